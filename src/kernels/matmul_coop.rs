//! Launcher of `wgsl/matmul_coop.wgsl`: the mixed-precision matmul on cooperative matrices
//! (tensor cores): square f16 fragments (16x16x16 on NVIDIA's Vulkan driver, 8x8x8 on Apple)
//! with f32 accumulators. Chosen at run time when the adapter lists such a shape in
//! `cooperative_matrix_properties()` (`Gpu::coop`); the tiled kernel's f16 variant computes the
//! same product elsewhere.
//!
//! The kernel reads each operand in units of 8 elements along one dim; `OperandAccess` says
//! which dim and whether a unit is one aligned 16-byte load (the fast path, checked here against
//! the operand's strides and its buffer) or a gather of 8 elements.

use super::matmul::{
    MatmulParams, OperandLayout, SplitEpilogue, Types, C_A_B_BIAS_OUT, SPLIT_STORAGE, STEP_TYPES,
};
use super::{Access, DType, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "matmul_coop",
    source: concat!(
        include_str!("../../wgsl/matmul_coop.wgsl"),
        include_str!("../../wgsl/matmul_split_tail.wgsl"),
        include_str!("../../wgsl/matmul_coop_split.wgsl")
    ),
    workgroup_reduce: false,
};

/// The X3 entry points' source: without the split in one dispatch, whose partials' binding
/// their operands' scales take.
static X3_FAMILY: Family = Family {
    name: "matmul_coop_x3",
    source: include_str!("../../wgsl/matmul_coop.wgsl"),
    workgroup_reduce: false,
};

/// Tiles of vec4<f16> (Vulkan: cooperative loads take vector pointers).
const TILE_WORDS: &str = include_str!("../../wgsl/matmul_coop_tile_words.wgsl");
/// Tiles of f16 (Metal's simdgroup loads want the matrix's element type).
const TILE_F16: &str = include_str!("../../wgsl/matmul_coop_tile_f16.wgsl");
/// C bound as its elements.
const C_ELEMS: &str = include_str!("../../wgsl/matmul_coop_c_elems.wgsl");
/// C bound as vectors of 4 (C_VEC).
const C_VEC4: &str = include_str!("../../wgsl/matmul_coop_c_vec4.wgsl");
/// `pre` bound as f32 elements.
const PRE_ELEMS: &str = include_str!("../../wgsl/matmul_coop_pre_elems.wgsl");
/// `pre` bound as vectors of 4 f32 (`pre_vectors`).
const PRE_VEC4: &str = include_str!("../../wgsl/matmul_coop_pre_vec4.wgsl");

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
    /// WGRAD_DISABLE_FEATURES=cooperative_matrix or subgroup_barrier).
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
                    // WGRAD_COOP_F16_TILES=1 keeps scalar f16 tiles on Vulkan too (to measure).
                    words: gpu.info.backend == wgpu::Backend::Vulkan
                        && std::env::var("WGRAD_COOP_F16_TILES").map_or(true, |v| v != "1"),
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
    /// passes of the subgroup's lanes. `WGRAD_COOP_C_VEC=0` stores elements (to measure).
    pub fn stores_vectors(&self) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        self.fs.is_multiple_of(4)
            && (self.fs * self.fs).is_multiple_of(4 * self.sgs)
            && *ON.get_or_init(|| std::env::var("WGRAD_COOP_C_VEC").map_or(true, |v| v != "0"))
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
/// at least 128 workgroups (and fits `max_workgroup_bytes`); `WGRAD_COOP_TILE` forces one.
pub fn choose_tile(
    m: usize,
    n: usize,
    batch: usize,
    coop: Coop,
    max_workgroup_bytes: u32,
    x3: bool,
) -> CoopTile {
    if let Some(t) = forced_tile().filter(|t| t.valid(coop, max_workgroup_bytes, x3)) {
        return t;
    }
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

/// A tile forced by `WGRAD_COOP_TILE` (`SG_MxSG_N/FMxFN[/BK]`, e.g. `2x4/4x2/32`), for
/// measuring tiles against each other.
fn forced_tile() -> Option<CoopTile> {
    static FORCED: std::sync::OnceLock<Option<CoopTile>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| CoopTile::parse(&std::env::var("WGRAD_COOP_TILE").ok()?))
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
    /// f32 C with unit column stride and 16-byte aligned rows (offset, row and batch strides
    /// multiples of 4): tiles inside C load and store their accumulators straight from and to
    /// it (plain and bias products; C_DIRECT), the others store elements.
    Direct,
}

/// The specialization of one product: tile, accumulate, storage types, how A and B are read,
/// how C is written.
pub fn spec(
    t: CoopTile,
    acc: bool,
    types: Types,
    coop: Coop,
    (a, b): (OperandAccess, OperandAccess),
    c: CStore,
) -> Spec {
    spec_ones(t, acc, types, coop, (a, b), c, false, false)
}

