//! The built-in assets, compiled into the binary so that `wgrad` runs the same from any
//! directory (`cargo install --path .` included): the presets' config.json (models/<name>/),
//! GPT-2's tokenizer (models/gpt2-tokenizer/vocab.json + merges.txt) and the default corpus
//! (data/austen-persuasion.txt). This module is the only way any command finds them; nothing
//! reads those files from the checkout at run time.
//!
//! The default corpus has a stable name, `builtin:austen-persuasion.txt`, which a run's options
//! (and so its checkpoints) record in place of a path; `--data` and `eval --text` accept it.
//! Checkpoints written before the corpus was compiled in recorded its absolute path in the
//! checkout (`<checkout>/data/austen-persuasion.txt`): such a path, when the file is gone, is
//! read as the built-in corpus (a resumed run still checks the tokens' fingerprint, and records
//! the name from then on). The name is reserved: a file called so is not read.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::{HfConfig, Tokenizer};

/// A built-in model: its Hugging Face config.json, and whether GPT-2's tokenizer (compiled in)
/// is its tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    /// The config.json text (no tokenizer pointer).
    pub config_json: &'static str,
    /// Its vocabulary is GPT-2's, and `gpt2_tokenizer` its tokenizer. Without one (SmolLM2's
    /// 49,152 tokens) the preset serves the commands that run random tokens (`bench step`,
    /// `profile`), and `train` asks for a model directory.
    pub gpt2_tokenizer: bool,
}

/// The presets, in the order `--preset` lists them.
pub const PRESETS: [Preset; 5] = [
    Preset {
        name: "tiny",
        config_json: include_str!("../models/tiny/config.json"),
        gpt2_tokenizer: true,
    },
    Preset {
        name: "distilgpt2",
        config_json: include_str!("../models/distilgpt2/config.json"),
        gpt2_tokenizer: true,
    },
    Preset {
        name: "gpt2",
        config_json: include_str!("../models/gpt2/config.json"),
        gpt2_tokenizer: true,
    },
    Preset {
        name: "tiny-llama",
        config_json: include_str!("../models/tiny-llama/config.json"),
        gpt2_tokenizer: true,
    },
    Preset {
        name: "smollm2-135m",
        config_json: include_str!("../models/smollm2-135m/config.json"),
        gpt2_tokenizer: false,
    },
];

/// GPT-2's vocabulary (token -> id), as Hugging Face ships it.
pub const GPT2_VOCAB_JSON: &[u8] = include_bytes!("../models/gpt2-tokenizer/vocab.json");
/// GPT-2's BPE merges, as Hugging Face ships them.
pub const GPT2_MERGES_TXT: &[u8] = include_bytes!("../models/gpt2-tokenizer/merges.txt");

/// The name a run records for the default corpus, and that `--data` accepts for it.
pub const DEFAULT_CORPUS_NAME: &str = "builtin:austen-persuasion.txt";
/// The default corpus: Austen's Persuasion (data/README.md says where it comes from).
pub const DEFAULT_CORPUS: &str = include_str!("../data/austen-persuasion.txt");
/// Where the corpus lay in a checkout, as checkpoints from before it was compiled in recorded.
const CHECKOUT_CORPUS: &str = "data/austen-persuasion.txt";

impl Preset {
    /// The preset called `name`; an unknown name is an error listing the known ones.
    pub fn named(name: &str) -> Result<Preset> {
        PRESETS
            .iter()
            .find(|p| p.name == name)
            .copied()
            .ok_or_else(|| Error::InvalidArgument {
                op: "--preset",
                reason: format!(
                    "unknown preset `{name}` (known: {})",
                    preset_names().join(", ")
                ),
            })
    }

    /// Its config, parsed and checked as a model directory's would be.
    pub fn config(&self) -> Result<HfConfig> {
        HfConfig::parse(
            &format!("the built-in preset {}", self.name),
            self.config_json,
        )
    }

    /// Its tokenizer: GPT-2's, or an error saying how to train a preset without one.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        if self.gpt2_tokenizer {
            return gpt2_tokenizer();
        }
        Err(Error::InvalidArgument {
            op: "--preset",
            reason: format!(
                "the {} preset has no built-in tokenizer for its vocabulary (wgrad compiles in \
                 GPT-2's only): train it from a Hugging Face directory that holds its \
                 config.json, weights and tokenizer.json (--model DIR); bench step and profile \
                 run it on random tokens",
                self.name
            ),
        })
    }
}

/// The presets' names.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

/// GPT-2's tokenizer from the compiled-in vocab.json and merges.txt (a checkpoint of a preset
/// run writes these two files beside its weights).
pub fn gpt2_tokenizer() -> Result<Tokenizer> {
    Tokenizer::from_builtin_bpe(
        GPT2_VOCAB_JSON,
        GPT2_MERGES_TXT,
        "the built-in GPT-2 tokenizer",
    )
}

