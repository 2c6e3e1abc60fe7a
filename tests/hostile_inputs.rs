//! Hostile input, by class: a few hundred mutated config.json files and safetensors headers
//! through the library's checks (no GPU), each an error naming the file (and the field, where
//! the fault is one) and never a panic; then the binary on the flags and files that used to
//! panic, abort, hang or pass silently, each an exit code of 1 or 2 with the reason on stderr.

mod common;

use common::Scratch;

use std::panic::{catch_unwind, AssertUnwindSafe};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use wgrad::model::{check_weights, HfConfig};
use wgrad::nn::ModelConfig;

/// `f`'s result, or the panic's message as an error of its own kind.
fn no_panic<T>(f: impl FnOnce() -> wgrad::Result<T>) -> Result<wgrad::Result<T>, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

// ---- config.json -------------------------------------------------------------------------

/// A small GPT-2 config.json with fields wgrad does not read (kept on save).
fn base_config() -> Map<String, Value> {
    let v = json!({
        "vocab_size": 50, "n_positions": 8, "n_embd": 16, "n_layer": 2, "n_head": 2,
        "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "n_ctx": 8, "n_inner": null,
        "activation_function": "gelu_new", "model_type": "gpt2", "tie_word_embeddings": true,
        "scale_attn_weights": true, "bos_token_id": 50256,
        "custom_field": {"nested": [1, 2]}
    });
    v.as_object().expect("an object").clone()
}

/// The base config's text with `field` set to the raw JSON `value` (None: removed).
fn with_field(field: &str, value: Option<&str>) -> String {
    let mut c = base_config();
    match value {
        None => {
            c.remove(field);
            serde_json::to_string_pretty(&c).expect("serializes")
        }
        Some(raw) => {
            c.insert(field.into(), "@@".into());
            let text = serde_json::to_string_pretty(&c).expect("serializes");
            text.replace("\"@@\"", raw)
        }
    }
}

