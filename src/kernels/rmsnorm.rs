//! Launcher of `wgsl/rmsnorm.wgsl`: RMSNorm over the last dim (Llama's, Qwen's), forward
//! (saving rstd; x f32 or f16, y f32 or f16) and backward: dx with each chunk of rows' partial
//! dweight. The partials are summed by LayerNorm's stage 2 (`layernorm::LAYERNORM_BACKWARD_SUM`
//! with dbeta not wanted), so this family has no sum kernel of its own.

use bytemuck::{Pod, Zeroable};

use super::{Access, DType, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "rmsnorm",
    source: include_str!("../../wgsl/rmsnorm.wgsl"),
    workgroup_reduce: true,
};

/// Mirrors `Params` in rmsnorm.wgsl. Offsets and strides count elements.
///
/// x's rows may be a view: row r = ((i0 * n1) + i1) * n2 + i2 starts at
/// `x_offset + i0 * s0 + i1 * s1 + i2 * s2` (the leading dims of x merged into at most three;
/// the last dim has unit stride). A row-major x is n1 = n2 = 1, s0 = C.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RmsNormParams {
    pub rows: u32,
    /// C, the normalized (last) dim.
    pub cols: u32,
    pub eps: f32,
    pub x_offset: u32,
    pub weight_offset: u32,
    pub dy_offset: u32,
    /// Backward: where dx starts.
    pub out_offset: u32,
    /// Backward: row chunks of the (n_chunks, C) partial dweight, and rows per chunk.
    pub n_chunks: u32,
    pub chunk_rows: u32,
    /// x's rows: the sizes of the inner two merged leading dims, and the three dims' strides.
    pub n1: u32,
    pub n2: u32,
    pub s0: u32,
    pub s1: u32,
    pub s2: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

const PARAMS: u64 = std::mem::size_of::<RmsNormParams>() as u64;

/// y (rows, C), x (rows, C; a view, see `RmsNormParams`), rstd (rows), weight (C).
pub static RMSNORM_FORWARD: KernelDesc = KernelDesc {
    name: "rmsnorm_forward",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::ReadWrite,
        Access::Read,
    ],
    params_size: PARAMS,
};

/// dx (rows, C), x (rows, C; a view), dy (rows, C), rstd (rows), weight (C),
/// partial (n_chunks, C).
pub static RMSNORM_BACKWARD: KernelDesc = KernelDesc {
    name: "rmsnorm_backward",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::ReadWrite,
    ],
    params_size: PARAMS,
};

/// Every constant and alias the family reads (WGSL validates the whole module, so each
/// variant defines them all; a kernel reads its own).
fn spec(x: DType, y: DType, dy: DType, dx: Option<bool>, params: bool) -> Spec {
    Spec::new()
        .ty("XT", x.wgsl())
        .ty("YT", y.wgsl())
        .ty("DY", dy.wgsl())
        .bool("ACC", dx == Some(true))
        .bool("DX", dx.is_some())
        .bool("PARAMS", params)
}

/// The forward reading x as `x` and storing y as `y` (each f32 or f16).
pub fn forward_spec(x: DType, y: DType) -> Spec {
    spec(x, y, DType::F32, None, false)
}

/// The backward reading x as `x` and dy as `dy`; `dx`: whether dx is written, and added into
/// (Some(true)) or overwritten; `params`: whether the chunks' partial dweight is written.
pub fn backward_spec(x: DType, dy: DType, dx: Option<bool>, params: bool) -> Spec {
    spec(x, DType::F32, dy, dx, params)
}

pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    let types: &[DType] = if f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    let mut v = Vec::new();
    for &x in types {
        for &t in types {
            v.push((&RMSNORM_FORWARD, forward_spec(x, t)));
            for dx in [None, Some(false), Some(true)] {
                for params in [false, true] {
                    if dx.is_some() || params {
                        v.push((&RMSNORM_BACKWARD, backward_spec(x, t, dx, params)));
                    }
                }
            }
        }
    }
    v
}
