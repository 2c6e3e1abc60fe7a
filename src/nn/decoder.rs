//! The decoder-only language model of every family wgrad trains, its parts picked by the
//! config (`ModelConfig`, `Family`):
//!
//! - GPT-2: token and learned position embeddings, pre-LayerNorm blocks (causal self-attention
//!   and a GELU MLP, each with a residual), a final LayerNorm and an LM head tied to the token
//!   embedding. Weights are Conv1D's [in, out] (`h.{i}.attn.c_attn.weight` is (C, 3C)), what
//!   `linear` takes.
//! - The Llama family (Llama, Qwen2, Qwen3): token embeddings, pre-RMSNorm blocks (grouped-query
//!   attention with rotary positions applied inside the attention kernels, a SwiGLU MLP),
//!   a final RMSNorm and an LM head tied or not. Weights are `nn.Linear`'s [out, in], multiplied
//!   through a transposed view; q/k/v are one stacked parameter and gate/up another
//!   (`ModelConfig::hf_tensors`), so each is one product.
//!
//! The token embedding (V, C) may be stored as row shards (`Parameters` splits a parameter over
//! the storage-binding limit: 50257 x 768 f32 is 154 MB, lavapipe binds 128 MiB): the lookup
//! gathers from every shard (`index_select_shards`) and a tied head multiplies by each shard
//! into its columns of the logits (`matmul_t_shards`). One shard runs today's kernels.

use crate::error::{Error, Result};
use crate::graph::{DType, Device, Tensor};
use crate::nn::{Family, ModelConfig, Parameters};
use crate::ops::{linear_casts_input, Activation, Rope};

#[path = "decoder_loss.rs"]
mod loss;

/// Which kernels the model runs: the fused ones, or the unfused compositions they are checked
/// against (slow; for tests and debugging).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kernels {
    #[default]
    Fused,
    Reference,
}

/// A decoder-only language model over a `Parameters` store.
pub struct Decoder {
    pub config: ModelConfig,
    pub params: Parameters,
    pub kernels: Kernels,
    /// Mixed precision (`set_amp`): the matmuls read the weights' f16 copies and run in f16
    /// with f32 accumulation; the MLP's hidden activation (GELU's or SwiGLU's output) and the
    /// norms' outputs that feed a product are stored as f16 by their kernels (each one's
    /// consumer is a matmul that would round it to f16 first); norm statistics, attention,
    /// softmax and cross-entropy stay f32.
    amp: bool,
    /// The Llama family's rotary table (cos and sin for every position).
    rope: Option<Rope>,
    /// A zero bias of width C for the residual products without one (the Llama family's o_proj
    /// and down_proj): the product's residual epilogue takes a bias. Not a parameter.
    zero_bias: Option<Tensor>,
}

impl Decoder {
    /// A model with its family's initialization, drawn from `seed`: GPT-2's (normal(0, 0.02),
    /// the residual projections scaled by 1/sqrt(2 n_layer); LayerNorm weights 1, biases 0) or
    /// transformers' for the Llama family (every weight and embedding normal(0,
    /// initializer_range), biases 0, RMSNorm weights 1).
    pub fn new(device: &Device, config: ModelConfig, seed: u64) -> Result<Decoder> {
        config.validate()?;
        let params = Parameters::new(device, &config.param_specs())?;
        let std = config.initializer_range;
        let proj_std = match config.family {
            Family::Gpt2 => std / (2.0 * config.n_layer as f32).sqrt(),
            _ => std,
        };
        for (k, spec) in params.specs().enumerate() {
            let seed = seed.wrapping_mul(1_000_003).wrapping_add(k as u64);
            let name = spec.name.as_str();
            let cols: usize = spec.shape[1..].iter().product();
            // A split parameter's shards draw their part of the whole one's sequence.
            for shard in params.shards(name).into_iter().flatten() {
                let t = shard.tensor;
                if is_norm_weight(name) {
                    t.fill_(1.0)?;
                } else if name.ends_with(".bias") {
                    t.fill_(0.0)?;
                } else {
                    let std = if name.ends_with("c_proj.weight") {
                        proj_std
                    } else {
                        std
                    };
                    t.fill_normal_at_(0.0, std, seed, shard.first_row * cols)?;
                }
            }
        }
        Decoder::from_params(config, params)
    }

