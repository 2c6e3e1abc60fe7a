//! Cross-entropy of logits against u32 class targets, fused. The forward is one pass over the
//! logits (an online max and rescaled sum give lse, then the per-row loss) and the mean over
//! the non-ignored rows (1 / n_valid folded into the sum's scale); backward writes dlogits in
//! one pass from the saved lse. `cross_entropy_unfused` is the same function in existing ops
//! (log_softmax, a one-hot product, a sum): the reference tests compare.
//!
//! Shapes: logits (..., V) seen as (N, V) rows (read in place when the leading dims merge into
//! one row stride and columns are unit-stride: padded rows need no copy); targets (...) or
//! (N), u32; lse (N); loss []. dlogits is made with the logits' row stride, so padded logits
//! get padded gradients (rows on aligned boundaries for the matmuls that read them).
//! Targets are checked on the host (every non-ignored one < V) from the copy `from_u32` keeps,
//! so no read-back is needed. With no non-ignored target the loss is NaN (0 / 0, as PyTorch's
//! mean) and the gradient zero.

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{coalesce_joint, DType, Tensor};
use crate::kernels::cross_entropy::{self, CrossEntropyParams, NO_IGNORE};
use crate::kernels::reduce::ReduceOp;
use crate::ops::elementwise::launch_copy;
use crate::ops::Out;

const OP: &str = "cross_entropy";

/// What backward needs: the logits, the targets, and the lse the forward saved.
struct CrossEntropyBackward {
    logits: Tensor,  // (..., V), rows per `rows_of`
    targets: Tensor, // (N) u32
    lse: Tensor,     // (N)
    ignore_index: u32,
    /// 1 / n_valid; 0 when every row is ignored (no row then has a gradient).
    inv_n: f32,
    /// The element type of a new dlogits (f32, or f16 for a consumer that rounds to f16).
    grad_dtype: DType,
}

/// Offset and row stride of `t` (..., V) as rows of V unit-stride elements, each row apart
/// from the others; None when its leading dims do not merge into one stride.
fn rows_of(t: &Tensor) -> Option<(usize, usize)> {
    let r = t.rank();
    let cols = *t.shape().last()?;
    if cols > 1 && t.strides()[r - 1] != 1 {
        return None;
    }
    let (shape, strides) = coalesce_joint(&t.shape()[..r - 1], &[&t.strides()[..r - 1]]);
    match shape.len() {
        0 => Some((t.layout().offset, cols)),
        1 if strides[0][0] >= cols => Some((t.layout().offset, strides[0][0])),
        _ => None,
    }
}

impl Backward for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        OP
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        ctx.put_with(0, |out| self.dlogits(g, out))
    }
}

impl CrossEntropyBackward {
    /// dlogits = g * (softmax - onehot) / n_valid, written per `out` in one dispatch; g (the
    /// scalar upstream gradient) is read by the kernel from its buffer.
    fn dlogits(&self, g: &Tensor, out: Out<'_>) -> Result<Tensor> {
        let x = &self.logits;
        let device = x.device();
        let (x_off, x_rs) = rows_of(x).expect("the forward kept logits with rows");
        let cols = x.shape().last().copied().unwrap_or(1);
        let inputs = [x, g, &self.lse, &self.targets];
        let (target, acc) = match out {
            // With the logits' row stride (their padding, if any).
            Out::New => (
                Tensor::uninit_rows(device, x.shape(), x_rs, self.grad_dtype, OP)?,
                false,
            ),
            Out::Write(t) | Out::Acc(t) => {
                out.resolve_typed(OP, device, x.shape(), &inputs, t.dtype())?
            }
        };
        if target.dtype() == DType::U32 {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: DType::F32,
                got: DType::U32,
            });
        }
        let Some((out_off, out_rs)) = rows_of(&target) else {
            // The kernel writes rows: compute into a new tensor, then copy it in.
            let fresh = self.dlogits(g, Out::New)?;
            let out = if acc {
                Out::Acc(&target)
            } else {
                Out::Write(&target)
            };
            return launch_copy(&fresh, out);
        };
        let rows = self.lse.numel();
        let params = CrossEntropyParams {
            rows: rows as u32,
            cols: cols as u32,
            x_offset: x_off as u32,
            target_offset: self.targets.layout().offset as u32,
            ignore_index: self.ignore_index,
            out_offset: out_off as u32,
            g_offset: g.layout().offset as u32,
            inv_n: self.inv_n,
            x_rs: x_rs as u32,
            out_rs: out_rs as u32,
            _pad: [0; 2],
        };
        let vec4 = in_vectors(x, rows, cols, (x_off, x_rs))
            && in_vectors(&target, rows, cols, (out_off, out_rs));
        let kernel = if vec4 {
            &cross_entropy::CROSS_ENTROPY_BACKWARD_VEC4
        } else {
            &cross_entropy::CROSS_ENTROPY_BACKWARD
        };
        device.record(
            kernel,
            &cross_entropy::spec(acc, target.dtype() == DType::F16, x.dtype() == DType::F16),
            &params,
            &[
                target.storage(),
                self.lse.storage(),
                x.storage(),
                self.targets.storage(),
                g.storage(),
            ],
            device.grid(rows as u64),
        );
        Ok(target)
    }
}

