//! Tests of safetensors load and save on a small GPT-2 (V 50, P 8, C 16, 2 layers).

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::tensor::Dtype;

use super::save::HostTensor as Raw; // a tensor of a hand-made safetensors file
use super::*;
use crate::model::test_support::{device, gpt2_tokenizer_dir, ScratchDir};
use crate::model::Tokenizer;
use crate::nn::ModelConfig;

/// The prefix GPT2LMHeadModel writes.
const PREFIX: &str = "transformer.";

fn small() -> HfConfig {
    HfConfig::new(ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.02,
        ..ModelConfig::gpt2(50, 8, 16, 2, 2)
    })
}

/// Parameters of `config` filled with seeded random values (some of them -0.0 and subnormal,
/// to show the round trip is bit-exact).
fn random_params(config: &HfConfig, seed: u64) -> (Parameters, Vec<Vec<f32>>) {
    let params = Parameters::new(device(), &config.model.param_specs()).expect("allocating");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut values = Vec::new();
    for (_, t) in params.iter() {
        let mut v: Vec<f32> = (0..t.numel())
            .map(|_| rng.random::<f32>() * 2.0 - 1.0)
            .collect();
        v[0] = -0.0;
        if v.len() > 1 {
            v[1] = f32::from_bits(1); // the smallest subnormal
        }
        t.copy_from_slice(&v).expect("uploading");
        values.push(v);
    }
    (params, values)
}

fn f32_raw(shape: &[usize], v: &[f32]) -> Raw {
    Raw {
        dtype: Dtype::F32,
        shape: shape.to_vec(),
        bytes: bytemuck::cast_slice(v).to_vec(),
    }
}

/// Every parameter of `config` as f32 tensors of value `fill`, named `prefix` + HF name.
fn all_tensors(config: &HfConfig, prefix: &str, fill: f32) -> Vec<(String, Raw)> {
    config
        .model
        .param_specs()
        .iter()
        .map(|s| {
            let n: usize = s.shape.iter().product();
            (
                format!("{prefix}{}", s.name),
                f32_raw(&s.shape, &vec![fill; n]),
            )
        })
        .collect()
}

fn write_st(path: &Path, tensors: Vec<(String, Raw)>) {
    safetensors::serialize_to_file(tensors, None, path).expect("writing a test file");
}

fn load_err(config: &HfConfig, path: &Path) -> String {
    let params = Parameters::new(device(), &config.model.param_specs()).expect("allocating");
    load_weights(&params, &config.model, path)
        .expect_err("a bad file")
        .to_string()
}

#[test]
fn save_then_load_is_bit_exact_and_writes_a_hf_directory() {
    let scratch = ScratchDir::new("st-round-trip");
    let dir = scratch.path().join("out");
    let config = small();
    let tok = Tokenizer::from_dir(&gpt2_tokenizer_dir()).expect("tokenizer");
    let (params, values) = random_params(&config, 7);
    save_pretrained(&dir, &config, &params, Some(&tok)).expect("saving");
    // Saving again over the directory replaces its files (renames, no temporaries left).
    save_pretrained(&dir, &config, &params, Some(&tok)).expect("saving again");

    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("listing")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "config.json",
            "merges.txt",
            "model.safetensors",
            "vocab.json"
        ]
    );

    let (back_config, back) = load_pretrained(device(), &dir).expect("loading");
    assert_eq!(back_config.model, config.model);
    for ((name, t), want) in back.iter().zip(&values) {
        let got = t.to_vec().expect("reading back");
        let same = got
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name} differs after save and load");
    }
    let bytes = std::fs::read(dir.join(WEIGHTS_FILE)).expect("reading");
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    assert_eq!(st.len(), config.model.param_specs().len());
    assert!(st.names().iter().all(|n| !n.starts_with(PREFIX)));
    let (_, meta) = SafeTensors::read_metadata(&bytes).expect("header");
    let format = meta.metadata().as_ref().and_then(|m| m.get("format"));
    assert_eq!(format.map(String::as_str), Some("pt"));
    assert!(
        Tokenizer::from_dir(&dir).is_ok(),
        "the copied tokenizer loads"
    );
}