    /// A model over parameters that already hold its weights (loaded from a file).
    pub fn from_params(config: ModelConfig, params: Parameters) -> Result<Decoder> {
        let device = params.device().clone();
        let (rope, zero_bias) = if config.family.is_llama() {
            (
                Some(Rope::new(
                    &device,
                    config.rope_theta,
                    config.head_dim,
                    config.n_positions,
                )?),
                Some(Tensor::zeros(&device, &[config.n_embd])?),
            )
        } else {
            (None, None)
        };
        Ok(Decoder {
            config,
            params,
            kernels: Kernels::Fused,
            amp: false,
            rope,
            zero_bias,
        })
    }

    /// Turns mixed precision on (f16 copies of the weights, made from their current values;
    /// the optimizer keeps them current) or off.
    pub fn set_amp(&mut self, on: bool) -> Result<()> {
        let gpu = self.params.device().gpu();
        if on && !gpu.has(wgpu::Features::SHADER_F16) {
            return Err(Error::InvalidArgument {
                op: "--amp",
                reason: format!(
                    "mixed precision needs f16 in shaders (shader-f16), which {} lacks",
                    gpu.info.name
                ),
            });
        }
        if on {
            self.params.enable_half()?;
        }
        self.amp = on;
        Ok(())
    }

    pub fn amp(&self) -> bool {
        self.amp
    }

    /// A matmul weight: its f16 copy under mixed precision.
    fn w(&self, name: &str) -> Result<&Tensor> {
        match self.params.half(name) {
            Some(h) if self.amp => Ok(h),
            _ => self.p(name),
        }
    }

    fn p(&self, name: &str) -> Result<&Tensor> {
        if let Some(t) = self.params.get(name) {
            return Ok(t);
        }
        let reason = match self.params.shards(name) {
            Some(shards) => {
                let gpu = self.params.device().gpu();
                format!(
                    "parameter `{name}` is split into {} row shards (over the {}-byte storage \
                     binding limit); only the embedding and the LM head may be split",
                    shards.len(),
                    gpu.limits.max_storage_buffer_binding_size
                )
            }
            None => format!("no parameter `{name}`"),
        };
        Err(Error::InvalidArgument {
            op: "model",
            reason,
        })
    }

