//! A Hugging Face GPT-2 config.json: the fields wgrad's model reads (`Gpt2Config`), every other
//! field kept as read so that a saved model keeps them, and the checks that refuse a config
//! whose model wgrad would compute differently (another activation, untied embeddings, ...).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::kernels::attention::MAX_HEAD_DIM;
use crate::model::input_file::read_regular;
use crate::nn::Gpt2Config;

/// The field of a wgrad preset naming its shared tokenizer directory (relative to the preset).
pub const TOKENIZER_DIR_FIELD: &str = "wgrad_tokenizer_dir";

/// The GELU variants that are the tanh approximation wgrad computes.
const TANH_GELUS: [&str; 3] = ["gelu_new", "gelu_pytorch_tanh", "gelu_fast"];

#[derive(Clone, Debug)]
pub struct HfConfig {
    pub gpt2: Gpt2Config,
    /// Every field as read, known ones included; `to_json` overwrites the known ones.
    fields: Map<String, Value>,
    /// The directory the file was read from (None when built in code).
    dir: Option<PathBuf>,
}

impl HfConfig {
    /// A config with only the fields wgrad knows.
    pub fn new(gpt2: Gpt2Config) -> HfConfig {
        HfConfig {
            gpt2,
            fields: Map::new(),
            dir: None,
        }
    }

    /// Reads and checks `path` (a config.json).
    pub fn read(path: &Path) -> Result<HfConfig> {
        let bytes = read_regular(path, "config.json")?;
        let text = String::from_utf8(bytes).map_err(|e| Error::ModelFile {
            path: path.display().to_string(),
            reason: format!("not UTF-8 text ({e})"),
        })?;
        let mut config = HfConfig::parse(&path.display().to_string(), &text)?;
        config.dir = path.parent().map(Path::to_path_buf);
        Ok(config)
    }

    /// Parses and checks config.json text; `path` names it in errors, and each fault names its
    /// field: a missing size, a value of the wrong type, a size out of range.
    pub fn parse(path: &str, text: &str) -> Result<HfConfig> {
        let bad = |reason: String| Error::ModelFile {
            path: path.to_string(),
            reason,
        };
        let fields = match serde_json::from_str(text) {
            Ok(Value::Object(fields)) => fields,
            Ok(other) => return Err(bad(format!("not a JSON object but {}", json_type(&other)))),
            Err(e) => return Err(bad(format!("not JSON: {e}"))),
        };
        let gpt2 = read_fields(&fields).map_err(&bad)?;
        check_sizes(&gpt2).map_err(&bad)?;
        gpt2.validate().map_err(|e| bad(e.to_string()))?;
        let config = HfConfig {
            gpt2,
            fields,
            dir: None,
        };
        config.check_supported().map_err(bad)?;
        Ok(config)
    }

    /// Refuses what would make wgrad compute another model than Hugging Face's.
    fn check_supported(&self) -> std::result::Result<(), String> {
        let f = &self.fields;
        if let Some(t) = typed(f, "model_type", Value::as_str, "a string")? {
            if t != "gpt2" {
                return Err(format!(
                    "model_type is `{t}`; wgrad loads `gpt2` models only"
                ));
            }
        }
        if let Some(act) = typed(f, "activation_function", Value::as_str, "a string")? {
            if !TANH_GELUS.contains(&act) {
                return Err(format!(
                    "activation_function `{act}` is not supported; wgrad computes the tanh \
                     GELU ({})",
                    TANH_GELUS.join(", ")
                ));
            }
        }
        if let Some(n_inner) = typed(f, "n_inner", Value::as_u64, "a whole number or null")? {
            if n_inner != 4 * self.gpt2.n_embd as u64 {
                return Err(format!(
                    "n_inner {n_inner} is not supported; wgrad's MLP is 4 * n_embd = {}",
                    4 * self.gpt2.n_embd
                ));
            }
        }
        let unsupported = [
            ("tie_word_embeddings", false, "wgrad ties lm_head to wte"),
            (
                "scale_attn_weights",
                false,
                "wgrad scales attention by 1/sqrt(D)",
            ),
            ("scale_attn_by_inverse_layer_idx", true, "not implemented"),
            ("reorder_and_upcast_attn", true, "not implemented"),
            ("add_cross_attention", true, "wgrad's GPT-2 is decoder-only"),
        ];
        for (field, value, why) in unsupported {
            if typed(f, field, Value::as_bool, "true or false")? == Some(value) {
                return Err(format!("{field}: {value} is not supported ({why})"));
            }
        }
        Ok(())
    }

