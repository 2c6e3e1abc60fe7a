//! Adapter choice, features, limits, queue.
//!
//! Picks the best adapter (discrete GPU, then integrated, then virtual, then CPU), or the one
//! the environment names: `WGRAD_BACKEND` (vulkan, metal, dx12) limits the backends searched,
//! `WGRAD_ADAPTER` picks the first adapter whose name contains the given text (case-insensitive).
//! `WGRAD_DISABLE_FEATURES` (comma list: subgroups, subgroup_barrier, f16, timestamps,
//! immediates, cooperative_matrix) turns optional features off, so fallbacks can be tested on
//! any adapter.
//! `WGRAD_MAX_BINDING` (bytes) lowers the storage-binding limit wgrad uses and requests, so the
//! paths for adapters with a small limit (lavapipe's 128 MiB: the embedding split into row
//! shards) run on any adapter.
//! The device is created with every useful feature the adapter has and the adapter's own limits.

use serde::Serialize;

use crate::error::{Error, Result};

/// Optional features wgrad uses when the adapter has them.
pub const USEFUL_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::SUBGROUP_BARRIER)
    .union(wgpu::Features::TIMESTAMP_QUERY)
    .union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    .union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS)
    .union(wgpu::Features::IMMEDIATES)
    .union(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);

/// How to choose the adapter; `Default` reads the environment.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Backends to search (`None`: `WGRAD_BACKEND`, else all native backends).
    pub backends: Option<wgpu::Backends>,
    /// A case-insensitive part of the adapter name (`None`: `WGRAD_ADAPTER`).
    pub adapter_name: Option<String>,
    /// Features to leave off even when the adapter has them (added to `WGRAD_DISABLE_FEATURES`).
    pub disable: wgpu::Features,
    /// A max storage-binding size in bytes below the adapter's (`None`: `WGRAD_MAX_BINDING`,
    /// else the adapter's own): tensors and parameter chunks are held to it as on an adapter
    /// whose limit it is.
    pub max_storage_binding: Option<u64>,
    /// Threads that compile pipelines (`None`: `WGRAD_COMPILE_THREADS`, else one per core;
    /// at most 16; `Some(0)`: each compiled where it is first recorded).
    pub compile_threads: Option<usize>,
    /// Bytes the buffer pool may hold (live and free) in buffers it makes rather than reuse
    /// one given back in the open Segment (`Some(0)`: a free buffer is reused at once, as
    /// `WGRAD_POOL_REUSE=any`; `None`: as the environment says, by default reused at once
    /// until a trainer sets `Reuse::REPEATING`). See `memory::Reuse`.
    pub pool_budget: Option<u64>,
    /// Whether f32 products run on the tensor cores as three f16 products of their operands'
    /// scaled high and low parts, where the adapter has cooperative matrices (`None`: yes,
    /// unless `WGRAD_F32_MATMUL=tiled`; `Some(false)`: the tiled f32 kernel).
    pub f32_tensor_cores: Option<bool>,
    /// Whether a product split into ranges of K (tiled or cooperative-matrix, not X3) sums
    /// them in its own dispatch, the last range of each tile adding the others' partials
    /// (`None`: yes on Vulkan and the noop backend, unless `WGRAD_SPLIT_SUM=dispatch`;
    /// `Some(true)`: on any backend, Metal's and DX12's unchecked; `Some(false)`: a second
    /// dispatch sums them). Either way it needs 7 storage bindings a shader.
    pub split_in_one_dispatch: Option<bool>,
    /// Whether the LayerNorm backward sums dgamma and dbeta in its own dispatch where split
    /// products do (`None`: only with `WGRAD_LN_SUM=one`: slower than a second dispatch on an
    /// H100, PROFILING.md; it needs 10 storage bindings a shader).
    pub layernorm_sums_in_one_dispatch: Option<bool>,
}

/// The wgpu device and what it can do.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    pub cooperative_matrix: Vec<wgpu::CooperativeMatrixProperties>,
}

