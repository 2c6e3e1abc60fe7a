//! `wgrad train`: trains a GPT-2 (the tiny preset on the bundled corpus by default) with a
//! progress bar (loss, tokens/s, ms/step), held-out evaluations, checkpoints and a summary;
//! `--json` prints one JSON object per step on stdout instead (header and summary go to
//! stderr). The run itself is `wgrad::session::TrainSession`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::dist::{abort_others_on_error, ReduceArg};
use super::signals;
use indicatif::{ProgressBar, ProgressStyle};
use wgrad::dist::Collective;
use wgrad::session::{
    saved_run_id, Event, Interrupt, ModelSource, OptionFlags, OutDir, OutPolicy, RunControl,
    RunSummary, Schedule, StepReport, TrainSession,
};
use wgrad::{Device, Options, Result};

#[derive(Clone, Copy, clap::ValueEnum)]
enum ScheduleArg {
    Constant,
    Cosine,
}

/// Settings left out take the defaults below (a new run) or the checkpoint's (--resume).
#[derive(clap::Args)]
pub struct Args {
    /// A built-in model with fresh weights: tiny, distilgpt2, gpt2, tiny-llama, smollm2-135m [default: tiny].
    #[arg(long, conflicts_with_all = ["model", "resume"])]
    preset: Option<String>,
    /// A Hugging Face model directory (GPT-2, Llama, Qwen2 or Qwen3: config.json, weights, tokenizer) to train on.
    #[arg(long, conflicts_with = "resume")]
    model: Option<PathBuf>,
    /// UTF-8 text to train on (tokenized once, cached beside it); its last 10% is held out
    /// [default: builtin:austen-persuasion.txt, the corpus compiled into wgrad].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Sequences per micro-batch [default: 4].
    #[arg(long)]
    batch: Option<usize>,
    /// Tokens per sequence [default: 16].
    #[arg(long)]
    seq: Option<usize>,
    /// The step the run ends at, counted from its start [default: 30].
    #[arg(long)]
    steps: Option<usize>,
    /// Peak learning rate [default: 0.002].
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f32>,
    /// Linear warm-up steps [default: 5].
    #[arg(long)]
    warmup: Option<usize>,
    /// After warm-up: constant, or cosine decay to lr/10 at the last step [default: constant].
    #[arg(long, value_enum)]
    schedule: Option<ScheduleArg>,
    /// AdamW's decoupled weight decay (weights and embeddings only) [default: 0.1].
    #[arg(long, allow_negative_numbers = true)]
    weight_decay: Option<f32>,
    /// Clip the global gradient norm to this; 0 turns clipping off [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    grad_clip: Option<f32>,
    /// Micro-batches per optimizer step [default: 1].
    #[arg(long)]
    grad_accum: Option<usize>,
    /// Seeds the fresh weights and the batch order [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Mixed precision: f16 matmuls (tensor cores where the adapter has cooperative
    /// matrices) on f32 master weights, with dynamic loss scaling.
    #[arg(long)]
    amp: bool,
    /// Evaluate the mean loss over the held-out split every N steps and at the end (0: never).
    #[arg(long, default_value_t = 0)]
    eval_every: usize,
    /// Save a checkpoint into --out every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    save_every: usize,
    /// Where checkpoints go: a model directory `from_pretrained` loads, plus the training state
    /// [default: the --resume directory; else nothing is saved].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Let --out be a directory that holds something else: another run's checkpoint, another
    /// model (its files that would contradict the saved one are removed), the --model
    /// directory. Without it such a directory is refused before the first step.
    #[arg(long)]
    overwrite: bool,
    /// Continue the run saved in this directory, with its settings (--steps may move the end).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// One JSON object per step on stdout instead of the progress bar.
    #[arg(long)]
    json: bool,
    /// Under mpirun: how the ranks' gradients are averaged (docs/DISTRIBUTED.md).
    #[arg(long, value_enum, default_value_t)]
    reduce: ReduceArg,
}

impl Args {
    fn flags(&self) -> OptionFlags {
        let model = match (&self.preset, &self.model) {
            (_, Some(dir)) => Some(ModelSource::Dir(dir.clone())),
            (Some(name), None) => Some(ModelSource::Preset(name.clone())),
            (None, None) => None,
        };
        OptionFlags {
            model,
            data: self.data.clone(),
            batch: self.batch,
            seq: self.seq,
            steps: self.steps,
            lr: self.lr,
            warmup: self.warmup,
            schedule: self.schedule.map(|s| match s {
                ScheduleArg::Constant => Schedule::Constant,
                ScheduleArg::Cosine => Schedule::Cosine,
            }),
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            grad_accum: self.grad_accum,
            seed: self.seed,
            amp: self.amp.then_some(true),
        }
    }
}

/// Under an MPI launcher, one rank of a data-parallel run (`wgrad::dist`): an error on any
/// rank ends them all, with its message.
pub fn run(args: &Args) -> Result<()> {
    let options = Options::from_env()?;
    let world = wgrad::dist::launch(&options)?;
    let result = train(args, &options, world.clone());
    abort_others_on_error(world.as_ref(), result)
}

