//! Launcher of `wgsl/attention.wgsl`: fused causal attention. Forward writes O and
//! lse = m + log(l); backward is two kernels, dQ (which also writes D = rowsum(dO * O)) and
//! then dK with dV. None of them writes the T x T scores.
//!
//! Tiles are chosen per pass and padded head dim (`Tile`, `tile`): 128 lanes each, at most
//! 32 KiB of workgroup memory (lavapipe's and Apple's limit; NVIDIA has 48 KiB).
//! `candidate_tiles` lists others to measure, `Device::force_attention_tiles` (or a `lab`
//! build's `WGRAD_ATTN_F32_TILE`) runs them (`chosen_tile`).

use bytemuck::{Pod, Zeroable};

use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "attention",
    source: include_str!("../../wgsl/attention.wgsl"),
    workgroup_reduce: false,
};

/// Mirrors `Params` in attention.wgsl. Each view is (offset, b stride, h stride, t stride) of
/// a (B, H, T, D) tensor with unit stride along D; the fields a kernel does not read stay 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AttentionParams {
    pub heads: u32,
    pub t: u32,
    pub d: u32,
    /// B (read by `attention_d.wgsl`; the other kernels count rows by the grid).
    pub batch: u32,
    pub scale: f32,
    /// Query heads per key/value head (grouped-query attention; 1 for multi-head). k, v and
    /// their gradients are (B, H / group, T, D) views.
    pub group: u32,
    /// The rotary table's row of position t = 0 (`rope` specializations).
    pub start: u32,
    pub _pad3: u32,
    pub q: [u32; 4],
    pub k: [u32; 4],
    pub v: [u32; 4],
    pub o: [u32; 4],
    pub dout: [u32; 4],
    pub dq: [u32; 4],
    pub dk: [u32; 4],
    pub dv: [u32; 4],
}

const PARAMS: u64 = std::mem::size_of::<AttentionParams>() as u64;

/// O (B, H, T, D), lse (B, H, T) <- q, k, v (and the rotary table). The slots of the
/// backward's dO, lse and aux are laid out unread (bound to q), so the table has one binding
/// (9) in every entry point.
pub static ATTN_FWD: KernelDesc = KernelDesc {
    name: "attn_fwd",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // O
        Access::ReadWrite, // lse
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
        Access::Read,      // - (dO)
        Access::Read,      // - (lse)
        Access::Read,      // - (aux)
        Access::Read,      // rotary table (positions, D)
    ],
    params_size: PARAMS,
};

/// dQ (B, H, T, D), D (B, H, T) <- q, k, v, dO, lse, O.
pub static ATTN_BWD_DQ: KernelDesc = KernelDesc {
    name: "attn_bwd_dq",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // dQ
        Access::ReadWrite, // D
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
        Access::Read,      // dO
        Access::Read,      // lse
        Access::Read,      // O
        Access::Read,      // rotary table (positions, D)
    ],
    params_size: PARAMS,
};

/// dK, dV (B, H, T, D) <- q, k, v, dO, lse, D (after `ATTN_BWD_DQ`).
pub static ATTN_BWD_DKV: KernelDesc = KernelDesc {
    name: "attn_bwd_dkv",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // dK
        Access::ReadWrite, // dV
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
        Access::Read,      // dO
        Access::Read,      // lse
        Access::Read,      // D
        Access::Read,      // rotary table (positions, D)
    ],
    params_size: PARAMS,
};

/// The largest head dim the kernels take.
pub const MAX_HEAD_DIM: usize = 128;

/// The padded head dims a kernel is specialized for; D is zero-padded up to the next one.
pub const HEAD_DIMS: [u32; 3] = [32, 64, 128];

/// The padded head dim (`DMAX`) for head dim `d` (1..=MAX_HEAD_DIM).
pub fn head_dim_bucket(d: usize) -> Option<u32> {
    HEAD_DIMS.into_iter().find(|&b| d >= 1 && d <= b as usize)
}

/// The three kernels (`KIND` in the WGSL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward = 0,
    Dq = 1,
    Dkv = 2,
}

impl Pass {
    pub const ALL: [Pass; 3] = [Pass::Forward, Pass::Dq, Pass::Dkv];

