//! Launcher of `wgsl/cross_entropy.wgsl`: per-row cross-entropy of logits against u32 targets
//! (forward, saving lse) and dlogits (backward), each one pass over the logits.

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "cross_entropy",
    source: include_str!("../../wgsl/cross_entropy.wgsl"),
    workgroup_reduce: true,
};

/// Mirrors `Params` in cross_entropy.wgsl. Offsets count elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct CrossEntropyParams {
    pub rows: u32,
    /// V, the number of classes.
    pub cols: u32,
    pub x_offset: u32,
    pub target_offset: u32,
    /// The target value whose rows count for nothing; `NO_IGNORE` when there is none.
    pub ignore_index: u32,
    pub out_offset: u32,
    pub g_offset: u32,
    /// 1 / the number of non-ignored rows.
    pub inv_n: f32,
}

/// `ignore_index` when nothing is ignored: every target the host let through is < V, and V
/// is at most u32::MAX, so no valid target equals it.
pub const NO_IGNORE: u32 = u32::MAX;

const PARAMS: u64 = std::mem::size_of::<CrossEntropyParams>() as u64;

/// loss (rows), lse (rows), logits (rows, V), targets (rows, u32).
pub static CROSS_ENTROPY_FORWARD: KernelDesc = KernelDesc {
    name: "cross_entropy_forward",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::ReadWrite,
        Access::Read,
        Access::Read,
    ],
    params_size: PARAMS,
};

/// dlogits (rows, V), lse (rows), logits (rows, V), targets (rows, u32), g ([]).
pub static CROSS_ENTROPY_BACKWARD: KernelDesc = KernelDesc {
    name: "cross_entropy_backward",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::Read,
    ],
    params_size: PARAMS,
};

/// `acc`: the backward adds into dlogits (gradient accumulation) instead of overwriting.
pub fn spec(acc: bool) -> Spec {
    Spec::new().bool("ACC", acc)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![
        (&CROSS_ENTROPY_FORWARD, spec(false)),
        (&CROSS_ENTROPY_BACKWARD, spec(false)),
        (&CROSS_ENTROPY_BACKWARD, spec(true)),
    ]
}