    /// A field as read from the file.
    pub fn field(&self, key: &str) -> Option<&Value> {
        self.fields.get(key)
    }

    /// The directory the config was read from.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The shared tokenizer directory a preset names, resolved against the config's directory.
    pub fn tokenizer_dir(&self) -> Option<PathBuf> {
        let rel = self.fields.get(TOKENIZER_DIR_FIELD)?.as_str()?;
        Some(match &self.dir {
            Some(dir) => dir.join(rel),
            None => PathBuf::from(rel),
        })
    }

    /// config.json as Hugging Face's `from_pretrained` reads it: the fields read, the known ones
    /// set from `gpt2`, `model_type` and `architectures` set, the preset-only tokenizer pointer
    /// dropped (a saved directory holds its own tokenizer files). Keys sorted, as HF writes them.
    pub fn to_json(&self) -> String {
        let mut f = self.fields.clone();
        let g = &self.gpt2;
        f.remove(TOKENIZER_DIR_FIELD);
        f.insert("model_type".into(), "gpt2".into());
        f.insert("architectures".into(), Value::from(vec!["GPT2LMHeadModel"]));
        f.entry("activation_function")
            .or_insert_with(|| "gelu_new".into());
        f.insert("vocab_size".into(), g.vocab_size.into());
        f.insert("n_positions".into(), g.n_positions.into());
        if f.contains_key("n_ctx") {
            f.insert("n_ctx".into(), g.n_positions.into());
        }
        f.insert("n_embd".into(), g.n_embd.into());
        f.insert("n_layer".into(), g.n_layer.into());
        f.insert("n_head".into(), g.n_head.into());
        f.insert(
            "layer_norm_epsilon".into(),
            f32_to_json(g.layer_norm_epsilon),
        );
        f.insert("initializer_range".into(), f32_to_json(g.initializer_range));
        let mut text = serde_json::to_string_pretty(&Value::Object(f))
            .expect("a JSON map of JSON values always serializes");
        text.push('\n');
        text
    }
}

/// Layers at most: far beyond any GPT-2 (48), and each layer is 12 tensors the host lists.
const MAX_LAYERS: usize = 4096;
/// Parameters at most: 2^36, whose f32 weights alone (256 GiB) no adapter holds.
const MAX_PARAMETERS: u128 = 1 << 36;

/// What a JSON value is, for an error.
fn json_type(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// An optional field of the type `get` reads (`null` counts as absent), or an error naming
/// the field, what it holds and what it should.
fn typed<'a, T>(
    fields: &'a Map<String, Value>,
    key: &str,
    get: impl Fn(&'a Value) -> Option<T>,
    expected: &str,
) -> std::result::Result<Option<T>, String> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => get(v)
            .map(Some)
            .ok_or_else(|| format!("field `{key}` is {}; it must be {expected}", json_type(v))),
    }
}

/// A required size field: a whole number from 1 to u32::MAX (ids and positions are u32 on
/// the GPU).
fn size(fields: &Map<String, Value>, key: &str) -> std::result::Result<usize, String> {
    let n = typed(fields, key, Value::as_u64, "a whole number of at least 1")?
        .ok_or_else(|| format!("missing field `{key}` (a GPT-2 config.json gives it)"))?;
    if n == 0 {
        return Err(format!("field `{key}` is 0; it must be at least 1"));
    }
    if n > u32::MAX as u64 {
        return Err(format!(
            "field `{key}` is {n}, over {} (sizes are indexed with 32-bit integers on the GPU)",
            u32::MAX
        ));
    }
    Ok(n as usize)
}

/// An optional finite f32 field, positive (or, unless `positive`, zero too); its default when
/// absent.
fn float(
    fields: &Map<String, Value>,
    key: &str,
    default: f32,
    positive: bool,
) -> std::result::Result<f32, String> {
    let Some(x) = typed(fields, key, Value::as_f64, "a number")? else {
        return Ok(default);
    };
    let x32 = x as f32;
    let ok = x32.is_finite() && if positive { x32 > 0.0 } else { x32 >= 0.0 };
    if !ok {
        let want = if positive { "positive" } else { "0 or more" };
        return Err(format!(
            "field `{key}` is {x}; it must be a finite f32, {want}"
        ));
    }
    Ok(x32)
}

/// The fields wgrad's model reads, each checked for its type.
fn read_fields(fields: &Map<String, Value>) -> std::result::Result<Gpt2Config, String> {
    Ok(Gpt2Config {
        vocab_size: size(fields, "vocab_size")?,
        n_positions: size(fields, "n_positions")?,
        n_embd: size(fields, "n_embd")?,
        n_layer: size(fields, "n_layer")?,
        n_head: size(fields, "n_head")?,
        layer_norm_epsilon: float(fields, "layer_norm_epsilon", 1e-5, true)?,
        initializer_range: float(fields, "initializer_range", 0.02, false)?,
    })
}

