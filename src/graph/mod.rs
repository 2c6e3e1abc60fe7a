//! Tensors, the open Segment, and the Device that records into it. Knows nothing of
//! gradients.

mod device;
mod layout;
mod schedule;
mod segment;
mod tensor;
mod timing;

pub use crate::config::WaitMode;
pub use device::{Device, Storage, TableSource, DEFAULT_FLUSH_BOUND, SPLIT_TICKETS};
pub use layout::{
    broadcast_shape, coalesce_joint, contiguous_strides, resolve_dim, Layout, MAX_RANK,
};
pub use segment::{Counters, Phase};
pub use tensor::{Attachment, DType, Tensor};
pub use timing::{GpuInterval, TimingMode};
