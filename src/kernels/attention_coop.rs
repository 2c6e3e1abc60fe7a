//! Launcher of `wgsl/attention_coop.wgsl`: fused causal attention on cooperative matrices, the
//! mixed-precision counterpart of `attention` (same params and algorithm, the forward in one
//! pass with its row max kept stale; f16 products, f32 softmax and accumulation; its backward
//! is one dispatch of both passes after `wgsl/attention_d.wgsl`'s D). Chosen for an autocast
//! forward on adapters with cooperative matrices, when D and every view's offset and strides
//! are multiples of 4 (the kernels read q, k, v, dO four elements at a time).

use super::attention::{AttentionParams, Pass, HEAD_DIMS};
use super::matmul_coop::Coop;
use super::{Access, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "attention_coop",
    source: include_str!("../../wgsl/attention_coop.wgsl"),
    workgroup_reduce: false,
};

const PARAMS: u64 = std::mem::size_of::<AttentionParams>() as u64;

/// O (B, H, T, D), lse (B, H, T) <- q, k, v, in one pass over the keys (the row max kept stale,
/// O rescaled where it moves).
pub static ATTN_COOP_FWD: KernelDesc = KernelDesc {
    name: "attn_coop_fwd",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // O
        Access::ReadWrite, // lse
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
    ],
    params_size: PARAMS,
};

/// dQ and dK (views of one buffer), dV (B, H, T, D) <- q, k, v, dO, lse, D (`ATTN_D`'s): both
/// backward passes of `attention` in one dispatch, their workgroups side by side.
pub static ATTN_COOP_BWD: KernelDesc = KernelDesc {
    name: "attn_coop_bwd",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // dQ and dK
        Access::ReadWrite, // dV
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
        Access::Read,      // dO
        Access::Read,      // lse
        Access::Read,      // D
    ],
    params_size: PARAMS,
};

pub static D_FAMILY: Family = Family {
    name: "attention_d",
    source: include_str!("../../wgsl/attention_d.wgsl"),
    workgroup_reduce: false,
};

/// D = rowsum(dO * O), (B, H, T) <- dO, O: before `ATTN_COOP_BWD`, which reads it.
pub static ATTN_D: KernelDesc = KernelDesc {
    name: "attn_d",
    family: &D_FAMILY,
    storage: &[
        Access::ReadWrite, // D
        Access::Read,      // dO
        Access::Read,      // O
    ],
    params_size: PARAMS,
};

/// `ATTN_D`'s workgroups for `rows` = B * H * T query rows (attention_d.wgsl: 4 lanes a row,
/// 256 lanes a workgroup).
pub fn d_workgroups(rows: usize) -> u64 {
    (rows as u64 * 4).div_ceil(256)
}

/// KIND of `ATTN_COOP_BWD` in the WGSL.
const KIND_BWD: u32 = 3;

/// The kernel of `pass`: the backward passes share one (`ATTN_COOP_BWD`).
pub fn kernel(pass: Pass) -> &'static KernelDesc {
    match pass {
        Pass::Forward => &ATTN_COOP_FWD,
        Pass::Dq | Pass::Dkv => &ATTN_COOP_BWD,
    }
}

/// A pass's blocking: `sg` subgroups of fragment rows (the workgroup's own rows: queries, or
/// keys for dK/dV), blocks of `bc` rows of the other side, head dim padded to `dmax`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub sg: u32,
    pub bc: u32,
    pub dmax: u32,
}

impl Tile {
    /// The workgroup's own rows.
    pub fn rows(&self, coop: Coop) -> u32 {
        self.sg * coop.fs
    }

    /// Bytes of workgroup memory `pass` declares (mirrors the `var<workgroup>` arrays of
    /// attention_coop.wgsl; the ones a pass does not use have one element).
    pub fn workgroup_bytes(&self, pass: Pass, coop: Coop) -> u32 {
        let rows = self.rows(coop);
        let bwd = pass != Pass::Forward;
        let (ds, ps, bc) = (self.dmax + 8, self.bc + 8, self.bc);
        // h_sh: the block's tiles, or the workgroup's own rows on their way into fragments,
        // whichever is larger.
        let block = match pass {
            Pass::Forward => 2 * bc * ds + rows * ps,
            Pass::Dq | Pass::Dkv => 2 * bc * ds + 2 * rows * ps, // one kernel: P and dS
        };
        let halves = block.max(rows * ds);
        let one = |used: bool, n: u32| if used { n } else { 1 };
        let floats = rows * (bc + 4) // sc
            + one(bwd, rows * (bc + 4)) // sc2
            + 2 * one(bwd, bc); // lse_c, dvec_c
        2 * halves + 4 * floats
    }
}

