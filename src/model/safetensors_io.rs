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
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorView, View};
use safetensors::SafeTensors;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::error::{Error, Result};
use crate::graph::Device;
use crate::model::atomic::{file_op, sync_file, StagedFiles};
use crate::model::hf_config::HfConfig;
use crate::model::input_file::refuse_non_regular;
use crate::model::tokenizer::Tokenizer;
use crate::nn::{Gpt2Config, ParamSpec, Parameters};

pub const WEIGHTS_FILE: &str = "model.safetensors";
const CONFIG_FILE: &str = "config.json";
const PREFIX: &str = "transformer.";
/// Tied to `wte.weight` in wgrad: accepted when its shape matches, never loaded.
const LM_HEAD: &str = "lm_head.weight";
/// Problems listed in one error at most (a config with the wrong n_layer lists dozens).
const MAX_LISTED: usize = 40;

/// Reads `dir`'s config.json, checks `dir/model.safetensors` against it (header, names,
/// shapes, dtypes: nothing is allocated on `device` for a file that does not match), then
/// allocates the parameters on `device` and loads the weights into them.
pub fn load_pretrained(device: &Device, dir: &Path) -> Result<(HfConfig, Parameters)> {
    let config = HfConfig::read(&dir.join(CONFIG_FILE))?;
    let specs = config.gpt2.param_specs();
    let path = dir.join(WEIGHTS_FILE);
    let map = map_file(&path)?;
    let found = checked_tensors(&path, &map, &specs)?;
    let params = Parameters::new(device, &specs)?;
    upload(&params, &found)?;
    params.check_finite(&path.display().to_string())?;
    Ok((config, params))
}

