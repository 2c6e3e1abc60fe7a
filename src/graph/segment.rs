//! The open Segment: work recorded since the last flush, and how a flush encodes it.
//!
//! Recording appends a `Command` and returns; nothing touches the GPU. A flush writes the
//! parameter arena and the upload arena with one `queue.write_buffer` each, encodes every
//! command in order into one command encoder (consecutive dispatches share one compute pass;
//! uploads and read-back copies sit between passes, in order), and submits once.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use serde::Serialize;

use super::schedule::{self, Uses};
use crate::kernels::Pipeline;
use crate::memory::HostArena;

/// A buffer as a command sees it: its id (for the bind-group cache) and a handle that keeps it
/// alive until the command has run.
#[derive(Clone, Debug)]
pub struct BufferRef {
    pub id: u64,
    pub buffer: wgpu::Buffer,
}

pub struct Dispatch {
    pub pipeline: Arc<Pipeline>,
    /// Storage bindings 1..=n, in the kernel's order.
    pub buffers: Vec<BufferRef>,
    /// Offset of this dispatch's params in the parameter arena.
    pub params_offset: u32,
    pub groups: [u32; 3],
}

pub enum Command {
    Dispatch(Dispatch),
    /// Host bytes (at `arena_offset` in the upload arena) copied into `dst`, in order.
    Upload {
        arena_offset: u64,
        dst: wgpu::Buffer,
        dst_id: u64,
        dst_offset: u64,
        size: u64,
    },
    /// A copy between buffers (read-backs into a mappable buffer).
    Copy {
        src: wgpu::Buffer,
        src_id: u64,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_id: u64,
        dst_offset: u64,
        size: u64,
    },
}

/// Work recorded since the last flush.
#[derive(Default)]
pub struct Segment {
    pub commands: Vec<Command>,
    pub params: HostArena,
    pub uploads: HostArena,
    pub dispatches: usize,
    /// Pipelines of `commands` that were still compiling when recorded (cold steps only).
    pub compiling: Vec<Arc<Pipeline>>,
}

impl Segment {
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Whether every pipeline the Segment dispatches has compiled.
    pub fn pipelines_ready(&self) -> bool {
        self.compiling.iter().all(|p| p.is_compiled())
    }

    /// Waits until every pipeline the Segment dispatches has compiled; the first that did not
    /// compile, as `Pipeline::wait` words it.
    pub fn wait_for_pipelines(&self) -> Result<(), String> {
        self.compiling.iter().try_for_each(|p| p.wait().map(drop))
    }
}

/// Counters over the device's lifetime (see `Device::counters`); subtract two readings to
/// get a step's.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Counters {
    pub dispatches: u64,
    /// Dispatches recorded in each phase (see `Device::set_phase`).
    pub forward_dispatches: u64,
    pub backward_dispatches: u64,
    pub optimizer_dispatches: u64,
    pub submits: u64,
    pub compute_passes: u64,
    /// Dispatches encoded behind a pipeline barrier (`Barriers`): each waits for all the
    /// compute work before it; the others may run beside the dispatches before them.
    pub barriers: u64,
    /// Dispatches encoded ahead of one recorded before them that waits at a barrier
    /// (`schedule::order`): they run beside the work before it.
    pub moved: u64,
    pub bind_groups_created: u64,
    pub uploads: u64,
    pub bytes_uploaded: u64,
    pub read_backs: u64,
    pub bytes_read_back: u64,
    /// CPU nanoseconds spent encoding and submitting flushes.
    pub encode_submit_ns: u64,
    /// Of `encode_submit_ns`: writing the parameter and upload arenas (`queue.write_buffer`).
    pub arena_write_ns: u64,
    /// Nanoseconds spent blocked on the GPU (read-backs, `sync`).
    pub wait_ns: u64,
    /// Nanoseconds flushes waited for pipelines still compiling (cold steps only).
    pub compile_wait_ns: u64,
}

