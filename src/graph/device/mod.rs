//! `Device`: the handle tensors hold. It owns the GPU, its options, the open Segment, the
//! buffer pools, the pipeline and bind-group caches, and the counters; ops record into it and
//! return at once.
//!
//! | file | what of the Device |
//! | --- | --- |
//! | here | construction, options, storage allocation |
//! | `record` | appending dispatches and copies to the open Segment |
//! | `flush` | encoding and submitting a Segment, waiting for the GPU |
//! | `transfer` | uploads in order with the recorded work, read-backs |
//! | `tiles` | the matmul tile table (measured, shipped) and searches' forcing |
//! | `stats` | counters, pool and pipeline statistics, GPU timestamps |

mod flush;
mod record;
mod stats;
mod tiles;
mod transfer;

use std::sync::{Arc, Mutex, MutexGuard};

use super::schedule::Uses;
use super::segment::{Barriers, BindGroupCache, BufferRef, Counters, Phase, Segment};
use super::timing::GpuTimer;
use crate::config::{F32Matmul, OptionRow, Options, WaitMode};
use crate::device::{AdapterReport, Gpu};
use crate::error::{Error, Result};
use crate::kernels::attention::{Pass, Tile as AttentionTile};
use crate::kernels::tuning::{ProductKey, TileChoice, TileTable};
use crate::kernels::{grid, PipelineCache};
use crate::memory::{BufferPool, GpuArena, PooledBuffer, Reuse};

pub use tiles::TableSource;

/// Dispatches past which an open Segment is flushed on its own (bounds the parameter arena
/// and the latency before the GPU starts; a DistilGPT-2 step records a few hundred).
pub const DEFAULT_FLUSH_BOUND: usize = 4096;

/// A GPU and everything recorded for it. Cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Device {
    rt: Arc<Runtime>,
}

struct Runtime {
    gpu: Gpu,
    options: Options,
    state: Mutex<State>,
    wait: WaitMode,
    /// f32 products on the tensor cores (`Precision::f32_matmul`, where the adapter can).
    f32_tensor_cores: bool,
    /// Split products summed in their own dispatch (`KernelPolicy::split_in_one_dispatch`,
    /// resolved).
    split_in_one_dispatch: bool,
    /// Where the tile table came from.
    tile_source: TableSource,
}

/// Tiles a product split in one dispatch may have: one ticket (u32) each.
pub const SPLIT_TICKETS: usize = 1 << 16;

/// Ticket buffers the dispatches that sum in their own dispatch bind in turn: a linear's dX and
/// dW, and the next linear's, bind different ones (one buffer put a barrier between every two;
/// four is a guess, not a measured count).
const TICKET_BUFFERS: usize = 4;

/// Spinning past this long blocks instead (a long step gains nothing from a busy core).
const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_millis(250);

/// How a device waits: as `Execution::wait` says, else spinning on a GPU and blocking on a CPU
/// adapter, whose work runs on the cores a spinning thread would take.
fn wait_mode(options: &Options, info: &wgpu::AdapterInfo) -> WaitMode {
    match options.execution.wait {
        Some(w) => w,
        None if info.device_type == wgpu::DeviceType::Cpu => WaitMode::Block,
        None => WaitMode::Spin,
    }
}

struct State {
    pool: BufferPool,
    read_back_pool: BufferPool,
    pipelines: PipelineCache,
    segment: Segment,
    params_gpu: GpuArena,
    params_buffer: Option<(wgpu::Buffer, u64)>,
    uploads_gpu: GpuArena,
    bind_groups: BindGroupCache,
    /// Which dispatches of a flush go behind a barrier (counted in `counters`).
    barriers: Barriers,
    /// The schedule's per-command buffers (`segment::EncodeTargets::uses`).
    schedule_uses: Vec<Uses>,
    counters: Counters,
    flush_bound: usize,
    /// A one-shot bound (`submit_early`): the open Segment is flushed once it holds this many
    /// dispatches, then the bound is gone.
    early_flush: Option<usize>,
    params_align: usize,
    phase: Phase,
    timer: Option<GpuTimer>,
    /// Matmul tiles measured on this adapter (`tiles::load`: the user's own, else shipped).
    tiles: TileTable,
    /// Tiles the f32 attention runs instead of its defaults (`force_attention_tiles`).
    attention_tiles: Vec<(Pass, AttentionTile)>,
    /// A tile every product runs on, whatever the table says (set by searches).
    forced_tile: Option<TileChoice>,
    /// K ranges every splittable product runs in, whatever the table says (set by searches).
    forced_split: Option<u32>,
    /// The products recorded while logging (`log_products`).
    product_log: Option<Vec<ProductKey>>,
    /// The tickets of products split in one dispatch (`TICKET_BUFFERS` buffers of
    /// `SPLIT_TICKETS` u32, zeroed when made; each product sets back to 0 the ones it takes),
    /// made when first bound, and the one the next such dispatch binds. Buffers, not Storages:
    /// a Storage holds its Device.
    split_tickets: Vec<BufferRef>,
    /// The one of them the next dispatch with tickets binds.
    next_tickets: usize,
    /// Why nothing may be submitted now, if something forbids it (`hold_submits`).
    held: Option<&'static str>,
}

