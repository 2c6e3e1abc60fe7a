//! A training run as `wgrad train` runs it: a GPT-2 (a preset with fresh weights, or a model
//! directory), a text file as seeded batches, `Trainer` steps, held-out evaluation, and
//! checkpoints that a resumed run continues exactly from.
//!
//! The host reads the losses late: each step's loss is copied into a small ring on the GPU and
//! the step is submitted at once; the ring is read back once per about `READ_BACK_INTERVAL` of
//! steps (every step when one step takes longer), and at evaluations, saves and the last step.
//! Between two read-backs the host records step N+1 while the GPU runs step N.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::Precision;
use crate::error::{Error, Result};
use crate::graph::{Device, Tensor};
use crate::model::{
    eval_batch_size, load_pretrained_with, mean_loss, read_train_state, save_checkpoint,
    BatchSampler, EvalReport, HfConfig, TokenDataset, Tokenizer, TrainState, WeightsRead,
};
use crate::nn::Decoder;
use crate::ops::{launch_copy, Out};
use crate::optim::{AdamWConfig, LrSchedule};
use crate::train::Trainer;

mod dist;
mod interrupt;
mod options;
mod out_dir;
#[cfg(test)]
mod tests;

pub use interrupt::Interrupt;
pub use out_dir::{saved_run_id, OutDir, OutPolicy, LOCK_FILE};

pub use options::{check_options, MAX_GRAD_ACCUM, MAX_TOKENS_PER_STEP};
pub use options::{ModelSource, OptionFlags, Schedule, TrainOptions};

/// A Hugging Face model directory on `device`: its config (checked against the weights), the
/// model and its tokenizer.
pub fn load_model(device: &Device, dir: &Path) -> Result<(HfConfig, Decoder, Tokenizer)> {
    load_model_with(device, dir).map(|(c, m, t, _)| (c, m, t))
}

/// `load_model`, also saying what the weight files held.
pub fn load_model_with(
    device: &Device,
    dir: &Path,
) -> Result<(HfConfig, Decoder, Tokenizer, WeightsRead)> {
    let (config, params, read) = load_pretrained_with(device, dir)?;
    let tokenizer = Tokenizer::for_model(dir, &config)?;
    let model = Decoder::from_params(config.model.clone(), params)?;
    Ok((config, model, tokenizer, read))
}

/// What a run does besides training: evaluate, save.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunControl {
    /// Held-out evaluation every this many steps and at the last step (0: never).
    pub eval_every: usize,
    /// A checkpoint into `out` every this many steps (0: only at the end).
    pub save_every: usize,
    /// Where checkpoints go (None: nothing is saved); checked before the first step
    /// (`OutDir::open`).
    pub out: Option<PathBuf>,
    /// Let `out` be a directory that holds something else (`--overwrite`).
    pub overwrite: bool,
    /// Stop after the current step (and save, with `out`) once this is requested.
    pub interrupt: Option<Interrupt>,
}

/// One optimizer step, as the host saw it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepReport {
    /// Steps taken, this one included (1-based).
    pub step: usize,
    /// The mean loss over the step's micro-batches.
    pub loss: f32,
    /// Wall time per step, averaged over the steps between two read-backs.
    pub ms: f64,
    pub tokens_per_s: f64,
    /// The held-out loss after this step, on evaluation steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f32>,
}

/// What a run reports as it goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Step(StepReport),
    Saved { step: usize, dir: PathBuf },
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    pub first_step: usize,
    pub last_step: usize,
    pub first_loss: f32,
    pub final_loss: f32,
    /// The last held-out loss, when evaluated.
    pub eval_loss: Option<f32>,
    /// Tokens trained on in this run.
    pub tokens: usize,
    /// Time spent in training steps (evaluations and saves excluded).
    pub train_time: Duration,
    /// The whole run.
    pub wall: Duration,
    pub saved: Option<PathBuf>,
    /// The run stopped early on `RunControl::interrupt`.
    pub interrupted: bool,
    /// Data parallel: FNV-1a of this rank's weights at the end (every rank's is checked to be
    /// rank 0's, `dist::weights_agree`).
    pub weights_fingerprint: Option<u64>,
}

/// Read back the losses once per about this much time of steps.
const READ_BACK_INTERVAL: Duration = Duration::from_millis(500);
/// Steps whose losses wait on the GPU at most (the ring's slots).
const LOSS_RING: usize = 16;