/// `spec`, with A's last row taken as ones where `ones` (A_ONES in the WGSL), and, with `x3`,
/// f32 operands multiplied as their high and low f16 parts (X3: the `MATMUL_COOP_X3*`
/// entry points, f32 A and B, no direct stores).
#[allow(clippy::too_many_arguments)]
pub fn spec_ones(
    t: CoopTile,
    acc: bool,
    types: Types,
    coop: Coop,
    (a, b): (OperandAccess, OperandAccess),
    c: CStore,
    ones: bool,
    x3: bool,
) -> Spec {
    let c_direct = c == CStore::Direct && !x3;
    let c_vec = c == CStore::Vec4 && coop.stores_vectors();
    coop.with_fragments(Spec::new())
        .ty("TC", types.c.wgsl())
        .ty(
            "CB",
            if c_vec {
                vec4_of(types.c, false)
            } else {
                types.c.wgsl()
            },
        )
        .ty("AV", operand_vec(types.a, a.wide))
        .ty("AV_B", operand_vec(types.b, b.wide))
        .source(
            "READ",
            read_source((types.a, a.wide), (types.b, b.wide), x3),
        )
        .u32("FS", coop.fs)
        .u32("SGS", coop.sgs)
        .u32("SG_M", t.sg_m)
        .u32("SG_N", t.sg_n)
        .u32("FM", t.fm)
        .u32("FN", t.fn_)
        .u32("BK", t.bk)
        .u32("STAGES", t.stages)
        .u32("PARTS", 1 + x3 as u32)
        .bool("A_UK", a.along_cols)
        .bool("B_UN", b.along_cols)
        .bool("A_VEC", a.vec)
        .bool("B_VEC", b.vec)
        .bool("A_WIDE", a.wide)
        .bool("B_WIDE", b.wide)
        .bool("C_DIRECT", c_direct)
        .bool("C_VEC", c_vec)
        .bool("ACC", acc)
        .bool("A_ONES", ones)
        .bool("B_ONES", false)
        .u32("SPLIT_EPI", 0)
        .bool("SPREAD", spread(coop))
        .u32("GROUP_M", group_m())
        .u32("EPI_FRAGS", epi_frags(t))
        .source("TILE", if coop.words { TILE_WORDS } else { TILE_F16 })
        .source("C", if c_vec { C_VEC4 } else { C_ELEMS })
        .ty("PB", "f32")
        .ty("PE", "f32")
        .source("PRE", PRE_ELEMS)
        .source("UNROLLED", generated(t, coop, c_direct, x3))
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
/// an H100, 15.33-15.43 ms against 15.22-15.41, 2026-11-27: not kept.)
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

/// The part of the kernel generated per tile shape: FM x FN accumulators and the UA + UB
/// units a lane keeps in flight, as separate variables, with every loop over them unrolled
/// (a loop the shader compiler keeps would index them at run time and push them out of
/// registers). Generated once per shape and kept for the process.
fn generated(t: CoopTile, coop: Coop, c_direct: bool, x3: bool) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    type Key = (CoopTile, u32, u32, bool, bool);
    static CACHE: Mutex<BTreeMap<Key, &'static str>> = Mutex::new(BTreeMap::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry((t, coop.fs, coop.sgs, c_direct, x3))
        .or_insert_with(|| Box::leak(unrolled_source(t, coop, c_direct, x3).into_boxed_str()))
}

/// The READ snippet: for each operand x = a, b, `UnitX` (a unit as loaded, in f16), `unit_x(i,
/// st, nv)` (its loads, always issued) and `half_x(u)` (masked to nv), written for the
/// operand's element type and binding: vectors of 4, or (`wide` f16) 16-byte units
/// (`operand_vec`). With A_VEC / B_VEC a unit is one or two vector loads, else 8 gathered
/// elements. Generated once per combination and kept for the process.
///
/// With `x3` (f32 operands) a unit stays f32 until its store, where `half_x` gives its scaled
/// high part and `low_x` its low part.
fn read_source(a: (DType, bool), b: (DType, bool), x3: bool) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    type Key = (bool, bool, bool, bool, bool);
    static CACHE: Mutex<BTreeMap<Key, &'static str>> = Mutex::new(BTreeMap::new());
    let key = (a.0 == DType::F16, a.1, b.0 == DType::F16, b.1, x3);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache.entry(key).or_insert_with(|| {
        let text = if x3 {
            x3_operand_source("a", "A") + &x3_operand_source("b", "B")
        } else {
            operand_source("a", "A", a) + &operand_source("b", "B", b)
        };
        Box::leak(text.into_boxed_str())
    })
}

/// The READ snippet's loads of operand x, whatever it becomes at the store: `Unit{up}` (8
/// elements as `ty`, as loaded, and how many are valid), `elem_x(e)` (element e, as `ty`:
/// `elem`) and `unit_x(i, st, nv)` (`vec_load` with {up}_VEC, else 8 gathered elements; no
/// branches on nv: a lane with nv = 0 reads the binding's first element).
fn unit_source(x: &str, up: &str, ty: &str, elem: &str, vec_load: &str) -> String {
    format!(
        "struct Unit{up} {{
    lo: vec4<{ty}>,
    hi: vec4<{ty}>,
    nv: u32,
}}

fn elem_{x}(e: u32) -> {ty} {{
    return {elem};
}}

fn unit_{x}(i: u32, st: u32, nv: u32) -> Unit{up} {{
    var u: Unit{up};
    u.nv = nv;
    let first = select(0u, i, nv > 0u);
    if ({up}_VEC) {{
        {vec_load}
    }} else {{
        let j = vec4<u32>(0u, 1u, 2u, 3u);
        let lo = select(vec4<u32>(), vec4<u32>(i) + j * st, j < vec4<u32>(nv));
        let hi = select(vec4<u32>(), vec4<u32>(i) + (j + 4u) * st, j + 4u < vec4<u32>(nv));
        u.lo = vec4<{ty}>(elem_{x}(lo.x), elem_{x}(lo.y), elem_{x}(lo.z), elem_{x}(lo.w));
        u.hi = vec4<{ty}>(elem_{x}(hi.x), elem_{x}(hi.y), elem_{x}(hi.z), elem_{x}(hi.w));
    }}
    return u;
}}
"
    )
}

