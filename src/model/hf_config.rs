//! A Hugging Face config.json (GPT-2, Llama, Qwen2, Qwen3; as transformers 4.x and 5.x write
//! it): the fields wgrad's model reads (`ModelConfig`), every other field kept as read so that
//! a saved model keeps them, and the checks that refuse a config whose model wgrad would
//! compute differently (another activation, a rope scaling, a sliding window, ...), each
//! naming its field, before any weight is read.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::model::input_file::read_regular;
use crate::nn::{Family, ModelConfig};

/// The field of a wgrad preset naming its shared tokenizer directory (relative to the preset).
pub const TOKENIZER_DIR_FIELD: &str = "wgrad_tokenizer_dir";

/// The GELU variants that are the tanh approximation wgrad computes.
const TANH_GELUS: [&str; 3] = ["gelu_new", "gelu_pytorch_tanh", "gelu_fast"];

#[derive(Clone, Debug)]
pub struct HfConfig {
    pub model: ModelConfig,
    /// Every field as read, known ones included; `to_json` overwrites the known ones.
    fields: Map<String, Value>,
    /// The directory the file was read from (None when built in code).
    dir: Option<PathBuf>,
}

impl HfConfig {
    /// A config with only the fields wgrad knows.
    pub fn new(model: ModelConfig) -> HfConfig {
        HfConfig {
            model,
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
        let model = read_fields(&fields).map_err(&bad)?;
        check_sizes(&model).map_err(&bad)?;
        model.validate().map_err(|e| bad(e.to_string()))?;
        Ok(HfConfig {
            model,
            fields,
            dir: None,
        })
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
    /// set from `model`, `model_type` and `architectures` set, the preset-only tokenizer pointer
    /// dropped (a saved directory holds its own tokenizer files). Keys sorted, as HF writes them.
    pub fn to_json(&self) -> String {
        let mut f = self.fields.clone();
        let g = &self.model;
        f.remove(TOKENIZER_DIR_FIELD);
        f.insert("model_type".into(), g.family.model_type().into());
        f.insert(
            "architectures".into(),
            Value::from(vec![g.family.architecture()]),
        );
        // The weights are saved f32: a loader that follows the declared dtype (transformers
        // 5.x's default) must not round them to a hub checkpoint's bf16.
        for key in ["torch_dtype", "dtype"] {
            if f.contains_key(key) {
                f.insert(key.into(), "float32".into());
            }
        }
        f.insert("vocab_size".into(), g.vocab_size.into());
        f.insert("initializer_range".into(), f32_to_json(g.initializer_range));
        if g.family == Family::Gpt2 {
            gpt2_fields(&mut f, g);
        } else {
            llama_fields(&mut f, g);
        }
        let mut text = serde_json::to_string_pretty(&Value::Object(f))
            .expect("a JSON map of JSON values always serializes");
        text.push('\n');
        text
    }
}

fn gpt2_fields(f: &mut Map<String, Value>, g: &ModelConfig) {
    f.entry("activation_function")
        .or_insert_with(|| "gelu_new".into());
    f.insert("n_positions".into(), g.n_positions.into());
    if f.contains_key("n_ctx") {
        f.insert("n_ctx".into(), g.n_positions.into());
    }
    f.insert("n_embd".into(), g.n_embd.into());
    f.insert("n_layer".into(), g.n_layer.into());
    f.insert("n_head".into(), g.n_head.into());
    if g.n_inner != 4 * g.n_embd || f.get("n_inner").is_some_and(|v| !v.is_null()) {
        f.insert("n_inner".into(), g.n_inner.into());
    }
    f.insert(
        "layer_norm_epsilon".into(),
        f32_to_json(g.layer_norm_epsilon),
    );
}

fn llama_fields(f: &mut Map<String, Value>, g: &ModelConfig) {
    f.entry("hidden_act").or_insert_with(|| "silu".into());
    f.insert("hidden_size".into(), g.n_embd.into());
    f.insert("intermediate_size".into(), g.n_inner.into());
    f.insert("num_hidden_layers".into(), g.n_layer.into());
    f.insert("num_attention_heads".into(), g.n_head.into());
    f.insert("num_key_value_heads".into(), g.n_kv_head.into());
    f.insert("head_dim".into(), g.head_dim.into());
    f.insert("max_position_embeddings".into(), g.n_positions.into());
    f.insert("rms_norm_eps".into(), f32_to_json(g.layer_norm_epsilon));
    f.insert("tie_word_embeddings".into(), g.tie_word_embeddings.into());
    let theta = serde_json::Number::from_f64(g.rope_theta).map_or(Value::Null, Value::Number);
    match f.get_mut("rope_parameters").and_then(Value::as_object_mut) {
        // transformers 5.x's place for it.
        Some(p) => {
            p.insert("rope_theta".into(), theta);
            p.entry("rope_type").or_insert_with(|| "default".into());
        }
        None => {
            f.insert("rope_theta".into(), theta);
        }
    }
    match g.family {
        Family::Qwen2 => {
            f.insert("use_sliding_window".into(), false.into());
        }
        Family::Llama => {
            f.insert("attention_bias".into(), g.qkv_bias.into());
            f.insert("mlp_bias".into(), g.mlp_bias.into());
        }
        _ => {
            f.insert("attention_bias".into(), g.qkv_bias.into());
        }
    }
}

/// Layers at most: far beyond any model wgrad trains (GPT-2 XL has 48), and each layer is a
/// dozen tensors the host lists.
const MAX_LAYERS: usize = 4096;
/// Parameters at most: 2^36, whose f32 weights alone (256 GiB) no adapter holds.
const MAX_PARAMETERS: u128 = 1 << 36;
/// The activations whose MLP is SwiGLU's silu(gate) * up.
const SILUS: [&str; 2] = ["silu", "swish"];

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

/// An optional size field: a whole number from 1 to u32::MAX (ids and positions are u32 on
/// the GPU).
fn size_or(
    fields: &Map<String, Value>,
    key: &str,
    default: Option<usize>,
    family: Family,
) -> std::result::Result<usize, String> {
    let Some(n) = typed(fields, key, Value::as_u64, "a whole number of at least 1")? else {
        return default.ok_or_else(|| match family {
            Family::Gpt2 => format!("missing field `{key}` (a GPT-2 config.json gives it)"),
            _ => format!(
                "missing field `{key}` (a config.json of model_type `{}` gives it)",
                family.model_type()
            ),
        });
    };
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

/// A required size field.
fn size(
    fields: &Map<String, Value>,
    key: &str,
    family: Family,
) -> std::result::Result<usize, String> {
    size_or(fields, key, None, family)
}

/// An optional finite float field, positive (or, unless `positive`, zero too); its default
/// when absent.
fn float64(
    fields: &Map<String, Value>,
    key: &str,
    default: f64,
    positive: bool,
) -> std::result::Result<f64, String> {
    let Some(x) = typed(fields, key, Value::as_f64, "a number")? else {
        return Ok(default);
    };
    let ok = (x as f32).is_finite() && if positive { x > 0.0 } else { x >= 0.0 };
    if !ok {
        let want = if positive { "positive" } else { "0 or more" };
        return Err(format!(
            "field `{key}` is {x}; it must be a finite f32, {want}"
        ));
    }
    Ok(x)
}

/// `float64` as an f32.
fn float(
    fields: &Map<String, Value>,
    key: &str,
    default: f32,
    positive: bool,
) -> std::result::Result<f32, String> {
    float64(fields, key, default as f64, positive).map(|x| x as f32)
}

fn flag(
    fields: &Map<String, Value>,
    key: &str,
    default: bool,
) -> std::result::Result<bool, String> {
    Ok(typed(fields, key, Value::as_bool, "true or false")?.unwrap_or(default))
}

/// The family config.json describes: `model_type`, else the first of `architectures`, else
/// GPT-2 (older GPT-2 files give neither).
fn family_of(fields: &Map<String, Value>) -> std::result::Result<Family, String> {
    let known = || {
        Family::ALL
            .iter()
            .map(|f| f.model_type())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(t) = typed(fields, "model_type", Value::as_str, "a string")? {
        return Family::from_model_type(t).ok_or_else(|| {
            format!(
                "model_type is `{t}`; wgrad trains these model types: {}",
                known()
            )
        });
    }
    let first = typed(
        fields,
        "architectures",
        Value::as_array,
        "an array of class names",
    )?
    .and_then(|a| a.first())
    .and_then(Value::as_str);
    match first {
        Some(a) => Family::from_architecture(a).ok_or_else(|| {
            format!(
                "architectures names `{a}`, and there is no model_type; wgrad trains these \
                 model types: {}",
                known()
            )
        }),
        None => Ok(Family::Gpt2),
    }
}

/// The fields wgrad's model reads, each checked for its type.
fn read_fields(fields: &Map<String, Value>) -> std::result::Result<ModelConfig, String> {
    let family = family_of(fields)?;
    if family == Family::Gpt2 {
        return read_gpt2(fields);
    }
    read_llama(fields, family)
}

fn read_gpt2(fields: &Map<String, Value>) -> std::result::Result<ModelConfig, String> {
    let g = Family::Gpt2;
    let n_embd = size(fields, "n_embd", g)?;
    let n_head = size(fields, "n_head", g)?;
    let mut c = ModelConfig::gpt2(
        size(fields, "vocab_size", g)?,
        size(fields, "n_positions", g)?,
        n_embd,
        size(fields, "n_layer", g)?,
        n_head,
    );
    if !n_embd.is_multiple_of(n_head) {
        return Err(format!(
            "n_head {n_head} does not divide n_embd {n_embd} (fields `n_head`, `n_embd`)"
        ));
    }
    c.n_inner = size_or(fields, "n_inner", Some(4 * n_embd), g)?;
    c.layer_norm_epsilon = float(fields, "layer_norm_epsilon", 1e-5, true)?;
    c.initializer_range = float(fields, "initializer_range", 0.02, false)?;
    if let Some(act) = typed(fields, "activation_function", Value::as_str, "a string")? {
        if !TANH_GELUS.contains(&act) {
            return Err(format!(
                "activation_function `{act}` is not supported; wgrad computes the tanh \
                 GELU ({})",
                TANH_GELUS.join(", ")
            ));
        }
    }
    let unsupported = [
        (
            "tie_word_embeddings",
            false,
            "wgrad ties GPT-2's lm_head to wte",
        ),
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
        if typed(fields, field, Value::as_bool, "true or false")? == Some(value) {
            return Err(format!("{field}: {value} is not supported ({why})"));
        }
    }
    Ok(c)
}

/// rope_theta where transformers 4.x writes it (top level, with `rope_scaling`) or 5.x does
/// (`rope_parameters`); any scaling but the default is refused.
fn read_rope(fields: &Map<String, Value>) -> std::result::Result<f64, String> {
    let mut theta = float64(fields, "rope_theta", 10000.0, true)?;
    for key in ["rope_scaling", "rope_parameters"] {
        let Some(p) = typed(fields, key, Value::as_object, "an object")? else {
            continue;
        };
        let kind = typed(p, "rope_type", Value::as_str, "a string")?
            .or(typed(p, "type", Value::as_str, "a string")?)
            .unwrap_or("default");
        if kind != "default" {
            return Err(format!(
                "field `{key}` asks for rope type `{kind}`; wgrad implements the default \
                 rotary embedding only"
            ));
        }
        if p.contains_key("rope_theta") {
            theta =
                float64(p, "rope_theta", theta, true).map_err(|e| format!("{e} (in `{key}`)"))?;
        }
    }
    Ok(theta)
}

fn read_llama(
    fields: &Map<String, Value>,
    family: Family,
) -> std::result::Result<ModelConfig, String> {
    let n_embd = size(fields, "hidden_size", family)?;
    let n_head = size(fields, "num_attention_heads", family)?;
    let n_kv_head = size_or(fields, "num_key_value_heads", Some(n_head), family)?;
    if !n_head.is_multiple_of(n_kv_head) {
        return Err(format!(
            "num_key_value_heads {n_kv_head} does not divide num_attention_heads {n_head} \
             (each key/value head serves a whole group of query heads)"
        ));
    }
    let head_dim = match typed(fields, "head_dim", Value::as_u64, "a whole number")? {
        Some(_) => size(fields, "head_dim", family)?,
        None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
        None => {
            return Err(format!(
                "num_attention_heads {n_head} does not divide hidden_size {n_embd}, and no \
                 head_dim is given"
            ))
        }
    };
    if !head_dim.is_multiple_of(2) {
        return Err(format!(
            "head_dim {head_dim} is odd; rotary embeddings rotate pairs of dimensions"
        ));
    }
    let act = typed(fields, "hidden_act", Value::as_str, "a string")?.unwrap_or("silu");
    if !SILUS.contains(&act) {
        return Err(format!(
            "hidden_act `{act}` is not supported; wgrad's {} MLP is SwiGLU with silu",
            family.model_type()
        ));
    }
    if flag(fields, "use_sliding_window", false)? {
        return Err(
            "use_sliding_window: true is not supported (wgrad's attention is causal \
                    over the whole sequence)"
                .into(),
        );
    }
    let attention_bias = flag(fields, "attention_bias", false)?;
    Ok(ModelConfig {
        family,
        vocab_size: size(fields, "vocab_size", family)?,
        n_positions: size_or(fields, "max_position_embeddings", Some(2048), family)?,
        n_embd,
        n_layer: size(fields, "num_hidden_layers", family)?,
        n_head,
        n_kv_head,
        head_dim,
        n_inner: size(fields, "intermediate_size", family)?,
        layer_norm_epsilon: float(fields, "rms_norm_eps", 1e-6, true)?,
        initializer_range: float(fields, "initializer_range", 0.02, false)?,
        rope_theta: read_rope(fields)?,
        tie_word_embeddings: flag(fields, "tie_word_embeddings", false)?,
        // Qwen2's q, k and v always have biases and its o_proj none.
        qkv_bias: family == Family::Qwen2 || attention_bias,
        o_bias: family != Family::Qwen2 && attention_bias,
        mlp_bias: family == Family::Llama && flag(fields, "mlp_bias", false)?,
    })
}

/// Sizes that no model wgrad runs could have, whatever the adapter: more layers or parameters
/// than any adapter holds. (Whether the model fits this adapter's memory at a batch size is
/// checked where the batch is known.)
fn check_sizes(g: &ModelConfig) -> std::result::Result<(), String> {
    if g.n_layer > MAX_LAYERS {
        return Err(format!(
            "field `{}` is {}, over {MAX_LAYERS} layers",
            if g.family.is_llama() {
                "num_hidden_layers"
            } else {
                "n_layer"
            },
            g.n_layer
        ));
    }
    let params = g.parameter_count();
    if params > MAX_PARAMETERS {
        let fields = match g.family {
            Family::Gpt2 => format!(
                "`vocab_size` {}, `n_positions` {}, `n_embd` {}, `n_inner` {}, `n_layer` {}",
                g.vocab_size, g.n_positions, g.n_embd, g.n_inner, g.n_layer
            ),
            _ => format!(
                "`vocab_size` {}, `hidden_size` {}, `intermediate_size` {}, \
                 `num_attention_heads` {} x `head_dim` {}, `num_hidden_layers` {}",
                g.vocab_size, g.n_embd, g.n_inner, g.n_head, g.head_dim, g.n_layer
            ),
        };
        return Err(format!(
            "fields {fields} make {params} parameters, over {MAX_PARAMETERS} (2^36, whose f32 \
             weights alone no adapter holds)"
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
#[path = "hf_config_tests.rs"]
mod tests;