#[test]
fn mutated_config_fields_are_errors_naming_the_field_and_file() {
    let base = serde_json::to_string(&base_config()).expect("serializes");
    let config = HfConfig::parse("cfg.json", &base).expect("the base config is valid");
    let saved: Value = serde_json::from_str(&config.to_json()).expect("JSON");
    assert_eq!(
        saved["custom_field"]["nested"][1], 2,
        "unknown fields round-trip"
    );

    let sizes = ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head"];
    let bad_sizes = [
        "-1",
        "0",
        "\"2\"",
        "2.5",
        "1e9",
        "2.0",
        "true",
        "[]",
        "{}",
        "null",
        "4294967296",
        "1000000000000",
        "18446744073709551615",
        "-9223372036854775808",
    ];
    // (field, raw JSON value or None to remove it, what the error must name besides the file)
    let mut cases: Vec<(&str, Option<&str>, &str)> = Vec::new();
    for field in sizes {
        cases.push((field, None, field));
        for v in bad_sizes {
            cases.push((field, Some(v), field));
        }
    }
    for field in ["layer_norm_epsilon", "initializer_range"] {
        for v in ["-1", "\"1e-5\"", "true", "[]", "{}", "1e300", "-1e-30"] {
            cases.push((field, Some(v), field));
        }
    }
    cases.push(("layer_norm_epsilon", Some("0"), "layer_norm_epsilon"));
    for v in ["1", "true", "[]", "\"llama\"", "\"GPT2\""] {
        cases.push(("model_type", Some(v), "model_type"));
    }
    for v in ["1", "false", "{}", "\"relu\"", "\"gelu\""] {
        cases.push(("activation_function", Some(v), "activation_function"));
    }
    for v in ["\"64\"", "-1", "2.5", "0", "true"] {
        cases.push(("n_inner", Some(v), "n_inner"));
    }
    for (field, values) in [
        ("tie_word_embeddings", &["false", "\"true\"", "0", "[]"][..]),
        ("scale_attn_weights", &["false", "\"no\"", "1"]),
        (
            "scale_attn_by_inverse_layer_idx",
            &["true", "\"false\"", "1"],
        ),
        ("reorder_and_upcast_attn", &["true", "2"]),
        ("add_cross_attention", &["true", "\"x\""]),
    ] {
        for v in values {
            cases.push((field, Some(v), field));
        }
    }
    let mut failures = Vec::new();
    let mut checked = 0;
    for (field, value, needle) in &cases {
        let text = with_field(field, *value);
        checked += 1;
        match no_panic(|| HfConfig::parse("cfg.json", &text)) {
            Err(panic) => failures.push(format!("{field} = {value:?}: panicked: {panic}")),
            Ok(Ok(_)) => failures.push(format!("{field} = {value:?}: accepted")),
            Ok(Err(e)) => {
                let e = e.to_string();
                if !(e.starts_with("cfg.json: ") && e.contains(needle)) {
                    failures.push(format!("{field} = {value:?}: `{e}` names no `{needle}`"));
                }
            }
        }
    }
    // Sizes each valid alone and nonsense together.
    let combos: [(&[(&str, u64)], &str); 6] = [
        (&[("n_head", 3)], "n_head"),
        (&[("n_embd", 100), ("n_head", 3)], "n_head"),
        (&[("n_layer", 5000)], "n_layer"),
        (&[("n_layer", 1_000_000)], "n_layer"),
        (
            &[("vocab_size", 4_294_967_295), ("n_embd", 128)],
            "vocab_size",
        ),
        (
            &[("n_positions", 1_000_000_000), ("n_embd", 128)],
            "n_positions",
        ),
    ];
    for (fields, needle) in combos {
        let mut c = base_config();
        for (k, v) in fields {
            c.insert(k.to_string(), (*v).into());
        }
        if fields.iter().any(|(k, _)| *k == "n_embd") && !fields.iter().any(|(k, _)| *k == "n_head")
        {
            c.insert("n_head".into(), 1.into());
        }
        let text = serde_json::to_string(&c).expect("serializes");
        checked += 1;
        match no_panic(|| HfConfig::parse("cfg.json", &text)) {
            Ok(Err(e)) if e.to_string().contains(needle) => {}
            other => failures.push(format!("{fields:?}: {:?}", other.map(|r| r.map(drop)))),
        }
    }
    for text in [
        "",
        "{",
        "[]",
        "null",
        "\"x\"",
        "{\"vocab_size\": 1e400}",
        "{} {}",
    ] {
        checked += 1;
        match no_panic(|| HfConfig::parse("cfg.json", text)) {
            Ok(Err(e)) if e.to_string().starts_with("cfg.json: ") => {}
            other => failures.push(format!("{text:?}: {:?}", other.map(|r| r.map(drop)))),
        }
    }
    // Random edits of the text: a byte replaced, removed or the text cut; any may still parse,
    // none may panic, every error names the file.
    const ALPHABET: &[u8] = b"0-9e.\"{}[],: x";
    let mut rng = StdRng::seed_from_u64(42);
    let bytes = with_field("n_layer", Some("2")).into_bytes();
    for i in 0..200 {
        let mut b = bytes.clone();
        let at = rng.random_range(0..b.len());
        match i % 3 {
            0 => b[at] = ALPHABET[rng.random_range(0..ALPHABET.len())],
            1 => drop(b.remove(at)),
            _ => b.truncate(at),
        }
        let text = String::from_utf8_lossy(&b).into_owned();
        checked += 1;
        match no_panic(|| HfConfig::parse("cfg.json", &text)) {
            Err(panic) => failures.push(format!("{text}: panicked: {panic}")),
            Ok(Err(e)) if !e.to_string().starts_with("cfg.json: ") => {
                failures.push(format!("`{e}` names no file"))
            }
            Ok(_) => {}
        }
    }
    assert!(checked > 300, "{checked} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---- safetensors headers -----------------------------------------------------------------

/// The micro model whose weights the mutated files hold.
fn micro() -> ModelConfig {
    ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.02,
        ..ModelConfig::gpt2(50, 8, 16, 1, 2)
    }
}

/// A header (name -> {dtype, shape, data_offsets}, and `__metadata__`) and its data.
struct StFile {
    header: Map<String, Value>,
    data: Vec<u8>,
}

impl StFile {
    /// `micro()`'s weights as f32, in name order.
    fn valid() -> StFile {
        let mut specs = micro().param_specs();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let mut header = Map::new();
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut data = Vec::new();
        for s in specs {
            let n: usize = s.shape.iter().product();
            let start = data.len();
            data.extend((0..n).flat_map(|i| (i as f32 * 0.01).to_le_bytes()));
            let entry =
                json!({"dtype": "F32", "shape": s.shape, "data_offsets": [start, data.len()]});
            header.insert(s.name, entry);
        }
        StFile { header, data }
    }

    fn names(&self) -> Vec<String> {
        self.header
            .keys()
            .filter(|k| *k != "__metadata__")
            .cloned()
            .collect()
    }

    /// The file: the header's length, the header, the data.
    fn bytes_with(&self, header_text: &str) -> Vec<u8> {
        let mut out = (header_text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header_text.as_bytes());
        out.extend_from_slice(&self.data);
        out
    }

    fn bytes(&self) -> Vec<u8> {
        self.bytes_with(&serde_json::to_string(&self.header).expect("serializes"))
    }

    /// Appends a tensor's entry and `n` f32 of data.
    fn append(&mut self, name: &str, shape: &[usize], value: f32) {
        let n: usize = shape.iter().product();
        let start = self.data.len();
        self.data.extend((0..n).flat_map(|_| value.to_le_bytes()));
        let entry =
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, self.data.len()]});
        self.header.insert(name.into(), entry);
    }
}

