//! Launcher of `wgsl/layernorm.wgsl`: LayerNorm over the last dim, forward (saving mean and
//! rstd; y in f32 or f16) and backward: dx with each chunk of rows' partial dgamma and dbeta,
//! then both parameter gradients from the partials, in a second dispatch.

use bytemuck::{Pod, Zeroable};

use super::{Access, DType, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "layernorm",
    source: include_str!("../../wgsl/layernorm.wgsl"),
    workgroup_reduce: true,
};

/// Mirrors `Params` in layernorm.wgsl. Offsets and strides count elements.
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
    /// Backward: where dx starts.
    pub out_offset: u32,
    /// Backward and stage 2: row chunks of the (2, n_chunks, C) partial sums.
    pub n_chunks: u32,
    /// Backward: rows per chunk.
    pub chunk_rows: u32,
    /// Stage 2: where the (C) gradient targets start, and their element strides.
    pub dgamma_offset: u32,
    pub dgamma_stride: u32,
    pub dbeta_offset: u32,
    pub dbeta_stride: u32,
    pub _pad0: u32,
    pub _pad1: u32,
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

/// dx (rows, C), x (rows, C), dy (rows, C), mean (rows), rstd (rows), gamma (C),
/// partial (2, n_chunks, C).
pub static LAYERNORM_BACKWARD: KernelDesc = KernelDesc {
    name: "layernorm_backward",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::ReadWrite,
    ],
    params_size: PARAMS,
};

/// dgamma (C, any stride), dbeta (C, any stride), partial (2, n_chunks, C).
pub static LAYERNORM_BACKWARD_SUM: KernelDesc = KernelDesc {
    name: "layernorm_backward_sum",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::ReadWrite, Access::Read],
    params_size: PARAMS,
};

/// Lanes per workgroup (`RED_WG`): one row (forward) or chunk of rows (backward) per
/// workgroup.
pub const WORKGROUP: u64 = 256;
/// Columns a stage-2 workgroup sums (`SUM_COLS` in the shader; its 256 lanes are 16 columns x
/// 16 groups of chunks).
pub const SUM_COLUMNS: u64 = 16;

/// How stage 2 writes one parameter gradient (`G_OUT`, `B_OUT` in the shader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Not wanted: its binding is not touched.
    None = 0,
    Overwrite = 1,
    /// Added into (gradient accumulation).
    Add = 2,
}

impl Write {
    pub fn of(acc: bool) -> Write {
        if acc {
            Write::Add
        } else {
            Write::Overwrite
        }
    }
}

/// Every constant and alias the family reads (WGSL validates the whole module, so each
/// variant defines them all; a kernel reads its own).
fn spec(y: DType, dy: DType, dx: Option<bool>, params: bool, g: Write, b: Write) -> Spec {
    Spec::new()
        .ty("YT", y.wgsl())
        .ty("DY", dy.wgsl())
        .bool("ACC", dx == Some(true))
        .bool("DX", dx.is_some())
        .bool("PARAMS", params)
        .u32("G_OUT", g as u32)
        .u32("B_OUT", b as u32)
}

/// The forward storing y as `y` (f32 or f16).
pub fn forward_spec(y: DType) -> Spec {
    spec(y, DType::F32, None, false, Write::None, Write::None)
}

/// The backward reading dy as `dy`; `dx`: whether dx is written, and added into (Some(true))
/// or overwritten; `params`: whether the chunks' partial dgamma and dbeta are written.
pub fn backward_spec(dy: DType, dx: Option<bool>, params: bool) -> Spec {
    spec(DType::F32, dy, dx, params, Write::None, Write::None)
}

/// Stage 2 writing dgamma per `g` and dbeta per `b`.
pub fn sum_spec(g: Write, b: Write) -> Spec {
    spec(DType::F32, DType::F32, None, false, g, b)
}

/// The (dgamma, dbeta) modes of a kernel that writes one or both.
fn param_modes() -> impl Iterator<Item = (Write, Write)> {
    let modes = [Write::None, Write::Overwrite, Write::Add];
    modes
        .into_iter()
        .flat_map(move |g| modes.map(|b| (g, b)))
        .filter(|&(g, b)| g != Write::None || b != Write::None)
}

pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    let types: &[DType] = if f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    let mut v = Vec::new();
    for &t in types {
        v.push((&LAYERNORM_FORWARD, forward_spec(t)));
        for dx in [None, Some(false), Some(true)] {
            for params in [false, true] {
                if dx.is_some() || params {
                    v.push((&LAYERNORM_BACKWARD, backward_spec(t, dx, params)));
                }
            }
        }
    }
    for (g, b) in param_modes() {
        v.push((&LAYERNORM_BACKWARD_SUM, sum_spec(g, b)));
    }
    v
}
