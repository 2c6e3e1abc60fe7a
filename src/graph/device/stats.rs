//! What a Device counts and times: dispatches, submits, barriers and waits (`Counters`), the
//! pools and pipeline caches, and GPU timestamps for the profiler.

use super::{Device, Phase};
use crate::error::{Error, Result};
use crate::graph::segment::Counters;
use crate::graph::timing::{self, GpuInterval, GpuTimer, TimingMode};
use crate::kernels::PipelineStats;
use crate::memory::PoolStats;

impl Device {
    /// Counters since the device was made; subtract two readings for an interval.
    pub fn counters(&self) -> Counters {
        self.state().counters
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.state().pool.stats()
    }

    /// Buffers created outside the tensor pool (arenas, read-back buffers) since the start.
    pub fn other_buffers_created(&self) -> u64 {
        let s = self.state();
        s.params_gpu.buffers_created
            + s.uploads_gpu.buffers_created
            + s.read_back_pool.stats().buffers_created
    }

    pub fn pipeline_stats(&self) -> PipelineStats {
        self.state().pipelines.stats()
    }

    /// The `n` kernel variants whose compiles took longest so far (`PipelineCache::
    /// slowest_compiles`): kernel, variant, milliseconds.
    pub fn slowest_compiles(&self, n: usize) -> Vec<(&'static str, std::sync::Arc<str>, f64)> {
        self.state().pipelines.slowest_compiles(n)
    }

    pub fn bind_groups_cached(&self) -> usize {
        self.state().bind_groups.len()
    }

    /// Zeroes the pool's running counters (creations, reuses); the peak restarts from now.
    pub fn reset_pool_counters(&self) {
        self.state().pool.reset_counters();
    }

    /// Sets what the following dispatches are counted as; returns the previous phase.
    pub fn set_phase(&self, phase: Phase) -> Phase {
        std::mem::replace(&mut self.state().phase, phase)
    }

    /// Turns GPU timestamps on or off (flushing first); returns the mode now in force, None
    /// when off or when the adapter has no timestamps.
    pub fn set_gpu_timing(&self, on: bool) -> Option<TimingMode> {
        self.flush();
        let gpu = &self.rt.gpu;
        let mode = if !on {
            None
        } else if gpu.has(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
            Some(TimingMode::PerDispatch)
        } else if gpu.has(wgpu::Features::TIMESTAMP_QUERY) {
            Some(TimingMode::PerPass)
        } else {
            None
        };
        let mut s = self.state();
        s.timer = mode.map(|m| GpuTimer::new(&gpu.device, &gpu.queue, m));
        if mode.is_some() {
            // Two queries per dispatch must fit one query set per flush.
            s.flush_bound = s.flush_bound.min(timing::MAX_QUERIES as usize / 2);
        }
        mode
    }

    /// Flushes, waits for the GPU, and returns every interval timed since the last call.
    pub fn take_gpu_intervals(&self) -> Result<Vec<GpuInterval>> {
        self.sync()?;
        let mut s = self.state();
        match s.timer.as_mut() {
            Some(t) => t.collect(&self.rt.gpu.device).map_err(Error::ReadBack),
            None => Ok(Vec::new()),
        }
    }
}
