//! A decoder-only transformer's configuration, the parts it picks (`Family`), its parameter
//! list and how those parameters map to a Hugging Face checkpoint's tensors.
//!
//! Two layouts: GPT-2's (learned positions, LayerNorm with biases, GELU MLP, Conv1D weights
//! stored [in, out], head tied to the token embedding) and the Llama family's (Llama, Qwen2,
//! Qwen3: rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, `nn.Linear` weights
//! stored [out, in], head tied or not). Field names follow GPT-2's config.json (`n_embd` is a
//! Llama config's `hidden_size`, `n_inner` its `intermediate_size`).
//!
//! In the Llama layout wgrad keeps a layer's q, k and v projections as one parameter
//! (`self_attn.qkv_proj`, their rows stacked) and gate and up as one (`mlp.gate_up_proj`), so
//! each is one product; `hf_tensors` says which rows of it each file tensor is.

use crate::error::{Error, Result};
use crate::nn::ParamSpec;

/// The model family: which parts a block has and how its checkpoint names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Family {
    #[default]
    Gpt2,
    Llama,
    Qwen2,
    /// Qwen2 with RMSNorm on each query and key head (`q_norm`, `k_norm`) and no q/k/v biases.
    Qwen3,
}

impl Family {
    pub const ALL: [Family; 4] = [Family::Gpt2, Family::Llama, Family::Qwen2, Family::Qwen3];

    /// config.json's `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    /// The transformers class that loads it (config.json's `architectures`).
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Gpt2 => "GPT2LMHeadModel",
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    pub fn from_model_type(t: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_type() == t)
    }

    pub fn from_architecture(a: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.architecture() == a)
    }

    /// The Llama layout (rotary positions, RMSNorm, SwiGLU, [out, in] weights).
    pub fn is_llama(self) -> bool {
        self != Family::Gpt2
    }

    /// The prefix transformers writes before the body's tensor names.
    pub fn file_prefix(self) -> &'static str {
        match self {
            Family::Gpt2 => "transformer.",
            _ => "model.",
        }
    }
}

