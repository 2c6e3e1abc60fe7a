//! Rotary position embedding (RoPE, Su et al. 2021) in Hugging Face's `rotate_half`
//! convention, as Llama, Qwen2 and Qwen3 use it: element d of a head pairs with d + D/2, and
//!   x_rot = x cos + rotate_half(x) sin,  rotate_half(x) = cat(-x[D/2:], x[:D/2]),
//! at angle pos * inv_freq[d mod D/2], inv_freq[i] = 1 / theta^(2i / D).
//!
//! `Rope` holds the cos/sin table, computed once on the host the way transformers does it
//! (inv_freq and the angle in f32; cos and sin of that f32 angle in f64, rounded to f32: GPU
//! sin/cos are inaccurate at large angles) and uploaded as one f32 tensor (positions, D), a
//! row's D/2 cosines then its D/2 sines. The fused attention reads it as it loads q and k
//! (`causal_self_attention_grouped`); `rope_reference` is the same rotation from unfused ops.

use super::OP;
use crate::error::{Error, Result};
use crate::graph::{Device, Tensor};

/// The cos/sin table of a rotary embedding: `max_positions` positions of head dim `head_dim`.
#[derive(Clone)]
pub struct Rope {
    table: Tensor,  // (max_positions, D): cos of the D/2 frequencies, then sin
    host: Vec<f32>, // the same, for `rope_reference`
    theta: f64,
    head_dim: usize,
    max_positions: usize,
}

impl Rope {
    /// The table for base `theta` (Llama 1e4, Qwen2 1e6), an even `head_dim`, and positions
    /// 0..`max_positions`.
    pub fn new(device: &Device, theta: f64, head_dim: usize, max_positions: usize) -> Result<Rope> {
        const NEW: &str = "Rope::new";
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::InvalidArgument {
                op: NEW,
                reason: format!("rotary embedding needs an even head dim, got {head_dim}"),
            });
        }
        if max_positions == 0 || !(theta.is_finite() && theta > 0.0) {
            return Err(Error::InvalidArgument {
                op: NEW,
                reason: format!(
                    "rotary embedding needs positions and a positive theta, got {max_positions} \
                     positions, theta {theta}"
                ),
            });
        }
        let half = head_dim / 2;
        // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), in f32.
        let base = theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let mut host = vec![0.0f32; max_positions * head_dim];
        for (pos, row) in host.chunks_exact_mut(head_dim).enumerate() {
            let (cos, sin) = row.split_at_mut(half);
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = f64::from(pos as f32 * f); // the f32 product, as transformers
                cos[i] = angle.cos() as f32;
                sin[i] = angle.sin() as f32;
            }
        }
        let table = Tensor::from_slice(device, &host, &[max_positions, head_dim])?;
        Ok(Rope {
            table,
            host,
            theta,
            head_dim,
            max_positions,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// The table, (max_positions, D) f32: a row's D/2 cosines, then its D/2 sines.
    pub fn table(&self) -> &Tensor {
        &self.table
    }

    /// An error unless `t` positions from `start` of head dim `d` are in the table.
    pub(super) fn check(&self, d: usize, start: usize, t: usize) -> Result<()> {
        if d != self.head_dim {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "the rotary table is for head dim {}, the heads have {d}",
                    self.head_dim
                ),
            });
        }
        if start + t > self.max_positions {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "positions {start}..{} past the rotary table's {}",
                    start + t,
                    self.max_positions
                ),
            });
        }
        Ok(())
    }

    /// (T, D) cos and sin of positions start.. as `rope_reference` multiplies them: of
    /// d mod D/2 (Hugging Face's emb = cat(freqs, freqs)).
    fn rows(&self, start: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
        let (d, half) = (self.head_dim, self.head_dim / 2);
        let mut cos = Vec::with_capacity(t * d);
        let mut sin = Vec::with_capacity(t * d);
        for row in self.host[start * d..(start + t) * d].chunks_exact(d) {
            for j in 0..d {
                cos.push(row[j % half]);
                sin.push(row[half + j % half]);
            }
        }
        (cos, sin)
    }
}

impl Tensor {
    /// The rotary embedding of `self`, (B, H, T, D) with D = `rope.head_dim()`, position of
    /// row t `start + t`: self * cos + rotate_half(self) * sin from unfused differentiable ops
    /// (rotate_half a product with a (D, D) matrix of 0 and +-1, exact in f32; products with
    /// (T, D) cos and sin), as Hugging Face's `apply_rotary_pos_emb` writes it. The definition the fused attention's rotation is
    /// tested against, and the model's reference path.
    pub fn rope_reference(&self, rope: &Rope, start: usize) -> Result<Tensor> {
        const REF: &str = "rope_reference";
        if self.rank() != 4 {
            return Err(Error::ShapeMismatch {
                op: REF,
                expected: "(B, H, T, D)".into(),
                got: self.shape().to_vec(),
            });
        }
        let (t, d) = (self.shape()[2], self.shape()[3]);
        rope.check(d, start, t)?;
        let half = d / 2;
        let device = self.device();
        let (cos, sin) = rope.rows(start, t);
        let cos = Tensor::from_slice(device, &cos, &[t, d])?;
        let sin = Tensor::from_slice(device, &sin, &[t, d])?;
        // rotate_half(x) = x R: column i < D/2 takes -x[i + D/2], column i >= D/2 x[i - D/2].
        let mut r = vec![0.0f32; d * d];
        for i in 0..half {
            r[(i + half) * d + i] = -1.0;
            r[i * d + i + half] = 1.0;
        }
        let r = Tensor::from_slice(device, &r, &[d, d])?;
        self.mul(&cos)?.add(&self.matmul(&r)?.mul(&sin)?)
    }
}
