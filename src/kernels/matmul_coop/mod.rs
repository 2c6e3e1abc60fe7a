//! Launcher of `wgsl/matmul_coop.wgsl`: the mixed-precision matmul on cooperative matrices
//! (tensor cores): square f16 fragments (16x16x16 on NVIDIA's Vulkan driver, 8x8x8 on Apple)
//! with f32 accumulators. Chosen at run time when the adapter lists such a shape in
//! `cooperative_matrix_properties()` (`Gpu::coop`); the tiled kernel's f16 variant computes the
//! same product elsewhere.
//!
//! The kernel reads each operand in units of 8 elements along one dim; `OperandAccess` says
//! which dim and whether a unit is one aligned 16-byte load (the fast path, checked here against
//! the operand's strides and its buffer) or a gather of 8 elements.
//!
//! Here: the kernel descriptors, what the adapter offers (`Coop`), the tiles and their choice,
//! and a product's specialization (`spec`). The WGSL generated per tile shape is `codegen`'s;
//! every variant a step may run, for the tests that compile them all, is `variants`'.

mod codegen;
mod variants;

pub use variants::variants;

use super::matmul::{MatmulParams, OperandLayout, Types, C_A_B_BIAS_OUT, SPLIT_STORAGE};
use super::{Access, DType, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "matmul_coop",
    source: concat!(
        include_str!("../../../wgsl/matmul_coop.wgsl"),
        include_str!("../../../wgsl/matmul_split_tail.wgsl"),
        include_str!("../../../wgsl/matmul_coop_split.wgsl")
    ),
    workgroup_reduce: false,
};

/// The X3 entry points' source: without the split in one dispatch, whose partials' binding
/// their operands' scales take.
static X3_FAMILY: Family = Family {
    name: "matmul_coop_x3",
    source: include_str!("../../../wgsl/matmul_coop.wgsl"),
    workgroup_reduce: false,
};

/// Tiles of vec4<f16> (Vulkan: cooperative loads take vector pointers).
const TILE_WORDS: &str = include_str!("../../../wgsl/matmul_coop_tile_words.wgsl");
/// Tiles of f16 (Metal's simdgroup loads want the matrix's element type).
const TILE_F16: &str = include_str!("../../../wgsl/matmul_coop_tile_f16.wgsl");
/// C bound as its elements.
const C_ELEMS: &str = include_str!("../../../wgsl/matmul_coop_c_elems.wgsl");
/// C bound as vectors of 4 (C_VEC).
const C_VEC4: &str = include_str!("../../../wgsl/matmul_coop_c_vec4.wgsl");
/// `pre` bound as f32 elements.
const PRE_ELEMS: &str = include_str!("../../../wgsl/matmul_coop_pre_elems.wgsl");
/// `pre` bound as vectors of 4 f32 (`pre_vectors`).
const PRE_VEC4: &str = include_str!("../../../wgsl/matmul_coop_pre_vec4.wgsl");

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

