//! GPU memory as a user meets it: a run that cannot fit is refused before it allocates
//! (`memory::check_fits`), an allocation past the memory cap is `Error::OutOfMemory` naming what
//! and how much (the path an adapter's out-of-memory takes), a long training run creates no
//! buffer after its second step, and loaded weights with NaN or infinities are refused
//! (`Parameters::count_nonfinite` against a CPU count; `eval` and `generate` on a saved model).

mod common;

use std::path::Path;

use common::{dev_with, private_dev, rng};
use rand::Rng;
use wgrad::memory::{check_fits, Workload};
use wgrad::nn::{Decoder, ModelConfig, ParamSpec, Parameters};
use wgrad::optim::{AdamWConfig, LrSchedule};
use wgrad::train::Trainer;
use wgrad::{Error, Result, Tensor};

/// A GPT-2 small enough that a step takes milliseconds on lavapipe.
fn micro() -> ModelConfig {
    ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.02,
        ..ModelConfig::gpt2(64, 16, 16, 1, 2)
    }
}

#[test]
fn the_memory_cap_refuses_an_allocation_as_an_adapter_out_of_memory_would() -> Result<()> {
    let cap = 1 << 20;
    let dev = dev_with(|o| o.pool.memory_limit = Some(cap));
    let a = Tensor::zeros(&dev, &[96 << 10])?; // 384 KiB
    let err = Tensor::zeros(&dev, &[192 << 10]).expect_err("768 KiB more is past the 1 MiB cap");
    let Error::OutOfMemory { what, bytes, .. } = &err else {
        panic!("not an out-of-memory error: {err}");
    };
    assert_eq!(*bytes, 768 << 10, "{err}");
    let text = err.to_string();
    for says in [
        "[196608]",
        "WGRAD_MEMORY_LIMIT_MIB",
        "--batch",
        "393216 bytes",
    ] {
        assert!(text.contains(says) || what.contains(says), "{says}: {text}");
    }
    // The device still works: once `a` is given back, the pool lets its cached buffer go to
    // make room for the request that failed.
    drop(a);
    let b = Tensor::zeros(&dev, &[192 << 10])?;
    assert_eq!(b.to_vec()?.len(), 192 << 10);
    assert!(dev.pool_stats().buffers_evicted >= 1);
    assert!(dev.pool_stats().bytes_live + dev.pool_stats().bytes_cached <= cap);

    // The estimate before a run refuses what the cap cannot hold, naming the parts and what
    // to lower; a small run passes.
    let train = |batch| Workload::Train {
        batch,
        seq: 16,
        amp: false,
    };
    check_fits(&dev, &micro(), train(1))?;
    let err = check_fits(&dev, &micro(), train(4096)).expect_err("activations past the cap");
    let text = err.to_string();
    for says in [
        "--batch 4096",
        "activations",
        "Lower --batch or --seq",
        "1048576",
    ] {
        assert!(text.contains(says), "{says}: {text}");
    }
    let big = ModelConfig {
        n_layer: 1_000_000_000,
        ..micro()
    };
    let text = check_fits(&dev, &big, train(1))
        .expect_err("n_layer 1e9")
        .to_string();
    assert!(text.contains("smaller model"), "{text}");
    Ok(())
}

#[test]
fn a_long_run_creates_no_buffer_after_its_second_step() -> Result<()> {
    let dev = private_dev();
    let config = micro();
    let model = Decoder::new(&dev, config.clone(), 1)?;
    let adamw = AdamWConfig {
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    let mut trainer = Trainer::new(model, adamw, 1e-3, LrSchedule::Constant { warmup: 0 })?;
    let mut r = rng("long run");
    let mut ids = |n: usize| -> Vec<u32> { (0..n).map(|_| r.random_range(0..64)).collect() };
    let (b, t) = (2, 8);
    let batch = (
        Tensor::from_u32(&dev, &ids(b * t), &[b, t])?,
        Tensor::from_u32(&dev, &ids(b * t), &[b, t])?,
    );
    let mut after_two = None;
    let mut first = f32::NAN;
    let mut last = f32::NAN;
    for step in 1..=300 {
        let loss = trainer.step(std::slice::from_ref(&batch))?.item()?;
        if step == 1 {
            first = loss;
        }
        last = loss;
        if step == 2 {
            after_two = Some((dev.pool_stats(), dev.other_buffers_created()));
        }
    }
    let (pool, other) = after_two.expect("two steps ran");
    let now = dev.pool_stats();
    assert_eq!(
        (now.buffers_created, dev.other_buffers_created()),
        (pool.buffers_created, other),
        "buffers made after step 2 (tensor pool, arenas and read-backs)"
    );
    assert_eq!(
        now.bytes_live, pool.bytes_live,
        "bytes live after step 2 and 300"
    );
    assert!(last < first, "the loss falls: {first} -> {last}");
    Ok(())
}

/// NaN, both infinities, subnormals, the largest finite values, at random positions.
fn poisoned(r: &mut impl Rng, n: usize) -> (Vec<f32>, u64) {
    let mut v: Vec<f32> = (0..n).map(|_| r.random_range(-2.0..2.0)).collect();
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7fc0_0001), // a NaN payload
        f32::from_bits(0x7f80_0001), // a signalling NaN
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::from_bits(1), // the smallest subnormal
        -f32::from_bits(0x007f_ffff),
    ];
    for _ in 0..r.random_range(0..6) {
        let i = r.random_range(0..n);
        v[i] = specials[r.random_range(0..specials.len())];
    }
    let bad = v.iter().filter(|x| !x.is_finite()).count() as u64;
    (v, bad)
}

