//! Elementwise ops: unary, with a scalar, binary with broadcasting, comparisons, where.
//!
//! Contiguous operands of the output's shape take the vectorized path (vec4 loads) when the
//! element count and offsets allow; everything else runs the strided kernel over coalesced
//! dims (broadcast dims have stride 0, so nothing is materialized).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{broadcast_shape, coalesce_joint, DType, Tensor, MAX_RANK};
use crate::kernels::elementwise::{self, ternary, BinaryOp, ElementwiseParams, UnaryOp};
use crate::kernels::{pack8, KernelDesc};
use crate::ops::Out;

/// Records `kernel` with op `code` over `inputs` (f32 or f16, read as f32) broadcast to
/// `out_shape`, into `out`: a new f32 tensor, or a given one of f32 or f16 (each value computed
/// in f32 and rounded once as it is stored).
pub(crate) fn launch(
    op: &'static str,
    kernel: &'static KernelDesc,
    code: u32,
    out_shape: &[usize],
    inputs: &[&Tensor],
    scalars: (f32, f32),
    out: Out<'_>,
) -> Result<Tensor> {
    let first = inputs[0];
    for t in inputs {
        if t.dtype() != DType::F16 {
            t.expect_dtype(op, DType::F32)?;
        }
        first.expect_same_device(op, t)?;
    }
    let dtype = match out {
        Out::New => DType::F32,
        Out::Write(t) | Out::Acc(t) => t.dtype(),
    };
    if !matches!(dtype, DType::F32 | DType::F16) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("an elementwise output of {dtype:?} (f32 or f16 only)"),
        });
    }
    let device = first.device();
    let (out, acc) = out.resolve_typed(op, device, out_shape, inputs, dtype)?;
    let numel = out.numel();
    if numel == 0 {
        return Ok(out);
    }
    if numel > u32::MAX as usize {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{numel} elements exceed the kernels' 32-bit indexing"),
        });
    }
    let mut params = ElementwiseParams {
        scalar: scalars.0,
        scalar2: scalars.1,
        ..Default::default()
    };
    let vec4 = numel % 4 == 0
        && inputs
            .iter()
            .chain([&&out])
            .all(|t| t.shape() == out_shape && t.is_contiguous() && t.layout().offset % 4 == 0);
    let n = if vec4 {
        for (i, t) in inputs.iter().enumerate() {
            params.offsets[i] = (t.layout().offset / 4) as u32;
        }
        params.offsets[3] = (out.layout().offset / 4) as u32;
        numel / 4
    } else {
        // Operand slots a, b, c (unused ones repeat a), then the output.
        let mut layouts: Vec<_> = inputs
            .iter()
            .map(|t| t.layout().broadcast_to(out_shape))
            .collect();
        while layouts.len() < 3 {
            layouts.push(layouts[0].clone());
        }
        layouts.push(out.layout().clone());
        let strides: Vec<&[usize]> = layouts.iter().map(|l| l.strides.as_slice()).collect();
        let (shape, strides) = coalesce_joint(out_shape, &strides);
        if shape.len() > MAX_RANK {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "a view of {} non-mergeable dims (at most {MAX_RANK})",
                    shape.len()
                ),
            });
        }
        params.rank = shape.len() as u32;
        params.shape = pack8(&shape);
        let slots = [
            &mut params.a_strides,
            &mut params.b_strides,
            &mut params.c_strides,
            &mut params.out_strides,
        ];
        for (slot, s) in slots.into_iter().zip(&strides) {
            *slot = pack8(s);
        }
        for (i, l) in layouts.iter().enumerate() {
            params.offsets[i] = l.offset as u32;
        }
        numel
    };
    params.numel = n as u32;
    let groups = device.grid((n as u64).div_ceil(elementwise::WORKGROUP));
    let mut storages = vec![out.storage()];
    storages.extend(inputs.iter().map(|t| t.storage()));
    device.record(
        kernel,
        &elementwise::spec_typed(code, vec4, acc, dtype == DType::F16, {
            // Operand slots a, b, c (unused ones repeat a).
            let f16 = |i: usize| inputs.get(i).unwrap_or(&first).dtype() == DType::F16;
            [f16(0), f16(1), f16(2)]
        }),
        &params,
        &storages,
        groups,
    );
    Ok(out)
}

