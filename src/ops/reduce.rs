//! Reductions: sum, mean, max, min over one dim, a set of dims, or everything.
//!
//! Over dims: one workgroup per output element folds the reduced dims through any strides.
//! Over everything: stage 1 folds chunks into at most 256 partials, stage 2 folds those (one
//! dispatch when one workgroup suffices). `sum_to_shape` is the reduction broadcasting's
//! backward needs: it folds a gradient back to an operand's shape, into its gradient buffer.

use crate::autograd::{Backward, BackwardCtx};
use crate::error::{Error, Result};
use crate::graph::{resolve_dim, DType, Layout, Tensor, MAX_RANK};
use crate::kernels::elementwise::{self, ternary};
use crate::kernels::pack8;
use crate::kernels::reduce::{self, ReduceOp, ReduceParams};
use crate::ops::elementwise::{launch, launch_copy};
use crate::ops::{Out, UnaryOp};

/// The backward of a reduction: a sum (or mean) spreads g back over the reduced dims; a max or
/// min sends g to the elements equal to the extremum.
pub(crate) struct ReduceBackward {
    x: Option<Tensor>,
    /// The result with the reduced dims kept (size 1), for max and min.
    y: Option<Tensor>,
    x_shape: Vec<usize>,
    keep_shape: Vec<usize>,
    scale: f32,
}

impl ReduceBackward {
    pub(crate) fn new(
        op: ReduceOp,
        x: &Tensor,
        y: &Tensor,
        keep_shape: Vec<usize>,
        scale: f32,
    ) -> ReduceBackward {
        let extremum = op != ReduceOp::Sum;
        ReduceBackward {
            x: extremum.then(|| x.detach()),
            y: extremum.then(|| y.detach()),
            x_shape: x.shape().to_vec(),
            keep_shape,
            scale,
        }
    }
}

impl Backward for ReduceBackward {
    fn name(&self) -> &'static str {
        "reduce"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let g = g.reshape(&self.keep_shape)?.broadcast_to(&self.x_shape)?;
        match (&self.x, &self.y) {
            (Some(x), Some(y)) => {
                let y = y.reshape(&self.keep_shape)?.broadcast_to(&self.x_shape)?;
                ctx.put_with(0, |out| {
                    launch(
                        "reduce_backward",
                        &elementwise::TERNARY,
                        ternary::EXTREMUM_BACKWARD,
                        &self.x_shape,
                        &[&g, x, &y],
                        (0.0, 0.0),
                        out,
                    )
                })
            }
            _ => ctx.put_with(0, |out| {
                launch(
                    "reduce_backward",
                    &elementwise::UNARY,
                    UnaryOp::MulScalar as u32,
                    &self.x_shape,
                    &[&g],
                    (self.scale, 0.0),
                    out,
                )
            }),
        }
    }
}

/// Elements each lane of stage 1 folds before partials pay off (8 keeps the partial count
/// small for the sizes a step sees; to be tuned per device).
const ELEMENTS_PER_LANE: u64 = 8;
/// Upper bound of stage-1 workgroups: stage 2 folds this many in one workgroup.
const MAX_PARTIALS: u64 = 256;

fn too_many_dims(op: &'static str, rank: usize) -> Error {
    Error::InvalidArgument {
        op,
        reason: format!("a view of {rank} non-mergeable dims (at most {MAX_RANK})"),
    }
}

fn select(l: &Layout, keep: impl Fn(usize) -> bool) -> Layout {
    Layout {
        shape: (0..l.rank())
            .filter(|d| keep(*d))
            .map(|d| l.shape[d])
            .collect(),
        strides: (0..l.rank())
            .filter(|d| keep(*d))
            .map(|d| l.strides[d])
            .collect(),
        offset: 0,
    }
    .coalesced()
}

