//! Training checkpoints: a Hugging Face model directory (`save_pretrained`: config.json,
//! model.safetensors, tokenizer files; `AutoModelForCausalLM.from_pretrained(dir)` loads it) plus
//! `wgrad_state.safetensors`, what a resumed run needs to continue exactly where this one
//! stopped:
//!
//! | in the state file | what |
//! | --- | --- |
//! | tensors `adamw.m.{i}`, `adamw.v.{i}` | AdamW's moments of parameter chunk i, f32 (numel_i) |
//! | metadata `step` | optimizer steps taken (the schedule's position) |
//! | metadata `adamw_steps` | AdamW's own step count (its bias corrections) |
//! | tensor `adamw.loss_scale` | mixed precision only: [scale, clean steps, applied, skipped] |
//! | metadata `data_epoch`, `data_index` | the training batches' `DataPosition` |
//! | metadata `hyper_parameters` | the run's settings, JSON, opaque here |
//! | metadata `weights_fnv1a64` | a fingerprint of the model.safetensors saved with it |
//!
//! A checkpoint is saved as one unit (`atomic.rs`): every file is staged under a temporary
//! name, then one journal's rename commits them all, so whatever stops the process, the
//! directory holds the previous checkpoint or the new one once `recover` has run (the next
//! writer and `--resume` run it). The fingerprint, taken from the weights' bytes as written,
//! ties the state to its weights: a directory whose files were mixed by hand (new weights, old
//! state) is refused on resume instead of continuing from mismatched halves.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::error::{Error, Result};
use crate::model::atomic::StagedFiles;
use crate::model::batches::DataPosition;
use crate::model::hf_config::HfConfig;
use crate::model::safetensors_io::{remove_other_model_files, stage_pretrained, WEIGHTS_FILE};
use crate::model::tokenizer::Tokenizer;
use crate::model::{fnv1a64, FNV_OFFSET};
use crate::nn::Parameters;
use crate::optim::AdamW;

/// The file beside the model that holds the training state.
pub const STATE_FILE: &str = "wgrad_state.safetensors";
/// `format` metadata of the state file (and its version).
const STATE_FORMAT: &str = "wgrad-train-state";
const STATE_VERSION: &str = "1";

/// Where a run stands, saved beside its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainState {
    /// Optimizer steps taken.
    pub step: u64,
    /// The next training batch.
    pub position: DataPosition,
    /// The run's settings (whatever the trainer serializes).
    pub hyper_parameters: serde_json::Value,
}

/// A training state read back: the state, and the optimizer's moments to restore.
pub struct SavedState {
    pub state: TrainState,
    adamw_steps: u64,
    /// (m, v) per parameter chunk.
    moments: Vec<(Vec<f32>, Vec<f32>)>,
    /// The loss-scale state of a mixed-precision run.
    loss_scale: Option<Vec<f32>>,
}

impl SavedState {
    /// Puts the saved moments and step count into `opt` (built for the same parameters).
    pub fn restore_optimizer(&self, opt: &mut AdamW) -> Result<()> {
        opt.restore(&self.moments, self.adamw_steps, self.loss_scale.as_deref())
    }
}

/// FNV-1a of a file's bytes.
fn file_fingerprint(path: &Path) -> Result<u64> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(fnv1a64(FNV_OFFSET, &bytes))
}

