//! Launchers of `wgsl/peak.wgsl` and `wgsl/peak_coop.wgsl`: kernels that only compute, whose
//! rates are the arithmetic roofs `wgrad bench` measures kernels against (f32 FMA, and f16
//! cooperative-matrix multiply-adds where the adapter has them).

use bytemuck::{Pod, Zeroable};

use super::matmul_coop::Coop;
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "peak",
    source: include_str!("../../wgsl/peak.wgsl"),
    workgroup_reduce: false,
};

pub static COOP_FAMILY: Family = Family {
    name: "peak_coop",
    source: include_str!("../../wgsl/peak_coop.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in both files.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct PeakParams {
    pub iters: u32,
    pub _pad: [u32; 3],
}

pub static PEAK_FMA: KernelDesc = KernelDesc {
    name: "peak_fma",
    family: &FAMILY,
    storage: &[Access::ReadWrite],
    params_size: std::mem::size_of::<PeakParams>() as u64,
};

pub static PEAK_COOP: KernelDesc = KernelDesc {
    name: "peak_coop",
    family: &COOP_FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: std::mem::size_of::<PeakParams>() as u64,
};

/// `peak_coop` with its fragments loaded from workgroup memory every step.
pub static PEAK_COOP_SHARED: KernelDesc = KernelDesc {
    name: "peak_coop_shared",
    family: &COOP_FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: std::mem::size_of::<PeakParams>() as u64,
};

/// FLOP per lane and step of `peak_fma`.
pub const FMA_FLOP_PER_STEP: u64 = 16;
/// Lanes per workgroup of `peak_fma`.
pub const FMA_LANES: u32 = 256;
/// Subgroups per workgroup of `peak_coop`.
pub const COOP_SUBGROUPS: u32 = 4;

pub fn coop_spec(coop: Coop) -> Spec {
    coop.with_fragments(Spec::new())
        .u32("FS", coop.fs)
        .u32("SGS", coop.sgs)
        .u32("SG", COOP_SUBGROUPS)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![(&PEAK_FMA, Spec::new())]
}

/// The cooperative-matrix roofs on `coop`.
pub fn coop_variants(coop: Coop) -> Vec<(&'static KernelDesc, Spec)> {
    vec![
        (&PEAK_COOP, coop_spec(coop)),
        (&PEAK_COOP_SHARED, coop_spec(coop)),
    ]
}