/// C = A B with A_ONES (A's last row taken as ones): C's last row, the column sums of B, to the
/// fifth binding at `bias_off` (the fourth is not read).
pub static MATMUL_COOP_SUMS: KernelDesc = KernelDesc {
    name: "matmul_coop_sums",
    family: &FAMILY,
    storage: C_A_B_BIAS_OUT,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// C = A B + bias + R (the fifth binding, only read; see `matmul::MATMUL_BIAS_RES`).
pub static MATMUL_COOP_BIAS_RES: KernelDesc = KernelDesc {
    name: "matmul_coop_bias_res",
    family: &FAMILY,
    storage: C_A_B_BIAS_OUT,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// C = gelu(A B + bias), saving the pre-activation.
pub static MATMUL_COOP_BIAS_GELU: KernelDesc = KernelDesc {
    name: "matmul_coop_bias_gelu",
    family: &FAMILY,
    storage: C_A_B_BIAS_OUT,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// A range of K of a split product, its tile's last range summing the ranges' partials in the
/// same dispatch (`matmul::MATMUL_SPLIT`'s bindings and epilogues). Not X3: its `scales` take
/// the partials' binding.
pub static MATMUL_COOP_SPLIT: KernelDesc = KernelDesc {
    name: "matmul_coop_split",
    family: &FAMILY,
    storage: SPLIT_STORAGE,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// The storage bindings of the X3 entry points (f32 operands as three f16 products): those of
/// `C_A_B_BIAS_OUT`, then the operands' partial maxima (`absmax`), read.
const X3_STORAGE: &[Access] = &[
    Access::ReadWrite,
    Access::Read,
    Access::Read,
    Access::Read,
    Access::ReadWrite,
    Access::Read,
];

const fn x3_desc(name: &'static str) -> KernelDesc {
    KernelDesc {
        name,
        family: &X3_FAMILY,
        storage: X3_STORAGE,
        params_size: std::mem::size_of::<MatmulParams>() as u64,
    }
}

/// The five entry points over f32 operands as high and low f16 parts (X3 in the WGSL), in the
/// order of the launcher's kernel lists: plain, bias, bias + GELU, column sums, bias +
/// residual. Bindings 4 and 5 are bound (to buffers the dispatch binds anyway) where the entry
/// point does not read them.
pub static MATMUL_COOP_X3: KernelDesc = x3_desc("matmul_coop");
pub static MATMUL_COOP_X3_BIAS: KernelDesc = x3_desc("matmul_coop_bias");
pub static MATMUL_COOP_X3_BIAS_GELU: KernelDesc = x3_desc("matmul_coop_bias_gelu");
pub static MATMUL_COOP_X3_SUMS: KernelDesc = x3_desc("matmul_coop_sums");
pub static MATMUL_COOP_X3_BIAS_RES: KernelDesc = x3_desc("matmul_coop_bias_res");

/// What the adapter offers: square f16 x f16 -> f32 fragments of `fs`, subgroups of `sgs`
/// lanes (one size: the workgroup is a whole number of subgroups), and whether cooperative
/// loads may read tiles of 16-byte words (`words`: Vulkan) or only of f16 (Metal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Coop {
    pub fs: u32,
    pub sgs: u32,
    pub words: bool,
}

impl Coop {
    /// What `gpu` offers, if anything: square f16 x f16 -> f32 fragments (16 preferred, then
    /// 8) with subgroups of one size and subgroup barriers (attention's subgroups sync on their
    /// own rows); None without them (or with them turned off through
    /// WGRAD_DISABLE_FEATURES=cooperative_matrix or subgroup_barrier). Workgroup tiles of
    /// 16-byte words on Vulkan (cooperative loads take vector pointers there; scalar f16 tiles
    /// measured slower, docs/decisions.md), of f16 elsewhere.
    pub fn available(gpu: &crate::device::Gpu) -> Option<Coop> {
        use wgpu::CooperativeScalarType as S;
        if !gpu.has(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            || !gpu.has(wgpu::Features::SUBGROUP)
            || !gpu.has(wgpu::Features::SUBGROUP_BARRIER)
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
                    words: gpu.info.backend == wgpu::Backend::Vulkan,
                })
        })
    }

    /// `spec` with the aliases every cooperative-matrix kernel takes for the WGSL types of its
    /// f16 A and B fragments and f32 accumulators: MA, MB, MC.
    pub fn with_fragments(&self, spec: Spec) -> Spec {
        let [ma, mb, mc] = match self.fs {
            8 => [
                "coop_mat8x8<f16, A>",
                "coop_mat8x8<f16, B>",
                "coop_mat8x8<f32, C>",
            ],
            _ => [
                "coop_mat16x16<f16, A>",
                "coop_mat16x16<f16, B>",
                "coop_mat16x16<f32, C>",
            ],
        };
        spec.ty("MA", ma).ty("MB", mb).ty("MC", mc)
    }

    /// Whether the scratch epilogue can store 4 consecutive columns a lane (`CStore::Vec4`):
    /// a fragment's rows split into whole vectors of 4, and its FS x FS elements into whole
    /// passes of the subgroup's lanes.
    pub fn stores_vectors(&self) -> bool {
        self.fs.is_multiple_of(4) && (self.fs * self.fs).is_multiple_of(4 * self.sgs)
    }

    /// NVIDIA's Vulkan driver: 16x16x16 fragments, subgroups of 32.
    pub const NVIDIA: Coop = Coop {
        fs: 16,
        sgs: 32,
        words: true,
    };
    /// Apple's simdgroup matrices: 8x8x8, simdgroups of 32.
    pub const APPLE: Coop = Coop {
        fs: 8,
        sgs: 32,
        words: false,
    };
}

