//! Text generation with a KV cache: the prompt runs through the model once (the fused causal
//! attention over its T0 positions, its keys and values written into the cache), then each new
//! token runs one position: its query attends over the cached keys and values of every
//! position so far with plain ops, q (B, H, 1, D) @ K^T (B, H, D, L), softmax, @ V (B, H, L, D).
//! The cache is one (B, KV, n_positions, D) tensor per layer for K and one for V (KV key/value
//! heads: GPT-2's H; the Llama family's grouped heads, each serving H / KV query heads, which
//! read it in place as (B, KV, H / KV, D) queries), allocated once and written in place, one
//! position at a time. The Llama family's keys are stored rotated (rotary embedding at their
//! positions). Sampling (temperature, top-k, top-p) is on the
//! host from the last position's logits, seeded.
//!
//! Shape legend: B batch, L positions cached, H heads, D head dim, C = H * D, V vocabulary.

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::nn::{Decoder, Family};
use crate::ops::{launch_copy, Activation, Out};

/// Keys and values of every position run so far, per layer.
pub struct KvCache {
    k: Vec<Tensor>, // (B, KV, n_positions, D) per layer
    v: Vec<Tensor>, // (B, KV, n_positions, D) per layer
    /// Positions filled.
    len: usize,
}

/// A model and its cache: feed tokens, get the next token's logits.
pub struct Generator<'a> {
    model: &'a Decoder,
    cache: KvCache,
    batch: usize,
}

impl<'a> Generator<'a> {
    /// An empty cache for `batch` sequences of up to n_positions tokens.
    pub fn new(model: &'a Decoder, batch: usize) -> Result<Generator<'a>> {
        let cfg = &model.config;
        let dev = model.params.device();
        let shape = [batch, cfg.n_kv_head, cfg.n_positions, cfg.head_dim];
        let mut k = Vec::with_capacity(cfg.n_layer);
        let mut v = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            k.push(Tensor::zeros(dev, &shape)?);
            v.push(Tensor::zeros(dev, &shape)?);
        }
        Ok(Generator {
            model,
            cache: KvCache { k, v, len: 0 },
            batch,
        })
    }

    /// Positions in the cache.
    pub fn len(&self) -> usize {
        self.cache.len
    }

    pub fn is_empty(&self) -> bool {
        self.cache.len == 0
    }

    /// Runs `ids` (B, t) row-major at the next t positions and returns the logits of the last
    /// one, (B, V), still on the GPU. Several tokens at once only into an empty cache (the
    /// prompt); after that one token per call.
    pub fn feed(&mut self, ids: &[u32]) -> Result<Tensor> {
        no_grad(|| self.record(ids))
    }

