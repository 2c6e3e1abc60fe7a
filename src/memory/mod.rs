//! GPU memory: the size-class buffer pool, the per-flush arenas (dispatch parameters and host
//! uploads), pooled read-back buffers, and whether a run fits before it allocates (`fit`).
//! Nothing here calls a kernel.

mod arena;
mod fit;
mod pool;

pub use arena::{GpuArena, HostArena};
pub use fit::{check_fits, footprint, Footprint, Workload, UNKNOWN_MEMORY};
pub use pool::{size_class, BufferPool, PoolStats, PooledBuffer, Reuse};

use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

/// A process-wide unique id for every buffer wgrad creates: bind groups are cached by it.
pub fn next_buffer_id() -> u64 {
    NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed)
}
