//! The GPT-2 configuration (Hugging Face config.json fields) and its parameter list.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::nn::ParamSpec;

/// The fields of a Hugging Face GPT-2 config.json this model reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gpt2Config {
    pub vocab_size: usize,
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f32,
    #[serde(default = "default_init_range")]
    pub initializer_range: f32,
}

fn default_eps() -> f32 {
    1e-5
}

fn default_init_range() -> f32 {
    0.02
}

impl Gpt2Config {
    /// Checks what the model relies on.
    pub fn validate(&self) -> Result<()> {
        if self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::InvalidArgument {
                op: "gpt2 config",
                reason: format!(
                    "n_head {} does not divide n_embd {}",
                    self.n_head, self.n_embd
                ),
            });
        }
        if self.vocab_size == 0 || self.n_positions == 0 || self.n_layer == 0 {
            return Err(Error::InvalidArgument {
                op: "gpt2 config",
                reason: "vocab_size, n_positions and n_layer must be positive".into(),
            });
        }
        Ok(())
    }

    /// Every parameter: (name, shape, decayed by AdamW). As in nanoGPT, 2-D tensors (weights
    /// and embeddings) decay; biases and LayerNorm weights do not.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let c = self.n_embd;
        let spec = |name: String, shape: Vec<usize>| ParamSpec {
            decay: shape.len() >= 2,
            name,
            shape,
        };
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
            v.push(spec(p("mlp.c_fc.weight"), vec![c, 4 * c]));
            v.push(spec(p("mlp.c_fc.bias"), vec![4 * c]));
            v.push(spec(p("mlp.c_proj.weight"), vec![4 * c, c]));
            v.push(spec(p("mlp.c_proj.bias"), vec![c]));
        }
        v.push(spec("ln_f.weight".into(), vec![c]));
        v.push(spec("ln_f.bias".into(), vec![c]));
        v
    }
}
