//! Launcher of `wgsl/adamw.wgsl`: the fused AdamW update over one flat parameter chunk.

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "adamw",
    source: include_str!("../../wgsl/adamw.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in adamw.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AdamWParams {
    pub numel: u32,
    pub n_decay: u32,
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub bc1: f32,
    pub bc2: f32,
    pub max_norm: f32,
    pub _pad: [u32; 2],
}

/// Bindings: param (rw), m (rw), v (rw), grad, norm_sq.
pub static ADAMW: KernelDesc = KernelDesc {
    name: "adamw",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::ReadWrite,
        Access::ReadWrite,
        Access::Read,
        Access::Read,
    ],
    params_size: std::mem::size_of::<AdamWParams>() as u64,
};

/// The mixed-precision update: bindings as ADAMW, then the loss-scale state and the f16 copy
/// of the chunk's decayed prefix (rw).
pub static ADAMW_AMP: KernelDesc = KernelDesc {
    name: "adamw_amp",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::ReadWrite,
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::ReadWrite,
    ],
    params_size: std::mem::size_of::<AdamWParams>() as u64,
};

pub const WORKGROUP: u64 = 256;
/// Elements a lane updates: one vec4 of each buffer (a chunk's numel and n_decay are multiples
/// of 4).
pub const ELEMENTS_PER_LANE: u64 = 4;

/// `amp`: the spec of ADAMW_AMP (an f16 copy), else of ADAMW.
pub fn spec(amp: bool) -> Spec {
    Spec::new().ty("TH", if amp { "f16" } else { "f32" })
}

pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = vec![(&ADAMW, spec(false))];
    if f16 {
        v.push((&ADAMW_AMP, spec(true)));
    }
    v
}