/// A pooled GPU buffer owned by one or more tensors; back to the pool when the last drops.
pub struct Storage {
    buf: Option<PooledBuffer>,
    /// Whether `buf` goes back to the pool when dropped (not a buffer `wrap_external` wrapped,
    /// whose memory another API shares).
    pooled: bool,
    device: Device,
    /// Bytes asked for (the buffer may be larger: its size class).
    pub bytes: u64,
}

impl Storage {
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn buffer_ref(&self) -> BufferRef {
        let b = self.buf.as_ref().expect("a live Storage holds its buffer");
        BufferRef {
            id: b.id,
            buffer: b.buffer.clone(),
        }
    }

    /// Bytes a kernel binding this storage can read: its buffer (the size class, at least
    /// `bytes`) up to the adapter's storage-binding limit.
    pub fn bound_bytes(&self) -> u64 {
        let b = self.buf.as_ref().expect("a live Storage holds its buffer");
        b.size
            .min(self.device.gpu().limits.max_storage_buffer_binding_size)
    }

    pub fn buffer_id(&self) -> u64 {
        self.buf
            .as_ref()
            .expect("a live Storage holds its buffer")
            .id
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            if !self.pooled {
                // wgpu frees it once the GPU is done with it.
                self.device.state().bind_groups.forget(&[buf.id]);
                return;
            }
            // The queue runs recorded work in order, so work recorded after this point may
            // reuse the buffer even though earlier recorded work still reads it.
            self.device.state().pool.release(buf);
        }
    }
}

impl Device {
    /// A device with the options the environment sets (`Options::from_env`): the best
    /// adapter, or the one `WGRAD_BACKEND` / `WGRAD_ADAPTER` name.
    pub fn new() -> Result<Device> {
        Device::with_options(&Options::from_env()?)
    }