/// The configuration the model reads (from config.json: `model::HfConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    /// Positions the model takes (`max_position_embeddings`).
    pub n_positions: usize,
    /// The residual width (`hidden_size`).
    pub n_embd: usize,
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`; GPT-2: `n_head`).
    pub n_kv_head: usize,
    /// Each head's size (GPT-2: n_embd / n_head; Llama's may differ).
    pub head_dim: usize,
    /// The MLP's hidden width (`intermediate_size`; GPT-2: 4 n_embd).
    pub n_inner: usize,
    /// LayerNorm's or RMSNorm's epsilon.
    pub layer_norm_epsilon: f32,
    pub initializer_range: f32,
    /// Rotary embedding base (the Llama layout).
    pub rope_theta: f64,
    /// The LM head is the token embedding.
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    /// The attention output projection's bias.
    pub o_bias: bool,
    pub mlp_bias: bool,
}

/// One tensor of a Hugging Face checkpoint: rows `first_row..first_row + shape[0]` of the
/// wgrad parameter `param`.
#[derive(Clone, Debug, PartialEq)]
pub struct HfTensor {
    /// The name without the family's prefix (`layers.0.self_attn.q_proj.weight`; the head is
    /// `lm_head.weight`).
    pub name: String,
    pub param: String,
    pub first_row: usize,
    pub shape: Vec<usize>,
}

impl ModelConfig {
    /// A GPT-2 of these sizes (MLP 4 n_embd, LayerNorm eps 1e-5, init range 0.02).
    pub fn gpt2(
        vocab_size: usize,
        n_positions: usize,
        n_embd: usize,
        n_layer: usize,
        n_head: usize,
    ) -> ModelConfig {
        ModelConfig {
            family: Family::Gpt2,
            vocab_size,
            n_positions,
            n_embd,
            n_layer,
            n_head,
            n_kv_head: n_head,
            head_dim: n_embd / n_head.max(1),
            n_inner: 4 * n_embd,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
            rope_theta: 0.0,
            tie_word_embeddings: true,
            qkv_bias: true,
            o_bias: true,
            mlp_bias: true,
        }
    }

    /// Checks what the model relies on (config.json's reader names the fields; this names the
    /// sizes).
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidArgument {
                op: "model config",
                reason,
            })
        };
        if self.vocab_size == 0 || self.n_positions == 0 || self.n_layer == 0 || self.n_embd == 0 {
            return bad("vocab_size, n_positions, n_embd and n_layer must be positive".into());
        }
        if self.n_head == 0 || self.n_kv_head == 0 || !self.n_head.is_multiple_of(self.n_kv_head) {
            return bad(format!(
                "{} key/value heads do not divide {} attention heads",
                self.n_kv_head, self.n_head
            ));
        }
        if self.head_dim == 0 || self.n_inner == 0 {
            return bad("head_dim and the MLP width must be positive".into());
        }
        match self.family {
            Family::Gpt2 => {
                if self.n_head * self.head_dim != self.n_embd {
                    return bad(format!(
                        "n_head {} does not divide n_embd {}",
                        self.n_head, self.n_embd
                    ));
                }
                if self.n_kv_head != self.n_head || !self.tie_word_embeddings {
                    return bad("GPT-2 has as many key/value heads as heads and a tied head".into());
                }
            }
            _ => {
                if !self.head_dim.is_multiple_of(2) {
                    return bad(format!(
                        "head_dim {} is odd; rotary embeddings rotate pairs of dimensions",
                        self.head_dim
                    ));
                }
                if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
                    return bad(format!("rope_theta {} is not positive", self.rope_theta));
                }
            }
        }
        Ok(())
    }

    /// Heads times head size: the attention's width (n_embd for GPT-2).
    pub fn attn_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The packed q, k, v width: (n_head + 2 n_kv_head) head_dim.
    pub fn qkv_width(&self) -> usize {
        (self.n_head + 2 * self.n_kv_head) * self.head_dim
    }

    /// The embedding table's name (also the head's when tied).
    pub fn embedding(&self) -> &'static str {
        match self.family {
            Family::Gpt2 => "wte.weight",
            _ => "embed_tokens.weight",
        }
    }

    /// The untied LM head's name.
    pub const LM_HEAD: &'static str = "lm_head.weight";

    /// Every parameter: (name, shape, decayed by AdamW). As in nanoGPT, tensors of 2 or more
    /// dimensions (weights and embeddings) decay; biases and norm weights do not.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        match self.family {
            Family::Gpt2 => self.gpt2_specs(),
            _ => self.llama_specs(),
        }
    }

    fn gpt2_specs(&self) -> Vec<ParamSpec> {
        let c = self.n_embd;
        let f = self.n_inner;
        let mut v = vec![
            spec("wte.weight".into(), vec![self.vocab_size, c]),
            spec("wpe.weight".into(), vec![self.n_positions, c]),
        ];
        for i in 0..self.n_layer {
            let p = |s: &str| format!("h.{i}.{s}");
            v.push(spec(p("ln_1.weight"), vec![c]));
            v.push(spec(p("ln_1.bias"), vec![c]));
            v.push(spec(p("attn.c_attn.weight"), vec![c, 3 * c]));
            v.push(spec(p("attn.c_attn.bias"), vec![3 * c]));
            v.push(spec(p("attn.c_proj.weight"), vec![c, c]));
            v.push(spec(p("attn.c_proj.bias"), vec![c]));
            v.push(spec(p("ln_2.weight"), vec![c]));
            v.push(spec(p("ln_2.bias"), vec![c]));
            v.push(spec(p("mlp.c_fc.weight"), vec![c, f]));
            v.push(spec(p("mlp.c_fc.bias"), vec![f]));
            v.push(spec(p("mlp.c_proj.weight"), vec![f, c]));
            v.push(spec(p("mlp.c_proj.bias"), vec![c]));
        }
        v.push(spec("ln_f.weight".into(), vec![c]));
        v.push(spec("ln_f.bias".into(), vec![c]));
        v
    }

    fn llama_specs(&self) -> Vec<ParamSpec> {
        let (c, f, d) = (self.n_embd, self.n_inner, self.head_dim);
        let mut v = vec![spec("embed_tokens.weight".into(), vec![self.vocab_size, c])];
        for i in 0..self.n_layer {
            let p = |s: &str| format!("layers.{i}.{s}");
            v.push(spec(p("input_layernorm.weight"), vec![c]));
            v.push(spec(
                p("self_attn.qkv_proj.weight"),
                vec![self.qkv_width(), c],
            ));
            if self.qkv_bias {
                v.push(spec(p("self_attn.qkv_proj.bias"), vec![self.qkv_width()]));
            }
            if self.family == Family::Qwen3 {
                v.push(spec(p("self_attn.q_norm.weight"), vec![d]));
                v.push(spec(p("self_attn.k_norm.weight"), vec![d]));
            }
            v.push(spec(
                p("self_attn.o_proj.weight"),
                vec![c, self.attn_width()],
            ));
            if self.o_bias {
                v.push(spec(p("self_attn.o_proj.bias"), vec![c]));
            }
            v.push(spec(p("post_attention_layernorm.weight"), vec![c]));
            v.push(spec(p("mlp.gate_up_proj.weight"), vec![2 * f, c]));
            if self.mlp_bias {
                v.push(spec(p("mlp.gate_up_proj.bias"), vec![2 * f]));
            }
            v.push(spec(p("mlp.down_proj.weight"), vec![c, f]));
            if self.mlp_bias {
                v.push(spec(p("mlp.down_proj.bias"), vec![c]));
            }
        }
        v.push(spec("norm.weight".into(), vec![c]));
        if !self.tie_word_embeddings {
            v.push(spec(Self::LM_HEAD.into(), vec![self.vocab_size, c]));
        }
        v
    }

    /// The checkpoint's tensors, each a block of rows of one parameter. GPT-2's are its
    /// parameters one to one; the Llama layout splits the stacked q/k/v and gate/up.
    pub fn hf_tensors(&self) -> Vec<HfTensor> {
        let (d, f) = (self.head_dim, self.n_inner);
        let mut out = Vec::new();
        for s in self.param_specs() {
            let parts: Vec<(&str, usize)> = if s.name.ends_with("self_attn.qkv_proj.weight")
                || s.name.ends_with("self_attn.qkv_proj.bias")
            {
                vec![
                    ("q_proj", self.n_head * d),
                    ("k_proj", self.n_kv_head * d),
                    ("v_proj", self.n_kv_head * d),
                ]
            } else if s.name.ends_with("mlp.gate_up_proj.weight")
                || s.name.ends_with("mlp.gate_up_proj.bias")
            {
                vec![("gate_proj", f), ("up_proj", f)]
            } else {
                out.push(HfTensor {
                    name: s.name.clone(),
                    param: s.name.clone(),
                    first_row: 0,
                    shape: s.shape.clone(),
                });
                continue;
            };
            let fused = if s.name.contains("qkv_proj") {
                "qkv_proj"
            } else {
                "gate_up_proj"
            };
            let mut first_row = 0;
            for (part, rows) in parts {
                let mut shape = s.shape.clone();
                shape[0] = rows;
                out.push(HfTensor {
                    name: s.name.replace(fused, part),
                    param: s.name.clone(),
                    first_row,
                    shape,
                });
                first_row += rows;
            }
        }
        out
    }

    /// Parameters in all, counted from the sizes (no list: a config's n_layer may be absurd),
    /// in u128, which no product of u32-bounded sizes overflows.
    pub fn parameter_count(&self) -> u128 {
        let [v, p, c, l, f, d] = [
            self.vocab_size,
            self.n_positions,
            self.n_embd,
            self.n_layer,
            self.n_inner,
            self.head_dim,
        ]
        .map(|n| n as u128);
        let (h, kv) = (self.n_head as u128, self.n_kv_head as u128);
        let (qkv, attn) = ((h + 2 * kv) * d, h * d);
        let b = |on: bool, n: u128| if on { n } else { 0 };
        match self.family {
            Family::Gpt2 => {
                // LayerNorms (2 x 2C), c_attn, c_proj, c_fc, c_proj with biases.
                let layer = 4 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * f + f) + (f * c + c);
                (v + p) * c + l * layer + 2 * c
            }
            _ => {
                let layer = 2 * c
                    + qkv * c
                    + b(self.qkv_bias, qkv)
                    + b(self.family == Family::Qwen3, 2 * d)
                    + c * attn
                    + b(self.o_bias, c)
                    + 3 * f * c
                    + b(self.mlp_bias, 2 * f + c);
                v * c + l * layer + c + b(!self.tie_word_embeddings, v * c)
            }
        }
    }
}

fn spec(name: String, shape: Vec<usize>) -> ParamSpec {
    ParamSpec {
        decay: shape.len() >= 2,
        name,
        shape,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> ModelConfig {
        ModelConfig {
            family: Family::Llama,
            vocab_size: 49152,
            n_positions: 8192,
            n_embd: 576,
            n_layer: 30,
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            n_inner: 1536,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.041_666_668,
            rope_theta: 100000.0,
            tie_word_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
        }
    }

    #[test]
    fn smollm2_has_its_published_parameter_count() {
        // SmolLM2-135M: 134,515,008 parameters (tied head).
        assert_eq!(smollm2().parameter_count(), 134_515_008);
        smollm2().validate().expect("valid");
    }

    #[test]
    fn parameter_count_is_the_sum_of_the_parameter_list() {
        let mut configs = vec![ModelConfig::gpt2(50, 8, 16, 2, 2)];
        for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
            for (bias, tied) in [(false, true), (true, false)] {
                configs.push(ModelConfig {
                    family,
                    n_layer: 3,
                    qkv_bias: bias,
                    o_bias: bias,
                    mlp_bias: bias,
                    tie_word_embeddings: tied,
                    ..smollm2()
                });
            }
        }
        for c in configs {
            let listed: u128 = c
                .param_specs()
                .iter()
                .map(|s| s.shape.iter().product::<usize>() as u128)
                .sum();
            assert_eq!(c.parameter_count(), listed, "{c:?}");
        }
        let absurd = ModelConfig {
            n_layer: u32::MAX as usize,
            ..smollm2()
        };
        assert!(absurd.parameter_count() > 1 << 40);
    }

    #[test]
    fn hf_tensors_cover_every_row_of_every_parameter_once() {
        let mut c = smollm2();
        c.n_layer = 2;
        c.qkv_bias = true;
        c.tie_word_embeddings = false;
        let tensors = c.hf_tensors();
        for s in c.param_specs() {
            let mut parts: Vec<&HfTensor> = tensors.iter().filter(|t| t.param == s.name).collect();
            parts.sort_by_key(|t| t.first_row);
            let mut row = 0;
            for t in parts {
                assert_eq!(t.first_row, row, "{}", t.name);
                assert_eq!(t.shape[1..], s.shape[1..], "{}", t.name);
                row += t.shape[0];
            }
            assert_eq!(row, s.shape[0], "{}", s.name);
        }
        let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        for n in [
            "layers.1.self_attn.q_proj.weight",
            "layers.1.self_attn.k_proj.bias",
            "layers.0.mlp.up_proj.weight",
            "lm_head.weight",
            "norm.weight",
        ] {
            assert!(names.contains(&n), "{n} in {names:?}");
        }
        let k = tensors
            .iter()
            .find(|t| t.name == "layers.0.self_attn.v_proj.weight")
            .expect("v_proj");
        assert_eq!(
            (k.first_row, k.shape.clone()),
            (9 * 64 + 3 * 64, vec![192, 576])
        );
    }
}
