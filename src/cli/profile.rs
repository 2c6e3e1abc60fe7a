//! `wgrad profile`: warm-up steps, then profiled steps of GPT-2 training, then as many without
//! timestamps; prints GPU time per kernel, CPU time per phase, per-step counters and wall
//! times, the untimed median beside the timed one (the profiler's own cost); `--json FILE`
//! and `--trace FILE` (Chrome trace) write the same data.

use std::path::PathBuf;

use wgrad::dist::Reduction;
use wgrad::memory::{check_fits, Workload};
use wgrad::optim::{AdamWConfig, LrSchedule};
use wgrad::profile::{chrome_trace, Profiler};
use wgrad::train::Trainer;
use wgrad::{Device, Error, Result};

use super::dist::{with_ranks, ReduceArg};
use super::setup;

#[derive(clap::Args)]
pub struct Args {
    /// A built-in model shape (tiny, distilgpt2, gpt2, tiny-llama, smollm2-135m).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// A model directory (its config.json) instead of a preset.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Mixed precision: f16 matmuls on f32 master weights, dynamic loss scaling.
    #[arg(long)]
    amp: bool,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// Profiled steps after warm-up.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Warm-up steps (step 0 is the cold one: pipeline compilation).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a Chrome trace (chrome://tracing, Perfetto) to this file.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Under mpirun: how the ranks' gradients are averaged (each rank trains its own --batch;
    /// rank 0 reports, the reduction as the "gradient reduction" phase).
    #[arg(long, value_enum, default_value_t)]
    reduce: ReduceArg,
}

fn write(path: &PathBuf, value: &serde_json::Value) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_string_pretty(value).expect("the report serializes");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })
}

pub fn run(args: &Args) -> Result<()> {
    with_ranks(args.reduce, |dev, world| profile(args, dev, world))
}

fn profile(args: &Args, dev: &Device, reduction: Option<Box<dyn Reduction>>) -> Result<()> {
    let dev = dev.clone();
    let config = setup::config(Some(&args.preset), args.model.as_deref())?;
    setup::check_run(&config, args.batch, args.seq, args.steps, args.warmup)?;
    let (batch, seq, amp) = (args.batch, args.seq, args.amp);
    check_fits(&dev, &config, Workload::Train { batch, seq, amp })?;
    let mut model = setup::model(&dev, config.clone(), 0)?;
    model.set_amp(args.amp)?;
    let adamw = AdamWConfig {
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    let mut trainer = Trainer::new(model, adamw, 1e-4, LrSchedule::Constant { warmup: 0 })?;
    if let Some(reduction) = reduction {
        trainer.set_reduction(reduction)?;
    }
    let rank = trainer.collective().map_or(0, |c| c.rank());
    // Each rank its own tokens.
    let seed = 1 + rank as u64;
    let batch = setup::random_batch(&dev, config.vocab_size, args.batch, args.seq, seed)?;
    let mut prof = Profiler::new(&dev);
    let warmup = args.warmup.max(1);
    for _ in 0..warmup + args.steps {
        prof.step(|| trainer.step(std::slice::from_ref(&batch))?.item())?;
    }
    // As many steps again without timestamps: the report sets their median beside the timed
    // one, the profiler's own cost.
    prof.untimed_steps(args.steps, || {
        trainer.step(std::slice::from_ref(&batch))?.item()
    })?;
    let report = prof.report(warmup);
    if rank > 0 {
        return Ok(());
    }
    if let Some(reduction) = trainer.reduction() {
        println!(
            "{} ranks, each {} x {} tokens; gradients averaged by {}",
            reduction.collective().world_size(),
            args.batch,
            args.seq,
            reduction.describe()
        );
    }
    println!(
        "adapter {}; {} x {} tokens; {} warm-up + {} profiled steps\n",
        dev.report().adapter,
        args.batch,
        args.seq,
        warmup,
        args.steps
    );
    print!("{}", report.to_text());
    if let Some(path) = &args.json {
        write(
            path,
            &serde_json::to_value(&report).expect("the report serializes"),
        )?;
    }
    if let Some(path) = &args.trace {
        write(path, &chrome_trace(&prof.steps))?;
    }
    Ok(())
}
