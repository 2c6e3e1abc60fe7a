//! Size-class buffer pool.
//!
//! Requests round up to a size class (four classes per power of two, 256 bytes at least), so a
//! buffer freed by one tensor fits the next request of a similar size. A buffer comes back the
//! moment its last owner drops; the queue runs recorded work in order, so a dispatch recorded
//! later may reuse it even inside the open Segment. Host uploads never write into a buffer with
//! `queue.write_buffer` (which would run before earlier recorded work): they go through the
//! encoder in order (see `GpuArena` and `graph::segment`).
//!
//! Which free buffer a request gets (`Reuse`): the oldest of its class, by default. A buffer
//! given back while the open Segment was recorded has been used in that Segment's command
//! buffer, though, and wgpu puts a barrier before a dispatch that writes such a buffer
//! (`graph::segment::Barriers`), which waits for all the compute work before it. For a workload
//! that repeats (`Reuse::REPEATING`, which the trainer sets) a request takes the oldest buffer
//! given back in an earlier Segment, and makes a new one rather than reuse a buffer of the open
//! Segment while the pool stays within its budget: independent dispatches (a linear's dW and
//! dX) then run side by side, and the buffers made are made once, as every step asks in the
//! same order.

use crate::config::{PoolPolicy, PoolReuse};
use crate::error::{human_bytes, Error, Result};
use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use serde::Serialize;

use super::next_buffer_id;

/// Smallest class: below this the class count only grows, and 256 bytes is the usual
/// storage-offset alignment anyway.
const MIN_CLASS_BYTES: u64 = 256;
/// Classes per power of two (sizes 1, 1.25, 1.5, 1.75 times 2^k): at most 25% waste.
const CLASSES_PER_OCTAVE: u64 = 4;

/// The size a request of `bytes` is rounded up to.
pub fn size_class(bytes: u64) -> u64 {
    if bytes <= MIN_CLASS_BYTES {
        return MIN_CLASS_BYTES;
    }
    let octave = 63 - bytes.leading_zeros() as u64; // 2^octave <= bytes < 2^(octave+1)
    let base = 1u64 << octave;
    let step = base / CLASSES_PER_OCTAVE;
    bytes.div_ceil(step) * step
}

/// A buffer owned by the pool's client; give it back with `BufferPool::release`.
#[derive(Clone, Debug)]
pub struct PooledBuffer {
    pub buffer: wgpu::Buffer,
    pub id: u64,
    /// The class size (what was allocated), at least what was asked for.
    pub size: u64,
}

/// How a request is served from the free buffers of its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// The oldest buffer given back before the open Segment; else a new buffer while the
    /// pool's bytes (live and free) stay within the budget; else the oldest free buffer. The
    /// budget: `Some(bytes)`, or (`None`) twice the most bytes ever live, and
    /// at least 1 GiB more.
    AcrossSegments { budget: Option<u64> },
    /// The oldest free buffer: the default (a workload that does not repeat would make a
    /// buffer for nearly every request otherwise; a 1,000-op chain made 1,000).
    Any,
}

impl Reuse {
    /// For a workload that repeats (a training step): buffers made once serve every later
    /// step, so the pool keeps a Segment's given-back buffers for the next one.
    pub const REPEATING: Reuse = Reuse::AcrossSegments { budget: None };

    /// `default` (the workload's), unless `policy` says `Any` or `AcrossSegments`; the policy's
    /// budget replaces the one that follows the bytes live.
    pub fn resolve(policy: &PoolPolicy, default: Reuse) -> Reuse {
        let budget = policy.budget;
        let reuse = match policy.reuse {
            Some(PoolReuse::Any) => Reuse::Any,
            Some(PoolReuse::AcrossSegments) => Reuse::REPEATING,
            None => default,
        };
        match reuse {
            Reuse::AcrossSegments { budget: b } => Reuse::AcrossSegments {
                budget: budget.or(b),
            },
            Reuse::Any => Reuse::Any,
        }
    }
}

/// The free buffers of one size class, each set ordered by buffer id.
#[derive(Default)]
struct FreeClass {
    /// Given back before the open Segment.
    earlier: BTreeMap<u64, PooledBuffer>,
    /// Given back while the open Segment was recorded.
    open: BTreeMap<u64, PooledBuffer>,
}

impl FreeClass {
    /// The oldest buffer of either set.
    fn pop_oldest(&mut self) -> Option<PooledBuffer> {
        match (self.earlier.first_key_value(), self.open.first_key_value()) {
            (Some((e, _)), Some((o, _))) if o < e => self.open.pop_first(),
            (Some(_), _) => self.earlier.pop_first(),
            _ => self.open.pop_first(),
        }
        .map(|(_, b)| b)
    }
}

