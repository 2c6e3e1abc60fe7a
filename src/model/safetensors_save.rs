//! Saving: a directory `AutoModelForCausalLM.from_pretrained(dir)` loads (config.json, f32
//! weights under transformers' names, the tokenizer), staged and committed as one unit, with
//! another model's contradicting files removed.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, View};

use super::{CONFIG_FILE, WEIGHTS_FILE};
use crate::error::{Error, Result};
use crate::model::atomic::{file_op, sync_file, StagedFiles};
use crate::model::hf_config::HfConfig;
use crate::model::tokenizer::Tokenizer;
use crate::nn::{Family, ModelConfig, Parameters};

/// A tensor in host memory as safetensors serializes it: the weights read back from the GPU
/// (f32), and the tests' hand-made files (any dtype).
pub(super) struct HostTensor {
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) bytes: Vec<u8>,
}

impl View for HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
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

/// Writes a directory that `AutoModelForCausalLM.from_pretrained(dir)` loads: config.json,
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
    let model = &config.model;
    let specs = model.param_specs();
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
    // GPT-2's names are saved without prefix (as wgrad always has); the Llama family's with
    // `model.`, as transformers writes them (its loader then needs no guess).
    let prefix = match model.family {
        Family::Gpt2 => "",
        family => family.file_prefix(),
    };
    let hf = model.hf_tensors();
    let mut tensors = Vec::with_capacity(hf.len());
    for spec in &specs {
        // Whole: a parameter stored as row shards is saved as one tensor.
        let values = params.read(&spec.name)?;
        let cols: usize = spec.shape[1..].iter().product();
        for t in hf.iter().filter(|t| t.param == spec.name) {
            let at = t.first_row * cols;
            let rows = &values[at..at + t.shape.iter().product::<usize>()];
            let name = if t.name == ModelConfig::LM_HEAD {
                t.name.clone()
            } else {
                format!("{prefix}{}", t.name)
            };
            tensors.push((
                name,
                HostTensor {
                    dtype: Dtype::F32,
                    shape: t.shape.clone(),
                    bytes: bytemuck::cast_slice(rows).to_vec(),
                },
            ));
        }
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
