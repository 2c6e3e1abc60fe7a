//! GPT-2's byte-level BPE through Hugging Face's `tokenizers` crate: built from `vocab.json` +
//! `merges.txt` as GPT-2's `tokenizer.json` describes it (ByteLevel pre-tokenizer without a
//! prefix space, ByteLevel decoder, `<|endoftext|>` as a special token), or read from a model
//! directory's own `tokenizer.json`, which wins when present.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use crate::error::{Error, Result};
use crate::model::hf_config::HfConfig;
use crate::model::input_file::read_regular;
use crate::model::{fnv1a64, FNV_OFFSET};

/// GPT-2's end-of-text token (id 50256 in its vocabulary): separates documents.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// Texts longer than this are encoded in pieces (bounds the memory of `tokenizers`' per-token
/// bookkeeping); see `split_points`.
const CHUNK_BYTES: usize = 1 << 16;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The files it was built from, written beside a saved model.
    files: Vec<TokenizerFile>,
    /// What errors name: the first file's path, or the built-in tokenizer.
    origin: String,
    /// FNV-1a of those files' bytes: names this tokenizer in token caches.
    fingerprint: u64,
}

/// A file a tokenizer was built from, as a saved model directory holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerFile {
    /// Its name in a model directory: `vocab.json`, `merges.txt` or `tokenizer.json`.
    pub name: &'static str,
    pub source: FileSource,
}

/// Where a tokenizer file came from, with its bytes as read: a save writes those, whatever
/// became of the file since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileSource {
    /// A file on disk (a model directory's).
    File { path: PathBuf, bytes: Arc<[u8]> },
    /// Compiled into the binary (`crate::assets`).
    Builtin(&'static [u8]),
}