    /// Logits (B, T, V) for token ids (B, T) (a u32 tensor), f32.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        crate::ops::autocast(self.amp, || self.forward_logits(ids))
    }

    fn forward_logits(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.forward_hidden(ids)?;
        self.lm_head(&x)
    }

    /// The final hidden states (B, T, C), after the final norm: what the LM head multiplies.
    fn forward_hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let cfg = &self.config;
        if ids.rank() != 2 {
            return Err(Error::ShapeMismatch {
                op: "model forward",
                expected: "token ids of shape (B, T)".into(),
                got: ids.shape().to_vec(),
            });
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        if t > cfg.n_positions {
            return Err(Error::InvalidArgument {
                op: "model forward",
                reason: format!(
                    "a sequence of {t} tokens is longer than the model's {} positions",
                    cfg.n_positions
                ),
            });
        }
        let c = cfg.n_embd;
        let flat = ids.reshape(&[b * t])?;
        let mut x = self.embed_tokens(&flat)?.reshape(&[b, t, c])?; // (B, T, C)
        if cfg.family == Family::Gpt2 {
            x = x.add(&self.p("wpe.weight")?.narrow(0, 0, t)?)?; // + (T, C)
        }
        for i in 0..cfg.n_layer {
            x = self.block(i, &x)?;
        }
        // The LM head's (C, V) weight, where it is one linear (`lm_head`, `loss_logits`).
        let head = (self.head_shards()?.len() == 1).then_some((c, cfg.vocab_size));
        self.final_norm(&x, head)
    }

    /// The final norm (ln_f or norm) of x, its output feeding the `next` linear.
    pub(crate) fn final_norm(&self, x: &Tensor, next: Option<(usize, usize)>) -> Result<Tensor> {
        match self.config.family {
            Family::Gpt2 => self.layer_norm(x, "ln_f.weight", "ln_f.bias", next),
            _ => self.rms_norm(x, "norm.weight", next),
        }
    }

    /// The token embeddings (N, C) of ids (N) (a u32 tensor made from host data, for backward).
    pub fn embed_tokens(&self, ids: &Tensor) -> Result<Tensor> {
        let shards = self.shards_of(self.config.embedding())?;
        let tables: Vec<&Tensor> = shards.iter().map(|s| s.tensor).collect();
        Tensor::index_select_shards(&tables, ids)
    }

    /// The LM head: logits (..., V) of x (..., C), f32.
    pub fn lm_head(&self, x: &Tensor) -> Result<Tensor> {
        let shards = self.head_shards()?;
        match shards.as_slice() {
            // (..., C) @ (C, V).
            [head] => self.linear(x, &self.w(head.name)?.t()?, None, Activation::None),
            _ => {
                let weights = shards
                    .iter()
                    .map(|s| self.w(s.name))
                    .collect::<Result<Vec<_>>>()?;
                x.matmul_t_shards(&weights)
            }
        }
    }

    /// The LM head's (V, C) weight as row shards (one when it fits one storage binding): the
    /// token embedding's when tied, else lm_head.weight's.
    fn head_shards(&self) -> Result<Vec<crate::nn::RowShard<'_>>> {
        let name = if self.config.tie_word_embeddings {
            self.config.embedding()
        } else {
            ModelConfig::LM_HEAD
        };
        self.shards_of(name)
    }

    fn shards_of(&self, name: &str) -> Result<Vec<crate::nn::RowShard<'_>>> {
        self.params
            .shards(name)
            .ok_or_else(|| Error::InvalidArgument {
                op: "model",
                reason: format!("no parameter `{name}`"),
            })
    }

    /// The rotary table (the Llama family).
    pub(crate) fn rope(&self) -> Option<&Rope> {
        self.rope.as_ref()
    }

    /// One pre-norm block on x (B, T, C).
    pub fn block(&self, i: usize, x: &Tensor) -> Result<Tensor> {
        crate::ops::autocast(self.amp, || match self.config.family {
            Family::Gpt2 => self.gpt2_block(i, x),
            _ => self.llama_block(i, x),
        })
    }

    /// The dtype a fused qkv projection is stored in: f16 under mixed precision where the
    /// attention's kernels read it so (they round q, k, v to f16 as they load them anyway).
    fn qkv_dtype(&self, x: &Tensor) -> DType {
        if self.amp
            && self.kernels == Kernels::Fused
            && crate::ops::attention_stores_half(x.device())
        {
            DType::F16
        } else {
            DType::F32
        }
    }

    /// The MLP's hidden activation's dtype: f16 under mixed precision (its consumer is a
    /// product that reads f16).
    fn hidden_dtype(&self) -> DType {
        if self.amp {
            DType::F16
        } else {
            DType::F32
        }
    }

    fn gpt2_block(&self, i: usize, x: &Tensor) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, t, c) = (x.shape()[0], x.shape()[1], cfg.n_embd);
        let (h, d) = (cfg.n_head, cfg.head_dim);
        let n = |s: &str| format!("h.{i}.{s}");
        let p = |s: &str| self.p(&n(s));
        let w = |s: &str| self.w(&n(s));

        let c_attn = w("attn.c_attn.weight")?;
        let a = self.layer_norm(
            x,
            &n("ln_1.weight"),
            &n("ln_1.bias"),
            Some((c, c_attn.shape()[1])),
        )?;
        let qkv = self.linear_as(
            &a,
            c_attn,
            Some(p("attn.c_attn.bias")?),
            Activation::None,
            self.qkv_dtype(x),
        )?; // (B, T, 3C)
        let y = match self.kernels {
            // The heads read in place; dQ, dK, dV written into one (B, T, 3C) gradient.
            Kernels::Fused => qkv.causal_self_attention(h)?,
            Kernels::Reference => {
                // Views, no copies: (B, T, 3C) -> (B, T, 3, H, D) -> q, k, v as (B, H, T, D).
                let qkv = qkv.reshape(&[b, t, 3, h, d])?;
                let heads = |k: usize| -> Result<Tensor> {
                    qkv.narrow(2, k, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3])
                };
                heads(0)?
                    .causal_attention_reference(&heads(1)?, &heads(2)?)? // (B, H, T, D)
                    .permute(&[0, 2, 1, 3])?
                    .reshape(&[b, t, c])?
            }
        }; // (B, T, C)
        let x = self.linear_residual(&y, w("attn.c_proj.weight")?, p("attn.c_proj.bias")?, x)?;

        let c_fc = w("mlp.c_fc.weight")?;
        let m = self.layer_norm(
            &x,
            &n("ln_2.weight"),
            &n("ln_2.bias"),
            Some((c, c_fc.shape()[1])),
        )?;
        let m = self.linear_as(
            &m,
            c_fc,
            Some(p("mlp.c_fc.bias")?),
            Activation::Gelu,
            self.hidden_dtype(),
        )?; // (B, T, 4C)
        self.linear_residual(&m, w("mlp.c_proj.weight")?, p("mlp.c_proj.bias")?, &x)
    }

    /// A Llama-family block: x + o_proj(attention(rope(q), rope(k), v)) of RMSNorm(x), then
    /// + down_proj(silu(gate) * up) of RMSNorm of that.
    fn llama_block(&self, i: usize, x: &Tensor) -> Result<Tensor> {
        let cfg = &self.config;
        let (h, kv) = (cfg.n_head, cfg.n_kv_head);
        let n = |s: &str| format!("layers.{i}.{s}");
        let bias = |s: &str| -> Result<Option<&Tensor>> {
            let name = n(s);
            Ok(match self.params.get(&name) {
                Some(_) => Some(self.p(&name)?),
                None => None,
            })
        };
        // nn.Linear's [out, in] weights, multiplied as (in, out) views.
        let w = |s: &str| self.w(&n(s))?.t();

        let qkv_w = w("self_attn.qkv_proj.weight")?;
        let a = self.rms_norm(
            x,
            &n("input_layernorm.weight"),
            Some((cfg.n_embd, cfg.qkv_width())),
        )?;
        let qkv = self.linear_as(
            &a,
            &qkv_w,
            bias("self_attn.qkv_proj.bias")?,
            Activation::None,
            self.qkv_dtype(x),
        )?; // (B, T, (H + 2 KV) D)
        let qkv = match cfg.family {
            Family::Qwen3 => self.qk_norm(i, &qkv)?,
            _ => qkv,
        };
        let rope = self
            .rope
            .as_ref()
            .expect("the Llama family has a rotary table");
        let y = match self.kernels {
            Kernels::Fused => qkv.causal_self_attention_grouped(h, kv, Some(rope))?,
            Kernels::Reference => qkv.causal_self_attention_grouped_reference(h, kv, Some(rope))?,
        }; // (B, T, H D)
        let zero = self
            .zero_bias
            .as_ref()
            .expect("the Llama family has a zero bias");
        let o_bias = bias("self_attn.o_proj.bias")?.unwrap_or(zero);
        let x = self.linear_residual(&y, &w("self_attn.o_proj.weight")?, o_bias, x)?;

        let gate_up = w("mlp.gate_up_proj.weight")?;
        let m = self.rms_norm(
            &x,
            &n("post_attention_layernorm.weight"),
            Some((cfg.n_embd, 2 * cfg.n_inner)),
        )?;
        let gu = self.linear_as(
            &m,
            &gate_up,
            bias("mlp.gate_up_proj.bias")?,
            Activation::None,
            self.hidden_dtype(),
        )?; // (B, T, 2F)
        let m = match self.kernels {
            Kernels::Fused => gu.swiglu_as(self.hidden_dtype())?,
            Kernels::Reference => gu.swiglu_unfused()?,
        }; // (B, T, F)
        let down_bias = bias("mlp.down_proj.bias")?.unwrap_or(zero);
        self.linear_residual(&m, &w("mlp.down_proj.weight")?, down_bias, &x)
    }

    /// Qwen3's RMSNorm of each query and key head (q_norm, k_norm over head_dim) in a packed
    /// (B, T, (H + 2 KV) D) projection, before the rotary embedding; v as it was. The norms
    /// read their heads in place and store the projection's type (f16 under mixed precision,
    /// as the attention reads it); one copy packs the three again.
    pub(crate) fn qk_norm(&self, i: usize, qkv: &Tensor) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, t) = (qkv.shape()[0], qkv.shape()[1]);
        let (h, kv, d) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
        let split = qkv.reshape(&[b, t, h + 2 * kv, d])?;
        let norm = |first: usize, count: usize, name: &str| -> Result<Tensor> {
            let x = split.narrow(2, first, count)?; // (B, T, count, D), a view
            let weight = self.p(&format!("layers.{i}.self_attn.{name}"))?;
            let eps = cfg.layer_norm_epsilon;
            match self.kernels {
                Kernels::Fused => x.rms_norm_as(weight, eps, qkv.dtype()),
                Kernels::Reference => x.rms_norm_unfused(weight, eps),
            }
        };
        let q = norm(0, h, "q_norm.weight")?;
        let k = norm(h, kv, "k_norm.weight")?;
        let v = split.narrow(2, h + kv, kv)?;
        Tensor::cat(&[&q, &k, &v], 2)?.reshape(&[b, t, cfg.qkv_width()])
    }

    /// Whether a norm's output feeding the linear of a (K, N) weight `next` is stored f16:
    /// under mixed precision with the fused kernels, where that linear would round an f32
    /// input to f16 before its product (the same values, without the cast kernel; its
    /// backward's dW reads this f16 copy). The reference compositions stay f32.
    fn norm_dtype(&self, next: Option<(usize, usize)>) -> DType {
        if self.amp && next.is_some_and(|(k, n)| linear_casts_input(n, k)) {
            DType::F16
        } else {
            DType::F32
        }
    }

    /// LayerNorm (weight and bias by name) whose output feeds the `next` linear, if any.
    fn layer_norm(
        &self,
        x: &Tensor,
        gamma: &str,
        beta: &str,
        next: Option<(usize, usize)>,
    ) -> Result<Tensor> {
        let (gamma, beta) = (self.p(gamma)?, self.p(beta)?);
        let eps = self.config.layer_norm_epsilon;
        match self.kernels {
            Kernels::Fused => x.layer_norm_as(gamma, beta, eps, self.norm_dtype(next)),
            Kernels::Reference => x.layer_norm_unfused(gamma, beta, eps),
        }
    }

    /// RMSNorm (weight by name) whose output feeds the `next` linear, if any.
    fn rms_norm(&self, x: &Tensor, weight: &str, next: Option<(usize, usize)>) -> Result<Tensor> {
        let weight = self.p(weight)?;
        let eps = self.config.layer_norm_epsilon;
        match self.kernels {
            Kernels::Fused => x.rms_norm_as(weight, eps, self.norm_dtype(next)),
            Kernels::Reference => x.rms_norm_unfused(weight, eps),
        }
    }

    fn linear(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Activation,
    ) -> Result<Tensor> {
        self.linear_as(x, w, b, act, DType::F32)
    }

    /// residual + (x W + b): with the fused kernels the add is the product's epilogue.
    fn linear_residual(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        residual: &Tensor,
    ) -> Result<Tensor> {
        match self.kernels {
            Kernels::Fused => x.linear_residual(w, b, residual),
            Kernels::Reference => {
                residual.add(&x.linear_reference(w, Some(b), Activation::None)?)
            }
        }
    }

    /// `linear` storing its output as `dtype` (the reference composition stays f32).
    fn linear_as(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Activation,
        dtype: DType,
    ) -> Result<Tensor> {
        match self.kernels {
            Kernels::Fused => x.linear_as(w, b, act, dtype),
            Kernels::Reference => x.linear_reference(w, b, act),
        }
    }
}

/// A norm's weight (initialized to 1): LayerNorm's gamma or RMSNorm's weight.
fn is_norm_weight(name: &str) -> bool {
    [
        "ln_1.weight",
        "ln_2.weight",
        "ln_f.weight",
        "layernorm.weight",
        "norm.weight",
    ]
    .iter()
    .any(|suffix| name.ends_with(suffix))
}