impl Tensor {
    /// Folds the dims `dims` (distinct, in range) with `op`, times `scale`; the result keeps
    /// them as size 1 (keepdim) and is written per `out`.
    pub(crate) fn reduce_dims_into(
        &self,
        op: ReduceOp,
        dims: &[usize],
        scale: f32,
        out: Out<'_>,
    ) -> Result<Tensor> {
        const NAME: &str = "reduce";
        // f32, or an f16 gradient (autocast), folded in f32 into an f32 result.
        let f16_in = self.dtype() == DType::F16;
        if !f16_in {
            self.expect_dtype(NAME, DType::F32)?;
        }
        let l = self.layout();
        let mut out_shape = l.shape.clone();
        for &d in dims {
            out_shape[d] = 1;
        }
        let (target, acc) = out.resolve(NAME, self.device(), &out_shape, &[self])?;
        if !target.is_contiguous() {
            // The kernel writes contiguous outputs: reduce into a new tensor, then add it in.
            let fresh = self.reduce_dims_into(op, dims, scale, Out::New)?;
            return launch_copy(
                &fresh,
                if acc {
                    Out::Acc(&target)
                } else {
                    Out::Write(&target)
                },
            );
        }
        let kept = select(l, |d| !dims.contains(&d));
        let red = select(l, |d| dims.contains(&d));
        if kept.rank() > MAX_RANK || red.rank() > MAX_RANK {
            return Err(too_many_dims(NAME, kept.rank().max(red.rank())));
        }
        let out_numel = target.numel();
        // Rows of a matrix with contiguous kept columns: lanes along the columns, 64 columns a
        // workgroup (the generic kernel takes a workgroup per output: the position-embedding
        // gradient, 393,216 columns of 8 rows at 8 x 512, took about 0.42 ms that way on an
        // H200: reduce_dims 0.445 ms in 3 dispatches before, 0.020 ms in the 2 left after).
        let col_groups = (kept.numel() as u64).div_ceil(reduce::COL_LANES);
        let columns = kept.rank() == 1
            && kept.strides[0] == 1
            && red.rank() == 1
            && red.numel() > 0
            && col_groups
                <= self
                    .device()
                    .gpu()
                    .limits
                    .max_compute_workgroups_per_dimension as u64;
        if out_numel > 0 && columns {
            self.reduce_cols(op, &kept, &red, scale, (&target, acc))?;
            return Ok(target);
        }
        if out_numel > 0 {
            let params = ReduceParams {
                out_numel: out_numel as u32,
                red_numel: red.numel() as u32,
                rank: kept.rank() as u32,
                red_rank: red.rank() as u32,
                in_offset: l.offset as u32,
                scale,
                out_offset: target.layout().offset as u32,
                shape: pack8(&kept.shape),
                strides: pack8(&kept.strides),
                red_shape: pack8(&red.shape),
                red_strides: pack8(&red.strides),
                ..Default::default()
            };
            let groups = self.device().grid(out_numel as u64);
            self.device().record(
                &reduce::REDUCE_DIMS,
                &reduce::spec_in(op, acc, f16_in),
                &params,
                &[target.storage(), self.storage()],
                groups,
            );
        }
        Ok(target)
    }

    /// `reduce_dims_into` over the rows (`red`, one dim) of columns (`kept`, one unit-stride
    /// dim): `reduce_cols` over chunks of rows, then (several chunks) over their partial rows.
    fn reduce_cols(
        &self,
        op: ReduceOp,
        kept: &Layout,
        red: &Layout,
        scale: f32,
        (target, acc): (&Tensor, bool),
    ) -> Result<()> {
        let dev = self.device();
        let f16_in = self.dtype() == DType::F16;
        let (cols, rows) = (kept.numel() as u64, red.numel() as u64);
        let col_groups = cols.div_ceil(reduce::COL_LANES) as u32;
        let chunk_rows = reduce::col_chunk_rows(rows);
        let chunks = rows.div_ceil(chunk_rows);
        let params = |rows: u64, row_stride: usize, in_offset: usize, out_offset: usize| {
            ReduceParams {
                out_numel: cols as u32,
                red_numel: rows as u32,
                rank: 1,
                red_rank: 1,
                in_offset: in_offset as u32,
                scale,
                n_groups: rows as u32, // one chunk: all rows
                out_offset: out_offset as u32,
                strides: pack8(&[1]),
                red_strides: pack8(&[row_stride]),
                ..Default::default()
            }
        };
        let base = self.layout().offset;
        if chunks == 1 {
            dev.record(
                &reduce::REDUCE_COLS,
                &reduce::spec_in(op, acc, f16_in),
                &params(rows, red.strides[0], base, target.layout().offset),
                &[target.storage(), self.storage()],
                [col_groups, 1, 1],
            );
            return Ok(());
        }
        // Partial rows (chunks, cols), then one fold of them into the target.
        let part = Tensor::uninit(dev, &[chunks as usize, cols as usize], DType::F32, "reduce")?;
        let first = ReduceParams {
            scale: 1.0,
            n_groups: chunk_rows as u32,
            ..params(rows, red.strides[0], base, 0)
        };
        dev.record(
            &reduce::REDUCE_COLS,
            &reduce::spec_in(op, false, f16_in),
            &first,
            &[part.storage(), self.storage()],
            [col_groups, chunks as u32, 1],
        );
        let combine = op.combine();
        dev.record(
            &reduce::REDUCE_COLS,
            &reduce::spec(combine, acc),
            &params(chunks, cols as usize, 0, target.layout().offset),
            &[target.storage(), part.storage()],
            [col_groups, 1, 1],
        );
        Ok(())
    }

