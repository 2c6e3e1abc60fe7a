//! A UTF-8 text file as GPT-2 token ids: read, tokenized once, the ids cached beside the file,
//! split into a training part and a held-out tail.
//!
//! The cache `<file>.wgrad-tokens-<key>.bin` is keyed by the text's and the tokenizer files'
//! fingerprints, so an edited text or another tokenizer gets a cache of its own; it is written
//! atomically, checked against its header when read, and rebuilt when it does not match. A
//! directory that cannot be written only costs the cache (a warning), not the run.
//!
//! The built-in corpus (`crate::assets`, named `builtin:austen-persuasion.txt`) is tokenized in
//! memory on each load, never cached: it is not a file of the user's to write beside, and its
//! 113K tokens take a fraction of a second (the test `the_builtin_corpus_is_tokenized_in_memory`
//! prints the time).
//!
//! Cache layout (little-endian): magic `WGRDTOK1`, text bytes u64, text FNV-1a u64, tokenizer
//! fingerprint u64, token count u64, then the ids as u32.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::atomic::write_file;
use crate::model::batches::BatchSampler;
use crate::model::input_file::read_regular;
use crate::model::tokenizer::Tokenizer;
use crate::model::{fnv1a64, FNV_OFFSET};

/// The fraction of the tokens held out (the file's tail) unless told otherwise.
pub const DEFAULT_HELD_OUT: f64 = 0.1;

const CACHE_MAGIC: &[u8; 8] = b"WGRDTOK1";
const CACHE_HEADER: usize = 8 + 4 * 8;

pub struct TokenDataset {
    path: PathBuf,
    tokens: Arc<[u32]>,
    /// `tokens[..split]` trains, `tokens[split..]` is held out.
    split: usize,
    /// None for a built-in corpus: tokenized in memory, never cached.
    cache_path: Option<PathBuf>,
    from_cache: bool,
}

/// What a cache must match: the text and the tokenizer it was made from.
struct CacheKey {
    text_len: u64,
    text_hash: u64,
    tokenizer: u64,
}

impl CacheKey {
    fn header(&self, n_tokens: usize) -> Vec<u8> {
        let mut h = CACHE_MAGIC.to_vec();
        for x in [
            self.text_len,
            self.text_hash,
            self.tokenizer,
            n_tokens as u64,
        ] {
            h.extend_from_slice(&x.to_le_bytes());
        }
        h
    }

    /// The cache file of `text_path` for this key.
    fn path(&self, text_path: &Path) -> PathBuf {
        let mut key = fnv1a64(FNV_OFFSET, &self.text_hash.to_le_bytes());
        key = fnv1a64(key, &self.tokenizer.to_le_bytes());
        let mut name = text_path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".wgrad-tokens-{key:016x}.bin"));
        text_path.with_file_name(name)
    }

    /// The ids of a cache file, or None when it is absent or does not match this key.
    fn read(&self, cache: &Path) -> Option<Vec<u32>> {
        // Not a regular file (a FIFO would block the read): no cache.
        if !std::fs::metadata(cache).ok()?.is_file() {
            return None;
        }
        let bytes = std::fs::read(cache).ok()?;
        if bytes.len() < CACHE_HEADER || !(bytes.len() - CACHE_HEADER).is_multiple_of(4) {
            return None;
        }
        let n = (bytes.len() - CACHE_HEADER) / 4;
        if bytes[..CACHE_HEADER] != self.header(n)[..] {
            return None;
        }
        Some(
            bytes[CACHE_HEADER..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }
}

/// The text of `path`, with an error naming the file for a missing, empty or non-UTF-8 one.
fn read_text(path: &Path) -> Result<String> {
    let shown = path.display().to_string();
    let bytes = read_regular(path, "the text")?;
    if bytes.is_empty() {
        return Err(Error::Dataset {
            path: shown,
            reason: "the file is empty: there is no text to train on".into(),
        });
    }
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        Error::NotUtf8 {
            path: shown,
            offset,
            byte: bytes[offset],
            line: 1 + bytes[..offset].iter().filter(|&&b| b == b'\n').count(),
        }
    })
}