/// A workgroup of `sg_m x sg_n` subgroups, each owning `fm x fn_` fragment accumulators; K
/// staged `bk` at a time in `stages` (1 or 2) sets of tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoopTile {
    pub sg_m: u32,
    pub sg_n: u32,
    pub fm: u32,
    pub fn_: u32,
    pub bk: u32,
    pub stages: u32,
}

impl CoopTile {
    pub const fn bm(&self, fs: u32) -> u32 {
        self.sg_m * self.fm * fs
    }

    pub const fn bn(&self, fs: u32) -> u32 {
        self.sg_n * self.fn_ * fs
    }

    pub const fn lanes(&self, sgs: u32) -> u32 {
        self.sg_m * self.sg_n * sgs
    }

    /// Workgroup memory at most (the larger of the two layouts of each tile, rows padded by 8
    /// halves; with `x3` each tile twice, high and low parts) plus an f32 scratch fragment per
    /// subgroup.
    pub fn workgroup_bytes(&self, fs: u32, x3: bool) -> u32 {
        let (bm, bn, bk) = (self.bm(fs), self.bn(fs), self.bk);
        let a = (bm * (bk + 8)).max(bk * (bm + 8));
        let b = (bk * (bn + 8)).max(bn * (bk + 8));
        let parts = 1 + x3 as u32;
        2 * parts * self.stages * (a + b) + 4 * fs * fs * self.sg_m * self.sg_n
    }

    /// Whether the kernel can run this tile on `coop`: every lane fetches whole units (8
    /// elements) of both tiles, K steps are whole fragments, and it fits the workgroup memory
    /// (with `x3`, its tiles twice).
    pub fn valid(&self, coop: Coop, max_workgroup_bytes: u32, x3: bool) -> bool {
        let units_a = self.bm(coop.fs) * self.bk / 8;
        let units_b = self.bk * self.bn(coop.fs) / 8;
        let lanes = self.lanes(coop.sgs);
        self.bk.is_multiple_of(coop.fs)
            && (1..=2).contains(&self.stages)
            && units_a.is_multiple_of(lanes)
            && units_b.is_multiple_of(lanes)
            && self.workgroup_bytes(coop.fs, x3) <= max_workgroup_bytes
    }

    /// As `WGRAD_COOP_TILE` takes it: `SG_MxSG_N/FMxFN/BK`, then `/2` for two stages.
    pub fn name(&self) -> String {
        let stages = if self.stages > 1 {
            format!("/{}", self.stages)
        } else {
            String::new()
        };
        format!(
            "{}x{}/{}x{}/{}{stages}",
            self.sg_m, self.sg_n, self.fm, self.fn_, self.bk
        )
    }

