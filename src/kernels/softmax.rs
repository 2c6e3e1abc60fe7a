//! Launcher of `wgsl/softmax.wgsl`: softmax and log-softmax over the last axis.

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "softmax",
    source: include_str!("../../wgsl/softmax.wgsl"),
    workgroup_reduce: true,
};

/// Mirrors `Params` in softmax.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct SoftmaxParams {
    pub rows: u32,
    pub cols: u32,
    pub in_offset: u32,
    pub _pad: u32,
}

pub static SOFTMAX_ROWS: KernelDesc = KernelDesc {
    name: "softmax_rows",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: std::mem::size_of::<SoftmaxParams>() as u64,
};

pub fn spec(log: bool) -> Spec {
    Spec::new().bool("LOG", log)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![(&SOFTMAX_ROWS, spec(false)), (&SOFTMAX_ROWS, spec(true))]
}