/// The tokens of the text file `path`: from its cache when one matches, else tokenized and
/// cached (a cache that cannot be written is a warning). Also the cache's path and whether
/// the tokens came from it.
fn cached_tokens(path: &Path, tokenizer: &Tokenizer) -> Result<(Vec<u32>, PathBuf, bool)> {
    let text = read_text(path)?;
    let key = CacheKey {
        text_len: text.len() as u64,
        text_hash: fnv1a64(FNV_OFFSET, text.as_bytes()),
        tokenizer: tokenizer.fingerprint(),
    };
    let cache_path = key.path(path);
    if let Some(ids) = key.read(&cache_path) {
        return Ok((ids, cache_path, true));
    }
    let ids = tokenizer.encode(&text)?;
    let mut bytes = key.header(ids.len());
    bytes.extend_from_slice(bytemuck::cast_slice(&ids));
    if let Err(e) = write_file(&cache_path, &bytes) {
        tracing::warn!("not caching the token ids: {e}");
    }
    Ok((ids, cache_path, false))
}

impl TokenDataset {
    /// The tokens of the text file `path` (or of the built-in corpus it names,
    /// `crate::assets::builtin_corpus`), the last `DEFAULT_HELD_OUT` of them held out.
    pub fn load(path: &Path, tokenizer: &Tokenizer) -> Result<TokenDataset> {
        TokenDataset::load_with_held_out(path, tokenizer, DEFAULT_HELD_OUT)
    }