    /// The pass's name in `WGRAD_ATTN_F32_TILE`.
    pub fn short_name(self) -> &'static str {
        match self {
            Pass::Forward => "fwd",
            Pass::Dq => "dq",
            Pass::Dkv => "dkv",
        }
    }

    pub fn kernel(self) -> &'static KernelDesc {
        match self {
            Pass::Forward => &ATTN_FWD,
            Pass::Dq => &ATTN_BWD_DQ,
            Pass::Dkv => &ATTN_BWD_DKV,
        }
    }
}

/// A pass's blocking: BR queries and BC keys per step, head dim padded to DMAX, lanes as a
/// ROWL x COLL grid (128 by default; `Tile::runs` says which others the kernel takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub dmax: u32,
    pub br: u32,
    pub bc: u32,
    pub rowl: u32,
    pub coll: u32,
}

/// The tile of `pass` at padded head dim `dmax` (one of `HEAD_DIMS`), all of 128 lanes;
/// `workgroup_bytes` counts what each stages:
///   forward: q (BR rows) and one k-or-v tile (BC rows) staged, plus S (BR x BC) and the
///   rows' partial maxima and sums (BR x COLL);
///   dQ: q, dO (BR rows), k, v (BC rows), dS; dK/dV: the same plus P.
/// At DMAX 64 (GPT-2's head dim) dQ and dK/dV take the candidates that ran fastest in the
/// 8 x 512 f32 step on an H100 (`candidate_tiles` swept with `WGRAD_ATTN_F32_TILE`, 2026-11-25,
/// PROFILING.md): dQ 24x16/8x16 (2.31 ms a step against 2.83 for 32x16/16x8) and dK/dV
/// 16x16/8x16 (3.01 against 3.46 for 16x32/8x16; two lanes share each run of 4 keys by vector
/// of 4 d's), 23.9 and 20.1 KiB: two workgroups a core where the larger tiles ran one. The
/// other tiles are the largest (BR first: it is the reuse of the staged keys) under 32 KiB,
/// not measured against the candidates: forward and dQ lanes 16 x 8 (rows are queries),
/// dK/dV lanes 8 x 16 with BC * DMAX = 2048 (one (run, vector) pair a lane).
pub fn tile(pass: Pass, dmax: u32) -> Tile {
    let (br, bc, rowl, coll) = match (pass, dmax) {
        (Pass::Forward, 128) => (32, 16, 16, 8),
        (Pass::Forward, _) => (32, 32, 16, 8),
        (Pass::Dq, 128) => (16, 8, 16, 8),
        (Pass::Dq, 64) => (24, 16, 8, 16),
        (Pass::Dq, _) => (32, 32, 16, 8),
        (Pass::Dkv, 128) => (8, 16, 8, 16),
        (Pass::Dkv, 64) => (16, 16, 8, 16),
        (Pass::Dkv, _) => (16, 64, 8, 16),
    };
    Tile {
        dmax,
        br,
        bc,
        rowl,
        coll,
    }
}

/// Other tiles of `pass` at padded head dim `dmax` to measure against `tile`'s (listed
/// first), all with at most 32 KiB of workgroup memory (so lavapipe runs them all): smaller
/// ones, so that two (24 KiB or less) or three (16 KiB or less) workgroups share an NVIDIA
/// core (its Vulkan driver gives a core about 48 KiB; PROFILING.md, "Workgroup memory per
/// core"), and 256-lane ones (8 subgroups of 32 a workgroup). DMAX 32 takes COLL 8 only for
/// the forward and dQ (D4 = 8 vectors across COLL lanes); at DMAX 128 no 256-lane tile but
/// the forward's fits 32 KiB.
pub fn candidate_tiles(pass: Pass, dmax: u32) -> Vec<Tile> {
    let others: &[&str] = match (pass, dmax) {
        (Pass::Forward, 32) => &[
            "32x32/32x8",
            "32x64/16x8",
            "32x64/32x8",
            "64x16/32x8",
            "16x32/16x8",
            "16x16/16x8",
        ],
        (Pass::Forward, 64) => &[
            "32x32/32x8",
            "32x32/16x16",
            "32x16/16x8",
            "32x16/32x8",
            "16x32/16x8",
            "16x32/16x16",
            "16x16/16x8",
            "16x16/16x16",
        ],
        (Pass::Forward, _) => &[
            "32x16/32x8",
            "32x16/16x16",
            "32x8/32x8",
            "16x16/16x8",
            "16x16/16x16",
            "8x32/8x16",
        ],
        (Pass::Dq, 32) => &[
            "32x32/32x8",
            "32x16/16x8",
            "32x16/32x8",
            "16x32/16x8",
            "16x16/16x8",
        ],
        (Pass::Dq, 64) => &[
            "32x16/16x8",
            "32x16/16x16",
            "32x16/32x8",
            "32x8/16x8",
            "32x8/32x8",
            "16x16/16x8",
            "16x16/16x16",
            "16x8/16x8",
        ],
        (Pass::Dq, _) => &["8x16/8x16"],
        (Pass::Dkv, 32) => &[
            "16x64/8x32",
            "16x32/8x16",
            "16x32/16x16",
            "32x32/16x8",
            "8x32/8x16",
            "16x16/8x16",
            "16x16/16x16",
        ],
        (Pass::Dkv, 64) => &[
            "16x32/8x16",
            "16x32/16x16",
            "16x32/8x32",
            "8x32/8x16",
            "8x32/8x32",
            "16x16/16x8",
            "16x16/16x16",
            "8x16/8x16",
            "16x8/16x8",
        ],
        (Pass::Dkv, _) => &["16x8/16x8"],
    };
    let parsed = others
        .iter()
        .map(|s| Tile::parse(s, dmax).expect("candidate tiles are well formed"));
    std::iter::once(tile(pass, dmax)).chain(parsed).collect()
}