impl Gpu {
    pub fn new(options: &DeviceOptions) -> Result<Gpu> {
        let backends = match (&options.backends, std::env::var("WGRAD_BACKEND")) {
            (Some(b), _) => *b,
            (None, Ok(s)) => wgpu::Backends::from_comma_list(&s),
            (None, Err(_)) => wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
        };
        let wanted_name = options
            .adapter_name
            .clone()
            .or_else(|| std::env::var("WGRAD_ADAPTER").ok())
            .map(|s| s.to_lowercase());
        let disable = options.disable | disabled_from_env();

        let mut descriptor = wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        };
        if backends.contains(wgpu::Backends::NOOP) {
            descriptor.backend_options.noop = noop_options();
        }
        let instance = wgpu::Instance::new(descriptor);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
        if let Some(name) = &wanted_name {
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(name));
        }
        adapters.sort_by_key(|a| adapter_rank(a.get_info().device_type));
        let Some(adapter) = adapters.into_iter().next() else {
            let detail = match &wanted_name {
                Some(n) => format!(" whose name contains `{n}` (backends {backends:?})"),
                None => format!(" (backends {backends:?})"),
            };
            return Err(Error::NoAdapter { detail });
        };

        let info = adapter.get_info();
        let features = adapter.features() & USEFUL_FEATURES & !disable;
        let mut limits = adapter.limits();
        if let Some(cap) = binding_cap(options)? {
            limits.max_storage_buffer_binding_size =
                limits.max_storage_buffer_binding_size.min(cap);
        }
        // Whole vectors of 4 f32: the matmul kernels bind their operands as vec4 arrays, so a
        // binding's last elements lie inside its array only if its size is a multiple of 16.
        limits.max_storage_buffer_binding_size -= limits.max_storage_buffer_binding_size % 16;
        let cooperative_matrix =
            if !features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                Vec::new()
            } else if info.backend == wgpu::Backend::Noop {
                vec![NOOP_COOPERATIVE_MATRIX]
            } else {
                adapter.cooperative_matrix_properties()
            };
        let experimental_features =
            if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                // SAFETY: experimental features are only requested when the adapter reports the
                // cooperative-matrix feature; the kernels that use it are validated by naga.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("wgrad"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::RequestDevice {
            adapter: info.name.clone(),
            reason: e.to_string(),
        })?;
        device.on_uncaptured_error(std::sync::Arc::new(|e| {
            // Validation errors are engine bugs; device loss is reported by the next poll.
            tracing::error!("wgpu: {e}");
            panic!("wgpu error (an engine bug, please report it): {e}");
        }));
        Ok(Gpu {
            device,
            queue,
            info,
            features,
            limits,
            cooperative_matrix,
        })
    }

    pub fn has(&self, feature: wgpu::Features) -> bool {
        self.features.contains(feature)
    }

    /// What `wgrad info` prints.
    pub fn report(&self) -> AdapterReport {
        let l = &self.limits;
        AdapterReport {
            adapter: self.info.name.clone(),
            backend: format!("{:?}", self.info.backend).to_lowercase(),
            device_type: format!("{:?}", self.info.device_type),
            driver: self.info.driver.clone(),
            driver_info: self.info.driver_info.clone(),
            features: USEFUL_FEATURES
                .iter_names()
                .filter(|(_, f)| self.features.contains(*f))
                .map(|(n, _)| n.to_string())
                .collect(),
            limits: LimitsReport {
                max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
                max_buffer_size: l.max_buffer_size,
                max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
                max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
                max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
                max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
                max_immediate_size: l.max_immediate_size,
                min_uniform_buffer_offset_alignment: l.min_uniform_buffer_offset_alignment,
                min_subgroup_size: self.info.subgroup_min_size,
                max_subgroup_size: self.info.subgroup_max_size,
            },
            cooperative_matrix: self
                .cooperative_matrix
                .iter()
                .map(|p| CoopMatrixShape {
                    m: p.m_size,
                    n: p.n_size,
                    k: p.k_size,
                    ab: format!("{:?}", p.ab_type).to_lowercase(),
                    cr: format!("{:?}", p.cr_type).to_lowercase(),
                })
                .collect(),
        }
    }
}

