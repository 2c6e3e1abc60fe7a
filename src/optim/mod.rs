//! Optimizers over flat parameter chunks (`nn::Parameters`): AdamW (one fused dispatch per chunk), global
//! gradient-norm clipping computed on the GPU, and learning-rate schedules.

mod adamw;
mod schedule;

pub use adamw::{AdamW, AdamWConfig, LossScaleConfig, LossScaleState};
pub use schedule::LrSchedule;