/// The READ snippet's part for f32 operand x of an X3 product: units loaded as f32 (two vector
/// loads, or 8 gathered elements), masked and scaled by `sc_x` at the store, then split into
/// the high part (`half_x`: the f32 value rounded to 11 significant bits by clearing its 13
/// lowest mantissa bits after adding half of their place, which f16 holds exactly) and the f16 rounding of what it leaves
/// (`low_x`). The high part is found by masking bits, not as f32(f16(x)): NVIDIA's compiler
/// folds that round trip to x (an H100 measured every low part 0, and f16 errors, 2026-11-26).
/// A unit of ones (A_ONES) is not scaled: its high part is 1, its low part 0.
fn x3_operand_source(x: &str, up: &str) -> String {
    let high = if x == "a" {
        "// The high part of x: its sign, exponent and 10 highest mantissa bits, rounded to the
// nearest (half away from zero), so the low part is at most 2^-11 of x.
fn high_part(v: vec4<f32>) -> vec4<f32> {
    return bitcast<vec4<f32>>((bitcast<vec4<u32>>(v) + vec4<u32>(0x1000u)) & vec4<u32>(0xffffe000u));
}

"
    } else {
        ""
    };
    let vec_load = format!("u.lo = {x}[first >> 2u];\n        u.hi = {x}[(first >> 2u) + 1u];");
    let elem = format!("{x}[e >> 2u][e & 3u]");
    high.to_string()
        + &format!(
            "// {up}: f32 elements in vectors of 4, split into f16 high and low parts at the store.\n"
        )
        + &unit_source(x, up, "f32", &elem, &vec_load)
        + &format!(
            "
// The unit masked to nv and scaled (ones, nv + 16, unscaled).
fn scaled_{x}(u: Unit{up}) -> Unit{up} {{
    let j = vec4<u32>(0u, 1u, 2u, 3u);
    let one = vec4<bool>({up}_ONES && u.nv >= 16u);
    let nv = vec4<u32>(u.nv & 15u);
    var s: Unit{up};
    s.lo = select(select(vec4<f32>(), u.lo * sc_{x}, j < nv), vec4<f32>(1.0), one & (j < nv));
    s.hi = select(select(vec4<f32>(), u.hi * sc_{x}, j + 4u < nv), vec4<f32>(1.0), one & (j + 4u < nv));
    return s;
}}

fn half_{x}(u: Unit{up}) -> Unit {{
    let s = scaled_{x}(u);
    return Unit(vec4<f16>(high_part(s.lo)), vec4<f16>(high_part(s.hi)));
}}

fn low_{x}(u: Unit{up}) -> Unit {{
    let s = scaled_{x}(u);
    return Unit(vec4<f16>(s.lo - high_part(s.lo)), vec4<f16>(s.hi - high_part(s.hi)));
}}
"
    )
}

fn operand_source(x: &str, up: &str, (dtype, wide): (DType, bool)) -> String {
    // f32 elements are rounded as they arrive: a unit held in f32 until its store takes twice
    // the registers, and made the step's f32 x f16 GELU product 2.6x slower on an H200.
    let sc = match dtype {
        DType::F16 => "f16",
        _ => "f32",
    };
    // Two vector loads (4 elements each), or one 16-byte load of 8 halves (as a matrix of
    // halves); f16 with `f16_words` as u32 words of two halves each; element e.
    let words = dtype == DType::F16 && f16_words();
    let (vec_load, elem) = if wide && words {
        (
            format!(
                "let w = {x}[first >> 3u];\n        \
                 u.lo = vec4<f16>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)));\n        \
                 u.hi = vec4<f16>(vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));"
            ),
            format!("f16(unpack2x16float({x}[e >> 3u][(e >> 1u) & 3u])[e & 1u])"),
        )
    } else if wide {
        (
            format!("let v = {x}[first >> 3u];\n        u.lo = v[0];\n        u.hi = v[1];"),
            format!("{x}[e >> 3u][(e >> 2u) & 1u][e & 3u]"),
        )
    } else if words {
        (
            format!(
                "let l = {x}[first >> 2u];\n        let h = {x}[(first >> 2u) + 1u];\n        \
                 u.lo = vec4<f16>(vec4<f32>(unpack2x16float(l.x), unpack2x16float(l.y)));\n        \
                 u.hi = vec4<f16>(vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y)));"
            ),
            format!("f16(unpack2x16float({x}[e >> 2u][(e >> 1u) & 1u])[e & 1u])"),
        )
    } else {
        (
            format!(
                "u.lo = vec4<f16>({x}[first >> 2u]);\n        u.hi = vec4<f16>({x}[(first >> 2u) + 1u]);"
            ),
            format!("f16({x}[e >> 2u][e & 3u])"),
        )
    };
    let binding = match (wide, words) {
        (true, true) => "16-byte units (vec4<u32>: two halves a word)",
        (true, false) => "16-byte units (mat2x4<f16>)",
        (false, true) => "vectors of 4 (vec2<u32>: two halves a word)",
        (false, false) => "vectors of 4",
    };
    format!("// {up}: {sc} elements in {binding}.\n")
        + &unit_source(x, up, "f16", &elem, &vec_load)
        + &format!(
            "
fn half_{x}(u: Unit{up}) -> Unit {{
    let j = vec4<u32>(0u, 1u, 2u, 3u);
    if ({up}_ONES) {{
        // nv + 16: a unit of ones (A's last row under A_ONES), nv of them.
        let one = vec4<bool>(u.nv >= 16u);
        let nv = vec4<u32>(u.nv & 15u);
        let lo = select(select(vec4<f16>(), u.lo, j < nv), vec4<f16>(1.0), one & (j < nv));
        let hi = select(select(vec4<f16>(), u.hi, j + 4u < nv), vec4<f16>(1.0), one & (j + 4u < nv));
        return Unit(lo, hi);
    }}
    let lo = select(vec4<f16>(), u.lo, j < vec4<u32>(u.nv));
    let hi = select(vec4<f16>(), u.hi, j + 4u < vec4<u32>(u.nv));
    return Unit(lo, hi);
}}
"
    )
}

/// Whether tiles of 4 or 2 units a row take their rows out of order so that the lanes storing
/// together reach different bank groups (SPREAD in the WGSL, `unit_rc`; 4096³ f16 on an H100,
/// 2026-11-26: 194.2 -> 198.6 TFLOP/s, medians of 9 and 15 runs). Only for tiles of vectors
/// (`Coop::words`, 16-byte stores; the scalar f16 tiles were not measured).
/// `WGRAD_COOP_SPREAD=0` stores them in order (to measure).
fn spread(coop: Coop) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    coop.words && *ON.get_or_init(|| std::env::var("WGRAD_COOP_SPREAD").map_or(true, |v| v != "0"))
}

