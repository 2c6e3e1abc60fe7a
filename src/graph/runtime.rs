//! `Device`: the handle tensors hold. It owns the GPU, the open Segment, the buffer pools, the
//! pipeline and bind-group caches, and the counters; ops record into it and return at once.

use std::sync::{Arc, Mutex, MutexGuard};

use bytemuck::Pod;

use super::schedule::Uses;
use super::segment::{
    encode, Barriers, BindGroupCache, BufferRef, Command, Counters, Dispatch, EncodeTargets, Phase,
    Segment,
};
use super::timing::{self, GpuInterval, GpuTimer, TimingMode};
use crate::device::{AdapterReport, DeviceOptions, Gpu};
use crate::error::{Error, Result};
use crate::kernels::tuning::{self, ProductKey, TileChoice, TileTable};
use crate::kernels::{grid, KernelDesc, PipelineCache, PipelineStats, Spec};
use crate::memory::{BufferPool, GpuArena, PoolStats, PooledBuffer, Reuse};

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
    state: Mutex<State>,
    wait: WaitMode,
    /// f32 products on the tensor cores (`DeviceOptions::f32_tensor_cores`, resolved).
    f32_tensor_cores: bool,
    /// Split products summed in their own dispatch (`DeviceOptions::split_in_one_dispatch`,
    /// resolved).
    split_in_one_dispatch: bool,
    /// The LayerNorm backward's parameter sums in its own dispatch
    /// (`DeviceOptions::layernorm_sums_in_one_dispatch`, resolved; only where the above).
    layernorm_sums_in_one_dispatch: bool,
}

/// Tiles a product split in one dispatch may have: one ticket (u32) each. (A LayerNorm
/// backward summing dgamma and dbeta in its dispatch takes one a group of chunks, and one.)
pub const SPLIT_TICKETS: usize = 1 << 16;

/// Ticket buffers the dispatches that sum in their own dispatch bind in turn: a linear's dX and
/// dW, and the next linear's, bind different ones (one buffer put a barrier between every two;
/// four is a guess, not a measured count).
const TICKET_BUFFERS: usize = 4;

/// How the CPU waits for the GPU (`sync`, read-backs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// The thread sleeps in the driver until the GPU signals (`PollType::Wait`); waking it
    /// takes the operating system's time.
    Block,
    /// The thread polls the GPU's progress without sleeping, for at most `SPIN_LIMIT`, then
    /// blocks: it sees the end of the work at once, and keeps a core busy meanwhile (as
    /// CUDA's default synchronization does with cores to spare).
    Spin,
}

/// Spinning past this long blocks instead (a long step gains nothing from a busy core).
const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_millis(250);

impl WaitMode {
    /// `WGRAD_WAIT=spin|block`, else `Spin` on a GPU and `Block` on a CPU adapter, whose
    /// work runs on the cores a spinning thread would take.
    fn for_adapter(info: &wgpu::AdapterInfo) -> WaitMode {
        match std::env::var("WGRAD_WAIT").as_deref() {
            Ok("spin") => WaitMode::Spin,
            Ok("block") => WaitMode::Block,
            _ if info.device_type == wgpu::DeviceType::Cpu => WaitMode::Block,
            _ => WaitMode::Spin,
        }
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
    /// Matmul tiles measured on this adapter (loaded from its cache file when there is one).
    tiles: TileTable,
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
}

/// A pooled GPU buffer owned by one or more tensors; back to the pool when the last drops.
pub struct Storage {
    buf: Option<PooledBuffer>,
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
            // The queue runs recorded work in order, so work recorded after this point may
            // reuse the buffer even though earlier recorded work still reads it.
            self.device.state().pool.release(buf);
        }
    }
}

/// The adapter's measured tiles, if its cache file exists; an unreadable one is reported and
/// ignored (it only ever makes products faster).
fn load_tiles(info: &wgpu::AdapterInfo) -> TileTable {
    let Some(path) = tuning::cache_file(info) else {
        return TileTable::default();
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return TileTable::default();
    };
    TileTable::from_json(&text, &info.name, &info.driver_info).unwrap_or_else(|e| {
        tracing::warn!("{}: not a tile table ({e}); ignored", path.display());
        TileTable::default()
    })
}

impl Device {
    /// The best adapter, or the one `WGRAD_BACKEND` / `WGRAD_ADAPTER` name.
    pub fn new() -> Result<Device> {
        Device::with_options(&DeviceOptions::default())
    }