/// The hyper-parameters JSON of a checkpoint: the options, which tokens they trained on, and
/// the precision the Device ran them in.
#[derive(Serialize, Deserialize)]
struct SavedOptions {
    options: TrainOptions,
    /// FNV-1a of the data's token ids (a resumed position is only valid in the same tokens).
    data_tokens_fnv1a64: String,
    /// What of `config::Precision` the run used (`Precision::in_effect`): a resumed run must
    /// use the same to continue the same losses. (Missing in a checkpoint written before it
    /// was saved: the defaults, what those runs used unless the environment said otherwise.)
    #[serde(default)]
    precision: Precision,
    /// The run's identity, the same across its resumes: a run may write over its own
    /// checkpoints only (`OutDir`). (Missing in checkpoints written before it was saved.)
    #[serde(default)]
    run_id: Option<String>,
    /// The ranks that trained it (data parallel, `TrainSession::join`): each step's batch was
    /// this many times `options.batch`, so a resume takes as many. (1 in checkpoints written
    /// before it was saved.)
    #[serde(default = "one")]
    world_size: usize,
}

fn one() -> usize {
    1
}

/// A new run's identity: unique enough to tell two runs' checkpoints apart.
fn new_run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut bytes = now.to_le_bytes().to_vec();
    bytes.extend(std::process::id().to_le_bytes());
    bytes.extend(NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    format!(
        "{:016x}",
        crate::model::fnv1a64(crate::model::FNV_OFFSET, &bytes)
    )
}

pub struct TrainSession {
    pub options: TrainOptions,
    pub trainer: Trainer,
    /// The config saved with each checkpoint (unknown fields of the source kept).
    pub config: HfConfig,
    pub tokenizer: Tokenizer,
    pub data: TokenDataset,
    sampler: BatchSampler,
    data_fingerprint: u64,
    /// Saved with each checkpoint; kept by a resume.
    run_id: String,
    /// The checkpoint directory this session resumed.
    resumed_from: Option<PathBuf>,
    /// What the weight files held, for a model loaded from a directory (trained as f32 master
    /// weights whatever they held).
    pub weights_read: Option<WeightsRead>,
    /// The ranks of the run the checkpoint resumed from trained on.
    resumed_world_size: Option<usize>,
}

/// An error unless `device` runs with the precision the checkpoint in `dir` was trained with
/// (`saved`), naming each difference and the variable that sets it.
fn check_precision(dir: &Path, saved: &Precision, device: &Device, amp: bool) -> Result<()> {
    let now = device.options().precision.in_effect(amp);
    let differences = saved.in_effect(amp).differences(&now);
    if differences.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op: "--resume",
        reason: format!(
            "{} was trained with another precision than this run's, so it would not continue \
             the same losses: {} (saved -> now; set the variables as the run had them)",
            dir.display(),
            differences.join(", ")
        ),
    })
}

fn tokens_fingerprint(tokens: &[u32]) -> u64 {
    crate::model::fnv1a64(crate::model::FNV_OFFSET, bytemuck::cast_slice(tokens))
}

impl TrainSession {
    /// A new run: the model (fresh preset weights or a directory's), the data tokenized (or
    /// read from its cache), the optimizer.
    pub fn new(device: &Device, options: TrainOptions) -> Result<TrainSession> {
        let mut weights_read = None;
        let (config, model, tokenizer) = match &options.model {
            ModelSource::Preset(name) => {
                let preset = crate::assets::Preset::named(name)?;
                // A preset without a tokenizer cannot train on text whatever the device: say
                // so first, not that it does not fit (a memory cap, a small GPU).
                let tokenizer = preset.tokenizer()?;
                let config = preset.config()?;
                check_options(&options, config.model.n_positions)?;
                crate::memory::check_fits(device, &config.model, (&options).into())?;
                let model = Decoder::new(device, config.model.clone(), options.seed)?;
                (config, model, tokenizer)
            }
            ModelSource::Dir(dir) => {
                let config = HfConfig::read(&dir.join("config.json"))?;
                check_options(&options, config.model.n_positions)?;
                crate::memory::check_fits(device, &config.model, (&options).into())?;
                let (config, model, tokenizer, read) = load_model_with(device, dir)?;
                weights_read = Some(read);
                (config, model, tokenizer)
            }
        };
        let data = TokenDataset::load(&options.data, &tokenizer)?;
        let mut session = TrainSession::assemble(options, config, model, tokenizer, data)?;
        session.weights_read = weights_read;
        Ok(session)
    }

