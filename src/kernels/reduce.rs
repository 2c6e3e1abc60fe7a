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

/// `REDUCE_PARTIAL` over a contiguous input whose offset and length are multiples of 4, read
/// 4 elements a load (the gradient norm's stage 1 over the parameter chunks: a lane's loads
/// issue one after another, so a quarter as many loads take about a quarter of the latencies).
pub static REDUCE_PARTIAL_VEC4: KernelDesc = KernelDesc {
    name: "reduce_partial_vec4",
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
/// Rows one `reduce_cols` folds whole: more rows go to chunks in workgroups of their own,
/// whose partial rows a second `reduce_cols` folds (`col_chunk_rows`).
pub const COL_CHUNK_ROWS: u64 = 256;
/// The shortest chunk of rows (16 loads a lane: 4 row phases).
const MIN_CHUNK_ROWS: u64 = 64;

/// The rows of a chunk when `reduce_cols` folds `rows` rows in two passes: about sqrt(rows), so
/// that both passes are short. A lane's loads issue one after another, so a pass takes about as
/// many memory latencies as a lane has rows (4 row phases a workgroup): 256-row chunks cost a
/// bias gradient of 4096 rows 64 latencies in the first pass (13 us a dispatch on an H200,
/// 2026-11-24), 64-row chunks 16 in each pass.
pub fn col_chunk_rows(rows: u64) -> u64 {
    if rows <= COL_CHUNK_ROWS {
        return rows.max(1);
    }
    ((rows as f64).sqrt().ceil() as u64)
        .next_multiple_of(4)
        .max(MIN_CHUNK_ROWS)
}

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
    spec_in(op, acc, false)
}

/// `spec` over an f16 input (`f16_in`: `reduce_dims` and `reduce_cols`, folded in f32).
pub fn spec_in(op: ReduceOp, acc: bool, f16_in: bool) -> Spec {
    Spec::new()
        .u32("OP", op as u32)
        .bool("ACC", acc)
        .ty("X", if f16_in { "f16" } else { "f32" })
}

/// Every variant; the f16 inputs where the adapter has shader-f16 (`f16`).
pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
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
            v.push((&REDUCE_PARTIAL_VEC4, spec(op, acc)));
            v.push((&REDUCE_COLS, spec(op, acc)));
        }
    }
    // Sums of f16 gradients under autocast (a linear's bias gradient from its f16 dz).
    if f16 {
        for acc in [false, true] {
            v.push((&REDUCE_DIMS, spec_in(ReduceOp::Sum, acc, true)));
            v.push((&REDUCE_COLS, spec_in(ReduceOp::Sum, acc, true)));
        }
    }
    v
}
