//! Launcher of `wgsl/random.wgsl`: seeded uniform and normal draws.

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "random",
    source: include_str!("../../wgsl/random.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in random.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RandomParams {
    pub numel: u32,
    pub seed_lo: u32,
    pub seed_hi: u32,
    pub counter: u32,
    pub a: f32,
    pub b: f32,
    pub out_offset: u32,
    pub _pad: u32,
}

pub static RANDOM: KernelDesc = KernelDesc {
    name: "random",
    family: &FAMILY,
    storage: &[Access::ReadWrite],
    params_size: std::mem::size_of::<RandomParams>() as u64,
};

pub const WORKGROUP: u64 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    Uniform = 0,
    Normal = 1,
}

pub fn spec(dist: Distribution) -> Spec {
    Spec::new().u32("DIST", dist as u32)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    vec![
        (&RANDOM, spec(Distribution::Uniform)),
        (&RANDOM, spec(Distribution::Normal)),
    ]
}
