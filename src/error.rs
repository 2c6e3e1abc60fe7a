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

    #[error("reading back from the GPU failed: {0}")]
    ReadBack(String),

    #[error("GPU device error: {0}")]
    Device(String),

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

impl Error {
    /// Whether the error is an adapter limit the work exceeds (one storage binding, workgroups
    /// per dimension): the same work fits a larger adapter. Benchmarks skip such sizes.
    pub fn is_adapter_limit(&self) -> bool {
        matches!(
            self,
            Error::BindingTooLarge { .. } | Error::TooManyWorkgroups { .. }
        )
    }
}