/// Whether `rows` rows of `cols` elements of `t`, from `off` and `rs` apart, read in vectors of
/// 4: every row starts on one, and the last row's last vector (which may reach past V into the
/// row's padding) lies inside the binding.
fn in_vectors(t: &Tensor, rows: usize, cols: usize, (off, rs): (usize, usize)) -> bool {
    let end = off + rows.saturating_sub(1) * rs + cols.next_multiple_of(4);
    rows > 0
        && off.is_multiple_of(4)
        && rs.is_multiple_of(4)
        && end as u64 * t.dtype().size() as u64 <= t.storage().bound_bytes()
}

/// The operands of a cross-entropy, checked.
struct Checked {
    rows: usize,
    classes: usize,
    /// Each row's target class; None where the row is ignored.
    targets: Vec<Option<u32>>,
}

impl Checked {
    fn n_valid(&self) -> usize {
        self.targets.iter().flatten().count()
    }
}

fn check_args(
    op: &'static str,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
) -> Result<Checked> {
    if !matches!(logits.dtype(), DType::F32 | DType::F16) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("logits are f32 or f16, not {:?}", logits.dtype()),
        });
    }
    targets.expect_dtype(op, DType::U32)?;
    logits.expect_same_device(op, targets)?;
    let Some((&classes, lead)) = logits.shape().split_last() else {
        return Err(Error::ShapeMismatch {
            op,
            expected: "logits of rank 1 or more, (..., V)".into(),
            got: vec![],
        });
    };
    if classes == 0 {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "logits of shape {:?} have no classes (V = 0)",
                logits.shape()
            ),
        });
    }
    if logits.numel() > u32::MAX as usize {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "{} logits exceed the kernels' 32-bit indexing",
                logits.numel()
            ),
        });
    }
    let rows: usize = lead.iter().product();
    if targets.shape() != lead && targets.shape() != [rows] {
        return Err(Error::ShapeMismatch {
            op,
            expected: format!(
                "targets of shape {lead:?} or [{rows}] (one per row of logits of shape {:?})",
                logits.shape()
            ),
            got: targets.shape().to_vec(),
        });
    }
    let host = match targets.host_u32() {
        Some(h) if targets.is_contiguous() => h,
        _ => {
            return Err(Error::InvalidArgument {
                op,
                reason: "targets need the host copy Tensor::from_u32 keeps (not a view or a GPU \
                         result), to be checked against V and counted without a read-back"
                    .into(),
            })
        }
    };
    let offset = targets.layout().offset;
    let targets = (0..rows)
        .map(|i| {
            let t = host[offset + i];
            if Some(t) == ignore_index {
                Ok(None)
            } else if t as usize >= classes {
                Err(Error::InvalidArgument {
                    op,
                    reason: format!(
                        "target {t} at position {i} is out of range for V = {classes} classes \
                         (ignore_index {ignore_index:?})"
                    ),
                })
            } else {
                Ok(Some(t))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Checked {
        rows,
        classes,
        targets,
    })
}

impl Tensor {
    /// The mean cross-entropy of these logits (..., V), f32 or f16 (summed in f32), against
    /// `targets` (...) or (N) made by `Tensor::from_u32`, over the rows whose target is not
    /// `ignore_index`; shape []. NaN when every row is ignored (as PyTorch). A target >= V is
    /// an error.
    pub fn cross_entropy(&self, targets: &Tensor, ignore_index: Option<u32>) -> Result<Tensor> {
        self.cross_entropy_grad_as(targets, ignore_index, DType::F32)
    }

    /// `cross_entropy` whose gradient of the logits is made as `grad_dtype`: f16 where the
    /// logits' only consumer rounds that gradient to f16 anyway (an autocast matmul: the LM
    /// head's backward), which halves its bytes and the cast.
    pub fn cross_entropy_grad_as(
        &self,
        targets: &Tensor,
        ignore_index: Option<u32>,
        grad_dtype: DType,
    ) -> Result<Tensor> {
        let checked = check_args(OP, self, targets, ignore_index)?;
        let n_valid = checked.n_valid();
        let x = match rows_of(self) {
            Some(_) => self.clone(),
            None => self.contiguous()?,
        };
        let (x_off, x_rs) = rows_of(&x).expect("a contiguous tensor has rows");
        let device = x.device();
        let rows = checked.rows;
        let row_loss = Tensor::uninit(device, &[rows], DType::F32, OP)?;
        let lse = Tensor::uninit(device, &[rows], DType::F32, OP)?;
        let ignore_index = ignore_index.unwrap_or(NO_IGNORE);
        let params = CrossEntropyParams {
            rows: rows as u32,
            cols: checked.classes as u32,
            x_offset: x_off as u32,
            target_offset: targets.layout().offset as u32,
            ignore_index,
            x_rs: x_rs as u32,
            ..Default::default()
        };
        let kernel = if in_vectors(&x, rows, checked.classes, (x_off, x_rs)) {
            &cross_entropy::CROSS_ENTROPY_FORWARD_VEC4
        } else {
            &cross_entropy::CROSS_ENTROPY_FORWARD
        };
        device.record(
            kernel,
            &cross_entropy::spec(false, false, x.dtype() == DType::F16),
            &params,
            &[
                row_loss.storage(),
                lse.storage(),
                x.storage(),
                targets.storage(),
            ],
            device.grid(rows as u64),
        );
        // The mean: 1 / n_valid is the sum's scale. With no valid row the sum is 0 and the
        // scale NaN, so the loss is NaN, as PyTorch's 0 / 0.
        let inv_n = if n_valid == 0 {
            f32::NAN
        } else {
            1.0 / n_valid as f32
        };
        // row_loss carries no autograd record, so this sum records no backward of its own.
        let loss = row_loss.reduce_all(ReduceOp::Sum, inv_n)?;
        Ok(record(loss, &[&x], || CrossEntropyBackward {
            logits: x.detach(),
            targets: targets.detach(),
            lse,
            ignore_index,
            inv_n: if n_valid == 0 { 0.0 } else { inv_n },
            grad_dtype,
        }))
    }

    /// The same loss composed of existing ops: -sum(log_softmax(logits) * onehot) / n_valid,
    /// with the one-hot mask (zero rows where ignored) built on the host. The unfused
    /// reference of `cross_entropy`.
    pub fn cross_entropy_unfused(
        &self,
        targets: &Tensor,
        ignore_index: Option<u32>,
    ) -> Result<Tensor> {
        self.expect_dtype("cross_entropy_unfused", DType::F32)?;
        let checked = check_args("cross_entropy_unfused", self, targets, ignore_index)?;
        let v = checked.classes;
        let mut onehot = vec![0.0f32; checked.rows * v];
        for (row, t) in checked.targets.iter().enumerate() {
            if let Some(t) = t {
                onehot[row * v + *t as usize] = 1.0;
            }
        }
        let onehot = Tensor::from_slice(self.device(), &onehot, self.shape())?;
        let picked = self.log_softmax()?.mul(&onehot)?.sum_all()?;
        // -1 / 0 = -inf times a sum of 0 gives NaN when every row is ignored, as the fused op.
        picked.mul_scalar(-1.0 / checked.n_valid() as f32)
    }
}