    /// Folds `dim` with `op`, times `scale`.
    pub fn reduce(&self, op: ReduceOp, dim: isize, keepdim: bool, scale: f32) -> Result<Tensor> {
        let d = resolve_dim("reduce", dim, self.rank())?;
        let out = self.reduce_dims_into(op, &[d], scale, Out::New)?;
        let out = crate::autograd::record_reduce(self, out, op, &[d], scale)?;
        if keepdim {
            Ok(out)
        } else {
            out.squeeze(d as isize)
        }
    }

    /// Sums this tensor (of a shape that `shape` broadcasts to) back down to `shape`, per `out`.
    pub(crate) fn sum_to_shape_into(&self, shape: &[usize], out: Out<'_>) -> Result<Tensor> {
        let extra = self.rank() - shape.len();
        let dims: Vec<usize> = (0..self.rank())
            .filter(|&d| d < extra || (shape[d - extra] == 1 && self.shape()[d] != 1))
            .collect();
        let mut keep_shape = self.shape().to_vec();
        for &d in &dims {
            keep_shape[d] = 1;
        }
        // Reduce with the kept-dims shape, then see the result (or the target) as `shape`.
        match out {
            Out::New => self
                .reduce_dims_into(ReduceOp::Sum, &dims, 1.0, Out::New)?
                .reshape(shape),
            Out::Write(t) | Out::Acc(t) => {
                let acc = matches!(out, Out::Acc(_));
                match t.layout().reshape(&keep_shape) {
                    Some(l) => {
                        let view = t.with_layout(l);
                        let o = if acc {
                            Out::Acc(&view)
                        } else {
                            Out::Write(&view)
                        };
                        self.reduce_dims_into(ReduceOp::Sum, &dims, 1.0, o)?;
                    }
                    None => {
                        let fresh = self
                            .reduce_dims_into(ReduceOp::Sum, &dims, 1.0, Out::New)?
                            .reshape(shape)?;
                        launch_copy(&fresh, out)?;
                    }
                }
                Ok(t.clone())
            }
        }
    }

    /// Folds every element with `op`, times `scale`; a one-element tensor of shape [].
    pub fn reduce_all(&self, op: ReduceOp, scale: f32) -> Result<Tensor> {
        const NAME: &str = "reduce_all";
        self.expect_dtype(NAME, DType::F32)?;
        let l = self.layout().coalesced();
        if l.rank() > MAX_RANK {
            return Err(too_many_dims(NAME, l.rank()));
        }
        let device = self.device();
        let numel = self.numel() as u64;
        let n_groups = numel
            .div_ceil(reduce::WORKGROUP * ELEMENTS_PER_LANE)
            .clamp(1, MAX_PARTIALS);
        let stage1 = ReduceParams {
            out_numel: n_groups as u32,
            rank: l.rank() as u32,
            in_offset: l.offset as u32,
            scale: if n_groups == 1 { scale } else { 1.0 },
            n_groups: n_groups as u32,
            numel: numel as u32,
            shape: pack8(&l.shape),
            strides: pack8(&l.strides),
            ..Default::default()
        };
        let out = Tensor::uninit(device, &[], DType::F32, NAME)?;
        let spec = reduce::spec(op, false);
        if n_groups == 1 {
            device.record(
                &reduce::REDUCE_PARTIAL,
                &spec,
                &stage1,
                &[out.storage(), self.storage()],
                [1, 1, 1],
            );
        } else {
            let partials = Tensor::uninit(device, &[n_groups as usize], DType::F32, NAME)?;
            device.record(
                &reduce::REDUCE_PARTIAL,
                &spec,
                &stage1,
                &[partials.storage(), self.storage()],
                [n_groups as u32, 1, 1],
            );
            let stage2 = ReduceParams {
                out_numel: 1,
                red_numel: n_groups as u32,
                red_rank: 1,
                scale,
                red_shape: pack8(&[n_groups as usize]),
                red_strides: pack8(&[1]),
                ..Default::default()
            };
            // Stage 2 combines partials: squares were already taken in stage 1.
            let stage2_op = op.combine();
            device.record(
                &reduce::REDUCE_DIMS,
                &reduce::spec(stage2_op, false),
                &stage2,
                &[out.storage(), partials.storage()],
                [1, 1, 1],
            );
        }
        let dims: Vec<usize> = (0..self.rank()).collect();
        crate::autograd::record_reduce(self, out, op, &dims, scale)
    }

    pub fn sum(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dim, keepdim, 1.0)
    }

    pub fn mean(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = resolve_dim("mean", dim, self.rank())?;
        self.reduce(ReduceOp::Sum, dim, keepdim, 1.0 / self.shape()[d] as f32)
    }

    pub fn max(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dim, keepdim, 1.0)
    }

    pub fn min(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dim, keepdim, 1.0)
    }

    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Sum, 1.0)
    }

    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Sum, 1.0 / self.numel().max(1) as f32)
    }

    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Max, 1.0)
    }

    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Min, 1.0)
    }
}
