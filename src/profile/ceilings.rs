//! The roofs kernels are measured against, measured on this adapter: the device-to-device copy
//! bandwidth (bytes read plus written), the f32 FMA rate of shader code, and the f16
//! cooperative-matrix rate where the adapter has cooperative matrices. `gpu_ms` times recorded
//! work with GPU timestamps.

use std::time::Instant;

use serde::Serialize;

use crate::error::Result;
use crate::graph::{DType, Device, Tensor};
use crate::kernels::matmul_coop::Coop;
use crate::kernels::peak::{self, PeakParams};

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
            if trace_timing() {
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

/// `WGRAD_TIMING_TRACE=1`: `gpu_ms` prints every timed call's intervals to stderr (a
/// measurement switch).
pub(crate) fn trace_timing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("WGRAD_TIMING_TRACE").is_ok_and(|v| v == "1"))
}

/// Keeps the GPU busy for about `ms` milliseconds (f32 FMA chains), so its clocks are up
/// before a measurement.
pub fn warm_up(device: &Device, ms: f64) -> Result<()> {
    let out = Tensor::uninit(
        device,
        &[1024 * peak::FMA_LANES as usize],
        DType::F32,
        "peak",
    )?;
    let params = PeakParams {
        iters: 1024,
        _pad: [0; 3],
    };
    let start = Instant::now();
    while start.elapsed().as_secs_f64() * 1e3 < ms {
        for _ in 0..16 {
            device.record(
                &peak::PEAK_FMA,
                &crate::kernels::Spec::new(),
                &params,
                &[out.storage()],
                [1024, 1, 1],
            );
        }
        device.sync()?;
    }
    Ok(())
}

/// The measured roofs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Ceilings {
    /// A buffer-to-buffer copy: GB/s counting bytes read plus written.
    pub copy_gbps: f64,
    /// f32 FMA chains in shader code, TFLOP/s.
    pub fma_tflops: f64,
    /// f16 x f16 -> f32 cooperative-matrix multiply-adds, TFLOP/s (None without them).
    pub coop_tflops: Option<f64>,
    /// The same with two fragment loads from workgroup memory per four multiply-adds (the
    /// ratio of matmul_coop's 4 x 4-fragment subgroup tiles), TFLOP/s.
    pub coop_shared_tflops: Option<f64>,
}

/// Measures the roofs (`quick`: small sizes, for a smoke run), after warming the GPU up.
pub fn measure(device: &Device, quick: bool) -> Result<Ceilings> {
    warm_up(device, if quick { 10.0 } else { 300.0 })?;
    Ok(Ceilings {
        copy_gbps: copy_gbps(device, quick)?,
        fma_tflops: fma_tflops(device, quick)?,
        coop_tflops: match Coop::available(device.gpu()) {
            Some(coop) => Some(coop_tflops(device, coop, quick, &peak::PEAK_COOP)?),
            None => None,
        },
        coop_shared_tflops: match Coop::available(device.gpu()) {
            Some(coop) => Some(coop_tflops(device, coop, quick, &peak::PEAK_COOP_SHARED)?),
            None => None,
        },
    })
}

/// Copies of a 256 MiB buffer (1 MiB quick) back to back, wall time over a batch; the best
/// of 3 batches.
fn copy_gbps(device: &Device, quick: bool) -> Result<f64> {
    let n = if quick { 1 << 18 } else { 1 << 26 };
    let reps = if quick { 4 } else { 40 };
    let src = Tensor::zeros(device, &[n])?;
    let dst = Tensor::zeros(device, &[n])?;
    let bytes = 4 * n as u64;
    device.copy_storage(src.storage(), dst.storage(), bytes);
    device.sync()?;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..reps {
            device.copy_storage(src.storage(), dst.storage(), bytes);
        }
        device.sync()?;
        let s = start.elapsed().as_secs_f64() / reps as f64;
        best = best.max(2.0 * bytes as f64 / s / 1e9);
    }
    Ok(best)
}

fn fma_tflops(device: &Device, quick: bool) -> Result<f64> {
    let groups: u32 = if quick { 8 } else { 4096 };
    let iters: u32 = if quick { 64 } else { 4096 };
    let out = Tensor::uninit(
        device,
        &[(groups * peak::FMA_LANES) as usize],
        DType::F32,
        "peak",
    )?;
    let params = PeakParams {
        iters,
        _pad: [0; 3],
    };
    let ms = gpu_ms(device, 5, || {
        device.record(
            &peak::PEAK_FMA,
            &crate::kernels::Spec::new(),
            &params,
            &[out.storage()],
            [groups, 1, 1],
        );
        Ok(())
    })?;
    let flop =
        groups as f64 * peak::FMA_LANES as f64 * iters as f64 * peak::FMA_FLOP_PER_STEP as f64;
    Ok(flop / (ms * 1e-3) / 1e12)
}

fn coop_tflops(
    device: &Device,
    coop: Coop,
    quick: bool,
    kernel: &'static crate::kernels::KernelDesc,
) -> Result<f64> {
    let groups: u32 = if quick { 8 } else { 2048 };
    let iters: u32 = if quick { 64 } else { 2048 };
    let fe = (coop.fs * coop.fs) as usize;
    let subgroups = (groups * peak::COOP_SUBGROUPS) as usize;
    let out = Tensor::uninit(device, &[subgroups * 4 * fe], DType::F32, "peak")?;
    let src = Tensor::rand_uniform(device, &[fe], -1.0, 1.0, 7)?.to_dtype(DType::F16)?;
    let params = PeakParams {
        iters,
        _pad: [0; 3],
    };
    let spec = peak::coop_spec(coop);
    let ms = gpu_ms(device, 5, || {
        device.record(
            kernel,
            &spec,
            &params,
            &[out.storage(), src.storage()],
            [groups, 1, 1],
        );
        Ok(())
    })?;
    let fs = coop.fs as f64;
    let flop = subgroups as f64 * iters as f64 * 4.0 * 2.0 * fs * fs * fs;
    Ok(flop / (ms * 1e-3) / 1e12)
}
