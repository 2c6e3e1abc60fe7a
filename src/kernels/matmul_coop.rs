//! Launcher of `wgsl/matmul_coop.wgsl`: the mixed-precision matmul on cooperative matrices
//! (tensor cores): square f16 fragments (16x16x16 on NVIDIA's Vulkan driver, 8x8x8 on Apple)
//! with f32 accumulators. Chosen at run time when the adapter lists such a shape in
//! `cooperative_matrix_properties()` (`Gpu::coop`); the tiled kernel's f16 variant computes the
//! same product elsewhere.

use super::matmul::{MatmulParams, Types, STEP_TYPES};
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "matmul_coop",
    source: include_str!("../../wgsl/matmul_coop.wgsl"),
    workgroup_reduce: false,
};

pub static MATMUL_COOP: KernelDesc = KernelDesc {
    name: "matmul_coop",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// C = A B + bias.
pub static MATMUL_COOP_BIAS: KernelDesc = KernelDesc {
    name: "matmul_coop_bias",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read, Access::Read],
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// C = gelu(A B + bias), saving the pre-activation.
pub static MATMUL_COOP_BIAS_GELU: KernelDesc = KernelDesc {
    name: "matmul_coop_bias_gelu",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite,
        Access::Read,
        Access::Read,
        Access::Read,
        Access::ReadWrite,
    ],
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// What the adapter offers: square f16 x f16 -> f32 fragments of `fs`, subgroups of `sgs`
/// lanes (one size: the workgroup is a whole number of subgroups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Coop {
    pub fs: u32,
    pub sgs: u32,
}

impl Coop {
    /// What `gpu` offers, if anything: square f16 x f16 -> f32 fragments (16 preferred, then
    /// 8) with subgroups of one size; None without the feature (or with it turned off through
    /// WGRAD_DISABLE_FEATURES=cooperative_matrix).
    pub fn available(gpu: &crate::device::Gpu) -> Option<Coop> {
        use wgpu::CooperativeScalarType as S;
        if !gpu.has(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            || !gpu.has(wgpu::Features::SUBGROUP)
            || gpu.info.subgroup_min_size != gpu.info.subgroup_max_size
        {
            return None;
        }
        [16, 8].into_iter().find_map(|fs| {
            gpu.cooperative_matrix
                .iter()
                .any(|p| {
                    (p.m_size, p.n_size, p.k_size) == (fs, fs, fs)
                        && p.ab_type == S::F16
                        && p.cr_type == S::F32
                })
                .then_some(Coop {
                    fs,
                    sgs: gpu.info.subgroup_max_size,
                })
        })
    }

    /// NVIDIA's Vulkan driver: 16x16x16 fragments, subgroups of 32.
    pub const NVIDIA: Coop = Coop { fs: 16, sgs: 32 };
    /// Apple's simdgroup matrices: 8x8x8, simdgroups of 32.
    pub const APPLE: Coop = Coop { fs: 8, sgs: 32 };
}

/// A workgroup of `sg_m x sg_n` subgroups, each owning `fm x fn_` fragment accumulators; K
/// staged `bk` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTile {
    pub sg_m: u32,
    pub sg_n: u32,
    pub fm: u32,
    pub fn_: u32,
    pub bk: u32,
}

impl CoopTile {
    pub const fn bm(&self, fs: u32) -> u32 {
        self.sg_m * self.fm * fs
    }

    pub const fn bn(&self, fs: u32) -> u32 {
        self.sg_n * self.fn_ * fs
    }

    /// Workgroup memory: the f16 A and B tiles (rows padded by 8) and an f32 scratch fragment
    /// per subgroup.
    pub const fn workgroup_bytes(&self, fs: u32) -> u32 {
        2 * self.bm(fs) * (self.bk + 8)
            + 2 * self.bk * (self.bn(fs) + 8)
            + 4 * fs * fs * self.sg_m * self.sg_n
    }

    /// As `WGRAD_COOP_TILE` takes it: `SG_MxSG_N/FMxFN`.
    pub fn name(&self) -> String {
        format!("{}x{}/{}x{}", self.sg_m, self.sg_n, self.fm, self.fn_)
    }