/// Sizes that no model wgrad runs could have, whatever the adapter: a head size the attention
/// kernels do not take, more layers or parameters than any adapter holds. (Whether the model
/// fits this adapter's memory at a batch size is checked where the batch is known.)
fn check_sizes(g: &Gpt2Config) -> std::result::Result<(), String> {
    if !g.n_embd.is_multiple_of(g.n_head) {
        return Err(format!(
            "n_head {} does not divide n_embd {} (fields `n_head`, `n_embd`)",
            g.n_head, g.n_embd
        ));
    }
    let head = g.n_embd / g.n_head;
    if head > MAX_HEAD_DIM {
        return Err(format!(
            "fields `n_embd` / `n_head`: a head size of {} / {} = {head} is over {MAX_HEAD_DIM}, \
             the largest the attention kernels take (use more heads)",
            g.n_embd, g.n_head
        ));
    }
    if g.n_layer > MAX_LAYERS {
        return Err(format!(
            "field `n_layer` is {}, over {MAX_LAYERS} layers",
            g.n_layer
        ));
    }
    let (v, p, c, l) = (
        g.vocab_size as u128,
        g.n_positions as u128,
        g.n_embd as u128,
        g.n_layer as u128,
    );
    let params = (v + p) * c + l * (12 * c * c + 13 * c) + 2 * c;
    if params > MAX_PARAMETERS {
        return Err(format!(
            "fields `vocab_size` {v}, `n_positions` {p}, `n_embd` {c}, `n_layer` {l} make \
             {params} parameters, over {MAX_PARAMETERS} (2^36, whose f32 weights alone no \
             adapter holds)"
        ));
    }
    Ok(())
}

/// An f32 as the shortest decimal that reads back as it (1e-5, not 9.999999747378752e-6).
fn f32_to_json(x: f32) -> Value {
    let shortest: f64 = x
        .to_string()
        .parse()
        .expect("an f32's Display output parses as f64");
    serde_json::Number::from_f64(shortest).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A built-in preset's config (the presets' own test is in `crate::assets`).
    fn preset(name: &str) -> HfConfig {
        let preset = crate::assets::Preset::named(name).expect("a preset");
        preset.config().expect("reading a preset")
    }

    #[test]
    fn to_json_keeps_unknown_fields_and_writes_hf_ones() {
        let mut c = preset("distilgpt2");
        c.gpt2.n_layer = 3;
        let v: Value = serde_json::from_str(&c.to_json()).expect("valid JSON");
        assert_eq!(v["n_layer"], 3);
        assert_eq!(v["bos_token_id"], 50256, "unknown fields are kept");
        assert_eq!(v["model_type"], "gpt2");
        assert_eq!(v["architectures"][0], "GPT2LMHeadModel");
        assert!(v.get(TOKENIZER_DIR_FIELD).is_none());
        // The shortest decimal of the f32, not the f64 widening of it (9.999999747378752e-6).
        assert_eq!(v["layer_norm_epsilon"].as_f64(), Some(1e-5));
        let back = HfConfig::parse("re-read", &c.to_json()).expect("re-reading");
        assert_eq!(back.gpt2, c.gpt2);
    }

    #[test]
    fn unsupported_configs_are_errors_naming_the_field() {
        let base = preset("tiny").to_json();
        let cases = [
            (
                "\"activation_function\": \"gelu_new\"",
                "\"activation_function\": \"relu\"",
                "relu",
            ),
            ("\"n_head\": 4", "\"n_head\": 3", "n_head 3"),
            (
                "\"model_type\": \"gpt2\"",
                "\"model_type\": \"llama\"",
                "llama",
            ),
            ("\"n_inner\": null", "\"n_inner\": 100", "n_inner 100"),
            ("\"n_embd\": 128,", "", "missing field `n_embd`"),
        ];
        for (from, to, needle) in cases {
            let text = base.replace(from, to);
            assert_ne!(text, base, "{from} is in the preset");
            let err = HfConfig::parse("cfg.json", &text)
                .expect_err(needle)
                .to_string();
            assert!(err.contains("cfg.json") && err.contains(needle), "{err}");
        }
        let untied = base.replacen('{', "{\"tie_word_embeddings\": false,", 1);
        let err = HfConfig::parse("cfg.json", &untied).expect_err("untied");
        assert!(err.to_string().contains("tie_word_embeddings"), "{err}");
    }
}