    /// A device with `options` (the environment is not read).
    pub fn with_options(options: &Options) -> Result<Device> {
        let gpu = Gpu::new(&options.adapter)?;
        let (tiles, tile_source) = tiles::load(&gpu.info, &options.paths);
        let storage_usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        let read_back_usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let mut state = State {
            pool: BufferPool::new(
                "wgrad:tensor",
                storage_usage,
                Reuse::resolve(&options.pool, Reuse::Any),
            ),
            read_back_pool: BufferPool::new("wgrad:read_back", read_back_usage, Reuse::Any),
            pipelines: PipelineCache::new(
                gpu.has(wgpu::Features::SUBGROUP),
                gpu.limits.max_compute_workgroups_per_dimension,
                options.execution.compile_threads,
                options.kernels.shader_checks,
            ),
            segment: Segment::default(),
            // 64 KiB: room for 256 dispatches before the first growth.
            params_gpu: GpuArena::new("wgrad:params", wgpu::BufferUsages::UNIFORM, 1 << 16),
            params_buffer: None,
            uploads_gpu: GpuArena::new("wgrad:uploads", wgpu::BufferUsages::COPY_SRC, 1 << 16),
            bind_groups: BindGroupCache::default(),
            barriers: Barriers::default(),
            schedule_uses: Vec::new(),
            counters: Counters::default(),
            flush_bound: DEFAULT_FLUSH_BOUND,
            early_flush: None,
            params_align: gpu.limits.min_uniform_buffer_offset_alignment as usize,
            phase: Phase::Forward,
            timer: None,
            tiles,
            attention_tiles: options.lab.attention_f32_tiles().to_vec(),
            forced_tile: None,
            forced_split: None,
            product_log: None,
            split_tickets: Vec::new(),
            next_tickets: 0,
            held: None,
        };
        let max_buffer = gpu.limits.max_buffer_size;
        state.pool.set_limits(options.pool.memory_limit, max_buffer);
        state.read_back_pool.set_limits(None, max_buffer);
        let wait = wait_mode(options, &gpu.info);
        let f32_tensor_cores = options.precision.f32_matmul == F32Matmul::TensorCores
            && crate::kernels::matmul_coop::Coop::available(&gpu).is_some();
        // The sum in the product's dispatch relies on device-scope barriers ordering one
        // workgroup's atomic stores before another's atomic loads, as SPIR-V's do (checked on
        // lavapipe and NVIDIA's driver); Metal's and DX12's translations are not checked.
        let split_in_one_dispatch = options.kernels.split_in_one_dispatch.unwrap_or(matches!(
            gpu.info.backend,
            wgpu::Backend::Vulkan | wgpu::Backend::Noop
        )) && gpu.limits.max_storage_buffers_per_shader_stage >= 7;
        Ok(Device {
            rt: Arc::new(Runtime {
                gpu,
                options: options.clone(),
                state: Mutex::new(state),
                wait,
                f32_tensor_cores,
                split_in_one_dispatch,
                tile_source,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while recording leaves nothing half-updated that later calls rely on.
        self.rt.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn gpu(&self) -> &Gpu {
        &self.rt.gpu
    }

    /// The options this device was made with.
    pub fn options(&self) -> &Options {
        &self.rt.options
    }

    /// The options as `wgrad info` prints them, with what this device made of the choices it
    /// resolves itself (how it waits, how split products sum, how f32 products run).
    pub fn option_rows(&self) -> Vec<OptionRow> {
        let mut rows = self.rt.options.rows();
        for r in &mut rows {
            let resolved = match r.name {
                "wait" => format!("{:?}", self.rt.wait).to_lowercase(),
                "split sum in one dispatch" => self.rt.split_in_one_dispatch.to_string(),
                "f32 matmul" if !self.rt.f32_tensor_cores => "tiled".to_string(),
                _ => continue,
            };
            if r.value != resolved {
                r.value = format!("{resolved} ({})", r.value);
            }
        }
        rows
    }

    /// Whether f32 products run on the adapter's cooperative matrices as three f16 products
    /// of each operand's scaled high and low parts, each after an `absmax` dispatch
    /// (`Precision::f32_matmul`; never without cooperative matrices).
    pub fn f32_on_tensor_cores(&self) -> bool {
        self.rt.f32_tensor_cores
    }

    /// Whether a product split into ranges of K (tiled or cooperative-matrix, not X3) sums
    /// them in its own dispatch (the last range of each tile adding the partials:
    /// `matmul_split_tail.wgsl`) rather than in a second one
    /// (`KernelPolicy::split_in_one_dispatch`).
    pub fn split_in_one_dispatch(&self) -> bool {
        self.rt.split_in_one_dispatch
    }

    pub fn report(&self) -> AdapterReport {
        self.rt.gpu.report()
    }

    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.rt, &other.rt)
    }

    pub fn has_subgroups(&self) -> bool {
        self.state().pipelines.subgroups()
    }

    /// Compiles every kernel variant but the cooperative-matrix matmuls now (see
    /// `PipelineCache::warmup`).
    pub fn warmup(&self) {
        let f16 = self.rt.gpu.has(wgpu::Features::SHADER_F16);
        let mut s = self.state();
        s.pipelines.warmup(&self.rt.gpu.device, f16);
    }

    /// How the tensor pool serves later requests, as the workload prefers (`Reuse::REPEATING`
    /// for a training loop); the options' `PoolPolicy`, where set, wins.
    pub fn set_pool_reuse(&self, reuse: Reuse) {
        let reuse = Reuse::resolve(&self.rt.options.pool, reuse);
        self.state().pool.set_reuse(reuse);
    }

    /// Frees every cached (unused) buffer of the pools.
    pub fn trim(&self) {
        let mut s = self.state();
        let mut ids = s.pool.trim();
        ids.extend(s.read_back_pool.trim());
        s.bind_groups.forget(&ids);
    }

    /// A pooled buffer for `bytes` bytes of tensor data; `what` names it in errors.
    pub(crate) fn alloc(&self, what: &dyn Fn() -> String, bytes: u64) -> Result<Arc<Storage>> {
        let limit = self.rt.gpu.limits.max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(Error::BindingTooLarge {
                what: what(),
                bytes,
                limit,
            });
        }
        let mut s = self.state();
        let buf = s.pool.acquire(&self.rt.gpu.device, bytes, what);
        let evicted = s.pool.take_evicted();
        if !evicted.is_empty() {
            s.bind_groups.forget(&evicted);
        }
        drop(s);
        Ok(Arc::new(Storage {
            buf: Some(buf?),
            pooled: true,
            device: self.clone(),
            bytes,
        }))
    }

    /// Tensor storage over `buffer`, a buffer of this device made outside the pool (with
    /// STORAGE, COPY_SRC and COPY_DST usages): a data-parallel run's gradient bucket, whose
    /// memory NCCL also reads and writes. Dropped, it is not pooled.
    pub fn wrap_external(&self, buffer: wgpu::Buffer) -> Result<Arc<Storage>> {
        let wanted = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        if !buffer.usage().contains(wanted) {
            return Err(Error::InvalidArgument {
                op: "wrap_external",
                reason: format!(
                    "the buffer's usages {:?} lack some of {wanted:?}",
                    buffer.usage()
                ),
            });
        }
        let bytes = buffer.size();
        Ok(Arc::new(Storage {
            buf: Some(PooledBuffer {
                id: crate::memory::next_buffer_id(),
                size: bytes,
                buffer,
            }),
            pooled: false,
            device: self.clone(),
            bytes,
        }))
    }

    /// Workgroups covering `groups` linear workgroups within the per-dimension limit.
    pub(crate) fn grid(&self, groups: u64) -> [u32; 3] {
        grid(
            groups,
            self.rt.gpu.limits.max_compute_workgroups_per_dimension,
        )
    }
}

#[cfg(test)]
mod tests;