/// The path-like name of the default corpus (`TrainOptions::default().data`).
pub fn default_corpus() -> PathBuf {
    PathBuf::from(DEFAULT_CORPUS_NAME)
}

/// The text of a built-in corpus that `path` names: `DEFAULT_CORPUS_NAME`, or (as checkpoints
/// from before the corpus was compiled in recorded it) an absolute path ending in
/// `data/austen-persuasion.txt` where no file is. None for any other path: a file to read.
pub fn builtin_corpus(path: &Path) -> Option<&'static str> {
    if path == Path::new(DEFAULT_CORPUS_NAME) {
        return Some(DEFAULT_CORPUS);
    }
    let legacy = path.is_absolute() && path.ends_with(CHECKOUT_CORPUS);
    (legacy && std::fs::symlink_metadata(path).is_err()).then_some(DEFAULT_CORPUS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_use_gpt2s_tokenizer() {
        for p in PRESETS {
            let c = p.config().expect("a preset's config");
            let vocab = if p.gpt2_tokenizer { 50257 } else { 49152 };
            assert_eq!(c.model.vocab_size, vocab, "{}", p.name);
            assert_eq!(c.model.layer_norm_epsilon, 1e-5, "{}", p.name);
            assert!(c.tokenizer_dir().is_none(), "{}: no path to follow", p.name);
            assert_eq!(p.tokenizer().is_ok(), p.gpt2_tokenizer, "{}", p.name);
        }
        for (name, layers) in [
            ("tiny", 2),
            ("distilgpt2", 6),
            ("gpt2", 12),
            ("tiny-llama", 2),
            ("smollm2-135m", 30),
        ] {
            let config = Preset::named(name).unwrap().config().unwrap();
            assert_eq!(config.model.n_layer, layers, "{name}");
        }
        let smol = Preset::named("smollm2-135m")
            .unwrap()
            .config()
            .unwrap()
            .model;
        assert_eq!(smol.family, crate::nn::Family::Llama);
        assert_eq!((smol.n_head, smol.n_kv_head, smol.head_dim), (9, 3, 64));
        assert_eq!(smol.parameter_count(), 134_515_008);
        let err = Preset::named("smollm2-135m")
            .unwrap()
            .tokenizer()
            .unwrap_err();
        assert!(err.to_string().contains("--model DIR"), "{err}");
        let err = Preset::named("gpt3").unwrap_err().to_string();
        assert!(
            err.contains("gpt3")
                && err.contains("tiny, distilgpt2, gpt2, tiny-llama, smollm2-135m"),
            "{err}"
        );
        let tok = Preset::named("tiny").unwrap().tokenizer().unwrap();
        assert_eq!(tok.vocab_size(), 50257);
        assert_eq!(tok.encode("Hello world").unwrap(), [15496, 995]);
    }

    #[test]
    fn the_default_corpus_and_the_paths_that_name_it() {
        assert!(DEFAULT_CORPUS.starts_with("[Persuasion by Jane Austen 1818]"));
        assert!(DEFAULT_CORPUS.len() > 300_000);
        assert_eq!(builtin_corpus(&default_corpus()), Some(DEFAULT_CORPUS));
        // An old checkpoint's checkout path, gone: the built-in text.
        let gone = std::env::temp_dir().join("wgrad-no-such-checkout/data/austen-persuasion.txt");
        assert_eq!(builtin_corpus(&gone), Some(DEFAULT_CORPUS));
        // A file that is there is read as a file; relative paths and other names are files.
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHECKOUT_CORPUS);
        assert!(here.is_file());
        assert_eq!(builtin_corpus(&here), None);
        assert_eq!(builtin_corpus(Path::new(CHECKOUT_CORPUS)), None);
        assert_eq!(builtin_corpus(&gone.with_file_name("emma.txt")), None);
    }

    #[test]
    fn an_old_checkpoints_checkout_path_resumes_as_the_named_corpus() {
        use crate::session::{OptionFlags, TrainOptions};
        let gone = std::env::temp_dir().join("wgrad-no-such-checkout/data/austen-persuasion.txt");
        let old = TrainOptions {
            data: gone,
            ..TrainOptions::default()
        };
        let resumed = OptionFlags::default().resumed_run(&old).expect("resuming");
        assert_eq!(resumed.data, default_corpus());
        let file = TrainOptions {
            data: PathBuf::from("/some/where/emma.txt"),
            ..TrainOptions::default()
        };
        let resumed = OptionFlags::default().resumed_run(&file).expect("resuming");
        assert_eq!(resumed.data, file.data, "another path is kept as recorded");
    }
}
