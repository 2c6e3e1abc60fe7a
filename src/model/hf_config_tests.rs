//! Tests of config.json reading and writing (`hf_config.rs`).

use super::*;

/// A built-in preset's config (the presets' own test is in `crate::assets`).
fn preset(name: &str) -> HfConfig {
    let preset = crate::assets::Preset::named(name).expect("a preset");
    preset.config().expect("reading a preset")
}

#[test]
fn to_json_keeps_unknown_fields_and_writes_hf_ones() {
    let mut c = preset("distilgpt2");
    c.model.n_layer = 3;
    let v: Value = serde_json::from_str(&c.to_json()).expect("valid JSON");
    assert_eq!(v["n_layer"], 3);
    assert_eq!(v["bos_token_id"], 50256, "unknown fields are kept");
    assert_eq!(v["model_type"], "gpt2");
    assert_eq!(v["architectures"][0], "GPT2LMHeadModel");
    assert!(v.get(TOKENIZER_DIR_FIELD).is_none());
    // The shortest decimal of the f32, not the f64 widening of it (9.999999747378752e-6).
    assert_eq!(v["layer_norm_epsilon"].as_f64(), Some(1e-5));
    let back = HfConfig::parse("re-read", &c.to_json()).expect("re-reading");
    assert_eq!(back.model, c.model);
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
        (
            "\"model_type\": \"gpt2\"",
            "\"model_type\": \"bert\"",
            "model_type is `bert`",
        ),
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

fn smollm2_json() -> String {
    preset("smollm2-135m").to_json()
}

#[test]
fn llama_family_configs_read_as_transformers_4_and_5_write_them() {
    let c = preset("smollm2-135m").model;
    assert_eq!(c.family, Family::Llama);
    assert_eq!(
        (
            c.n_embd,
            c.n_layer,
            c.n_head,
            c.n_kv_head,
            c.head_dim,
            c.n_inner
        ),
        (576, 30, 9, 3, 64, 1536)
    );
    assert_eq!(c.rope_theta, 100000.0);
    assert!(c.tie_word_embeddings && !c.qkv_bias && !c.o_bias && !c.mlp_bias);
    // Round trip, and the keys transformers reads.
    let text = smollm2_json();
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["architectures"][0], "LlamaForCausalLM");
    assert_eq!(v["num_key_value_heads"], 3);
    assert_eq!(HfConfig::parse("again", &text).expect("re-read").model, c);
    // transformers 5.x: rope_theta under rope_parameters.
    let mut fields: Map<String, Value> = serde_json::from_str(&text).expect("JSON");
    fields.remove("rope_theta");
    fields.insert(
        "rope_parameters".into(),
        serde_json::json!({"rope_theta": 500000.0, "rope_type": "default"}),
    );
    let v5 = serde_json::to_string(&fields).expect("JSON");
    let c5 = HfConfig::parse("v5", &v5).expect("5.x config").model;
    assert_eq!(c5.rope_theta, 500000.0);
    let again: Value =
        serde_json::from_str(&HfConfig::parse("v5", &v5).unwrap().to_json()).expect("JSON");
    assert_eq!(again["rope_parameters"]["rope_theta"], 500000.0);
    assert!(
        again.get("rope_theta").is_none(),
        "written where it was read"
    );
    // Qwen2: q/k/v biases, none on o_proj; head_dim from the sizes.
    let mut q = fields.clone();
    q.insert("model_type".into(), "qwen2".into());
    q.remove("head_dim");
    let q = HfConfig::parse("qwen2", &serde_json::to_string(&q).unwrap())
        .expect("qwen2")
        .model;
    assert_eq!(q.family, Family::Qwen2);
    assert!(q.qkv_bias && !q.o_bias);
    assert_eq!(q.head_dim, 64);
    // Saved f32 weights are declared f32.
    let mut bf = fields.clone();
    bf.insert("torch_dtype".into(), "bfloat16".into());
    let out: Value = serde_json::from_str(
        &HfConfig::parse("bf16", &serde_json::to_string(&bf).unwrap())
            .unwrap()
            .to_json(),
    )
    .unwrap();
    assert_eq!(out["torch_dtype"], "float32");
}

#[test]
fn llama_family_faults_name_their_field_before_any_weight_is_read() {
    let base: Map<String, Value> = serde_json::from_str(&smollm2_json()).expect("JSON");
    let cases: [(&str, Value, &str); 9] = [
        (
            "num_key_value_heads",
            4.into(),
            "num_key_value_heads 4 does not divide",
        ),
        ("model_type", "mamba".into(), "model_type is `mamba`"),
        ("hidden_act", "gelu".into(), "hidden_act `gelu`"),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
            "rope type `yarn`",
        ),
        ("use_sliding_window", true.into(), "use_sliding_window"),
        ("head_dim", 63.into(), "head_dim 63 is odd"),
        ("num_attention_heads", 0.into(), "num_attention_heads"),
        ("rope_theta", (-1.0).into(), "rope_theta"),
        ("intermediate_size", "big".into(), "intermediate_size"),
    ];
    for (field, value, needle) in cases {
        let mut f = base.clone();
        f.insert(field.into(), value);
        let err = HfConfig::parse("cfg.json", &serde_json::to_string(&f).unwrap())
            .expect_err(needle)
            .to_string();
        assert!(
            err.contains("cfg.json") && err.contains(needle),
            "{field}: {err}"
        );
    }
    let mut f = base.clone();
    f.remove("head_dim");
    f.insert("num_attention_heads".into(), 7.into());
    f.insert("num_key_value_heads".into(), 7.into());
    let err = HfConfig::parse("cfg.json", &serde_json::to_string(&f).unwrap())
        .expect_err("7 heads of 576")
        .to_string();
    assert!(err.contains("does not divide hidden_size 576"), "{err}");
}
