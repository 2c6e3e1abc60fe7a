//! Options: every setting a user (or, in a `lab` build, a measurement) may give, as one typed
//! struct that each `Device` holds. `Options::from_env` reads the environment once, here and
//! nowhere else; `Options::default` is the built-in defaults. Code and tests set a field
//! directly and make a Device with it (`Device::with_options`), so two Devices of one process
//! may run under different options.
//!
//! | group | what | changes a run's numbers |
//! | --- | --- | --- |
//! | `adapter` | which adapter, which of its features and how much of its binding limit | yes (other kernels) |
//! | `precision` | what mixed precision stores in f16, and how f32 products run | yes: saved with a checkpoint, checked on `--resume` |
//! | `kernels` | portability and debugging choices of the kernels | no |
//! | `execution` | how the CPU waits and compiles | no |
//! | `pool` | how the buffer pool reuses memory | no |
//! | `paths` | where measured tile tables are kept | no |
//! | `dist` | what an MPI launcher says of this process (world size, local rank), the collectives' bound | no |
//! | `lab` | measurement knobs, only with `--features lab` | some (forced tiles, ablations) |
//!
//! docs/ENVIRONMENT.md lists every variable.

mod env;
mod lab;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use env::{check_binding_cap, VARIABLES};
pub use lab::Lab;

/// Every option of a Device.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub adapter: AdapterChoice,
    pub precision: Precision,
    pub kernels: KernelPolicy,
    pub execution: Execution,
    pub pool: PoolPolicy,
    pub paths: Paths,
    pub dist: DistOptions,
    /// Measurement knobs: fields only in a `lab` build; in a default build every knob reads as
    /// its default and nothing of them is checked.
    pub lab: Lab,
    /// The environment variables `from_env` found set (for `wgrad info`).
    from_env: Vec<&'static str>,
}

/// Which adapter, and how much of it.
#[derive(Clone, Debug, Default)]
pub struct AdapterChoice {
    /// This process's rank among those of its host, when an MPI launcher started it
    /// (`OMPI_COMM_WORLD_LOCAL_RANK` from Open MPI, `MPI_LOCALRANKID` from MPICH): the adapter
    /// is the one of this index (modulo their count) among the best kind's, after `name` and
    /// `backends` filtered them, so each rank of a host takes its own GPU.
    pub local_rank: Option<usize>,
    /// Backends to search (`WGRAD_BACKEND`: vulkan, metal, dx12, noop, a comma list; None:
    /// Vulkan, Metal and DX12).
    pub backends: Option<wgpu::Backends>,
    /// The first adapter whose name contains this, case-insensitive (`WGRAD_ADAPTER`; None:
    /// the best: discrete GPU, then integrated, virtual, CPU).
    pub name: Option<String>,
    /// Optional features left off even where the adapter has them (`WGRAD_DISABLE_FEATURES`:
    /// subgroups, subgroup_barrier, f16, timestamps, timestamps_inside_passes, immediates,
    /// cooperative_matrix), to run the fallbacks on any adapter.
    pub disable: wgpu::Features,
    /// A storage-binding size in bytes below the adapter's (`WGRAD_MAX_BINDING`): tensors and
    /// parameter chunks are held to it as on an adapter whose limit it is (at least 1024, a
    /// multiple of 4).
    pub max_storage_binding: Option<u64>,
}

/// f16 or f32 storage of one kind of tensor under mixed precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Float {
    #[default]
    F16,
    F32,
}

/// How a product of f32 operands (outside mixed precision) runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum F32Matmul {
    /// On the adapter's cooperative matrices as three f16 products of each operand's scaled
    /// high and low parts (X3), where it has them; else the tiled f32 kernel.
    #[default]
    TensorCores,
    /// Always the tiled f32 kernel (f32 multiply-adds).
    Tiled,
}

