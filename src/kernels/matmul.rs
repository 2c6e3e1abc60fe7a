//! Launcher of `wgsl/matmul.wgsl`: batched matmul with strided (transposable) operands,
//! workgroup-memory tiling and register blocking; the tile is chosen from the shape.

use bytemuck::{Pod, Zeroable};

use super::DType;
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "matmul",
    source: concat!(
        include_str!("../../wgsl/matmul.wgsl"),
        include_str!("../../wgsl/matmul_split_tail.wgsl")
    ),
    workgroup_reduce: false,
};

/// Mirrors `Params` in matmul.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MatmulParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch: u32,
    pub a_off: u32,
    pub a_bs: u32,
    pub a_ms: u32,
    pub a_ks: u32,
    pub b_off: u32,
    pub b_bs: u32,
    pub b_ks: u32,
    pub b_ns: u32,
    pub c_off: u32,
    pub c_bs: u32,
    pub c_ms: u32,
    pub c_ns: u32,
    pub bias_off: u32,
    /// Split-K: the length of each workgroup's range of K (0: none; see `k_range` in the WGSL).
    pub k_split: u32,
    /// Where the residual starts (`matmul_bias_res`, `matmul_coop_bias_res`).
    pub res_off: u32,
    /// Where the operands' partial maxima start in the `scales` binding (the cooperative-matrix
    /// kernel's X3 products; unused elsewhere).
    pub scale_off: u32,
}

