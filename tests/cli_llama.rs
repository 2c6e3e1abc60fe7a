//! The CLI on the Llama family: `wgrad bench step` and `wgrad profile` run a micro Llama from
//! a config.json alone (random weights and tokens) and report sane JSON; `wgrad train
//! --preset smollm2-135m` (a preset without a built-in tokenizer) stops at once with the error
//! that points to `--model DIR`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wgrad::model::HfConfig;
use wgrad::nn::{Family, ModelConfig};

/// A scratch directory of this test process, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("wgrad-cli-llama-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A micro Llama: C 32, 2 layers, 4 heads over 2 key/value heads, SwiGLU 88 wide, V 128.
fn micro_llama() -> ModelConfig {
    ModelConfig {
        family: Family::Llama,
        n_kv_head: 2,
        head_dim: 8,
        n_inner: 88,
        rope_theta: 10000.0,
        tie_word_embeddings: true,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        ..ModelConfig::gpt2(128, 32, 32, 2, 4)
    }
}

/// A model directory holding only `config`'s config.json.
fn config_dir(scratch: &Scratch, config: ModelConfig) -> PathBuf {
    let dir = scratch.0.join("model");
    std::fs::create_dir_all(&dir).expect("scratch");
    std::fs::write(dir.join("config.json"), HfConfig::new(config).to_json()).expect("writing");
    dir
}

fn wgrad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wgrad"))
        .args(args)
        .output()
        .expect("running wgrad")
}

fn succeeded(o: &Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

#[test]
fn bench_step_runs_a_llama_config() {
    let scratch = Scratch::new("bench");
    let dir = config_dir(&scratch, micro_llama());
    let o = wgrad(&[
        "bench",
        "step",
        "--model",
        path(&dir),
        "--batch",
        "2",
        "--seq",
        "9",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--json",
    ]);
    let stdout = succeeded(&o);
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {stdout}"));
    assert_eq!(
        r["params"].as_u64(),
        Some(micro_llama().parameter_count() as u64),
        "{stdout}"
    );
    assert!(
        r["model"].as_str().is_some_and(|m| m.contains("llama")),
        "{stdout}"
    );
    assert_eq!((r["batch"].as_u64(), r["seq"].as_u64()), (Some(2), Some(9)));
    // Random tokens from a small init: the loss starts near ln(128) = 4.85.
    let (first, last) = (f("loss_first"), f("loss_last"));
    assert!((first - 128f64.ln()).abs() < 0.5, "{stdout}");
    assert!(last.is_finite() && last <= first + 0.1, "{stdout}");
    for k in ["median_ms", "tokens_per_s", "dispatches_per_step"] {
        assert!(f(k) > 0.0, "{k}: {stdout}");
    }
    assert!((1.0..=3.0).contains(&f("submits_per_step")), "{stdout}");
}

#[test]
fn profile_runs_a_llama_config() {
    let scratch = Scratch::new("profile");
    let dir = config_dir(&scratch, micro_llama());
    let json = scratch.0.join("profile.json");
    let o = wgrad(&[
        "profile",
        "--model",
        path(&dir),
        "--batch",
        "2",
        "--seq",
        "9",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
        path(&json),
    ]);
    let stdout = succeeded(&o);
    let text = std::fs::read_to_string(&json).expect("the --json file");
    let r: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {text}"));
    // Steps recorded: the warm-up's and the profiled ones.
    assert_eq!(
        (r["steps"].as_u64(), r["warmup"].as_u64()),
        (Some(3), Some(1))
    );
    assert!(
        r["step_ms"]["median"].as_f64().is_some_and(|m| m > 0.0),
        "{text}"
    );
    assert!(f("dispatches_per_step") > 0.0, "{text}");
    assert!(
        f("forward_dispatches_per_step") > 0.0 && f("backward_dispatches_per_step") > 0.0,
        "{text}"
    );
    assert!((1.0..=3.0).contains(&f("submits_per_step")), "{text}");
    assert_eq!(f("buffers_created_per_step"), 0.0, "{text}");
    // Where kernels are timed, the Llama parts show up by name.
    let kernels: Vec<&str> = r["kernels"]
        .as_array()
        .expect("a kernel table")
        .iter()
        .filter_map(|k| k["name"].as_str())
        .collect();
    if !kernels.is_empty() {
        for k in ["swiglu", "rmsnorm"] {
            assert!(
                kernels.iter().any(|n| n.contains(k)),
                "no {k} kernel in {kernels:?}"
            );
        }
    }
    assert!(stdout.contains("1 warm-up + 2 profiled steps"), "{stdout}");
}

#[test]
fn training_a_preset_without_a_tokenizer_points_to_model_dir() {
    let start = std::time::Instant::now();
    // A 1 MiB memory cap: the 135M-parameter model cannot have been allocated if the error
    // is the tokenizer's.
    let o = Command::new(env!("CARGO_BIN_EXE_wgrad"))
        .args(["train", "--preset", "smollm2-135m", "--steps", "1"])
        .env("WGRAD_MEMORY_LIMIT_MIB", "1")
        .output()
        .expect("running wgrad");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("smollm2-135m")
            && stderr.contains("no built-in tokenizer")
            && stderr.contains("--model DIR"),
        "{stderr}"
    );
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(start.elapsed().as_secs() < 30, "took {:?}", start.elapsed());
}