/// Writes the model directory and the training state into `dir` (created when missing), as
/// one unit. The caller holds `dir`'s lock (`session::OutDir`).
pub fn save_checkpoint(
    dir: &Path,
    config: &HfConfig,
    params: &Parameters,
    tokenizer: &Tokenizer,
    opt: &AdamW,
    state: &TrainState,
) -> Result<()> {
    // Read the moments before writing anything: a failed read-back leaves the old checkpoint.
    let mut host = Vec::new();
    for (i, (m, v)) in opt.moments().iter().enumerate() {
        host.push((format!("adamw.m.{i}"), m.to_vec()?));
        host.push((format!("adamw.v.{i}"), v.to_vec()?));
    }
    if let Some(state) = opt.loss_scale_tensor() {
        host.push(("adamw.loss_scale".to_string(), state.to_vec()?));
    }
    let mut staged = StagedFiles::new(dir)?;
    let weights_tmp = stage_pretrained(&mut staged, config, params, Some(tokenizer))?;
    let weights = file_fingerprint(&weights_tmp)?;

    let metadata = HashMap::from([
        ("format".to_string(), STATE_FORMAT.to_string()),
        ("version".to_string(), STATE_VERSION.to_string()),
        ("step".to_string(), state.step.to_string()),
        ("adamw_steps".to_string(), opt.steps().to_string()),
        ("data_epoch".to_string(), state.position.epoch.to_string()),
        ("data_index".to_string(), state.position.index.to_string()),
        (
            "hyper_parameters".to_string(),
            state.hyper_parameters.to_string(),
        ),
        ("weights_fnv1a64".to_string(), format!("{weights:016x}")),
    ]);
    let views: Vec<(String, TensorView<'_>)> = host
        .iter()
        .map(|(name, data)| {
            let view = TensorView::new(Dtype::F32, vec![data.len()], bytemuck::cast_slice(data))
                .expect("an f32 vector's bytes match its shape");
            (name.clone(), view)
        })
        .collect();
    let bytes = safetensors::serialize(views, Some(metadata)).map_err(|e| Error::ModelFile {
        path: dir.join(STATE_FILE).display().to_string(),
        reason: format!("serializing the training state: {e}"),
    })?;
    staged.write(STATE_FILE, &bytes)?;
    remove_other_model_files(&mut staged, Some(tokenizer))?;
    staged.commit()
}

/// The metadata of `dir`'s training state, read from the file's header alone (not its
/// tensors, nor the weights' fingerprint): what a check of the directory needs.
pub fn saved_metadata(dir: &Path) -> Result<HashMap<String, String>> {
    use std::io::Read;
    let path = dir.join(STATE_FILE);
    crate::model::refuse_non_regular(&path, STATE_FILE)?;
    let bad = |reason: String| Error::ModelFile {
        path: path.display().to_string(),
        reason,
    };
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::File::open(&path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(bad(format!(
            "a header of {len} bytes is not a training state's"
        )));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let header: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("not a safetensors header ({e})")))?;
    let meta = (header.get("__metadata__"))
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default();
    Ok(meta)
}

/// Reads `dir`'s training state; an error when `dir` holds none, or a state that does not
/// belong to the weights beside it.
pub fn read_train_state(dir: &Path) -> Result<SavedState> {
    let path = dir.join(STATE_FILE);
    let shown = path.display().to_string();
    let bad = |reason: String| Error::ModelFile {
        path: shown.clone(),
        reason,
    };
    if !path.is_file() {
        return Err(bad(format!(
            "no training state here: {} is not a directory `wgrad train --out` wrote (a model \
             directory alone can be trained from with --model)",
            dir.display()
        )));
    }
    let bytes = std::fs::read(&path).map_err(|source| Error::Io {
        path: shown.clone(),
        source,
    })?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| bad(format!("not a complete safetensors file ({e})")))?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| bad(format!("not a complete safetensors file ({e})")))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let field = |key: &str| {
        meta.get(key)
            .cloned()
            .ok_or_else(|| bad(format!("metadata `{key}` is missing")))
    };
    let number = |key: &str| -> Result<u64> {
        field(key)?
            .parse()
            .map_err(|e| bad(format!("metadata `{key}`: {e}")))
    };
    if field("format")? != STATE_FORMAT || field("version")? != STATE_VERSION {
        return Err(bad(format!(
            "format {:?} version {:?}; this wgrad reads {STATE_FORMAT} version {STATE_VERSION}",
            meta.get("format"),
            meta.get("version")
        )));
    }
    let weights = file_fingerprint(&dir.join(WEIGHTS_FILE))?;
    if field("weights_fnv1a64")? != format!("{weights:016x}") {
        return Err(bad(format!(
            "the training state was not saved with the {WEIGHTS_FILE} beside it (files of two \
             saves mixed, by a copy or by hand); resume from another checkpoint"
        )));
    }
    let hyper_parameters = serde_json::from_str(&field("hyper_parameters")?)
        .map_err(|e| bad(format!("metadata `hyper_parameters`: {e}")))?;
    let read = |name: &str| -> Result<Vec<f32>> {
        let view = st
            .tensor(name)
            .map_err(|_| bad(format!("tensor `{name}` is missing")))?;
        if view.dtype() != Dtype::F32 {
            return Err(bad(format!(
                "tensor `{name}` is {:?}, not F32",
                view.dtype()
            )));
        }
        Ok(view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let chunks = st
        .names()
        .iter()
        .filter(|n| n.starts_with("adamw.m."))
        .count();
    let mut moments = Vec::with_capacity(chunks);
    for i in 0..chunks {
        moments.push((
            read(&format!("adamw.m.{i}"))?,
            read(&format!("adamw.v.{i}"))?,
        ));
    }
    Ok(SavedState {
        state: TrainState {
            step: number("step")?,
            position: DataPosition {
                epoch: number("data_epoch")?,
                index: number("data_index")?,
            },
            hyper_parameters,
        },
        adamw_steps: number("adamw_steps")?,
        moments,
        loss_scale: if st.names().contains(&"adamw.loss_scale") {
            Some(read("adamw.loss_scale")?)
        } else {
            None
        },
    })
}
