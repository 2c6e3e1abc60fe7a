//! `matmul_t_shards`: x times the transpose of a matrix stored as row shards, the LM head tied
//! to an embedding that is over the adapter's storage-binding limit (`nn::Parameters` splits
//! it by rows). Shape legend: R rows of x, K its last dim, N_i the rows of shard i, N their sum.
//!
//! Forward: one matmul per shard, x (R, K) @ shard_i^T (K, N_i), written into the columns
//! lo_i .. lo_i + N_i of one (R, N) output (a strided view: no concatenation copy).
//! Backward, per shard, with g_i = g[:, lo_i .. lo_i + N_i] (a strided view of g):
//! dx = sum_i g_i @ shard_i (the first product writes, the others accumulate in the kernel), and
//! dshard_i^T = x^T @ g_i written through the transposed view of shard i's gradient, as the
//! unsharded `linear` writes d(W^T).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::ops::matmul::half_precision;
use crate::ops::{autocast, Out};

struct MatmulTShardsBackward {
    x: Tensor,           // (R, K)
    shards: Vec<Tensor>, // (N_i, K) each
    /// The first output column of each shard.
    starts: Vec<usize>,
    /// The forward ran under autocast: so do the backward products.
    half: bool,
}

impl Backward for MatmulTShardsBackward {
    fn name(&self) -> &'static str {
        "matmul_t_shards"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let half = self.half;
        autocast(half, || (*self).backward_products(g, ctx))
    }
}

impl MatmulTShardsBackward {
    fn backward_products(self, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let rows = self.x.shape()[0];
        let n: usize = self.shards.iter().map(|s| s.shape()[0]).sum();
        let g = g.reshape(&[rows, n])?; // (R, N)
        let part = |i: usize| g.narrow(1, self.starts[i], self.shards[i].shape()[0]); // (R, N_i)
        if ctx.needed(0) {
            ctx.put_with(0, |out| {
                let mut dx = part(0)?.matmul_into(&self.shards[0], out)?;
                for i in 1..self.shards.len() {
                    dx = part(i)?.matmul_into(&self.shards[i], Out::Acc(&dx))?;
                }
                Ok(dx)
            })?;
        }
        let xt = self.x.t()?; // (K, R)
        for (i, shard) in self.shards.iter().enumerate() {
            if !ctx.needed(i + 1) {
                continue;
            }
            let g_i = part(i)?;
            ctx.put_with(i + 1, |out| {
                let (target, acc) =
                    out.resolve("matmul_t_shards", g.device(), shard.shape(), &[])?;
                let tt = target.t()?; // (K, N_i)
                xt.matmul_into(&g_i, if acc { Out::Acc(&tt) } else { Out::Write(&tt) })?;
                Ok(target)
            })?;
        }
        Ok(())
    }
}

impl Tensor {
    /// self (..., K) @ concat(shards)^T: (..., N) for shards (N_i, K) stacked by rows (f32, or
    /// their f16 copies under mixed precision); f32 out. One matmul dispatch per shard.
    pub fn matmul_t_shards(&self, shards: &[&Tensor]) -> Result<Tensor> {
        const OP: &str = "matmul_t_shards";
        if shards.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "no shards".into(),
            });
        }
        let k = self.shape().last().copied().unwrap_or(0);
        if self.rank() == 0 {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: "an input of rank 1 or more".into(),
                got: vec![],
            });
        }
        let mut starts = Vec::with_capacity(shards.len());
        let mut n = 0;
        for (i, s) in shards.iter().enumerate() {
            if s.rank() != 2 || s.shape()[1] != k {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    expected: format!(
                        "shard {i} of shape (rows, {k}), K = the input's last dim (input {:?})",
                        self.shape()
                    ),
                    got: s.shape().to_vec(),
                });
            }
            self.expect_same_device(OP, s)?;
            starts.push(n);
            n += s.shape()[0];
        }
        let rows = self.numel() / k.max(1);
        let x = self.reshape(&[rows, k])?; // (R, K)
        let xd = x.detach();
        let out = Tensor::uninit(self.device(), &[rows, n], DType::F32, OP)?; // (R, N)
        for (s, &start) in shards.iter().zip(&starts) {
            let cols = out.narrow(1, start, s.shape()[0])?; // (R, N_i), row stride N
            xd.matmul_into(&s.detach().t()?, Out::Write(&cols))?;
        }
        let mut out_shape = self.shape().to_vec();
        *out_shape.last_mut().expect("rank checked") = n;
        let y = out.reshape(&out_shape)?;
        let half = half_precision(&xd, &shards[0].detach());
        let mut inputs = vec![&x];
        inputs.extend(shards.iter().copied());
        Ok(record(y, &inputs, || MatmulTShardsBackward {
            x: xd,
            shards: shards.iter().map(|s| s.detach()).collect(),
            starts,
            half,
        }))
    }
}