    fn record(&mut self, ids: &[u32]) -> Result<Tensor> {
        let cfg = &self.model.config;
        let b = self.batch;
        if ids.is_empty() || !ids.len().is_multiple_of(b) {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: format!("{} token ids do not fill {b} rows", ids.len()),
            });
        }
        let t = ids.len() / b;
        let start = self.cache.len;
        if start + t > cfg.n_positions {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: format!(
                    "position {} is past the model's {} positions",
                    start + t - 1,
                    cfg.n_positions
                ),
            });
        }
        if t > 1 && start > 0 {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: format!(
                    "{t} tokens at once into a cache of {start}: after the prompt, one at a time"
                ),
            });
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: format!(
                    "token id {bad} is outside the vocabulary of {}",
                    cfg.vocab_size
                ),
            });
        }
        let dev = self.model.params.device();
        let c = cfg.n_embd;
        let ids = Tensor::from_u32(dev, ids, &[b * t])?;
        let mut x = self.model.embed_tokens(&ids)?.reshape(&[b, t, c])?; // (B, t, C)
        if cfg.family == Family::Gpt2 {
            x = x.add(&self.p("wpe.weight")?.narrow(0, start, t)?)?; // + (t, C)
        }
        for i in 0..cfg.n_layer {
            x = match cfg.family {
                Family::Gpt2 => self.block(i, &x, start)?,
                _ => self.llama_block(i, &x, start)?,
            };
        }
        let last = x.narrow(1, t - 1, 1)?; // (B, 1, C)
        let last = self.model.final_norm(&last, None)?;
        let logits = self.model.lm_head(&last)?; // (B, 1, V)
        self.cache.len = start + t;
        logits.reshape(&[b, cfg.vocab_size])
    }

    fn p(&self, name: &str) -> Result<&'a Tensor> {
        let model: &'a Decoder = self.model;
        model
            .params
            .get(name)
            .ok_or_else(|| Error::InvalidArgument {
                op: "generate",
                reason: format!("no parameter `{name}`"),
            })
    }

    /// Block `i` on x (B, t, C) at positions start..start + t, writing their keys and values
    /// into the cache.
    fn block(&self, i: usize, x: &Tensor, start: usize) -> Result<Tensor> {
        let cfg = &self.model.config;
        let (b, t, c) = (x.shape()[0], x.shape()[1], cfg.n_embd);
        let (h, d) = (cfg.n_head, c / cfg.n_head);
        let p = |s: &str| self.p(&format!("h.{i}.{s}"));
        let eps = cfg.layer_norm_epsilon;

        let a = x.layer_norm(p("ln_1.weight")?, p("ln_1.bias")?, eps)?;
        let qkv = a.linear(
            p("attn.c_attn.weight")?,
            Some(p("attn.c_attn.bias")?),
            Activation::None,
        )?; // (B, t, 3C)
        let qkv = qkv.reshape(&[b, t, 3, h, d])?;
        let heads = |k: usize| -> Result<Tensor> {
            qkv.narrow(2, k, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3])
        }; // (B, H, t, D) views
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let (cache_k, cache_v) = (&self.cache.k[i], &self.cache.v[i]);
        launch_copy(&k, Out::Write(&cache_k.narrow(2, start, t)?))?;
        launch_copy(&v, Out::Write(&cache_v.narrow(2, start, t)?))?;
        let y = if t > 1 {
            // The prompt (start is 0): every position attends to the ones before it.
            q.causal_attention(&k, &v)?
        } else {
            let len = start + 1;
            // Contiguous q: its (B, H) batch dims merge into one stride, as the cache's do, so
            // the matmuls read the cache in place.
            let q = q.contiguous()?; // (B, H, 1, D)
            let keys = cache_k.narrow(2, 0, len)?; // (B, H, L, D)
            let values = cache_v.narrow(2, 0, len)?; // (B, H, L, D)
            let scores = q.matmul(&keys.t()?)?.mul_scalar(1.0 / (d as f32).sqrt())?; // (B, H, 1, L)
            scores.softmax()?.matmul(&values)? // (B, H, 1, D)
        };
        let y = y.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?; // (B, t, C)
        let y = y.linear(
            p("attn.c_proj.weight")?,
            Some(p("attn.c_proj.bias")?),
            Activation::None,
        )?;
        let x = x.add(&y)?;
        let m = x.layer_norm(p("ln_2.weight")?, p("ln_2.bias")?, eps)?;
        let m = m.linear(
            p("mlp.c_fc.weight")?,
            Some(p("mlp.c_fc.bias")?),
            Activation::Gelu,
        )?; // (B, t, 4C)
        let m = m.linear(
            p("mlp.c_proj.weight")?,
            Some(p("mlp.c_proj.bias")?),
            Activation::None,
        )?;
        x.add(&m)
    }

    /// A Llama-family block on x (B, t, C) at positions start..start + t, writing their rotated
    /// keys and their values into the cache.
    fn llama_block(&self, i: usize, x: &Tensor, start: usize) -> Result<Tensor> {
        let model = self.model;
        let cfg = &model.config;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (h, kv, d) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
        let name = |s: &str| format!("layers.{i}.{s}");
        let p = |s: &str| self.p(&name(s));
        let bias = |s: &str| model.params.get(&name(s));
        let eps = cfg.layer_norm_epsilon;
        let rope = model.rope().expect("the Llama family has a rotary table");

        let a = x.rms_norm(p("input_layernorm.weight")?, eps)?;
        let qkv = a.linear(
            &p("self_attn.qkv_proj.weight")?.t()?,
            bias("self_attn.qkv_proj.bias"),
            Activation::None,
        )?; // (B, t, (H + 2 KV) D)
        let qkv = match cfg.family {
            Family::Qwen3 => model.qk_norm(i, &qkv)?,
            _ => qkv,
        };
        let split = qkv.reshape(&[b, t, h + 2 * kv, d])?;
        let heads = |first: usize, n: usize| -> Result<Tensor> {
            split.narrow(2, first, n)?.permute(&[0, 2, 1, 3])
        }; // (B, n, t, D) views
        let keys = heads(h, kv)?.rope_reference(rope, start)?;
        let (cache_k, cache_v) = (&self.cache.k[i], &self.cache.v[i]);
        launch_copy(&keys, Out::Write(&cache_k.narrow(2, start, t)?))?;
        launch_copy(
            &heads(h + kv, kv)?,
            Out::Write(&cache_v.narrow(2, start, t)?),
        )?;
        let y = if t > 1 {
            // The prompt (start is 0): the fused grouped attention, rotating as it loads.
            qkv.causal_self_attention_grouped(h, kv, Some(rope))? // (B, t, H D)
        } else {
            let len = start + 1;
            // The query heads of each key/value head as its rows: (B, KV, H / KV, D).
            let q = heads(0, h)?
                .rope_reference(rope, start)?
                .contiguous()?
                .reshape(&[b, kv, h / kv, d])?;
            let keys = cache_k.narrow(2, 0, len)?; // (B, KV, L, D)
            let values = cache_v.narrow(2, 0, len)?; // (B, KV, L, D)
            let scores = q.matmul(&keys.t()?)?.mul_scalar(1.0 / (d as f32).sqrt())?; // (B, KV, H / KV, L)
            scores
                .softmax()?
                .matmul(&values)? // (B, KV, H / KV, D)
                .reshape(&[b, 1, h * d])?
        };
        let x = x.add(&y.linear(
            &p("self_attn.o_proj.weight")?.t()?,
            bias("self_attn.o_proj.bias"),
            Activation::None,
        )?)?;
        let m = x.rms_norm(p("post_attention_layernorm.weight")?, eps)?;
        let m = m
            .linear(
                &p("mlp.gate_up_proj.weight")?.t()?,
                bias("mlp.gate_up_proj.bias"),
                Activation::None,
            )? // (B, t, 2F)
            .swiglu_as(crate::graph::DType::F32)?;
        x.add(&m.linear(
            &p("mlp.down_proj.weight")?.t()?,
            bias("mlp.down_proj.bias"),
            Activation::None,
        )?)
    }
}

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy (the most likely token); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to p at least (1: all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl Sampling {
    fn check(&self) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidArgument {
                op: "sampling",
                reason,
            })
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!(
                "temperature {} must be 0 (greedy) or positive",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top-p {} must be in (0, 1]", self.top_p));
        }
        Ok(())
    }
}

