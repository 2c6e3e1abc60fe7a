//! `wgrad eval` and `wgrad generate` through the library functions they call, on the golden
//! model of tests/fixtures/gpt2-small (Hugging Face's logits and loss on it are the reference),
//! and one smoke run of the binary: train, eval, generate.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_close, private_dev};
use safetensors::SafeTensors;
use wgrad::model::{evaluate, generate, load_pretrained, Generator, Sampling};
use wgrad::nn::Decoder;
use wgrad::{no_grad, Device, Result, Tensor};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-small")
}

/// The golden GPT-2 (V 512, P 64, C 64, 2 layers, 4 heads).
fn golden(dev: &Device) -> Result<Decoder> {
    let (config, params) = load_pretrained(dev, &fixture_dir())?;
    Decoder::from_params(config.model, params)
}

/// A tensor of expected.safetensors as f32 (ids as their values).
fn expected(name: &str) -> Vec<f64> {
    let bytes = std::fs::read(fixture_dir().join("expected.safetensors")).expect("the fixture");
    let st = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let view = st.tensor(name).expect("the tensor");
    view.data()
        .chunks_exact(4)
        .map(|c| {
            let b = [c[0], c[1], c[2], c[3]];
            match view.dtype() {
                safetensors::Dtype::I32 => i32::from_le_bytes(b) as f64,
                _ => f32::from_le_bytes(b) as f64,
            }
        })
        .collect()
}

fn input_ids() -> Vec<u32> {
    expected("input_ids").iter().map(|&x| x as u32).collect() // (2, 16)
}

#[test]
fn eval_is_hugging_faces_loss_averaged_over_chunks() -> Result<()> {
    let dev = private_dev();
    let model = golden(&dev)?;
    let ids = input_ids();
    // HF: model(input_ids (2, 16), labels=input_ids).loss, the mean over 2 x 15 predictions,
    // is the mean of the two chunks' losses.
    let hf = expected("loss")[0];
    for batch in [1, 2] {
        let r = evaluate(&model, &ids, 16, batch)?;
        assert_close(&[r.loss as f32], &[hf], 1e-5, "eval loss");
        assert_eq!((r.sequences, r.tokens), (2, 32));
        assert!((r.perplexity - r.loss.exp()).abs() < 1e-9);
    }
    // A remainder shorter than a chunk is dropped; chunks in batches of 2, 2 and 1.
    let long: Vec<u32> = ids.iter().cycle().take(5 * 7 + 4).copied().collect();
    let r = evaluate(&model, &long, 7, 2)?;
    assert_eq!((r.sequences, r.tokens), (5, 35));
    let mut sum = 0.0;
    for c in long[..35].chunks(7) {
        sum += evaluate(&model, c, 7, 1)?.loss;
    }
    assert_close(&[r.loss as f32], &[sum / 5.0], 1e-5, "mean over chunks");

    let err = evaluate(&model, &ids, 65, 1).unwrap_err().to_string();
    assert!(
        err.contains("--seq") && err.contains("64 positions"),
        "{err}"
    );
    let err = evaluate(&model, &ids[..5], 8, 1).unwrap_err().to_string();
    assert!(err.contains("no chunk of 8 tokens"), "{err}");
    Ok(())
}

/// The last position's logits of a full forward over `ids` (one sequence).
fn full_forward_last(model: &Decoder, ids: &[u32]) -> Result<Vec<f32>> {
    let dev = model.params.device();
    let x = Tensor::from_u32(dev, ids, &[1, ids.len()])?;
    let logits = no_grad(|| model.forward(&x))?; // (1, T, V)
    logits.narrow(1, ids.len() - 1, 1)?.to_vec()
}