/// The tile of `pass` at padded head dim `dmax` on `coop`: the first of the candidates (most
/// rows per workgroup first) that fits `max_workgroup_bytes`.
pub fn tile(pass: Pass, dmax: u32, coop: Coop, max_workgroup_bytes: u32) -> Option<Tile> {
    // Every pass keeps its outputs in accumulators, so 4 x 16 takes 18-21 KiB at D = 64 (the
    // backward 27 KiB at D = 128) and two workgroups share a core (NVIDIA's Vulkan driver gives a core about 48 KiB of workgroup
    // memory; PROFILING.md). DistilGPT-2 at 4 x 128 on an H200, 2026-11-24: 2 x 16 ran the
    // forward in 32 us against 36 (4 x 16) but dQ in 42 against 36, 1 x 16 slower still.
    let candidates: &[(u32, u32)] = &[(4, 16), (2, 16), (1, 16)];
    forced_tile(pass)
        .into_iter()
        .chain(candidates.iter().copied())
        .map(|(sg, bc)| Tile { sg, bc, dmax })
        .find(|t| {
            t.dmax.is_multiple_of(coop.fs)
                && t.bc.is_multiple_of(coop.fs)
                && t.bc <= t.sg * coop.sgs // a lane fetches a block's lse and D
                && t.workgroup_bytes(pass, coop) <= max_workgroup_bytes
        })
}

/// `WGRAD_ATTN_TILE=SGxBC` (e.g. `4x32`) tries that blocking first for every pass, where it
/// fits; `fwd=SGxBC` or `bwd=SGxBC` (comma-separated, beside a bare one or not) for the forward
/// or the backward alone (a measurement switch). An entry that does not parse is reported on
/// stderr and left out.
fn forced_tile(pass: Pass) -> Option<(u32, u32)> {
    static FORCED: std::sync::OnceLock<[Option<(u32, u32)>; 2]> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| {
        let Ok(s) = std::env::var("WGRAD_ATTN_TILE") else {
            return [None; 2];
        };
        let tile = |t: &str| {
            let (sg, bc) = t.split_once('x')?;
            Some((sg.parse().ok()?, bc.parse().ok()?))
        };
        let (mut both, mut fwd, mut bwd) = (None, None, None);
        for part in s.split(',').map(str::trim) {
            let (slot, t) = match part.split_once('=') {
                Some(("fwd", t)) => (&mut fwd, t),
                Some(("bwd", t)) => (&mut bwd, t),
                None => (&mut both, part),
                Some(_) => {
                    eprintln!("WGRAD_ATTN_TILE: `{part}` is not SGxBC, fwd=SGxBC or bwd=SGxBC");
                    continue;
                }
            };
            match tile(t) {
                Some(v) => *slot = Some(v),
                None => eprintln!("WGRAD_ATTN_TILE: `{part}`: not SGxBC (e.g. 4x16)"),
            }
        }
        [fwd.or(both), bwd.or(both)]
    });
    forced[(pass != Pass::Forward) as usize]
}

/// Whether a block's loads are issued while the block before it works (into registers held
/// across that block's work), rather than just before the block is stored into the tiles.
/// `WGRAD_ATTN_PREFETCH=0` or `=1` (a measurement switch) sets it. Unlike the matmul's f16
/// products, attention keeps the prefetch: on an H100 (2026-11-26) without it the 8 x 512 --amp
/// forward took 133 us a block against 108, the backward 226 against 211, the step 20.93 ms
/// against 20.68.
fn prefetches() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on_off("WGRAD_ATTN_PREFETCH", PREFETCH))
}

/// A measurement switch `var`: `0` off, `1` on, else `default`.
fn on_off(var: &str, default: bool) -> bool {
    match std::env::var(var).as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => default,
    }
}

/// The default of `prefetches`.
const PREFETCH: bool = true;

/// The SYNC snippet: a subgroup waits for its own lanes, where it reads what they wrote of
/// its own rows (scores, P, dS).
const SYNC_SUBGROUP: &str = "fn own_sync() {\n    subgroupBarrier();\n}\n";
/// The SYNC snippet that waits for the whole workgroup (`WGRAD_ATTN_SYNC=workgroup`).
const SYNC_WORKGROUP: &str = "fn own_sync() {\n    workgroupBarrier();\n}\n";

/// Whether `own_sync` waits for the subgroup alone. `WGRAD_ATTN_SYNC=workgroup` (a measurement
/// switch) waits for the workgroup.
fn subgroup_sync() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("WGRAD_ATTN_SYNC").as_deref() != Ok("workgroup"))
}

/// Whether a workgroup whose rows are all inside T (D = DMAX, the views on 16-byte boundaries)
/// stores its output accumulators straight to the outputs (`coopStoreT` into the binding, and
/// loads them so where it accumulates) rather than a fragment at a time through the subgroup's
/// scratch rows, as on the edge of T. `WGRAD_ATTN_DIRECT=0` or `=1` (a measurement switch)
/// sets it.
fn direct_out() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on_off("WGRAD_ATTN_DIRECT", DIRECT_OUT))
}

