//! Launcher of `wgsl/count_nonfinite.wgsl`: how many elements of an f32 tensor are NaN or
//! infinite, added into one u32 slot of a counts buffer (a dispatch per tensor, one read-back
//! for all: `Parameters::check_finite`).

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};
use crate::error::Result;
use crate::graph::{Device, Tensor};

pub static FAMILY: Family = Family {
    name: "count_nonfinite",
    source: include_str!("../../wgsl/count_nonfinite.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in count_nonfinite.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct CountParams {
    /// The tensor's first element in its binding, and its elements.
    pub off: u32,
    pub n: u32,
    /// The counts element it adds to.
    pub slot: u32,
    pub _pad: u32,
}

/// Bindings: the counts (u32, atomically added), the tensor's buffer (f32 read as u32 bits).
pub static COUNT_NONFINITE: KernelDesc = KernelDesc {
    name: "count_nonfinite",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: std::mem::size_of::<CountParams>() as u64,
};

/// Lanes per workgroup (`WG`).
const WG: u64 = 256;
/// Workgroups a dispatch has at most (each lane then loops over the rest).
const MAX_GROUPS: u64 = 1024;

pub fn spec() -> Spec {
    Spec::new()
}

/// Records the count of `t`'s non-finite elements (a contiguous f32 tensor) added into
/// `counts[slot]` (a u32 tensor the caller zeroed).
pub(crate) fn record(dev: &Device, counts: &Tensor, slot: usize, t: &Tensor) -> Result<()> {
    let n = t.numel();
    if n == 0 {
        return Ok(());
    }
    let params = CountParams {
        off: t.layout().offset as u32,
        n: n as u32,
        slot: (counts.layout().offset + slot) as u32,
        _pad: 0,
    };
    let groups = (n as u64).div_ceil(WG).min(MAX_GROUPS);
    dev.record(
        &COUNT_NONFINITE,
        &spec(),
        &params,
        &[counts.storage(), t.storage()],
        dev.grid(groups),
    );
    Ok(())
}