#[test]
fn prefixed_names_tied_head_mask_buffers_and_half_dtypes_load() {
    let scratch = ScratchDir::new("st-hf-layout");
    let path = scratch.path().join(WEIGHTS_FILE);
    let config = small();
    let mut tensors = all_tensors(&config, PREFIX, 0.5);
    // wte in f16 and wpe in bf16: values exactly representable in both.
    for (name, raw) in tensors.iter_mut() {
        let n: usize = raw.shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect();
        if name.ends_with("wte.weight") {
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            *raw = Raw {
                dtype: Dtype::F16,
                shape: raw.shape.clone(),
                bytes: bytemuck::cast_slice(&h).to_vec(),
            };
        } else if name.ends_with("wpe.weight") {
            let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
            *raw = Raw {
                dtype: Dtype::BF16,
                shape: raw.shape.clone(),
                bytes: bytemuck::cast_slice(&h).to_vec(),
            };
        }
    }
    // A tied head: the embedding's values (here in f32 beside wte's f16).
    let wte: Vec<f32> = (0..800).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect();
    tensors.push(("lm_head.weight".into(), f32_raw(&[50, 16], &wte)));
    for i in 0..2 {
        let mask = vec![1.0; 64];
        tensors.push((
            format!("{PREFIX}h.{i}.attn.bias"),
            f32_raw(&[1, 1, 8, 8], &mask),
        ));
        tensors.push((
            format!("{PREFIX}h.{i}.attn.masked_bias"),
            f32_raw(&[], &[-1e4]),
        ));
    }
    write_st(&path, tensors);

    let params = Parameters::new(device(), &config.model.param_specs()).expect("allocating");
    load_weights(&params, &config.model, &path).expect("loading");
    for name in ["wte.weight", "wpe.weight"] {
        let got = params.get(name).expect(name).to_vec().expect("reading");
        let want: Vec<f32> = (0..got.len())
            .map(|i| (i % 17) as f32 * 0.25 - 2.0)
            .collect();
        assert_eq!(got, want, "{name}");
    }
    let ln = params
        .get("h.1.ln_2.bias")
        .expect("ln")
        .to_vec()
        .expect("reading");
    assert!(ln.iter().all(|&x| x == 0.5));
}

#[test]
fn an_untied_lm_head_is_an_error() {
    let scratch = ScratchDir::new("st-untied");
    let path = scratch.path().join(WEIGHTS_FILE);
    let config = small();
    let mut tensors = all_tensors(&config, "", 0.5);
    let mut head = vec![0.5; 800];
    head[123] = 0.25;
    tensors.push(("lm_head.weight".into(), f32_raw(&[50, 16], &head)));
    write_st(&path, tensors);
    let err = load_err(&config, &path);
    assert!(
        err.contains("`lm_head.weight` differs from `wte.weight`"),
        "{err}"
    );
}

#[test]
fn missing_misshaped_unknown_and_untyped_tensors_are_listed_together() {
    let scratch = ScratchDir::new("st-problems");
    let path = scratch.path().join(WEIGHTS_FILE);
    let config = small();
    let mut tensors: Vec<(String, Raw)> = all_tensors(&config, "", 1.0)
        .into_iter()
        .filter(|(n, _)| n != "h.1.mlp.c_fc.bias")
        .collect();
    for (name, raw) in tensors.iter_mut() {
        if name == "h.0.attn.c_attn.weight" {
            *raw = f32_raw(&[16, 32], &[0.0; 512]);
        }
        if name == "ln_f.bias" {
            *raw = Raw {
                dtype: Dtype::I32,
                shape: vec![16],
                bytes: vec![0; 64],
            };
        }
    }
    tensors.push(("h.0.attn.rotary.weight".into(), f32_raw(&[2], &[0.0, 0.0])));
    tensors.push(("lm_head.weight".into(), f32_raw(&[49, 16], &[0.0; 784])));
    write_st(&path, tensors);

    let err = load_err(&config, &path);
    for needle in [
        "model.safetensors",
        "missing tensor `h.1.mlp.c_fc.bias` [64]",
        "`h.0.attn.c_attn.weight`: config.json gives shape [16, 48], the file holds [16, 32]",
        "unexpected tensor `h.0.attn.rotary.weight` [2]",
        "`ln_f.bias` [16]: dtype I32",
        "`lm_head.weight` [49, 16] F32 cannot be tied",
    ] {
        assert!(err.contains(needle), "`{needle}` not in:\n{err}");
    }
    assert!(
        !err.contains("missing tensor `h.0.attn.c_attn.weight`"),
        "{err}"
    );
}