/// The default of `direct_out`.
const DIRECT_OUT: bool = true;

/// The forward's variant, or (`Pass::Dq` or `Pass::Dkv`) the backward kernel's: `acc_a`
/// adds into dQ and dK instead of overwriting them, `acc_b` into dV.
pub fn spec(pass: Pass, t: Tile, coop: Coop, acc_a: bool, acc_b: bool) -> Spec {
    let (kind, [dq, dk, dv]) = match pass {
        Pass::Forward => (Pass::Forward as u32, [false; 3]),
        Pass::Dq | Pass::Dkv => (KIND_BWD, [acc_a, acc_a, acc_b]),
    };
    coop.with_fragments(Spec::new())
        .u32("KIND", kind)
        .u32("FS", coop.fs)
        .u32("SGS", coop.sgs)
        .u32("SG", t.sg)
        .u32("BC", t.bc)
        .u32("DMAX", t.dmax)
        .bool("ACC_DQ", dq)
        .bool("ACC_DK", dk)
        .bool("ACC_DV", dv)
        .bool("PREFETCH", prefetches())
        .bool("DIRECT_OUT", direct_out())
        .source("OWN", own_source(t.dmax / coop.fs, coop.fs))
        .source(
            "SYNC",
            if subgroup_sync() {
                SYNC_SUBGROUP
            } else {
                SYNC_WORKGROUP
            },
        )
}

/// The OWN snippet for `nf` fragments of `fs` columns across the head dim: the subgroup's own
/// rows' fragments (`oa*`, `ob*`), the backward's output accumulators (`acc*`: dQ or dK;
/// `acc2_*`: dV) as separate variables, and the functions that use them with every loop over
/// them unrolled (a loop the shader compiler keeps would index them at run time and push them
/// out of registers). Generated once per shape and kept for the process.
fn own_source(nf: u32, fs: u32) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static CACHE: Mutex<BTreeMap<(u32, u32), &'static str>> = Mutex::new(BTreeMap::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry((nf, fs))
        .or_insert_with(|| Box::leak(write_own_source(nf, fs).into_boxed_str()))
}

