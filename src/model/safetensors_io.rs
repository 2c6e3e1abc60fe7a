//! Hugging Face GPT-2 weights in safetensors, in and out of `Parameters`.
//!
//! Names are Hugging Face's (`Gpt2Config::param_specs`), read with or without the
//! `transformer.` prefix that `GPT2LMHeadModel` adds. GPT-2's Conv1D stores its weights
//! [in, out], e.g. `h.{i}.attn.c_attn.weight` (C, 3C), the layout wgrad multiplies with: no
//! transpose anywhere. Tolerated and skipped: `lm_head.weight` when it is `wte.weight`'s copy
//! (wgrad ties the two; a head that differs is an error, not silently dropped), and the
//! causal-mask buffers `h.{i}.attn.bias` / `h.{i}.attn.masked_bias` older files carry. f32,
//! f16, bf16 and f64 tensors load (converted to f32); saved files are f32 without prefix,
//! loadable by `GPT2LMHeadModel.from_pretrained(dir)`. A parameter `Parameters` stores as row
//! shards (wte over the storage-binding limit) is one tensor in the file, split on load and
//! concatenated on save.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorView, View};
use safetensors::SafeTensors;

use crate::error::{Error, Result};
use crate::graph::Device;
use crate::model::atomic::{sync_file, StagedFiles};
use crate::model::hf_config::HfConfig;
use crate::model::tokenizer::Tokenizer;
use crate::nn::Parameters;

pub const WEIGHTS_FILE: &str = "model.safetensors";
const CONFIG_FILE: &str = "config.json";
const PREFIX: &str = "transformer.";
/// Tied to `wte.weight` in wgrad: accepted when its shape matches, never loaded.
const LM_HEAD: &str = "lm_head.weight";
/// Problems listed in one error at most (a config with the wrong n_layer lists dozens).
const MAX_LISTED: usize = 40;

/// Reads `dir`'s config.json, allocates its parameters on `device` and loads
/// `dir/model.safetensors` into them.
pub fn load_pretrained(device: &Device, dir: &Path) -> Result<(HfConfig, Parameters)> {
    let config = HfConfig::read(&dir.join(CONFIG_FILE))?;
    let params = Parameters::new(device, &config.gpt2.param_specs())?;
    load_weights(&params, &dir.join(WEIGHTS_FILE))?;
    params.check_finite(&dir.join(WEIGHTS_FILE).display().to_string())?;
    Ok((config, params))
}

/// A causal-mask buffer of an attention layer (`h.{i}.attn.bias`, `h.{i}.attn.masked_bias`).
fn is_mask_buffer(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("h.") else {
        return false;
    };
    let Some((layer, field)) = rest.split_once('.') else {
        return false;
    };
    layer.parse::<usize>().is_ok() && (field == "attn.bias" || field == "attn.masked_bias")
}

/// The f32 values of a tensor stored as f32, f16, bf16 or f64 (little-endian, as safetensors
/// stores them; the mapping may be unaligned, so bytes are read whole).
fn to_f32(view: &TensorView<'_>) -> Vec<f32> {
    let b = view.data();
    match view.dtype() {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8 bytes")) as f32)
            .collect(),
        other => unreachable!("dtype {other:?} is refused before conversion"),
    }
}

fn convertible(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64)
}

/// Loads the safetensors file `path` into `params` (matched by Hugging Face name). Every
/// missing, unexpected, misshaped or unconvertible tensor is listed in one error, and nothing
/// is uploaded unless all of them match.
pub fn load_weights(params: &Parameters, path: &Path) -> Result<()> {
    let shown = path.display().to_string();
    let bad = |reason: String| Error::ModelFile {
        path: shown.clone(),
        reason,
    };
    let file = File::open(path).map_err(|source| Error::Io {
        path: shown.clone(),
        source,
    })?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len < 8 {
        return Err(bad(format!(
            "truncated: {len} bytes; a safetensors file starts with an 8-byte header length"
        )));
    }
    // SAFETY: the mapping is read-only and dropped before returning. Another process
    // truncating the file meanwhile could fault the read; safetensors files are written whole
    // and renamed (as wgrad's own are), not rewritten in place.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
        path: shown.clone(),
        source,
    })?;
    let st = SafeTensors::deserialize(&map)
        .map_err(|e| bad(format!("not a complete safetensors file ({e})")))?;

    let found = match_tensors(&st, params).map_err(|mut problems| {
        let total = problems.len();
        if total > MAX_LISTED {
            problems.truncate(MAX_LISTED);
            problems.push(format!("... and {} more", total - MAX_LISTED));
        }
        Error::WeightMismatch {
            path: shown.clone(),
            problems,
        }
    })?;
    for spec in params.specs() {
        params.write(&spec.name, &to_f32(&found[&spec.name]))?;
    }
    Ok(())
}

