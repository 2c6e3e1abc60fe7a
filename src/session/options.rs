//! A run's settings: `TrainOptions` (what decides its losses, saved with each checkpoint),
//! their defaults (the out-of-the-box `wgrad train`), the command line's `OptionFlags` for a new
//! or a resumed run. The presets and the default corpus are built in (`crate::assets`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where the model comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSource {
    /// A built-in preset's config (`crate::assets::Preset`) with fresh weights drawn from the
    /// run's seed.
    Preset(String),
    /// A Hugging Face model directory (GPT-2, Llama, Qwen2, Qwen3): config, weights, tokenizer.
    Dir(PathBuf),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Linear warm-up, then the peak rate.
    Constant,
    /// Linear warm-up, then cosine decay to a tenth of the peak at the last step.
    Cosine,
}

/// A run's settings: everything that decides its losses (saved with each checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainOptions {
    pub model: ModelSource,
    /// The text file, or the built-in corpus's name (`crate::assets::DEFAULT_CORPUS_NAME`).
    pub data: PathBuf,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Optimizer steps the run ends at (counted from the start, resumed runs included).
    pub steps: usize,
    /// Peak learning rate.
    pub lr: f32,
    pub warmup: usize,
    pub schedule: Schedule,
    pub weight_decay: f32,
    /// Global gradient-norm clip (0: off).
    pub grad_clip: f32,
    /// Micro-batches whose gradients add up to one optimizer step.
    pub grad_accum: usize,
    /// Seeds the fresh weights and the batch order.
    pub seed: u64,
    /// Mixed precision: f16 matmuls on f32 master weights, dynamic loss scaling.
    #[serde(default)]
    pub amp: bool,
}

/// Defaults of `wgrad train` with no flags: the tiny preset on the built-in corpus, sized so
/// the loss visibly falls within a few minutes on lavapipe (measured in README.md).
impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            model: ModelSource::Preset("tiny".into()),
            data: crate::assets::default_corpus(),
            batch: 4,
            seq: 16,
            steps: 30,
            lr: 2e-3,
            warmup: 5,
            schedule: Schedule::Constant,
            weight_decay: 0.1,
            grad_clip: 1.0,
            grad_accum: 1,
            seed: 0,
            amp: false,
        }
    }
}

/// Settings given on the command line, None where not given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptionFlags {
    pub model: Option<ModelSource>,
    pub data: Option<PathBuf>,
    pub batch: Option<usize>,
    pub seq: Option<usize>,
    pub steps: Option<usize>,
    pub lr: Option<f32>,
    pub warmup: Option<usize>,
    pub schedule: Option<Schedule>,
    pub weight_decay: Option<f32>,
    pub grad_clip: Option<f32>,
    pub grad_accum: Option<usize>,
    pub seed: Option<u64>,
    pub amp: Option<bool>,
}

impl OptionFlags {
    /// A new run's options: the flags given, defaults for the rest.
    pub fn new_run(&self) -> TrainOptions {
        let d = TrainOptions::default();
        TrainOptions {
            model: self.model.clone().unwrap_or(d.model),
            data: self.data.clone().unwrap_or(d.data),
            batch: self.batch.unwrap_or(d.batch),
            seq: self.seq.unwrap_or(d.seq),
            steps: self.steps.unwrap_or(d.steps),
            lr: self.lr.unwrap_or(d.lr),
            warmup: self.warmup.unwrap_or(d.warmup),
            schedule: self.schedule.unwrap_or(d.schedule),
            weight_decay: self.weight_decay.unwrap_or(d.weight_decay),
            grad_clip: self.grad_clip.unwrap_or(d.grad_clip),
            grad_accum: self.grad_accum.unwrap_or(d.grad_accum),
            seed: self.seed.unwrap_or(d.seed),
            amp: self.amp.unwrap_or(d.amp),
        }
    }

    /// A resumed run's options: the saved ones, with a new end (`steps`) or another path to the
    /// same data allowed; any other flag must agree with the checkpoint (a different value
    /// would not continue the same run).
    pub fn resumed_run(&self, saved: &TrainOptions) -> Result<TrainOptions> {
        let mut differ = Vec::new();
        let mut check = |flag: &str, given: Option<String>, saved: String| {
            if let Some(g) = given {
                if g != saved {
                    differ.push(format!("--{flag} {g} (the checkpoint's is {saved})"));
                }
            }
        };
        let s = saved;
        check(
            "batch",
            self.batch.map(|x| x.to_string()),
            s.batch.to_string(),
        );
        check("seq", self.seq.map(|x| x.to_string()), s.seq.to_string());
        check("lr", self.lr.map(|x| x.to_string()), s.lr.to_string());
        check(
            "warmup",
            self.warmup.map(|x| x.to_string()),
            s.warmup.to_string(),
        );
        check(
            "schedule",
            self.schedule.map(|x| format!("{x:?}").to_lowercase()),
            format!("{:?}", s.schedule).to_lowercase(),
        );
        check(
            "weight-decay",
            self.weight_decay.map(|x| x.to_string()),
            s.weight_decay.to_string(),
        );
        check(
            "grad-clip",
            self.grad_clip.map(|x| x.to_string()),
            s.grad_clip.to_string(),
        );
        check(
            "grad-accum",
            self.grad_accum.map(|x| x.to_string()),
            s.grad_accum.to_string(),
        );
        check("seed", self.seed.map(|x| x.to_string()), s.seed.to_string());
        check("amp", self.amp.map(|x| x.to_string()), s.amp.to_string());
        if self.model.is_some() {
            differ.push("--preset/--model (a resumed run's model is the checkpoint's)".into());
        }
        if !differ.is_empty() {
            return Err(Error::InvalidArgument {
                op: "--resume",
                reason: format!(
                    "a resumed run keeps its settings; these differ: {}",
                    differ.join(", ")
                ),
            });
        }
        let mut options = saved.clone();
        if let Some(steps) = self.steps {
            options.steps = steps;
        }
        if let Some(data) = &self.data {
            options.data = data.clone();
        }
        // A checkpoint from before the corpus was compiled in recorded its checkout path: when
        // that path now means the built-in corpus, the run records the corpus's name from here.
        if crate::assets::builtin_corpus(&options.data).is_some() {
            options.data = crate::assets::default_corpus();
        }
        Ok(options)
    }
}