/// SplitMix64: the sampling stream, fixed by its seed on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The next token from one row of logits: argmax at temperature 0 (the lowest id among
/// ties), else a draw from softmax(logits / temperature) restricted to the top-k, then to the
/// top-p nucleus.
fn choose(logits: &[f32], s: &Sampling, rng: &mut SplitMix64) -> u32 {
    let argmax = || {
        let mut best = 0;
        for (i, &x) in logits.iter().enumerate() {
            if x > logits[best] {
                best = i;
            }
        }
        best as u32
    };
    if s.temperature == 0.0 {
        return argmax();
    }
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    if s.top_k > 0 {
        order.truncate(s.top_k);
    }
    let top = logits[order[0] as usize] as f64;
    let t = s.temperature as f64;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i as usize] as f64 - top) / t).exp())
        .collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    let mut kept = 0;
    let mut mass = 0.0;
    while kept < probs.len() && mass < s.top_p as f64 {
        mass += probs[kept];
        kept += 1;
    }
    if kept == 0 || !mass.is_finite() {
        // Probabilities that are not numbers (non-finite logits, a temperature so small the
        // division overflows): the most likely token, as at temperature 0.
        return argmax();
    }
    let r = rng.uniform() * mass;
    let mut acc = 0.0;
    for (i, &p) in probs[..kept].iter().enumerate() {
        acc += p;
        if r < acc {
            return order[i];
        }
    }
    order[kept - 1]
}