impl Tensor {
    /// In place: self += alpha * x (x broadcast to self's shape), one dispatch, nothing
    /// allocated, not recorded for backward. For parameter updates (plain SGD, tests).
    pub fn add_scaled_(&self, x: &Tensor, alpha: f32) -> Result<()> {
        let x = x.broadcast_to(self.shape())?.detach();
        launch(
            "add_scaled_",
            &elementwise::UNARY,
            UnaryOp::MulScalar as u32,
            self.shape(),
            &[&x],
            (alpha, 0.0),
            Out::Acc(self),
        )?;
        Ok(())
    }
}

/// `t` copied per `out` (new, over, or added into an existing tensor).
pub(crate) fn launch_copy(t: &Tensor, out: Out<'_>) -> Result<Tensor> {
    launch(
        "copy",
        &elementwise::UNARY,
        UnaryOp::Copy as u32,
        t.shape(),
        &[t],
        (0.0, 0.0),
        out,
    )
}

/// The backward of a unary op: g times its derivative, from the input x or the output y.
struct UnaryBackward {
    op: UnaryOp,
    scalars: (f32, f32),
    x: Option<Tensor>,
    y: Option<Tensor>,
}

impl UnaryBackward {
    fn needs_input(op: UnaryOp) -> bool {
        use UnaryOp::*;
        matches!(
            op,
            Log | Abs
                | Relu
                | Gelu
                | Sin
                | Cos
                | Square
                | PowScalar
                | MaxScalar
                | MinScalar
                | RdivScalar
                | Clamp
        )
    }

    fn needs_output(op: UnaryOp) -> bool {
        use UnaryOp::*;
        matches!(op, Exp | Sqrt | Rsqrt | Tanh | Sigmoid | Recip)
    }
}

impl Backward for UnaryBackward {
    fn name(&self) -> &'static str {
        "unary"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        if matches!(self.op, UnaryOp::Copy | UnaryOp::AddScalar) {
            return ctx.put(0, g.clone());
        }
        let x = self.x.as_ref().unwrap_or(g);
        let y = self.y.as_ref().unwrap_or(g);
        let code = ternary::unary_backward(self.op);
        ctx.put_with(0, |out| {
            launch(
                "unary_backward",
                &elementwise::TERNARY,
                code,
                g.shape(),
                &[g, x, y],
                self.scalars,
                out,
            )
        })
    }
}

/// The backward of a binary op: each operand's gradient, summed back over the dims it was
/// broadcast along.
struct BinaryBackward {
    op: BinaryOp,
    a: Tensor,
    b: Tensor,
}

impl Backward for BinaryBackward {
    fn name(&self) -> &'static str {
        "binary"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        for side in 0..2 {
            if !ctx.needed(side) {
                continue;
            }
            let shape = if side == 0 {
                self.a.shape()
            } else {
                self.b.shape()
            };
            let broadcast = shape != g.shape();
            let pass_through = self.op == BinaryOp::Add || (self.op == BinaryOp::Sub && side == 0);
            if pass_through {
                if broadcast {
                    ctx.put_with(side, |out| g.sum_to_shape_into(shape, out))?;
                } else {
                    ctx.put(side, g.clone())?;
                }
                continue;
            }
            let code = ternary::binary_backward(self.op, side == 1);
            let inputs = [g, &self.a, &self.b];
            ctx.put_summed_to(side, shape, g.shape(), |out| {
                launch(
                    "binary_backward",
                    &elementwise::TERNARY,
                    code,
                    g.shape(),
                    &inputs,
                    (0.0, 0.0),
                    out,
                )
            })?;
        }
        Ok(())
    }
}

/// The backward of where: the gradient goes to x where the condition holds, to y elsewhere.
struct WhereBackward {
    cond: Tensor,
    x_shape: Vec<usize>,
    y_shape: Vec<usize>,
}

impl Backward for WhereBackward {
    fn name(&self) -> &'static str {
        "where"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let zero = Tensor::zeros(g.device(), &[])?;
        for (side, shape) in [(1, &self.x_shape), (2, &self.y_shape)] {
            if !ctx.needed(side) {
                continue;
            }
            let inputs = if side == 1 {
                [&self.cond, g, &zero]
            } else {
                [&self.cond, &zero, g]
            };
            ctx.put_summed_to(side, shape, g.shape(), |out| {
                launch(
                    "where_backward",
                    &elementwise::TERNARY,
                    ternary::WHERE,
                    g.shape(),
                    &inputs,
                    (0.0, 0.0),
                    out,
                )
            })?;
        }
        Ok(())
    }
}

