//! Flushing: a Segment encoded into one command buffer (its pipelines compiled first) and
//! submitted; waiting for the GPU, by spinning or blocking (`WaitMode`).

use super::{Device, State, SPIN_LIMIT};
use crate::config::WaitMode;
use crate::error::{Error, Result};
use crate::graph::segment::{encode, EncodeTargets, Segment};

impl Device {
    /// Encodes and submits everything recorded so far (nothing if the Segment is empty),
    /// after waiting for any of its pipelines still compiling.
    pub fn flush(&self) {
        let mut s = self.state();
        self.flush_locked(&mut s);
    }

    /// Flushes unless a pipeline the open Segment uses is still compiling; then the Segment
    /// stays open and goes with a later flush. For submits that only let the GPU start
    /// sooner (a training step's forward before its backward is recorded): in a cold step,
    /// recording on queues the next variants' compiles beside the running ones, where waiting
    /// here would compile the step in as many rounds as it has such submits.
    pub fn flush_if_compiled(&self) {
        let mut s = self.state();
        if s.segment.pipelines_ready() {
            self.flush_locked(&mut s);
        }
    }

    /// Flushes and waits until the GPU has finished all submitted work.
    pub fn sync(&self) -> Result<()> {
        let idx = self.flush_locked(&mut self.state());
        let start = std::time::Instant::now();
        let waited = self.wait_for(idx, wgpu::PollStatus::is_queue_empty);
        if let Some(fault) = self.rt.gpu.take_fault() {
            return Err(fault);
        }
        waited.map_err(|e| Error::Device(e.to_string()))?;
        self.state().counters.wait_ns += start.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Forbids submits until `release_submits`, because recorded work reads memory that
    /// another API is still writing (`why`: NCCL's allreduce into the gradient bucket, while
    /// the optimizer is recorded behind it). A flush in between is a bug in the caller: it
    /// panics, naming `why`, rather than let the GPU read half-written memory.
    pub fn hold_submits(&self, why: &'static str) {
        self.state().held = Some(why);
    }

    /// Allows submits again (`hold_submits`).
    pub fn release_submits(&self) {
        self.state().held = None;
    }

    /// How this device waits for the GPU.
    pub fn wait_mode(&self) -> WaitMode {
        self.rt.wait
    }

    /// Waits until the GPU has finished submission `idx` (`None`: all submitted work). A
    /// spinning wait ends when `done` says what was waited for has happened, given what a
    /// poll returned (an empty queue; or a map callback, which fires within a poll).
    pub(super) fn wait_for(
        &self,
        idx: Option<wgpu::SubmissionIndex>,
        done: impl Fn(&wgpu::PollStatus) -> bool,
    ) -> std::result::Result<(), wgpu::PollError> {
        let device = &self.rt.gpu.device;
        if self.rt.wait == WaitMode::Spin {
            let start = std::time::Instant::now();
            while start.elapsed() < SPIN_LIMIT {
                if done(&device.poll(wgpu::PollType::Poll)?) {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
        }
        device
            .poll(wgpu::PollType::Wait {
                submission_index: idx,
                timeout: None,
            })
            .map(drop)
    }

    pub(super) fn flush_locked(&self, s: &mut State) -> Option<wgpu::SubmissionIndex> {
        if s.segment.is_empty() {
            return None;
        }
        if let Some(why) = s.held {
            panic!("a submit while submits are held ({why})");
        }
        // An early submit is for the Segment that was open when it was armed.
        s.early_flush = None;
        if !s.segment.compiling.is_empty() {
            let wait_start = std::time::Instant::now();
            if let Err(e) = s.segment.wait_for_pipelines() {
                // The Segment cannot be encoded: drop it, so that later flushes (a profiler's
                // on unwinding, say) do not meet the same kernel again.
                s.segment = Segment::default();
                panic!("{e}");
            }
            s.counters.compile_wait_ns += wait_start.elapsed().as_nanos() as u64;
        }
        let start = std::time::Instant::now();
        let gpu = &self.rt.gpu;
        let segment = std::mem::take(&mut s.segment);
        let st = &mut *s;
        if !segment.params.is_empty() {
            let before = st.params_buffer.as_ref().map(|(_, id)| *id);
            st.params_buffer = st
                .params_gpu
                .upload(&gpu.device, &gpu.queue, &segment.params);
            let after = st.params_buffer.as_ref().map(|(_, id)| *id);
            if let (Some(old), true) = (before, before != after) {
                st.bind_groups.forget(&[old]);
            }
        }
        let uploads = if segment.uploads.is_empty() {
            None
        } else {
            st.uploads_gpu
                .upload(&gpu.device, &gpu.queue, &segment.uploads)
        };
        st.counters.arena_write_ns += start.elapsed().as_nanos() as u64;
        let cmd = encode(
            &segment,
            EncodeTargets {
                device: &gpu.device,
                params: st.params_buffer.as_ref(),
                uploads: uploads.as_ref().map(|(b, _)| b),
                bind_groups: &mut st.bind_groups,
                counters: &mut st.counters,
                max_binding: gpu.limits.max_storage_buffer_binding_size,
                timer: st.timer.as_mut(),
                barriers: &mut st.barriers,
                uses: &mut st.schedule_uses,
                window: self
                    .rt
                    .options
                    .lab
                    .schedule_window()
                    .unwrap_or(crate::graph::schedule::WINDOW),
            },
        );
        // A span: the profiler's trace shows when each submit left the CPU.
        let idx = tracing::info_span!("queue.submit").in_scope(|| gpu.queue.submit([cmd]));
        st.pool.next_segment();
        st.counters.submits += 1;
        st.counters.encode_submit_ns += start.elapsed().as_nanos() as u64;
        // Recycle the host arenas' allocations for the next Segment.
        let mut segment = segment;
        segment.commands.clear();
        segment.params.clear();
        segment.uploads.clear();
        segment.compiling.clear();
        segment.dispatches = 0;
        st.segment = segment;
        Some(idx)
    }
}