#[test]
fn a_config_that_disagrees_with_the_weights_names_tensor_and_shapes() {
    let scratch = ScratchDir::new("st-config");
    let dir = scratch.path();
    let config = small();
    let (params, _) = random_params(&config, 3);
    save_pretrained(dir, &config, &params, None).expect("saving");
    let text = std::fs::read_to_string(dir.join("config.json")).expect("config");
    std::fs::write(
        dir.join("config.json"),
        text.replace("\"n_positions\": 8", "\"n_positions\": 9"),
    )
    .expect("editing the config");
    let err = load_pretrained(device(), dir)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`wpe.weight`: config.json gives shape [9, 16], the file holds [8, 16]"),
        "{err}"
    );
}

#[test]
fn truncated_or_corrupt_files_are_errors() {
    let scratch = ScratchDir::new("st-truncated");
    let dir = scratch.path();
    let config = small();
    let (params, _) = random_params(&config, 5);
    save_pretrained(dir, &config, &params, None).expect("saving");
    let path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&path).expect("reading");
    for (len, needle) in [
        (bytes.len() - 1, "not a complete"),
        (bytes.len() / 2, "not a complete"),
        (4, "truncated: 4 bytes"),
        (0, "truncated: 0 bytes"),
    ] {
        std::fs::write(&path, &bytes[..len]).expect("truncating");
        let err = load_err(&config, &path);
        assert!(
            err.contains("model.safetensors") && err.contains(needle),
            "{len}: {err}"
        );
    }
    std::fs::write(&path, b"this is not a safetensors file at all").expect("writing");
    let err = load_err(&config, &path);
    assert!(err.contains("not a complete"), "{err}");
    let err = load_err(&config, &dir.join("absent.safetensors"));
    assert!(err.contains("absent.safetensors"), "{err}");
}

/// A small Qwen2-shaped model (grouped heads, q/k/v biases) with an untied head.
fn small_llama() -> HfConfig {
    HfConfig::new(ModelConfig {
        family: crate::nn::Family::Qwen2,
        n_kv_head: 1,
        head_dim: 8,
        n_inner: 24,
        rope_theta: 1e6,
        tie_word_embeddings: false,
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        ..ModelConfig::gpt2(50, 8, 16, 2, 2)
    })
}