    /// Parses `name`'s form (`2x4/4x2/32`, `2x4/4x2/32/2`; BK defaults to 32, stages to 1).
    pub fn parse(s: &str) -> Option<CoopTile> {
        let mut parts = s.split('/');
        let pair = |x: &str| -> Option<(u32, u32)> {
            let (a, b) = x.split_once('x')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        let (sg_m, sg_n) = pair(parts.next()?)?;
        let (fm, fn_) = pair(parts.next()?)?;
        let bk = match parts.next() {
            Some(k) => k.parse().ok()?,
            None => 32,
        };
        let stages = match parts.next() {
            Some(n) => n.parse().ok()?,
            None => 1,
        };
        parts.next().is_none().then_some(CoopTile {
            sg_m,
            sg_n,
            fm,
            fn_,
            bk,
            stages,
        })
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

const fn tile(sg_m: u32, sg_n: u32, fm: u32, fn_: u32, bk: u32, stages: u32) -> CoopTile {
    CoopTile {
        sg_m,
        sg_n,
        fm,
        fn_,
        bk,
        stages,
    }
}

/// The tiles the engine chooses among without a tuned table, largest first.
pub const COOP_TILES: [CoopTile; 3] = [
    tile(2, 2, 4, 4, 32, 1),
    tile(2, 2, 2, 2, 32, 1),
    tile(1, 1, 2, 2, 32, 1),
];

/// The tiles a search measures (`wgrad bench matmul --search`): the defaults, wider and
/// deeper ones, other splits of the same outputs over subgroups, tiles 96 wide (3 fragments a
/// subgroup: N = 768 in 8 columns of tiles, so a 4096-row product on 128x96 tiles is 256
/// workgroups, one wave of two a core on an H100, where 128x128 gives 192; the DistilGPT-2
/// 8 x 512 --amp step 19.03-19.11 -> 18.48-18.70 ms with its 4096 x 768 products on them, H100,
/// 2026-11-26), and
/// two-stage tiles (those that fit the adapter's workgroup memory).
pub const SEARCH_TILES: [CoopTile; 22] = [
    tile(2, 2, 4, 4, 32, 1),
    tile(2, 2, 4, 4, 64, 1),
    tile(2, 2, 2, 4, 32, 1),
    tile(2, 2, 4, 2, 64, 1),
    tile(1, 2, 4, 4, 32, 1),
    tile(2, 4, 4, 2, 32, 1),
    tile(2, 4, 4, 2, 64, 1),
    tile(4, 2, 2, 4, 32, 1),
    tile(2, 4, 4, 4, 32, 1),
    tile(4, 2, 4, 4, 32, 1),
    tile(2, 2, 4, 2, 32, 1),
    tile(2, 2, 2, 2, 32, 1),
    tile(2, 2, 2, 2, 64, 1),
    tile(1, 1, 2, 2, 32, 1),
    tile(2, 2, 4, 3, 32, 1),
    tile(2, 2, 2, 3, 32, 1),
    tile(2, 4, 4, 2, 32, 2),
    tile(4, 2, 2, 4, 32, 2),
    tile(2, 2, 4, 4, 32, 2),
    tile(2, 2, 4, 2, 32, 2),
    tile(2, 2, 2, 2, 32, 2),
    tile(2, 2, 2, 2, 64, 2),
];

/// The default tiles of X3 products (f32 operands as high and low f16 parts), largest first:
/// a unit in flight holds 8 f32 elements, twice an f16 unit's registers, and each fragment
/// pair is loaded twice, so a subgroup owns 8 accumulators, not 16 (at 4096³ on an H100,
/// 2026-11-26: 4x2/2x4/32 87.7 TFLOP/s counting the f32 product's flops, 2x4/4x2/32 86.9,
/// 2x2/4x4/32 73.8, 2x2/2x4/32 62.7).
pub const X3_TILES: [CoopTile; 4] = [
    tile(4, 2, 2, 4, 32, 1),
    tile(2, 2, 2, 4, 32, 1),
    tile(2, 2, 2, 2, 32, 1),
    tile(1, 1, 2, 2, 32, 1),
];

/// The largest default tile (`X3_TILES` for `x3`, else `COOP_TILES`) that still gives the GPU
/// at least 128 workgroups (and fits `max_workgroup_bytes`).
pub fn choose_tile(
    m: usize,
    n: usize,
    batch: usize,
    coop: Coop,
    max_workgroup_bytes: u32,
    x3: bool,
) -> CoopTile {
    const MIN_GROUPS: usize = 128;
    let defaults: &[CoopTile] = if x3 { &X3_TILES } else { &COOP_TILES };
    let fits: Vec<CoopTile> = defaults
        .iter()
        .copied()
        .filter(|t| t.valid(coop, max_workgroup_bytes, x3))
        .collect();
    let groups = |t: &CoopTile| {
        m.div_ceil(t.bm(coop.fs) as usize) * n.div_ceil(t.bn(coop.fs) as usize) * batch
    };
    for t in &fits {
        if groups(t) >= MIN_GROUPS {
            return *t;
        }
    }
    *fits.last().unwrap_or(&defaults[defaults.len() - 1])
}

/// How the kernel reads one operand, seen as a (rows, cols) matrix per batch (A: (M, K); B:
/// (K, N)): units of 8 along cols (`along_cols`, the first choice) or along rows, and whether a
/// unit is one aligned load (`vec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OperandAccess {
    pub along_cols: bool,
    pub vec: bool,
    /// f16 units that start on 16 bytes: one 16-byte load each (the operand bound as 4 u32
    /// words of two halves, `operand_vec`), instead of two 8-byte ones.
    pub wide: bool,
}

impl OperandLayout {
    /// Units run along the unit-stride dim (cols unless only rows are unit-stride); a unit is
    /// two vector loads when that dim is unit-stride, every unit starts on a vector of 4
    /// (offset, row and batch strides multiples of 4), and the last unit, rounded up to 8
    /// elements, still lies inside the binding.
    pub fn access(&self) -> OperandAccess {
        let vec = self.reads_vectors(4, 8);
        let wide = vec && self.dtype == DType::F16 && self.reads_vectors(8, 8);
        OperandAccess {
            along_cols: self.along_cols(),
            vec,
            wide,
        }
    }
}

/// How a product's kernel writes C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CStore {
    /// Through the scratch tile, an element a lane.
    Elems,
    /// Through the scratch tile, 4 consecutive columns a lane, stored as one vector (C_VEC, C
    /// bound as vectors of 4): C's columns unit-stride, its offset and row and batch strides
    /// multiples of 4, its last element's vector inside the binding (the launcher checks).
    /// Adapters whose fragments are too small for it (FS x FS under 4 elements a lane) store
    /// elements.
    Vec4,
}

/// One cooperative-matrix product's kernel variant: everything its specialization depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub tile: CoopTile,
    /// Adds into C instead of overwriting it.
    pub acc: bool,
    pub types: Types,
    pub coop: Coop,
    /// How A and B are read.
    pub a: OperandAccess,
    pub b: OperandAccess,
    pub c: CStore,
    /// A's last row taken as ones (A_ONES: the column sums of B in C's last row).
    pub ones: bool,
    /// f32 operands multiplied as their high and low f16 parts (X3: the `MATMUL_COOP_X3*`
    /// entry points, f32 A and B).
    pub x3: bool,
    /// Parts of the kernel left out to time the rest (`lab` builds only).
    pub ablation: Ablation,
}

