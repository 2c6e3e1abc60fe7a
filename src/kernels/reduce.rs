//! Launchers of `wgsl/reduce.wgsl`: sum, mean, max, min over a set of dims or everything.

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "reduce",
    source: include_str!("../../wgsl/reduce.wgsl"),
    workgroup_reduce: true,
};

/// Mirrors `Params` in reduce.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ReduceParams {
    pub out_numel: u32,
    pub red_numel: u32,
    pub rank: u32,
    pub red_rank: u32,
    pub in_offset: u32,
    pub scale: f32,
    pub n_groups: u32,
    pub numel: u32,
    pub out_offset: u32,
    pub _pad: [u32; 3],
    pub shape: [u32; 8],
    pub strides: [u32; 8],
    pub red_shape: [u32; 8],
    pub red_strides: [u32; 8],
}

const PARAMS: u64 = std::mem::size_of::<ReduceParams>() as u64;

pub static REDUCE_DIMS: KernelDesc = KernelDesc {
    name: "reduce_dims",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: PARAMS,
};
pub static REDUCE_PARTIAL: KernelDesc = KernelDesc {
    name: "reduce_partial",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: PARAMS,
};

/// Folds over the rows of a matrix whose kept dim is contiguous, `COL_LANES` columns a
/// workgroup, rows in chunks of `n_groups` (one partial row per chunk).
pub static REDUCE_COLS: KernelDesc = KernelDesc {
    name: "reduce_cols",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: PARAMS,
};

/// Columns per workgroup of `reduce_cols`.
pub const COL_LANES: u64 = 64;
/// Rows a workgroup of `reduce_cols` folds at most: more rows go to more workgroups, whose
/// partial rows a second `reduce_cols` folds.
pub const COL_CHUNK_ROWS: u64 = 256;

/// Lanes per workgroup (`RED_WG`).
pub const WORKGROUP: u64 = 256;

/// The fold (`OP` in the shader); a mean is a sum with `scale = 1 / len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum = 0,
    Max = 1,
    Min = 2,
    /// Sum of squares (the squared norm).
    SumSquares = 3,
}

impl ReduceOp {
    /// How partial results of `self` fold together: squares were taken when the partials were
    /// made, so sums of squares combine as sums.
    pub fn combine(self) -> ReduceOp {
        match self {
            ReduceOp::SumSquares => ReduceOp::Sum,
            other => other,
        }
    }
}

/// `acc`: add into the output (gradient accumulation) instead of overwriting it.
pub fn spec(op: ReduceOp, acc: bool) -> Spec {
    Spec::new().u32("OP", op as u32).bool("ACC", acc)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for op in [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::SumSquares,
    ] {
        for acc in [false, true] {
            v.push((&REDUCE_DIMS, spec(op, acc)));
            v.push((&REDUCE_PARTIAL, spec(op, acc)));
            v.push((&REDUCE_COLS, spec(op, acc)));
        }
    }
    v
}
