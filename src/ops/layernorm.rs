//! LayerNorm over the last dim, fused. The forward is one dispatch that also saves mean and
//! rstd; backward computes dx in one dispatch from them (the statistics are not recomputed),
//! and dgamma, dbeta in two stages: partial sums per chunk of rows into a scratch, then one
//! sum per gradient written into its target (overwritten or added into, as `Out` says).
//! `layer_norm_unfused` is the same function in existing ops: the reference tests compare.
//!
//! Shapes: x (..., C) seen as (rows, C); gamma, beta (C); mean, rstd (rows).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::layernorm::{self, LayerNormParams};
use crate::ops::elementwise::launch_copy;
use crate::ops::Out;

const OP: &str = "layer_norm";

/// Stage 1 gives each chunk at least this many rows, so that a lane's loop outweighs writing
/// its partial (a starting point, not yet tuned on a device).
const MIN_CHUNK_ROWS: usize = 32;
/// At most this many chunks: bounds the (2, n_chunks, C) scratch and stage 2's loop; 256
/// chunks of 32 rows cover 8192 rows (a GPT-2 batch of 8 x 1024) before chunks grow.
const MAX_CHUNKS: usize = 256;

/// What backward needs: the forward's input and scale, and the statistics it saved.
struct LayerNormBackward {
    x: Tensor,     // (..., C) contiguous
    gamma: Tensor, // (C) contiguous
    mean: Tensor,  // (rows)
    rstd: Tensor,  // (rows)
}

/// (rows, C) of a (..., C) tensor of rank >= 1.
fn rows_cols(x: &Tensor) -> (usize, usize) {
    let cols = x.shape().last().copied().unwrap_or(1);
    // No columns: no rows either.
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    (rows, cols)
}

impl Backward for LayerNormBackward {
    fn name(&self) -> &'static str {
        OP
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        // The kernels read dy as contiguous rows (a broadcast gradient, e.g. from a mean,
        // costs one copy here).
        let dy = g.contiguous()?;
        if ctx.needed(0) {
            ctx.put_with(0, |out| self.dx(&dy, out))?;
        }
        if ctx.needed(1) || ctx.needed(2) {
            let partial = self.param_partials(&dy)?;
            for (input, which) in [(1, 0), (2, 1)] {
                if ctx.needed(input) {
                    ctx.put_with(input, |out| self.param_sum(&partial, which, out))?;
                }
            }
        }
        Ok(())
    }
}

impl LayerNormBackward {
    /// dx, written per `out` in one dispatch (one workgroup per row).
    fn dx(&self, dy: &Tensor, out: Out<'_>) -> Result<Tensor> {
        let x = &self.x;
        let device = x.device();
        let inputs = [dy, x, &self.gamma, &self.mean, &self.rstd];
        let (target, acc) = out.resolve(OP, device, x.shape(), &inputs)?;
        if !target.is_contiguous() {
            // The kernel writes contiguous rows: compute into a new tensor, then copy it in.
            let fresh = self.dx(dy, Out::New)?;
            let out = if acc {
                Out::Acc(&target)
            } else {
                Out::Write(&target)
            };
            return launch_copy(&fresh, out);
        }
        let (rows, cols) = rows_cols(x);
        let params = LayerNormParams {
            rows: rows as u32,
            cols: cols as u32,
            x_offset: x.layout().offset as u32,
            gamma_offset: self.gamma.layout().offset as u32,
            dy_offset: dy.layout().offset as u32,
            out_offset: target.layout().offset as u32,
            ..Default::default()
        };
        device.record(
            &layernorm::LAYERNORM_BACKWARD_DX,
            &layernorm::spec(acc),
            &params,
            &[
                target.storage(),
                x.storage(),
                dy.storage(),
                self.mean.storage(),
                self.rstd.storage(),
                self.gamma.storage(),
            ],
            device.grid(rows as u64),
        );
        Ok(target)
    }

    /// Stage 1: the (2, n_chunks, C) partial sums of dy * xhat (dgamma) and dy (dbeta) over
    /// chunks of rows.
    fn param_partials(&self, dy: &Tensor) -> Result<Tensor> {
        let x = &self.x;
        let device = x.device();
        let (rows, cols) = rows_cols(x);
        let n_chunks = rows.div_ceil(MIN_CHUNK_ROWS).clamp(1, MAX_CHUNKS);
        let chunk_rows = rows.div_ceil(n_chunks);
        let partial = Tensor::uninit(device, &[2, n_chunks, cols], DType::F32, OP)?;
        let params = LayerNormParams {
            rows: rows as u32,
            cols: cols as u32,
            x_offset: x.layout().offset as u32,
            dy_offset: dy.layout().offset as u32,
            n_chunks: n_chunks as u32,
            chunk_rows: chunk_rows as u32,
            ..Default::default()
        };
        let col_blocks = (cols as u64).div_ceil(layernorm::WORKGROUP);
        device.record(
            &layernorm::LAYERNORM_BACKWARD_PARTIAL,
            &layernorm::spec(false),
            &params,
            &[
                partial.storage(),
                x.storage(),
                dy.storage(),
                self.mean.storage(),
                self.rstd.storage(),
            ],
            device.grid(n_chunks as u64 * col_blocks),
        );
        Ok(partial)
    }