/// wgpu's noop backend (`WGRAD_BACKEND=noop`) records, encodes and submits everything and runs
/// nothing: a step's host cost alone, on any machine (read-backs give zeros). It stands for an
/// NVIDIA GPU as the H200 reports itself (`wgrad info`: subgroups of 32, 48 KiB of workgroup
/// memory, 2 GiB bindings, uniform offsets on 64 bytes, 16x16x16 f16 cooperative matrices), so
/// a step records the kernels it records there; but no tile table is found for it (the shape
/// heuristics choose), its cooperative-matrix tiles are the scalar f16 ones (the vec4 ones are
/// for Vulkan), and it reports itself as a CPU (wgpu 30 leaves `device_type` unused), so waits
/// block.
fn noop_options() -> wgpu::NoopBackendOptions {
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: (2 << 30) - 4,
        max_buffer_size: 4 << 30,
        max_compute_workgroup_storage_size: 48 << 10,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroups_per_dimension: 65535,
        min_uniform_buffer_offset_alignment: 64,
        min_storage_buffer_offset_alignment: 16,
        ..wgpu::Limits::unlimited()
    };
    wgpu::NoopBackendOptions {
        enable: true,
        limits: Some(limits),
        subgroup_min_size: Some(32),
        subgroup_max_size: Some(32),
        ..Default::default()
    }
}

/// The cooperative-matrix shape the noop backend offers (NVIDIA's f16 one; see `noop_options`).
const NOOP_COOPERATIVE_MATRIX: wgpu::CooperativeMatrixProperties =
    wgpu::CooperativeMatrixProperties {
        m_size: 16,
        n_size: 16,
        k_size: 16,
        ab_type: wgpu::CooperativeScalarType::F16,
        cr_type: wgpu::CooperativeScalarType::F32,
        saturating_accumulation: false,
    };

fn adapter_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// The binding cap of `options`, else of `WGRAD_MAX_BINDING` (bytes; a multiple of 4, so
/// whole f32 elements fit).
fn binding_cap(options: &DeviceOptions) -> Result<Option<u64>> {
    let cap = match (
        options.max_storage_binding,
        std::env::var("WGRAD_MAX_BINDING"),
    ) {
        (Some(cap), _) => cap,
        (None, Ok(text)) => text.trim().parse().map_err(|e| Error::InvalidArgument {
            op: "WGRAD_MAX_BINDING",
            reason: format!("`{text}` is not a byte count: {e}"),
        })?,
        (None, Err(_)) => return Ok(None),
    };
    // 1 KiB: a floor that keeps every small tensor of the tests and kernels bindable.
    if cap < 1024 || !cap.is_multiple_of(4) {
        return Err(Error::InvalidArgument {
            op: "WGRAD_MAX_BINDING",
            reason: format!(
                "a binding cap of {cap} bytes: it must be at least 1024 and a multiple of 4"
            ),
        });
    }
    Ok(Some(cap))
}

fn disabled_from_env() -> wgpu::Features {
    let Ok(list) = std::env::var("WGRAD_DISABLE_FEATURES") else {
        return wgpu::Features::empty();
    };
    let mut off = wgpu::Features::empty();
    for name in list.split(',').map(str::trim) {
        off |= match name {
            "subgroups" => wgpu::Features::SUBGROUP,
            "subgroup_barrier" => wgpu::Features::SUBGROUP_BARRIER,
            "f16" => wgpu::Features::SHADER_F16,
            "timestamps" => {
                wgpu::Features::TIMESTAMP_QUERY
                    | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
                    | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            }
            // Timestamps around passes only: `wgrad profile` then times each submit's pass,
            // which costs nothing between dispatches (see PROFILING.md).
            "timestamps_inside_passes" => wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
            "immediates" => wgpu::Features::IMMEDIATES,
            "cooperative_matrix" => wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            _ => wgpu::Features::empty(),
        };
    }
    off
}

/// The adapter, as `wgrad info --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct AdapterReport {
    pub adapter: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub features: Vec<String>,
    pub limits: LimitsReport,
    pub cooperative_matrix: Vec<CoopMatrixShape>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LimitsReport {
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_immediate_size: u32,
    pub min_uniform_buffer_offset_alignment: u32,
    pub min_subgroup_size: u32,
    pub max_subgroup_size: u32,
}

/// One cooperative-matrix configuration: M x N x K, operand and accumulator types.
#[derive(Clone, Debug, Serialize)]
pub struct CoopMatrixShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ab: String,
    pub cr: String,
}
