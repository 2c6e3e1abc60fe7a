//! A training loss's LM head and cross-entropy fused by chunks of token rows, their gradients
//! made in the forward: for each chunk, the logits (rows, V), the rows' losses and lse, the
//! logits' gradient for the loss's seed, then dX of the chunk's rows and dW (accumulated over
//! the chunks). A chunk's logits and their gradient are dropped before the next chunk's are
//! made, so the step never holds the whole (N, V) logits or their gradient: the pool reuses
//! the chunk's buffers. dW goes straight into the weight's gradient where the weight is a
//! parameter (added to what is there, as a backward rule's contribution is); the backward
//! rule passes dX on (and dW, where the weight is not a parameter).
//!
//! The gradients are made for the seed the loss is given, which must be the one its backward
//! starts from (`Tensor::backward_with(seed)` on this loss itself): a trainer knows its seed
//! (1 / micro-batches, times the loss scale) before the forward. Backward from another
//! gradient is an error, not a wrong gradient.
//!
//! Shapes: hidden (N, C), the head's weight (V, C) as Hugging Face stores it (GPT-2's tied
//! token embedding, or an untied `lm_head.weight`), targets (N) u32 with the host copy
//! `Tensor::from_u32` keeps; every row counts (no ignore index). The loss is the mean, [].

use crate::autograd::{add_to_leaf_grad, is_leaf, no_grad, record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{DType, Tensor};
use crate::kernels::reduce::ReduceOp;
use crate::ops::cross_entropy::{cross_entropy_dlogits, cross_entropy_rows};
use crate::ops::matmul::half_precision;
use crate::ops::Out;

const OP: &str = "lm_head_loss";

/// The gradients the forward made, and the seed they were made for.
struct LmHeadLossBackward {
    seed: Tensor,
    dx: Tensor,         // (N, C) f32
    dw: Option<Tensor>, // (V, C) f32, where the weight is not a parameter
}

impl Backward for LmHeadLossBackward {
    fn name(&self) -> &'static str {
        OP
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        if !g.same_storage(&self.seed) || g.layout().offset != self.seed.layout().offset {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "this loss's gradients were made in its forward for the seed it was \
                         given: start the backward from the loss itself with that seed \
                         (`backward_with(seed)`), not from a gradient flowing into it"
                    .into(),
            });
        }
        let LmHeadLossBackward { dx, dw, .. } = *self;
        if ctx.needed(0) {
            ctx.put(0, dx)?;
        }
        if let Some(dw) = dw.filter(|_| ctx.needed(1)) {
            ctx.put(1, dw)?;
        }
        Ok(())
    }
}

