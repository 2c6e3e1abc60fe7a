//! Launcher of `wgsl/scatter.wgsl`: scatter-add of rows (the backward of index_select).

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "scatter",
    source: include_str!("../../wgsl/scatter.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in scatter.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ScatterParams {
    pub n_rows: u32,
    pub cols: u32,
    pub dy_offset: u32,
    pub dy_row_stride: u32,
    pub out_offset: u32,
    pub out_row_stride: u32,
    pub starts_offset: u32,
    pub positions_offset: u32,
}

pub static INDEX_ADD_ROWS: KernelDesc = KernelDesc {
    name: "index_add_rows",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: std::mem::size_of::<ScatterParams>() as u64,
};

pub fn spec(acc: bool) -> Spec {
    Spec::new().bool("ACC", acc)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![
        (&INDEX_ADD_ROWS, spec(false)),
        (&INDEX_ADD_ROWS, spec(true)),
    ]
}