/// Counters since the pool was made (or since `reset_counters`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PoolStats {
    /// `create_buffer` calls.
    pub buffers_created: u64,
    /// Requests served from the free lists.
    pub reuses: u64,
    /// All requests (`reuses + buffers_created`).
    pub requests: u64,
    /// Bytes held by live buffers (handed out, not yet released).
    pub bytes_live: u64,
    /// Bytes held in the free lists.
    pub bytes_cached: u64,
    /// The most `bytes_live` has been.
    pub peak_bytes_live: u64,
    /// Buffers destroyed by `trim`.
    pub buffers_destroyed: u64,
    /// Cached buffers let go to make room under the memory cap or after the adapter ran out.
    pub buffers_evicted: u64,
}

impl PoolStats {
    /// Share of requests served without creating a buffer.
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            return 1.0;
        }
        self.reuses as f64 / self.requests as f64
    }
}

pub struct BufferPool {
    label: &'static str,
    usage: wgpu::BufferUsages,
    /// Free buffers by class, each class ordered by buffer id: a request takes the oldest
    /// buffer, so the same sequence of requests and releases gets the same buffers every step
    /// (and the bind groups cached for them keep hitting). LIFO lists reshuffle instead: a
    /// repeated workload created new bind groups for 12 repeats (tests/ops/runtime.rs, lavapipe).
    free: HashMap<u64, FreeClass>,
    /// Classes given a buffer back while the open Segment was recorded.
    opened: Vec<u64>,
    stats: PoolStats,
    reuse: Reuse,
    /// The most bytes ever live (`peak_bytes_live` restarts with the counters).
    high_water: u64,
    /// Bytes (live and cached) the pool may hold (`PoolPolicy::memory_limit`).
    memory_limit: Option<u64>,
    /// The adapter's largest buffer: a size class past it is cut to what was asked.
    max_buffer: u64,
    /// Ids of the buffers evicted since `take_evicted` (their bind groups are stale).
    evicted: Vec<u64>,
}

/// What an out-of-memory error says to lower.
const ADVICE: &str = "Lower --batch or --seq (a smaller --batch with a larger --grad-accum \
     trains on as many tokens a step), or use a smaller model";

impl BufferPool {
    pub fn new(label: &'static str, usage: wgpu::BufferUsages, reuse: Reuse) -> BufferPool {
        BufferPool {
            label,
            usage,
            free: HashMap::default(),
            opened: Vec::new(),
            stats: PoolStats::default(),
            reuse,
            high_water: 0,
            memory_limit: None,
            max_buffer: u64::MAX,
            evicted: Vec::new(),
        }
    }

    /// The cap on the bytes the pool holds (live and cached; None: the adapter's memory) and
    /// the adapter's largest buffer.
    pub fn set_limits(&mut self, memory_limit: Option<u64>, max_buffer: u64) {
        self.memory_limit = memory_limit;
        self.max_buffer = max_buffer;
    }

