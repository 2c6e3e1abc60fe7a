//! wgrad: a training engine for small transformers on any GPU that wgpu reaches.
//!
//! Ops record into a lazy Segment and return at once; a flush encodes the Segment into one
//! compute pass and one `queue.submit` over pooled buffers. See DESIGN.md for the layers:
//! `device` -> `memory` -> `kernels` -> `graph` -> `ops`.

pub mod autograd;
pub mod device;
pub mod error;
pub mod graph;
pub mod kernels;
pub mod memory;
pub mod model;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod profile;
pub mod session;
pub mod train;
pub mod tune;

pub use autograd::no_grad;
pub use device::DeviceOptions;
pub use error::{Error, Result};
pub use graph::{Counters, DType, Device, Phase, Tensor};
/// The wgpu this engine is built on (for `DeviceOptions` features and backends).
pub use wgpu;