/// The file's tensor for every parameter (by Hugging Face name), or every problem found: a
/// missing, unexpected, misshaped, duplicated or non-float tensor, or an `lm_head.weight` that
/// is not `wte.weight`'s copy.
fn match_tensors<'a>(
    st: &SafeTensors<'a>,
    params: &Parameters,
) -> std::result::Result<HashMap<String, TensorView<'a>>, Vec<String>> {
    let expected: HashMap<&str, &[usize]> = params
        .specs()
        .map(|s| (s.name.as_str(), s.shape.as_slice()))
        .collect();
    let mut problems = Vec::new();
    let mut reported = HashSet::new(); // HF names already in a problem: not "missing" too
    let mut found: HashMap<String, (String, TensorView<'a>)> = HashMap::new();
    let mut lm_head = None;
    let mut file_tensors = st.tensors();
    file_tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (file_name, view) in file_tensors {
        let name = file_name.strip_prefix(PREFIX).unwrap_or(&file_name);
        let shape = view.shape().to_vec();
        if let Some((&hf_name, want)) = expected.get_key_value(name) {
            if shape != *want {
                reported.insert(hf_name);
                problems.push(format!(
                    "`{file_name}`: config.json gives shape {want:?}, the file holds {shape:?}"
                ));
            } else if !convertible(view.dtype()) {
                reported.insert(hf_name);
                problems.push(format!(
                    "`{file_name}` {shape:?}: dtype {:?} is not a float type wgrad converts \
                     (F32, F16, BF16, F64)",
                    view.dtype()
                ));
            } else if let Some((other, _)) = found.get(hf_name) {
                problems.push(format!(
                    "`{name}` appears twice: as `{other}` and `{file_name}`"
                ));
            } else {
                found.insert(hf_name.to_string(), (file_name.clone(), view));
            }
        } else if name == LM_HEAD {
            let wte = expected.get("wte.weight").copied().unwrap_or(&[]);
            if shape != wte || !convertible(view.dtype()) {
                problems.push(format!(
                    "`{file_name}` {shape:?} {:?} cannot be tied to `wte.weight` {wte:?} (wgrad \
                     ties the output projection to the token embedding)",
                    view.dtype()
                ));
            } else {
                lm_head = Some((file_name.clone(), view));
            }
        } else if !is_mask_buffer(name) {
            problems.push(format!("unexpected tensor `{file_name}` {shape:?}"));
        }
    }
    if let (Some((head_name, head)), Some((_, wte))) = (&lm_head, found.get("wte.weight")) {
        let same = if head.dtype() == wte.dtype() {
            head.data() == wte.data()
        } else {
            to_f32(head) == to_f32(wte)
        };
        if !same {
            problems.push(format!(
                "`{head_name}` differs from `wte.weight`: this model's output projection is not \
                 tied to its embedding, and wgrad's is"
            ));
        }
    }
    for spec in params.specs() {
        let name = spec.name.as_str();
        if !found.contains_key(name) && !reported.contains(name) {
            problems.push(format!("missing tensor `{name}` {:?}", spec.shape));
        }
    }
    if problems.is_empty() {
        Ok(found.into_iter().map(|(k, (_, v))| (k, v)).collect())
    } else {
        Err(problems)
    }
}

/// An f32 tensor read back from the GPU, as safetensors serializes it.
struct HostTensor {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for HostTensor {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes a directory that `GPT2LMHeadModel.from_pretrained(dir)` loads: config.json,
/// model.safetensors (f32, Hugging Face names without prefix) and, when given, the tokenizer's
/// files. Every file is staged under a temporary name in `dir` and renamed only once all are
/// written: an existing directory keeps its old files if anything fails.
pub fn save_pretrained(
    dir: &Path,
    config: &HfConfig,
    params: &Parameters,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    let specs = config.gpt2.param_specs();
    for spec in &specs {
        match params.specs().find(|s| s.name == spec.name) {
            Some(s) if s.shape == spec.shape => {}
            got => {
                return Err(Error::ShapeMismatch {
                    op: "save_pretrained",
                    expected: format!("parameter `{}` of shape {:?}", spec.name, spec.shape),
                    got: got.map(|s| s.shape.clone()).unwrap_or_default(),
                })
            }
        }
    }
    let mut tensors = Vec::with_capacity(specs.len());
    for spec in &specs {
        // Whole: a parameter stored as row shards is saved as one tensor.
        let bytes = bytemuck::cast_slice(&params.read(&spec.name)?).to_vec();
        tensors.push((
            spec.name.clone(),
            HostTensor {
                shape: spec.shape.clone(),
                bytes,
            },
        ));
    }

    let mut staged = StagedFiles::new(dir)?;
    let config_json = config.to_json();
    staged.write_with(CONFIG_FILE, |w| {
        std::io::Write::write_all(w, config_json.as_bytes())
    })?;
    let tmp = staged.temporary_path(WEIGHTS_FILE);
    // serialize_to_file goes through a 0600 temporary of its own: give the file the
    // permissions of one created here (the umask's), as the other files get.
    let io = |source| Error::Io {
        path: tmp.display().to_string(),
        source,
    };
    let permissions = File::create(&tmp)
        .and_then(|f| f.metadata())
        .map_err(io)?
        .permissions();
    // HF's loader requires the "format" metadata ("pt": tensors as PyTorch names them).
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors, Some(metadata), &tmp).map_err(|e| {
        Error::ModelFile {
            path: dir.join(WEIGHTS_FILE).display().to_string(),
            reason: format!("writing safetensors: {e}"),
        }
    })?;
    std::fs::set_permissions(&tmp, permissions).map_err(io)?;
    sync_file(&tmp)?;
    if let Some(tok) = tokenizer {
        for src in tok.files() {
            let name =
                src.file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| Error::Tokenizer {
                        path: src.display().to_string(),
                        reason: "no UTF-8 file name".into(),
                    })?;
            staged.copy(name, src)?;
        }
    }
    staged.commit()
}

#[cfg(test)]
#[path = "safetensors_io_tests.rs"]
mod tests;
