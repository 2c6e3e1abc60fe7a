//! SwiGLU, fused: y = silu(gate) * up over x = [gate | up] along the last dim, the output of one
//! matmul against Hugging Face's gate_proj and up_proj weights concatenated (Llama's, Qwen's
//! MLP). The forward is one elementwise dispatch reading x as f32 or f16 and storing y as f32
//! or (`swiglu_as`) f16 for the down_proj matmul; the backward is one dispatch writing both
//! halves of x's gradient from dy (f32 or f16) and the saved x (nothing else is saved). dx is
//! f32, or f16 under autocast where x is f16 and the gate/up linear that made it is all that
//! reads dx (its backward products round it to f16 as they load it: half the bytes, and the
//! products' fast f16 path). sigmoid is the overflow-free form (finite for any finite gate).
//!
//! x may be a view whose last dim has unit stride and whose leading dims merge into one (rows
//! a fixed stride apart): the kernels read it in place and the backward saves the view. Any
//! other x is made contiguous first (for an f16 x, an f32 copy).
//! `swiglu_unfused` is the same function in existing ops (narrow, sigmoid, mul): the reference
//! tests compare.
//!
//! Shapes: x (..., 2F) seen as (rows, 2F); y (..., F).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{coalesce_joint, DType, Tensor};
use crate::kernels::swiglu::{self, SwigluParams};
use crate::ops::elementwise::launch_copy;
use crate::ops::{check_store_dtype, Out};

const OP: &str = "swiglu";

/// What backward needs: the forward's input (the view it read).
struct SwigluBackward {
    x: Tensor, // (..., 2F), rows addressable in place (`row_params`)
}

/// x's addressing (`x_offset`, `x_row_stride`, `f`, `numel` of `SwigluParams`), or None where
/// the kernels cannot read x in place: a last dim of non-unit stride, leading dims that do
/// not merge into one, or an element past 32-bit indexing.
fn row_params(x: &Tensor) -> Option<SwigluParams> {
    let rank = x.shape().len();
    let two_f = x.shape()[rank - 1];
    if two_f > 1 && x.strides()[rank - 1] != 1 {
        return None;
    }
    let (dims, strides) = coalesce_joint(&x.shape()[..rank - 1], &[&x.strides()[..rank - 1]]);
    let (rows, row_stride) = match dims.len() {
        0 => (1, two_f),
        1 => (dims[0], strides[0][0]),
        _ => return None,
    };
    let last = x.layout().offset + rows.saturating_sub(1) * row_stride + two_f;
    if last > u32::MAX as usize {
        return None;
    }
    Some(SwigluParams {
        numel: (rows * (two_f / 2)) as u32,
        f: (two_f / 2) as u32,
        x_offset: x.layout().offset as u32,
        x_row_stride: row_stride as u32,
        ..Default::default()
    })
}

impl Backward for SwigluBackward {
    fn name(&self) -> &'static str {
        OP
    }

    /// The kernel reads dy of either type: under autocast the down projection's dX may be
    /// stored f16 for it.
    fn takes_half_grad(&self) -> bool {
        self.x.dtype() == DType::F16
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        if !ctx.needed(0) {
            return Ok(());
        }
        // The kernel reads dy as contiguous rows (`contiguous` makes f32 rows of a strided f16).
        let dy = g.contiguous()?;
        let dtype = if self.x.dtype() == DType::F16
            && ctx.input_takes_half(0)
            && ctx.sole_contribution(0)
        {
            DType::F16
        } else {
            DType::F32
        };
        ctx.put_with_typed(0, dtype, |out| self.grad(&dy, out, dtype))
    }
}