    /// As `load`, holding out the last `held_out` fraction (0 <= held_out < 1) of the tokens.
    pub fn load_with_held_out(
        path: &Path,
        tokenizer: &Tokenizer,
        held_out: f64,
    ) -> Result<TokenDataset> {
        if !(0.0..1.0).contains(&held_out) {
            return Err(Error::InvalidArgument {
                op: "TokenDataset::load",
                reason: format!("the held-out fraction {held_out} is not in [0, 1)"),
            });
        }
        let (tokens, cache_path, from_cache) = match crate::assets::builtin_corpus(path) {
            Some(text) => (tokenizer.encode(text)?, None, false),
            None => {
                let (tokens, cache_path, from_cache) = cached_tokens(path, tokenizer)?;
                (tokens, Some(cache_path), from_cache)
            }
        };
        let held = (tokens.len() as f64 * held_out).round() as usize;
        Ok(TokenDataset {
            path: path.to_path_buf(),
            split: tokens.len() - held,
            tokens: tokens.into(),
            cache_path,
            from_cache,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every token of the file, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn train(&self) -> &[u32] {
        &self.tokens[..self.split]
    }

    pub fn held_out(&self) -> &[u32] {
        &self.tokens[self.split..]
    }

    /// The cache file of these tokens (None for a built-in corpus, which is not cached).
    pub fn cache_path(&self) -> Option<&Path> {
        self.cache_path.as_deref()
    }

    /// Whether the tokens came from the cache (not from tokenizing the text).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// Shuffled (B, T+1) training batches, deterministic for a seed; an error naming both
    /// lengths when the training part is shorter than one sequence.
    pub fn train_batches(&self, batch: usize, seq_len: usize, seed: u64) -> Result<BatchSampler> {
        self.check_len("training", self.train().len(), seq_len)?;
        BatchSampler::shuffled(self.tokens.clone(), 0..self.split, batch, seq_len, seed)
    }

    /// The held-out part as (B, T+1) batches of consecutive windows, in order.
    pub fn held_out_batches(&self, batch: usize, seq_len: usize) -> Result<BatchSampler> {
        self.check_len("held-out", self.held_out().len(), seq_len)?;
        BatchSampler::sequential(
            self.tokens.clone(),
            self.split..self.tokens.len(),
            batch,
            seq_len,
        )
    }

    fn check_len(&self, part: &'static str, tokens: usize, seq_len: usize) -> Result<()> {
        if tokens < seq_len + 1 {
            return Err(Error::DataTooShort {
                path: self.path.display().to_string(),
                part,
                tokens,
                needed: seq_len + 1,
                seq_len,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{gpt2_tokenizer_dir, ScratchDir};

    fn gpt2() -> Tokenizer {
        Tokenizer::from_dir(&gpt2_tokenizer_dir()).expect("the GPT-2 tokenizer")
    }

    #[test]
    fn tokenizes_once_then_reads_the_cache() {
        let scratch = ScratchDir::new("data-cache");
        let path = scratch.path().join("text.txt");
        let text = "It is a truth universally acknowledged.\n".repeat(50);
        std::fs::write(&path, &text).expect("writing");
        let tok = gpt2();
        let first = TokenDataset::load(&path, &tok).expect("loading");
        assert!(!first.from_cache());
        assert!(
            first.cache_path().is_some_and(Path::is_file),
            "{:?}",
            first.cache_path()
        );
        assert_eq!(first.tokens(), tok.encode(&text).unwrap());
        let second = TokenDataset::load(&path, &tok).expect("loading again");
        assert!(second.from_cache());
        assert_eq!(second.tokens(), first.tokens());
        let n = first.tokens().len();
        assert_eq!(first.held_out().len(), (n as f64 * 0.1).round() as usize);
        assert_eq!([first.train(), first.held_out()].concat(), first.tokens());

        // An edited text gets a cache of its own; a corrupt cache is rebuilt.
        std::fs::write(&path, format!("{text}More.\n")).expect("editing");
        let edited = TokenDataset::load(&path, &tok).expect("loading the edit");
        assert!(!edited.from_cache());
        assert_ne!(edited.cache_path(), first.cache_path());
        std::fs::write(edited.cache_path().unwrap(), b"WGRDTOK1 garbage").expect("corrupting");
        let rebuilt = TokenDataset::load(&path, &tok).expect("rebuilding");
        assert!(!rebuilt.from_cache());
        assert_eq!(rebuilt.tokens(), edited.tokens());
    }

    #[test]
    fn missing_empty_and_non_utf8_files_are_errors_naming_them() {
        let scratch = ScratchDir::new("data-errors");
        let tok = gpt2();
        let missing = scratch.path().join("absent.txt");
        let err = TokenDataset::load(&missing, &tok)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("absent.txt"), "{err}");

        let empty = scratch.path().join("empty.txt");
        std::fs::write(&empty, b"").expect("writing");
        let err = TokenDataset::load(&empty, &tok)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty.txt") && err.contains("empty"), "{err}");

        let latin1 = scratch.path().join("latin1.txt");
        std::fs::write(&latin1, b"line one\ncaf\xe9\n").expect("writing");
        let err = TokenDataset::load(&latin1, &tok)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("latin1.txt") && err.contains("0xe9 at offset 12 (line 2)"),
            "{err}"
        );
    }

    #[test]
    fn data_shorter_than_one_sequence_names_both_lengths() {
        let scratch = ScratchDir::new("data-short");
        let path = scratch.path().join("short.txt");
        std::fs::write(&path, "Hello world").expect("writing");
        let data = TokenDataset::load_with_held_out(&path, &gpt2(), 0.0).expect("loading");
        assert_eq!(data.train(), [15496, 995]);
        let err = data
            .train_batches(1, 2, 0)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("short.txt") && err.contains("2 tokens"),
            "{err}"
        );
        assert!(err.contains("3 tokens (T + 1 with T = 2)"), "{err}");
        assert!(data.train_batches(1, 1, 0).is_ok());
        let err = data
            .held_out_batches(1, 1)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("held-out part holds 0 tokens"), "{err}");
    }

    #[test]
    fn the_builtin_corpus_is_tokenized_in_memory() {
        let tok = gpt2();
        let started = std::time::Instant::now();
        let data = TokenDataset::load(&crate::assets::default_corpus(), &tok).expect("loading");
        eprintln!(
            "the built-in corpus: {} tokens in {:?}",
            data.tokens().len(),
            started.elapsed()
        );
        assert_eq!(
            data.tokens(),
            tok.encode(crate::assets::DEFAULT_CORPUS).unwrap()
        );
        assert!(data.tokens().len() > 100_000, "{}", data.tokens().len());
        assert!(!data.from_cache() && data.cache_path().is_none());
        assert_eq!(data.path(), crate::assets::default_corpus());
        // As an old checkpoint recorded it: the checkout's path, the file gone.
        let gone = std::env::temp_dir().join("wgrad-no-such-checkout/data/austen-persuasion.txt");
        let legacy = TokenDataset::load(&gone, &tok).expect("loading the old path");
        assert_eq!(legacy.tokens(), data.tokens());
        assert!(legacy.cache_path().is_none());
    }
}