impl Tensor {
    /// The mean cross-entropy of the LM head `hidden` (N, C) times `w`^T ((V, C) stored) against
    /// `targets` (N), by chunks of `chunk` rows, with the gradients of `hidden` and `w` for
    /// `seed` made as it goes (see the module's note; a parameter's dW lands in its gradient
    /// here, in the forward). The logits of a chunk are made as
    /// `logits_dtype` with rows padded to `row_align` elements, their gradient as
    /// `grad_dtype`; under autocast the products run in half precision and `hidden` is
    /// rounded to f16 once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lm_head_loss(
        &self,
        w: &Tensor,
        targets: &Tensor,
        seed: &Tensor,
        chunk: usize,
        row_align: usize,
        (logits_dtype, grad_dtype): (DType, DType),
    ) -> Result<Tensor> {
        let [n, c] = self.shape() else {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: "hidden states (N, C)".into(),
                got: self.shape().to_vec(),
            });
        };
        let (n, c) = (*n, *c);
        if w.rank() != 2 || w.shape()[1] != c {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("a head weight (V, {c})"),
                got: w.shape().to_vec(),
            });
        }
        if targets.shape() != [n] {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("targets ({n})"),
                got: targets.shape().to_vec(),
            });
        }
        if seed.numel() != 1 || n == 0 || chunk == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "needs a scalar seed, rows and a chunk of rows (seed of {} elements, {n} \
                     rows, chunks of {chunk})",
                    seed.numel()
                ),
            });
        }
        // Each chunk's targets as a tensor of their own: cross-entropy checks them on the host.
        let host = targets
            .host_u32()
            .filter(|_| targets.is_contiguous())
            .ok_or_else(|| Error::InvalidArgument {
                op: OP,
                reason: "targets need the host copy Tensor::from_u32 keeps".into(),
            })?
            .clone();
        let t0 = targets.layout().offset;
        let device = self.device();
        let v = w.shape()[0];
        let wd = w.detach();
        let x = self.detach();
        // Rounded once: both of a chunk's products with it (logits, dW) read the f16 copy.
        let x = if half_precision(&x, &wd) && x.dtype() == DType::F32 {
            x.to_dtype(DType::F16)?
        } else {
            x
        };
        let wt = wd.t()?; // (C, V)
        let inv_n = 1.0 / n as f32;
        let dx = Tensor::uninit(device, &[n, c], DType::F32, OP)?;
        // A parameter's dW goes into its gradient chunk by chunk; any other weight's is kept
        // for the backward.
        let leaf = is_leaf(w);
        let dw = match leaf || !w.needs_grad() {
            true => None,
            false => Some(Tensor::uninit(device, &[v, c], DType::F32, OP)?),
        };
        let loss = no_grad(|| -> Result<Tensor> {
            let mut total: Option<Tensor> = None;
            for (i, r0) in (0..n).step_by(chunk).enumerate() {
                let rows = chunk.min(n - r0);
                let xc = x.narrow(0, r0, rows)?;
                let tc = Tensor::from_u32(device, &host[t0 + r0..t0 + r0 + rows], &[rows])?;
                let logits = xc.linear_padded_as(&wt, row_align, logits_dtype)?; // (rows, V)
                let fwd = cross_entropy_rows(&logits, &tc, None)?;
                let dl = cross_entropy_dlogits(&fwd, &tc, seed, inv_n, grad_dtype)?;
                drop(fwd.logits);
                drop(logits);
                dl.matmul_into(&wd, Out::Write(&dx.narrow(0, r0, rows)?))?;
                // dW = dl^T x: the (V, C) rows stored whole.
                let dlt = dl.t()?;
                match &dw {
                    Some(dw) if i == 0 => drop(dlt.matmul_into(&xc, Out::Write(dw))?),
                    Some(dw) => drop(dlt.matmul_into(&xc, Out::Acc(dw))?),
                    None if leaf => add_to_leaf_grad(w, |out| dlt.matmul_into(&xc, out))?,
                    None => {}
                }
                let part = fwd.row_loss.reduce_all(ReduceOp::Sum, inv_n)?;
                total = Some(match total {
                    None => part,
                    Some(sum) => sum.add(&part)?,
                });
            }
            Ok(total.expect("at least one chunk"))
        })?;
        Ok(record(loss, &[self, w], || LmHeadLossBackward {
            seed: seed.detach(),
            dx,
            dw,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Result;
    use crate::graph::{DType, Device, Tensor};

    /// Largest |a - b| over the largest |b|.
    fn rel(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
        a.iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
            / scale
    }

    /// (loss, d hidden, d w) of the head and loss on the given data, chunked (`Some(chunk)`)
    /// or as the LM head and cross-entropy ops (`None`), under autocast or not.
    fn run(
        dev: &Device,
        (x, w, targets): (&[f32], &[f32], &[u32]),
        (n, c, v): (usize, usize, usize),
        chunk: Option<usize>,
        amp: bool,
    ) -> Result<(f32, Vec<f32>, Vec<f32>)> {
        let hidden = Tensor::from_slice(dev, x, &[n, c])?.requires_grad();
        let weight = Tensor::from_slice(dev, w, &[v, c])?.requires_grad();
        let t = Tensor::from_u32(dev, targets, &[n])?;
        let seed = Tensor::full(dev, &[], 0.75)?;
        let half = if amp { DType::F16 } else { DType::F32 };
        // Chunks of 4 rows take the weight through an op (not a parameter: dW kept for the
        // backward), other chunks as the parameter itself (dW into its gradient).
        let w_in = match chunk {
            Some(4) => weight.mul_scalar(1.0)?,
            _ => weight.clone(),
        };
        let loss = crate::ops::autocast(amp, || match chunk {
            Some(rows) => hidden.lm_head_loss(&w_in, &t, &seed, rows, 8, (half, half)),
            None => hidden
                .linear_padded_as(&weight.t()?, 8, half)?
                .cross_entropy_grad_as(&t, None, half),
        })?;
        loss.backward_with(&seed)?;
        let grad = |t: &Tensor| t.grad().expect("a gradient").to_vec();
        Ok((loss.to_vec()?[0], grad(&hidden)?, grad(&weight)?))
    }

    fn data(n: usize, c: usize, v: usize) -> (Vec<f32>, Vec<f32>, Vec<u32>) {
        let x = (0..n * c)
            .map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0)
            .collect();
        let w = (0..v * c)
            .map(|i| (i * 53 % 97) as f32 / 97.0 - 0.5)
            .collect();
        let t = (0..n).map(|i| (i * 7 % v) as u32).collect();
        (x, w, t)
    }

    /// By chunks of 5 rows (13 rows: a partial last chunk), V = 37 (padded rows), the loss and
    /// both gradients are the ops' (f32), and under autocast within f16 rounding of them.
    #[test]
    fn chunks_match_the_head_and_cross_entropy_ops() -> Result<()> {
        let dev = Device::new()?;
        let (n, c, v) = (13, 16, 37);
        let (x, w, t) = data(n, c, v);
        let want = run(&dev, (&x, &w, &t), (n, c, v), None, false)?;
        let got = run(&dev, (&x, &w, &t), (n, c, v), Some(5), false)?;
        assert!(
            (got.0 - want.0).abs() <= 1e-6 * want.0.abs(),
            "loss {} vs {}",
            got.0,
            want.0
        );
        assert!(
            rel(&got.1, &want.1) <= 1e-5,
            "d hidden {}",
            rel(&got.1, &want.1)
        );
        assert!(rel(&got.2, &want.2) <= 1e-5, "d w {}", rel(&got.2, &want.2));
        assert!(got.2.iter().any(|&g| g != 0.0));
        let node = run(&dev, (&x, &w, &t), (n, c, v), Some(4), false)?;
        assert!(
            rel(&node.1, &want.1) <= 1e-5,
            "d hidden via an op {}",
            rel(&node.1, &want.1)
        );
        assert!(
            rel(&node.2, &want.2) <= 1e-5,
            "d w via an op {}",
            rel(&node.2, &want.2)
        );
        if dev.gpu().has(wgpu::Features::SHADER_F16) {
            let want = run(&dev, (&x, &w, &t), (n, c, v), None, true)?;
            let got = run(&dev, (&x, &w, &t), (n, c, v), Some(5), true)?;
            assert!(
                (got.0 - want.0).abs() <= 1e-3 * want.0.abs(),
                "amp loss {} vs {}",
                got.0,
                want.0
            );
            assert!(
                rel(&got.1, &want.1) <= 2e-3,
                "amp d hidden {}",
                rel(&got.1, &want.1)
            );
            assert!(
                rel(&got.2, &want.2) <= 2e-3,
                "amp d w {}",
                rel(&got.2, &want.2)
            );
        }
        Ok(())
    }

    /// The gradients were made for the seed: a backward from anything else is refused.
    #[test]
    fn a_backward_from_another_gradient_is_an_error() -> Result<()> {
        let dev = Device::new()?;
        let (n, c, v) = (4, 8, 11);
        let (x, w, t) = data(n, c, v);
        let hidden = Tensor::from_slice(&dev, &x, &[n, c])?.requires_grad();
        let weight = Tensor::from_slice(&dev, &w, &[v, c])?.requires_grad();
        let t = Tensor::from_u32(&dev, &t, &[n])?;
        let seed = Tensor::full(&dev, &[], 1.0)?;
        let loss = hidden.lm_head_loss(&weight, &t, &seed, 3, 8, (DType::F32, DType::F32))?;
        let err = loss.mul_scalar(2.0)?.backward_with(&seed).unwrap_err();
        assert!(err.to_string().contains("seed"), "{err}");
        Ok(())
    }
}
