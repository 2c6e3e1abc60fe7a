//! Reductions: sum, mean, max, min over one axis (keepdim or not) or over everything.
//!
//! Over an axis: one workgroup per output element folds the axis through any strides. Over
//! everything: stage 1 folds chunks into at most 256 partials, stage 2 folds those (one
//! dispatch when one workgroup suffices).

use crate::error::{Error, Result};
use crate::graph::{resolve_dim, DType, Layout, Tensor, MAX_RANK};
use crate::kernels::pack8;
use crate::kernels::reduce::{self, ReduceOp, ReduceParams};

/// Elements each lane of stage 1 folds before partials pay off (measured later; 8 keeps the
/// partial count small for the sizes a step sees).
const ELEMENTS_PER_LANE: u64 = 8;
/// Upper bound of stage-1 workgroups: stage 2 folds this many in one workgroup.
const MAX_PARTIALS: u64 = 256;

fn too_many_dims(op: &'static str, rank: usize) -> Error {
    Error::InvalidArgument {
        op,
        reason: format!("a view of {rank} non-mergeable dims (at most {MAX_RANK})"),
    }
}

impl Tensor {
    /// Folds `dim` with `op`, times `scale`.
    pub fn reduce(&self, op: ReduceOp, dim: isize, keepdim: bool, scale: f32) -> Result<Tensor> {
        const NAME: &str = "reduce";
        self.expect_dtype(NAME, DType::F32)?;
        let d = resolve_dim(NAME, dim, self.rank())?;
        let l = self.layout();
        let mut out_shape = l.shape.clone();
        out_shape[d] = 1;
        let kept = Layout {
            shape: l
                .shape
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != d)
                .map(|(_, n)| *n)
                .collect(),
            strides: l
                .strides
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != d)
                .map(|(_, s)| *s)
                .collect(),
            offset: l.offset,
        }
        .coalesced();
        if kept.rank() > MAX_RANK {
            return Err(too_many_dims(NAME, kept.rank()));
        }
        let out = Tensor::uninit(self.device(), &out_shape, DType::F32, NAME)?;
        let out_numel = out.numel();
        if out_numel > 0 {
            let params = ReduceParams {
                out_numel: out_numel as u32,
                reduce_len: l.shape[d] as u32,
                reduce_stride: l.strides[d] as u32,
                rank: kept.rank() as u32,
                in_offset: l.offset as u32,
                scale,
                n_groups: 0,
                numel: 0,
                shape: pack8(&kept.shape),
                strides: pack8(&kept.strides),
            };
            let groups = self.device().grid(out_numel as u64);
            self.device().record(
                &reduce::REDUCE_AXIS,
                &reduce::spec(op),
                &params,
                &[out.storage(), self.storage()],
                groups,
            );
        }
        if keepdim {
            Ok(out)
        } else {
            out.squeeze(d as isize)
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
            reduce_len: 0,
            reduce_stride: 0,
            rank: l.rank() as u32,
            in_offset: l.offset as u32,
            scale: if n_groups == 1 { scale } else { 1.0 },
            n_groups: n_groups as u32,
            numel: numel as u32,
            shape: pack8(&l.shape),
            strides: pack8(&l.strides),
        };
        let out = Tensor::uninit(device, &[], DType::F32, NAME)?;
        let spec = reduce::spec(op);
        if n_groups == 1 {
            device.record(
                &reduce::REDUCE_PARTIAL,
                &spec,
                &stage1,
                &[out.storage(), self.storage()],
                [1, 1, 1],
            );
            return Ok(out);
        }
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
            reduce_len: n_groups as u32,
            reduce_stride: 1,
            rank: 0,
            in_offset: 0,
            scale,
            ..Default::default()
        };
        device.record(
            &reduce::REDUCE_AXIS,
            &spec,
            &stage2,
            &[out.storage(), partials.storage()],
            [1, 1, 1],
        );
        Ok(out)
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
