//! Models built from ops and fused kernels, and the parameter store they live in. Shape legend:
//! B batch, T sequence, C n_embd, H heads, D head dim (GPT-2: C / H), KV key/value heads, V vocabulary.

mod config;
mod decoder;
#[cfg(test)]
mod decoder_tests;
mod params;

pub use config::{Family, HfTensor, ModelConfig};
pub use decoder::{Decoder, Kernels};
pub use params::{shard_name, ParamSpec, Parameters, RowShard};