/// The tile `pass` runs with at padded head dim `dmax` on an adapter with these limits: the
/// one `forced` holds for them (`Device::force_attention_tiles`, a `lab` build's
/// `WGRAD_ATTN_F32_TILE`) where the kernel runs it and it fits, else `tile`'s.
pub fn chosen_tile(
    pass: Pass,
    dmax: u32,
    (max_workgroup_bytes, max_lanes): (u32, u32),
    forced: &[(Pass, Tile)],
) -> Tile {
    forced
        .iter()
        .find(|(p, t)| *p == pass && t.dmax == dmax)
        .map(|&(_, t)| t)
        .filter(|t| {
            t.runs(pass) && t.workgroup_bytes(pass) <= max_workgroup_bytes && t.lanes() <= max_lanes
        })
        .unwrap_or_else(|| tile(pass, dmax))
}

/// `PASS=BRxBC/ROWLxCOLL` entries split by commas, as tiles to force: each named pass's at
/// every padded head dim (`chosen_tile` takes it where it runs and fits), and the entries
/// that are not of that form.
pub fn parse_forced_tiles(s: &str) -> (Vec<(Pass, Tile)>, Vec<&str>) {
    let (mut tiles, mut unread) = (Vec::new(), Vec::new());
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.split_once('=').and_then(|(name, t)| {
            let pass = Pass::ALL
                .into_iter()
                .find(|p| p.short_name() == name.trim())?;
            let t = Tile::parse(t, 0)?;
            Some(HEAD_DIMS.map(|dmax| (pass, Tile { dmax, ..t })))
        });
        match parsed {
            Some(at) => tiles.extend(at),
            None => unread.push(entry),
        }
    }
    (tiles, unread)
}

impl Tile {
    pub const fn lanes(&self) -> u32 {
        self.rowl * self.coll
    }

    /// `BRxBC/ROWLxCOLL`, as `WGRAD_ATTN_F32_TILE` takes it.
    pub fn name(&self) -> String {
        format!("{}x{}/{}x{}", self.br, self.bc, self.rowl, self.coll)
    }

    /// A `name` at padded head dim `dmax` (whether the kernel runs it is `runs`).
    pub fn parse(s: &str, dmax: u32) -> Option<Tile> {
        let (block, lanes) = s.split_once('/')?;
        let pair = |s: &str| -> Option<(u32, u32)> {
            let (a, b) = s.split_once('x')?;
            Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
        };
        let ((br, bc), (rowl, coll)) = (pair(block)?, pair(lanes)?);
        Some(Tile {
            dmax,
            br,
            bc,
            rowl,
            coll,
        })
    }

