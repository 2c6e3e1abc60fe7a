//! Concatenation along one dim: one copy dispatch per part into its slice of a new tensor;
//! the backward hands each part its slice of the gradient (a view, no copy).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::ops::elementwise::launch_copy;
use crate::ops::Out;

const OP: &str = "cat";

struct CatBackward {
    dim: usize,
    /// (start, len) of each part along `dim`.
    spans: Vec<(usize, usize)>,
}

impl Backward for CatBackward {
    fn name(&self) -> &'static str {
        OP
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        for (i, &(start, len)) in self.spans.iter().enumerate() {
            if ctx.needed(i) {
                ctx.put(i, g.narrow(self.dim as isize, start, len)?)?;
            }
        }
        Ok(())
    }
}

impl Tensor {
    /// `parts` (same rank, dtype and device; equal sizes but along `dim`) joined along `dim`.
    pub fn cat(parts: &[&Tensor], dim: usize) -> Result<Tensor> {
        let first = parts.first().ok_or_else(|| Error::InvalidArgument {
            op: OP,
            reason: "no tensors to concatenate".into(),
        })?;
        let rank = first.rank();
        if dim >= rank {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("dim {dim} of rank-{rank} tensors"),
            });
        }
        let mut shape = first.shape().to_vec();
        shape[dim] = 0;
        let mut spans = Vec::with_capacity(parts.len());
        for p in parts {
            let same_but_dim =
                p.rank() == rank && (0..rank).all(|d| d == dim || p.shape()[d] == first.shape()[d]);
            if !same_but_dim || p.dtype() != first.dtype() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    expected: format!(
                        "{:?} tensors of shape {:?} but along dim {dim}",
                        first.dtype(),
                        first.shape()
                    ),
                    got: p.shape().to_vec(),
                });
            }
            p.expect_same_device(OP, first)?;
            spans.push((shape[dim], p.shape()[dim]));
            shape[dim] += p.shape()[dim];
        }
        let out = Tensor::uninit(first.device(), &shape, first.dtype(), OP)?;
        for (p, &(start, len)) in parts.iter().zip(&spans) {
            if len > 0 {
                launch_copy(
                    &p.detach(),
                    Out::Write(&out.narrow(dim as isize, start, len)?),
                )?;
            }
        }
        Ok(record(out, parts, || CatBackward { dim, spans }))
    }
}
