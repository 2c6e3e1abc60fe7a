//! Launcher of `wgsl/cast.wgsl`: element type conversion of a contiguous range.

use bytemuck::{Pod, Zeroable};

use super::DType;
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "cast",
    source: include_str!("../../wgsl/cast.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in cast.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct CastParams {
    pub numel: u32,
    pub a_off: u32,
    pub out_off: u32,
    pub _pad: u32,
}

/// (`cast` is a reserved word in WGSL: the entry point is `convert`.)
pub static CAST: KernelDesc = KernelDesc {
    name: "convert",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: std::mem::size_of::<CastParams>() as u64,
};

pub const WORKGROUP: u64 = 256;

pub fn spec(from: DType, to: DType) -> Spec {
    Spec::new().ty("TI", from.wgsl()).ty("TO", to.wgsl())
}

/// f32 <-> f16 (with shader-f16).
pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    if !f16 {
        return Vec::new();
    }
    vec![
        (&CAST, spec(DType::F32, DType::F16)),
        (&CAST, spec(DType::F16, DType::F32)),
    ]
}
