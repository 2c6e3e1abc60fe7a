//! Tensors, the open Segment, and the Device that records into it. Knows nothing of
//! gradients.

mod layout;
mod runtime;
mod schedule;
mod segment;
mod tensor;
mod timing;

pub use layout::{
    broadcast_shape, coalesce_joint, contiguous_strides, resolve_dim, Layout, MAX_RANK,
};
pub use runtime::{Device, Storage, WaitMode, DEFAULT_FLUSH_BOUND, SPLIT_TICKETS};
pub use segment::{Counters, Phase};
pub use tensor::{Attachment, DType, Tensor};
pub use timing::{GpuInterval, TimingMode};