impl TokenizerFile {
    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.source {
            FileSource::File { bytes, .. } => bytes,
            FileSource::Builtin(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("origin", &self.origin)
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

fn tok_err(what: impl std::fmt::Display, reason: impl ToString) -> Error {
    Error::Tokenizer {
        path: what.to_string(),
        reason: reason.to_string(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    if !path.exists() {
        return Err(tok_err(path.display(), "no such file"));
    }
    read_regular(path, "a tokenizer file")
}

/// A vocab.json's token ids; `what` names it in errors.
fn parse_vocab(what: &str, bytes: &[u8]) -> Result<Vocab> {
    let map: HashMap<String, u32> = serde_json::from_slice(bytes).map_err(|e| {
        tok_err(
            what,
            format!("not a JSON object of token ids (token -> id): {e}"),
        )
    })?;
    Ok(map.into_iter().collect())
}

/// A merges.txt's pairs, as `tokenizers` reads them (`#version` lines skipped, each other line
/// two tokens separated by one space); `what` names it in errors.
fn parse_merges(what: &str, bytes: &[u8]) -> Result<Merges> {
    let text = std::str::from_utf8(bytes).map_err(|e| tok_err(what, format!("not UTF-8: {e}")))?;
    let mut merges = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("#version") {
            continue;
        }
        match line.split(' ').collect::<Vec<_>>()[..] {
            [a, b] => merges.push((a.to_string(), b.to_string())),
            _ => {
                return Err(tok_err(
                    what,
                    format!(
                        "line {}: `{line}` is not two tokens separated by one space",
                        i + 1
                    ),
                ))
            }
        }
    }
    Ok(merges)
}

impl Tokenizer {
    /// GPT-2's tokenizer from its vocabulary (token -> id) and merge list.
    pub fn from_bpe_files(vocab: &Path, merges: &Path) -> Result<Tokenizer> {
        let (v, m) = (read(vocab)?, read(merges)?);
        Tokenizer::from_bpe(
            [
                (vocab.display().to_string(), v.as_slice()),
                (merges.display().to_string(), m.as_slice()),
            ],
            [
                FileSource::File {
                    path: vocab.to_path_buf(),
                    bytes: Arc::from(v.as_slice()),
                },
                FileSource::File {
                    path: merges.to_path_buf(),
                    bytes: Arc::from(m.as_slice()),
                },
            ],
        )
    }

    /// GPT-2's tokenizer from the bytes of a vocab.json and a merges.txt compiled into the
    /// binary; `origin` names them in errors (`crate::assets::gpt2_tokenizer`).
    pub fn from_builtin_bpe(
        vocab: &'static [u8],
        merges: &'static [u8],
        origin: &str,
    ) -> Result<Tokenizer> {
        Tokenizer::from_bpe(
            [
                (format!("{origin} (vocab.json)"), vocab),
                (format!("{origin} (merges.txt)"), merges),
            ],
            [FileSource::Builtin(vocab), FileSource::Builtin(merges)],
        )
    }

    /// GPT-2's byte-level BPE from vocab.json and merges.txt bytes, each with what names it.
    fn from_bpe(bytes: [(String, &[u8]); 2], sources: [FileSource; 2]) -> Result<Tokenizer> {
        let [(vocab_name, vocab), (merges_name, merges)] = bytes;
        let bpe = BPE::builder()
            .vocab_and_merges(
                parse_vocab(&vocab_name, vocab)?,
                parse_merges(&merges_name, merges)?,
            )
            .build()
            .map_err(|e| tok_err(&vocab_name, format!("building BPE with {merges_name}: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_decoder(Some(ByteLevel::default()))
            .with_post_processor(Some(ByteLevel::default().trim_offsets(false)));
        if inner.token_to_id(END_OF_TEXT).is_some() {
            inner
                .add_special_tokens([AddedToken::from(END_OF_TEXT, true)])
                .map_err(|e| tok_err(&vocab_name, e))?;
        }
        let [vs, ms] = sources;
        Ok(Tokenizer {
            inner,
            fingerprint: fnv1a64(fnv1a64(FNV_OFFSET, vocab), merges),
            files: vec![
                TokenizerFile {
                    name: "vocab.json",
                    source: vs,
                },
                TokenizerFile {
                    name: "merges.txt",
                    source: ms,
                },
            ],
            origin: vocab_name,
        })
    }

    /// A tokenizer saved whole by Hugging Face (`tokenizer.json`).
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer> {
        let bytes = read(path)?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| tok_err(path.display(), e))?;
        Ok(Tokenizer {
            inner,
            fingerprint: fnv1a64(FNV_OFFSET, &bytes),
            files: vec![TokenizerFile {
                name: "tokenizer.json",
                source: FileSource::File {
                    path: path.to_path_buf(),
                    bytes: Arc::from(bytes.as_slice()),
                },
            }],
            origin: path.display().to_string(),
        })
    }

    /// The tokenizer files of `dir`: `tokenizer.json` if present, else `vocab.json` +
    /// `merges.txt`.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            return Tokenizer::from_tokenizer_json(&json);
        }
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if vocab.exists() || merges.exists() {
            return Tokenizer::from_bpe_files(&vocab, &merges);
        }
        Err(tok_err(
            dir.display(),
            "no tokenizer.json, nor vocab.json + merges.txt, in this directory",
        ))
    }

    /// A model directory's tokenizer: its own files, else the directory its config names
    /// (`"wgrad_tokenizer_dir"`, a path relative to the directory). The presets' tokenizer is
    /// built in (`crate::assets`), not found this way.
    pub fn for_model(dir: &Path, config: &HfConfig) -> Result<Tokenizer> {
        let own = ["tokenizer.json", "vocab.json", "merges.txt"];
        if own.iter().any(|f| dir.join(f).exists()) {
            return Tokenizer::from_dir(dir);
        }
        match config.tokenizer_dir() {
            Some(shared) => Tokenizer::from_dir(&shared),
            None => Tokenizer::from_dir(dir),
        }
    }

    /// Token ids of `text`; special tokens written in the text (`<|endoftext|>`) become their
    /// ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut start = 0;
        for end in split_points(text, CHUNK_BYTES) {
            let enc = self
                .inner
                .encode(&text[start..end], false)
                .map_err(|e| tok_err(&self.origin, format!("encoding: {e}")))?;
            ids.extend_from_slice(enc.get_ids());
            start = end;
        }
        Ok(ids)
    }

    /// The text of `ids`; an id outside the vocabulary is an error naming it.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let n = self.vocab_size();
        if let Some(pos) = ids.iter().position(|&id| id as usize >= n) {
            return Err(tok_err(
                &self.origin,
                format!(
                    "decoding: id {} at position {pos} is outside the vocabulary of {n}",
                    ids[pos]
                ),
            ));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| tok_err(&self.origin, format!("decoding: {e}")))
    }

    /// Tokens in the vocabulary, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of `<|endoftext|>`, when the vocabulary has it.
    pub fn end_of_text(&self) -> Option<u32> {
        self.inner.token_to_id(END_OF_TEXT)
    }

    /// The files this tokenizer was built from, as a saved model directory holds them.
    pub fn files(&self) -> &[TokenizerFile] {
        &self.files
    }

    /// A fingerprint of the tokenizer files' contents.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// Byte offsets that cut `text` into pieces of about `chunk` bytes, ending with `text.len()`.
/// A cut goes right after a lone `\n` between two printable ASCII characters: GPT-2's
/// pre-tokenizer regex makes that `\n` a pre-token of its own both inside the text (`\s+`) and
/// at the end of a piece (`\s+(?!\S)`), and ` ?\p{L}+` and the like take a space, never a `\n`;
/// so the pieces' ids are the whole text's. (A longer whitespace run would not do: at the end
/// of a piece `\n\n` is one pre-token, before a letter it is two.)
fn split_points(text: &str, chunk: usize) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut cuts = Vec::new();
    let mut from = chunk;
    while from < bytes.len() {
        let next = bytes[from..]
            .windows(3)
            .position(|w| w[1] == b'\n' && w[0].is_ascii_graphic() && w[2].is_ascii_graphic())
            .map(|p| from + p + 2);
        match next {
            Some(cut) => {
                cuts.push(cut);
                from = cut + chunk;
            }
            None => break,
        }
    }
    cuts.push(bytes.len());
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::gpt2_tokenizer_dir;

    fn gpt2() -> Tokenizer {
        Tokenizer::from_dir(&gpt2_tokenizer_dir()).expect("the GPT-2 tokenizer")
    }

    #[test]
    fn known_gpt2_ids() {
        let t = gpt2();
        assert_eq!(t.vocab_size(), 50257);
        assert_eq!(t.encode("Hello world").unwrap(), [15496, 995]);
        assert_eq!(t.encode(" the").unwrap(), [262]);
        assert_eq!(t.encode("<|endoftext|>").unwrap(), [50256]);
        assert_eq!(t.end_of_text(), Some(50256));
        assert_eq!(t.decode(&[15496, 995]).unwrap(), "Hello world");
    }

    #[test]
    fn round_trip_including_unicode_and_whitespace() {
        let t = gpt2();
        let text = "Anne Elliot's  \"persuasion\" — 1818.\n\n\tCafé, naïve; 東京 🙂\r\n  end <|endoftext|>x";
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
        let err = t.decode(&[1, 50257]).unwrap_err().to_string();
        assert!(err.contains("50257") && err.contains("position 1"), "{err}");
    }

    #[test]
    fn encoding_in_pieces_gives_the_ids_of_the_whole_text() {
        let t = gpt2();
        let text = crate::assets::DEFAULT_CORPUS;
        let mut end = 40_000;
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let text = &text[..end];
        let whole = t.inner.encode(text, false).unwrap().get_ids().to_vec();
        let cuts = split_points(text, 997);
        assert!(cuts.len() > 20, "{} pieces", cuts.len());
        let mut pieces = Vec::new();
        let mut start = 0;
        for end in cuts {
            pieces.extend_from_slice(t.inner.encode(&text[start..end], false).unwrap().get_ids());
            start = end;
        }
        if let Some(i) = (0..pieces.len().min(whole.len())).find(|&i| pieces[i] != whole[i]) {
            let lo = i.saturating_sub(5);
            panic!(
                "first difference at {i}: pieces {:?} = {:?}, whole {:?} = {:?}",
                &pieces[lo..i + 5],
                t.decode(&pieces[lo..i + 5]).unwrap(),
                &whole[lo..i + 5],
                t.decode(&whole[lo..i + 5]).unwrap()
            );
        }
        assert_eq!(pieces.len(), whole.len());
    }

    #[test]
    fn the_builtin_tokenizer_is_the_files_one() {
        let files = gpt2();
        let builtin = crate::assets::gpt2_tokenizer().expect("the built-in tokenizer");
        assert_eq!(builtin.fingerprint(), files.fingerprint());
        let text = "Anne Elliot <|endoftext|> 1818";
        assert_eq!(builtin.encode(text).unwrap(), files.encode(text).unwrap());
        let names: Vec<_> = builtin.files().iter().map(|f| f.name).collect();
        assert_eq!(names, ["vocab.json", "merges.txt"]);
        assert!(matches!(builtin.files()[0].source, FileSource::Builtin(_)));
        assert!(matches!(files.files()[1].source, FileSource::File { .. }));
    }

    #[test]
    fn malformed_vocab_and_merges_are_errors_naming_the_file() {
        let err = parse_vocab("v.json", br#"{"a": "one"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("v.json") && err.contains("token ids"), "{err}");
        let merges = parse_merges("m.txt", b"#version: 0.2\na b\nc d e\n").unwrap_err();
        let err = merges.to_string();
        assert!(err.contains("m.txt") && err.contains("line 3"), "{err}");
        let ok = parse_merges("m.txt", b"#version: 0.2\r\na b\r\nc d\n").unwrap();
        assert_eq!(ok, [("a".into(), "b".into()), ("c".into(), "d".into())]);
    }

    #[test]
    fn a_config_may_name_a_shared_tokenizer_directory() {
        let scratch = crate::model::test_support::ScratchDir::new("tokenizer-dir-field");
        let json = format!(
            r#"{{"vocab_size": 50257, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2,
                "{}": "{}"}}"#,
            crate::model::hf_config::TOKENIZER_DIR_FIELD,
            gpt2_tokenizer_dir().display()
        );
        let path = scratch.path().join("config.json");
        std::fs::write(&path, json).expect("writing");
        let config = HfConfig::read(&path).expect("the config");
        let t = Tokenizer::for_model(scratch.path(), &config).expect("the named tokenizer");
        assert_eq!(t.fingerprint(), gpt2().fingerprint());
        assert!(!config
            .to_json()
            .contains(crate::model::hf_config::TOKENIZER_DIR_FIELD));
    }

    #[test]
    fn missing_files_are_errors_naming_them() {
        let dir = std::env::temp_dir().join("wgrad-no-such-tokenizer-dir");
        let err = Tokenizer::from_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("wgrad-no-such-tokenizer-dir"), "{err}");
        let err = Tokenizer::from_bpe_files(&gpt2_tokenizer_dir().join("vocab.json"), &dir)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no such file"), "{err}");
    }
}