/// Rows of tiles a group of the grid takes (GROUP_M in the WGSL, `tile_of`): 8 (4096³ f16 on an
/// H100, 2026-11-26: 198.6 -> 200.5 TFLOP/s, medians of 15 and 20 runs). `WGRAD_COOP_GROUP=N`
/// sets it, 1 to 64 (1: the grid's own order), to measure.
fn group_m() -> u32 {
    static GROUP: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *GROUP.get_or_init(|| {
        std::env::var("WGRAD_COOP_GROUP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8)
            .clamp(1, 64)
    })
}

/// Whether `WGRAD_COOP_ABLATE` names `noepilogue` (read once): the scratch epilogue stores one
/// fragment, the sum of a subgroup's accumulators (`unrolled_source`), instead of all of them.
fn epilogue_ablated() -> bool {
    static ABLATED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ABLATED.get_or_init(|| {
        std::env::var("WGRAD_COOP_ABLATE")
            .unwrap_or_default()
            .split(',')
            .any(|a| a == "noepilogue")
    })
}

/// Accumulators the scratch epilogue stores (EPI_FRAGS in the WGSL): all of them, or one with
/// the epilogue ablated (`epilogue_ablated`).
fn epi_frags(t: CoopTile) -> u32 {
    if epilogue_ablated() {
        1
    } else {
        t.fm * t.fn_
    }
}

/// Whether a one-stage tile's loop fetches the next step's units while this step multiplies
/// (the units held in registers across the multiply), rather than loading, storing and then
/// multiplying each step in turn. Measured on an H100 (2026-11-26, the same products): f16
/// products run faster in turn (4096³ 158.3 -> 172.6 TFLOP/s; the 4 x 128 --amp step
/// 5.11-5.21 -> 4.97-5.16 ms, 8 x 512 --amp 21.8 -> 20.8), X3 products (f32 units, twice the
/// registers) faster with the prefetch (4096³ 60.4 -> 65.7 TFLOP/s; 8 x 512 f32 48.9 -> 44.3
/// ms). So X3 prefetches and the f16 kernel does not; `WGRAD_COOP_PREFETCH=1` or `=0` sets it
/// for every product (to measure). Two-stage tiles always overlap.
fn prefetches(x3: bool) -> bool {
    match std::env::var("WGRAD_COOP_PREFETCH").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => x3,
    }
}

