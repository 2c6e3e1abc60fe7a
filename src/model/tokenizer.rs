//! GPT-2's byte-level BPE through Hugging Face's `tokenizers` crate: built from `vocab.json` +
//! `merges.txt` as GPT-2's `tokenizer.json` describes it (ByteLevel pre-tokenizer without a
//! prefix space, ByteLevel decoder, `<|endoftext|>` as a special token), or read from a model
//! directory's own `tokenizer.json`, which wins when present.

use std::path::{Path, PathBuf};

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use crate::error::{Error, Result};
use crate::model::hf_config::HfConfig;
use crate::model::input_file::refuse_non_regular;
use crate::model::{fnv1a64, FNV_OFFSET};

/// GPT-2's end-of-text token (id 50256 in its vocabulary): separates documents.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// Texts longer than this are encoded in pieces (bounds the memory of `tokenizers`' per-token
/// bookkeeping); see `split_points`.
const CHUNK_BYTES: usize = 1 << 16;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The files it was built from, copied beside a saved model.
    files: Vec<PathBuf>,
    /// FNV-1a of those files' bytes: names this tokenizer in token caches.
    fingerprint: u64,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("files", &self.files)
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

fn tok_err(path: &Path, reason: impl ToString) -> Error {
    Error::Tokenizer {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn fingerprint(files: &[PathBuf]) -> Result<u64> {
    let mut h = FNV_OFFSET;
    for f in files {
        let bytes = std::fs::read(f).map_err(|source| Error::Io {
            path: f.display().to_string(),
            source,
        })?;
        h = fnv1a64(h, &bytes);
    }
    Ok(h)
}

impl Tokenizer {
    /// GPT-2's tokenizer from its vocabulary (token -> id) and merge list.
    pub fn from_bpe_files(vocab: &Path, merges: &Path) -> Result<Tokenizer> {
        let utf8 = |p: &Path| {
            p.to_str()
                .map(str::to_owned)
                .ok_or_else(|| tok_err(p, "the path is not UTF-8"))
        };
        for f in [vocab, merges] {
            refuse_non_regular(f, "a tokenizer file")?;
            if !f.is_file() {
                return Err(tok_err(f, "no such file"));
            }
        }
        let bpe = BPE::from_file(&utf8(vocab)?, &utf8(merges)?)
            .build()
            .map_err(|e| {
                tok_err(
                    vocab,
                    format!("building BPE with {}: {e}", merges.display()),
                )
            })?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_decoder(Some(ByteLevel::default()))
            .with_post_processor(Some(ByteLevel::default().trim_offsets(false)));
        if inner.token_to_id(END_OF_TEXT).is_some() {
            inner
                .add_special_tokens([AddedToken::from(END_OF_TEXT, true)])
                .map_err(|e| tok_err(vocab, e))?;
        }
        let files = vec![vocab.to_path_buf(), merges.to_path_buf()];
        Ok(Tokenizer {
            inner,
            fingerprint: fingerprint(&files)?,
            files,
        })
    }

    /// A tokenizer saved whole by Hugging Face (`tokenizer.json`).
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer> {
        refuse_non_regular(path, "tokenizer.json")?;
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| tok_err(path, e))?;
        let files = vec![path.to_path_buf()];
        Ok(Tokenizer {
            inner,
            fingerprint: fingerprint(&files)?,
            files,
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
            dir,
            "no tokenizer.json, nor vocab.json + merges.txt, in this directory",
        ))
    }

    /// A model directory's tokenizer: its own files, else the directory its config names
    /// (`"wgrad_tokenizer_dir"`, as the presets under `models/` do).
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
                .map_err(|e| tok_err(&self.files[0], format!("encoding: {e}")))?;
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
                &self.files[0],
                format!(
                    "decoding: id {} at position {pos} is outside the vocabulary of {n}",
                    ids[pos]
                ),
            ));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| tok_err(&self.files[0], format!("decoding: {e}")))
    }

    /// Tokens in the vocabulary, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of `<|endoftext|>`, when the vocabulary has it.
    pub fn end_of_text(&self) -> Option<u32> {
        self.inner.token_to_id(END_OF_TEXT)
    }

    /// The files this tokenizer was built from.
    pub fn files(&self) -> &[PathBuf] {
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
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/austen-persuasion.txt");
        let text = std::fs::read_to_string(path).expect("the corpus");
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
