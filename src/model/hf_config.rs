//! A Hugging Face GPT-2 config.json: the fields wgrad's model reads (`Gpt2Config`), every other
//! field kept as read so that a saved model keeps them, and the checks that refuse a config
//! whose model wgrad would compute differently (another activation, untied embeddings, ...).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};
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
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = HfConfig::parse(&path.display().to_string(), &text)?;
        config.dir = path.parent().map(Path::to_path_buf);
        Ok(config)
    }

    /// Parses and checks config.json text; `path` names it in errors.
    pub fn parse(path: &str, text: &str) -> Result<HfConfig> {
        let bad = |reason: String| Error::ModelFile {
            path: path.to_string(),
            reason,
        };
        let fields: Map<String, Value> =
            serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        let gpt2: Gpt2Config = serde_json::from_value(Value::Object(fields.clone()))
            .map_err(|e| bad(format!("not a GPT-2 config: {e}")))?;
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
        let str_field = |k: &str| self.fields.get(k).and_then(Value::as_str);
        let bool_field = |k: &str| self.fields.get(k).and_then(Value::as_bool);
        if let Some(t) = str_field("model_type") {
            if t != "gpt2" {
                return Err(format!(
                    "model_type is `{t}`; wgrad loads `gpt2` models only"
                ));
            }
        }
        if let Some(act) = str_field("activation_function") {
            if !TANH_GELUS.contains(&act) {
                return Err(format!(
                    "activation_function `{act}` is not supported; wgrad computes the tanh \
                     GELU ({})",
                    TANH_GELUS.join(", ")
                ));
            }
        }
        if let Some(n_inner) = self.fields.get("n_inner").and_then(Value::as_u64) {
            if n_inner as usize != 4 * self.gpt2.n_embd {
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
            if bool_field(field) == Some(value) {
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