impl std::ops::Sub for Counters {
    type Output = Counters;
    fn sub(self, o: Counters) -> Counters {
        Counters {
            dispatches: self.dispatches - o.dispatches,
            forward_dispatches: self.forward_dispatches - o.forward_dispatches,
            backward_dispatches: self.backward_dispatches - o.backward_dispatches,
            optimizer_dispatches: self.optimizer_dispatches - o.optimizer_dispatches,
            submits: self.submits - o.submits,
            compute_passes: self.compute_passes - o.compute_passes,
            barriers: self.barriers - o.barriers,
            moved: self.moved - o.moved,
            bind_groups_created: self.bind_groups_created - o.bind_groups_created,
            uploads: self.uploads - o.uploads,
            bytes_uploaded: self.bytes_uploaded - o.bytes_uploaded,
            read_backs: self.read_backs - o.read_backs,
            bytes_read_back: self.bytes_read_back - o.bytes_read_back,
            encode_submit_ns: self.encode_submit_ns - o.encode_submit_ns,
            arena_write_ns: self.arena_write_ns - o.arena_write_ns,
            wait_ns: self.wait_ns - o.wait_ns,
            compile_wait_ns: self.compile_wait_ns - o.compile_wait_ns,
        }
    }
}

/// What the recorded work belongs to, for the per-phase counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Phase {
    #[default]
    Forward,
    Backward,
    Optimizer,
}

/// The most storage buffers a kernel binds (`layernorm_backward_params`: 10).
pub(crate) const MAX_STORAGE_BINDINGS: usize = 10;

/// Key of a cached bind group: layout, parameter arena, and every storage buffer.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BindKey {
    layout: u64,
    params: u64,
    buffers: [u64; MAX_STORAGE_BINDINGS],
}

/// Bind groups by (layout, buffers): pooled buffers come back in the same combinations every
/// step, so a steady-state step creates none.
#[derive(Default)]
pub struct BindGroupCache {
    groups: HashMap<BindKey, wgpu::BindGroup>,
}

/// Entries past this many are dropped wholesale (pool churn, not a steady state).
const BIND_GROUP_CACHE_CAP: usize = 1 << 16;

impl BindGroupCache {
    /// Drops every bind group that refers to one of `ids` (destroyed buffers).
    pub fn forget(&mut self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        let set: HashSet<u64> = ids.iter().copied().collect();
        self.groups
            .retain(|k, _| !set.contains(&k.params) && !k.buffers.iter().any(|b| set.contains(b)));
    }

    pub fn len(&self) -> usize {
        self.groups.len()
    }
}

/// How a command uses a buffer, as wgpu-core tracks it within a command buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    StorageRead,
    StorageWrite,
    CopySrc,
    CopyDst,
}

/// The barriers wgpu 30 puts into a command buffer (wgpu-core's `track::skip_barrier`): before
/// a command, one for every buffer it uses that an earlier command of the same command buffer
/// used, unless both uses are the same read-only one (storage read, copy source). Read-write
/// storage is never such a use, so a dispatch that writes a buffer written or read before
/// waits; one whose outputs are new to the command buffer and whose inputs were last read (not
/// written) does not. A buffer's first use in a command buffer has its transition placed
/// before the command buffer, at submit. On Vulkan a barrier between dispatches waits for all
/// the compute work before it; without one, the GPU may run a dispatch beside the ones before.
#[derive(Default)]
pub struct Barriers {
    last: HashMap<u64, Use>,
}

impl Barriers {
    /// Forgets every use: a new command buffer (the map keeps its room).
    pub fn clear(&mut self) {
        self.last.clear();
    }

    /// Whether a buffer last used as `old` needs a barrier before it is used as `new`: unless
    /// both are the same read-only use.
    fn transition(old: Use, new: Use) -> bool {
        !(old == new && matches!(old, Use::StorageRead | Use::CopySrc))
    }

    /// Whether a barrier would go before a command with these uses (each buffer once).
    pub fn waits(&self, uses: &[(u64, Use)]) -> bool {
        uses.iter().any(|(id, u)| {
            self.last
                .get(id)
                .is_some_and(|&old| Self::transition(old, *u))
        })
    }

    /// Records one command's uses (a buffer may come twice, with the same use); whether a
    /// barrier goes before the command.
    pub fn record(&mut self, uses: impl IntoIterator<Item = (u64, Use)>) -> bool {
        let mut barrier = false;
        for (id, u) in uses {
            if let Some(old) = self.last.insert(id, u) {
                barrier |= Self::transition(old, u);
            }
        }
        barrier
    }
}

