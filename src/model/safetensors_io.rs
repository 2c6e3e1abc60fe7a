//! Hugging Face weights in safetensors, in and out of `Parameters`.
//!
//! Names are Hugging Face's (`ModelConfig::hf_tensors`), read with or without the prefix the
//! model class adds (`transformer.` for GPT-2, `model.` for the Llama family), from
//! `model.safetensors` or the shards `model.safetensors.index.json` lists (every file its
//! `weight_map` names is read and each tensor matched by name across them; which file the map
//! gives a tensor is not checked). GPT-2's Conv1D
//! stores its weights [in, out] and the Llama family's nn.Linear [out, in], each kept as
//! stored; the Llama family's q/k/v and gate/up tensors are rows of one wgrad parameter each.
//! Tolerated and skipped: `lm_head.weight` of a tied model when it is the embedding's copy (a
//! head that differs is an error, not silently dropped), GPT-2's causal-mask buffers
//! (`h.{i}.attn.bias` / `h.{i}.attn.masked_bias`) and the rotary `inv_freq` buffers older
//! files carry. f32, f16, bf16 and f64 tensors load, converted to f32 (wgrad trains f32 master
//! weights; `WeightsRead` says what the files held); saved files are f32, loadable by
//! `AutoModelForCausalLM.from_pretrained(dir)`. A parameter `Parameters` stores as row shards
//! is one tensor in the file, split on load and concatenated on save.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::error::{Error, Result};
use crate::graph::Device;
use crate::model::hf_config::HfConfig;
use crate::model::input_file::refuse_non_regular;
use crate::nn::{Family, HfTensor, ModelConfig, Parameters};

#[path = "safetensors_save.rs"]
mod save;
pub use save::save_pretrained;
pub(crate) use save::{remove_other_model_files, stage_pretrained};

pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint: `weight_map` names each tensor's file.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";
const CONFIG_FILE: &str = "config.json";
/// A tied model's head: accepted when it is the embedding's copy, never loaded.
const LM_HEAD: &str = "lm_head.weight";
/// Problems listed in one error at most (a config with the wrong n_layer lists dozens).
const MAX_LISTED: usize = 40;
/// Shard files of one checkpoint at most.
const MAX_SHARDS: usize = 4096;

/// What a load read: the files and the stored dtypes (converted to f32 on load).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WeightsRead {
    pub files: Vec<PathBuf>,
    /// Each stored dtype with its count of tensors, e.g. ("BF16", 272).
    pub dtypes: Vec<(String, usize)>,
}

impl WeightsRead {
    /// "bf16 (272 tensors), converted to f32" or "f32".
    pub fn describe(&self) -> String {
        let kinds: Vec<String> = self
            .dtypes
            .iter()
            .map(|(d, n)| format!("{} ({n} tensors)", d.to_lowercase()))
            .collect();
        let converted = self.dtypes.iter().any(|(d, _)| d != "F32");
        let files = match self.files.len() {
            1 => String::new(),
            n => format!(" in {n} shards"),
        };
        format!(
            "{}{files}{}",
            kinds.join(", "),
            if converted { ", converted to f32" } else { "" }
        )
    }
}

/// Reads `dir`'s config.json, checks its weights (model.safetensors, or the shards of
/// model.safetensors.index.json) against it (headers, names, shapes, dtypes: nothing is
/// allocated on `device` for files that do not match), then allocates the parameters on
/// `device` and loads the weights into them.
pub fn load_pretrained(device: &Device, dir: &Path) -> Result<(HfConfig, Parameters)> {
    load_pretrained_with(device, dir).map(|(c, p, _)| (c, p))
}

/// `load_pretrained`, also saying what it read.
pub fn load_pretrained_with(
    device: &Device,
    dir: &Path,
) -> Result<(HfConfig, Parameters, WeightsRead)> {
    let config = HfConfig::read(&dir.join(CONFIG_FILE))?;
    let files = weight_files(dir)?;
    let maps = files
        .iter()
        .map(|f| map_file(f))
        .collect::<Result<Vec<_>>>()?;
    let found = checked_tensors(&files, &maps, &config.model)?;
    let params = Parameters::new(device, &config.model.param_specs())?;
    upload(&params, &config.model, &found)?;
    let shown = files
        .first()
        .map_or(String::new(), |f| f.display().to_string());
    params.check_finite(&shown)?;
    let read = weights_read(files, &found);
    Ok((config, params, read))
}