/// The errors `generate` would return for these arguments, before any work: an empty prompt,
/// a prompt plus new tokens past the model's positions, bad sampling settings.
pub fn check_request(
    model: &Decoder,
    prompt_len: usize,
    max_new: usize,
    sampling: &Sampling,
) -> Result<()> {
    sampling.check()?;
    let n_pos = model.config.n_positions;
    if prompt_len == 0 {
        return Err(Error::InvalidArgument {
            op: "generate",
            reason: "the prompt holds no token".into(),
        });
    }
    if prompt_len
        .checked_add(max_new)
        .is_none_or(|end| end > n_pos)
    {
        return Err(Error::InvalidArgument {
            op: "generate",
            reason: format!(
                "the prompt's {prompt_len} tokens plus {max_new} new ones exceed the model's \
                 {n_pos} positions (ask for {} new tokens at most)",
                n_pos.saturating_sub(prompt_len)
            ),
        });
    }
    Ok(())
}

/// Generates up to `max_new` tokens after `prompt` (one sequence), calling `on_token` with each
/// as it comes; stops early at `stop` (the end-of-text token) when given. An empty prompt is an
/// error (start it with the end-of-text token, as GPT-2 was trained).
pub fn generate(
    model: &Decoder,
    prompt: &[u32],
    max_new: usize,
    sampling: &Sampling,
    stop: Option<u32>,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Vec<u32>> {
    check_request(model, prompt.len(), max_new, sampling)?;
    let mut gen = Generator::new(model, 1)?;
    let mut rng = SplitMix64(sampling.seed);
    let mut out = Vec::with_capacity(max_new);
    if max_new == 0 {
        return Ok(out);
    }
    let mut logits = gen.feed(prompt)?;
    loop {
        let next = choose(&logits.to_vec()?, sampling, &mut rng);
        out.push(next);
        on_token(next)?;
        if out.len() == max_new || Some(next) == stop {
            return Ok(out);
        }
        logits = gen.feed(&[next])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top_k_and_top_p_choose_from_the_right_sets() {
        let logits = [1.0, 3.0, 2.0, 3.0, -1.0];
        let mut rng = SplitMix64(1);
        let greedy = Sampling {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(
            choose(&logits, &greedy, &mut rng),
            1,
            "the lowest id of a tie"
        );
        let top2 = Sampling {
            top_k: 2,
            ..Default::default()
        };
        for _ in 0..50 {
            assert!([1, 3].contains(&choose(&logits, &top2, &mut rng)));
        }
        // p(1) = p(3) ~ 0.39: a nucleus of 0.5 holds both, 0.3 only the first.
        let nucleus = Sampling {
            top_p: 0.3,
            ..Default::default()
        };
        for _ in 0..50 {
            assert_eq!(choose(&logits, &nucleus, &mut rng), 1);
        }
        let all = Sampling::default();
        let mut seen = [0; 5];
        for _ in 0..2000 {
            seen[choose(&logits, &all, &mut rng) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
        assert!(seen[1] > seen[0] && seen[0] > seen[4], "{seen:?}");
    }

    #[test]
    fn logits_that_are_not_numbers_choose_a_token_without_panicking() {
        let mut rng = SplitMix64(2);
        let tiny = Sampling {
            temperature: f32::MIN_POSITIVE,
            ..Default::default()
        };
        for logits in [
            [f32::NAN; 4],
            [0.0, f32::INFINITY, f32::INFINITY, 1.0],
            [f32::NEG_INFINITY; 4],
            [1.0, 2.0, f32::NAN, 0.0],
        ] {
            for s in [&tiny, &Sampling::default()] {
                assert!(choose(&logits, s, &mut rng) < 4, "{logits:?}");
            }
        }
    }
}
