//! A linear layer in one matmul dispatch: y = act(x W + b), with the bias add and GELU (the tanh
//! approximation GPT-2 uses) in the matmul's epilogue, or y = r + x W + b with a block's
//! residual r added there too (`linear_residual`). W is (K, N), the layout of GPT-2's Conv1D
//! weights, so Hugging Face weights load without a transpose.
//!
//! Backward: dz = g (or g * gelu'(z) from the saved pre-activation z, one dispatch; under
//! autocast z, the output's gradient g and dz are stored f16); dW = x^T dz with, over few
//! rows, db = the sums of dz over rows in the same product (x^T extended by a row of ones;
//! else a reduction), and dx = dz W^T, each written into its gradient by the matmul.

use crate::autograd::{record, Backward, BackwardCtx};
use crate::config::Float;
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::elementwise::{self, ternary, UnaryOp};
use crate::ops::elementwise::{launch, launch_copy};
use crate::ops::matmul::{half_precision, Epilogue};
use crate::ops::{autocast, Out};

const OP: &str = "linear";

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
    /// The output is residual + act(x W + b), the residual the input after the bias: its
    /// gradient is the output's.
    has_residual: bool,
    /// The forward ran under autocast: so do the backward products.
    half: bool,
}

/// The rule name of a linear with GELU's epilogue.
const GELU_RULE: &str = "linear_gelu";

impl Backward for LinearBackward {
    fn name(&self) -> &'static str {
        if self.pre.is_some() {
            GELU_RULE
        } else {
            OP
        }
    }

    /// Under autocast the backward products round g to f16 as they load it, and GELU's
    /// gradient reads it as either type (unless `Precision::gelu` keeps it f32).
    fn takes_half_grad(&self) -> bool {
        self.half && (self.pre.is_none() || gelu_f16(&self.x))
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let half = self.half;
        let residual = self.has_residual.then(|| 2 + self.has_bias as usize);
        autocast(half, || (*self).backward_products(g, ctx))?;
        match residual {
            Some(i) if ctx.needed(i) => ctx.put(i, g.clone()),
            _ => Ok(()),
        }
    }
}

