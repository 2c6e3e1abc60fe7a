//! Launcher of `wgsl/gather.wgsl`: index_select along one axis (embedding lookup).

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "gather",
    source: include_str!("../../wgsl/gather.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in gather.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GatherParams {
    pub numel: u32,
    pub rank: u32,
    pub dim: u32,
    pub src_len: u32,
    pub in_offset: u32,
    pub idx_offset: u32,
    pub idx_stride: u32,
    /// The table row that x's first row is (x is a row shard of it; 0 for a whole table).
    pub row_lo: u32,
    pub shape: [u32; 8],
    pub strides: [u32; 8],
}

pub static INDEX_SELECT: KernelDesc = KernelDesc {
    name: "index_select",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: std::mem::size_of::<GatherParams>() as u64,
};

pub const WORKGROUP: u64 = 256;

/// `keep_others`: indices outside the shard's rows leave their output elements unwritten.
pub fn spec(keep_others: bool) -> Spec {
    Spec::new().bool("KEEP_OTHERS", keep_others)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![(&INDEX_SELECT, spec(false)), (&INDEX_SELECT, spec(true))]
}