#[test]
fn cached_generation_matches_the_full_forward_and_hugging_face() -> Result<()> {
    let dev = private_dev();
    let model = golden(&dev)?;
    let v = model.config.vocab_size;
    let ids = input_ids();
    let row = &ids[..16];
    let hf_logits = expected("logits"); // (2, 16, V)

    // The prompt (6 tokens) at once, then the rest of row 0 one position at a time: each
    // step's logits are HF's at that position.
    let mut gen = Generator::new(&model, 1)?;
    let mut logits = gen.feed(&row[..6])?;
    for p in 5..16 {
        let want = &hf_logits[p * v..(p + 1) * v];
        assert_close(&logits.to_vec()?, want, 1e-4, &format!("position {p}"));
        if p + 1 < 16 {
            logits = gen.feed(&row[p + 1..p + 2])?;
        }
    }
    assert_eq!(gen.len(), 16);

    // Greedy generation: at every step the cached logits are the full forward's over the
    // whole sequence so far, and their argmax is the token chosen.
    let prompt = &row[..4];
    let greedy = Sampling {
        temperature: 0.0,
        ..Default::default()
    };
    let tokens = generate(&model, prompt, 12, &greedy, None, |_| Ok(()))?;
    assert_eq!(tokens.len(), 12);
    let mut gen = Generator::new(&model, 1)?;
    let mut seq = prompt.to_vec();
    let mut cached = gen.feed(prompt)?.to_vec()?;
    for &next in &tokens {
        let full = full_forward_last(&model, &seq)?;
        let want: Vec<f64> = full.iter().map(|&x| x as f64).collect();
        assert_close(
            &cached,
            &want,
            1e-4,
            &format!("step at length {}", seq.len()),
        );
        let argmax = (0..v).fold(0, |b, i| if cached[i] > cached[b] { i } else { b });
        assert_eq!(next as usize, argmax);
        seq.push(next);
        cached = gen.feed(&[next])?.to_vec()?;
    }
    let again = generate(&model, prompt, 12, &greedy, None, |_| Ok(()))?;
    assert_eq!(again, tokens, "greedy generation is deterministic");

    // Sampling: the same seed gives the same tokens; the stop token ends early.
    let sampled = Sampling {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        seed: 3,
    };
    let a = generate(&model, prompt, 10, &sampled, None, |_| Ok(()))?;
    let b = generate(&model, prompt, 10, &sampled, None, |_| Ok(()))?;
    assert_eq!(a, b);
    let stopped = generate(&model, prompt, 10, &sampled, Some(a[2]), |_| Ok(()))?;
    assert_eq!(
        stopped.len(),
        1 + a.iter().position(|&t| t == a[2]).unwrap()
    );

    let err = generate(&model, prompt, 61, &greedy, None, |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("4 tokens plus 61 new ones exceed the model's 64 positions"),
        "{err}"
    );
    Ok(())
}

#[test]
fn the_binary_trains_evaluates_and_generates() {
    let dir = std::env::temp_dir().join(format!("wgrad-cli-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    let text = dir.join("text.txt");
    let corpus = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/austen-persuasion.txt"),
    )
    .expect("the corpus");
    std::fs::write(&text, &corpus[..3000]).expect("writing");
    let out = dir.join("model");
    let wgrad = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_wgrad"))
            .args(args)
            .output()
            .expect("running wgrad");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        assert!(o.status.success(), "wgrad {args:?}:\n{stdout}\n{stderr}");
        (stdout, stderr)
    };
    let (stdout, _) = wgrad(&[
        "train",
        "--steps",
        "2",
        "--batch",
        "1",
        "--seq",
        "8",
        "--json",
        "--data",
        text.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--eval-every",
        "2",
    ]);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for key in ["step", "loss", "ms", "tokens_per_s"] {
        assert!(lines[1][key].is_number(), "{key}: {stdout}");
    }
    assert!(lines[1]["eval_loss"].is_number() && lines[0].get("eval_loss").is_none());

    let (stdout, _) = wgrad(&[
        "eval",
        "--model",
        out.to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
        "--seq",
        "16",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON");
    for key in ["loss", "perplexity", "tokens", "sequences"] {
        assert!(r[key].is_number(), "{key}: {stdout}");
    }

    let (stdout, stderr) = wgrad(&[
        "generate",
        "--model",
        out.to_str().unwrap(),
        "--prompt",
        "Anne",
        "--max-tokens",
        "3",
        "--temperature",
        "0",
    ]);
    assert!(stdout.starts_with("Anne"), "{stdout}");
    assert!(
        stderr.contains("3 new tokens after a prompt of 1"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