/// Checks the safetensors file `path` against the model `config` describes, as loading it
/// would, without a GPU: an error for a malformed header (lengths, offsets, dtypes, shapes,
/// duplicated names) or any missing, unexpected, misshaped or unconvertible tensor.
pub fn check_weights(path: &Path, config: &Gpt2Config) -> Result<()> {
    let map = map_file(path)?;
    checked_tensors(path, &map, &config.param_specs()).map(drop)
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
    let specs: Vec<ParamSpec> = params.specs().cloned().collect();
    let map = map_file(path)?;
    let found = checked_tensors(path, &map, &specs)?;
    upload(params, &found)
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

/// The file's tensor for every spec, after checking the header (`header_fault`, then the
/// safetensors crate's own checks of lengths, offsets and shapes) and every tensor.
fn checked_tensors<'a>(
    path: &Path,
    bytes: &'a [u8],
    specs: &[ParamSpec],
) -> Result<HashMap<String, TensorView<'a>>> {
    let shown = path.display().to_string();
    let bad = |reason: String| Error::ModelFile {
        path: shown.clone(),
        reason,
    };
    if let Some(fault) = header_fault(bytes) {
        return Err(bad(fault));
    }
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| bad(format!("not a complete, valid safetensors file ({e})")))?;
    match_tensors(&st, specs).map_err(|mut problems| {
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

/// Writes every matched tensor into `params`, converted to f32.
fn upload(params: &Parameters, found: &HashMap<String, TensorView<'_>>) -> Result<()> {
    for spec in params.specs() {
        params.write(&spec.name, &to_f32(&found[&spec.name]))?;
    }
    Ok(())
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

/// The file's tensor for every parameter (by Hugging Face name), or every problem found: a
/// missing, unexpected, misshaped, duplicated or non-float tensor, or an `lm_head.weight` that
/// is not `wte.weight`'s copy.
fn match_tensors<'a>(
    st: &SafeTensors<'a>,
    specs: &[ParamSpec],
) -> std::result::Result<HashMap<String, TensorView<'a>>, Vec<String>> {
    let expected: HashMap<&str, &[usize]> = specs
        .iter()
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
    for spec in specs {
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
/// files. The files are staged under temporary names in `dir` and put in place as one unit
/// (`atomic.rs`), with the files of another model that would contradict them removed: an
/// existing directory keeps its old files if anything fails.
pub fn save_pretrained(
    dir: &Path,
    config: &HfConfig,
    params: &Parameters,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    let mut staged = StagedFiles::new(dir)?;
    stage_pretrained(&mut staged, config, params, tokenizer)?;
    remove_other_model_files(&mut staged, tokenizer)?;
    staged.commit()
}

/// Stages `save_pretrained`'s files into `staged`; returns the weights' temporary path.
pub(crate) fn stage_pretrained(
    staged: &mut StagedFiles,
    config: &HfConfig,
    params: &Parameters,
    tokenizer: Option<&Tokenizer>,
) -> Result<PathBuf> {
    let dir = staged.dir().to_path_buf();
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
    file_op(&tmp)?;
    let permissions = File::create(&tmp)
        .and_then(|f| f.metadata())
        .map_err(io)?
        .permissions();
    // HF's loader requires the "format" metadata ("pt": tensors as PyTorch names them).
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    file_op(&tmp)?;
    safetensors::serialize_to_file(tensors, Some(metadata), &tmp).map_err(|e| {
        Error::ModelFile {
            path: dir.join(WEIGHTS_FILE).display().to_string(),
            reason: format!("writing safetensors: {e}"),
        }
    })?;
    std::fs::set_permissions(&tmp, permissions).map_err(io)?;
    sync_file(&tmp)?;
    if let Some(tok) = tokenizer {
        for f in tok.files() {
            staged.write(f.name, f.bytes())?;
        }
    }
    Ok(tmp)
}

/// The files of a Hugging Face model directory besides the ones wgrad writes: another model's
/// weights (shards and their index, other formats), its tokenizer and generation settings.
/// Left beside a saved model they would win over it or contradict it (a `tokenizer.json`
/// beside wgrad's vocab.json and merges.txt is the tokenizer `from_pretrained` takes).
const MODEL_FILES: [&str; 10] = [
    CONFIG_FILE,
    WEIGHTS_FILE,
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
];

/// Settings that go with a tokenizer: kept beside the same tokenizer (a model saved over the
/// directory it came from), removed with another one.
const TOKENIZER_SETTINGS: [&str; 4] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
];

/// Whether the directory's tokenizer is `tokenizer`: its files there, byte for byte, and no
/// other tokenizer file.
fn holds_tokenizer(dir: &Path, tokenizer: Option<&Tokenizer>) -> bool {
    let Some(tok) = tokenizer else {
        return false;
    };
    let ours = |name: &str| tok.files().iter().find(|f| f.name == name);
    ["tokenizer.json", "vocab.json", "merges.txt"]
        .iter()
        .all(|name| match (ours(name), std::fs::read(dir.join(name))) {
            (Some(f), Ok(bytes)) => bytes == f.bytes(),
            (None, Err(_)) => true,
            _ => false,
        })
}

/// A shard of a sharded checkpoint: `model-00001-of-00003.safetensors`,
/// `pytorch_model-00001-of-00003.bin`.
fn is_shard(name: &str) -> bool {
    let stem = name
        .strip_suffix(".safetensors")
        .and_then(|s| s.strip_prefix("model-"))
        .or_else(|| {
            name.strip_suffix(".bin")
                .and_then(|s| s.strip_prefix("pytorch_model-"))
        });
    let Some((i, n)) = stem.and_then(|s| s.split_once("-of-")) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    digits(i) && digits(n)
}

/// Registers for removal, in the same commit, every model file in the directory that the
/// staged ones do not replace (`MODEL_FILES`, shards), and the tokenizer settings unless the
/// directory's tokenizer is `tokenizer`.
pub(crate) fn remove_other_model_files(
    staged: &mut StagedFiles,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    let dir = staged.dir().to_path_buf();
    let settings_stay = holds_tokenizer(&dir, tokenizer);
    let written: HashSet<String> = staged.names().map(str::to_string).collect();
    let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut gone = Vec::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let settings = TOKENIZER_SETTINGS.contains(&name.as_str()) && !settings_stay;
        if !written.contains(&name)
            && (MODEL_FILES.contains(&name.as_str()) || is_shard(&name) || settings)
        {
            gone.push(name);
        }
    }
    gone.sort();
    for name in gone {
        staged.remove_on_commit(&name);
    }
    Ok(())
}

#[cfg(test)]
#[path = "safetensors_io_tests.rs"]
mod tests;