/// Micro-batches per optimizer step at most: each is two GPU buffers made before the step
/// runs. Far beyond use: GPT-3's 3.2M-token steps are 1600 micro-batches of 1 x 2048.
pub const MAX_GRAD_ACCUM: usize = 1 << 16;
/// Tokens per optimizer step (batch x seq x grad-accum) at most: a step's token ids are all
/// uploaded before it runs (8 bytes a token, inputs and targets: 2 GiB at this limit).
pub const MAX_TOKENS_PER_STEP: usize = 1 << 28;

/// Refuses settings no run can train with, each error naming its flag and the bound: zero or
/// too large sizes, a sequence longer than the model's `n_positions`, rates that are negative
/// or not numbers. `train` checks a new and a resumed run's options (from flags or a
/// checkpoint) with it; `profile` and `bench step` their batch, seq and steps.
pub fn check_options(o: &TrainOptions, n_positions: usize) -> Result<()> {
    let bad = |op: &'static str, reason: String| Err(Error::InvalidArgument { op, reason });
    if o.seq == 0 || o.seq > n_positions {
        return bad(
            "--seq",
            format!(
                "{} tokens per sequence: the model has {n_positions} positions (1..={n_positions})",
                o.seq
            ),
        );
    }
    for (flag, value) in [
        ("--batch", o.batch),
        ("--grad-accum", o.grad_accum),
        ("--steps", o.steps),
    ] {
        if value == 0 {
            return bad(flag, "must be at least 1, it is 0".into());
        }
    }
    if o.grad_accum > MAX_GRAD_ACCUM {
        return bad(
            "--grad-accum",
            format!(
                "{} micro-batches per step is over {MAX_GRAD_ACCUM} (each is uploaded before \
                 the step runs); raise --batch instead",
                o.grad_accum
            ),
        );
    }
    let tokens = o
        .batch
        .checked_mul(o.seq)
        .and_then(|n| n.checked_mul(o.grad_accum))
        .filter(|&n| n <= MAX_TOKENS_PER_STEP);
    if tokens.is_none() {
        return bad(
            "--batch",
            format!(
                "--batch {} x --seq {} x --grad-accum {} tokens per step is over \
                 {MAX_TOKENS_PER_STEP} (2^28; a step's token ids are uploaded before it runs)",
                o.batch, o.seq, o.grad_accum
            ),
        );
    }
    if !(o.lr.is_finite() && o.lr > 0.0) {
        return bad("--lr", format!("{} is not a positive rate", o.lr));
    }
    if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
        return bad(
            "--weight-decay",
            format!("{} is not a decay of 0 or more", o.weight_decay),
        );
    }
    if !(o.grad_clip.is_finite() && o.grad_clip >= 0.0) {
        return bad(
            "--grad-clip",
            format!(
                "{} is not a norm of 0 or more (0 turns clipping off)",
                o.grad_clip
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_options_names_the_flag_and_never_overflows() {
        let ok = TrainOptions::default();
        assert!(check_options(&ok, 64).is_ok());
        type Edit = fn(&mut TrainOptions);
        let cases: [(Edit, &str); 10] = [
            (|o| o.batch = 0, "--batch"),
            (|o| o.seq = 0, "--seq"),
            (|o| o.seq = 65, "--seq"),
            (|o| o.steps = 0, "--steps"),
            (|o| o.grad_accum = 1_000_000_000, "--grad-accum"),
            (|o| o.batch = usize::MAX, "--batch"),
            (|o| o.batch = 1 << 40, "--batch"),
            (|o| o.lr = f32::NAN, "--lr"),
            (|o| o.weight_decay = -0.1, "--weight-decay"),
            (|o| o.grad_clip = -1.0, "--grad-clip"),
        ];
        for (edit, flag) in cases {
            let mut o = TrainOptions::default();
            edit(&mut o);
            let err = check_options(&o, 64).expect_err(flag).to_string();
            assert!(err.starts_with(flag), "{flag}: {err}");
        }
    }
}