/// Checks the weights of the model `config` describes in `path` (model.safetensors, or the
/// index of shards) as loading them would, without a GPU: an error for a malformed header
/// (lengths, offsets, dtypes, shapes, duplicated names) or any missing, unexpected, misshaped
/// or unconvertible tensor.
pub fn check_weights(path: &Path, config: &ModelConfig) -> Result<()> {
    let files = match path.file_name().and_then(|n| n.to_str()) {
        Some(WEIGHTS_INDEX_FILE) => shard_files(path)?,
        _ => vec![path.to_path_buf()],
    };
    let maps = files
        .iter()
        .map(|f| map_file(f))
        .collect::<Result<Vec<_>>>()?;
    checked_tensors(&files, &maps, config).map(drop)
}

/// The weight files of a model directory: model.safetensors, else the shards its index lists.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if single.exists() || !index.exists() {
        return Ok(vec![single]);
    }
    shard_files(&index)
}

/// The shard files an index names (its `weight_map`'s values), in first-named order, each in
/// the index's directory.
fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    let shown = index.display().to_string();
    let bad = |reason: String| Error::ModelFile {
        path: shown.clone(),
        reason,
    };
    let bytes = crate::model::input_file::read_regular(index, WEIGHTS_INDEX_FILE)?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| bad("no `weight_map` object naming each tensor's file".into()))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (tensor, file) in map {
        let name = file
            .as_str()
            .filter(|f| !f.is_empty() && Path::new(f).file_name() == Some(std::ffi::OsStr::new(f)))
            .ok_or_else(|| {
                bad(format!(
                    "`weight_map` gives tensor `{tensor}` the file {file}, not a file name in \
                     the index's directory"
                ))
            })?;
        let path = dir.join(name);
        if !files.contains(&path) {
            if files.len() == MAX_SHARDS {
                return Err(bad(format!("more than {MAX_SHARDS} shard files")));
            }
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(bad("`weight_map` is empty".into()));
    }
    Ok(files)
}

/// A buffer of a checkpoint that is no parameter: GPT-2's causal masks (`h.{i}.attn.bias`,
/// `h.{i}.attn.masked_bias`) and the rotary inverse frequencies (`...rotary_emb.inv_freq`).
fn is_buffer(family: Family, name: &str) -> bool {
    if family.is_llama() {
        return name.ends_with("rotary_emb.inv_freq");
    }
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

/// Loads the safetensors file `path` into `params` of the model `config` describes (matched
/// by Hugging Face name). Every missing, unexpected, misshaped or unconvertible tensor is
/// listed in one error, and nothing is uploaded unless all of them match.
pub fn load_weights(params: &Parameters, config: &ModelConfig, path: &Path) -> Result<()> {
    let files = vec![path.to_path_buf()];
    let maps = vec![map_file(path)?];
    let found = checked_tensors(&files, &maps, config)?;
    upload(params, config, &found)
}

/// `path` mapped into memory: a regular file of 8 bytes at least.
fn map_file(path: &Path) -> Result<Mmap> {
    let shown = path.display().to_string();
    refuse_non_regular(path, WEIGHTS_FILE)?;
    let io = |source| Error::Io {
        path: shown.clone(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len < 8 {
        return Err(Error::ModelFile {
            path: shown.clone(),
            reason: format!(
                "truncated: {len} bytes; a safetensors file starts with an 8-byte header length"
            ),
        });
    }
    // SAFETY: the mapping is read-only and dropped before the load returns. Another process
    // truncating the file meanwhile could fault the read; safetensors files are written whole
    // and renamed (as wgrad's own are), not rewritten in place.
    unsafe { Mmap::map(&file) }.map_err(io)
}

/// The files' tensor for every Hugging Face name of `config`, after checking each header
/// (`header_fault`, then the safetensors crate's own checks of lengths, offsets and shapes) and
/// every tensor.
fn checked_tensors<'a>(
    files: &[PathBuf],
    maps: &'a [Mmap],
    config: &ModelConfig,
) -> Result<HashMap<String, TensorView<'a>>> {
    let shown = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut all = Vec::new();
    for (path, bytes) in files.iter().zip(maps) {
        let bad = |reason: String| Error::ModelFile {
            path: path.display().to_string(),
            reason,
        };
        if let Some(fault) = header_fault(bytes) {
            return Err(bad(fault));
        }
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| bad(format!("not a complete, valid safetensors file ({e})")))?;
        all.extend(st.tensors());
    }
    match_tensors(all, config).map_err(|mut problems| {
        let total = problems.len();
        if total > MAX_LISTED {
            problems.truncate(MAX_LISTED);
            problems.push(format!("... and {} more", total - MAX_LISTED));
        }
        Error::WeightMismatch {
            path: shown.clone(),
            problems,
        }
    })
}