impl Variant {
    /// A plain variant (no ones row, not X3, nothing left out) of the given product.
    pub fn new(
        tile: CoopTile,
        acc: bool,
        types: Types,
        coop: Coop,
        (a, b): (OperandAccess, OperandAccess),
        c: CStore,
    ) -> Variant {
        Variant {
            tile,
            acc,
            types,
            coop,
            a,
            b,
            c,
            ones: false,
            x3: false,
            ablation: Ablation::NONE,
        }
    }

    /// The specialization.
    pub fn spec(&self) -> Spec {
        let (t, coop, types, (a, b)) = (self.tile, self.coop, self.types, (self.a, self.b));
        let c_vec = self.c == CStore::Vec4 && coop.stores_vectors();
        coop.with_fragments(Spec::new())
            .ty("TC", types.c.wgsl())
            .ty(
                "CB",
                if c_vec {
                    codegen::vec4_of(types.c)
                } else {
                    types.c.wgsl()
                },
            )
            .ty("AV", codegen::operand_vec(types.a, a.wide))
            .ty("AV_B", codegen::operand_vec(types.b, b.wide))
            .source(
                "READ",
                codegen::read_source((types.a, a.wide), (types.b, b.wide), self.x3),
            )
            .u32("FS", coop.fs)
            .u32("SGS", coop.sgs)
            .u32("SG_M", t.sg_m)
            .u32("SG_N", t.sg_n)
            .u32("FM", t.fm)
            .u32("FN", t.fn_)
            .u32("BK", t.bk)
            .u32("STAGES", t.stages)
            .u32("PARTS", 1 + self.x3 as u32)
            .bool("A_UK", a.along_cols)
            .bool("B_UN", b.along_cols)
            .bool("A_VEC", a.vec)
            .bool("B_VEC", b.vec)
            .bool("A_WIDE", a.wide)
            .bool("B_WIDE", b.wide)
            .bool("C_VEC", c_vec)
            .bool("ACC", self.acc)
            .bool("A_ONES", self.ones)
            .bool("B_ONES", false)
            .u32("SPLIT_EPI", 0)
            // Tiles of 16-byte words spread their rows over the bank groups (4096³ f16 on an
            // H100, 2026-11-26: 194.2 -> 198.6 TFLOP/s); the scalar f16 tiles were not
            // measured so.
            .bool("SPREAD", coop.words)
            .u32("EPI_FRAGS", codegen::epi_frags(t, self.ablation))
            .source("TILE", if coop.words { TILE_WORDS } else { TILE_F16 })
            .source("C", if c_vec { C_VEC4 } else { C_ELEMS })
            .ty("PB", "f32")
            .ty("PE", "f32")
            .source("PRE", PRE_ELEMS)
            .source(
                "UNROLLED",
                codegen::generated(t, coop, self.x3, self.ablation),
            )
    }
}