fn write_own_source(nf: u32, fs: u32) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let w = &mut s;
    let frags = || (0..nf).map(move |i| (i, i * fs));
    // One function: its header, a line per fragment, its end.
    let func = |w: &mut String, head: &str, line: &dyn Fn(u32, u32) -> String, end: &str| {
        let _ = writeln!(w, "\n{head}");
        for (i, d) in frags() {
            let _ = writeln!(w, "{}", line(i, d));
        }
        let _ = writeln!(w, "{end}");
    };
    let _ = writeln!(w, "// Generated for {nf} fragments across the head dim.");
    for (i, _) in frags() {
        let _ = writeln!(
            w,
            "var<private> oa{i}: MA;\nvar<private> ob{i}: MA;\nvar<private> acc{i}: MC;\nvar<private> acc2_{i}: MC;"
        );
    }
    for which in ["a", "b"] {
        func(
            w,
            &format!("fn own_{which}(r0: u32) {{"),
            &|i, d| format!("    o{which}{i} = a_tile(0u, r0, {d}u);"),
            "}",
        );
    }
    func(
        w,
        "fn s_only(r0: u32, c0: u32) {\n    var s = MC();",
        &|i, d| format!("    s = coopMultiplyAdd(oa{i}, bt_k(c0, {d}u), s);"),
        "    store_sc(s, r0, c0);\n}",
    );
    func(
        w,
        "fn s_dp(r0: u32, c0: u32) {\n    var s = MC();\n    var dp = MC();",
        &|i, d| {
            format!(
                "    s = coopMultiplyAdd(oa{i}, bt_s(c0, {d}u), s);\n    dp = coopMultiplyAdd(ob{i}, bt_dp(c0, {d}u), dp);"
            )
        },
        "    store_sc(s, r0, c0);\n    store_sc2(dp, r0, c0);\n}",
    );
    func(
        w,
        "fn add_out(r0: u32) {\n    for (var c0 = 0u; c0 < BC; c0 += FS) {\n        let ds = a_out(r0, c0);",
        &|i, d| format!("        acc{i} = coopMultiplyAdd(ds, b_out(c0, {d}u), acc{i});"),
        "    }\n}",
    );
    func(
        w,
        "fn add_dv(r0: u32) {\n    for (var c0 = 0u; c0 < BC; c0 += FS) {\n        let pp = a_pp(r0, c0);",
        &|i, d| format!("        acc2_{i} = coopMultiplyAdd(pp, b_do(c0, {d}u), acc2_{i});"),
        "    }\n}",
    );
    func(
        w,
        "fn zero_out() {",
        &|i, _| format!("    acc{i} = MC();\n    acc2_{i} = MC();"),
        "}",
    );
    // The outputs straight from and to their views (rows row0 + r0..): the first (O, dQ or
    // dK) through `va`, dV through p.dv.
    func(
        w,
        "fn load_out(bh: u32, row0: u32, r0: u32, va: vec4<u32>) {\n    let sa = va.w;",
        &|i, d| {
            format!(
                "    if (ACC_A) {{\n        let i{i} = at(va, bh, row0 + r0, {d}u);\n        acc{i} = coopLoadT<MC>(&out_a[i{i}], sa);\n    }}"
            )
        },
        "}",
    );
    func(
        w,
        "fn load_dv(bh: u32, row0: u32, r0: u32) {\n    let sb = p.dv.w;",
        &|i, d| {
            format!(
                "    if (ACC_DV) {{\n        let j{i} = at(p.dv, bh, row0 + r0, {d}u);\n        acc2_{i} = coopLoadT<MC>(&out_b[j{i}], sb);\n    }}"
            )
        },
        "}",
    );
    func(
        w,
        "fn store_out(bh: u32, row0: u32, r0: u32, va: vec4<u32>) {\n    let sa = va.w;",
        &|i, d| {
            format!(
                "    let i{i} = at(va, bh, row0 + r0, {d}u);\n    coopStoreT(acc{i}, &out_a[i{i}], sa);"
            )
        },
        "}",
    );
    func(
        w,
        "fn store_dv(bh: u32, row0: u32, r0: u32) {\n    let sb = p.dv.w;",
        &|i, d| {
            format!(
                "    let j{i} = at(p.dv, bh, row0 + r0, {d}u);\n    coopStoreT(acc2_{i}, &out_b[j{i}], sb);"
            )
        },
        "}",
    );
    // The forward's O rows times the lane's row factor f: each fragment through the
    // subgroup's own scratch rows and back (subgroup barriers: the subgroup's lanes alone take
    // this branch).
    func(
        w,
        "fn rescale_out(r0: u32, row: u32, part: u32, f: f32) {",
        &|i, _| {
            format!(
                "    store_sc(acc{i}, r0, 0u);\n    subgroupBarrier();\n    scale_row(row, part, f);\n    subgroupBarrier();\n    acc{i} = load_sc(r0, 0u);\n    subgroupBarrier();"
            )
        },
        "}",
    );
    // On the edge of T or D (or without `direct_out`): one fragment at a time through the
    // subgroup's own scratch rows (so the subgroup waits for its own lanes).
    func(
        w,
        "fn edge_store(bh: u32, row0: u32, r0: u32, lane: u32, va: vec4<u32>) {",
        &|i, d| {
            format!(
                "    store_sc(acc{i}, r0, 0u);\n    own_sync();\n    edge_out(0u, va, ACC_A, bh, row0, r0, {d}u, lane);\n    own_sync();"
            )
        },
        "}",
    );
    func(
        w,
        "fn edge_dv(bh: u32, row0: u32, r0: u32, lane: u32) {",
        &|i, d| {
            format!(
                "    store_sc(acc2_{i}, r0, 0u);\n    own_sync();\n    edge_out(1u, p.dv, ACC_DV, bh, row0, r0, {d}u, lane);\n    own_sync();"
            )
        },
        "}",
    );
    s
}

/// Every variant on `coop` with `max_workgroup_bytes`: each pass, padded head dim and
/// accumulate flag.
pub fn variants(coop: Coop, max_workgroup_bytes: u32) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    for dmax in HEAD_DIMS {
        for pass in [Pass::Forward, Pass::Dq, Pass::Dkv] {
            let Some(t) = tile(pass, dmax, coop, max_workgroup_bytes) else {
                continue;
            };
            // The backward (one kernel for both passes) adds into all its outputs or none.
            let accs: &[(bool, bool)] = match pass {
                Pass::Forward => &[(false, false)],
                Pass::Dq => continue,
                Pass::Dkv => &[(false, false), (true, true)],
            };
            for &(a, b) in accs {
                v.push((kernel(pass), spec(pass, t, coop, a, b)));
            }
        }
    }
    v.push((&ATTN_D, Spec::new()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pass_and_head_dim_has_a_tile_on_nvidia_and_apple() {
        for (coop, limit) in [(Coop::NVIDIA, 49152), (Coop::APPLE, 32768)] {
            for dmax in HEAD_DIMS {
                for pass in [Pass::Forward, Pass::Dq, Pass::Dkv] {
                    let t = tile(pass, dmax, coop, limit);
                    assert!(t.is_some(), "{pass:?} at D {dmax} on {coop:?}");
                }
            }
        }
    }
}
