//! Per-flush arenas: everything the host sends with one flush (the parameters of every dispatch,
//! the bytes of every upload) is appended to one host vector while recording, then written to
//! one GPU buffer with a single `queue.write_buffer` at flush. No buffer per dispatch.

use super::next_buffer_id;

/// Bytes gathered while a Segment is open.
#[derive(Default)]
pub struct HostArena {
    bytes: Vec<u8>,
}

impl HostArena {
    /// Appends `data` at an offset aligned to `align` bytes; returns that offset.
    pub fn push(&mut self, data: &[u8], align: usize) -> u64 {
        let offset = self.bytes.len().next_multiple_of(align);
        self.bytes.resize(offset, 0);
        self.bytes.extend_from_slice(data);
        offset as u64
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
    }
}

/// The GPU side of an arena: one buffer, grown by doubling, written once per flush.
pub struct GpuArena {
    label: &'static str,
    usage: wgpu::BufferUsages,
    buffer: Option<(wgpu::Buffer, u64)>,
    /// Size of the first buffer: the first flush of a step is usually the largest.
    min_size: u64,
    pub buffers_created: u64,
}

impl GpuArena {
    pub fn new(label: &'static str, usage: wgpu::BufferUsages, min_size: u64) -> GpuArena {
        GpuArena {
            label,
            usage: usage | wgpu::BufferUsages::COPY_DST,
            buffer: None,
            min_size,
            buffers_created: 0,
        }
    }

    /// A buffer of at least `bytes` (kept across flushes; replaced by a larger one if needed).
    /// Returns the buffer and its id; the id changes when the buffer is replaced. Made while
    /// flushing, outside an error scope: an out-of-memory here goes to wgpu's uncaptured-error
    /// handler and comes back as an error from the next wait (`Gpu::take_fault`).
    pub fn reserve(&mut self, device: &wgpu::Device, bytes: u64) -> (&wgpu::Buffer, u64) {
        let fits = matches!(&self.buffer, Some((b, _)) if b.size() >= bytes);
        if !fits {
            let size = bytes.max(self.min_size).next_power_of_two();
            let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(self.label),
                size,
                usage: self.usage,
                mapped_at_creation: false,
            });
            self.buffers_created += 1;
            self.buffer = Some((buffer, next_buffer_id()));
        }
        let (b, id) = self.buffer.as_ref().expect("arena buffer was just ensured");
        (b, *id)
    }

    /// Writes the host bytes at offset 0. `queue.write_buffer` runs before the next submit's
    /// commands and after every earlier submit's, which is exactly when this flush needs them.
    pub fn upload(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        host: &HostArena,
    ) -> Option<(wgpu::Buffer, u64)> {
        if host.is_empty() {
            return self.buffer.clone();
        }
        let len = (host.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let (buffer, id) = self.reserve(device, len);
        let buffer = buffer.clone();
        let mut padded;
        let data = if len as usize == host.len() {
            host.bytes()
        } else {
            padded = host.bytes().to_vec();
            padded.resize(len as usize, 0);
            &padded
        };
        queue.write_buffer(&buffer, 0, data);
        Some((buffer, id))
    }
}