pub static MATMUL: KernelDesc = KernelDesc {
    name: "matmul",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// C = A B + bias.
pub static MATMUL_BIAS: KernelDesc = KernelDesc {
    name: "matmul_bias",
    family: &FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read, Access::Read],
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// The bindings of a product with a second output: C, A, B, the bias (read), and the
/// pre-activation or the column sums (written).
pub(crate) const C_A_B_BIAS_OUT: &[Access] = &[
    Access::ReadWrite,
    Access::Read,
    Access::Read,
    Access::Read,
    Access::ReadWrite,
];

/// C = A B + bias + R: a linear whose output a block adds to its residual stream R (the fifth
/// binding, only read; bound read-write as the shader's `pre`).
pub static MATMUL_BIAS_RES: KernelDesc = KernelDesc {
    name: "matmul_bias_res",
    family: &FAMILY,
    storage: C_A_B_BIAS_OUT,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// C = gelu(A B + bias), saving the pre-activation.
pub static MATMUL_BIAS_GELU: KernelDesc = KernelDesc {
    name: "matmul_bias_gelu",
    family: &FAMILY,
    storage: C_A_B_BIAS_OUT,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// The bindings of a split product in one dispatch (`matmul_split`, `matmul_coop_split`;
/// matmul_split_tail.wgsl):
/// C, A, B, the bias, the residual or column sums (`pre`), the partials (f32 bits, tile by
/// tile) and the tickets (u32, one a tile, 0 between products).
pub(crate) const SPLIT_STORAGE: &[Access] = &[
    Access::ReadWrite,
    Access::Read,
    Access::Read,
    Access::Read,
    Access::ReadWrite,
    Access::ReadWrite,
    Access::ReadWrite,
];

/// A split product in one dispatch: each range's partial, and the last range of a tile sums
/// them and stores C through `SplitEpilogue`.
pub static MATMUL_SPLIT: KernelDesc = KernelDesc {
    name: "matmul_split",
    family: &FAMILY,
    storage: SPLIT_STORAGE,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

/// What the last range of a split tile adds before it stores C (SPLIT_EPI in
/// matmul_split_tail.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitEpilogue {
    Plain = 0,
    Bias = 1,
    BiasResidual = 2,
    ColumnSums = 3,
}

impl SplitEpilogue {
    /// `spec` (a product's, built with SPLIT_EPI 0) for a split in one dispatch.
    pub fn spec(self, spec: Spec) -> Spec {
        spec.with_u32("SPLIT_EPI", self as u32)
    }
}

pub static SPLIT_FAMILY: Family = Family {
    name: "matmul_split",
    source: include_str!("../../wgsl/matmul_split.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in matmul_split.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct SplitSumParams {
    pub m: u32,
    pub n: u32,
    pub splits: u32,
    pub c_off: u32,
    pub c_ms: u32,
    pub c_ns: u32,
    /// Where the bias starts (`matmul_split_sum_bias`).
    pub bias_off: u32,
    /// Where the residual starts (`matmul_split_sum_bias_res`).
    pub res_off: u32,
}

/// C (+)= the sum of the split-K partial products (S, M, N).
/// C (+)= A B with `ONES` (A's last row taken as ones): C's last row, the column sums of B, to
/// the fifth binding at `bias_off` (the fourth is not read).
pub static MATMUL_SUMS: KernelDesc = KernelDesc {
    name: "matmul_sums",
    family: &FAMILY,
    storage: C_A_B_BIAS_OUT,
    params_size: std::mem::size_of::<MatmulParams>() as u64,
};

pub static MATMUL_SPLIT_SUM: KernelDesc = KernelDesc {
    name: "matmul_split_sum",
    family: &SPLIT_FAMILY,
    storage: &[Access::ReadWrite, Access::Read],
    params_size: std::mem::size_of::<SplitSumParams>() as u64,
};

/// C (+)= the sum of the split-K partial products (S, M, N) + bias: a bias product's epilogue.
pub static MATMUL_SPLIT_SUM_BIAS: KernelDesc = KernelDesc {
    name: "matmul_split_sum_bias",
    family: &SPLIT_FAMILY,
    storage: &[Access::ReadWrite, Access::Read, Access::Read],
    params_size: std::mem::size_of::<SplitSumParams>() as u64,
};

/// The bindings of a split sum with a second output: C, the partials, the bias (read), and the
/// column sums (written) or the residual (read; bound read-write as the shader's `sums`).
const C_PART_BIAS_OUT: &[Access] = &[
    Access::ReadWrite,
    Access::Read,
    Access::Read,
    Access::ReadWrite,
];

/// C = the sum of the split-K partial products (S, M, N) + bias + R (the fourth binding, only
/// read; bound read-write as the shader's `sums`): a residual linear's epilogue.
pub static MATMUL_SPLIT_SUM_BIAS_RES: KernelDesc = KernelDesc {
    name: "matmul_split_sum_bias_res",
    family: &SPLIT_FAMILY,
    storage: C_PART_BIAS_OUT,
    params_size: std::mem::size_of::<SplitSumParams>() as u64,
};

/// The split sum of a product with `ONES`: its last row to the fourth binding at `bias_off`
/// (the third is not read).
pub static MATMUL_SPLIT_SUM_SUMS: KernelDesc = KernelDesc {
    name: "matmul_split_sum_sums",
    family: &SPLIT_FAMILY,
    storage: C_PART_BIAS_OUT,
    params_size: std::mem::size_of::<SplitSumParams>() as u64,
};

/// Workgroups a product should give the GPU before its K is split (a few per core of a large
/// GPU: an H200 has 132, each running two 128x128 cooperative-matrix workgroups at once). On
/// an H200 (DistilGPT-2 --amp, GPU busy per step, 2026-11-23): 256 -> 29.5 ms at 8x512 and 7.78
/// at 4x128; 512 -> 28.9 and 7.79; 1024 -> 28.7 and 7.99; 2048 -> 30.0 and 8.26.
pub const SPLIT_TARGET_GROUPS: usize = 512;
/// The shortest range of K worth a workgroup of its own.
pub const SPLIT_MIN_K: usize = 256;
/// Ranges at most.
pub const SPLIT_MAX: usize = 16;

/// The ranges to split K into for a product of `tiles` workgroups (a plain or bias product:
/// the bias is added by the split sum): a power of two that brings the workgroups to `target`
/// (`SPLIT_TARGET_GROUPS` but in a `lab` build's sweep), each range at least `SPLIT_MIN_K`
/// long; 1 for none.
pub fn split_k(tiles: usize, k: usize, target: usize) -> usize {
    let want = target / tiles.max(1);
    let most = (k / SPLIT_MIN_K).min(SPLIT_MAX).min(want);
    if most < 2 {
        return 1;
    }
    1 << most.ilog2()
}

/// A split sum storing C of type `c` (`acc`: adding into it), a lane summing 4 consecutive
/// elements of a row through vector bindings (`vec4`; the launcher checks N, the offsets and C's
/// row stride are multiples of 4, C's columns unit-stride) or one.
pub fn split_sum_spec(c: DType, acc: bool, vec4: bool) -> Spec {
    let (w, pv, cv) = match (vec4, c) {
        (true, DType::F16) => (4, "vec4<f32>", "vec4<f16>"),
        (true, _) => (4, "vec4<f32>", "vec4<f32>"),
        (false, _) => (1, "f32", c.wgsl()),
    };
    Spec::new()
        .ty("TC", c.wgsl())
        .u32("W", w)
        .ty("PV", pv)
        .ty("CV", cv)
        .bool("ACC", acc)
}

/// A workgroup tile: BM x BN outputs, K staged BK at a time, TM x TN per lane; `vec`: the
/// lane's block in runs of 4 rows and columns read as vectors (`matmul.wgsl`'s VEC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
    pub vec: bool,
}

impl Tile {
    /// An interleaved tile (not `vec`).
    pub const fn new(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32) -> Tile {
        Tile {
            bm,
            bn,
            bk,
            tm,
            tn,
            vec: false,
        }
    }

    /// The tile with its block in vector runs.
    pub const fn vec(self) -> Tile {
        Tile { vec: true, ..self }
    }

    pub const fn lanes(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Workgroup memory the tile stages per step of K, as f32 (rows padded by one word, or by
    /// one vector with `vec`, plus the other form's one-element placeholders and up to 8 bytes
    /// aligning the vectors; f16 staging takes about half).
    pub const fn workgroup_bytes(&self) -> u32 {
        if self.vec {
            4 * self.bk * (self.bm + 4 + self.bn + 4) + 16
        } else {
            4 * self.bk * (self.bm + 1 + self.bn + 1) + 32
        }
    }

    pub fn name(&self) -> String {
        format!(
            "{}x{}x{}/{}x{}{}",
            self.bm,
            self.bn,
            self.bk,
            self.tm,
            self.tn,
            if self.vec { "v" } else { "" }
        )
    }

    /// Parses `name`'s form (`64x64x16/4x4`, `128x128x8/8x8v`); None unless the tile is one the
    /// kernel can run (register blocks dividing the tile, in runs of 4 with `v`, at most 1,024
    /// lanes).
    pub fn parse(s: &str) -> Option<Tile> {
        let (block, lane) = s.split_once('/')?;
        let dims: Vec<u32> = block
            .split('x')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let (lane, vec) = match lane.strip_suffix('v') {
            Some(l) => (l, true),
            None => (lane, false),
        };
        let (tm, tn) = lane.split_once('x')?;
        let t = match dims[..] {
            [bm, bn, bk] => Tile {
                bm,
                bn,
                bk,
                tm: tm.parse().ok()?,
                tn: tn.parse().ok()?,
                vec,
            },
            _ => return None,
        };
        let ok = t.tm > 0
            && t.tn > 0
            && t.bk > 0
            && t.bm.is_multiple_of(t.tm)
            && t.bn.is_multiple_of(t.tn)
            && (!t.vec || (t.tm.is_multiple_of(4) && t.tn.is_multiple_of(4)))
            && (1..=1024).contains(&t.lanes())
            // Each lane keeps a bit per staged element of A and of B (matmul.wgsl).
            && (t.bm * t.bk).div_ceil(t.lanes()) <= 32
            && (t.bk * t.bn).div_ceil(t.lanes()) <= 32;
        ok.then_some(t)
    }
}

/// The tiles the engine chooses among (each 256 lanes, at most 6.3 KiB of workgroup memory,
/// under WebGPU's 16 KiB default), largest first. On an H100 the two vector-run tiles were the
/// fastest at 4096^3 of the blocks whose every entry point keeps its accumulators in registers
/// (31.8 and 28.1 TFLOP/s against 24.4 for the interleaved 64x64x16/4x4 that led before); the
/// 8x8 blocks run faster (36.1) but spill in their residual and GELU entry points, so only a
/// search, which times each product's own epilogue, chooses them (`wgrad bench matmul
/// --search`, `examples/shader_stats`, 2026-11-25, PROFILING.md).
pub const TILES: [Tile; 4] = [
    Tile::new(128, 64, 8, 8, 4).vec(),
    Tile::new(64, 64, 8, 4, 4).vec(),
    Tile::new(32, 32, 16, 2, 2),
    Tile::new(16, 16, 16, 1, 1),
];

/// The tile for an (M, N) output of `batch` matrices: the largest one that still gives the
/// GPU enough workgroups (at least 64) to spread over its cores.
pub fn choose_tile(m: usize, n: usize, batch: usize) -> Tile {
    let groups = |t: &Tile| m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize) * batch;
    for t in &TILES[..TILES.len() - 1] {
        if groups(t) >= 64 && m >= t.bm as usize / 2 && n >= t.bn as usize / 2 {
            return *t;
        }
    }
    TILES[TILES.len() - 1]
}

/// The element types of a product: A, B and C as stored, and whether the operands are
/// rounded to f16 (products accumulated in f32 either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Types {
    pub a: DType,
    pub b: DType,
    pub c: DType,
    pub half: bool,
}

impl Types {
    pub const F32: Types = Types {
        a: DType::F32,
        b: DType::F32,
        c: DType::F32,
        half: false,
    };

    /// f16 operands and products written as f32 (the mixed-precision training case).
    pub const F16: Types = Types {
        a: DType::F16,
        b: DType::F16,
        c: DType::F32,
        half: true,
    };

    /// The type aliases every matmul kernel takes: TA, TB, TC and TS (the staging type).
    pub fn spec(&self, spec: Spec) -> Spec {
        spec.ty("TA", self.a.wgsl())
            .ty("TB", self.b.wgsl())
            .ty("TC", self.c.wgsl())
            .ty("TS", if self.half { "f16" } else { "f32" })
    }
}

/// The storage types a mixed-precision training step multiplies: f16 operands; f32
/// activations or gradients (rounded to f16 in the tiles) times f16 weight copies, out as f32
/// or as f16 (a GELU output feeding the next matmul); f16 activations times f32 gradients.
pub const STEP_TYPES: [Types; 5] = [
    Types::F16,
    Types {
        a: DType::F32,
        b: DType::F32,
        c: DType::F32,
        half: true,
    },
    Types {
        a: DType::F32,
        b: DType::F16,
        c: DType::F32,
        half: true,
    },
    Types {
        a: DType::F32,
        b: DType::F16,
        c: DType::F16,
        half: true,
    },
    Types {
        a: DType::F16,
        b: DType::F32,
        c: DType::F32,
        half: true,
    },
];

/// An operand as a launcher sees it: element type, offset, batch stride and count, row and
/// column extents and strides (elements), and the elements its binding holds. A: (M, K) per
/// batch; B: (K, N).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperandLayout {
    pub dtype: DType,
    pub offset: usize,
    pub batch_stride: usize,
    pub batch: usize,
    pub rows: usize,
    pub row_stride: usize,
    pub cols: usize,
    pub col_stride: usize,
    pub bound_elements: usize,
}

impl OperandLayout {
    /// Whether the kernels walk the operand along its cols (A's k, B's n): unless only its rows
    /// are unit-stride (the rule of `a_unit_m` / `b_unit_k` in matmul.wgsl and of the
    /// cooperative-matrix kernel's units).
    pub fn along_cols(&self) -> bool {
        self.col_stride == 1 || self.row_stride != 1
    }

    /// Whether the operand can be read in whole vectors along that dim: it is unit-stride,
    /// every vector starts on a multiple of `align` elements (offset, other and batch strides),
    /// and every row's last vector, its extent rounded up to `round` elements, lies inside the
    /// binding.
    pub fn reads_vectors(&self, align: usize, round: usize) -> bool {
        let (unit_stride, extent, other_stride, other_extent) = if self.along_cols() {
            (self.col_stride, self.cols, self.row_stride, self.rows)
        } else {
            (self.row_stride, self.rows, self.col_stride, self.cols)
        };
        let last_read = self.offset
            + self.batch.saturating_sub(1) * self.batch_stride
            + other_extent.saturating_sub(1) * other_stride
            + extent.next_multiple_of(round);
        matches!(self.dtype, DType::F16 | DType::F32)
            && unit_stride == 1
            && self.offset.is_multiple_of(align)
            && other_stride.is_multiple_of(align)
            && (self.batch <= 1 || self.batch_stride.is_multiple_of(align))
            && last_read <= self.bound_elements
    }
}

/// Whether the tiled kernel reads A and B in vectors of 4 (A_V4, B_V4 in matmul.wgsl): on
/// `vec` tiles, for each operand that `reads_vectors(4, 4)`, and along k only where BK is a
/// multiple of 4.
pub fn vector_reads(t: Tile, a: &OperandLayout, b: &OperandLayout) -> (bool, bool) {
    let k_ok = t.bk.is_multiple_of(4);
    let a_v4 = t.vec && a.reads_vectors(4, 4) && (k_ok || !a.along_cols());
    let b_v4 = t.vec && b.reads_vectors(4, 4) && (k_ok || b.along_cols());
    (a_v4, b_v4)
}

/// `acc`: add the product into C (gradient accumulation) instead of overwriting it.
/// `vectors`: A and B read in vectors of 4 (`vector_reads`).
pub fn spec(t: Tile, acc: bool, types: Types, vectors: (bool, bool)) -> Spec {
    spec_ones(t, acc, types, vectors, false)
}

/// `spec`, with A's last row taken as ones where `ones` (`matmul.wgsl`'s ONES).
pub fn spec_ones(t: Tile, acc: bool, types: Types, vectors: (bool, bool), ones: bool) -> Spec {
    types.spec(
        Spec::new()
            .u32("BM", t.bm)
            .u32("BN", t.bn)
            .u32("BK", t.bk)
            .u32("TM", t.tm)
            .u32("TN", t.tn)
            .bool("VEC", t.vec)
            .bool("A_V4", vectors.0)
            .bool("B_V4", vectors.1)
            .bool("ACC", acc)
            .bool("ONES", ones)
            .u32("SPLIT_EPI", 0)
            .ty("PE", "f32"),
    )
}

/// Every tiled variant: each tile, accumulate or not, f32 and (with shader-f16) the
/// mixed-precision step's types.
pub fn variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    let outs: &[DType] = if f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    for &c in outs {
        for acc in [false, true] {
            for vec4 in [false, true] {
                v.push((&MATMUL_SPLIT_SUM, split_sum_spec(c, acc, vec4)));
                v.push((&MATMUL_SPLIT_SUM_BIAS, split_sum_spec(c, acc, vec4)));
                v.push((&MATMUL_SPLIT_SUM_SUMS, split_sum_spec(c, acc, vec4)));
                // A residual is added to a new f32 output.
                if !acc && c == DType::F32 {
                    v.push((&MATMUL_SPLIT_SUM_BIAS_RES, split_sum_spec(c, acc, vec4)));
                }
            }
        }
    }
    let mut types = vec![Types::F32];
    if f16 {
        types.extend(STEP_TYPES);
    }
    for ty in types {
        for t in TILES {
            // Vector reads of both operands (a step's aligned products) on the vector tiles.
            let reads: &[(bool, bool)] = if t.vec {
                &[(false, false), (true, true)]
            } else {
                &[(false, false)]
            };
            for &vectors in reads {
                for acc in [false, true] {
                    v.push((&MATMUL, spec(t, acc, ty, vectors)));
                    v.push((&MATMUL_BIAS, spec(t, acc, ty, vectors)));
                    v.push((&MATMUL_BIAS_GELU, spec(t, acc, ty, vectors)));
                    if ty.half {
                        // GELU's pre-activation stored f16 under autocast.
                        let s = spec(t, acc, ty, vectors).with_ty("PE", "f16");
                        v.push((&MATMUL_BIAS_GELU, s));
                    }
                    if !acc && ty.c == DType::F32 {
                        v.push((&MATMUL_BIAS_RES, spec(t, acc, ty, vectors)));
                    }
                    // A split product in one dispatch, with each epilogue its sum serves.
                    for epi in [SplitEpilogue::Plain, SplitEpilogue::Bias] {
                        v.push((&MATMUL_SPLIT, epi.spec(spec(t, acc, ty, vectors))));
                    }
                    if !acc && ty.c == DType::F32 {
                        let s = spec(t, acc, ty, vectors);
                        v.push((&MATMUL_SPLIT, SplitEpilogue::BiasResidual.spec(s)));
                    }
                    if ty.c == DType::F32 {
                        let s = spec_ones(t, acc, ty, vectors, true);
                        v.push((&MATMUL_SPLIT, SplitEpilogue::ColumnSums.spec(s)));
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

    /// A (rows, cols) f32 operand with row stride `row_stride` at `offset`, its binding
    /// `bound` elements.
    fn operand(
        rows: usize,
        cols: usize,
        row_stride: usize,
        offset: usize,
        bound: usize,
    ) -> OperandLayout {
        OperandLayout {
            dtype: DType::F32,
            offset,
            batch_stride: 0,
            batch: 1,
            rows,
            row_stride,
            cols,
            col_stride: 1,
            bound_elements: bound,
        }
    }

    #[test]
    fn vectors_need_aligned_starts_and_whole_last_vectors() {
        assert!(operand(68, 44, 44, 0, 68 * 44).reads_vectors(4, 4));
        assert!(
            !operand(68, 44, 44, 2, 68 * 44 + 2).reads_vectors(4, 4),
            "offset"
        );
        assert!(
            !operand(68, 45, 45, 0, 68 * 45).reads_vectors(4, 4),
            "row stride"
        );
        // A view of 45 of each row's 56, 4 in: the last vector reads 3 elements past the view.
        let narrow = |cols, bound| operand(70, cols, 56, 4, bound);
        assert!(narrow(45, 70 * 56).reads_vectors(4, 4));
        assert!(narrow(45, 4 + 69 * 56 + 48).reads_vectors(4, 4));
        assert!(
            !narrow(45, 4 + 69 * 56 + 45).reads_vectors(4, 4),
            "last vector past the binding"
        );
        // Units of 8 (the cooperative-matrix kernel) need the last 8 inside: 43 rounds to 44
        // in vectors of 4, to 48 in units of 8.
        assert!(narrow(43, 4 + 69 * 56 + 44).reads_vectors(4, 4));
        assert!(!narrow(43, 4 + 69 * 56 + 44).reads_vectors(4, 8));
        let batched = |batch_stride| OperandLayout {
            batch: 3,
            batch_stride,
            ..operand(68, 44, 44, 0, 3 * 68 * 44)
        };
        assert!(batched(68 * 44).reads_vectors(4, 4));
        assert!(batched(0).reads_vectors(4, 4), "a broadcast batch");
        assert!(!batched(68 * 44 - 2).reads_vectors(4, 4), "batch stride");
        let strided = OperandLayout {
            col_stride: 2,
            ..operand(68, 44, 88, 0, 68 * 88)
        };
        assert!(!strided.reads_vectors(4, 4), "no unit-stride dim");
    }

    #[test]
    fn vector_reads_only_on_vector_tiles_and_along_k_only_on_whole_vectors_of_k() {
        let a = operand(68, 44, 44, 0, 68 * 44); // (M, K) along k
        let b = operand(44, 36, 36, 0, 44 * 36); // (K, N) along n
        let t = Tile::new(64, 64, 8, 4, 4);
        assert_eq!(vector_reads(t.vec(), &a, &b), (true, true));
        assert_eq!(vector_reads(t, &a, &b), (false, false), "interleaved tile");
        // BK 2: a vector along k would straddle two steps; along m or n it does not.
        let bk2 = Tile::new(64, 64, 2, 4, 4).vec();
        assert_eq!(vector_reads(bk2, &a, &b), (false, true));
        // A transposed (rows unit-stride: along m) and B transposed (along k).
        let at = OperandLayout {
            row_stride: 1,
            col_stride: 68,
            ..operand(68, 44, 0, 0, 68 * 44)
        };
        let bt = OperandLayout {
            row_stride: 1,
            col_stride: 44,
            ..operand(44, 36, 0, 0, 44 * 36)
        };
        assert!(!at.along_cols() && !bt.along_cols());
        assert_eq!(vector_reads(bk2, &at, &bt), (true, false));
    }
}
