//! Timing recorded work on the GPU: `gpu_ms` (the median of GPU timestamps over repeated
//! calls, after warming the clocks up) and `warm_up`. Benchmarks and tile searches use them;
//! nothing asserts on their results.

use std::time::Instant;

use crate::error::Result;
use crate::graph::{Device, Tensor};

/// How long `gpu_ms` keeps the GPU running the untimed calls back to back before it times
/// any. An H200 left idle while a new pipeline compiled (tens of milliseconds) ran the next
/// products at 1/3 to 1/4 of their speed for 5 to 10 ms of work (`WGRAD_TIMING_TRACE`,
/// 2026-11-23: a 4096 x 768 x 3072 product read 0.74 ms right after a compile, 0.21 ms next).
pub const WARM_MS: f64 = 30.0;

/// Median GPU milliseconds of what one call of `f` records, over `reps` calls recorded back to
/// back. Before them: one call, waited for (its pipelines compile, its buffers exist), then
/// untimed calls back to back for `WARM_MS` of wall time and `reps` calls at least, submitted
/// as they are recorded (a GPU left idle drops its clocks: after a compile, or between synchronized calls,
/// an H200 ran the same matmul 2 to 4 times slower). The time is the summed GPU timestamps
/// of each call's dispatches where the adapter has timestamps, else the wall time of the
/// timed calls over `reps`.
pub fn gpu_ms<T>(device: &Device, reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<f64> {
    let reps = reps.max(1);
    drop(f()?);
    device.sync()?;
    let warm = Instant::now();
    // Batches of calls, each twice the last (up to 1024), so that a short product keeps the
    // GPU busy between waits as well; submitted every 16 calls, so the GPU runs them while
    // the next ones are recorded.
    let (mut untimed, mut batch) = (0, reps);
    while untimed < reps || warm.elapsed().as_secs_f64() * 1e3 < WARM_MS {
        for i in 0..batch {
            drop(f()?);
            if i % 16 == 15 {
                device.flush();
            }
        }
        untimed += batch;
        batch = (batch * 2).min(1024);
        device.sync()?;
    }
    if device.set_gpu_timing(true).is_some() {
        for _ in 0..reps {
            drop(f()?);
        }
        let intervals = device.take_gpu_intervals()?;
        device.set_gpu_timing(false);
        if !intervals.is_empty() && intervals.len().is_multiple_of(reps) {
            let per = intervals.len() / reps;
            let mut times: Vec<f64> = intervals
                .chunks(per)
                .map(|c| c.iter().map(|i| (i.end_ns - i.start_ns) * 1e-6).sum())
                .collect();
            if device.options().lab.timing_trace() {
                let span = intervals.last().map_or(0.0, |l| l.end_ns) - intervals[0].start_ns;
                let kinds: Vec<String> = intervals[..per]
                    .iter()
                    .map(|i| {
                        format!(
                            "{}[{}]{:?} {:.1}us",
                            i.label,
                            i.variant,
                            i.groups,
                            (i.end_ns - i.start_ns) * 1e-3
                        )
                    })
                    .collect();
                let gaps: Vec<String> = intervals
                    .windows(2)
                    .map(|w| format!("{:.1}", (w[1].start_ns - w[0].end_ns) * 1e-3))
                    .collect();
                eprintln!(
                    "timing: {reps} reps x {per} dispatches; sums ms {:?}; span/rep {:.4} ms; gaps us {:?}; first rep: {}",
                    times.iter().map(|t| (t * 1e4).round() / 1e4).collect::<Vec<_>>(),
                    span * 1e-6 / reps as f64,
                    gaps,
                    kinds.join(", ")
                );
            }
            times.sort_by(f64::total_cmp);
            return Ok(times[reps / 2]);
        }
    }
    let start = Instant::now();
    for _ in 0..reps {
        drop(f()?);
    }
    device.sync()?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / reps as f64)
}

/// Keeps the GPU busy for about `ms` milliseconds (1024³ f32 products back to back), so its
/// clocks are up before a measurement.
pub fn warm_up(device: &Device, ms: f64) -> Result<()> {
    let a = Tensor::rand_uniform(device, &[1024, 1024], -1.0, 1.0, 1)?;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() * 1e3 < ms {
        for _ in 0..8 {
            drop(a.matmul(&a)?);
        }
        device.sync()?;
    }
    Ok(())
}