#[test]
fn a_llama_family_model_saves_under_transformers_names_and_loads_back_bit_exact() {
    let scratch = ScratchDir::new("st-llama");
    let dir = scratch.path().join("out");
    let config = small_llama();
    let (params, values) = random_params(&config, 11);
    save_pretrained(&dir, &config, &params, None).expect("saving");
    let bytes = std::fs::read(dir.join(WEIGHTS_FILE)).expect("reading");
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let shape = |n: &str| st.tensor(n).map(|t| t.shape().to_vec()).ok();
    // q/k/v and gate/up split into transformers' tensors, with its prefix; the head without.
    assert_eq!(
        shape("model.layers.1.self_attn.q_proj.weight"),
        Some(vec![16, 16])
    );
    assert_eq!(
        shape("model.layers.1.self_attn.k_proj.weight"),
        Some(vec![8, 16])
    );
    assert_eq!(shape("model.layers.1.self_attn.v_proj.bias"), Some(vec![8]));
    assert_eq!(
        shape("model.layers.0.mlp.up_proj.weight"),
        Some(vec![24, 16])
    );
    assert_eq!(shape("model.norm.weight"), Some(vec![16]));
    assert_eq!(shape("lm_head.weight"), Some(vec![50, 16]));
    assert_eq!(st.len(), config.model.hf_tensors().len());
    // v_proj's rows are the stacked parameter's last 8.
    let qkv = &values[params
        .iter()
        .position(|(n, _)| n == "layers.1.self_attn.qkv_proj.weight")
        .expect("qkv")];
    let v: Vec<f32> = st
        .tensor("model.layers.1.self_attn.v_proj.weight")
        .expect("v")
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(v, qkv[24 * 16..]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("JSON");
    assert_eq!(json["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(json["num_key_value_heads"], 1);

    let (back_config, back) = load_pretrained(device(), &dir).expect("loading");
    assert_eq!(back_config.model, config.model);
    for ((name, t), want) in back.iter().zip(&values) {
        let got = t.to_vec().expect("reading back");
        assert!(
            got.iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name} differs after save and load"
        );
    }
}

#[test]
fn sharded_bf16_checkpoints_load_and_say_what_they_held() {
    let scratch = ScratchDir::new("st-shards");
    let dir = scratch.path();
    let config = small_llama();
    std::fs::write(dir.join("config.json"), config.to_json()).expect("config");
    // Every tensor bf16, without the prefix in one shard and with it in the other.
    let value = |i: usize| (i % 13) as f32 * 0.125 - 0.75;
    let tensors: Vec<(String, Raw)> = config
        .model
        .hf_tensors()
        .iter()
        .map(|t| {
            let n: usize = t.shape.iter().product();
            let h: Vec<half::bf16> = (0..n).map(|i| half::bf16::from_f32(value(i))).collect();
            let raw = Raw {
                dtype: Dtype::BF16,
                shape: t.shape.clone(),
                bytes: bytemuck::cast_slice(&h).to_vec(),
            };
            (t.name.clone(), raw)
        })
        .collect();
    let (first, second): (Vec<_>, Vec<_>) = tensors
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let mut map = serde_json::Map::new();
    for (file, part, prefix) in [
        ("model-00001-of-00002.safetensors", first, ""),
        ("model-00002-of-00002.safetensors", second, "model."),
    ] {
        let named: Vec<(String, Raw)> = part
            .into_iter()
            .map(|(_, (n, r))| {
                let n = if n == "lm_head.weight" {
                    n
                } else {
                    format!("{prefix}{n}")
                };
                map.insert(n.clone(), file.into());
                (n, r)
            })
            .collect();
        write_st(&dir.join(file), named);
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join(WEIGHTS_INDEX_FILE), index.to_string()).expect("index");

    let (_, params, read) = load_pretrained_with(device(), dir).expect("loading shards");
    assert_eq!(read.files.len(), 2);
    assert_eq!(
        read.dtypes,
        [("BF16".to_string(), config.model.hf_tensors().len())]
    );
    assert!(
        read.describe().contains("converted to f32"),
        "{}",
        read.describe()
    );
    for (name, t) in params.iter() {
        let got = t.to_vec().expect("reading");
        let shape = &config
            .model
            .param_specs()
            .into_iter()
            .find(|s| s.name == name)
            .expect("spec")
            .shape;
        let cols: usize = shape[1..].iter().product();
        // Each checkpoint tensor restarts the pattern at its first row.
        let starts: Vec<usize> = config
            .model
            .hf_tensors()
            .iter()
            .filter(|h| h.param == name)
            .map(|h| h.first_row * cols)
            .collect();
        for (i, &x) in got.iter().enumerate() {
            let start = starts.iter().rev().find(|&&s| s <= i).expect("a part");
            assert_eq!(x, value(i - start), "{name}[{i}]");
        }
    }
    // A shard the index names but the directory lacks is an error naming it.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).expect("removing");
    let err = load_pretrained(device(), dir)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
}