impl Tensor {
    /// A unary op; `s` and `s2` are its scalar operands where it has them.
    pub fn unary(&self, op: UnaryOp, s: f32, s2: f32) -> Result<Tensor> {
        let out = launch(
            "unary",
            &elementwise::UNARY,
            op as u32,
            self.shape(),
            &[self],
            (s, s2),
            Out::New,
        )?;
        let saved_out = out.clone();
        Ok(record(out, &[self], || UnaryBackward {
            op,
            scalars: (s, s2),
            x: UnaryBackward::needs_input(op).then(|| self.detach()),
            y: UnaryBackward::needs_output(op).then_some(saved_out),
        }))
    }

    /// A binary op with numpy broadcasting.
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shape("binary", self.shape(), other.shape())?;
        let out = launch(
            "binary",
            &elementwise::BINARY,
            op as u32,
            &shape,
            &[self, other],
            (0.0, 0.0),
            Out::New,
        )?;
        if (op as u32) >= BinaryOp::Eq as u32 {
            return Ok(out); // comparisons have no gradient
        }
        Ok(record(out, &[self, other], || BinaryBackward {
            op,
            a: self.detach(),
            b: other.detach(),
        }))
    }

    /// `cond != 0 ? x : y`, all three broadcast together (the gradient flows to x and y).
    pub fn where_cond(cond: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shape("where", cond.shape(), x.shape())?;
        let shape = broadcast_shape("where", &shape, y.shape())?;
        let out = launch(
            "where",
            &elementwise::TERNARY,
            ternary::WHERE,
            &shape,
            &[cond, x, y],
            (0.0, 0.0),
            Out::New,
        )?;
        Ok(record(out, &[cond, x, y], || WhereBackward {
            cond: cond.detach(),
            x_shape: x.shape().to_vec(),
            y_shape: y.shape().to_vec(),
        }))
    }

    pub fn add(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, o)
    }
    pub fn sub(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, o)
    }
    pub fn mul(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, o)
    }
    pub fn div(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, o)
    }
    pub fn maximum(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Max, o)
    }
    pub fn minimum(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Min, o)
    }
    pub fn pow(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Pow, o)
    }
    pub fn eq(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Eq, o)
    }
    pub fn ne(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ne, o)
    }
    pub fn lt(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Lt, o)
    }
    pub fn le(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Le, o)
    }
    pub fn gt(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Gt, o)
    }
    pub fn ge(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ge, o)
    }

    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg, 0.0, 0.0)
    }
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp, 0.0, 0.0)
    }
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log, 0.0, 0.0)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt, 0.0, 0.0)
    }
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt, 0.0, 0.0)
    }
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs, 0.0, 0.0)
    }
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu, 0.0, 0.0)
    }
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh, 0.0, 0.0)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid, 0.0, 0.0)
    }
    /// GELU, tanh approximation (GPT-2's).
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu, 0.0, 0.0)
    }
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sin, 0.0, 0.0)
    }
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Cos, 0.0, 0.0)
    }
    pub fn square(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Square, 0.0, 0.0)
    }
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip, 0.0, 0.0)
    }
    pub fn add_scalar(&self, s: f32) -> Result<Tensor> {
        self.unary(UnaryOp::AddScalar, s, 0.0)
    }
    pub fn mul_scalar(&self, s: f32) -> Result<Tensor> {
        self.unary(UnaryOp::MulScalar, s, 0.0)
    }
    /// x^s; for x < 0 defined only for integer s (as in PyTorch).
    pub fn pow_scalar(&self, s: f32) -> Result<Tensor> {
        let kind = if s.fract() != 0.0 {
            2.0
        } else if (s as i64) % 2 != 0 {
            1.0
        } else {
            0.0
        };
        self.unary(UnaryOp::PowScalar, s, kind)
    }
    pub fn max_scalar(&self, s: f32) -> Result<Tensor> {
        self.unary(UnaryOp::MaxScalar, s, 0.0)
    }
    pub fn min_scalar(&self, s: f32) -> Result<Tensor> {
        self.unary(UnaryOp::MinScalar, s, 0.0)
    }
    /// s - x.
    pub fn rsub_scalar(&self, s: f32) -> Result<Tensor> {
        self.unary(UnaryOp::RsubScalar, s, 0.0)
    }
    /// s / x.
    pub fn rdiv_scalar(&self, s: f32) -> Result<Tensor> {
        self.unary(UnaryOp::RdivScalar, s, 0.0)
    }
    pub fn clamp(&self, lo: f32, hi: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Clamp, lo, hi)
    }
    /// x * scale + shift.
    pub fn affine(&self, scale: f32, shift: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine, scale, shift)
    }
}
