//! The Llama family (Llama, Qwen2, Qwen3) built from wgrad's kernels, on micro configs with
//! grouped heads: the fused kernels give the loss and every gradient of their unfused
//! reference compositions; KV-cache generation gives the full forward's logits at every
//! position; mixed precision gives f32's gradients within f16 rounding (SwiGLU's gate/up
//! weights among them); a few AdamW steps learn a fixed batch.
//!
//! The three configs (C 32, V 97, 2 layers, 4 heads):
//! - Llama: 2 key/value heads, head_dim 8, an untied LM head, no biases;
//! - Qwen2 (parsed from config.json text): 2 key/value heads, q/k/v biases, tied head;
//! - Qwen3: 1 key/value head, head_dim 16 (an attention 64 wide over a residual of 32),
//!   q_norm/k_norm, tied head.

mod common;

use common::{assert_close, private_dev, relative};
use wgrad::model::{Generator, HfConfig};
use wgrad::nn::{Decoder, Family, Kernels, ModelConfig};
use wgrad::optim::{AdamW, AdamWConfig};
use wgrad::{Device, Result, Tensor};

const VOCAB: usize = 97;

/// A Llama-family config on GPT-2's sizes (C 32, 2 layers, 4 heads, 48 positions).
fn llama_family(family: Family, n_kv_head: usize, head_dim: usize) -> ModelConfig {
    ModelConfig {
        family,
        n_kv_head,
        head_dim,
        n_inner: 88, // not a multiple of the tiles
        layer_norm_epsilon: 1e-5,
        // Large weights: logits of std ~ 0.5 sqrt(C) (RMSNorm makes h of norm sqrt(C)), a loss far
        // from ln(vocab).
        initializer_range: 0.5,
        rope_theta: 10000.0,
        tie_word_embeddings: true,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        ..ModelConfig::gpt2(VOCAB, 48, 32, 2, 4)
    }
}

/// Qwen2 as its config.json says it: q/k/v biases come with the architecture.
const QWEN2_JSON: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "vocab_size": 97,
  "hidden_size": 32,
  "intermediate_size": 88,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "max_position_embeddings": 48,
  "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0,
  "tie_word_embeddings": true,
  "initializer_range": 0.5,
  "hidden_act": "silu",
  "use_sliding_window": false
}"#;

fn configs() -> Vec<ModelConfig> {
    let llama = ModelConfig {
        tie_word_embeddings: false,
        ..llama_family(Family::Llama, 2, 8)
    };
    let qwen2 = HfConfig::parse("qwen2 config.json", QWEN2_JSON)
        .expect("the Qwen2 config parses")
        .model;
    assert!(
        qwen2.qkv_bias && !qwen2.o_bias && qwen2.tie_word_embeddings && qwen2.head_dim == 8,
        "{qwen2:?}"
    );
    let qwen3 = llama_family(Family::Qwen3, 1, 16);
    vec![llama, qwen2, qwen3]
}

/// The config with a small initialization (the one training and mixed precision use).
fn gentle(c: ModelConfig) -> ModelConfig {
    ModelConfig {
        initializer_range: 0.02,
        ..c
    }
}

/// Seeded ids (B, T + 1) cut into inputs (B, T) and next-token targets (B, T).
fn batch(dev: &Device, b: usize, t: usize) -> Result<(Tensor, Tensor)> {
    common::next_token_batch(dev, b, t, VOCAB as u32)
}

/// A loss and every parameter's gradient by name.
type Run = (f32, Vec<(String, Vec<f32>)>);

/// The loss and every parameter's gradient (by name) of one backward.
fn loss_and_grads(model: &Decoder, x: &Tensor, y: &Tensor) -> Result<Run> {
    model.params.zero_grad();
    let loss = model.loss(x, y)?;
    loss.backward()?;
    let grads = model
        .params
        .iter()
        .map(|(name, p)| {
            let g = p
                .grad()
                .unwrap_or_else(|| panic!("{name} gets a gradient"))
                .to_vec()?;
            Ok((name.to_string(), g))
        })
        .collect::<Result<_>>()?;
    Ok((loss.item()?, grads))
}

#[test]
fn fused_models_match_their_unfused_references() -> Result<()> {
    let dev = private_dev();
    // An odd length: no tile of the attention or the products is whole.
    let (x, y) = batch(&dev, 2, 13)?;
    for config in configs() {
        let family = config.family;
        let mut model = Decoder::new(&dev, config, 7)?;
        let mut runs = Vec::new();
        for kernels in [Kernels::Fused, Kernels::Reference] {
            model.kernels = kernels;
            runs.push(loss_and_grads(&model, &x, &y)?);
        }
        let (fused, reference) = (&runs[0], &runs[1]);
        assert!(
            (fused.0 - (VOCAB as f32).ln()).abs() > 0.5,
            "{family:?}: loss {} is too close to ln(vocab)",
            fused.0
        );
        assert_close(
            &[fused.0],
            &[reference.0 as f64],
            1e-5,
            &format!("{family:?} loss"),
        );
        assert_eq!(fused.1.len(), reference.1.len());
        for ((name, g), (_, r)) in fused.1.iter().zip(&reference.1) {
            let want: Vec<f64> = r.iter().map(|&v| v as f64).collect();
            assert!(
                want.iter().any(|&v| v != 0.0),
                "{family:?}: {name}'s gradient is all zero"
            );
            assert_close(g, &want, 1e-4, &format!("{family:?} grad of {name}"));
        }
    }
    Ok(())
}