/// What changes a run's numbers: saved with each checkpoint and checked on `--resume`. The
/// defaults are what measured fastest at the same training quality (docs/decisions.md); the
/// f32 choices keep more bits where a user wants them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Precision {
    /// Under `--amp`: the training loss's logits (f16, as autocast makes them in PyTorch;
    /// cross-entropy sums in f32 either way). `WGRAD_LOGITS=f32`.
    pub logits: Float,
    /// Under `--amp`, where cooperative matrices run the attention: q, k, v, O and their
    /// gradients. `WGRAD_ATTN_HALF=0` keeps them f32.
    pub attention: Float,
    /// Under `--amp`: a GELU linear's pre-activation (saved for GELU's gradient) and the
    /// gradient of its output. `WGRAD_GELU_HALF=none` keeps both f32.
    pub gelu: Float,
    /// Under `--amp`: GELU's gradient (the dz its linear's backward products read).
    /// `WGRAD_DZ=f32` keeps it f32.
    pub gelu_grad: Float,
    /// f32 products. `WGRAD_F32_MATMUL=tiled`.
    pub f32_matmul: F32Matmul,
}

impl Precision {
    /// What of `self` a run in (`amp`) or out of mixed precision uses: without it, the f16
    /// choices are left at their defaults (they change nothing there).
    pub fn in_effect(&self, amp: bool) -> Precision {
        if amp {
            *self
        } else {
            Precision {
                f32_matmul: self.f32_matmul,
                ..Precision::default()
            }
        }
    }

    /// The environment variable of each field (`differences` names them).
    pub const VARIABLES: [(&'static str, &'static str); 5] = [
        ("logits", "WGRAD_LOGITS"),
        ("attention", "WGRAD_ATTN_HALF"),
        ("gelu", "WGRAD_GELU_HALF"),
        ("gelu_grad", "WGRAD_DZ"),
        ("f32_matmul", "WGRAD_F32_MATMUL"),
    ];

    /// The fields on which `self` and `other` differ, as `name: self -> other (VARIABLE)`.
    pub fn differences(&self, other: &Precision) -> Vec<String> {
        let a = serde_json::to_value(self).expect("precision serializes");
        let b = serde_json::to_value(other).expect("precision serializes");
        Precision::VARIABLES
            .iter()
            .filter(|(field, _)| a[field] != b[field])
            .map(|(field, var)| format!("{field}: {} -> {} ({var})", a[field], b[field]))
            .collect()
    }
}

/// How the attention's subgroups wait where they read what their own lanes wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionSync {
    /// A subgroup barrier: the subgroup waits for its own lanes (checked on NVIDIA's driver;
    /// the SPIR-V naga writes does not promise it makes workgroup memory visible).
    #[default]
    Subgroup,
    /// A workgroup barrier (`WGRAD_ATTN_SYNC=workgroup`): for a driver where the subgroup
    /// barrier does not order workgroup memory.
    Workgroup,
}

/// Portability and debugging choices of the kernels (none changes a result).
#[derive(Clone, Debug, Default)]
pub struct KernelPolicy {
    /// Whether a product split into ranges of K sums them in its own dispatch, the last range
    /// of each tile adding the others' partials (None: yes on Vulkan and the noop backend,
    /// where the ordering it relies on is checked; Some(true) on any backend; Some(false): a
    /// second dispatch sums them). In a `lab` build, `WGRAD_SPLIT_SUM=dispatch`.
    pub split_in_one_dispatch: Option<bool>,
    /// naga's run-time bounds checks in every kernel (`WGRAD_SHADER_CHECKS=1`; off: the
    /// kernels check their own bounds).
    pub shader_checks: bool,
    /// `WGRAD_ATTN_SYNC`.
    pub attention_sync: AttentionSync,
}

/// How the CPU waits for the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// The thread sleeps in the driver until the GPU signals; waking it takes the operating
    /// system's time.
    Block,
    /// The thread polls the GPU's progress without sleeping (for at most 250 ms, then blocks):
    /// it sees the end of the work at once and keeps a core busy meanwhile, as CUDA's default
    /// synchronization does with cores to spare.
    Spin,
}

/// How the host side runs.
#[derive(Clone, Debug, Default)]
pub struct Execution {
    /// `WGRAD_WAIT=spin|block` (None: spin on a GPU, block on a CPU adapter such as lavapipe,
    /// whose work runs on the cores a spinning thread would take).
    pub wait: Option<WaitMode>,
    /// Threads compiling pipelines (`WGRAD_COMPILE_THREADS`; None: one per core, at most 16;
    /// Some(0): each compiled where it is first recorded).
    pub compile_threads: Option<usize>,
}

