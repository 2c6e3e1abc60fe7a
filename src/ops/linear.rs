//! A linear layer in one matmul dispatch: y = act(x W + b), with the bias add and GELU (the tanh
//! approximation GPT-2 uses) in the matmul's epilogue. W is (K, N), the layout of GPT-2's
//! Conv1D weights, so Hugging Face weights load without a transpose.
//!
//! Backward: dz = g (or g * gelu'(z) from the saved pre-activation z, one dispatch); db = sum of
//! dz over rows; dW = x^T dz and dx = dz W^T, each written into its gradient by the matmul.

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::elementwise::{self, ternary, UnaryOp};
use crate::ops::elementwise::{launch, launch_copy};
use crate::ops::matmul::{half_precision, Epilogue};
use crate::ops::{autocast, Out};

/// The activation a linear layer applies in its epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    Gelu,
}

struct LinearBackward {
    x: Tensor,           // (rows, K)
    w: Tensor,           // (K, N)
    pre: Option<Tensor>, // (rows, N) for GELU
    has_bias: bool,
    /// The forward ran under autocast: so do the backward products.
    half: bool,
}

impl Backward for LinearBackward {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let half = self.half;
        autocast(half, || (*self).backward_products(g, ctx))
    }
}

impl LinearBackward {
    fn backward_products(self, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let n = self.w.shape()[1];
        let g = g.reshape(&[g.numel() / n, n])?; // (rows, N)
        let dz = match &self.pre {
            Some(z) => {
                let code = ternary::unary_backward(UnaryOp::Gelu);
                launch(
                    "linear_backward",
                    &elementwise::TERNARY,
                    code,
                    g.shape(),
                    &[&g, z, &g],
                    (0.0, 0.0),
                    Out::New,
                )?
            }
            None => g,
        };
        if self.has_bias && ctx.needed(2) {
            ctx.put_with(2, |out| dz.sum_to_shape_into(&[n], out))?;
        }
        if ctx.needed(1) {
            let xt = self.x.t()?;
            ctx.put_with(1, |out| xt.matmul_into(&dz, out))?;
        }
        if ctx.needed(0) {
            let x_shape = ctx.input(0).shape().to_vec();
            let wt = self.w.t()?;
            ctx.put_with(0, |out| match out {
                Out::New => dz.matmul_into(&wt, Out::New)?.reshape(&x_shape),
                Out::Write(t) | Out::Acc(t) => {
                    let acc = matches!(out, Out::Acc(_));
                    match t.layout().reshape(&[dz.shape()[0], wt.shape()[1]]) {
                        Some(l) => {
                            let t2 = t.with_layout(l);
                            dz.matmul_into(&wt, if acc { Out::Acc(&t2) } else { Out::Write(&t2) })?;
                        }
                        None => {
                            let fresh = dz.matmul_into(&wt, Out::New)?.reshape(&x_shape)?;
                            launch_copy(&fresh, out)?;
                        }
                    }
                    Ok(t.clone())
                }
            })?;
        }
        Ok(())
    }
}

impl Tensor {
    /// act(self W + b) for self (..., K), W (K, N), b (N): one matmul dispatch.
    pub fn linear(&self, w: &Tensor, b: Option<&Tensor>, act: Activation) -> Result<Tensor> {
        self.linear_as(w, b, act, DType::F32)
    }

    /// `linear` with its output stored as `dtype` (f32, or f16 for a consumer that reads f16
    /// operands: the cast is the matmul's store). The pre-activation GELU saves stays f32.
    pub fn linear_as(
        &self,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Activation,
        dtype: DType,
    ) -> Result<Tensor> {
        const OP: &str = "linear";
        if w.rank() != 2 || self.rank() == 0 || self.shape()[self.rank() - 1] != w.shape()[0] {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!(
                    "a weight (K, N) with K = the input's last dim (input {:?})",
                    self.shape()
                ),
                got: w.shape().to_vec(),
            });
        }
        if act == Activation::Gelu && b.is_none() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the GELU epilogue comes with a bias".into(),
            });
        }
        let k = w.shape()[0];
        let n = w.shape()[1];
        let rows = self.numel() / k.max(1);
        let x = self.reshape(&[rows, k])?;
        let mut out_shape = self.shape().to_vec();
        *out_shape.last_mut().expect("rank checked") = n;
        let xd = x.detach();
        let wd = w.detach();
        let (y, pre) = match (b, act) {
            (None, _) => (
                xd.matmul_epilogue_into(&wd, Epilogue::None, Out::New, dtype)?,
                None,
            ),
            (Some(bias), Activation::None) => (
                xd.matmul_epilogue_into(&wd, Epilogue::Bias(&bias.detach()), Out::New, dtype)?,
                None,
            ),
            (Some(bias), Activation::Gelu) => {
                let pre = Tensor::uninit(self.device(), &[rows, n], DType::F32, OP)?;
                let y = xd.matmul_epilogue_into(
                    &wd,
                    Epilogue::BiasGelu {
                        bias: &bias.detach(),
                        pre: &pre,
                    },
                    Out::New,
                    dtype,
                )?;
                (y, Some(pre))
            }
        };
        let y = y.reshape(&out_shape)?;
        let mut inputs = vec![&x, w];
        if let Some(bias) = b {
            inputs.push(bias);
        }
        let half = half_precision(&xd, &wd);
        Ok(record(y, &inputs, || LinearBackward {
            x: xd,
            w: wd,
            pre,
            has_bias: b.is_some(),
            half,
        }))
    }

    /// The unfused composition `linear` must match: matmul, add, gelu as separate ops.
    pub fn linear_reference(
        &self,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Activation,
    ) -> Result<Tensor> {
        let mut y = self.matmul(w)?;
        if let Some(b) = b {
            y = y.add(b)?;
        }
        match act {
            Activation::None => Ok(y),
            Activation::Gelu => y.gelu(),
        }
    }
}
