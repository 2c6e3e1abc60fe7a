//! Models built from ops and fused kernels, and the parameter store they live in. Shape legend:
//! B batch, T sequence, C n_embd, H heads, D = C / H head dim, V vocabulary.

mod config;
mod gpt2;
mod params;

pub use config::Gpt2Config;
pub use gpt2::{Gpt2, Kernels};
pub use params::{shard_name, ParamSpec, Parameters, RowShard};
