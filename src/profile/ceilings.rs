//! The roofs kernels are measured against, measured on this adapter: the device-to-device copy
//! bandwidth (bytes read plus written) and, in a `lab` build (`--features lab`: the peak
//! kernels are measurement code), the f32 FMA rate of shader code and the f16
//! cooperative-matrix rate where the adapter has cooperative matrices.

use std::time::Instant;

use serde::Serialize;

use super::timed::warm_up;
use crate::error::Result;
use crate::graph::{Device, Tensor};
#[cfg(feature = "lab")]
use {
    super::timed::gpu_ms,
    crate::graph::DType,
    crate::kernels::matmul_coop::Coop,
    crate::kernels::peak::{self, PeakParams},
};

/// The measured roofs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Ceilings {
    /// A buffer-to-buffer copy: GB/s counting bytes read plus written.
    pub copy_gbps: f64,
    /// f32 FMA chains in shader code, TFLOP/s (a `lab` build's; else None).
    pub fma_tflops: Option<f64>,
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
        ..compute_roofs(device, quick)?
    })
}

/// Without the peak kernels (a default build): no compute roofs.
#[cfg(not(feature = "lab"))]
fn compute_roofs(_device: &Device, _quick: bool) -> Result<Ceilings> {
    Ok(Ceilings {
        copy_gbps: 0.0,
        fma_tflops: None,
        coop_tflops: None,
        coop_shared_tflops: None,
    })
}

/// The compute roofs of the peak kernels.
#[cfg(feature = "lab")]
fn compute_roofs(device: &Device, quick: bool) -> Result<Ceilings> {
    Ok(Ceilings {
        copy_gbps: 0.0,
        fma_tflops: Some(fma_tflops(device, quick)?),
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

/// Copies of a 256 MiB buffer (1 MiB quick; at most the adapter's storage-binding limit)
/// back to back, wall time over a batch; the best of 3 batches.
fn copy_gbps(device: &Device, quick: bool) -> Result<f64> {
    let limit = device.gpu().limits.max_storage_buffer_binding_size as usize / 4;
    let n = if quick { 1 << 18 } else { 1 << 26 }.min(limit);
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

#[cfg(feature = "lab")]
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

#[cfg(feature = "lab")]
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