/// `WGRAD_COOP_ABLATE` (a measurement switch; the products come out wrong) leaves parts out of
/// the main loop, comma-separated: `noglobal` (units made up instead of loaded), `nostore`
/// (no tile stores), `nomultiply` (no fragment loads or multiply-adds), `nobarrier` (no
/// workgroup barriers), `noprefetch` (a step's units loaded and stored before its multiply
/// rather than during the previous one: what `prefetches` chooses for f16 products; the
/// products are right), out of the scratch epilogue `noepilogue` (the accumulators' sum
/// spilled and stored as one fragment), and out of the direct stores `nodirect` (their sum
/// stored as one fragment). What is left runs as it would, so the time of a
/// part is the difference (PROFILING.md).
fn unrolled_source(t: CoopTile, coop: Coop, c_direct: bool, x3: bool) -> String {
    use std::fmt::Write as _;
    let ablate = std::env::var("WGRAD_COOP_ABLATE").unwrap_or_default();
    let off = |what: &str| ablate.split(',').any(|a| a == what);
    let lanes = t.lanes(coop.sgs);
    let ua = t.bm(coop.fs) * t.bk / 8 / lanes;
    let ub = t.bk * t.bn(coop.fs) / 8 / lanes;
    let (fm, fn_, kf) = (t.fm, t.fn_, t.bk / coop.fs);
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "// Generated for FM = {fm}, FN = {fn_}, BK = {} (K fragments per step {kf}), {ua} + {ub} units per lane.",
        t.bk
    );
    for f in 0..fm * fn_ {
        let _ = writeln!(w, "var<private> acc{f}: MC;");
    }
    for j in 0..ua {
        let _ = writeln!(w, "var<private> ua{j}: UnitA;");
    }
    for j in 0..ub {
        let _ = writeln!(w, "var<private> ub{j}: UnitB;");
    }
    for j in 0..ua {
        let _ = writeln!(w, "var<private> oa{j}: u32;");
    }
    for j in 0..ub {
        let _ = writeln!(w, "var<private> ob{j}: u32;");
    }
    // A step's units, `load(x, j)` the expression that loads unit j of operand x (`noglobal`:
    // units made up instead).
    let fetch = |w: &mut String, load: &dyn Fn(&str, u32) -> String| {
        for (x, up, n) in [("a", "A", ua), ("b", "B", ub)] {
            for j in 0..n {
                if off("noglobal") {
                    let _ = writeln!(
                        w,
                        "    u{x}{j} = Unit{up}();\n    u{x}{j}.nv = (k0 + lid + {j}u) & 7u;"
                    );
                } else {
                    let _ = writeln!(w, "    u{x}{j} = {};", load(x, j));
                }
            }
        }
    };
    let _ = writeln!(w, "\nfn fetch_units(wid: vec3<u32>, lid: u32, k0: u32) {{");
    fetch(w, &|x, j| format!("fetch_{x}(wid, lid, k0, {j}u)"));
    // A whole tile's units: their offsets at k_lo found once, then moved along K.
    let _ = writeln!(w, "}}\n\nfn whole_bases(wid: vec3<u32>, lid: u32) {{");
    for j in 0..ua {
        let _ = writeln!(w, "    oa{j} = base_a(wid, lid, {j}u);");
    }
    for j in 0..ub {
        let _ = writeln!(w, "    ob{j} = base_b(wid, lid, {j}u);");
    }
    let _ = writeln!(
        w,
        "}}\n\nfn fetch_whole(wid: vec3<u32>, lid: u32, k0: u32) {{\n\
         \x20   let da = (k0 - k_lo) * p.a_ks;\n\
         \x20   let db = (k0 - k_lo) * p.b_ks;\n\
         \x20   let sa = select(p.a_ms, p.a_ks, A_UK);\n\
         \x20   let sb = select(p.b_ks, p.b_ns, B_UN);"
    );
    fetch(w, &|x, j| format!("unit_{x}(o{x}{j} + d{x}, s{x}, 8u)"));
    let _ = writeln!(w, "}}\n\nfn store_units(lid: u32, stage: u32) {{");
    for j in 0..if off("nostore") { 0 } else { ua } {
        let _ = writeln!(w, "    store_a(lid, {j}u, ua{j}, stage);");
        if x3 {
            let _ = writeln!(w, "    store_a_low(lid, {j}u, ua{j}, stage);");
        }
    }
    for j in 0..if off("nostore") { 0 } else { ub } {
        let _ = writeln!(w, "    store_b(lid, {j}u, ub{j}, stage);");
        if x3 {
            let _ = writeln!(w, "    store_b_low(lid, {j}u, ub{j}, stage);");
        }
    }
    let _ = writeln!(
        w,
        "}}\n\n// One step of K out of the tiles of `stage`.\nfn multiply(sm: u32, sn: u32, stage: u32) {{"
    );
    for kk in 0..if off("nomultiply") { 0 } else { kf } {
        let k0 = kk * coop.fs;
        let _ = writeln!(w, "    {{");
        for j in 0..fn_ {
            let _ = writeln!(
                w,
                "        let b{j} = frag_b({k0}u, (sn * FN + {j}u) * FS, stage);"
            );
            if x3 {
                let _ = writeln!(
                    w,
                    "        let bl{j} = frag_b({k0}u, (sn * FN + {j}u) * FS, STAGES + stage);"
                );
            }
        }
        for i in 0..fm {
            let _ = writeln!(
                w,
                "        let a{i} = frag_a((sm * FM + {i}u) * FS, {k0}u, stage);"
            );
            if x3 {
                let _ = writeln!(
                    w,
                    "        let al{i} = frag_a((sm * FM + {i}u) * FS, {k0}u, STAGES + stage);"
                );
            }
            for j in 0..fn_ {
                let f = i * fn_ + j;
                if x3 && !off("x3inside") {
                    // A fragment of K's three products summed from zero on the tensor cores,
                    // then added to the accumulator in f32: the tensor cores' sums truncate,
                    // so inside them each step would lose a unit of the accumulator's last
                    // place three times (an H100's errors 4-5x the tiled f32 kernel's).
                    let _ = writeln!(
                        w,
                        "        acc{f} = acc{f} + coopMultiplyAdd(a{i}, b{j}, \
                         coopMultiplyAdd(a{i}, bl{j}, coopMultiplyAdd(al{i}, b{j}, MC())));"
                    );
                } else if x3 {
                    let _ = writeln!(
                        w,
                        "        acc{f} = coopMultiplyAdd(al{i}, b{j}, acc{f});\n\
                         \x20       acc{f} = coopMultiplyAdd(a{i}, bl{j}, acc{f});\n\
                         \x20       acc{f} = coopMultiplyAdd(a{i}, b{j}, acc{f});"
                    );
                } else {
                    let _ = writeln!(w, "        acc{f} = coopMultiplyAdd(a{i}, b{j}, acc{f});");
                }
            }
        }
        let _ = writeln!(w, "    }}");
    }
    // WGRAD_COOP_PAD_SMEM=BYTES (a measurement switch, like WGRAD_COOP_ABLATE) declares that
    // much more workgroup memory, touched so the compiler keeps it: how the time moves with the
    // workgroup memory tells how many workgroups share a core (PROFILING.md).
    let pad: u32 = std::env::var("WGRAD_COOP_PAD_SMEM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let _ = writeln!(w, "}}");
    if pad >= 4 {
        let _ = writeln!(w, "\nvar<workgroup> pad_sh: array<u32, {}>;", pad / 4);
    }
    let _ = writeln!(w, "\nfn zero_acc() {{");
    if pad >= 4 {
        let _ = writeln!(
            w,
            "    if (p.k == 0xffffffffu) {{\n        pad_sh[p.m] = 1u;\n    }}"
        );
    }
    for f in 0..fm * fn_ {
        let _ = writeln!(w, "    acc{f} = MC();");
    }
    // With C_DIRECT (f32 C) an accumulating tile inside C starts from C; the load only
    // type-checks against an f32 C, so it is generated only then.
    let _ = writeln!(w, "}}\n\nfn load_acc(wid: vec3<u32>, sg: u32) {{");
    if c_direct {
        let _ = writeln!(w, "    let s = p.c_ms;");
        for f in 0..fm * fn_ {
            let _ = writeln!(
                w,
                "    let i{f} = c_frag(wid, sg, {f}u);\n    acc{f} = coopLoadT<MC>(&c[i{f}], s);"
            );
        }
    }
    // A bias product into a tile inside C starts its accumulators from the bias: each of
    // the subgroup's FN column blocks is broadcast down the rows of its scratch fragment and
    // loaded as the accumulators of that column block, so the tile is stored straight to C
    // like a plain product's (no epilogue through the scratch).
    let _ = writeln!(
        w,
        "}}\n\nfn bias_acc(wid: vec3<u32>, sg: u32, lane: u32) {{\n    let off = sg * FE;\n    let s = FS;"
    );
    for j in 0..fn_ {
        let _ = writeln!(
            w,
            "    for (var e = lane; e < FE; e += SGS) {{\n\
             \x20       c_sh[off + e] = bias[p.bias_off + frag_col(wid, sg, {j}u, e)];\n\
             \x20   }}\n\
             \x20   workgroupBarrier();\n\
             \x20   let b{j} = coopLoadT<MC>(&c_sh[off], s);\n\
             \x20   workgroupBarrier();"
        );
        for i in 0..fm {
            let _ = writeln!(w, "    acc{} = b{j};", i * fn_ + j);
        }
    }
    let _ = writeln!(
        w,
        "}}\n\n// Adds the workgroup's tile of A @ B into the subgroup's accumulators (with one stage, each\n\
         // step's units loaded and stored before it multiplies, or the next step's fetched while it\n\
         // multiplies: `prefetches` in the launcher); a whole tile's units through `fetch_whole`.\n\
         fn product(wid: vec3<u32>, lid: u32, sg: u32) {{\n    let sm = sg / SG_N;\n    let sn = sg % SG_N;\n    k_range(wid);"
    );
    let in_turn = off("noprefetch") || !prefetches(x3);
    // WGRAD_COOP_WHOLE=0 (a measurement switch) sends every tile through the bounded loads.
    if std::env::var("WGRAD_COOP_WHOLE").as_deref() == Ok("0") {
        let _ = writeln!(w, "{}}}\n", k_loop(t, in_turn, "k_lo", "k_hi"));
    } else {
        // A loop of their own for tiles inside C: a branch a step between the two fetches
        // took 222 registers a lane against 207 and ran 4096³ at 168 TFLOP/s against 195. The
        // ragged last step of such a tile, and every step of the others, go through one
        // bounded loop after it: two copies of the loop, not three (a copy for the ragged step
        // had doubled what the driver compiles: 0.8-1.15 s for the longest variants on an
        // H100 against 0.41 with the bounded loop alone, 2026-11-27).
        let whole = k_loop(t, in_turn, "k_lo", "k_mid").replace("fetch_units", "fetch_whole");
        let _ = writeln!(
            w,
            "    var k_from = k_lo;\n\
             \x20   if (inside_c(wid)) {{\n\
             \x20       whole_bases(wid, lid);\n\
             \x20       // Whole steps of K here, the ragged last one (if any) bounded below.\n\
             \x20       let k_mid = k_hi - (k_hi - k_lo) % BK;\n{}        k_from = k_mid;\n    }}\n{}}}\n",
            indent(&whole),
            k_loop(t, in_turn, "k_from", "k_hi")
        );
    }
    let _ = writeln!(
        w,
        "// Accumulator f into the subgroup's scratch tile (row-major FS x FS).\n\
         fn spill(f: u32, sg: u32) {{\n    let off = sg * FE;\n    let s = FS;\n    switch f {{"
    );
    if epilogue_ablated() {
        // Every accumulator folded into the one spilled fragment (EPI_FRAGS 1), so the
        // product is kept and the epilogue is a sixteenth or so of its own.
        let sum: Vec<String> = (0..fm * fn_).map(|f| format!("acc{f}")).collect();
        let _ = writeln!(
            w,
            "        case 0u: {{ let all = {}; coopStoreT(all, &c_sh[off], s); }}",
            sum.join(" + ")
        );
    }
    for f in (epilogue_ablated() as u32)..fm * fn_ {
        let _ = writeln!(
            w,
            "        case {f}u: {{ coopStoreT(acc{f}, &c_sh[off], s); }}"
        );
    }
    let _ = writeln!(w, "        default: {{}}\n    }}\n}}");
    let _ = writeln!(
        w,
        "\n// Every accumulator straight to C (C_DIRECT tiles inside C).\n\
         fn store_direct(wid: vec3<u32>, sg: u32) {{"
    );
    if c_direct && off("nodirect") {
        // (Ablation) one fragment a subgroup, the sum of its accumulators, so the product
        // is kept and the direct stores are a twelfth or so of their own.
        let sum: Vec<String> = (0..fm * fn_).map(|f| format!("acc{f}")).collect();
        let _ = writeln!(
            w,
            "    let s = p.c_ms;\n    let all = {};\n    coopStoreT(all, &c[c_frag(wid, sg, 0u)], s);",
            sum.join(" + ")
        );
    } else if c_direct {
        let _ = writeln!(w, "    let s = p.c_ms;");
        for f in 0..fm * fn_ {
            let _ = writeln!(
                w,
                "    let i{f} = c_frag(wid, sg, {f}u);\n    coopStoreT(acc{f}, &c[i{f}], s);"
            );
        }
    }
    let _ = writeln!(w, "}}");
    write_x3_parts(w, x3);
    if off("nobarrier") {
        s = s.replace("workgroupBarrier();", "");
    }
    s
}