/// The logits `Generator::feed` returns, for a prompt of 5 and then 6 single tokens, two
/// sequences at once, are the full forward's at those positions.
#[test]
fn cached_generation_gives_the_full_forwards_logits() -> Result<()> {
    let dev = private_dev();
    let (b, t, prompt) = (2, 11, 5);
    let (x, _) = batch(&dev, b, t)?;
    let ids = x.to_vec_u32()?;
    for config in configs() {
        let family = config.family;
        let model = Decoder::new(&dev, config, 3)?;
        let full = model.forward(&x)?.to_vec()?; // (B, T, V)
        let at = |p: usize| -> Vec<f64> {
            (0..b)
                .flat_map(|r| full[(r * t + p) * VOCAB..(r * t + p + 1) * VOCAB].to_vec())
                .map(|v| v as f64)
                .collect()
        };
        let mut gen = Generator::new(&model, b)?;
        let first: Vec<u32> = (0..b)
            .flat_map(|r| ids[r * t..r * t + prompt].to_vec())
            .collect();
        let logits = gen.feed(&first)?;
        assert_eq!(logits.shape(), [b, VOCAB]);
        assert_close(
            &logits.to_vec()?,
            &at(prompt - 1),
            1e-4,
            &format!("{family:?}: the prompt's last logits"),
        );
        for p in prompt..t {
            let next: Vec<u32> = (0..b).map(|r| ids[r * t + p]).collect();
            let logits = gen.feed(&next)?.to_vec()?;
            assert_close(
                &logits,
                &at(p),
                1e-4,
                &format!("{family:?}: logits at position {p}"),
            );
        }
        assert_eq!(gen.len(), t);
    }
    Ok(())
}

/// As tests/amp.rs for GPT-2: one mixed-precision backward against f32's, each gradient within
/// 1e-2 in the 2-norm. The gate/up weight's gradient is checked by halves too (gate rows, up
/// rows): SwiGLU's backward stores its gradient f16 under autocast, and either half alone
/// could be wrong without moving the whole much.
#[test]
fn amp_gradients_match_f32_within_f16_rounding() -> Result<()> {
    let dev = private_dev();
    let (x, y) = batch(&dev, 2, 16)?;
    for config in configs() {
        let family = config.family;
        let f = config.n_inner;
        let c = config.n_embd;
        let mut model = Decoder::new(&dev, gentle(config), 5)?;
        let mut runs = Vec::new();
        for amp in [false, true] {
            model.set_amp(amp)?;
            runs.push(loss_and_grads(&model, &x, &y)?);
        }
        let (l32, g32) = &runs[0];
        let (l16, g16) = &runs[1];
        assert!(
            (l32 - l16).abs() < 1e-3 * l32,
            "{family:?}: loss {l16} vs {l32}"
        );
        let mut worst = (0f32, String::new());
        for ((name, a), (_, b)) in g16.iter().zip(g32) {
            let mut parts = vec![(name.clone(), a.as_slice(), b.as_slice())];
            if name.ends_with("mlp.gate_up_proj.weight") {
                let half = f * c;
                parts.push((format!("{name} (gate rows)"), &a[..half], &b[..half]));
                parts.push((format!("{name} (up rows)"), &a[half..], &b[half..]));
            }
            for (what, a, b) in parts {
                let err = relative(a, b);
                if err > worst.0 {
                    worst = (err, what.clone());
                }
                assert!(
                    err < 1e-2,
                    "{family:?}: {what}: relative gradient error {err:.2e}"
                );
            }
        }
        println!(
            "{family:?}: amp loss {l16} vs f32 {l32}; worst relative gradient error {:.2e} ({})",
            worst.0, worst.1
        );
        assert!(
            model
                .params
                .half("layers.0.mlp.gate_up_proj.weight")
                .is_some(),
            "{family:?}: the gate/up weight has an f16 copy"
        );
    }
    Ok(())
}

#[test]
fn small_llama_family_models_learn_a_fixed_batch() -> Result<()> {
    let dev = private_dev();
    let (x, y) = batch(&dev, 4, 16)?;
    for config in configs() {
        let family = config.family;
        let model = Decoder::new(&dev, gentle(config), 11)?;
        let mut opt = AdamW::new(
            &model.params,
            AdamWConfig {
                max_grad_norm: Some(1.0),
                ..Default::default()
            },
        )?;
        let mut losses = Vec::new();
        for _ in 0..30 {
            let loss = model.loss(&x, &y)?;
            loss.backward()?;
            opt.step(&model.params, 3e-3)?;
            losses.push(loss.item()?);
        }
        assert!(
            (losses[0] - (VOCAB as f32).ln()).abs() < 0.1,
            "{family:?}: a small init starts near ln(vocab): {losses:?}"
        );
        assert!(losses[29] < 0.5 * losses[0], "{family:?}: {losses:?}");
    }
    Ok(())
}
