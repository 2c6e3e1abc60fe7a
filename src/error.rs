//! The one error type of wgrad: every fallible call returns `Result<_, wgrad::Error>`, and each
//! variant names the op, tensor, file or limit at fault.

use crate::graph::DType;

/// Shorthand for `Result<T, wgrad::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no GPU adapter found{detail}. On Linux without a GPU, install a software Vulkan \
         driver: `apt-get install mesa-vulkan-drivers` (lavapipe); or set WGRAD_BACKEND / \
         WGRAD_ADAPTER to pick another one"
    )]
    NoAdapter { detail: String },

    #[error("requesting the device on adapter `{adapter}` failed: {reason}")]
    RequestDevice { adapter: String, reason: String },

    #[error("{op}: shapes {lhs:?} and {rhs:?} do not broadcast together")]
    BroadcastMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },

    #[error("{op}: expected {expected}, got shape {got:?}")]
    ShapeMismatch {
        op: &'static str,
        expected: String,
        got: Vec<usize>,
    },

    #[error("{op}: data of {got} elements does not fill shape {shape:?} ({expected} elements)")]
    ElementCount {
        op: &'static str,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },

    #[error("{op}: dimension {dim} is out of range for a tensor of rank {rank}")]
    DimOutOfRange {
        op: &'static str,
        dim: isize,
        rank: usize,
    },

    #[error("{op}: expected dtype {expected:?}, got {got:?}")]
    DTypeMismatch {
        op: &'static str,
        expected: DType,
        got: DType,
    },

    #[error("{op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },

    #[error("{op}: tensors live on different devices")]
    DeviceMismatch { op: &'static str },

    #[error(
        "{what} needs {bytes} bytes in one storage binding, over this adapter's \
         max_storage_buffer_binding_size of {limit} bytes"
    )]
    BindingTooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },

    #[error("{what} needs {count} workgroups, over this adapter's limit of {limit} per dimension")]
    TooManyWorkgroups {
        what: String,
        count: u64,
        limit: u64,
    },

    /// GPU memory that is not there: the adapter's, or the cap `PoolPolicy::memory_limit`
    /// (`WGRAD_MEMORY_LIMIT_MIB`) sets, which the pool enforces the same way.
    #[error(
        "out of GPU memory: {what} needs {bytes} bytes ({}); {limit}. {advice}",
        human_bytes(*bytes)
    )]
    OutOfMemory {
        /// What was being allocated (or run).
        what: String,
        bytes: u64,
        /// The limit that was hit and what was held, in words.
        limit: String,
        /// What to lower.
        advice: String,
    },

    /// Loaded weights holding NaN or an infinity.
    #[error(
        "{path}: tensor `{tensor}` holds {count} non-finite values (NaN or infinite){others}; \
         the weights are corrupt or diverged: use another checkpoint"
    )]
    NonFinite {
        path: String,
        /// The first such tensor (Hugging Face name).
        tensor: String,
        count: u64,
        /// ", and N more tensors" where others have some too.
        others: String,
    },

    #[error("reading back from the GPU failed: {0}")]
    ReadBack(String),

    #[error("GPU device error: {0}")]
    Device(String),

    /// Data-parallel training: a collective that failed or timed out, ranks that disagree.
    #[error("rank {rank} of {world}: {reason}")]
    Distributed {
        rank: usize,
        world: usize,
        reason: String,
    },

    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A model file (config.json, a safetensors header, a checkpoint) that cannot be used as is.
    #[error("{path}: {reason}")]
    ModelFile { path: String, reason: String },

    /// Weights that do not match the model the config describes: every missing, unexpected,
    /// misshaped or unconvertible tensor, one line each.
    #[error("{path}: the weights do not match config.json:\n  {}", problems.join("\n  "))]
    WeightMismatch { path: String, problems: Vec<String> },

    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: String, reason: String },

    #[error("{path}: not UTF-8 text: byte 0x{byte:02x} at offset {offset} (line {line})")]
    NotUtf8 {
        path: String,
        offset: usize,
        byte: u8,
        line: usize,
    },

    #[error("{path}: {reason}")]
    Dataset { path: String, reason: String },

    #[error(
        "{path}: the {part} part holds {tokens} tokens, shorter than one sequence of {needed} \
         tokens (T + 1 with T = {seq_len})"
    )]
    DataTooShort {
        path: String,
        part: &'static str,
        tokens: usize,
        needed: usize,
        seq_len: usize,
    },
}

/// `bytes` in the largest binary unit that keeps it at 1 or more ("1.50 GiB").
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

impl Error {
    /// Whether the error is an adapter limit the work exceeds (one storage binding, workgroups
    /// per dimension, its memory): the same work fits a larger adapter. Benchmarks skip such
    /// sizes.
    pub fn is_adapter_limit(&self) -> bool {
        matches!(
            self,
            Error::BindingTooLarge { .. }
                | Error::TooManyWorkgroups { .. }
                | Error::OutOfMemory { .. }
        )
    }
}