/// The main loop of `product` over K from `from` to `to` (the names of two WGSL values) for
/// tile `t`, fetching units with `fetch_units(wid, lid, k0)` (`product` also uses it with
/// `fetch_whole`): with one stage, each step's units loaded and stored before it multiplies
/// (`in_turn`), or the next step's fetched while this one multiplies; with two stages, the
/// next step's units stored into the other stage while this one multiplies (which the
/// previous step's multiply finished reading before its barrier). The loops that fetch ahead
/// fetch nothing over an empty range (a whole loop must not read a step past its range).
fn k_loop(t: CoopTile, in_turn: bool, from: &str, to: &str) -> String {
    let text = if t.stages == 1 && in_turn {
        "for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
    fetch_units(wid, lid, k0);
    store_units(lid, 0u);
    workgroupBarrier();
    multiply(sm, sn, 0u);
    workgroupBarrier();
}
"
    } else if t.stages == 1 {
        "if (k_lo < k_hi) {
    fetch_units(wid, lid, k_lo);
    for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
        store_units(lid, 0u);
        workgroupBarrier();
        if (k0 + BK < k_hi) {
            fetch_units(wid, lid, k0 + BK);
        }
        multiply(sm, sn, 0u);
        workgroupBarrier();
    }
}
"
    } else {
        "if (k_lo < k_hi) {
    fetch_units(wid, lid, k_lo);
    store_units(lid, 0u);
    workgroupBarrier();
    var stage = 0u;
    for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
        let more = k0 + BK < k_hi;
        if (more) {
            fetch_units(wid, lid, k0 + BK);
        }
        multiply(sm, sn, stage);
        if (more) {
            store_units(lid, 1u - stage);
        }
        workgroupBarrier();
        stage = 1u - stage;
    }
}
"
    };
    indent(&text.replace("k_lo", from).replace("k_hi", to))
}

/// `text` indented by four spaces a line.
fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// The generated snippet's X3 part: the `scales` binding, `scales_init` (each subgroup takes
/// the largest of the absmax kernel's partial maxima of A and of B: the largest finite |x|
/// lies under 2^(e + 1), so 2^(13 - e) scales it under 2^14, clear of f16's largest, 65504,
/// and the low parts of elements down to about 2^-15 of it clear of f16's smallest normal),
/// and the stores of the low parts. Without X3, an empty `scales_init`.
fn write_x3_parts(w: &mut String, x3: bool) {
    use std::fmt::Write as _;
    if !x3 {
        let _ = writeln!(w, "\nfn scales_init(lane: u32) {{}}");
        return;
    }
    let _ = write!(
        w,
        "
@group(0) @binding(6) var<storage, read> scales: array<u32>;
const SCALE_PARTS: u32 = {parts}u;

fn scales_init(lane: u32) {{
    var ma = 0u;
    var mb = 0u;
    for (var i = lane; i < SCALE_PARTS; i += SGS) {{
        ma = max(ma, scales[p.scale_off + i]);
        mb = max(mb, scales[p.scale_off + SCALE_PARTS + i]);
    }}
    // e in [-110, 127] (an operand of zeros: -127): the scales 2^(13 - e) and the inverse
    // 2^(ea + eb - 26), split in two, each inside f32's range.
    let ea = clamp(i32(subgroupMax(ma) >> 23u) - 127, -110, 127);
    let eb = clamp(i32(subgroupMax(mb) >> 23u) - 127, -110, 127);
    sc_a = ldexp(1.0, 13 - ea);
    sc_b = ldexp(1.0, 13 - eb);
    let t = ea + eb - 26;
    unscale = vec2<f32>(ldexp(1.0, t / 2), ldexp(1.0, t - t / 2));
    inv_b = ldexp(1.0, eb - 13);
}}

fn store_a_low(lid: u32, j: u32, u: UnitA, stage: u32) {{
    let t = lid + j * WG;
    put_a(at_a(t, STAGES + stage), low_a(u));
}}

fn store_b_low(lid: u32, j: u32, u: UnitB, stage: u32) {{
    let t = lid + j * WG;
    put_b(at_b(t, STAGES + stage), low_b(u));
}}
",
        parts = super::absmax::PARTS
    );
}

