//! Elementwise ops: unary, with a scalar, binary with broadcasting, comparisons, where.
//!
//! Contiguous operands of the output's shape take the vectorized path (vec4 loads) when the
//! element count and offsets allow; everything else runs the strided kernel over coalesced
//! dims (broadcast dims have stride 0, so nothing is materialized).

use crate::error::{Error, Result};
use crate::graph::{broadcast_shape, coalesce_joint, DType, Tensor, MAX_RANK};
use crate::kernels::elementwise::{self, BinaryOp, ElementwiseParams, UnaryOp};
use crate::kernels::{pack8, KernelDesc};

/// Records `kernel` with op `code` over `inputs` broadcast to `out_shape`.
fn launch(
    op: &'static str,
    kernel: &'static KernelDesc,
    code: u32,
    out_shape: &[usize],
    inputs: &[&Tensor],
    scalars: (f32, f32),
) -> Result<Tensor> {
    let first = inputs[0];
    for t in inputs {
        t.expect_dtype(op, DType::F32)?;
        first.expect_same_device(op, t)?;
    }
    let device = first.device();
    let out = Tensor::uninit(device, out_shape, DType::F32, op)?;
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
            .all(|t| t.shape() == out_shape && t.is_contiguous() && t.layout().offset % 4 == 0);
    let n = if vec4 {
        for (i, t) in inputs.iter().enumerate() {
            params.offsets[i] = (t.layout().offset / 4) as u32;
        }
        numel / 4
    } else {
        let layouts: Vec<_> = inputs
            .iter()
            .map(|t| t.layout().broadcast_to(out_shape))
            .collect();
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
        &elementwise::spec(code, vec4),
        &params,
        &storages,
        groups,
    );
    Ok(out)
}

impl Tensor {
    /// A unary op; `s` and `s2` are its scalar operands where it has them.
    pub fn unary(&self, op: UnaryOp, s: f32, s2: f32) -> Result<Tensor> {
        launch(
            "unary",
            &elementwise::UNARY,
            op as u32,
            self.shape(),
            &[self],
            (s, s2),
        )
    }

    /// A binary op with numpy broadcasting.
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shape("binary", self.shape(), other.shape())?;
        launch(
            "binary",
            &elementwise::BINARY,
            op as u32,
            &shape,
            &[self, other],
            (0.0, 0.0),
        )
    }

    /// `cond != 0 ? self : other`, all three broadcast together.
    pub fn where_cond(cond: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shape("where", cond.shape(), x.shape())?;
        let shape = broadcast_shape("where", &shape, y.shape())?;
        launch(
            "where",
            &elementwise::WHERE,
            0,
            &shape,
            &[cond, x, y],
            (0.0, 0.0),
        )
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