    fn assemble(
        options: TrainOptions,
        config: HfConfig,
        mut model: Decoder,
        tokenizer: Tokenizer,
        data: TokenDataset,
    ) -> Result<TrainSession> {
        let vocab = model.config.vocab_size;
        if let Some(&bad) = data.tokens().iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Dataset {
                path: options.data.display().to_string(),
                reason: format!(
                    "token id {bad} is outside the model's vocabulary of {vocab} (the tokenizer \
                     does not belong to this model)"
                ),
            });
        }
        let sampler = data.train_batches(options.batch, options.seq, options.seed)?;
        let adamw = AdamWConfig {
            weight_decay: options.weight_decay,
            max_grad_norm: (options.grad_clip > 0.0).then_some(options.grad_clip),
            ..Default::default()
        };
        let schedule = match options.schedule {
            Schedule::Constant => LrSchedule::Constant {
                warmup: options.warmup,
            },
            Schedule::Cosine => LrSchedule::Cosine {
                warmup: options.warmup,
                total: options.steps,
                min_ratio: 0.1,
            },
        };
        model.set_amp(options.amp)?;
        let trainer = Trainer::new(model, adamw, options.lr, schedule)?;
        let data_fingerprint = tokens_fingerprint(data.tokens());
        Ok(TrainSession {
            options,
            trainer,
            config,
            tokenizer,
            data,
            sampler,
            data_fingerprint,
            run_id: new_run_id(),
            resumed_from: None,
            weights_read: None,
            resumed_world_size: None,
        })
    }

    /// Continues the run saved in `dir` (by `save`): its weights, optimizer state, step and
    /// batch position, with its settings (`flags` may move the end or the data's path only).
    pub fn resume(device: &Device, dir: &Path, flags: &OptionFlags) -> Result<TrainSession> {
        out_dir::finish_stopped_save(dir)?;
        let state_file = crate::model::STATE_FILE;
        crate::model::refuse_non_regular(&dir.join(state_file), state_file)?;
        let saved = read_train_state(dir)?;
        let meta: SavedOptions = serde_json::from_value(saved.state.hyper_parameters.clone())
            .map_err(|e| Error::ModelFile {
                path: dir.display().to_string(),
                reason: format!("the checkpoint's hyper-parameters: {e}"),
            })?;
        let options = flags.resumed_run(&meta.options)?;
        check_precision(dir, &meta.precision, device, options.amp)?;
        let step = saved.state.step as usize;
        if options.steps <= step {
            return Err(Error::InvalidArgument {
                op: "--steps",
                reason: format!(
                    "the checkpoint is at step {step}: --steps (where the run ends) must be \
                     larger, it is {}",
                    options.steps
                ),
            });
        }
        let config = HfConfig::read(&dir.join("config.json"))?;
        check_options(&options, config.model.n_positions)?;
        crate::memory::check_fits(device, &config.model, (&options).into())?;
        let tokenizer = Tokenizer::for_model(dir, &config)?;
        let data = TokenDataset::load(&options.data, &tokenizer)?;
        let fingerprint = format!("{:016x}", tokens_fingerprint(data.tokens()));
        if fingerprint != meta.data_tokens_fnv1a64 {
            return Err(Error::Dataset {
                path: options.data.display().to_string(),
                reason: format!(
                    "these are not the tokens the checkpoint in {} trained on (give --data the \
                     same text)",
                    dir.display()
                ),
            });
        }
        let (config, model, tokenizer) = load_model(device, dir)?;
        let mut session = TrainSession::assemble(options, config, model, tokenizer, data)?;
        saved.restore_optimizer(&mut session.trainer.opt)?;
        session.trainer.step = step;
        session.sampler.set_position(saved.state.position)?;
        if let Some(id) = meta.run_id {
            session.run_id = id;
        }
        session.resumed_from = Some(dir.to_path_buf());
        session.resumed_world_size = Some(meta.world_size);
        Ok(session)
    }

    /// Optimizer steps taken.
    pub fn step(&self) -> usize {
        self.trainer.step
    }

    /// Tokens one optimizer step trains on, over every rank.
    pub fn tokens_per_step(&self) -> usize {
        self.world_size() * self.options.batch * self.options.seq * self.options.grad_accum
    }

    /// Records one optimizer step over the next batches; the loss stays on the GPU.
    pub fn record_step(&mut self) -> Result<Tensor> {
        let dev = self.trainer.model.params.device().clone();
        let (b, t) = (self.options.batch, self.options.seq);
        let mut micro = Vec::with_capacity(self.options.grad_accum);
        let rank = self.rank();
        for _ in 0..self.options.grad_accum {
            // The global batch, of which this rank trains on its B rows (all of it alone).
            let batch = self.sampler.next_batch();
            let (inputs, targets) = (batch.inputs(), batch.targets());
            micro.push((
                Tensor::from_u32(&dev, crate::dist::shard_rows(&inputs, t, rank, b)?, &[b, t])?,
                Tensor::from_u32(
                    &dev,
                    crate::dist::shard_rows(&targets, t, rank, b)?,
                    &[b, t],
                )?,
            ));
        }
        self.trainer.step(&micro)
    }

    /// The mean loss over the held-out split: its consecutive windows of T + 1 tokens.
    pub fn eval_held_out(&self) -> Result<EvalReport> {
        let chunk = self.options.seq + 1;
        let held = self.data.held_out();
        if held.len() < chunk {
            self.data.held_out_batches(1, self.options.seq)?; // the error naming both lengths
        }
        let model = &self.trainer.model;
        mean_loss(model, held, chunk, eval_batch_size(model, chunk))
    }

    /// Checks, creates and locks `path` for this run's checkpoints (`OutDir::open`): refused
    /// when it holds something else than this run's checkpoints, unless `overwrite`.
    pub fn open_out(&self, path: &Path, overwrite: bool) -> Result<OutDir> {
        let model_dir = match &self.options.model {
            ModelSource::Dir(dir) => Some(dir.as_path()),
            ModelSource::Preset(_) => None,
        };
        OutDir::open(
            path,
            &OutPolicy {
                run_id: &self.run_id,
                model_dir,
                resumed_from: self.resumed_from.as_deref(),
                overwrite,
            },
        )
    }

    /// Writes a checkpoint of the current step into `out`, as one unit.
    pub fn save(&self, out: &OutDir) -> Result<()> {
        let device = self.trainer.model.params.device();
        let hyper = SavedOptions {
            options: self.options.clone(),
            data_tokens_fnv1a64: format!("{:016x}", self.data_fingerprint),
            precision: device.options().precision.in_effect(self.options.amp),
            run_id: Some(self.run_id.clone()),
            world_size: self.world_size(),
        };
        let state = TrainState {
            step: self.trainer.step as u64,
            position: self.sampler.position(),
            hyper_parameters: serde_json::to_value(&hyper).expect("the options serialize to JSON"),
        };
        save_checkpoint(
            out.path(),
            &self.config,
            &self.trainer.model.params,
            &self.tokenizer,
            &self.trainer.opt,
            &state,
        )
    }

    /// Trains until step `options.steps`, evaluating and saving per `control`, reporting each
    /// step to `on_event` as its loss comes back.
    pub fn run(
        &mut self,
        control: &RunControl,
        on_event: impl FnMut(&Event),
    ) -> Result<RunSummary> {
        self.run_until(self.options.steps, control, on_event)
    }

    /// As `run`, stopping at step `until` (<= options.steps; the schedule still ends at
    /// options.steps): a run cut short, as an interruption would.
    pub fn run_until(
        &mut self,
        until: usize,
        control: &RunControl,
        mut on_event: impl FnMut(&Event),
    ) -> Result<RunSummary> {
        if until > self.options.steps || until <= self.step() {
            return Err(Error::InvalidArgument {
                op: "train",
                reason: format!(
                    "stopping at step {until}: the run is at step {} and ends at {}",
                    self.step(),
                    self.options.steps
                ),
            });
        }
        if let Some(saved) = self.resumed_world_size.filter(|&w| w != self.world_size()) {
            return Err(Error::InvalidArgument {
                op: "--resume",
                reason: format!(
                    "the checkpoint was trained by {saved} ranks (each step {saved} x --batch \
                     sequences), this run has {}: resume it under `mpirun -np {saved}`",
                    self.world_size()
                ),
            });
        }
        if control.save_every > 0 && control.out.is_none() {
            return Err(Error::InvalidArgument {
                op: "--save-every",
                reason: "checkpoints need a directory: give --out DIR".into(),
            });
        }
        // Data parallel: rank 0 alone saves and evaluates; the others agree with it on when
        // to stop and check that their weights are its own.
        let collective = self.trainer.collective().cloned();
        let lead = self.rank() == 0;
        let out = (control.out.as_deref())
            .filter(|_| lead)
            .map(|path| self.open_out(path, control.overwrite))
            .transpose()?;
        let eval_every = if lead { control.eval_every } else { 0 };
        if eval_every > 0 {
            // Before any work: a held-out split too short for one sequence.
            self.data.held_out_batches(1, self.options.seq)?;
        }
        let requested = || control.interrupt.as_ref().is_some_and(Interrupt::requested);
        // A stop asked for after a step's agreement waits for the next step's under MPI.
        let late_requested = || collective.is_none() && requested();
        let dev = self.trainer.model.params.device().clone();
        let ring = Tensor::zeros(&dev, &[LOSS_RING])?;
        let first_step = self.step() + 1;
        let started = Instant::now();
        let mut group_start = Instant::now();
        let mut pending = 0;
        let mut read_every = 1;
        let mut summary = RunSummary {
            first_step,
            last_step: first_step,
            first_loss: f32::NAN,
            final_loss: f32::NAN,
            eval_loss: None,
            tokens: 0,
            train_time: Duration::ZERO,
            wall: Duration::ZERO,
            saved: None,
            interrupted: false,
            weights_fingerprint: None,
        };
        while self.step() < until {
            let loss = self.record_step()?;
            launch_copy(
                &loss.reshape(&[1])?,
                Out::Write(&ring.narrow(0, pending, 1)?),
            )?;
            dev.flush();
            pending += 1;
            let step = self.step();
            let stop = match &collective {
                Some(c) => c.any(requested())?,
                None => requested(),
            };
            let end = step == until;
            let last = end || stop;
            if let Some(c) = &collective {
                let at_save = control.save_every > 0 && step.is_multiple_of(control.save_every);
                if last || at_save {
                    crate::dist::weights_agree(c.as_ref(), &self.trainer.model.params, step)?;
                }
            }
            let eval_now = eval_every > 0 && (step.is_multiple_of(eval_every) || end);
            let save_now = out.is_some()
                && (last || (control.save_every > 0 && step.is_multiple_of(control.save_every)));
            if pending < read_every && !last && !eval_now && !save_now {
                continue;
            }
            let losses = ring.narrow(0, 0, pending)?.to_vec()?;
            let elapsed = group_start.elapsed();
            summary.train_time += elapsed;
            let ms = elapsed.as_secs_f64() * 1e3 / pending as f64;
            read_every =
                ((READ_BACK_INTERVAL.as_secs_f64() * 1e3 / ms) as usize).clamp(1, LOSS_RING);
            if let Some(i) = losses.iter().position(|l| !l.is_finite()) {
                return Err(Error::InvalidArgument {
                    op: "train",
                    reason: format!(
                        "the loss is {} at step {}: training diverged (try a lower --lr or \
                         --grad-clip 1); nothing was saved at this step",
                        losses[i],
                        step + 1 - pending + i
                    ),
                });
            }
            let eval_loss = if eval_now {
                let loss = self.eval_held_out()?.loss as f32;
                summary.eval_loss = Some(loss);
                Some(loss)
            } else {
                None
            };
            for (i, &loss) in losses.iter().enumerate() {
                let s = step + 1 - pending + i;
                if s == first_step {
                    summary.first_loss = loss;
                }
                on_event(&Event::Step(StepReport {
                    step: s,
                    loss,
                    ms,
                    tokens_per_s: self.tokens_per_step() as f64 / (ms * 1e-3),
                    eval_loss: if s == step { eval_loss } else { None },
                }));
            }
            summary.final_loss = *losses.last().expect("one step at least");
            summary.tokens += pending * self.tokens_per_step();
            // A stop asked for during the read-back, the evaluation or the save also saves
            // this step (once), then ends the run.
            let mut stop = stop || late_requested();
            let mut saved = false;
            loop {
                if let Some(out) = out.as_ref().filter(|_| (save_now || stop) && !saved) {
                    self.save(out)?;
                    saved = true;
                    summary.saved = Some(out.path().to_path_buf());
                    on_event(&Event::Saved {
                        step,
                        dir: out.path().to_path_buf(),
                    });
                }
                if stop || !late_requested() {
                    break;
                }
                stop = true;
            }
            pending = 0;
            group_start = Instant::now();
            if stop {
                summary.interrupted = true;
                break;
            }
        }
        summary.last_step = self.step();
        if collective.is_some() {
            summary.weights_fingerprint = Some(crate::dist::weights_fingerprint(
                &self.trainer.model.params,
            )?);
        }
        summary.wall = started.elapsed();
        Ok(summary)
    }
}
