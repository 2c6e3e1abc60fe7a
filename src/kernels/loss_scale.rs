//! Launcher of `wgsl/loss_scale.wgsl`: the dynamic loss scale's update after a
//! mixed-precision step.

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "loss_scale",
    source: include_str!("../../wgsl/loss_scale.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in loss_scale.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LossScaleParams {
    pub growth_interval: u32,
    pub growth: f32,
    pub backoff: f32,
    pub max_scale: f32,
}

/// Bindings: state (rw), norm_sq.
pub static LOSS_SCALE_UPDATE: KernelDesc = KernelDesc {
    name: "loss_scale_update",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: std::mem::size_of::<LossScaleParams>() as u64,
};

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![(&LOSS_SCALE_UPDATE, Spec::new())]
}
