//! wgrad: a training engine for small transformers on any GPU that wgpu reaches.
//!
//! Ops record into a lazy Segment and return at once; a flush encodes the Segment into one
//! compute pass and one `queue.submit` over pooled buffers. docs/ARCHITECTURE.md has the
//! layers: `config`, `device` -> `memory` -> `kernels` -> `graph` -> `autograd` -> `ops` ->
//! `nn`, `optim` -> `model`, `session`.

pub mod assets;
pub mod autograd;
pub mod config;
pub mod device;
pub mod dist;
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
pub use config::Options;
pub use error::{Error, Result};
pub use graph::{Counters, DType, Device, Phase, Tensor};
/// The wgpu this engine is built on (for `Options` features and backends).
pub use wgpu;
