//! Launcher of `wgsl/cross_entropy.wgsl`: per-row cross-entropy of logits (f32 or f16) against
//! u32 targets (forward, saving lse) and dlogits (backward), each one pass over the logits,
//! scalar or 4 columns a lane where the rows sit on 4-element boundaries.

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
    /// Row stride of the logits (unit column stride).
    pub x_rs: u32,
    /// Row stride of dlogits.
    pub out_rs: u32,
    pub _pad: [u32; 2],
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
const BACKWARD_STORAGE: &[Access] = &[
    Access::ReadWrite,
    Access::Read,
    Access::Read,
    Access::Read,
    Access::Read,
];

pub static CROSS_ENTROPY_BACKWARD: KernelDesc = KernelDesc {
    name: "cross_entropy_backward",
    family: &FAMILY,
    storage: BACKWARD_STORAGE,
    params_size: PARAMS,
};

/// The forward's bindings, 4 columns a lane (rows, offsets and strides multiples of 4).
pub static CROSS_ENTROPY_FORWARD_VEC4: KernelDesc = KernelDesc {
    name: "cross_entropy_forward_vec4",
    family: &FAMILY,
    storage: CROSS_ENTROPY_FORWARD.storage,
    params_size: PARAMS,
};

/// The backward's bindings, 4 columns a lane (rows, offsets and strides multiples of 4).
pub static CROSS_ENTROPY_BACKWARD_VEC4: KernelDesc = KernelDesc {
    name: "cross_entropy_backward_vec4",
    family: &FAMILY,
    storage: BACKWARD_STORAGE,
    params_size: PARAMS,
};

fn ty(f16: bool) -> &'static str {
    if f16 {
        "f16"
    } else {
        "f32"
    }
}

/// `acc`: the backward adds into dlogits (gradient accumulation) instead of overwriting;
/// `grad_f16`: dlogits is f16 (else f32); `logits_f16`: the logits are f16 (else f32).
pub fn spec(acc: bool, grad_f16: bool, logits_f16: bool) -> Spec {
    Spec::new()
        .bool("ACC", acc)
        .ty("OT", ty(grad_f16))
        .ty("XT", ty(logits_f16))
}

pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    let halves: &[bool] = if f16 { &[false, true] } else { &[false] };
    let mut v = Vec::new();
    for &logits_f16 in halves {
        for desc in [&CROSS_ENTROPY_FORWARD, &CROSS_ENTROPY_FORWARD_VEC4] {
            v.push((desc, spec(false, false, logits_f16)));
        }
        for desc in [&CROSS_ENTROPY_BACKWARD, &CROSS_ENTROPY_BACKWARD_VEC4] {
            for &grad_f16 in halves {
                for acc in [false, true] {
                    v.push((desc, spec(acc, grad_f16, logits_f16)));
                }
            }
        }
    }
    v
}
