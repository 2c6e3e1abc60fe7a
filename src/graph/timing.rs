//! GPU timestamps for profiling: a timestamp before and after every dispatch (where the adapter
//! can write timestamps inside compute passes), else at the start and end of every pass. Off by
//! default: then no query set exists and encoding writes nothing.
//!
//! Timestamps are resolved and copied to a mappable buffer inside the flush that wrote them;
//! they are read (waiting for the GPU) only when the profiler asks (`Device::take_gpu_intervals`).

use std::sync::Arc;

use serde::Serialize;

use crate::kernels::Pipeline;

/// One query set holds this many timestamps (wgpu's QUERY_SET_MAX_QUERIES), so a flush times
/// at most half as many dispatches; the Device lowers its flush bound to fit.
pub const MAX_QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// How finely the GPU is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TimingMode {
    /// Around every dispatch (TIMESTAMP_QUERY_INSIDE_PASSES).
    PerDispatch,
    /// Around every compute pass (TIMESTAMP_QUERY only, e.g. Metal).
    PerPass,
}

/// A timed interval on the GPU's clock, in nanoseconds.
#[derive(Clone, Debug, Serialize)]
pub struct GpuInterval {
    pub label: &'static str,
    /// The kernel variant (`Spec::describe`); empty for a pass.
    pub variant: Arc<str>,
    /// The dispatch's workgroup counts; zeros for a pass.
    pub groups: [u32; 3],
    pub start_ns: f64,
    pub end_ns: f64,
}

/// What one pair of timestamps timed.
#[derive(Clone)]
struct Timed {
    label: &'static str,
    variant: Arc<str>,
    groups: [u32; 3],
}

struct Pending {
    buffer: wgpu::Buffer,
    labels: Vec<Timed>,
}

pub struct GpuTimer {
    pub mode: TimingMode,
    query_set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    free: Vec<wgpu::Buffer>,
    pending: Vec<Pending>,
    period_ns: f64,
    /// Queries written by the flush being encoded, and what each pair timed.
    next: u32,
    labels: Vec<Timed>,
}

impl GpuTimer {
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue, mode: TimingMode) -> GpuTimer {
        GpuTimer {
            mode,
            query_set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("wgrad:timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: MAX_QUERIES,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgrad:timestamps-resolve"),
                size: MAX_QUERIES as u64 * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            free: Vec::new(),
            pending: Vec::new(),
            period_ns: queue.get_timestamp_period() as f64,
            next: 0,
            labels: Vec::new(),
        }
    }

    /// Timestamp writes for a pass about to begin (per-pass mode).
    pub fn pass_writes(&mut self) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        if self.mode != TimingMode::PerPass || self.next + 2 > MAX_QUERIES {
            return None;
        }
        let i = self.next;
        self.next += 2;
        self.labels.push(Timed {
            label: "compute pass",
            variant: Arc::from(""),
            groups: [0; 3],
        });
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.query_set,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: Some(i + 1),
        })
    }

    /// Wraps one dispatch in timestamps (per-dispatch mode).
    pub fn around_dispatch(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        pipeline: &Pipeline,
        groups: [u32; 3],
        dispatch: impl FnOnce(&mut wgpu::ComputePass<'_>),
    ) {
        if self.mode != TimingMode::PerDispatch || self.next + 2 > MAX_QUERIES {
            dispatch(pass);
            return;
        }
        pass.write_timestamp(&self.query_set, self.next);
        dispatch(pass);
        pass.write_timestamp(&self.query_set, self.next + 1);
        self.next += 2;
        self.labels.push(Timed {
            label: pipeline.label,
            variant: pipeline.variant.clone(),
            groups,
        });
    }

    /// After the flush's last command: resolve its timestamps into a mappable buffer.
    pub fn finish_flush(&mut self, device: &wgpu::Device, encoder: &mut wgpu::CommandEncoder) {
        if self.next == 0 {
            return;
        }
        let bytes = self.next as u64 * 8;
        encoder.resolve_query_set(&self.query_set, 0..self.next, &self.resolve, 0);
        let buffer = self.free.pop().unwrap_or_else(|| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgrad:timestamps-read"),
                size: MAX_QUERIES as u64 * 8,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &buffer, 0, bytes);
        self.pending.push(Pending {
            buffer,
            labels: std::mem::take(&mut self.labels),
        });
        self.next = 0;
    }

    /// Reads every flushed interval (the caller has waited for the GPU).
    pub fn collect(&mut self, device: &wgpu::Device) -> Result<Vec<GpuInterval>, String> {
        let mut out = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let bytes = p.labels.len() as u64 * 16;
            let slice = p.buffer.slice(0..bytes);
            let (tx, rx) = std::sync::mpsc::channel();
            slice.map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            device
                .poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                })
                .map_err(|e| e.to_string())?;
            rx.recv()
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            {
                let view = slice.get_mapped_range().map_err(|e| e.to_string())?;
                let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&view[..]);
                for (k, t) in p.labels.iter().enumerate() {
                    out.push(GpuInterval {
                        label: t.label,
                        variant: t.variant.clone(),
                        groups: t.groups,
                        start_ns: ticks[2 * k] as f64 * self.period_ns,
                        end_ns: ticks[2 * k + 1] as f64 * self.period_ns,
                    });
                }
            }
            p.buffer.unmap();
            self.free.push(p.buffer);
        }
        Ok(out)
    }
}