    pub fn with_options(options: &DeviceOptions) -> Result<Device> {
        let gpu = Gpu::new(options)?;
        let storage_usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        let read_back_usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let state = State {
            pool: BufferPool::new(
                "wgrad:tensor",
                storage_usage,
                match options.pool_budget {
                    None => Reuse::from_env(Reuse::Any),
                    Some(0) => Reuse::Any,
                    Some(budget) => Reuse::AcrossSegments {
                        budget: Some(budget),
                    },
                },
            ),
            read_back_pool: BufferPool::new("wgrad:read_back", read_back_usage, Reuse::Any),
            pipelines: PipelineCache::new(
                gpu.has(wgpu::Features::SUBGROUP),
                gpu.limits.max_compute_workgroups_per_dimension,
                options.compile_threads,
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
            tiles: load_tiles(&gpu.info),
            forced_tile: None,
            forced_split: None,
            product_log: None,
            split_tickets: Vec::new(),
            next_tickets: 0,
        };
        let wait = WaitMode::for_adapter(&gpu.info);
        let f32_tensor_cores = options
            .f32_tensor_cores
            .unwrap_or_else(|| std::env::var("WGRAD_F32_MATMUL").map_or(true, |v| v != "tiled"))
            && crate::kernels::matmul_coop::Coop::available(&gpu).is_some();
        // The sum in the product's dispatch relies on device-scope barriers ordering one
        // workgroup's atomic stores before another's atomic loads, as SPIR-V's do (checked on
        // lavapipe and NVIDIA's driver); Metal's and DX12's translations are not checked.
        let split_in_one_dispatch = options.split_in_one_dispatch.unwrap_or_else(|| {
            std::env::var("WGRAD_SPLIT_SUM").map_or(true, |v| v != "dispatch")
                && matches!(
                    gpu.info.backend,
                    wgpu::Backend::Vulkan | wgpu::Backend::Noop
                )
        }) && gpu.limits.max_storage_buffers_per_shader_stage >= 7;
        let layernorm_sums_in_one_dispatch = split_in_one_dispatch
            && gpu.limits.max_storage_buffers_per_shader_stage >= 10
            && options
                .layernorm_sums_in_one_dispatch
                .unwrap_or_else(|| std::env::var("WGRAD_LN_SUM").is_ok_and(|v| v == "one"));
        Ok(Device {
            rt: Arc::new(Runtime {
                gpu,
                state: Mutex::new(state),
                wait,
                f32_tensor_cores,
                split_in_one_dispatch,
                layernorm_sums_in_one_dispatch,
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

    /// Whether f32 products run on the adapter's cooperative matrices as three f16 products
    /// of each operand's scaled high and low parts, each after an `absmax` dispatch
    /// (`DeviceOptions::f32_tensor_cores`; never without cooperative matrices).
    pub fn f32_on_tensor_cores(&self) -> bool {
        self.rt.f32_tensor_cores
    }

    /// Whether a product split into ranges of K (tiled or cooperative-matrix, not X3) sums
    /// them in its own dispatch (the last range of each tile adding the partials:
    /// `matmul_split_tail.wgsl`) rather than in a second one
    /// (`DeviceOptions::split_in_one_dispatch`).
    pub fn split_in_one_dispatch(&self) -> bool {
        self.rt.split_in_one_dispatch
    }

    /// Whether the LayerNorm backward sums dgamma and dbeta in its own dispatch
    /// (`DeviceOptions::layernorm_sums_in_one_dispatch`).
    pub fn layernorm_sums_in_one_dispatch(&self) -> bool {
        self.rt.layernorm_sums_in_one_dispatch
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

    /// Counters since the device was made; subtract two readings for an interval.
    pub fn counters(&self) -> Counters {
        self.state().counters
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.state().pool.stats()
    }

    /// Buffers created outside the tensor pool (arenas, read-back buffers) since the start.
    pub fn other_buffers_created(&self) -> u64 {
        let s = self.state();
        s.params_gpu.buffers_created
            + s.uploads_gpu.buffers_created
            + s.read_back_pool.stats().buffers_created
    }

    pub fn pipeline_stats(&self) -> PipelineStats {
        self.state().pipelines.stats()
    }

    /// The `n` kernel variants whose compiles took longest so far (`PipelineCache::
    /// slowest_compiles`): kernel, variant, milliseconds.
    pub fn slowest_compiles(&self, n: usize) -> Vec<(&'static str, std::sync::Arc<str>, f64)> {
        self.state().pipelines.slowest_compiles(n)
    }

    pub fn bind_groups_cached(&self) -> usize {
        self.state().bind_groups.len()
    }

    /// Zeroes the pool's running counters (creations, reuses); the peak restarts from now.
    pub fn reset_pool_counters(&self) {
        self.state().pool.reset_counters();
    }

    /// Sets what the following dispatches are counted as; returns the previous phase.
    pub fn set_phase(&self, phase: Phase) -> Phase {
        std::mem::replace(&mut self.state().phase, phase)
    }

    /// Turns GPU timestamps on or off (flushing first); returns the mode now in force, None
    /// when off or when the adapter has no timestamps.
    pub fn set_gpu_timing(&self, on: bool) -> Option<TimingMode> {
        self.flush();
        let gpu = &self.rt.gpu;
        let mode = if !on {
            None
        } else if gpu.has(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
            Some(TimingMode::PerDispatch)
        } else if gpu.has(wgpu::Features::TIMESTAMP_QUERY) {
            Some(TimingMode::PerPass)
        } else {
            None
        };
        let mut s = self.state();
        s.timer = mode.map(|m| GpuTimer::new(&gpu.device, &gpu.queue, m));
        if mode.is_some() {
            // Two queries per dispatch must fit one query set per flush.
            s.flush_bound = s.flush_bound.min(timing::MAX_QUERIES as usize / 2);
        }
        mode
    }

    /// Flushes, waits for the GPU, and returns every interval timed since the last call.
    pub fn take_gpu_intervals(&self) -> Result<Vec<GpuInterval>> {
        self.sync()?;
        let mut s = self.state();
        match s.timer.as_mut() {
            Some(t) => t.collect(&self.rt.gpu.device).map_err(Error::ReadBack),
            None => Ok(Vec::new()),
        }
    }

    /// The tile to run `key` on: the forced one, else the measured one, if any (the caller
    /// checks it fits the product's kernel).
    pub fn tile_for(&self, key: &ProductKey) -> Option<TileChoice> {
        let mut s = self.state();
        if let Some(log) = s.product_log.as_mut() {
            if !log.contains(key) {
                log.push(*key);
            }
        }
        s.forced_tile.or_else(|| s.tiles.get(key))
    }

    /// Runs every product on `tile` (None: back to the table and the heuristics).
    pub fn force_tile(&self, tile: Option<TileChoice>) {
        self.state().forced_tile = tile;
    }

    /// The number of K ranges `key` runs in, where forced or measured (else the launcher's
    /// rule decides).
    pub fn split_for(&self, key: &ProductKey) -> Option<u32> {
        let s = self.state();
        s.forced_split.or_else(|| s.tiles.split(key))
    }

    /// Runs every product that may split K in `split` ranges (None: back to the table and the
    /// rule).
    pub fn force_split(&self, split: Option<u32>) {
        self.state().forced_split = split;
    }

    /// Records a measured tile and K ranges for `key` (kept in memory; `tile_table_json`
    /// writes it out).
    pub fn set_tile(&self, key: ProductKey, tile: TileChoice, split: Option<u32>, ms: f64) {
        self.state().tiles.insert(key, tile, split, ms);
    }

    /// The measured configurations as rows (key, tile, split, ms).
    pub fn tile_rows(&self) -> Vec<(ProductKey, TileChoice, Option<u32>, f64)> {
        self.state().tiles.rows()
    }

    /// The table as its cache file holds it.
    pub fn tile_table_json(&self) -> String {
        let info = &self.rt.gpu.info;
        self.state().tiles.to_json(&info.name, &info.driver_info)
    }

    /// Starts (or stops) logging the distinct matmul products recorded.
    pub fn log_products(&self, on: bool) {
        self.state().product_log = on.then(Vec::new);
    }

    /// The products logged since `log_products(true)`; logging goes on.
    pub fn take_product_log(&self) -> Vec<ProductKey> {
        self.state()
            .product_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

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

    /// Compiles every kernel variant but the cooperative-matrix matmuls now (see
    /// `PipelineCache::warmup`).
    pub fn warmup(&self) {
        let f16 = self.rt.gpu.has(wgpu::Features::SHADER_F16);
        let mut s = self.state();
        s.pipelines.warmup(&self.rt.gpu.device, f16);
    }

    /// How the tensor pool serves later requests (`Reuse::REPEATING` for a training loop).
    pub fn set_pool_reuse(&self, reuse: Reuse) {
        self.state().pool.set_reuse(reuse);
    }

    /// Frees every cached (unused) buffer of the pools.
    pub fn trim(&self) {
        let mut s = self.state();
        let mut ids = s.pool.trim();
        ids.extend(s.read_back_pool.trim());
        s.bind_groups.forget(&ids);
    }

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
        self.wait_for(idx, wgpu::PollStatus::is_queue_empty)
            .map_err(|e| Error::Device(e.to_string()))?;
        self.state().counters.wait_ns += start.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// How this device waits for the GPU.
    pub fn wait_mode(&self) -> WaitMode {
        self.rt.wait
    }

    /// Waits until the GPU has finished submission `idx` (`None`: all submitted work). A
    /// spinning wait ends when `done` says what was waited for has happened, given what a
    /// poll returned (an empty queue; or a map callback, which fires within a poll).
    fn wait_for(
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

    fn flush_locked(&self, s: &mut State) -> Option<wgpu::SubmissionIndex> {
        if s.segment.is_empty() {
            return None;
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
        let buf = self.state().pool.acquire(&self.rt.gpu.device, bytes);
        Ok(Arc::new(Storage {
            buf: Some(buf),
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
        if groups.contains(&0) || skipped(kernel.name) {
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
        if s.segment.dispatches >= s.flush_bound || (early && s.segment.pipelines_ready()) {
            self.flush_locked(&mut s);
        } else if early {
            // A cold Segment goes on recording instead (see `flush_if_compiled`).
            s.early_flush = None;
        }
    }

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

    /// Records a copy of the first `bytes` of `src` into `dst` (a buffer-to-buffer copy in
    /// order with the recorded work: the device-to-device copy `wgrad bench` measures against).
    pub fn copy_storage(&self, src: &Storage, dst: &Storage, bytes: u64) {
        let bytes = bytes.min(src.bytes).min(dst.bytes) / wgpu::COPY_BUFFER_ALIGNMENT
            * wgpu::COPY_BUFFER_ALIGNMENT;
        if bytes == 0 {
            return;
        }
        let mut s = self.state();
        let (src, dst) = (src.buffer_ref(), dst.buffer_ref());
        s.segment.commands.push(Command::Copy {
            src: src.buffer,
            src_id: src.id,
            src_offset: 0,
            dst: dst.buffer,
            dst_id: dst.id,
            dst_offset: 0,
            size: bytes,
        });
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
            let staging = s.read_back_pool.acquire(&gpu.device, size);
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
        self.wait_for(Some(idx), |_| {
            mapped.load(std::sync::atomic::Ordering::Acquire)
        })
        .map_err(|e| Error::ReadBack(e.to_string()))?;
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

/// `WGRAD_SKIP_KERNELS=name,...` (a measurement switch; results come out wrong): dispatches
/// of these entry points are not recorded, so a step's time without them bounds what making
/// them free (or fusing them away) can save inside the step, barriers included.
fn skipped(name: &str) -> bool {
    static SKIP: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SKIP.get_or_init(|| {
        std::env::var("WGRAD_SKIP_KERNELS")
            .map(|v| {
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    })
    .iter()
    .any(|s| s == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Tensor;

    /// A device whose one compile worker is held until the returned sender sends (or drops).
    fn held_device() -> (Device, std::sync::mpsc::Sender<()>) {
        let dev = Device::with_options(&DeviceOptions {
            compile_threads: Some(1),
            ..Default::default()
        })
        .expect("a device (lavapipe without a GPU)");
        let (release, held) = std::sync::mpsc::channel::<()>();
        dev.state().pipelines.run_on_workers(move || {
            let _ = held.recv();
        });
        (dev, release)
    }

    #[test]
    fn the_slowest_compiles_come_longest_first_with_their_times() {
        let dev = Device::with_options(&DeviceOptions {
            compile_threads: Some(2),
            ..Default::default()
        })
        .expect("a device (lavapipe without a GPU)");
        let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2]).expect("an upload");
        let y = x
            .matmul(&x)
            .expect("recorded")
            .add_scalar(1.0)
            .expect("recorded");
        y.to_vec().expect("read back");
        let all = dev.slowest_compiles(100);
        assert!(all.len() >= 2, "{all:?}");
        assert!(all.iter().all(|(_, _, ms)| *ms > 0.0), "{all:?}");
        assert!(all.windows(2).all(|w| w[0].2 >= w[1].2), "{all:?}");
        assert_eq!(dev.slowest_compiles(1), all[..1].to_vec());
    }

    #[test]
    fn an_early_submit_waits_for_no_compile() {
        let (dev, release) = held_device();
        let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3]).expect("an upload");
        let c0 = dev.counters();
        dev.submit_early(2);
        let mut y = x.clone();
        for _ in 0..4 {
            y = y.add_scalar(0.5).expect("recorded");
        }
        dev.flush_if_compiled();
        assert_eq!((dev.counters() - c0).submits, 0, "nothing compiled yet");
        release.send(()).expect("the worker waits");
        assert_eq!(y.to_vec().expect("read back"), [3.0, 4.0, 5.0]);
        let c = dev.counters() - c0;
        assert_eq!(c.submits, 1, "{c:?}");
        assert!(
            c.compile_wait_ns > 0,
            "the read-back waited for the compile: {c:?}"
        );
        // Compiled now: the same work submits early, and waits for nothing.
        let c1 = dev.counters();
        dev.submit_early(2);
        for _ in 0..2 {
            y = y.add_scalar(0.5).expect("recorded");
        }
        let c = dev.counters() - c1;
        assert_eq!((c.submits, c.compile_wait_ns), (1, 0), "{c:?}");
    }

    #[test]
    fn a_kernel_that_does_not_compile_is_reported_once() {
        static BROKEN: crate::kernels::Family = crate::kernels::Family {
            name: "test_broken",
            source: "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
                     @compute @workgroup_size(1) fn test_broken() { let x = undeclared; }",
            workgroup_reduce: false,
        };
        static KERNEL: KernelDesc = KernelDesc {
            name: "test_broken",
            family: &BROKEN,
            storage: &[],
            params_size: 16,
        };
        let (dev, release) = held_device();
        drop(release);
        dev.record(&KERNEL, &Spec::new(), &[0u32; 4], &[], [1, 1, 1]);
        let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.flush()));
        let msg = flushed.expect_err("the flush reports it");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains("kernel test_broken") && msg.contains("did not compile"),
            "{msg}"
        );
        // The Segment that held it is gone: the next flush has nothing to encode.
        let c0 = dev.counters();
        dev.flush();
        assert_eq!((dev.counters() - c0).submits, 0);
    }

    fn pool_device(pool_budget: u64) -> Device {
        Device::with_options(&DeviceOptions {
            pool_budget: Some(pool_budget),
            ..Default::default()
        })
        .expect("a device (lavapipe without a GPU)")
    }

    #[test]
    fn dispatches_that_write_new_buffers_and_read_what_was_read_run_without_a_barrier() {
        let dev = pool_device(1 << 30);
        let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[4]).expect("an upload");
        let y = Tensor::from_slice(&dev, &[0.5, 0.5, 0.5, 0.5], &[4]).expect("an upload");
        dev.flush();
        let c0 = dev.counters();
        let a = x.add(&y).expect("recorded"); // first uses in this command buffer
        let b = x.mul(&y).expect("recorded"); // x, y read again; b new: beside a
        let c = a.add(&b).expect("recorded"); // reads what a and b wrote: waits
        let d = c.mul_scalar(2.0).expect("recorded"); // reads c: waits
        dev.flush();
        let k = dev.counters() - c0;
        assert_eq!((k.dispatches, k.barriers), (4, 2), "{k:?}");
        assert_eq!(d.to_vec().expect("read back"), [4.0, 7.0, 10.0, 13.0]);
    }

    #[test]
    fn a_buffer_given_back_in_the_open_segment_is_reused_in_the_next() {
        // (budget, whether the open Segment's buffer is taken again at once)
        for (budget, at_once) in [(1u64 << 30, false), (0, true), (1, true)] {
            let dev = pool_device(budget);
            let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[4]).expect("an upload");
            let y = Tensor::from_slice(&dev, &[0.5, 0.5, 0.5, 0.5], &[4]).expect("an upload");
            dev.flush();
            let c0 = dev.counters();
            let a = x.add(&y).expect("recorded");
            let freed = a.storage().buffer_id();
            drop(a);
            let b = x.mul(&y).expect("recorded");
            dev.flush();
            let k = dev.counters() - c0;
            assert_eq!(b.storage().buffer_id() == freed, at_once, "budget {budget}");
            // b writing the buffer a wrote in the same command buffer waits for a.
            assert_eq!(k.barriers, at_once as u64, "budget {budget}: {k:?}");
            assert_eq!(b.to_vec().expect("read back"), [0.5, 1.0, 1.5, 2.0]);
            drop(b);
            // Given back before the open Segment: taken first.
            let e = x.sub(&y).expect("recorded");
            assert_eq!(e.storage().buffer_id(), freed, "budget {budget}");
            assert_eq!(e.to_vec().expect("read back"), [0.5, 1.5, 2.5, 3.5]);
        }
    }
}