#[test]
fn non_finite_weights_are_counted_per_tensor_as_the_cpu_counts_them() -> Result<()> {
    // A 4 KiB binding cap: the (300, 8) parameter is stored as row shards, counted whole.
    let dev = dev_with(|o| o.adapter.max_storage_binding = Some(4096));
    let mut r = rng("non-finite");
    let spec = |name: &str, shape: Vec<usize>| ParamSpec {
        name: name.into(),
        decay: shape.len() > 1,
        shape,
    };
    let specs = vec![
        spec("wte.weight", vec![300, 8]),
        spec("h.0.ln_1.bias", vec![5]),
        spec("h.0.attn.c_attn.weight", vec![8, 24]),
        spec("h.3.attn.c_attn.weight", vec![1, 1]),
        spec("ln_f.weight", vec![777]),
    ];
    let params = Parameters::new(&dev, &specs)?;
    assert!(params.shards("wte.weight").expect("wte").len() > 1);
    for round in 0..4 {
        let mut want = Vec::new();
        for s in &specs {
            let n: usize = s.shape.iter().product();
            let (v, bad) = poisoned(&mut r, n);
            params.write(&s.name, &v)?;
            if bad > 0 {
                want.push((s.name.clone(), bad));
            }
        }
        assert_eq!(params.count_nonfinite()?, want, "round {round}");
        match (params.check_finite("weights.safetensors"), want.first()) {
            (Ok(()), None) => {}
            (Err(e), Some((name, n))) => {
                let text = e.to_string();
                let says = format!("tensor `{name}` holds {n} non-finite");
                assert!(text.contains(&says) && text.contains("weights"), "{text}");
            }
            (got, want) => panic!("round {round}: {got:?}, expected {want:?}"),
        }
    }
    Ok(())
}

/// Sets element `index` of tensor `name` in the f32 safetensors file `path` to `value`.
fn poke(path: &Path, name: &str, index: usize, value: f32) {
    let mut bytes = std::fs::read(path).expect("the weights");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(&bytes[8..8 + header_len]).expect("the header");
    let entry = &header[name];
    assert_eq!(entry["dtype"], "F32", "{name}");
    let at = 8 + header_len + entry["data_offsets"][0].as_u64().expect("offsets") as usize;
    let at = at + 4 * index;
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    std::fs::write(path, bytes).expect("writing the weights");
}

#[test]
fn eval_and_generate_refuse_a_model_with_a_nan_in_an_unused_vocabulary_row() {
    let dir = std::env::temp_dir().join(format!("wgrad-nonfinite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    let text = dir.join("text.txt");
    std::fs::write(
        &text,
        "It was the best of times, it was the worst of times. ".repeat(8),
    )
    .expect("writing");
    let model = dir.join("model");
    let wgrad = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_wgrad"))
            .args(args)
            .output()
            .expect("running wgrad");
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        (o.status.success(), stderr)
    };
    let (m, t) = (model.to_str().unwrap(), text.to_str().unwrap());
    let (ok, stderr) = wgrad(&[
        "train", "--steps", "1", "--batch", "1", "--seq", "8", "--data", t, "--out", m,
    ]);
    assert!(ok, "train: {stderr}");
    let eval = ["eval", "--model", m, "--text", t, "--seq", "8"];
    let generate = [
        "generate",
        "--model",
        m,
        "--prompt",
        "It was",
        "--max-tokens",
        "2",
    ];
    assert!(wgrad(&eval).0, "eval of the clean model");
    // Token 50000 is not in the text; its row still makes the weights unusable.
    poke(
        &model.join("model.safetensors"),
        "wte.weight",
        50_000 * 128 + 7,
        f32::NAN,
    );
    for args in [&eval[..], &generate[..]] {
        let (ok, stderr) = wgrad(args);
        assert!(!ok, "{args:?} exits non-zero");
        assert!(
            stderr.contains("`wte.weight` holds 1 non-finite") && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_step_reports_the_pools_bytes_flat_after_the_second_step() {
    let dir = std::env::temp_dir().join(format!("wgrad-bench-pool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let config = wgrad::model::HfConfig::new(micro()).to_json();
    std::fs::write(dir.join("config.json"), config).expect("writing");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_wgrad"))
        .args(["bench", "step", "--model", dir.to_str().unwrap()])
        .args([
            "--batch", "2", "--seq", "8", "--steps", "40", "--warmup", "1", "--json",
        ])
        .output()
        .expect("running wgrad");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let key = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k}: {stdout}"));
    assert_eq!(key("buffers_created_after_step_2"), 0, "{stdout}");
    let (first, last, peak) = (
        key("pool_bytes_first"),
        key("pool_bytes_last"),
        key("peak_bytes"),
    );
    assert!(
        0 < first && first <= last && 0 < peak && peak <= last,
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