impl LinearBackward {
    fn backward_products(self, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let n = self.w.shape()[1];
        let g = g.reshape(&[g.numel() / n, n])?; // (rows, N)
        let dz = match &self.pre {
            // Under autocast dz is stored f16 (`Precision::gelu_grad`): the products round it
            // to f16 as they load it anyway, and read half the bytes.
            Some(z) => {
                let precision = g.device().options().precision;
                let dtype = if self.half && precision.gelu_grad == Float::F16 {
                    DType::F16
                } else {
                    DType::F32
                };
                let dz = Tensor::uninit(g.device(), g.shape(), dtype, "linear_backward")?;
                launch(
                    "linear_backward",
                    &elementwise::TERNARY,
                    ternary::unary_backward(UnaryOp::Gelu),
                    g.shape(),
                    &[&g, z, &g],
                    (0.0, 0.0),
                    Out::Write(&dz),
                )?
            }
            None => g,
        };
        // dW = x^T dz and, under autocast or over few rows, db (the sums of dz over rows) in
        // the same product: x^T with a row of ones (`Epilogue::BColumnSums`,
        // `bias_grad_in_product`). Then dX, which reads what dW read and writes a new buffer,
        // needs no barrier (`graph::segment::Barriers`), nor does db's first stage where it is a
        // reduction: both run beside dW's product, ahead of the dispatch that sums its ranges
        // of K where it is split (`graph::schedule` moves them there).
        let x = &self.x;
        let dw = |out: Out<'_>, db: Option<&Tensor>| -> Result<Tensor> {
            let epilogue = db.map_or(Epilogue::None, Epilogue::BColumnSums);
            match out {
                // W is a transposed view (the LM head's tied embedding): dW^T = dz^T x into
                // the row-major image, so the product stores rows, not a column per element.
                Out::Write(t) | Out::Acc(t)
                    if t.rank() == 2 && t.strides()[0] == 1 && t.strides()[1] != 1 =>
                {
                    if let Some(db) = db {
                        let acc = matches!(out, Out::Acc(_));
                        dz.sum_to_shape_into(
                            &[n],
                            if acc { Out::Acc(db) } else { Out::Write(db) },
                        )?;
                    }
                    let image = t.t()?;
                    let target = if matches!(out, Out::Acc(_)) {
                        Out::Acc(&image)
                    } else {
                        Out::Write(&image)
                    };
                    dz.t()?.matmul_into(x, target)?;
                    Ok(t.clone())
                }
                out => x.t()?.matmul_epilogue_into(&dz, epilogue, out, DType::F32),
            }
        };
        match (ctx.needed(1), self.has_bias && ctx.needed(2)) {
            (true, true) => ctx.put_pair_with(1, 2, |ow, ob| {
                let (tw, acc_w) = ow.resolve(OP, x.device(), self.w.shape(), &[x, &dz])?;
                let (tb, acc_b) = ob.resolve(OP, x.device(), &[n], &[&dz])?;
                let out = |t, acc| if acc { Out::Acc(t) } else { Out::Write(t) };
                if acc_w == acc_b && tb.is_contiguous() && bias_grad_in_product(&dz, self.half) {
                    dw(out(&tw, acc_w), Some(&tb))?;
                } else {
                    dw(out(&tw, acc_w), None)?;
                    dz.sum_to_shape_into(&[n], out(&tb, acc_b))?;
                }
                Ok((tw, tb))
            })?,
            (true, false) => ctx.put_with(1, |out| dw(out, None))?,
            (false, true) => ctx.put_with(2, |out| dz.sum_to_shape_into(&[n], out))?,
            (false, false) => {}
        }
        if ctx.needed(0) {
            let x_shape = ctx.input(0).shape().to_vec();
            let wt = self.w.t()?;
            // Under autocast, the gradient of the input is stored f16 where its producer reads
            // f16 gradients and this is its only contribution: the MLP's second dX (GELU's
            // gradient reads it as f32) and the attention's output projection's dX (the
            // cooperative-matrix attention's backward reads dO as it reads O).
            let dx_dtype = if self.half && ctx.input_takes_half(0) && ctx.sole_contribution(0) {
                DType::F16
            } else {
                DType::F32
            };
            ctx.put_with_typed(0, dx_dtype, |out| match out {
                Out::New => dz
                    .matmul_epilogue_into(&wt, Epilogue::None, Out::New, dx_dtype)?
                    .reshape(&x_shape),
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

/// Rows up to which an f32 linear's bias gradient comes out of its dW product (a row of ones
/// appended to x^T) instead of a two-stage reduction of dz. On an H200 (DistilGPT-2 --amp,
/// 2026-11-25): at 512 rows 48 dispatches and 24 barriers fewer, the step 0.2 ms shorter; at
/// 4,096 rows the extra tile row of each dW product cost 0.27 ms of GPU time more than the
/// reductions it replaced (they had run beside dW and dX). Under autocast the product serves at
/// any rows: since the products store f32 C through their scratch epilogue, the 8 x 512 --amp
/// step ran 16.66-16.87 ms with it against 16.81-17.09 with the reductions on an H100; the f32
/// step alike either way (38.53-38.60 against 38.57-38.63 ms), so f32 keeps the limit
/// (PROFILING.md, 2026-11-26).
const BIAS_GRAD_IN_PRODUCT_ROWS: usize = 1024;

/// Whether the bias gradient of a linear over dz's rows comes out of its dW product: under
/// autocast (`half`) or up to `BIAS_GRAD_IN_PRODUCT_ROWS` (a `lab` build's `WGRAD_BIAS_GRAD`
/// forces either way).
fn bias_grad_in_product(dz: &Tensor, half: bool) -> bool {
    let forced = dz.device().options().lab.bias_grad_in_product();
    forced.unwrap_or(half || dz.shape()[0] <= BIAS_GRAD_IN_PRODUCT_ROWS)
}

/// Whether a GELU linear on `x`'s device stores its pre-activation (and its output's gradient
/// may be) f16 under autocast (`Precision::gelu`: f16, as PyTorch's autocast saves there; f32
/// keeps both f32). GELU's gradient reads both as f32.
fn gelu_f16(x: &Tensor) -> bool {
    x.device().options().precision.gelu == Float::F16
}

/// Whether an f32 input of a (K, N) weight under autocast is rounded to f16 before the
/// product: where the output has 3 K columns or more (the numbers are the same either way;
/// casting every input, or none, measured slower: docs/decisions.md). An f16 input is used as
/// it is: a producer may store f16 for such a linear (GPT-2's LayerNorms do under mixed
/// precision).
pub(crate) fn cast_input(n: usize, k: usize) -> bool {
    n >= 3 * k
}

impl Tensor {
    /// act(self W + b) for self (..., K), W (K, N), b (N): one matmul dispatch.
    pub fn linear(&self, w: &Tensor, b: Option<&Tensor>, act: Activation) -> Result<Tensor> {
        self.linear_as(w, b, act, DType::F32)
    }

    /// `linear` with its output stored as `dtype` (f32, or f16 for a consumer that reads f16
    /// operands: the cast is the matmul's store). The pre-activation GELU saves is f16 under
    /// autocast, else f32.
    pub fn linear_as(
        &self,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Activation,
        dtype: DType,
    ) -> Result<Tensor> {
        self.linear_rows(w, b, act, dtype, 1, None)
    }

    /// residual + (self W + b), the output the residual's shape: a linear whose output a block
    /// adds to its residual stream, the add in the product's epilogue (one dispatch, where
    /// `x.linear(w, b) + residual` takes two). A residual that is not a contiguous f32 tensor
    /// of the output's shape is added by a second dispatch.
    pub fn linear_residual(&self, w: &Tensor, b: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let mut out_shape = self.shape().to_vec();
        if let (Some(last), Some(&n)) = (out_shape.last_mut(), w.shape().get(1)) {
            *last = n;
        }
        if residual.shape() != out_shape.as_slice()
            || residual.dtype() != DType::F32
            || !residual.is_contiguous()
        {
            return self.linear(w, Some(b), Activation::None)?.add(residual);
        }
        self.linear_rows(w, Some(b), Activation::None, DType::F32, 1, Some(residual))
    }

    /// `linear` (no bias) whose output rows are `row_align`-element aligned: (rows, N) over a
    /// (rows, N rounded up) buffer. An output as wide as the LM head's (N = 50,257 logits) is
    /// then stored in vectors, and its gradient (made with the same rows by cross-entropy) is
    /// read by the backward matmuls in vectors.
    pub fn linear_padded(&self, w: &Tensor, row_align: usize) -> Result<Tensor> {
        self.linear_padded_as(w, row_align, DType::F32)
    }

    /// `linear_padded` whose output is made as `dtype` (f32, or f16: the kernel's store rounds).
    pub fn linear_padded_as(&self, w: &Tensor, row_align: usize, dtype: DType) -> Result<Tensor> {
        self.linear_rows(w, None, Activation::None, dtype, row_align, None)
    }

    fn linear_rows(
        &self,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Activation,
        dtype: DType,
        row_align: usize,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        debug_assert!(
            residual.is_none() || (b.is_some() && act == Activation::None),
            "a residual comes with a bias and no activation (`linear_residual`)"
        );
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
        let wd = w.detach();
        let half = half_precision(&x, &wd);
        // A half-precision product (autocast, or an f16 weight) rounds an f32 input to f16 as
        // it loads it, once per column tile of the output; rounded once here instead, every
        // tile loads half the bytes, and the backward's dW reads (and keeps) the f16 copy. The
        // same values (up to the order of sums, where the f16 input's key tunes to another
        // tile).
        let xd = if half && x.dtype() == DType::F32 && cast_input(n, k) {
            x.detach().to_dtype(DType::F16)?
        } else {
            x.detach()
        };
        let padded = match n.next_multiple_of(row_align.max(1)) {
            stride if stride > n => Some(Tensor::uninit_rows(
                self.device(),
                &[rows, n],
                stride,
                dtype,
                OP,
            )?),
            _ => None,
        };
        let out = match &padded {
            Some(t) => Out::Write(t),
            None => Out::New,
        };
        let (y, pre) = match (b, act) {
            (None, _) => (
                xd.matmul_epilogue_into(&wd, Epilogue::None, out, dtype)?,
                None,
            ),
            (Some(bias), Activation::None) => {
                let bias = bias.detach();
                let epilogue = match residual {
                    Some(r) => Epilogue::BiasResidual {
                        bias: &bias,
                        residual: &r.detach().reshape(&[rows, n])?,
                    },
                    None => Epilogue::Bias(&bias),
                };
                (xd.matmul_epilogue_into(&wd, epilogue, out, dtype)?, None)
            }
            (Some(bias), Activation::Gelu) => {
                // Under autocast the pre-activation is stored f16 (GELU's gradient reads it).
                let pre_dtype = if half && gelu_f16(self) {
                    DType::F16
                } else {
                    DType::F32
                };
                let pre = Tensor::uninit(self.device(), &[rows, n], pre_dtype, OP)?;
                let y = xd.matmul_epilogue_into(
                    &wd,
                    Epilogue::BiasGelu {
                        bias: &bias.detach(),
                        pre: &pre,
                    },
                    out,
                    dtype,
                )?;
                (y, Some(pre))
            }
        };
        let y = y.reshape(&out_shape)?;
        let mut inputs = vec![&x, w];
        inputs.extend(b);
        inputs.extend(residual);
        Ok(record(y, &inputs, || LinearBackward {
            x: xd,
            w: wd,
            pre,
            has_bias: b.is_some(),
            has_residual: residual.is_some(),
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
