//! Views without copies: reshape, permute, transpose, narrow (slice), broadcast, (un)squeeze;
//! and `contiguous`, the one copy a kernel that needs row-major data asks for.

use crate::autograd::{record, record_view, Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{broadcast_shape, resolve_dim, Layout, Tensor};
use crate::kernels::elementwise::UnaryOp;

/// A broadcast view reads each element many times: its gradient sums back over those reads.
struct BroadcastBackward {
    shape: Vec<usize>,
}

impl Backward for BroadcastBackward {
    fn name(&self) -> &'static str {
        "broadcast_to"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        ctx.put_with(0, |out| g.sum_to_shape_into(&self.shape, out))
    }
}

impl Tensor {
    /// The same elements with another shape: a view when the layout allows, else a copy.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            // The same view (a strided one stays as it is: no copy).
            return Ok(self.clone());
        }
        let numel: usize = shape.iter().product();
        if numel != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                expected: format!("{numel} elements for shape {shape:?}"),
                got: self.shape().to_vec(),
            });
        }
        match self.layout().reshape(shape) {
            Some(_) => self.view(|l| l.reshape(shape)),
            None => self.contiguous()?.reshape(shape),
        }
    }

    /// Dims reordered: `dims[i]` of the input becomes dim i.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        let valid = dims.len() == self.rank()
            && dims
                .iter()
                .all(|&d| d < self.rank() && !std::mem::replace(&mut seen[d], true));
        if !valid {
            return Err(Error::InvalidArgument {
                op: "permute",
                reason: format!(
                    "{dims:?} is not a permutation of the {} dims of {:?}",
                    self.rank(),
                    self.shape()
                ),
            });
        }
        self.view(|l| Some(l.permute(dims)))
    }

    /// Dims `d0` and `d1` swapped (negative dims count from the end).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let a = resolve_dim("transpose", d0, self.rank())?;
        let b = resolve_dim("transpose", d1, self.rank())?;
        let mut dims: Vec<usize> = (0..self.rank()).collect();
        dims.swap(a, b);
        self.permute(&dims)
    }

    /// The last two dims swapped.
    pub fn t(&self) -> Result<Tensor> {
        self.transpose(-2, -1)
    }

    /// `len` entries of `dim` from `start`.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        if start + len > self.shape()[d] {
            return Err(Error::InvalidArgument {
                op: "narrow",
                reason: format!(
                    "range {start}..{} is outside dim {d} of size {} (shape {:?})",
                    start + len,
                    self.shape()[d],
                    self.shape()
                ),
            });
        }
        self.view(|l| Some(l.narrow(d, start, len)))
    }

    /// This tensor seen with shape `shape` (numpy broadcasting), without a copy.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let b = broadcast_shape("broadcast_to", self.shape(), shape)?;
        if b != shape {
            return Err(Error::BroadcastMismatch {
                op: "broadcast_to",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        }
        if self.shape() == shape {
            return self.view(|l| Some(l.clone()));
        }
        let view = self.with_layout(self.layout().broadcast_to(shape));
        Ok(record(view, &[self], || BroadcastBackward {
            shape: self.shape().to_vec(),
        }))
    }

    /// A dim of size 1 inserted at `dim` (0..=rank; negative counts from the end).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("unsqueeze", dim, self.rank() + 1)?;
        self.view(|l| Some(l.unsqueeze(d)))
    }

    /// The size-1 dim `dim` removed.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("squeeze", dim, self.rank())?;
        if self.shape()[d] != 1 {
            return Err(Error::ShapeMismatch {
                op: "squeeze",
                expected: format!("size 1 at dim {d}"),
                got: self.shape().to_vec(),
            });
        }
        self.view(|l| Some(l.squeeze(d)))
    }

    /// The view `f` makes of this tensor's layout (the caller checked that it applies); its
    /// gradient lands where `f` puts it in this tensor's gradient.
    fn view(&self, f: impl Fn(&Layout) -> Option<Layout>) -> Result<Tensor> {
        let layout = f(self.layout()).ok_or_else(|| Error::InvalidArgument {
            op: "view",
            reason: format!("the layout of {:?} does not allow this view", self.shape()),
        })?;
        Ok(record_view(self, self.with_layout(layout), f))
    }

    /// A row-major copy, or this tensor when it already is row-major.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.unary(UnaryOp::Copy, 0.0, 0.0)
    }
}