/// Every way one tensor's entry can be wrong, as a file.
fn tensor_mutations(name: &str) -> Vec<(String, Vec<u8>)> {
    let base = StFile::valid();
    let entry = base.header[name].clone();
    let shape: Vec<u64> = serde_json::from_value(entry["shape"].clone()).expect("a shape");
    let (s, e) = (
        entry["data_offsets"][0].as_u64().expect("offset"),
        entry["data_offsets"][1].as_u64().expect("offset"),
    );
    let numel: u64 = shape.iter().product();
    let reshaped = if shape.len() == 2 {
        json!([numel])
    } else {
        json!([2, numel / 2])
    };
    let edits: Vec<(&str, &str, Value)> = vec![
        ("dtype I32", "dtype", json!("I32")),
        ("dtype F16", "dtype", json!("F16")),
        ("dtype F64", "dtype", json!("F64")),
        ("dtype unknown", "dtype", json!("XX")),
        ("dtype a number", "dtype", json!(7)),
        ("dtype null", "dtype", Value::Null),
        ("shape []", "shape", json!([])),
        ("shape with a 1 more", "shape", {
            let mut v = shape.clone();
            v.push(1);
            json!(v)
        }),
        ("shape reshaped", "shape", reshaped),
        (
            "shape overflowing",
            "shape",
            json!([1u64 << 40, 1u64 << 40]),
        ),
        ("shape negative", "shape", json!([-1])),
        ("shape of strings", "shape", json!(["16"])),
        ("offsets short", "data_offsets", json!([s, e - 4])),
        ("offsets shifted", "data_offsets", json!([s + 4, e + 4])),
        ("offsets reversed", "data_offsets", json!([e, s])),
        ("offsets past the end", "data_offsets", json!([s, u64::MAX])),
        ("offsets one", "data_offsets", json!([s])),
        ("offsets negative", "data_offsets", json!([-1, e])),
    ];
    let mut out = Vec::new();
    for (what, key, value) in edits {
        let mut f = StFile::valid();
        f.header[name][key] = value;
        out.push((format!("{name}: {what}"), f.bytes()));
    }
    let mut f = StFile::valid();
    let entry = f.header.remove(name).expect("present");
    out.push((format!("{name}: removed"), f.bytes()));
    f.header.insert("h.0.attn.unexpected".into(), entry);
    out.push((format!("{name}: renamed"), f.bytes()));
    // The same name twice in the header text (JSON keeps the last one).
    let f = StFile::valid();
    let text = serde_json::to_string(&f.header).expect("serializes");
    let twice = format!(
        "{},{:?}:{}}}",
        &text[..text.len() - 1],
        name,
        f.header[name]
    );
    out.push((format!("{name}: named twice"), f.bytes_with(&twice)));
    // Present again under the `transformer.` prefix (a second tensor of the same parameter).
    let mut f = StFile::valid();
    f.append(&format!("transformer.{name}"), &[numel as usize], 0.5);
    f.header[format!("transformer.{name}").as_str()]["shape"] = json!(shape);
    out.push((format!("{name}: twice with the prefix"), f.bytes()));
    out
}