/// Parts of the cooperative-matrix matmul a measurement leaves out to time the rest
/// (`WGRAD_COOP_ABLATE`, `WGRAD_COOP_PAD_SMEM`; the products come out wrong). Only a `lab`
/// build has any: in a default build this is empty and leaves nothing out.
#[cfg(not(feature = "lab"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ablation;

#[cfg(not(feature = "lab"))]
impl Ablation {
    /// Nothing left out.
    pub const NONE: Ablation = Ablation;

    #[inline(always)]
    pub fn leaves_out(&self, _part: &str) -> bool {
        false
    }

    #[inline(always)]
    pub fn pad_bytes(&self) -> u32 {
        0
    }
}

/// See the default build's `Ablation`. Parts, comma-separated in `WGRAD_COOP_ABLATE`:
/// `noglobal` (units made up instead of loaded), `nostore` (no tile stores), `nomultiply` (no
/// fragment loads or multiply-adds), `nobarrier` (no workgroup barriers), `noprefetch` (X3's
/// units loaded and stored before its multiply, as the f16 products do: right products),
/// `noepilogue` (the accumulators' sum stored as one fragment) and `x3inside` (an X3 product's
/// three products summed inside the tensor cores' accumulator: faster, 4-5x the error).
/// `pad_bytes` more workgroup memory is declared (and touched), to see how many workgroups
/// share a core.
#[cfg(feature = "lab")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ablation {
    parts: u8,
    pub pad_bytes: u32,
}

#[cfg(feature = "lab")]
impl Ablation {
    /// Nothing left out.
    pub const NONE: Ablation = Ablation {
        parts: 0,
        pad_bytes: 0,
    };

    pub const PARTS: [&'static str; 7] = [
        "noglobal",
        "nostore",
        "nomultiply",
        "nobarrier",
        "noprefetch",
        "noepilogue",
        "x3inside",
    ];

    /// The parts a comma list names; the first it does not know, as the error.
    pub fn parse(list: &str) -> Result<Ablation, String> {
        let mut a = Ablation::NONE;
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let i = Self::PARTS
                .iter()
                .position(|p| *p == part)
                .ok_or_else(|| part.to_string())?;
            a.parts |= 1 << i;
        }
        Ok(a)
    }

    pub fn leaves_out(&self, part: &str) -> bool {
        Self::PARTS
            .iter()
            .position(|p| *p == part)
            .is_some_and(|i| self.parts & (1 << i) != 0)
    }

    pub fn pad_bytes(&self) -> u32 {
        self.pad_bytes
    }
}