    /// Whether attention.wgsl computes `pass` with this tile: what its lane mappings assume.
    ///   all: 64 to 256 lanes (a power of 2, so D4 = DMAX / 4 divides them), COLL a multiple
    ///   of 8 (`score_lane`), the [query][key] block split evenly over the lane grid (BR over
    ///   ROWL, BC over COLL), keys in vectors of 4, and a lane per query row of a block (lse
    ///   and D);
    ///   forward, dQ: O and dQ's vectors of 4 d's split evenly over COLL lanes;
    ///   dK/dV: the runs of 4 keys by vectors of 4 d's split evenly over the lanes, or the
    ///   lanes evenly over them (`DKV_QS` lanes a pair, each with BR / DKV_QS of a block's
    ///   queries).
    pub fn runs(&self, pass: Pass) -> bool {
        let (lanes, d4) = (self.lanes(), self.dmax / 4);
        let grid = HEAD_DIMS.contains(&self.dmax)
            && lanes.is_power_of_two()
            && (64..=256).contains(&lanes)
            && self.coll.is_multiple_of(8)
            && self.rowl > 0
            && self.br > 0
            && self.br.is_multiple_of(self.rowl)
            && self.br <= lanes
            && self.bc > 0
            && self.bc.is_multiple_of(self.coll)
            && self.bc.is_multiple_of(4);
        grid && match pass {
            Pass::Forward | Pass::Dq => d4.is_multiple_of(self.coll),
            Pass::Dkv => {
                // Shared pairs: DKV_QS = lanes / pairs lanes a pair, each with BR / DKV_QS of a
                // block's queries.
                let pairs = self.bc / 4 * d4;
                (lanes.is_multiple_of(pairs) && self.br.is_multiple_of(lanes / pairs))
                    || pairs.is_multiple_of(lanes)
            }
        }
    }

    /// Bytes of workgroup memory `pass` declares with this tile (mirrors the `var<workgroup>`
    /// arrays of attention.wgsl: the ones a pass does not use have one element). The tiles are
    /// vectors of 4 f32, rows padded by one vector.
    pub fn workgroup_bytes(&self, pass: Pass) -> u32 {
        let dp4 = self.dmax / 4 + 1;
        let sp4 = self.bc / 4 + 1;
        let (rows_q, rows_k, s) = (self.br * dp4, self.bc * dp4, self.br * sp4);
        let one = |used: bool, n: u32| if used { n } else { 1 };
        let bwd = pass != Pass::Forward;
        let vectors = rows_q // tile_q
            + rows_k // tile_k
            + one(bwd, rows_q) // tile_do
            + one(bwd, rows_k) // tile_v
            + one(pass != Pass::Dq, s) // tile_s
            + one(bwd, s); // tile_ds
        let floats = one(!bwd, self.br * self.coll) // red
            + 2 * one(bwd, self.br); // lse_row, dvec_row
        16 * vectors + 4 * floats
    }
}

/// `acc_a`: add into the first output (dQ, or dK) instead of overwriting it; `acc_b` the
/// same for dV. Forward takes neither. No rotary embedding (`with_rope` adds it).
pub fn spec(pass: Pass, t: Tile, acc_a: bool, acc_b: bool) -> Spec {
    Spec::new()
        .u32("KIND", pass as u32)
        .u32("DMAX", t.dmax)
        .u32("BR", t.br)
        .u32("BC", t.bc)
        .u32("ROWL", t.rowl)
        .u32("COLL", t.coll)
        .bool("ACC_DQ", pass == Pass::Dq && acc_a)
        .bool("ACC_DK", pass == Pass::Dkv && acc_a)
        .bool("ACC_DV", pass == Pass::Dkv && acc_b)
        .bool("ROPE", false)
}

/// `spec` (of this file's kernels or attention_coop's) with q and k rotated as they load and
/// dQ, dK rotated back as they are written (rotary position embedding, from the table bound
/// last).
pub fn with_rope(spec: Spec, rope: bool) -> Spec {
    spec.with_bool("ROPE", rope)
}

pub fn variants() -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for rope in [false, true] {
        for dmax in HEAD_DIMS {
            let t = tile(Pass::Forward, dmax);
            v.push((
                &ATTN_FWD,
                with_rope(spec(Pass::Forward, t, false, false), rope),
            ));
            let t = tile(Pass::Dq, dmax);
            for acc in [false, true] {
                v.push((&ATTN_BWD_DQ, with_rope(spec(Pass::Dq, t, acc, false), rope)));
            }
            let t = tile(Pass::Dkv, dmax);
            for acc_k in [false, true] {
                for acc_v in [false, true] {
                    let s = spec(Pass::Dkv, t, acc_k, acc_v);
                    v.push((&ATTN_BWD_DKV, with_rope(s, rope)));
                }
            }
        }
    }
    v
}