/// Whether f16 operands are bound as u32 words, each unpacked to two halves
/// (`unpack2x16float`, then f16), rather than as mat2x4<f16> (16-byte units) or vec4<f16>: on
/// an H100 (2026-11-27) the 16-byte units as words ran 4096³ in 0.599 ms against 0.655 (229
/// against 210 TFLOP/s) and the DistilGPT-2 8 x 512 --amp step in 15.61-15.70 ms against
/// 16.50-16.58, as the attention kernels had read f16 faster as words than as f16 vectors.
/// `WGRAD_COOP_WORDS=0` (a measurement switch) binds halves.
fn f16_words() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("WGRAD_COOP_WORDS").as_deref() != Ok("0"))
}

/// What an operand is bound as: vectors of 4 elements, or (`wide` f16) 8 halves in 16 bytes;
/// f16 as u32 words of two halves (`f16_words`: naga has no bitcast from a word to a pair of
/// halves), or halves (WGSL has no 8-element vector: a 2 x 4 matrix).
fn operand_vec(t: DType, wide: bool) -> &'static str {
    match t {
        DType::F16 if f16_words() && wide => "vec4<u32>",
        DType::F16 if f16_words() => "vec2<u32>",
        _ => vec4_of(t, wide),
    }
}

/// The vector C or an operand of type `t` is bound as in halves or f32: 4 elements, or
/// (`wide` f16) 8 halves in one 16-byte matrix.
fn vec4_of(t: DType, wide: bool) -> &'static str {
    match t {
        DType::F16 if wide => "mat2x4<f16>",
        DType::F16 => "vec4<f16>",
        _ => "vec4<f32>",
    }
}

/// Every variant for an adapter offering `coop` with `max_workgroup_bytes`: each default tile
/// and a two-stage one, accumulate or not, each of the step's storage types, each way of
/// reading A and B, each epilogue; and, with the ways of reading A and of reading B paired in
/// order (as many pairs as the shorter list), each epilogue storing C in vectors (where the
/// adapter's fragments allow it) and the direct-store plain and bias products into f32.
pub fn variants(coop: Coop, max_workgroup_bytes: u32) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for ty in STEP_TYPES {
        // Each way of reading an operand of type `t`: along either dim, gathered or vectors
        // (and, f16, 16-byte vectors).
        let accesses = |t: DType| {
            let mut ways = Vec::new();
            for along_cols in [false, true] {
                for (vec, wide) in [(false, false), (true, false), (true, true)] {
                    if !wide || t == DType::F16 {
                        ways.push(OperandAccess {
                            along_cols,
                            vec,
                            wide,
                        });
                    }
                }
            }
            ways
        };
        let (a_ways, b_ways) = (accesses(ty.a), accesses(ty.b));
        for t in COOP_TILES
            .into_iter()
            .chain([tile(2, 4, 4, 2, 32, 2)])
            .filter(|t| t.valid(coop, max_workgroup_bytes, false))
        {
            for acc in [false, true] {
                for &a in &a_ways {
                    for &b in &b_ways {
                        for kernel in [&MATMUL_COOP, &MATMUL_COOP_BIAS, &MATMUL_COOP_BIAS_GELU] {
                            v.push((kernel, spec(t, acc, ty, coop, (a, b), CStore::Elems)));
                        }
                        // GELU's pre-activation stored f16 (autocast).
                        let s = spec(t, acc, ty, coop, (a, b), CStore::Elems);
                        v.push((&MATMUL_COOP_BIAS_GELU, pre_binding(s, false, true)));
                        // A residual is added to a new f32 output.
                        if !acc && ty.c == DType::F32 {
                            let s = spec(t, acc, ty, coop, (a, b), CStore::Elems);
                            v.push((&MATMUL_COOP_BIAS_RES, s));
                        }
                    }
                }
                // C stored in vectors through the scratch tile (where the adapter's fragments
                // allow it): each epilogue, the ways of reading A and B paired in order.
                if coop.stores_vectors() {
                    for (&a, &b) in a_ways.iter().zip(&b_ways) {
                        let s = spec(t, acc, ty, coop, (a, b), CStore::Vec4);
                        for kernel in [&MATMUL_COOP, &MATMUL_COOP_BIAS, &MATMUL_COOP_BIAS_GELU] {
                            v.push((kernel, s.clone()));
                        }
                        // `pre` in vectors too (GELU's pre-activation, the residual).
                        v.push((&MATMUL_COOP_BIAS_GELU, pre_vectors(s.clone())));
                        v.push((&MATMUL_COOP_BIAS_GELU, pre_binding(s.clone(), true, true)));
                        if !acc && ty.c == DType::F32 {
                            v.push((&MATMUL_COOP_BIAS_RES, s.clone()));
                            v.push((&MATMUL_COOP_BIAS_RES, pre_vectors(s)));
                        }
                    }
                }
                // Direct stores: plain and bias products into an f32 C, the ways of reading A
                // and B paired in order.
                if ty.c == DType::F32 {
                    for (&a, &b) in a_ways.iter().zip(&b_ways) {
                        for kernel in [&MATMUL_COOP, &MATMUL_COOP_BIAS] {
                            v.push((kernel, spec(t, acc, ty, coop, (a, b), CStore::Direct)));
                        }
                    }
                }
                // A split product in one dispatch, with each epilogue its sum serves (the ways
                // of reading A and B paired in order).
                for (&a, &b) in a_ways.iter().zip(&b_ways) {
                    let s = |ones| spec_ones(t, acc, ty, coop, (a, b), CStore::Elems, ones, false);
                    for epi in [SplitEpilogue::Plain, SplitEpilogue::Bias] {
                        v.push((&MATMUL_COOP_SPLIT, epi.spec(s(false))));
                    }
                    if !acc && ty.c == DType::F32 {
                        v.push((
                            &MATMUL_COOP_SPLIT,
                            SplitEpilogue::BiasResidual.spec(s(false)),
                        ));
                    }
                    if ty.c == DType::F32 {
                        v.push((&MATMUL_COOP_SPLIT, SplitEpilogue::ColumnSums.spec(s(true))));
                    }
                }
            }
        }
    }
    v.extend(x3_variants(coop, max_workgroup_bytes));
    v
}

