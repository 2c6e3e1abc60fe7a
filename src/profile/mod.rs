//! Step-time profiling: GPU time per kernel from timestamps, CPU time per phase from tracing
//! spans, per-step counters, wall times, and a Chrome trace. It observes; it changes nothing
//! that runs (timestamps are written only while a Profiler is alive).

pub mod ceilings;
mod report;
mod spans;
pub mod timed;
mod trace;

pub use report::{KernelRow, PhaseRow, ProfileReport, StepStats};
pub use spans::{CpuSpan, SpanCollector};
pub use trace::chrome_trace;

use std::time::Instant;

use crate::error::Result;
use crate::graph::{Device, GpuInterval, TimingMode};
use crate::memory::PoolStats;
use crate::Counters;

/// What one profiled step measured.
#[derive(Clone, Debug)]
pub struct StepRecord {
    pub wall_ms: f64,
    pub counters: Counters,
    pub pool_before: PoolStats,
    pub pool_after: PoolStats,
    pub pipelines_compiled: u64,
    /// Milliseconds of compiling finished during the step, summed over the compile workers.
    pub compile_ms: f64,
    pub gpu: Vec<GpuInterval>,
    pub cpu: Vec<CpuSpan>,
    /// When the step started, on the span collector's clock (us).
    pub start_us: f64,
}

/// Runs steps under measurement. Create it after the model is built; drop it to stop timing.
pub struct Profiler {
    device: Device,
    collector: SpanCollector,
    _guard: tracing::dispatcher::DefaultGuard,
    pub mode: Option<TimingMode>,
    pub steps: Vec<StepRecord>,
    /// Wall times of steps run without timestamps (`untimed_steps`).
    pub untimed_ms: Vec<f64>,
}

impl Profiler {
    pub fn new(device: &Device) -> Profiler {
        let collector = SpanCollector::default();
        let guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(collector.clone()));
        let mode = device.set_gpu_timing(true);
        Profiler {
            device: device.clone(),
            collector,
            _guard: guard,
            mode,
            steps: Vec::new(),
            untimed_ms: Vec::new(),
        }
    }

    /// Runs one step (`f` records and finishes it, e.g. reads the loss), synchronized, and
    /// keeps its measurements.
    pub fn step<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let dev = &self.device;
        dev.sync()?;
        let _ = dev.take_gpu_intervals()?;
        let _ = self.collector.take();
        let c0 = dev.counters();
        let pool_before = dev.pool_stats();
        let pipes0 = dev.pipeline_stats();
        let start_us = self.collector.now_us();
        let t = Instant::now();
        let out = f()?;
        dev.sync()?;
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        let pipes = dev.pipeline_stats();
        self.steps.push(StepRecord {
            wall_ms,
            counters: dev.counters() - c0,
            pool_before,
            pool_after: dev.pool_stats(),
            pipelines_compiled: pipes.pipelines_compiled - pipes0.pipelines_compiled,
            compile_ms: pipes.compile_ms - pipes0.compile_ms,
            gpu: dev.take_gpu_intervals()?,
            cpu: self.collector.take(),
            start_us,
        });
        Ok(out)
    }

    /// Runs `n` steps (`f` as for `step`) with the GPU timestamps off, each synchronized, and
    /// keeps their wall times: the step as `bench step` times it, which the report sets beside
    /// the timed one (what profiling costs). Timestamps are on again after.
    pub fn untimed_steps<T>(&mut self, n: usize, mut f: impl FnMut() -> Result<T>) -> Result<()> {
        let dev = self.device.clone();
        dev.set_gpu_timing(false);
        for _ in 0..n {
            dev.sync()?;
            let t = Instant::now();
            f()?;
            dev.sync()?;
            self.untimed_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let _ = self.collector.take();
        self.mode = dev.set_gpu_timing(true);
        let _ = dev.take_gpu_intervals()?;
        Ok(())
    }

    /// The report over the recorded steps; the first `warmup` are left out of the steady-state
    /// figures (step 0 is reported on its own).
    pub fn report(&self, warmup: usize) -> ProfileReport {
        report::build(&self.steps, warmup, self.mode, &self.untimed_ms)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        self.device.set_gpu_timing(false);
    }
}
