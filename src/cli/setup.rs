//! What the model commands share: the config from a preset or a model directory, a model with
//! fresh weights, and random token batches.

use std::path::Path;

use wgrad::assets::Preset;
use wgrad::model::HfConfig;
use wgrad::nn::{Decoder, ModelConfig};
use wgrad::session::{check_options, TrainOptions};
use wgrad::{Device, Error, Result, Tensor};

/// The config of `--preset NAME` (built in: `wgrad::assets`) or `--model DIR` (DIR/config.json),
/// every field checked.
pub fn config(preset: Option<&str>, model_dir: Option<&Path>) -> Result<ModelConfig> {
    let config = match (preset, model_dir) {
        (_, Some(dir)) => HfConfig::read(&dir.join("config.json"))?,
        // Parsed and checked as `train` does (`wgrad::assets::Preset::config`).
        (Some(name), None) => Preset::named(name)?.config()?,
        (None, None) => unreachable!("clap gives a default preset"),
    };
    Ok(config.model)
}

/// `train`'s checks of --batch, --seq and --steps (`check_options`), for the commands that
/// run training steps of `config` without a `TrainSession`: `warmup` steps, then `steps`
/// (twice, for `profile`) must count without overflow.
pub fn check_run(
    config: &ModelConfig,
    batch: usize,
    seq: usize,
    steps: usize,
    warmup: usize,
) -> Result<()> {
    if steps
        .checked_mul(2)
        .and_then(|s| s.checked_add(warmup))
        .is_none()
    {
        return Err(Error::InvalidArgument {
            op: "--warmup",
            reason: format!("{warmup} warm-up steps and {steps} steps do not count in 64 bits"),
        });
    }
    let options = TrainOptions {
        batch,
        seq,
        steps,
        ..TrainOptions::default()
    };
    check_options(&options, config.n_positions)
}

/// Timed repetitions at most (`--reps`).
pub const MAX_REPS: u64 = 1_000_000;

/// A parser of `--reps`: 1 to `MAX_REPS`.
pub fn reps() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=MAX_REPS)
}

/// A model with fresh weights (its family's initialization).
pub fn model(device: &Device, config: ModelConfig, seed: u64) -> Result<Decoder> {
    Decoder::new(device, config, seed)
}

/// A batch of random token ids and next-token targets, (B, T) each.
pub fn random_batch(
    device: &Device,
    vocab: usize,
    batch: usize,
    seq: usize,
    seed: u64,
) -> Result<(Tensor, Tensor)> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % vocab as u64) as u32
    };
    let ids: Vec<u32> = (0..batch * (seq + 1)).map(|_| next()).collect();
    let x: Vec<u32> = (0..batch)
        .flat_map(|b| ids[b * (seq + 1)..b * (seq + 1) + seq].to_vec())
        .collect();
    let y: Vec<u32> = (0..batch)
        .flat_map(|b| ids[b * (seq + 1) + 1..(b + 1) * (seq + 1)].to_vec())
        .collect();
    Ok((
        Tensor::from_u32(device, &x, &[batch, seq])?,
        Tensor::from_u32(device, &y, &[batch, seq])?,
    ))
}