    /// The ids of buffers evicted since the last call (their bind groups are stale).
    pub fn take_evicted(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.evicted)
    }

    /// Lets go of every cached buffer (dropped, not destroyed: work recorded or running that
    /// reads one keeps it until done); returns the bytes let go.
    pub fn evict(&mut self) -> u64 {
        let freed = self.stats.bytes_cached;
        self.opened.clear();
        for (_, class) in self.free.drain() {
            for (id, _) in class.earlier.into_iter().chain(class.open) {
                self.evicted.push(id);
                self.stats.buffers_evicted += 1;
            }
        }
        self.stats.bytes_cached = 0;
        freed
    }

    /// Bytes live and cached.
    pub fn bytes_held(&self) -> u64 {
        self.stats.bytes_live + self.stats.bytes_cached
    }

    /// How later requests are served.
    pub fn set_reuse(&mut self, reuse: Reuse) {
        self.reuse = reuse;
    }

    /// The open Segment was submitted: buffers given back so far are new to the next one.
    pub fn next_segment(&mut self) {
        for size in self.opened.drain(..) {
            if let Some(class) = self.free.get_mut(&size) {
                let mut open = std::mem::take(&mut class.open);
                class.earlier.append(&mut open);
            }
        }
    }

    /// Bytes the pool may hold before it reuses a buffer of the open Segment (`Reuse`). Twice
    /// the most bytes ever live: DistilGPT-2's 16 x 1024 step holds 1.76x (--amp) and 1.62x
    /// (f32) with no open-Segment reuse; at 1.5x it reused, and 23 and 49 of its dispatches
    /// waited at barriers they need not have (PROFILING.md, 2026-11-26).
    fn budget(&self, fixed: Option<u64>) -> u64 {
        let budget = fixed.unwrap_or((self.high_water * 2).max(self.high_water + (1 << 30)));
        budget.min(self.memory_limit.unwrap_or(u64::MAX))
    }

    /// A buffer of at least `bytes`, from the free list of its class (as `Reuse` says) or newly
    /// created; `what` names it in an out-of-memory error. A buffer the memory cap has no room
    /// for, or the adapter's memory, is `Error::OutOfMemory` (cached buffers are let go first).
    pub fn acquire(
        &mut self,
        device: &wgpu::Device,
        bytes: u64,
        what: &dyn Fn() -> String,
    ) -> Result<PooledBuffer> {
        let mut size = size_class(bytes);
        if size > self.max_buffer {
            size = bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        }
        let over = match self.reuse {
            Reuse::Any => true,
            Reuse::AcrossSegments { budget } => {
                self.stats.bytes_live + self.stats.bytes_cached + size > self.budget(budget)
            }
        };
        let pick = self.free.get_mut(&size).and_then(|class| {
            if over {
                class.pop_oldest()
            } else {
                class.earlier.pop_first().map(|(_, b)| b)
            }
        });
        let buf = match pick {
            Some(buf) => {
                self.stats.reuses += 1;
                self.stats.bytes_cached -= size;
                buf
            }
            None => {
                let buffer = self.create(device, size, what)?;
                self.stats.buffers_created += 1;
                PooledBuffer {
                    buffer,
                    id: next_buffer_id(),
                    size,
                }
            }
        };
        self.stats.requests += 1;
        self.stats.bytes_live += size;
        self.stats.peak_bytes_live = self.stats.peak_bytes_live.max(self.stats.bytes_live);
        self.high_water = self.high_water.max(self.stats.bytes_live);
        Ok(buf)
    }

    /// A new buffer of `size` bytes within the memory cap, under an out-of-memory error scope
    /// (its pop is a lock and a lookup on native backends, no wait on the GPU: and buffers are
    /// made in the first steps only, reused after).
    fn create(
        &mut self,
        device: &wgpu::Device,
        size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<wgpu::Buffer> {
        if let Some(limit) = self.memory_limit {
            if self.bytes_held() + size > limit {
                self.evict();
            }
            if self.stats.bytes_live + size > limit {
                return Err(self.out_of_memory(
                    what(),
                    size,
                    format!(
                        "the memory cap is {limit} bytes ({}, WGRAD_MEMORY_LIMIT_MIB)",
                        human_bytes(limit)
                    ),
                ));
            }
        }
        let descriptor = wgpu::BufferDescriptor {
            label: Some(self.label),
            size,
            usage: self.usage,
            mapped_at_creation: false,
        };
        for attempt in 0..2 {
            let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let buffer = device.create_buffer(&descriptor);
            match pollster::block_on(scope.pop()) {
                None => return Ok(buffer),
                // Cached buffers hold memory no tensor uses: let them go and try once more.
                Some(_) if attempt == 0 && self.evict() > 0 => continue,
                Some(e) => {
                    let reason = match e {
                        wgpu::Error::OutOfMemory { source } => source.to_string(),
                        other => other.to_string(),
                    };
                    return Err(self.out_of_memory(
                        what(),
                        size,
                        format!("the adapter has no more memory for it ({reason})"),
                    ));
                }
            }
        }
        unreachable!("the second attempt returns")
    }

    fn out_of_memory(&self, what: String, bytes: u64, limit: String) -> Error {
        let live = self.stats.bytes_live;
        Error::OutOfMemory {
            what,
            bytes,
            limit: format!(
                "{limit}, and tensors hold {live} bytes ({})",
                human_bytes(live)
            ),
            advice: ADVICE.to_string(),
        }
    }

    /// Returns a buffer to its free list.
    pub fn release(&mut self, buf: PooledBuffer) {
        self.stats.bytes_live -= buf.size;
        self.stats.bytes_cached += buf.size;
        let class = self.free.entry(buf.size).or_default();
        if class.open.is_empty() {
            self.opened.push(buf.size);
        }
        class.open.insert(buf.id, buf);
    }

    /// Destroys every cached buffer; returns the ids destroyed (their bind groups are stale).
    pub fn trim(&mut self) -> Vec<u64> {
        let mut ids = Vec::new();
        self.opened.clear();
        for (_, class) in self.free.drain() {
            for (_, buf) in class.earlier.into_iter().chain(class.open) {
                buf.buffer.destroy();
                ids.push(buf.id);
            }
        }
        self.stats.buffers_destroyed += ids.len() as u64;
        self.stats.bytes_cached = 0;
        ids
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Zeroes the running counters (not bytes live or cached); the peak restarts from now.
    pub fn reset_counters(&mut self) {
        self.stats.buffers_created = 0;
        self.stats.reuses = 0;
        self.stats.requests = 0;
        self.stats.buffers_destroyed = 0;
        self.stats.buffers_evicted = 0;
        self.stats.peak_bytes_live = self.stats.bytes_live;
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn classes_round_up_with_bounded_waste() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1280);
        for bytes in [300u64, 5000, 123_457, 154_389_504, (1 << 31) + 1] {
            let c = size_class(bytes);
            assert!(
                c >= bytes && (c as f64) <= bytes as f64 * 1.25 + 1.0,
                "{bytes} -> {c}"
            );
            assert_eq!(size_class(c), c, "a class is its own class");
        }
    }
}
