//! wgrad's Llama family against Hugging Face transformers on the same weights and batch
//! (tests/fixtures/llama-small: LlamaForCausalLM with grouped-query attention and an untied
//! head; tests/fixtures/qwen2-small: Qwen2ForCausalLM with q/k/v biases and a tied head;
//! tests/fixtures/qwen3-small: Qwen3ForCausalLM with q_norm/k_norm on each head and a tied head;
//! all made by tests/fixtures/make_llama_fixtures.py, reference computed in float64): logits, loss,
//! every gradient by its Hugging Face name (wgrad's stacked q/k/v and gate/up parameters
//! compared row block by row block), every parameter after 3 AdamW steps, and the loss under
//! mixed precision.

mod common;

use std::path::{Path, PathBuf};

use common::golden::{assert_after_adamw, shifted, three_adamw_steps, Expected};
use common::{assert_close, dev_with, private_dev};
use wgrad::model::load_pretrained;
use wgrad::nn::{Decoder, Family, HfTensor, Kernels};
use wgrad::{Result, Tensor};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

const FIXTURES: [(&str, Family); 3] = [
    ("llama-small", Family::Llama),
    ("qwen2-small", Family::Qwen2),
    ("qwen3-small", Family::Qwen3),
];

fn model(fixture: &str, family: Family) -> Result<Decoder> {
    model_on(fixture, family, false)
}

/// The fixture's model on the default device, or (`split`) on one whose bindings hold 96 KiB:
/// the 512 x 64 embedding and the untied head (128 KiB each) then in 2 row shards each.
fn model_on(fixture: &str, family: Family, split: bool) -> Result<Decoder> {
    let dev = if split {
        dev_with(|o| o.adapter.max_storage_binding = Some(96 << 10))
    } else {
        private_dev()
    };
    let (cfg, params) = load_pretrained(&dev, &dir(fixture))?;
    assert_eq!(cfg.model.family, family, "{fixture}'s family");
    let shards = |name: &str| params.shards(name).map(|s| s.len());
    let want = if split { 2 } else { 1 };
    assert_eq!(
        shards(cfg.model.embedding()),
        Some(want),
        "{fixture}'s embedding"
    );
    if !cfg.model.tie_word_embeddings {
        assert_eq!(shards("lm_head.weight"), Some(want), "{fixture}'s head");
    }
    Decoder::from_params(cfg.model, params)
}

/// The rows of `values` (a parameter's, row-major) that the checkpoint tensor `t` is.
fn rows_of(values: &[f32], t: &HfTensor) -> Vec<f32> {
    let cols: usize = t.shape[1..].iter().product();
    let at = t.first_row * cols;
    values[at..at + t.shape.iter().product::<usize>()].to_vec()
}

#[test]
fn logits_and_loss_match_transformers() -> Result<()> {
    for ((fixture, family), split) in FIXTURES.into_iter().flat_map(|f| [(f, false), (f, true)]) {
        let exp = Expected::load(&dir(fixture));
        let mut model = model_on(fixture, family, split)?;
        let ids = exp.ids();
        let x = Tensor::from_u32(model.params.device(), &ids, &[2, ids.len() / 2])?;
        let want_loss = exp.f32s("loss")[0];
        let vocab = model.config.vocab_size as f64;
        assert!(
            (want_loss - vocab.ln()).abs() > 0.5,
            "{fixture}: the loss {want_loss} is too close to ln(V)"
        );
        for kernels in [Kernels::Fused, Kernels::Reference] {
            model.kernels = kernels;
            let what = format!("{fixture} ({kernels:?}, split {split})");
            let logits = model.forward(&x)?.to_vec()?;
            assert_close(
                &logits,
                &exp.f32s("logits"),
                1e-4,
                &format!("{what} logits"),
            );
            let (xs, ys) = shifted(model.params.device(), &ids)?;
            let loss = model.loss(&xs, &ys)?.item()?;
            assert_close(&[loss], &[want_loss], 1e-4, &format!("{what} loss"));
        }
    }
    Ok(())
}

#[test]
fn every_gradient_matches_transformers() -> Result<()> {
    for ((fixture, family), split) in FIXTURES.into_iter().flat_map(|f| [(f, false), (f, true)]) {
        let exp = Expected::load(&dir(fixture));
        let model = model_on(fixture, family, split)?;
        let (x, y) = shifted(model.params.device(), &exp.ids())?;
        model.loss(&x, &y)?.backward()?;
        for t in model.config.hf_tensors() {
            let grad = model
                .params
                .read_grad(&t.param)?
                .unwrap_or_else(|| panic!("{} has no gradient", t.param));
            assert_close(
                &rows_of(&grad, &t),
                &exp.f32s(&format!("grad.{}", t.name)),
                1e-3,
                &format!("{fixture} (split {split}): grad of {}", t.name),
            );
        }
    }
    Ok(())
}

#[test]
fn parameters_after_three_adamw_steps_match_torch() -> Result<()> {
    for (fixture, family) in FIXTURES {
        let exp = Expected::load(&dir(fixture));
        let model = model(fixture, family)?;
        let (x, y) = shifted(model.params.device(), &exp.ids())?;
        let losses = three_adamw_steps(&model, &x, &y)?;
        assert_close(
            &losses,
            &exp.f32s("adamw.losses"),
            1e-4,
            &format!("{fixture}: losses before each step and after the last"),
        );
        for t in model.config.hf_tensors() {
            // Rounding noise here is up to 1e-5 of the largest gradient: Qwen2's key bias in
            // the slowest rotary dims (the rotation there is nearly the identity over 16
            // positions, so a constant added to every key shifts each score row uniformly;
            // 4e-7 of the tensor's largest gradient in this fixture).
            assert_after_adamw(
                &rows_of(&model.params.read(&t.param)?, &t),
                &exp.f32s(&format!("adamw3.{}", t.name)),
                &exp.f32s(&format!("grad.{}", t.name)),
                1e-5,
                &format!("{fixture}: {}", t.name),
            );
        }
    }
    Ok(())
}

/// Under mixed precision the loss stays within the 1% GPT-2's --amp holds against f32
/// (tests/amp.rs).
#[test]
fn the_loss_under_mixed_precision_matches_transformers() -> Result<()> {
    for (fixture, family) in FIXTURES {
        let exp = Expected::load(&dir(fixture));
        let mut model = model(fixture, family)?;
        model.set_amp(true)?;
        let (x, y) = shifted(model.params.device(), &exp.ids())?;
        let loss = model.loss(&x, &y)?.item()? as f64;
        let want = exp.f32s("loss")[0];
        assert!(
            (loss - want).abs() / want < 0.01,
            "{fixture}: --amp loss {loss} vs transformers' {want}"
        );
    }
    Ok(())
}
