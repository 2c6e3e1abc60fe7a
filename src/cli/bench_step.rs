//! `wgrad bench step`: the median time of a full GPT-2 training step (forward, backward,
//! AdamW), synchronized per step, after warm-up; tokens/s, submits and buffers created per
//! step, step-0 (cold) time. Prints a table, or `--json`.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use wgrad::dist::Reduction;
use wgrad::memory::{check_fits, Workload};
use wgrad::optim::{AdamWConfig, LrSchedule};
use wgrad::train::Trainer;
use wgrad::tune;
use wgrad::{Device, Error, Result};

use super::dist::{with_ranks, ReduceArg};
use super::setup;

#[derive(clap::Args)]
pub struct Args {
    /// A built-in model shape (tiny, distilgpt2, gpt2, tiny-llama, smollm2-135m).
    #[arg(long, default_value = "distilgpt2")]
    preset: String,
    /// A model directory (its config.json) instead of a preset.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Mixed precision: f16 matmuls on f32 master weights, dynamic loss scaling.
    #[arg(long)]
    amp: bool,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 512)]
    seq: usize,
    /// Timed steps (the median is reported).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Untimed steps first (step 0 is reported on its own).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long)]
    json: bool,
    /// First search the tile of every matmul product of a step (one untimed step records them),
    /// check the fastest few of each inside the step (the one under which the step's GPU is
    /// busy least is kept), and write the adapter's tile table; later runs read it. Step 0
    /// then is no longer cold.
    #[arg(long)]
    tune: bool,
    /// With --tune: keep each product's fastest tile alone, unchecked in the step.
    #[arg(long)]
    tune_isolated: bool,
    /// Under mpirun: how the ranks' gradients are averaged (each rank steps on its own
    /// --batch; rank 0 reports the step, the reduction and the tokens/s of all ranks).
    #[arg(long, value_enum, default_value_t)]
    reduce: ReduceArg,
}

/// One kernel variant's compile (naga and the driver) on its worker.
#[derive(Serialize)]
struct SlowCompile {
    kernel: &'static str,
    variant: String,
    ms: f64,
}

#[derive(Serialize)]
struct Report {
    adapter: String,
    model: String,
    batch: usize,
    seq: usize,
    params: usize,
    /// Mixed precision (--amp).
    amp: bool,
    /// Ranks stepping together under mpirun (1 without): tokens_per_s counts all of them.
    world_size: usize,
    /// How their gradients were averaged (absent for one rank).
    #[serde(skip_serializing_if = "Option::is_none")]
    reduction: Option<String>,
    /// Median ms of a timed step's reduction, from the end of this rank's backward (absent
    /// for one rank).
    #[serde(skip_serializing_if = "Option::is_none")]
    reduce_ms: Option<f64>,
    step0_ms: f64,
    /// Step 0's pipelines: how many compiled, their compile time summed over the worker
    /// threads, and how long the step's flushes waited for them.
    step0_pipelines_compiled: u64,
    step0_compile_ms: f64,
    step0_compile_wait_ms: f64,
    /// The compiles that took longest by the end of step 0 (step 0's; with --tune the searches'
    /// too): a variant's compile is one worker's work, so the longest bounds the wait however
    /// many workers there are. Longest first.
    step0_slowest_compiles: Vec<SlowCompile>,
    compile_threads: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    tokens_per_s: f64,
    submits_per_step: f64,
    buffers_created_per_step: f64,
    dispatches_per_step: f64,
    /// Dispatches encoded behind a pipeline barrier, which waits for all the compute work
    /// before it (the others may run beside the dispatches before them).
    barriers_per_step: f64,
    /// Dispatches encoded ahead of an earlier-recorded one that waits at a barrier, to run
    /// beside the work before it (`WGRAD_SCHEDULE=recorded` keeps the recorded order).
    moved_per_step: f64,
    /// How the CPU waited for the GPU: `spin` or `block` (`WGRAD_WAIT`).
    wait: String,
    loss_first: f32,
    loss_last: f32,
    /// --amp: the loss scale after the last step, and the steps skipped on an overflow.
    loss_scale: Option<f32>,
    skipped_steps: Option<u64>,
    /// GPU memory the tensor pool held (live and cached) after the first step and after the
    /// last: flat over a long run (`--steps 1000`) unless something leaks.
    pool_bytes_first: u64,
    pool_bytes_last: u64,
    /// The most bytes tensors held at once over the run.
    peak_bytes: u64,
    /// Buffers made after the second step (the tensor pool's, the arenas', the read-backs'):
    /// 0 when every later step reuses what the first two made.
    buffers_created_after_step_2: u64,
    /// --tune: the products searched, each with its tile and time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tuned: Vec<Tuned>,
}

#[derive(Serialize)]
struct Tuned {
    product: String,
    /// The tile (and K ranges) written to the table, and its time alone.
    tile: String,
    ms: f64,
    default_tile: String,
    default_ms: Option<f64>,
    /// The fastest alone, where the step chose another (or kept it).
    searched_tile: String,
    /// Median GPU-busy ms of a step under the searched and the kept tile (checked in the
    /// step; absent with --tune-isolated or without timestamps).
    searched_step_busy_ms: Option<f64>,
    step_busy_ms: Option<f64>,
}

