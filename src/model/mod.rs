//! Model I/O: what goes in and out of files. A model directory is a Hugging Face directory
//! (GPT-2, Llama, Qwen2, Qwen3): `config.json`, `model.safetensors`, and the tokenizer files (`tokenizer.json`, or
//! `vocab.json` + `merges.txt`); a preset under `models/` may hold only `config.json` and point
//! at a shared tokenizer directory (`"wgrad_tokenizer_dir"`).
//!
//! | file | job |
//! | --- | --- |
//! | `hf_config.rs` | config.json: the fields wgrad reads, the ones it keeps untouched |
//! | `input_file.rs` | every file read is a regular file: a FIFO or directory is refused by name |
//! | `tokenizer.rs` | byte-level BPE (GPT-2's files, or any `tokenizer.json`): text to token ids and back |
//! | `safetensors_io.rs` | weights: load into `Parameters` (one file or index.json shards, every mismatch named); `safetensors_save.rs`: save |
//! | `atomic.rs` | writes that are never seen half-done: temporary name, then rename |
//! | `data.rs` | a text file as token ids: read, tokenize once, cache, split |
//! | `batches.rs` | (B, T+1) batches from a token split, seeded, with a resumable position |
//! | `checkpoint.rs` | a model directory plus the training state a resumed run needs |
//! | `eval.rs` | next-token loss and perplexity over a token sequence, in chunks |
//! | `generate.rs` | text generation with a KV cache; temperature, top-k, top-p sampling |

pub(crate) mod atomic;
mod batches;
mod checkpoint;
mod data;
mod eval;
mod generate;
mod hf_config;
mod input_file;
mod safetensors_io;
mod tokenizer;

pub use batches::{Batch, BatchSampler, DataPosition};
pub use checkpoint::{
    read_train_state, save_checkpoint, saved_metadata, SavedState, TrainState, STATE_FILE,
};
pub use data::{TokenDataset, DEFAULT_HELD_OUT};
pub(crate) use eval::mean_loss;
pub use eval::{check_eval_seq, eval_batch_size, evaluate, evaluate_text, EvalReport};
pub use generate::{check_request, generate, Generator, KvCache, Sampling};
pub use hf_config::HfConfig;
pub(crate) use input_file::refuse_non_regular;
pub use safetensors_io::{
    check_weights, load_pretrained, load_pretrained_with, load_weights, save_pretrained,
    weight_files, WeightsRead, WEIGHTS_FILE, WEIGHTS_INDEX_FILE,
};
pub use tokenizer::{FileSource, Tokenizer, TokenizerFile};

/// FNV-1a (64-bit) of `bytes`, continuing from `state` (start from `FNV_OFFSET`): a content
/// fingerprint that stays the same across Rust versions and platforms, unlike `DefaultHasher`.
pub(crate) fn fnv1a64(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state = (state ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    state
}

pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

#[cfg(test)]
pub(crate) mod test_support {
    //! What the module's tests share: one device, scratch directories, the repository's files.

    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    use crate::graph::Device;

    /// The tests' shared device (lavapipe on a machine without a GPU).
    pub fn device() -> &'static Device {
        static DEVICE: OnceLock<Device> = OnceLock::new();
        DEVICE.get_or_init(|| Device::new().expect("creating the wgrad Device"))
    }

    /// A scratch directory, removed when dropped.
    pub struct ScratchDir(PathBuf);

    impl ScratchDir {
        pub fn new(tag: &str) -> ScratchDir {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir()
                .join(format!("wgrad-model-test-{}-{tag}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("creating a scratch directory");
            ScratchDir(dir)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The names of the entries in `dir`, sorted.
    pub fn file_names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("listing")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A path inside the repository.
    pub fn repo_path(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
    }

    /// The repository's GPT-2 tokenizer directory.
    pub fn gpt2_tokenizer_dir() -> PathBuf {
        repo_path("models/gpt2-tokenizer")
    }
}
