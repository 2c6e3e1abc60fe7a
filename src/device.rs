//! Adapter choice, features, limits, queue.
//!
//! Picks the best adapter (discrete GPU, then integrated, then virtual, then CPU), or the one
//! `config::AdapterChoice` names (`WGRAD_BACKEND`, `WGRAD_ADAPTER`); leaves off the optional
//! features it says (`WGRAD_DISABLE_FEATURES`, so fallbacks can be tested on any adapter) and
//! lowers the storage-binding limit to its cap (`WGRAD_MAX_BINDING`: lavapipe's 128 MiB paths,
//! the embedding split into row shards, on any adapter). The device is created with every
//! useful feature the adapter has and the adapter's own limits.

use serde::Serialize;

use crate::config::AdapterChoice;
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

/// The wgpu device and what it can do.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    pub cooperative_matrix: Vec<wgpu::CooperativeMatrixProperties>,
    /// What went wrong outside an error scope and is not an engine bug: the next wait reports
    /// it (`take_fault`).
    faults: Faults,
}

/// A GPU failure that is the machine's, not wgrad's.
#[derive(Clone, Debug)]
enum Fault {
    /// Memory ran out where no error scope was open (a bind group, a command buffer).
    OutOfMemory(String),
    /// The driver or wgpu failed inside (a system limit, a driver error).
    Internal(String),
    /// The device is gone (driver reset, GPU removed, a hang the driver ended).
    Lost(String),
}

/// The first fault since the last wait, shared with wgpu's callbacks.
#[derive(Clone, Default)]
struct Faults(std::sync::Arc<std::sync::Mutex<Option<Fault>>>);

impl Faults {
    fn set(&self, fault: Fault) {
        tracing::error!("wgpu: {fault:?}");
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(fault);
    }

    /// wgpu's uncaptured-error handler: a validation error means wgrad recorded something
    /// invalid, an engine bug, and stops here; out-of-memory and internal errors are the
    /// machine's and come back as errors from the next wait.
    fn uncaptured(&self, e: wgpu::Error) {
        match e {
            wgpu::Error::OutOfMemory { source } => self.set(Fault::OutOfMemory(source.to_string())),
            wgpu::Error::Internal { description, .. } => self.set(Fault::Internal(description)),
            wgpu::Error::Validation { .. } => {
                tracing::error!("wgpu: {e}");
                // After a fault, a resource whose creation failed is invalid and every use of
                // it fails validation: a consequence, which the fault's error reports.
                if self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                    return;
                }
                panic!("wgpu validation error (an engine bug, please report it): {e}");
            }
        }
    }
}

impl Gpu {
    /// The fault recorded since the last call, as an error naming what happened and what to
    /// do; None when there was none.
    pub fn take_fault(&self) -> Option<Error> {
        let fault = self
            .faults
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        Some(match fault {
            Fault::OutOfMemory(reason) => Error::OutOfMemory {
                what: "the GPU's work (bind groups, command buffers)".into(),
                bytes: 0,
                limit: format!("the adapter had no more memory ({reason})"),
                advice: "Lower --batch or --seq, or use a smaller model".into(),
            },
            Fault::Internal(reason) => Error::Device(format!(
                "the driver or wgpu failed (not a fault of the run's inputs): {reason}"
            )),
            Fault::Lost(reason) => Error::Device(format!(
                "the GPU device was lost ({reason}): the driver reset it or it went away; \
                 nothing more can run on it, start the command again"
            )),
        })
    }

    pub fn new(choice: &AdapterChoice) -> Result<Gpu> {
        let backends = choice
            .backends
            .unwrap_or(wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12);
        let wanted_name = choice.name.as_ref().map(|s| s.to_lowercase());
        let disable = choice.disable;

        let mut descriptor = wgpu::InstanceDescriptor {
            backends,
            // Creation past 95% of the memory budget the driver reports fails as out of memory
            // (Vulkan with VK_EXT_memory_budget, DX12) instead of overcommitting the GPU.
            memory_budget_thresholds: wgpu::MemoryBudgetThresholds {
                for_resource_creation: Some(95),
                for_device_loss: None,
            },
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
        if let (Some(rank), Some(best)) = (choice.local_rank, adapters.first()) {
            // One process per GPU under an MPI launcher: the host's rank r takes the r-th of
            // the best kind (modulo, so ranks share an adapter where there are fewer, as
            // lavapipe's tests do).
            let kind = best.get_info().device_type;
            adapters.retain(|a| a.get_info().device_type == kind);
            let pick = rank % adapters.len();
            adapters.rotate_left(pick);
        }
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
        if let Some(cap) = choice.max_storage_binding {
            crate::config::check_binding_cap(cap)?;
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
        let faults = Faults::default();
        let sink = faults.clone();
        device.on_uncaptured_error(std::sync::Arc::new(move |e| sink.uncaptured(e)));
        let sink = faults.clone();
        device.set_device_lost_callback(move |reason, message| {
            sink.set(Fault::Lost(format!("{reason:?}: {message}")));
        });
        Ok(Gpu {
            device,
            queue,
            info,
            features,
            limits,
            cooperative_matrix,
            faults,
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