/// The X3 variants (f32 operands and C): each default X3 tile, accumulate or not, the four
/// ways of reading an f32 operand (A's paired with B's in reverse order: each way of each
/// operand once), each epilogue, column sums (A_ONES) and, not accumulating, the residual; C
/// stored element by element and, where the adapter's fragments allow it, in vectors.
fn x3_variants(coop: Coop, max_workgroup_bytes: u32) -> Vec<(&'static KernelDesc, Spec)> {
    let ty = Types {
        a: DType::F32,
        b: DType::F32,
        c: DType::F32,
        half: false,
    };
    let ways: Vec<OperandAccess> = [false, true]
        .into_iter()
        .flat_map(|along_cols| {
            [false, true].map(|vec| OperandAccess {
                along_cols,
                vec,
                wide: false,
            })
        })
        .collect();
    // C stored element by element, and in vectors where the adapter's fragments allow it.
    let stores: &[CStore] = if coop.stores_vectors() {
        &[CStore::Elems, CStore::Vec4]
    } else {
        &[CStore::Elems]
    };
    let mut v = Vec::new();
    for t in X3_TILES
        .into_iter()
        .filter(|t| t.valid(coop, max_workgroup_bytes, true))
    {
        for acc in [false, true] {
            for (&a, &b) in ways.iter().zip(ways.iter().rev()) {
                let spec = |ones, c| spec_ones(t, acc, ty, coop, (a, b), c, ones, true);
                for kernel in [
                    &MATMUL_COOP_X3,
                    &MATMUL_COOP_X3_BIAS,
                    &MATMUL_COOP_X3_BIAS_GELU,
                ] {
                    for &c in stores {
                        v.push((kernel, spec(false, c)));
                    }
                }
                for &c in stores {
                    v.push((&MATMUL_COOP_X3_SUMS, spec(true, c)));
                    if !acc {
                        v.push((&MATMUL_COOP_X3_BIAS_RES, spec(false, c)));
                    }
                }
                // Vector stores with `pre` in vectors too (GELU's pre-activation, the residual).
                if stores.len() > 1 {
                    v.push((
                        &MATMUL_COOP_X3_BIAS_GELU,
                        pre_vectors(spec(false, CStore::Vec4)),
                    ));
                    if !acc {
                        v.push((
                            &MATMUL_COOP_X3_BIAS_RES,
                            pre_vectors(spec(false, CStore::Vec4)),
                        ));
                    }
                }
            }
        }
    }
    v
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

#[cfg(test)]
mod generated_tests {
    use super::*;

    #[test]
    fn the_generated_part_names_every_accumulator_and_unit_once() {
        let t = COOP_TILES[0];
        let src = generated(t, Coop::NVIDIA, true, false);
        let frags = (t.fm * t.fn_) as usize;
        assert_eq!(src.matches("var<private> acc").count(), frags);
        assert_eq!(src.matches("coopStoreT(acc").count(), 2 * frags);
        // Every accumulator multiplies once per fragment of K in a step.
        let kf = (t.bk / Coop::NVIDIA.fs) as usize;
        assert_eq!(src.matches("coopMultiplyAdd").count(), frags * kf);
        // Two loops over K: a tile inside C's whole steps without bounds, then one bounded
        // loop for its ragged last step and every step of the other tiles (the loops as
        // generated with none of the measurement switches that change them set).
        let switched = [
            "WGRAD_COOP_WHOLE",
            "WGRAD_COOP_PREFETCH",
            "WGRAD_COOP_ABLATE",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
        let product = &src[src.find("fn product(").unwrap()..src.find("fn spill(").unwrap()];
        if !switched {
            assert_eq!(product.matches("multiply(sm, sn, 0u);").count(), 2);
            assert_eq!(product.matches("fetch_whole(wid, lid, k0);").count(), 1);
            assert_eq!(product.matches("fetch_units(wid, lid, k0);").count(), 1);
            assert!(
                product.contains("k0 = k_lo; k0 < k_mid;")
                    && product.contains("k_from = k_mid;")
                    && product.contains("k0 = k_from; k0 < k_hi;")
            );
        }
        // Generated once: the same text (address) for the same tile.
        assert!(std::ptr::eq(src, generated(t, Coop::NVIDIA, true, false)));
        // Direct stores: one store per accumulator, and a start from C when accumulating.
        assert_eq!(src.matches("coopLoadT<MC>(&c[").count(), frags);
        let scratch_only = generated(t, Coop::NVIDIA, false, false);
        assert_eq!(scratch_only.matches("&c[").count(), 0);
        // X3: three multiply-adds a fragment pair, the low parts from the stages after the
        // high parts', every unit stored twice, and no direct stores.
        let t3 = X3_TILES[0];
        let x3 = generated(t3, Coop::NVIDIA, false, true);
        let (frags3, kf3) = (
            (t3.fm * t3.fn_) as usize,
            (t3.bk / Coop::NVIDIA.fs) as usize,
        );
        assert_eq!(x3.matches("coopMultiplyAdd").count(), 3 * frags3 * kf3);
        assert_eq!(
            x3.matches("STAGES + stage);").count(),
            (t3.fm + t3.fn_) as usize * kf3
        );
        let lanes = t3.lanes(Coop::NVIDIA.sgs);
        let units = (t3.bm(16) * t3.bk + t3.bk * t3.bn(16)) / 8 / lanes;
        assert_eq!(x3.matches("_low(lid, ").count(), units as usize);
        assert_eq!(x3.matches("&c[").count(), 0);
        assert!(x3.contains("@binding(6)") && !src.contains("@binding(6)"));
        println!("{src}");
    }
}
