//! RMSNorm over the last dim, fused: Hugging Face's LlamaRMSNorm (also Qwen2's, and Qwen3's
//! q_norm and k_norm over head_dim). The forward is one dispatch that also saves rstd, reads
//! x as f32 or f16 and stores y as f32 or (`rms_norm_as`) f16 for a matmul that reads f16
//! operands: the statistic and the normalization are f32 either way, y rounded once as it is
//! stored. The backward works from the saved rstd: one workgroup per chunk of rows computes
//! each row's dx and the chunk's partial dweight into a scratch, and LayerNorm's stage 2 sums
//! the partials into dweight's target (`layernorm::param_sums`, dbeta not wanted). dy may be
//! f32 or f16; dx and dweight are f32.
//!
//! x may be a view whose last dim has unit stride and whose leading dims merge into at most
//! three (a (B, T, H, D) narrow of a packed qkv tensor): the kernels address its rows in place,
//! and the backward saves the view, not a copy. Any other x is made contiguous first.
//! `rms_norm_unfused` is the same function in existing ops: the reference tests compare.
//!
//! Shapes: x (..., C) seen as (rows, C); weight (C); rstd (rows).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::Result;
use crate::graph::{coalesce_joint, DType, Tensor};
use crate::kernels::layernorm::Write;
use crate::kernels::rmsnorm::{self, RmsNormParams};
use crate::ops::elementwise::launch_copy;
use crate::ops::layernorm::{chunks, norm_cols, param_sums, rows_cols};
use crate::ops::{check_store_dtype, Out};

const OP: &str = "rms_norm";

/// What backward needs: the forward's input (the view it read) and weight, and the rstd it
/// saved.
struct RmsNormBackward {
    x: Tensor,      // (..., C), rows addressable in place (`row_params`)
    weight: Tensor, // (C) contiguous
    rstd: Tensor,   // (rows)
}

const ASKED: &str = "a gradient that was asked for is made";

/// x's row addressing (`n1`, `n2`, `s0`, `s1`, `s2` of `RmsNormParams`, with `x_offset`), or
/// None where the kernels cannot read x in place: a last dim of non-unit stride, or leading
/// dims that merge into more than three.
fn row_params(x: &Tensor) -> Option<RmsNormParams> {
    let rank = x.shape().len();
    let cols = x.shape()[rank - 1];
    if cols > 1 && x.strides()[rank - 1] != 1 {
        return None;
    }
    let (dims, strides) = coalesce_joint(&x.shape()[..rank - 1], &[&x.strides()[..rank - 1]]);
    if dims.len() > 3 {
        return None;
    }
    // Right-aligned into three dims; the missing outer ones are of size 1.
    let mut n = [1usize; 3];
    let mut s = [0usize; 3];
    let skip = 3 - dims.len();
    n[skip..].copy_from_slice(&dims);
    s[skip..].copy_from_slice(&strides[0]);
    // The furthest element read must be indexable in 32 bits.
    let last = x.layout().offset
        + (0..3).map(|d| n[d].saturating_sub(1) * s[d]).sum::<usize>()
        + cols.saturating_sub(1);
    if last >= u32::MAX as usize {
        return None;
    }
    Some(RmsNormParams {
        cols: cols as u32,
        x_offset: x.layout().offset as u32,
        n1: n[1] as u32,
        n2: n[2] as u32,
        s0: s[0] as u32,
        s1: s[1] as u32,
        s2: s[2] as u32,
        ..Default::default()
    })
}

impl Backward for RmsNormBackward {
    fn name(&self) -> &'static str {
        OP
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        // The kernels read dy as contiguous rows (a broadcast gradient, e.g. from a mean,
        // costs one copy here).
        let dy = g.contiguous()?;
        match [0, 1].map(|i| ctx.needed(i)) {
            [true, true] => ctx.put_pair_with(0, 1, |x, w| {
                let [x, w] = self.grads(&dy, [Some(x), Some(w)])?;
                Ok((x.expect(ASKED), w.expect(ASKED)))
            }),
            [true, false] => ctx.put_with(0, |x| {
                Ok(self.grads(&dy, [Some(x), None])?[0].take().expect(ASKED))
            }),
            [false, true] => ctx.put_with(1, |w| {
                Ok(self.grads(&dy, [None, Some(w)])?[1].take().expect(ASKED))
            }),
            [false, false] => Ok(()),
        }
    }
}

