//! What the model commands share: the config from a preset or a model directory, a model with
//! fresh weights, and random token batches.

use std::path::Path;

use wgrad::assets::Preset;
use wgrad::nn::{Gpt2, Gpt2Config};
use wgrad::{Device, Error, Result, Tensor};

/// The config of `--preset NAME` (built in: `wgrad::assets`) or `--model DIR` (DIR/config.json).
pub fn config(preset: Option<&str>, model_dir: Option<&Path>) -> Result<Gpt2Config> {
    let (text, origin) = match (preset, model_dir) {
        (_, Some(dir)) => {
            let path = dir.join("config.json");
            let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
                path: path.display().to_string(),
                source,
            })?;
            (text, path.display().to_string())
        }
        // Parsed and checked as `train` does (`wgrad::assets::Preset::config`).
        (Some(name), None) => return Ok(Preset::named(name)?.config()?.gpt2),
        (None, None) => unreachable!("clap gives a default preset"),
    };
    let config: Gpt2Config = serde_json::from_str(&text).map_err(|e| Error::InvalidArgument {
        op: "config",
        reason: format!("{origin}: {e}"),
    })?;
    config.validate()?;
    Ok(config)
}

/// A model with fresh GPT-2 initialization.
pub fn model(device: &Device, config: Gpt2Config, seed: u64) -> Result<Gpt2> {
    Gpt2::new(device, config, seed)
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