/// A command's buffers, as the barrier model and the scheduler see them, into `u` (whose
/// vectors keep their room).
fn fill_uses(cmd: &Command, u: &mut Uses) {
    u.tracked.clear();
    u.writes.clear();
    match cmd {
        Command::Dispatch(d) => {
            u.dispatch = true;
            for (b, a) in d.buffers.iter().zip(d.pipeline.layout.storage) {
                let write = matches!(a, crate::kernels::Access::ReadWrite);
                // The same buffer bound twice in one dispatch is one use (wgpu merges them):
                // the first binding's, for the barrier model.
                match u.writes.iter_mut().find(|(id, _)| *id == b.id) {
                    Some((_, w)) => *w |= write,
                    None => {
                        let t = if write {
                            Use::StorageWrite
                        } else {
                            Use::StorageRead
                        };
                        u.tracked.push((b.id, t));
                        u.writes.push((b.id, write));
                    }
                }
            }
        }
        Command::Upload { dst_id, .. } => {
            u.dispatch = false;
            u.tracked.push((*dst_id, Use::CopyDst));
            u.writes.push((*dst_id, true));
        }
        Command::Copy { src_id, dst_id, .. } => {
            u.dispatch = false;
            u.tracked
                .extend([(*src_id, Use::CopySrc), (*dst_id, Use::CopyDst)]);
            u.writes.extend([(*src_id, false), (*dst_id, true)]);
        }
    }
}

/// What `encode` needs besides the segment.
pub struct EncodeTargets<'a> {
    pub device: &'a wgpu::Device,
    pub params: Option<&'a (wgpu::Buffer, u64)>,
    pub uploads: Option<&'a wgpu::Buffer>,
    pub bind_groups: &'a mut BindGroupCache,
    pub counters: &'a mut Counters,
    /// The adapter's max_storage_buffer_binding_size: a pooled buffer may be larger than the
    /// tensor (its size class), so bindings are capped to it.
    pub max_binding: u64,
    /// GPU timestamps, when profiling.
    pub timer: Option<&'a mut super::timing::GpuTimer>,
    /// The barrier model's buffer uses (kept between flushes for its room).
    pub barriers: &'a mut Barriers,
    /// Each command's buffers for the schedule (kept between flushes for their room).
    pub uses: &'a mut Vec<Uses>,
    /// How far the schedule looks ahead (`schedule::WINDOW`; 0: the recorded order).
    pub window: usize,
}

/// Encodes every command of `segment` in order into one command buffer.
pub fn encode(segment: &Segment, mut t: EncodeTargets<'_>) -> wgpu::CommandBuffer {
    let mut encoder = t
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgrad:segment"),
        });
    let barriers = &mut *t.barriers;
    barriers.clear();
    let n = segment.commands.len();
    if t.uses.len() < n {
        t.uses.resize_with(n, Uses::default);
    }
    for (u, cmd) in t.uses.iter_mut().zip(&segment.commands) {
        fill_uses(cmd, u);
    }
    let uses = &t.uses[..n];
    let (order, moved) = schedule::order(uses, t.window);
    t.counters.moved += moved;
    let cmds: Vec<(&Command, &Uses)> = order
        .into_iter()
        .map(|i| (&segment.commands[i], &uses[i]))
        .collect();
    let mut i = 0;
    while i < cmds.len() {
        match cmds[i].0 {
            Command::Dispatch(_) => {
                let timestamp_writes = t.timer.as_mut().and_then(|timer| timer.pass_writes());
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("wgrad:pass"),
                    timestamp_writes,
                });
                t.counters.compute_passes += 1;
                let mut last_pipeline: *const Pipeline = std::ptr::null();
                while let Some((Command::Dispatch(d), u)) = cmds.get(i) {
                    if barriers.record(u.tracked.iter().copied()) {
                        t.counters.barriers += 1;
                    }
                    let (params, params_id) =
                        t.params.expect("a segment with dispatches has params");
                    let bg = bind_group(
                        t.device,
                        t.bind_groups,
                        t.counters,
                        d,
                        (params, *params_id),
                        t.max_binding,
                    );
                    if !std::ptr::eq(last_pipeline, Arc::as_ptr(&d.pipeline)) {
                        pass.set_pipeline(d.pipeline.compute());
                        last_pipeline = Arc::as_ptr(&d.pipeline);
                    }
                    pass.set_bind_group(0, bg, &[d.params_offset]);
                    let [x, y, z] = d.groups;
                    match t.timer.as_mut() {
                        Some(timer) => {
                            timer.around_dispatch(&mut pass, &d.pipeline, d.groups, |p| {
                                p.dispatch_workgroups(x, y, z)
                            })
                        }
                        None => pass.dispatch_workgroups(x, y, z),
                    }
                    i += 1;
                }
            }
            Command::Upload {
                arena_offset,
                dst,
                dst_offset,
                size,
                ..
            } => {
                barriers.record(cmds[i].1.tracked.iter().copied());
                let src = t
                    .uploads
                    .expect("a segment with uploads has an upload arena");
                encoder.copy_buffer_to_buffer(src, *arena_offset, dst, *dst_offset, *size);
                i += 1;
            }
            Command::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                size,
                ..
            } => {
                barriers.record(cmds[i].1.tracked.iter().copied());
                encoder.copy_buffer_to_buffer(src, *src_offset, dst, *dst_offset, *size);
                i += 1;
            }
        }
    }
    if let Some(timer) = t.timer.as_mut() {
        timer.finish_flush(t.device, &mut encoder);
    }
    encoder.finish()
}

