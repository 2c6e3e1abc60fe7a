//! Launcher of `wgsl/swiglu.wgsl`: SwiGLU, silu(gate) * up, from one matmul's output against
//! Hugging Face's gate_proj and up_proj weights concatenated (x = [gate | up] along the last
//! dim); forward (x f32 or f16, y f32 or f16) and backward (the (rows, 2F) gradient of x in one
//! dispatch).

use bytemuck::{Pod, Zeroable};

use super::{Access, DType, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "swiglu",
    source: include_str!("../../wgsl/swiglu.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in swiglu.wgsl. Offsets and strides count elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct SwigluParams {
    /// rows * F: one lane per output element.
    pub numel: u32,
    /// F, half of x's last dim.
    pub f: u32,
    pub x_offset: u32,
    /// Elements between x's rows (2F when row-major; x's last dim has unit stride).
    pub x_row_stride: u32,
    pub dy_offset: u32,
    /// Backward: where dx starts.
    pub out_offset: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

const PARAMS: u64 = std::mem::size_of::<SwigluParams>() as u64;

/// y (rows, F), x (rows, 2F; rows `x_row_stride` apart).
pub static SWIGLU_FORWARD: KernelDesc = KernelDesc {
    name: "swiglu_forward",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: PARAMS,
};

/// dx (rows, 2F), x (rows, 2F; rows `x_row_stride` apart), dy (rows, F).
pub static SWIGLU_BACKWARD: KernelDesc = KernelDesc {
    name: "swiglu_backward",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: PARAMS,
};

/// Lanes per workgroup (`WG` in the shader): one output element a lane.
pub const WORKGROUP: u64 = 256;

/// Every constant and alias the family reads (WGSL validates the whole module, so each
/// variant defines them all; a kernel reads its own).
fn spec(x: DType, y: DType, dy: DType, dx: DType, acc: bool) -> Spec {
    Spec::new()
        .ty("XT", x.wgsl())
        .ty("YT", y.wgsl())
        .ty("DY", dy.wgsl())
        .ty("DXT", dx.wgsl())
        .bool("ACC", acc)
}

/// The forward reading x as `x` and storing y as `y` (each f32 or f16).
pub fn forward_spec(x: DType, y: DType) -> Spec {
    spec(x, y, DType::F32, DType::F32, false)
}

/// The backward reading x as `x` and dy as `dy`, storing dx as `dx` (f16 only where it is
/// new: no accumulation in f16), adding it into its output where `acc`.
pub fn backward_spec(x: DType, dy: DType, dx: DType, acc: bool) -> Spec {
    debug_assert!(!(acc && dx == DType::F16), "no f16 accumulation");
    spec(x, DType::F32, dy, dx, acc)
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
            v.push((&SWIGLU_FORWARD, forward_spec(x, t)));
            for acc in [false, true] {
                v.push((&SWIGLU_BACKWARD, backward_spec(x, t, DType::F32, acc)));
            }
            if f16 {
                v.push((&SWIGLU_BACKWARD, backward_spec(x, t, DType::F16, false)));
            }
        }
    }
    v
}