/// When the pool reuses a buffer given back (see `memory::Reuse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolReuse {
    /// At once, the oldest free buffer first (`WGRAD_POOL_REUSE=any`).
    Any,
    /// A buffer given back in the open Segment only from the next one, new buffers made
    /// meanwhile within a budget (`WGRAD_POOL_REUSE=segments`): dispatches that would share a
    /// buffer run side by side instead.
    AcrossSegments,
}

/// The tensor pool's policy.
#[derive(Clone, Debug, Default)]
pub struct PoolPolicy {
    /// None: the workload's own (at once, unless a trainer asks for `AcrossSegments`).
    pub reuse: Option<PoolReuse>,
    /// Bytes (live and free) the pool may hold across Segments before it reuses a buffer of
    /// the open one (`WGRAD_POOL_BUDGET_MIB`; None: twice the most bytes ever live, at least
    /// 1 GiB more).
    pub budget: Option<u64>,
    /// Bytes of GPU memory the tensor pool may hold, live and cached
    /// (`WGRAD_MEMORY_LIMIT_MIB`; None: as much as the adapter gives). A request past it is
    /// refused exactly as one the adapter has no memory for (`Error::OutOfMemory`), after
    /// the cached buffers are let go; runs are checked against it before they allocate
    /// (`memory::check_fits`).
    pub memory_limit: Option<u64>,
}

/// Where wgrad keeps files of its own.
#[derive(Clone, Debug, Default)]
pub struct Paths {
    /// Where measured tile tables are written and read (`WGRAD_CACHE_DIR`; None:
    /// `$XDG_CACHE_HOME/wgrad`, else `~/.cache/wgrad`, as `from_env` resolves them).
    pub cache_dir: Option<PathBuf>,
}

/// Data-parallel training under an MPI launcher (`dist`).
#[derive(Clone, Debug)]
pub struct DistOptions {
    /// The ranks the launcher started, when one did (`OMPI_COMM_WORLD_SIZE` from Open MPI,
    /// `PMI_SIZE` from MPICH); None: no launcher, a run of one process.
    pub launcher_world_size: Option<usize>,
    /// How long one collective (a gradient allreduce, a broadcast) may wait for the other
    /// ranks before this rank ends the job, naming the operation (`WGRAD_DIST_TIMEOUT_S`): a
    /// rank that died or hangs must not leave the others waiting for ever. Rank 0 evaluates
    /// and saves while the others wait in the next step's allreduce, so it must exceed those.
    pub timeout: std::time::Duration,
}

/// `DistOptions::timeout`'s default: longer than a checkpoint or an evaluation of the largest
/// preset takes on a slow adapter (lavapipe's DistilGPT-2 save and eval: under 2 minutes).
pub const DIST_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(600);

impl Default for DistOptions {
    fn default() -> Self {
        DistOptions {
            launcher_world_size: None,
            timeout: DIST_TIMEOUT_DEFAULT,
        }
    }
}

impl Options {
    /// The defaults, overridden by whatever the environment sets. A variable set to a value
    /// it cannot take is an error naming the variable and the values it takes.
    pub fn from_env() -> crate::Result<Options> {
        env::read(&env::current())
    }

    /// `from_env` over the given variables instead of the process's environment.
    pub fn from_vars(vars: &[(&str, &str)]) -> crate::Result<Options> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env::read(&vars)
    }

    /// What `wgrad info` prints: each option's group, name, value in force, and the variable
    /// that sets it, marked where the environment set it.
    pub fn rows(&self) -> Vec<OptionRow> {
        env::rows(self)
    }

    /// The environment variables found set (every one names an option).
    pub fn variables_set(&self) -> &[&'static str] {
        &self.from_env
    }
}

/// One option as `wgrad info` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct OptionRow {
    pub group: &'static str,
    pub name: &'static str,
    pub value: String,
    /// The environment variable that sets it.
    pub variable: &'static str,
    /// Whether the environment set it (else the default, or code).
    pub from_env: bool,
}