fn bind_group<'c>(
    device: &wgpu::Device,
    cache: &'c mut BindGroupCache,
    counters: &mut Counters,
    d: &Dispatch,
    (params, params_id): (&wgpu::Buffer, u64),
    max_binding: u64,
) -> &'c wgpu::BindGroup {
    let layout = &d.pipeline.layout;
    debug_assert!(d.buffers.len() <= MAX_STORAGE_BINDINGS);
    let mut key = BindKey {
        layout: layout.id,
        params: params_id,
        buffers: [0; MAX_STORAGE_BINDINGS],
    };
    for (k, b) in key.buffers.iter_mut().zip(&d.buffers) {
        *k = b.id;
    }
    if cache.groups.len() >= BIND_GROUP_CACHE_CAP && !cache.groups.contains_key(&key) {
        cache.groups.clear();
    }
    cache.groups.entry(key).or_insert_with(|| {
        counters.bind_groups_created += 1;
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: params,
                offset: 0,
                size: wgpu::BufferSize::new(layout.params_size),
            }),
        }];
        for (i, b) in d.buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(b.buffer.size().min(max_binding)),
                }),
            });
        }
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(d.pipeline.label),
            layout: &layout.layout,
            entries: &entries,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{Barriers, Use};

    #[test]
    fn every_kernel_binds_at_most_the_keyed_buffers() {
        // A bind group's key holds MAX_STORAGE_BINDINGS buffers: a kernel binding more would
        // share a bind group with another set of buffers.
        for (kernel, _) in crate::kernels::all_variants(true) {
            assert!(
                kernel.storage.len() <= super::MAX_STORAGE_BINDINGS,
                "{} binds {} storage buffers",
                kernel.name,
                kernel.storage.len()
            );
        }
    }

    #[test]
    fn barriers_follow_wgpu_cores_rule() {
        let mut b = Barriers::default();
        assert!(
            !b.record([(1, Use::StorageRead), (2, Use::StorageWrite)]),
            "first uses"
        );
        assert!(
            !b.record([(1, Use::StorageRead), (3, Use::StorageWrite)]),
            "read after read"
        );
        assert!(b.record([(2, Use::StorageRead)]), "read after write");
        assert!(b.record([(1, Use::StorageWrite)]), "write after read");
        assert!(b.record([(1, Use::StorageWrite)]), "write after write");
        assert!(!b.record([(4, Use::CopySrc)]) && !b.record([(4, Use::CopySrc)]));
        assert!(b.record([(4, Use::StorageRead)]), "another read-only use");
        assert!(!b.record([(5, Use::CopyDst)]));
        assert!(
            b.record([(5, Use::CopyDst)]),
            "a copy into a buffer after another"
        );
    }
}
