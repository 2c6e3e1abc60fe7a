//! Recording: each op appends its dispatch (kernel, specialization, params, buffers,
//! workgroups) or copy to the open Segment and returns; a Segment past its bound, or armed to
//! submit early, is flushed from here.

use bytemuck::Pod;

use super::{Device, Storage, SPLIT_TICKETS, TICKET_BUFFERS};
use crate::error::{Error, Result};
use crate::graph::segment::{BufferRef, Command, Dispatch, Phase};
use crate::kernels::{KernelDesc, Spec};

impl Device {
    /// Flushes past this many recorded dispatches.
    pub fn set_flush_bound(&self, dispatches: usize) {
        self.state().flush_bound = dispatches.max(1);
    }

    /// Submits the open Segment once it holds `dispatches` dispatches (once; later work goes
    /// on into the next Segment as usual). A training step arms it before its forward, so the
    /// GPU starts on the first layers while the CPU records and encodes the rest instead of
    /// waiting for the whole forward. Where a pipeline of the Segment is still compiling at
    /// that count, the bound is dropped without a submit (`flush_if_compiled`).
    pub fn submit_early(&self, dispatches: usize) {
        self.state().early_flush = Some(dispatches.max(1));
    }

    /// Appends one dispatch to the open Segment.
    pub(crate) fn record<P: Pod>(
        &self,
        kernel: &'static KernelDesc,
        spec: &Spec,
        params: &P,
        buffers: &[&Storage],
        groups: [u32; 3],
    ) {
        self.record_split(kernel, spec, params, buffers, groups, false);
    }

    /// `record`, with the split tickets (`split_tickets`) bound after `buffers` where
    /// `tickets`.
    pub(crate) fn record_split<P: Pod>(
        &self,
        kernel: &'static KernelDesc,
        spec: &Spec,
        params: &P,
        buffers: &[&Storage],
        groups: [u32; 3],
        tickets: bool,
    ) {
        debug_assert_eq!(std::mem::size_of::<P>() as u64, kernel.params_size);
        debug_assert_eq!(buffers.len() + tickets as usize, kernel.storage.len());
        // A `lab` build's `WGRAD_SKIP_KERNELS` (results wrong: a step's time without them bounds
        // what fusing them away can save); in a default build `skips` is `false`, folded away.
        if groups.contains(&0) || self.rt.options.lab.skips(kernel.name) {
            return;
        }
        let mut s = self.state();
        let mut bound: Vec<BufferRef> = buffers.iter().map(|b| b.buffer_ref()).collect();
        if tickets {
            // The ticket buffers in turn: a dispatch binding one for writing waits behind the
            // last that bound it, so consecutive ones bind different buffers and independent
            // products (a linear's dX and dW) keep running side by side.
            let i = s.next_tickets;
            s.next_tickets = (i + 1) % TICKET_BUFFERS;
            if s.split_tickets.len() <= i {
                // The tickets must start at 0: written so here (wgpu also zeroes a new buffer
                // before its first use). A new buffer, so the write runs before any work that
                // binds it.
                let gpu = &self.rt.gpu;
                let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgrad:split_tickets"),
                    size: (SPLIT_TICKETS * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                gpu.queue
                    .write_buffer(&buffer, 0, &vec![0u8; SPLIT_TICKETS * 4]);
                s.split_tickets.push(BufferRef {
                    buffer,
                    id: crate::memory::next_buffer_id(),
                });
            }
            bound.push(s.split_tickets[i].clone());
        }
        let pipeline = s.pipelines.get(&self.rt.gpu.device, kernel, spec);
        if !pipeline.is_compiled() {
            s.segment.compiling.push(pipeline.clone());
        }
        let align = s.params_align;
        let params_offset = s.segment.params.push(bytemuck::bytes_of(params), align) as u32;
        s.segment.commands.push(Command::Dispatch(Dispatch {
            pipeline,
            buffers: bound,
            params_offset,
            groups,
        }));
        s.segment.dispatches += 1;
        s.counters.dispatches += 1;
        match s.phase {
            Phase::Forward => s.counters.forward_dispatches += 1,
            Phase::Backward => s.counters.backward_dispatches += 1,
            Phase::Optimizer => s.counters.optimizer_dispatches += 1,
        }
        let early = s.early_flush.is_some_and(|n| s.segment.dispatches >= n);
        if s.held.is_some() {
            // Recorded on until submits are released (`hold_submits`).
        } else if s.segment.dispatches >= s.flush_bound || (early && s.segment.pipelines_ready()) {
            self.flush_locked(&mut s);
        } else if early {
            // A cold Segment goes on recording instead (see `flush_if_compiled`).
            s.early_flush = None;
        }
    }

    /// Records a copy of the first `bytes` of `src` into `dst` (a buffer-to-buffer copy in
    /// order with the recorded work: the device-to-device copy `wgrad bench` measures against).
    pub fn copy_storage(&self, src: &Storage, dst: &Storage, bytes: u64) {
        let bytes = bytes.min(src.bytes).min(dst.bytes) / wgpu::COPY_BUFFER_ALIGNMENT
            * wgpu::COPY_BUFFER_ALIGNMENT;
        if bytes == 0 {
            return;
        }
        self.record_copy((src.buffer_ref(), 0), (dst.buffer_ref(), 0), bytes);
    }

    /// Records a copy of `bytes` from `src` at byte `src_offset` into `dst` at `dst_offset`
    /// (the loss into a data-parallel run's gradient bucket, and back).
    pub fn copy_storage_at(
        &self,
        (src, src_offset): (&Storage, u64),
        (dst, dst_offset): (&Storage, u64),
        bytes: u64,
    ) -> Result<()> {
        let align = wgpu::COPY_BUFFER_ALIGNMENT;
        if !(src_offset | dst_offset | bytes).is_multiple_of(align)
            || src_offset + bytes > src.bytes
            || dst_offset + bytes > dst.bytes
        {
            return Err(Error::InvalidArgument {
                op: "copy_storage_at",
                reason: format!(
                    "{bytes} bytes from {src_offset} of {} to {dst_offset} of {}: outside a \
                     buffer or not {align}-byte aligned",
                    src.bytes, dst.bytes
                ),
            });
        }
        self.record_copy(
            (src.buffer_ref(), src_offset),
            (dst.buffer_ref(), dst_offset),
            bytes,
        );
        Ok(())
    }

    fn record_copy(&self, src: (BufferRef, u64), dst: (BufferRef, u64), size: u64) {
        let ((src, src_offset), (dst, dst_offset)) = (src, dst);
        self.state().segment.commands.push(Command::Copy {
            src: src.buffer,
            src_id: src.id,
            src_offset,
            dst: dst.buffer,
            dst_id: dst.id,
            dst_offset,
            size,
        });
    }
}
