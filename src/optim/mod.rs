//! Optimizers over flat parameter chunks: AdamW (one fused dispatch per chunk), global
//! gradient-norm clipping computed on the GPU, and learning-rate schedules.

mod adamw;
mod params;
mod schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use params::{ParamSpec, Parameters};
pub use schedule::LrSchedule;