impl SwigluBackward {
    /// dx = [dgate | dup] into `out` (new, overwritten or added into), one dispatch (and a
    /// copy for a strided target: the kernel writes contiguous rows).
    fn grad(&self, dy: &Tensor, out: Out<'_>, dtype: DType) -> Result<Tensor> {
        let x = &self.x;
        let device = x.device();
        let (dx, acc) = match out {
            Out::New => (Tensor::uninit(device, x.shape(), dtype, OP)?, false),
            out => out.resolve(OP, device, x.shape(), &[dy, x])?,
        };
        if !dx.is_contiguous() || (acc && dx.dtype() == DType::F16) {
            let fresh = self.grad(dy, Out::New, DType::F32)?;
            return launch_copy(&fresh, if acc { Out::Acc(&dx) } else { Out::Write(&dx) });
        }
        let addressing = row_params(x).expect("the forward saved an x its kernels read in place");
        if addressing.numel == 0 {
            if !acc {
                dx.fill_(0.0)?;
            }
            return Ok(dx);
        }
        let params = SwigluParams {
            dy_offset: dy.layout().offset as u32,
            out_offset: dx.layout().offset as u32,
            ..addressing
        };
        device.record(
            &swiglu::SWIGLU_BACKWARD,
            &swiglu::backward_spec(x.dtype(), dy.dtype(), dx.dtype(), acc),
            &params,
            &[dx.storage(), x.storage(), dy.storage()],
            device.grid((params.numel as u64).div_ceil(swiglu::WORKGROUP)),
        );
        Ok(dx)
    }
}

/// Checks x and returns F (half its last dim).
fn check_args(x: &Tensor) -> Result<usize> {
    if x.dtype() != DType::F16 {
        x.expect_dtype(OP, DType::F32)?;
    }
    match x.shape().last() {
        Some(&two_f) if two_f % 2 == 0 => {}
        _ => {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: "x of rank 1 or more with an even last dim, (..., 2F) = [gate | up]"
                    .into(),
                got: x.shape().to_vec(),
            })
        }
    }
    if x.numel() > u32::MAX as usize {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!("{} elements exceed the kernels' 32-bit indexing", x.numel()),
        });
    }
    Ok(x.shape()[x.shape().len() - 1] / 2)
}

impl Tensor {
    /// SwiGLU: silu(gate) * up with x = [gate | up] along the last dim, silu(g) = g *
    /// sigmoid(g), in f32. x (..., 2F) f32 or f16; y (..., F) f32.
    pub fn swiglu(&self) -> Result<Tensor> {
        self.swiglu_as(DType::F32)
    }

    /// `swiglu` with y stored as `dtype`: f32, or f16 for a consumer that reads f16 operands
    /// (the down_proj matmul under mixed precision: the rounding is the kernel's store).
    pub fn swiglu_as(&self, dtype: DType) -> Result<Tensor> {
        let f = check_args(self)?;
        let device = self.device();
        check_store_dtype(OP, device, dtype)?;
        let (x, addressing) = match row_params(self) {
            Some(a) => (self.clone(), a),
            None => {
                let x = self.contiguous()?;
                let a = row_params(&x).expect("a row-major x is read in place");
                (x, a)
            }
        };
        let rank = x.shape().len();
        let mut shape = x.shape().to_vec();
        shape[rank - 1] = f;
        let y = Tensor::uninit(device, &shape, dtype, OP)?;
        if addressing.numel > 0 {
            device.record(
                &swiglu::SWIGLU_FORWARD,
                &swiglu::forward_spec(x.dtype(), dtype),
                &addressing,
                &[y.storage(), x.storage()],
                device.grid((addressing.numel as u64).div_ceil(swiglu::WORKGROUP)),
            );
        }
        Ok(record(y, &[&x], || SwigluBackward { x: x.detach() }))
    }

    /// The same SwiGLU composed of existing ops: gate * sigmoid(gate) * up over the two
    /// halves (narrow views) of x. The unfused reference of `swiglu`, several dispatches each
    /// way.
    pub fn swiglu_unfused(&self) -> Result<Tensor> {
        let f = check_args(self)?;
        let gate = self.narrow(-1, 0, f)?;
        let up = self.narrow(-1, f, f)?;
        gate.mul(&gate.sigmoid()?)?.mul(&up)
    }
}