/// Writes every matched tensor into its rows of `params`, converted to f32.
fn upload(
    params: &Parameters,
    config: &ModelConfig,
    found: &HashMap<String, TensorView<'_>>,
) -> Result<()> {
    let tensors = config.hf_tensors();
    for spec in params.specs() {
        let parts: Vec<&HfTensor> = tensors.iter().filter(|t| t.param == spec.name).collect();
        if let [whole] = parts.as_slice() {
            params.write(&spec.name, &to_f32(&found[&whole.name]))?;
            continue;
        }
        let cols: usize = spec.shape[1..].iter().product();
        let mut data = vec![0f32; spec.shape.iter().product()];
        for t in parts {
            let at = t.first_row * cols;
            let values = to_f32(&found[&t.name]);
            data[at..at + values.len()].copy_from_slice(&values);
        }
        params.write(&spec.name, &data)?;
    }
    Ok(())
}

/// What `found` held, for the load's report.
fn weights_read(files: Vec<PathBuf>, found: &HashMap<String, TensorView<'_>>) -> WeightsRead {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for view in found.values() {
        let d = format!("{:?}", view.dtype());
        match counts.iter_mut().find(|(k, _)| *k == d) {
            Some((_, n)) => *n += 1,
            None => counts.push((d, 1)),
        }
    }
    counts.sort();
    WeightsRead {
        files,
        dtypes: counts,
    }
}

/// What the safetensors crate lets pass in a header and wgrad refuses: a name given twice
/// (JSON keeps the last, so one of the two would be dropped unseen). None when the header is
/// fine or too broken to read here (the crate's check then names the fault).
fn header_fault(bytes: &[u8]) -> Option<String> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let end = usize::try_from(len).ok()?.checked_add(8)?;
    let text = std::str::from_utf8(bytes.get(8..end)?).ok()?;
    let keys: UniqueKeys = serde_json::from_str(text).ok()?;
    keys.0
        .map(|name| format!("the header names tensor `{name}` twice"))
}

/// The first key a JSON object gives twice, if any.
struct UniqueKeys(Option<String>);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Keys;
        impl<'de> Visitor<'de> for Keys {
            type Value = UniqueKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<UniqueKeys, A::Error> {
                let mut seen = HashSet::new();
                let mut twice = None;
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    if !seen.insert(key.clone()) && twice.is_none() {
                        twice = Some(key);
                    }
                }
                Ok(UniqueKeys(twice))
            }
        }
        d.deserialize_map(Keys)
    }
}

/// The files' tensor for every Hugging Face name of `config`, or every problem found: a
/// missing, unexpected, misshaped, duplicated or non-float tensor, or a tied model's
/// `lm_head.weight` that is not the embedding's copy.
fn match_tensors<'a>(
    mut file_tensors: Vec<(String, TensorView<'a>)>,
    config: &ModelConfig,
) -> std::result::Result<HashMap<String, TensorView<'a>>, Vec<String>> {
    let hf = config.hf_tensors();
    let expected: HashMap<&str, &[usize]> = hf
        .iter()
        .map(|t| (t.name.as_str(), t.shape.as_slice()))
        .collect();
    let prefix = config.family.file_prefix();
    let embedding = config.embedding();
    let mut problems = Vec::new();
    let mut reported = HashSet::new(); // HF names already in a problem: not "missing" too
    let mut found: HashMap<String, (String, TensorView<'a>)> = HashMap::new();
    let mut lm_head = None;
    file_tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (file_name, view) in file_tensors {
        let name = file_name.strip_prefix(prefix).unwrap_or(&file_name);
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
        } else if name == LM_HEAD && config.tie_word_embeddings {
            let table = expected.get(embedding).copied().unwrap_or(&[]);
            if shape != table || !convertible(view.dtype()) {
                problems.push(format!(
                    "`{file_name}` {shape:?} {:?} cannot be tied to `{embedding}` {table:?} \
                     (config.json ties the output projection to the token embedding)",
                    view.dtype()
                ));
            } else {
                lm_head = Some((file_name.clone(), view));
            }
        } else if !is_buffer(config.family, name) {
            problems.push(format!("unexpected tensor `{file_name}` {shape:?}"));
        }
    }
    if let (Some((head_name, head)), Some((_, table))) = (&lm_head, found.get(embedding)) {
        let same = if head.dtype() == table.dtype() {
            head.data() == table.data()
        } else {
            to_f32(head) == to_f32(table)
        };
        if !same {
            problems.push(format!(
                "`{head_name}` differs from `{embedding}`: this model's output projection is \
                 not tied to its embedding, and config.json says it is (tie_word_embeddings)"
            ));
        }
    }
    for t in &hf {
        let name = t.name.as_str();
        if !found.contains_key(name) && !reported.contains(name) {
            problems.push(format!("missing tensor `{name}` {:?}", t.shape));
        }
    }
    if problems.is_empty() {
        Ok(found.into_iter().map(|(k, (_, v))| (k, v)).collect())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
#[path = "safetensors_io_tests.rs"]
mod tests;