impl RmsNormBackward {
    /// The gradients asked for, each written per its `Out`: dx alone in one dispatch (a row a
    /// workgroup); with dweight, the chunks' partials (with dx where asked for), then their
    /// sum.
    fn grads(
        &self,
        dy: &Tensor,
        [dx, dweight]: [Option<Out<'_>>; 2],
    ) -> Result<[Option<Tensor>; 2]> {
        let x = &self.x;
        let device = x.device();
        let (rows, cols) = rows_cols(x);
        let read = [dy, x, &self.weight, &self.rstd];
        let dx = dx
            .map(|o| o.resolve(OP, device, x.shape(), &read))
            .transpose()?;
        let dw = dweight
            .map(|o| o.resolve(OP, device, &[cols], &[]))
            .transpose()?;
        // The kernel writes dx as contiguous rows: a strided target (the gradient of a view,
        // such as a head's slice of qkv) gets a new tensor, copied in after.
        let fresh = match &dx {
            Some((t, _)) if !t.is_contiguous() => {
                Some(Tensor::uninit(device, x.shape(), DType::F32, OP)?)
            }
            _ => None,
        };
        let dx_kernel = match (&dx, &fresh) {
            (Some(_), Some(f)) => Some((f, false)),
            (Some((t, acc)), None) => Some((t, *acc)),
            (None, _) => None,
        };
        match &dw {
            None => self.launch(dy, dx_kernel, None),
            Some((t, acc)) => {
                let n_chunks = chunks(x, rows).0;
                let partial = Tensor::uninit(device, &[1, n_chunks, cols], DType::F32, OP)?;
                self.launch(dy, dx_kernel, Some(&partial));
                param_sums(&partial, ([Write::of(*acc), Write::None], [t, t]));
            }
        }
        let dx = match (dx, fresh) {
            (Some((t, acc)), Some(f)) => Some(launch_copy(
                &f,
                if acc { Out::Acc(&t) } else { Out::Write(&t) },
            )?),
            (dx, _) => dx.map(|t| t.0),
        };
        Ok([dx, dw.map(|t| t.0)])
    }

    /// The backward kernel: dx into `dx` (contiguous; added into where its flag says) and the
    /// (1, n_chunks, C) partial dweight into `partial`, each where given. Without the
    /// partials, one row a workgroup.
    fn launch(&self, dy: &Tensor, dx: Option<(&Tensor, bool)>, partial: Option<&Tensor>) {
        let x = &self.x;
        let device = x.device();
        let rows = rows_cols(x).0;
        let (n_chunks, chunk_rows) = match partial {
            Some(_) => chunks(x, rows),
            None => (rows, 1),
        };
        // A binding the variant does not touch gets the other written buffer.
        let (dx_buf, partial_buf) = match (dx, partial) {
            (Some((t, _)), Some(p)) => (t, p),
            (Some((t, _)), None) => (t, t),
            (None, Some(p)) => (p, p),
            (None, None) => return,
        };
        let params = RmsNormParams {
            rows: rows as u32,
            weight_offset: self.weight.layout().offset as u32,
            dy_offset: dy.layout().offset as u32,
            out_offset: dx_buf.layout().offset as u32,
            n_chunks: n_chunks as u32,
            chunk_rows: chunk_rows as u32,
            ..row_params(x).expect("the forward saved an x its kernels address in place")
        };
        device.record(
            &rmsnorm::RMSNORM_BACKWARD,
            &rmsnorm::backward_spec(
                x.dtype(),
                dy.dtype(),
                dx.map(|(_, acc)| acc),
                partial.is_some(),
            ),
            &params,
            &[
                dx_buf.storage(),
                x.storage(),
                dy.storage(),
                self.rstd.storage(),
                self.weight.storage(),
                partial_buf.storage(),
            ],
            device.grid(n_chunks as u64),
        );
    }
}

/// Checks the operands of an RMSNorm and returns C.
fn check_args(x: &Tensor, weight: &Tensor, eps: f32) -> Result<usize> {
    if x.dtype() != DType::F16 {
        x.expect_dtype(OP, DType::F32)?;
    }
    weight.expect_dtype(OP, DType::F32)?;
    x.expect_same_device(OP, weight)?;
    norm_cols(OP, x, &[("weight", weight)], eps)
}

impl Tensor {
    /// RMSNorm over the last dim as Hugging Face's LlamaRMSNorm: y = weight * (x * rstd) with
    /// rstd = 1 / sqrt(mean(x^2) + eps), in f32. x (..., C) f32 or f16; weight (C) f32;
    /// y f32.
    pub fn rms_norm(&self, weight: &Tensor, eps: f32) -> Result<Tensor> {
        self.rms_norm_as(weight, eps, DType::F32)
    }

    /// `rms_norm` with y stored as `dtype`: f32, or f16 for a consumer that reads f16
    /// operands (a mixed-precision matmul: the rounding is the kernel's store, no cast
    /// kernel). x may be a view with a unit-stride last dim (Qwen3's q_norm on a
    /// (B, T, H, D) narrow of qkv): it is read in place.
    pub fn rms_norm_as(&self, weight: &Tensor, eps: f32, dtype: DType) -> Result<Tensor> {
        check_args(self, weight, eps)?;
        let device = self.device();
        check_store_dtype(OP, device, dtype)?;
        let (x, addressing) = match row_params(self) {
            Some(a) => (self.clone(), a),
            None => {
                let x = self.contiguous()?;
                let a = row_params(&x).expect("a row-major x is addressed in place");
                (x, a)
            }
        };
        let weight = weight.contiguous()?;
        let rows = rows_cols(&x).0;
        let y = Tensor::uninit(device, x.shape(), dtype, OP)?;
        let rstd = Tensor::uninit(device, &[rows], DType::F32, OP)?;
        let params = RmsNormParams {
            rows: rows as u32,
            eps,
            weight_offset: weight.layout().offset as u32,
            ..addressing
        };
        device.record(
            &rmsnorm::RMSNORM_FORWARD,
            &rmsnorm::forward_spec(x.dtype(), dtype),
            &params,
            &[y.storage(), x.storage(), rstd.storage(), weight.storage()],
            device.grid(rows as u64),
        );
        Ok(record(y, &[&x, &weight], || RmsNormBackward {
            x: x.detach(),
            weight: weight.detach(),
            rstd,
        }))
    }

    /// The same RMSNorm composed of existing ops (square, mean, add, rsqrt, mul): the unfused
    /// reference of `rms_norm`, several dispatches each way.
    pub fn rms_norm_unfused(&self, weight: &Tensor, eps: f32) -> Result<Tensor> {
        check_args(self, weight, eps)?;
        let rstd = self.square()?.mean(-1, true)?.add_scalar(eps)?.rsqrt()?;
        self.mul(&rstd)?.mul(weight)
    }
}