/// `spec` with `pre` (the GELU product's pre-activation, or the residual a bias product adds)
/// bound as vectors of 4 f32, read and written 4 at once by the vector epilogue
/// (`CStore::Vec4`): for the launcher to choose where every row the epilogue touches starts on
/// a vector (N and the offset multiples of 4) inside the binding.
pub fn pre_vectors(spec: Spec) -> Spec {
    pre_binding(spec, true, false)
}

/// `spec` with `pre` bound as vectors of 4 (`vectors`, as `pre_vectors`) or elements, of f16
/// (`f16`: GELU's pre-activation under autocast, stored for its gradient) or f32. (Stored as
/// u32 words of halves instead of vec4<f16>, C and `pre` ran the 8 x 512 --amp step alike on
/// an H100, 15.33-15.43 ms against 15.22-15.41, 2026-11-27: not kept, docs/decisions.md.)
pub fn pre_binding(spec: Spec, vectors: bool, f16: bool) -> Spec {
    let (pb, pe) = match (vectors, f16) {
        (true, true) => ("vec4<f16>", "f16"),
        (true, false) => ("vec4<f32>", "f32"),
        (false, true) => ("f16", "f16"),
        (false, false) => ("f32", "f32"),
    };
    let source = if vectors { PRE_VEC4 } else { PRE_ELEMS };
    spec.with_ty("PB", pb)
        .with_ty("PE", pe)
        .with_source("PRE", source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(
        dtype: DType,
        offset: usize,
        rows: usize,
        rs: usize,
        cols: usize,
        cs: usize,
    ) -> OperandLayout {
        OperandLayout {
            dtype,
            offset,
            batch_stride: 0,
            batch: 1,
            rows,
            row_stride: rs,
            cols,
            col_stride: cs,
            bound_elements: offset + (rows - 1) * rs.max(1) + (cols - 1) * cs.max(1) + 1,
        }
    }

    #[test]
    fn operand_access_follows_strides_alignment_and_the_binding() {
        let acc = |along_cols, vec| OperandAccess {
            along_cols,
            vec,
            wide: false,
        };
        let wide = |along_cols| OperandAccess {
            along_cols,
            vec: true,
            wide: true,
        };
        // Row-major, rows of 64: vector units along the columns, if the last unit fits.
        let mut l = layout(DType::F16, 0, 10, 64, 64, 1);
        assert_eq!(l.access(), wide(true));
        // f16 rows of 68: units on 8 bytes, not 16.
        l = layout(DType::F16, 0, 10, 68, 64, 1);
        assert_eq!(l.access(), acc(true, true));
        // Rows of 44: the last unit of the last row (rounded up to 8) would pass the binding.
        l = layout(DType::F32, 0, 10, 44, 44, 1);
        assert_eq!(l.access(), acc(true, false));
        l.bound_elements += 4;
        assert_eq!(l.access(), acc(true, true));
        // A transposed view: units along the rows.
        assert_eq!(layout(DType::F16, 0, 64, 1, 32, 64).access(), wide(false));
        // Unaligned offset or row stride: gathered.
        assert_eq!(
            layout(DType::F16, 1, 10, 64, 63, 1).access(),
            acc(true, false)
        );
        assert_eq!(
            layout(DType::F16, 0, 10, 66, 64, 1).access(),
            acc(true, false)
        );
        // Neither dim unit-stride: gathered along the columns.
        assert_eq!(
            layout(DType::F32, 0, 8, 32, 8, 2).access(),
            acc(true, false)
        );
    }

    #[test]
    fn search_and_default_tiles_are_valid_on_nvidia() {
        for t in COOP_TILES.iter().chain(&SEARCH_TILES) {
            assert!(t.valid(Coop::NVIDIA, 49152, false), "{}", t.name());
            assert_eq!(CoopTile::parse(&t.name()), Some(*t));
        }
        assert_eq!(CoopTile::parse("2x2/4x4"), Some(COOP_TILES[0]));
    }
}