fn train(args: &Args, options: &Options, world: Option<Rc<dyn Collective>>) -> Result<()> {
    let lead = world.as_ref().is_none_or(|w| w.rank() == 0);
    // --out's checks before anything loads (the run checks again, holding the directory);
    // rank 0 alone writes it.
    if let Some(out) = args.out.as_ref().filter(|_| lead) {
        let run_id = args.resume.as_deref().and_then(saved_run_id);
        OutDir::open(
            out,
            &OutPolicy {
                run_id: run_id.as_deref().unwrap_or(""),
                model_dir: args.model.as_deref(),
                resumed_from: args.resume.as_deref(),
                overwrite: args.overwrite,
            },
        )?;
    }
    let dev = Device::with_options(options)?;
    // Rank 0 loads first: it alone tidies a stopped save in --resume's directory and writes
    // the data's token cache, which the others then read.
    let wait_for_rank_0 = |now: bool| match world.as_ref().filter(|_| now) {
        Some(world) => world.barrier(),
        None => Ok(()),
    };
    wait_for_rank_0(!lead)?;
    let mut session = match &args.resume {
        Some(dir) => TrainSession::resume(&dev, dir, &args.flags())?,
        None => TrainSession::new(&dev, args.flags().new_run())?,
    };
    wait_for_rank_0(lead)?;
    if let Some(world) = world {
        session.join(wgrad::dist::reduction(args.reduce.into(), &world, &dev)?)?;
    }
    let interrupt = Interrupt::new();
    let control = RunControl {
        eval_every: args.eval_every,
        save_every: args.save_every,
        out: args.out.clone().or(args.resume.clone()),
        overwrite: args.overwrite,
        interrupt: Some(interrupt.clone()),
    };
    let saving = control.out.as_ref().map(|d| d.display().to_string());
    let caught = signals::stop_on_signals(interrupt, saving);
    if lead {
        print_header(&session, &dev, args);
    }
    let summary = if !lead {
        session.run(&control, |_| {})?
    } else if args.json {
        session.run(&control, |event| match event {
            Event::Step(report) => println!(
                "{}",
                serde_json::to_string(report).expect("a step report serializes")
            ),
            Event::Saved { step, dir } => eprintln!("step {step}: saved {}", dir.display()),
        })?
    } else {
        let mut progress = Progress::new(session.step(), session.options.steps);
        let summary = session.run(&control, |event| progress.event(event));
        progress.finish();
        summary?
    };
    if lead {
        print_summary(&summary, args.json);
    }
    if let Some(fingerprint) = summary.weights_fingerprint {
        // One write, so the ranks' lines do not interleave.
        let line = format!(
            "rank {} of {}: weights fnv1a64 {fingerprint:016x} at step {}\n",
            session.rank(),
            session.world_size(),
            summary.last_step
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
    if let Some((name, status)) = caught.signal().filter(|_| summary.interrupted) {
        let saved = match &summary.saved {
            Some(dir) => format!(
                "; saved at step {} in {} (continue with `wgrad train --resume {}`)",
                summary.last_step,
                dir.display(),
                dir.display()
            ),
            None => "; nothing was saved (no --out)".into(),
        };
        eprintln!("stopped by {name} after step {}{saved}", summary.last_step);
        std::process::exit(status);
    }
    Ok(())
}

fn print_header(session: &TrainSession, dev: &Device, args: &Args) {
    let o = &session.options;
    let model = match (&args.resume, &o.model) {
        (Some(dir), _) => format!("{} (resumed at step {})", dir.display(), session.step()),
        (None, ModelSource::Preset(name)) => format!("preset {name} (fresh weights)"),
        (None, ModelSource::Dir(dir)) => dir.display().to_string(),
    };
    let cfg = &session.trainer.model.config;
    let lines =
        [
            format!("adapter   {}", dev.report().adapter),
            format!(
                "model     {model}: {} {} layers, {} dims, {} heads{}, {:.1}M parameters{}",
                cfg.family.model_type(),
                cfg.n_layer,
                cfg.n_embd,
                cfg.n_head,
                if cfg.n_kv_head < cfg.n_head {
                    format!(" ({} key/value)", cfg.n_kv_head)
                } else {
                    String::new()
                },
                session.trainer.model.params.numel() as f64 / 1e6,
                match &session.weights_read {
                    Some(read) => format!("; weights {}", read.describe()),
                    None => String::new(),
                }
            ),
            format!(
                "data      {}: {} tokens for training, {} held out{}",
                o.data.display(),
                session.data.train().len(),
                session.data.held_out().len(),
                if session.data.from_cache() {
                    " (token cache)"
                } else {
                    ""
                }
            ),
            format!(
            "training  {} steps of {} x {} tokens{}, lr {} ({:?}, {} warm-up), weight decay {}, \
             grad clip {}, seed {}{}{}",
            o.steps,
            o.batch,
            o.seq,
            if o.grad_accum > 1 {
                format!(" x {} micro-batches", o.grad_accum)
            } else {
                String::new()
            },
            o.lr,
            o.schedule,
            o.warmup,
            o.weight_decay,
            o.grad_clip,
            o.seed,
            if session.world_size() > 1 {
                let world = session.world_size();
                format!(", {world} ranks (global batch {world} x {} sequences)", o.batch)
            } else {
                String::new()
            },
            if o.amp {
                ", mixed precision (f16 matmuls, loss scaling)"
            } else {
                ""
            }
        ),
        ];
    for line in lines {
        eprintln!("{line}");
    }
    if let Some(reduction) = session.trainer.reduction() {
        eprintln!(
            "ranks     {}, gradients averaged by {}",
            session.world_size(),
            reduction.describe()
        );
    }
}

/// The progress bar on a terminal; a line every few seconds elsewhere (a log file sees the
/// loss fall too).
struct Progress {
    bar: Option<ProgressBar>,
    last_line: Instant,
}

/// Seconds between two plain progress lines when stderr is not a terminal.
const PLAIN_LINE_INTERVAL: Duration = Duration::from_secs(5);

impl Progress {
    fn new(at: usize, end: usize) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(end as u64);
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} step {pos}/{len} [{bar:30}] {msg} ({elapsed}, eta {eta})",
                )
                .expect("the template is valid")
                .progress_chars("=> "),
            );
            bar.set_position(at as u64);
            bar.set_message("compiling kernels, first step");
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress {
            bar,
            last_line: Instant::now(),
        }
    }

    fn line(r: &StepReport) -> String {
        format!(
            "loss {:.4} | {:.0} tokens/s | {:.1} ms/step",
            r.loss, r.tokens_per_s, r.ms
        )
    }

    fn event(&mut self, event: &Event) {
        match (event, &self.bar) {
            (Event::Step(r), Some(bar)) => {
                bar.set_position(r.step as u64);
                bar.set_message(Progress::line(r));
                if let Some(eval) = r.eval_loss {
                    bar.println(format!(
                        "step {}: loss {:.4}, held-out loss {eval:.4}",
                        r.step, r.loss
                    ));
                }
            }
            (Event::Step(r), None) => {
                if r.eval_loss.is_some() || self.last_line.elapsed() >= PLAIN_LINE_INTERVAL {
                    let eval = r
                        .eval_loss
                        .map(|e| format!(" | held-out loss {e:.4}"))
                        .unwrap_or_default();
                    eprintln!("step {}: {}{eval}", r.step, Progress::line(r));
                    self.last_line = Instant::now();
                }
            }
            (Event::Saved { step, dir }, Some(bar)) => {
                bar.println(format!("step {step}: saved {}", dir.display()))
            }
            (Event::Saved { step, dir }, None) => {
                eprintln!("step {step}: saved {}", dir.display())
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

fn print_summary(s: &RunSummary, to_stderr: bool) {
    let train = s.train_time.as_secs_f64();
    let steps = s.last_step + 1 - s.first_step;
    let mut lines = vec![
        format!(
            "trained steps {}..{}: loss {:.4} -> {:.4}",
            s.first_step, s.last_step, s.first_loss, s.final_loss
        ),
        format!(
            "{} tokens in {train:.1} s of steps ({:.0} tokens/s, {:.0} ms/step); {:.1} s in all",
            s.tokens,
            s.tokens as f64 / train,
            train * 1e3 / steps as f64,
            s.wall.as_secs_f64()
        ),
    ];
    if let Some(e) = s.eval_loss {
        lines.push(format!(
            "held-out loss {e:.4} (perplexity {:.1})",
            (e as f64).exp()
        ));
    }
    lines.push(match &s.saved {
        Some(dir) => format!(
            "saved to {} (resume: wgrad train --resume {0} --steps N)",
            dir.display()
        ),
        None => "not saved (give --out DIR to keep the model)".into(),
    });
    for line in lines {
        if to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use wgrad::session::TrainOptions;

    /// The defaults `--help` states are the ones a new run takes.
    #[test]
    fn help_states_the_library_defaults() {
        let d = TrainOptions::default();
        let expected = [
            ("batch", d.batch.to_string()),
            ("seq", d.seq.to_string()),
            ("steps", d.steps.to_string()),
            ("lr", d.lr.to_string()),
            ("warmup", d.warmup.to_string()),
            ("schedule", format!("{:?}", d.schedule).to_lowercase()),
            ("weight_decay", d.weight_decay.to_string()),
            ("grad_clip", d.grad_clip.to_string()),
            ("grad_accum", d.grad_accum.to_string()),
            ("seed", d.seed.to_string()),
        ];
        let cmd = crate::cli::Cli::command();
        let train = cmd.find_subcommand("train").expect("a train subcommand");
        for (id, value) in expected {
            let arg = train
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap_or_else(|| panic!("no argument {id}"));
            let help = arg.get_help().expect("documented").to_string();
            assert!(
                help.ends_with(&format!("[default: {value}]")),
                "--{id}: `{help}` should end with [default: {value}]"
            );
        }
    }
}