/// GPU memory the tensor pool holds: live and cached.
fn pool_bytes(dev: &Device) -> u64 {
    let p = dev.pool_stats();
    p.bytes_live + p.bytes_cached
}

pub fn run(args: &Args) -> Result<()> {
    with_ranks(args.reduce, |dev, world| bench(args, dev, world))
}

fn median_of(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

fn bench(args: &Args, dev: &Device, reduction: Option<Box<dyn Reduction>>) -> Result<()> {
    let dev = dev.clone();
    let config = setup::config(Some(&args.preset), args.model.as_deref())?;
    setup::check_run(&config, args.batch, args.seq, args.steps, args.warmup)?;
    let (batch, seq, amp) = (args.batch, args.seq, args.amp);
    check_fits(&dev, &config, Workload::Train { batch, seq, amp })?;
    let name = args
        .model
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or(args.preset.clone());
    let mut model = setup::model(&dev, config.clone(), 0)?;
    model.set_amp(args.amp)?;
    let params = model.params.numel();
    let adamw = AdamWConfig {
        weight_decay: 0.1,
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    let mut trainer = Trainer::new(model, adamw, 1e-4, LrSchedule::Constant { warmup: 0 })?;
    let (mut rank, mut world_size) = (0, 1);
    if let Some(reduction) = reduction {
        if args.tune {
            return Err(Error::InvalidArgument {
                op: "--tune",
                reason: "tile searches run on one process: tune without mpirun first".into(),
            });
        }
        (rank, world_size) = (
            reduction.collective().rank(),
            reduction.collective().world_size(),
        );
        trainer.set_reduction(reduction)?;
    }
    // Each rank its own tokens.
    let seed = 1 + rank as u64;
    let batch = setup::random_batch(&dev, config.vocab_size, args.batch, args.seq, seed)?;
    let mut reduce_times = Vec::new();
    let mut tuned = Vec::new();
    if args.tune {
        let searches = tune::search_step(&dev, 5, || {
            trainer.step(std::slice::from_ref(&batch)).map(drop)
        })?;
        let refined = if args.tune_isolated {
            None
        } else {
            tune::in_step::refine_step(&dev, &searches, || {
                trainer.step(std::slice::from_ref(&batch))?.item().map(drop)
            })?
        };
        tune::save_tiles(&dev)?;
        tuned = searches
            .iter()
            .map(|s| {
                let r = refined
                    .as_ref()
                    .and_then(|r| r.iter().find(|r| r.key == s.key));
                let kept = r.map_or(s.best(), |r| r.chosen);
                let busy = r.map(|r| r.busy_ms());
                Tuned {
                    product: s.key.describe(),
                    tile: kept.name(),
                    ms: kept.ms,
                    default_tile: s.default.name(),
                    default_ms: s.default_ms(),
                    searched_tile: s.best().name(),
                    searched_step_busy_ms: busy.map(|b| b.0),
                    step_busy_ms: busy.map(|b| b.1),
                }
            })
            .collect();
    }
    let mut times = Vec::new();
    let mut submits = 0u64;
    let mut created = 0u64;
    let mut dispatches = 0u64;
    let mut barriers = 0u64;
    let mut moved = 0u64;
    let mut losses = Vec::new();
    let mut step0 = (0, 0.0, 0.0);
    let mut slowest = Vec::new();
    let mut pool_bytes_first = 0;
    let mut created_by_step_2 = None;
    let total_steps = args.warmup.max(1) + args.steps;
    for i in 0..total_steps {
        let c0 = dev.counters();
        let p0 = (i == 0).then(|| dev.pipeline_stats());
        let b0 = dev.pool_stats().buffers_created;
        let t = Instant::now();
        let loss = trainer.step(std::slice::from_ref(&batch))?;
        losses.push(loss.item()?); // synchronizes
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if let Some(p0) = p0 {
            let p = dev.pipeline_stats();
            step0 = (
                p.pipelines_compiled - p0.pipelines_compiled,
                p.compile_ms - p0.compile_ms,
                (dev.counters() - c0).compile_wait_ns as f64 * 1e-6,
            );
            slowest = dev
                .slowest_compiles(5)
                .into_iter()
                .map(|(kernel, variant, ms)| SlowCompile {
                    kernel,
                    variant: variant.to_string(),
                    ms,
                })
                .collect();
        }
        if i >= args.warmup.max(1) {
            if let Some(r) = trainer.reduction() {
                reduce_times.push(r.last_time().as_secs_f64() * 1e3);
            }
            let c = dev.counters() - c0;
            submits += c.submits;
            dispatches += c.dispatches;
            barriers += c.barriers;
            moved += c.moved;
            created += dev.pool_stats().buffers_created - b0;
        }
        times.push(ms);
        let buffers = dev.pool_stats().buffers_created + dev.other_buffers_created();
        match i {
            0 => pool_bytes_first = pool_bytes(&dev),
            1 => created_by_step_2 = Some(buffers),
            _ => {}
        }
    }
    let buffers = dev.pool_stats().buffers_created + dev.other_buffers_created();
    let scale = trainer.opt.loss_scale()?;
    let timed: Vec<f64> = times[args.warmup.max(1)..].to_vec();
    let mut sorted = timed.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let n = sorted.len().max(1) as f64;
    let median = median_of(&sorted);
    let report = Report {
        adapter: dev.report().adapter,
        model: name,
        batch: args.batch,
        seq: args.seq,
        params,
        amp: args.amp,
        world_size,
        reduction: trainer.reduction().map(|r| r.describe()),
        reduce_ms: trainer.reduction().map(|_| median_of(&reduce_times)),
        step0_ms: times[0],
        step0_pipelines_compiled: step0.0,
        step0_compile_ms: step0.1,
        step0_compile_wait_ms: step0.2,
        step0_slowest_compiles: slowest,
        compile_threads: dev.pipeline_stats().compile_threads,
        median_ms: median,
        min_ms: sorted.first().copied().unwrap_or(0.0),
        max_ms: sorted.last().copied().unwrap_or(0.0),
        tokens_per_s: (world_size * args.batch * args.seq) as f64 / (median * 1e-3),
        submits_per_step: submits as f64 / n,
        buffers_created_per_step: created as f64 / n,
        dispatches_per_step: dispatches as f64 / n,
        barriers_per_step: barriers as f64 / n,
        moved_per_step: moved as f64 / n,
        wait: format!("{:?}", dev.wait_mode()).to_lowercase(),
        loss_first: losses[0],
        loss_last: *losses.last().expect("steps ran"),
        loss_scale: scale.map(|s| s.scale),
        skipped_steps: scale.map(|s| s.skipped_steps),
        pool_bytes_first,
        pool_bytes_last: pool_bytes(&dev),
        peak_bytes: dev.pool_stats().peak_bytes_live,
        buffers_created_after_step_2: created_by_step_2.map_or(0, |b| buffers - b),
        tuned,
    };
    if rank > 0 {
        return Ok(());
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serializes")
        );
    } else {
        println!(
            "adapter {}; model {} ({} parameters); B x T = {} x {}; {}",
            report.adapter,
            report.model,
            report.params,
            report.batch,
            report.seq,
            if report.amp { "mixed precision" } else { "f32" }
        );
        println!(
            "step 0 (cold)        {:>10.2} ms  ({} pipelines compiled: {:.0} ms of compiling on {} threads, waited {:.0} ms)",
            report.step0_ms,
            report.step0_pipelines_compiled,
            report.step0_compile_ms,
            report.compile_threads,
            report.step0_compile_wait_ms
        );
        for c in &report.step0_slowest_compiles {
            let v: String = c.variant.chars().take(72).collect();
            println!("  compiled in {:>7.1} ms  {} [{v}]", c.ms, c.kernel);
        }
        println!(
            "step median          {:>10.2} ms  (min {:.2}, max {:.2}, {} steps after {} warm-up)",
            report.median_ms,
            report.min_ms,
            report.max_ms,
            args.steps,
            args.warmup.max(1)
        );
        println!("tokens/s             {:>10.0}", report.tokens_per_s);
        if let (Some(how), Some(ms)) = (&report.reduction, report.reduce_ms) {
            println!(
                "ranks                {:>10}  (gradients averaged by {how}: {ms:.2} ms a step, median)",
                report.world_size
            );
        }
        println!("submits per step     {:>10.1}", report.submits_per_step);
        println!(
            "buffers created/step {:>10.1}",
            report.buffers_created_per_step
        );
        println!("dispatches per step  {:>10.1}", report.dispatches_per_step);
        println!("barriers per step    {:>10.1}", report.barriers_per_step);
        println!("moved ahead per step {:>10.1}", report.moved_per_step);
        println!("waiting on the GPU   {:>10}", report.wait);
        println!(
            "pool memory          {:>10} -> {} bytes (step 1 -> last; peak live {}, {} buffers made after step 2)",
            report.pool_bytes_first,
            report.pool_bytes_last,
            report.peak_bytes,
            report.buffers_created_after_step_2
        );
        println!(
            "loss                 {:>10.4} -> {:.4}",
            report.loss_first, report.loss_last
        );
        if let (Some(scale), Some(skipped)) = (report.loss_scale, report.skipped_steps) {
            println!("loss scale           {scale:>10} ({skipped} steps skipped on overflow)");
        }
        if !report.tuned.is_empty() {
            println!("\ntuned products (tile table written):");
            for t in &report.tuned {
                let default = match t.default_ms {
                    Some(ms) => format!("{ms:.3} ms"),
                    None => "not measured".into(),
                };
                println!(
                    "  {:<40} {:<22} {:>9.3} ms   (default {} {})",
                    t.product, t.tile, t.ms, t.default_tile, default
                );
                if let (Some(a), Some(b)) = (t.searched_step_busy_ms, t.step_busy_ms) {
                    println!(
                        "  {:<40} in the step: GPU busy {b:.3} ms a step; the fastest alone ({}) {a:.3}",
                        "", t.searched_tile
                    );
                }
            }
        }
    }
    Ok(())
}
