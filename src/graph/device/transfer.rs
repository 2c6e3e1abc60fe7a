//! Host data in and out: uploads recorded in order with the dispatches (never a
//! `queue.write_buffer` into a buffer earlier work still reads), read-backs through a pool of
//! mappable staging buffers.

use std::sync::Arc;

use super::{Device, Storage};
use crate::error::{Error, Result};
use crate::graph::segment::Command;

impl Device {
    /// Copies host bytes into `dst` at `offset`, in order with the recorded work (never with a
    /// `queue.write_buffer` into `dst`, which would run before work recorded earlier).
    pub(crate) fn upload(&self, dst: &Storage, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        debug_assert_eq!(offset % wgpu::COPY_BUFFER_ALIGNMENT, 0);
        let size = (data.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let mut s = self.state();
        let arena_offset = s
            .segment
            .uploads
            .push(data, wgpu::COPY_BUFFER_ALIGNMENT as usize);
        if size > data.len() as u64 {
            let pad = vec![0u8; (size - data.len() as u64) as usize];
            s.segment.uploads.push(&pad, 1);
        }
        let dst = dst.buffer_ref();
        s.segment.commands.push(Command::Upload {
            arena_offset,
            dst: dst.buffer,
            dst_id: dst.id,
            dst_offset: offset,
            size,
        });
        s.counters.uploads += 1;
        s.counters.bytes_uploaded += data.len() as u64;
    }

    /// Flushes, waits, and returns `len` bytes of `src` from byte `offset`.
    pub(crate) fn read_back(&self, src: &Storage, offset: u64, len: u64) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let start = offset - offset % wgpu::COPY_BUFFER_ALIGNMENT;
        let end = (offset + len).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let size = end - start;
        let gpu = &self.rt.gpu;
        let (staging, idx) = {
            let mut s = self.state();
            let staging = s.read_back_pool.acquire(&gpu.device, size, &|| {
                format!("a staging buffer reading back {len} bytes")
            })?;
            s.read_back_pool.take_evicted(); // staging buffers are in no bind group
            let src_ref = src.buffer_ref();
            s.segment.commands.push(Command::Copy {
                src: src_ref.buffer,
                src_id: src_ref.id,
                src_offset: start,
                dst: staging.buffer.clone(),
                dst_id: staging.id,
                dst_offset: 0,
                size,
            });
            s.counters.read_backs += 1;
            s.counters.bytes_read_back += len;
            let idx = self
                .flush_locked(&mut s)
                .expect("the segment holds the copy");
            (staging, idx)
        };
        let wait_start = std::time::Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let slice = staging.buffer.slice(0..size);
        let mapped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = mapped.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            flag.store(true, std::sync::atomic::Ordering::Release);
            let _ = tx.send(r);
        });
        let waited = self.wait_for(Some(idx), |_| {
            mapped.load(std::sync::atomic::Ordering::Acquire)
        });
        if let Some(fault) = self.rt.gpu.take_fault() {
            return Err(fault);
        }
        waited.map_err(|e| Error::ReadBack(e.to_string()))?;
        rx.recv()
            .map_err(|e| Error::ReadBack(e.to_string()))?
            .map_err(|e| Error::ReadBack(e.to_string()))?;
        let skip = (offset - start) as usize;
        let bytes = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| Error::ReadBack(e.to_string()))?;
            view[skip..skip + len as usize].to_vec()
        };
        staging.buffer.unmap();
        let mut s = self.state();
        s.counters.wait_ns += wait_start.elapsed().as_nanos() as u64;
        s.read_back_pool.release(staging);
        Ok(bytes)
    }
}