/// Faults of the whole file: lengths, encodings, metadata, a head that is not tied.
fn file_mutations() -> Vec<(String, Vec<u8>)> {
    let f = StFile::valid();
    let good = f.bytes();
    let header_len = u64::from_le_bytes(good[..8].try_into().expect("8 bytes"));
    let mut out = Vec::new();
    for len in [
        0,
        1,
        7,
        header_len - 1,
        header_len + 1,
        good.len() as u64,
        100_000_001,
        1 << 63,
        u64::MAX,
    ] {
        let mut b = good.clone();
        b[..8].copy_from_slice(&len.to_le_bytes());
        out.push((format!("header length {len}"), b));
    }
    out.push(("data cut by a byte".into(), good[..good.len() - 1].to_vec()));
    out.push(("data cut in half".into(), good[..good.len() / 2].to_vec()));
    out.push(("a byte more".into(), [&good[..], &[0]].concat()));
    out.push(("7 bytes".into(), good[..7].to_vec()));
    out.push(("empty".into(), Vec::new()));
    let mut b = good.clone();
    b[9] = 0xff;
    out.push(("header not UTF-8".into(), b));
    for text in ["[]", "null", "{}", "{\"a\":", "\"x\""] {
        out.push((format!("header {text}"), f.bytes_with(text)));
    }
    for meta in [json!(1), json!({"format": 1}), json!([])] {
        let mut m = StFile::valid();
        m.header.insert("__metadata__".into(), meta.clone());
        out.push((format!("metadata {meta}"), m.bytes()));
    }
    let mut head = StFile::valid();
    head.append("lm_head.weight", &[50, 16], 3.0);
    out.push(("lm_head not wte's copy".into(), head.bytes()));
    let mut extra = StFile::valid();
    extra.append("h.1.ln_1.weight", &[16], 1.0);
    out.push(("a layer more".into(), extra.bytes()));
    out
}

#[test]
fn mutated_safetensors_headers_are_errors_naming_the_file() {
    let scratch = Scratch::new("st");
    let config = micro();
    let path = scratch.0.join("model.safetensors");
    std::fs::write(&path, StFile::valid().bytes()).expect("writing");
    check_weights(&path, &config).expect("the unmutated file matches the config");

    let mut cases = file_mutations();
    for name in StFile::valid().names() {
        cases.extend(tensor_mutations(&name));
    }
    let shown = path.display().to_string();
    let mut failures = Vec::new();
    for (what, bytes) in &cases {
        std::fs::write(&path, bytes).expect("writing");
        match no_panic(|| check_weights(&path, &config)) {
            Err(panic) => failures.push(format!("{what}: panicked: {panic}")),
            Ok(Ok(())) => failures.push(format!("{what}: accepted")),
            Ok(Err(e)) if !e.to_string().starts_with(&shown) => {
                failures.push(format!("{what}: `{e}` names no file"))
            }
            Ok(Err(_)) => {}
        }
    }
    // Random bytes of the header replaced: any may still load, none may panic.
    let good = StFile::valid().bytes();
    let header_end = 8 + u64::from_le_bytes(good[..8].try_into().expect("8 bytes")) as usize;
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..150 {
        let mut b = good.clone();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..header_end);
            b[at] = rng.random();
        }
        std::fs::write(&path, &b).expect("writing");
        if let Err(panic) = no_panic(|| check_weights(&path, &config)) {
            failures.push(format!("random bytes: panicked: {panic}"));
        }
    }
    // Not a regular file: refused without opening it (a FIFO would block the read).
    std::fs::remove_file(&path).expect("removing");
    std::fs::create_dir(&path).expect("a directory in its place");
    match check_weights(&path, &config) {
        Err(e) if e.to_string().contains("is a directory") => {}
        other => failures.push(format!("a directory: {other:?}")),
    }
    assert!(cases.len() > 300, "{} cases", cases.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[cfg(unix)]
#[path = "hostile/cli.rs"]
mod cli;