    /// The output tile and the subgroup layout, for tables.
    pub fn describe(&self, fs: u32) -> String {
        format!(
            "coop {}x{}x{} ({}, {fs}x{fs} fragments)",
            self.bm(fs),
            self.bn(fs),
            self.bk,
            self.name()
        )
    }
}

/// The tiles the engine chooses among, largest first.
pub const COOP_TILES: [CoopTile; 3] = [
    CoopTile {
        sg_m: 2,
        sg_n: 4,
        fm: 4,
        fn_: 2,
        bk: 32,
    },
    CoopTile {
        sg_m: 2,
        sg_n: 2,
        fm: 2,
        fn_: 2,
        bk: 32,
    },
    CoopTile {
        sg_m: 1,
        sg_n: 1,
        fm: 2,
        fn_: 2,
        bk: 32,
    },
];

/// The largest tile that still gives the GPU at least 128 workgroups (and fits
/// `max_workgroup_bytes`).
pub fn choose_tile(
    m: usize,
    n: usize,
    batch: usize,
    coop: Coop,
    max_workgroup_bytes: u32,
) -> CoopTile {
    if let Some(t) = forced_tile() {
        return t;
    }
    const MIN_GROUPS: usize = 128;
    let fits: Vec<CoopTile> = COOP_TILES
        .iter()
        .copied()
        .filter(|t| t.workgroup_bytes(coop.fs) <= max_workgroup_bytes)
        .collect();
    let groups = |t: &CoopTile| {
        m.div_ceil(t.bm(coop.fs) as usize) * n.div_ceil(t.bn(coop.fs) as usize) * batch
    };
    for t in &fits {
        if groups(t) >= MIN_GROUPS {
            return *t;
        }
    }
    *fits.last().unwrap_or(&COOP_TILES[COOP_TILES.len() - 1])
}

/// A tile forced by `WGRAD_COOP_TILE` (`SG_MxSG_N/FMxFN`, e.g. `2x4/4x2`), for measuring tiles
/// against each other.
fn forced_tile() -> Option<CoopTile> {
    static FORCED: std::sync::OnceLock<Option<CoopTile>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let s = std::env::var("WGRAD_COOP_TILE").ok()?;
        let (sg, fr) = s.split_once('/')?;
        let pair = |x: &str| -> Option<(u32, u32)> {
            let (a, b) = x.split_once('x')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        let ((sg_m, sg_n), (fm, fn_)) = (pair(sg)?, pair(fr)?);
        Some(CoopTile {
            sg_m,
            sg_n,
            fm,
            fn_,
            bk: 32,
        })
    })
}

pub fn spec(t: CoopTile, acc: bool, types: Types, coop: Coop) -> Spec {
    let (ma, mb, mc) = match coop.fs {
        8 => (
            "coop_mat8x8<f16, A>",
            "coop_mat8x8<f16, B>",
            "coop_mat8x8<f32, C>",
        ),
        _ => (
            "coop_mat16x16<f16, A>",
            "coop_mat16x16<f16, B>",
            "coop_mat16x16<f32, C>",
        ),
    };
    Types {
        half: true,
        ..types
    }
    .spec(
        Spec::new()
            .ty("MA", ma)
            .ty("MB", mb)
            .ty("MC", mc)
            .u32("FS", coop.fs)
            .u32("SGS", coop.sgs)
            .u32("SG_M", t.sg_m)
            .u32("SG_N", t.sg_n)
            .u32("FM", t.fm)
            .u32("FN", t.fn_)
            .u32("BK", t.bk)
            .bool("ACC", acc),
    )
}

/// Every variant for an adapter offering `coop`: each tile, accumulate or not, each of the
/// step's storage types, each epilogue.
pub fn variants(coop: Coop) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for ty in STEP_TYPES {
        for t in COOP_TILES {
            for acc in [false, true] {
                v.push((&MATMUL_COOP, spec(t, acc, ty, coop)));
                v.push((&MATMUL_COOP_BIAS, spec(t, acc, ty, coop)));
                v.push((&MATMUL_COOP_BIAS_GELU, spec(t, acc, ty, coop)));
            }
        }
    }
    v
}
