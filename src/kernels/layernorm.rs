//! Launcher of `wgsl/layernorm.wgsl`: LayerNorm over the last dim, forward (saving mean and
//! rstd) and backward (dx in one dispatch; dgamma and dbeta in two stages).

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "layernorm",
    source: include_str!("../../wgsl/layernorm.wgsl"),
    workgroup_reduce: true,
};

/// Mirrors `Params` in layernorm.wgsl. Offsets and strides count f32 elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LayerNormParams {
    pub rows: u32,
    /// C, the normalized (last) dim.
    pub cols: u32,
    pub eps: f32,
    pub x_offset: u32,
    pub gamma_offset: u32,
    pub beta_offset: u32,
    pub dy_offset: u32,
    pub out_offset: u32,
    /// Stage 2: the element stride of the (C) gradient target.
    pub out_stride: u32,
    /// Stages 1 and 2: row chunks of the (2, n_chunks, C) partial sums.
    pub n_chunks: u32,
    /// Stage 1: rows per chunk.
    pub chunk_rows: u32,
    /// Stage 2: where its partials start (0: dgamma, n_chunks * C: dbeta).
    pub partial_offset: u32,
}

const PARAMS: u64 = std::mem::size_of::<LayerNormParams>() as u64;

/// y (rows, C), x (rows, C), beta (C), mean (rows), rstd (rows), gamma (C).
pub static LAYERNORM_FORWARD: KernelDesc = KernelDesc {
    name: "layernorm_forward",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::ReadWrite,
        Access::ReadWrite,
        Access::Read,
    ],
    params_size: PARAMS,
};

/// dx (rows, C), x (rows, C), dy (rows, C), mean (rows), rstd (rows), gamma (C).
pub static LAYERNORM_BACKWARD_DX: KernelDesc = KernelDesc {
    name: "layernorm_backward_dx",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::Read,
    ],
    params_size: PARAMS,
};

/// partial (2, n_chunks, C), x (rows, C), dy (rows, C), mean (rows), rstd (rows).
pub static LAYERNORM_BACKWARD_PARTIAL: KernelDesc = KernelDesc {
    name: "layernorm_backward_partial",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::Read,
    ],
    params_size: PARAMS,
};

/// dgamma or dbeta (C, any stride), partial (2, n_chunks, C).
pub static LAYERNORM_BACKWARD_SUM: KernelDesc = KernelDesc {
    name: "layernorm_backward_sum",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: PARAMS,
};

/// Lanes per workgroup (`RED_WG`): one row per workgroup, or 256 columns in stages 1 and 2.
pub const WORKGROUP: u64 = 256;

/// `acc`: dx or stage 2 adds into its output (gradient accumulation) instead of overwriting.
pub fn spec(acc: bool) -> Spec {
    Spec::new().bool("ACC", acc)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![
        (&LAYERNORM_FORWARD, spec(false)),
        (&LAYERNORM_BACKWARD_DX, spec(false)),
        (&LAYERNORM_BACKWARD_DX, spec(true)),
        (&LAYERNORM_BACKWARD_PARTIAL, spec(false)),
        (&LAYERNORM_BACKWARD_SUM, spec(false)),
        (&LAYERNORM_BACKWARD_SUM, spec(true)),
    ]
}