    /// Stage 2: dgamma (`which` 0) or dbeta (1) from the partials, written per `out` (any
    /// stride) in one dispatch.
    fn param_sum(&self, partial: &Tensor, which: usize, out: Out<'_>) -> Result<Tensor> {
        let device = partial.device();
        let (n_chunks, cols) = (partial.shape()[1], partial.shape()[2]);
        let (target, acc) = out.resolve(OP, device, &[cols], &[partial])?;
        let params = LayerNormParams {
            cols: cols as u32,
            n_chunks: n_chunks as u32,
            partial_offset: (which * n_chunks * cols) as u32,
            out_offset: target.layout().offset as u32,
            out_stride: target.strides()[0] as u32,
            ..Default::default()
        };
        device.record(
            &layernorm::LAYERNORM_BACKWARD_SUM,
            &layernorm::spec(acc),
            &params,
            &[target.storage(), partial.storage()],
            device.grid((cols as u64).div_ceil(layernorm::WORKGROUP)),
        );
        Ok(target)
    }
}

/// Checks the operands of a LayerNorm and returns C.
fn check_args(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<usize> {
    for t in [x, gamma, beta] {
        t.expect_dtype(OP, DType::F32)?;
        x.expect_same_device(OP, t)?;
    }
    let Some(&cols) = x.shape().last() else {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: "x of rank 1 or more, (..., C)".into(),
            got: vec![],
        });
    };
    for (name, t) in [("gamma", gamma), ("beta", beta)] {
        if t.shape() != [cols] {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!(
                    "{name} of shape [{cols}] (C, the last dim of x of shape {:?})",
                    x.shape()
                ),
                got: t.shape().to_vec(),
            });
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!("eps must be finite and non-negative, got {eps}"),
        });
    }
    if x.numel() > u32::MAX as usize {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!("{} elements exceed the kernels' 32-bit indexing", x.numel()),
        });
    }
    Ok(cols)
}

impl Tensor {
    /// LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * gamma + beta, with the
    /// biased variance (as PyTorch) and f32 statistics. x (..., C); gamma, beta (C).
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        check_args(self, gamma, beta, eps)?;
        let x = self.contiguous()?;
        let gamma = gamma.contiguous()?;
        let beta = beta.contiguous()?;
        let (rows, cols) = rows_cols(&x);
        let device = x.device();
        let y = Tensor::uninit(device, x.shape(), DType::F32, OP)?;
        let mean = Tensor::uninit(device, &[rows], DType::F32, OP)?;
        let rstd = Tensor::uninit(device, &[rows], DType::F32, OP)?;
        let params = LayerNormParams {
            rows: rows as u32,
            cols: cols as u32,
            eps,
            x_offset: x.layout().offset as u32,
            gamma_offset: gamma.layout().offset as u32,
            beta_offset: beta.layout().offset as u32,
            ..Default::default()
        };
        device.record(
            &layernorm::LAYERNORM_FORWARD,
            &layernorm::spec(false),
            &params,
            &[
                y.storage(),
                x.storage(),
                beta.storage(),
                mean.storage(),
                rstd.storage(),
                gamma.storage(),
            ],
            device.grid(rows as u64),
        );
        Ok(record(y, &[&x, &gamma, &beta], || LayerNormBackward {
            x: x.detach(),
            gamma: gamma.detach(),
            mean,
            rstd,
        }))
    }

    /// The same LayerNorm composed of existing ops (mean, sub, square, rsqrt, mul, add): the
    /// unfused reference of `layer_norm`, several dispatches each way.
    pub fn layer_norm_unfused(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        check_args(self, gamma, beta, eps)?;
        let mean = self.mean(-1, true)?;
        let xc = self.sub(&mean)?;
        let var = xc.square()?.mean(-1, true)?;
        let rstd = var.add_scalar(eps)?.rsqrt()?;
        xc.mul(&rstd)?.mul(gamma)?.add(beta)
    }
}
