//! Causal self-attention of a packed projection, (B, T, (H + 2 Hkv) D): the H query heads' D
//! columns, then Hkv key heads', then Hkv value heads' (Hugging Face's q_proj, k_proj, v_proj
//! outputs side by side; GPT-2's c_attn is Hkv = H). Query head h attends with key/value head
//! h / (H / Hkv); the kernels read each head in place, and a rotary embedding (`Rope`) rotates
//! q and k as they load. `causal_attention_grouped_reference` and `rope_reference` are the
//! same functions from unfused ops; head dims over the kernels' run through them.

use super::*;

/// q (B, H, T, D), k and v (B, Hkv, T, D) of a packed (B, T, (H + 2 Hkv) D) tensor (any
/// strides) as views of its storage.
pub(super) fn heads_of(qkv: &Tensor, heads: usize, kv_heads: usize) -> [Tensor; 3] {
    let l = qkv.layout();
    let (b, t, width) = (l.shape[0], l.shape[1], l.shape[2]);
    let (d, sc) = (width / (heads + 2 * kv_heads), l.strides[2]);
    let part = |first: usize, n: usize| {
        qkv.with_layout(Layout {
            shape: vec![b, n, t, d],
            strides: vec![l.strides[0], sc * d, l.strides[1], sc],
            offset: l.offset + first * d * sc,
        })
    };
    [
        part(0, heads),
        part(heads, kv_heads),
        part(heads + kv_heads, kv_heads),
    ]
}

impl Tensor {
    /// Causal self-attention of a packed projection `self`, (B, T, (H + 2 Hkv) D) with
    /// H = `heads`, Hkv = `kv_heads` dividing it: query head h attends with key/value head
    /// h / (H / Hkv), q and k rotated by `rope` at positions 0..T; returns (B, T, H D) as
    /// `causal_attention_merged` does. The backward writes dQ, dK and dV (dK and dV summed over
    /// each kv head's group) into one gradient of `self`'s shape. D up to 128 runs fused, a
    /// larger one through the unfused ops.
    pub fn causal_self_attention_grouped(
        &self,
        heads: usize,
        kv_heads: usize,
        rope: Option<&Rope>,
    ) -> Result<Tensor> {
        self.causal_self_attention_at(heads, kv_heads, rope, 0)
    }

    /// `causal_self_attention_grouped` with query and key row t rotated as position `start + t`.
    /// The rows attend to each other only (no cache): `start` moves the rotary embedding alone,
    /// so this is not how a prompt continues; generation keeps its keys in a cache
    /// (`model::Generator`).
    pub fn causal_self_attention_at(
        &self,
        heads: usize,
        kv_heads: usize,
        rope: Option<&Rope>,
        start: usize,
    ) -> Result<Tensor> {
        let s = self.shape();
        let packed = heads + 2 * kv_heads;
        if self.rank() != 3
            || kv_heads == 0
            || !heads.is_multiple_of(kv_heads)
            || !s[2].is_multiple_of(packed)
        {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!(
                    "a packed qkv input (B, T, ({heads} query + 2 x {kv_heads} key/value heads) \
                     x D), the key/value heads dividing the query heads"
                ),
                got: s.to_vec(),
            });
        }
        let d = s[2] / packed;
        if let Some(r) = rope {
            r.check(d, start, s[1])?;
        }
        if d > MAX_HEAD_DIM {
            return self_attention_reference(self, heads, kv_heads, rope, start);
        }
        let [q, k, v] = heads_of(&self.detach(), heads, kv_heads);
        let rope = rope.map(|r| RopeAt {
            table: r.table().clone(),
            start,
        });
        let (out, state) = attention_forward(&q, &k, &v, true, rope)?;
        Ok(record(out, &[self], || CausalAttentionBackward {
            fused_qkv: true,
            ..state
        }))
    }

    /// `causal_attention_reference` of queries `self` (B, H, T, D) with keys `k` and values
    /// `v` of Hkv heads, (B, Hkv, T, D), Hkv dividing H: each kv head repeated for the H / Hkv
    /// query heads of its group (broadcast and copied, with autograd summing the group's
    /// gradients), as transformers' `repeat_kv`.
    pub fn causal_attention_grouped_reference(&self, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        const REF: &str = "causal_attention_grouped_reference";
        let [b, h, t, d] = check_shapes(self, k, v, REF, false, true)?;
        let hk = k.shape()[1];
        let repeat = |x: &Tensor| -> Result<Tensor> {
            if hk == h {
                return Ok(x.clone());
            }
            x.unsqueeze(2)?
                .broadcast_to(&[b, hk, h / hk, t, d])?
                .contiguous()?
                .reshape(&[b, h, t, d])
        };
        self.causal_attention_reference(&repeat(k)?, &repeat(v)?)
    }
}

impl Tensor {
    /// `causal_self_attention_grouped` from unfused ops (f32): head views of the packed
    /// input, the rotary reference on q and k, the grouped reference attention, heads merged.
    /// The model's `Kernels::Reference` runs it, and the tests check the kernels against it.
    pub fn causal_self_attention_grouped_reference(
        &self,
        heads: usize,
        kv_heads: usize,
        rope: Option<&Rope>,
    ) -> Result<Tensor> {
        self_attention_reference(self, heads, kv_heads, rope, 0)
    }
}

/// `causal_self_attention_at` from unfused ops: head views of the packed input, the rotary
/// reference on q and k, the grouped reference attention, heads merged.
fn self_attention_reference(
    qkv: &Tensor,
    heads: usize,
    kv_heads: usize,
    rope: Option<&Rope>,
    start: usize,
) -> Result<Tensor> {
    let qkv = match qkv.dtype() {
        DType::F32 => qkv.clone(),
        _ => qkv.to_dtype(DType::F32)?,
    };
    let s = qkv.shape();
    let (b, t) = (s[0], s[1]);
    let d = s[2] / (heads + 2 * kv_heads);
    let part = |first: usize, n: usize| -> Result<Tensor> {
        qkv.narrow(2, first * d, n * d)?
            .reshape(&[b, t, n, d])?
            .permute(&[0, 2, 1, 3])
    };
    let (mut q, mut k) = (part(0, heads)?, part(heads, kv_heads)?);
    let v = part(heads + kv_heads, kv_heads)?;
    if let Some(r) = rope {
        q = q.rope_reference(r, start)?;
        k = k.rope_reference(r, start)?;
    }
    q.causal_attention_grouped_reference(&k, &v)?
        .permute(&[0, 2, 1, 3])?
        .reshape(&[b, t, heads * d])
}
