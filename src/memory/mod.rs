//! GPU memory: the size-class buffer pool, the per-flush arenas (dispatch parameters and host
//! uploads), and pooled read-back buffers. Nothing here calls a kernel.

mod arena;
mod pool;

pub use arena::{GpuArena, HostArena};
pub use pool::{size_class, BufferPool, PoolStats, PooledBuffer, Reuse};

use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

/// A process-wide unique id for every buffer wgrad creates: bind groups are cached by it.
pub fn next_buffer_id() -> u64 {
    NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed)
}
