//! Launcher of `wgsl/attention_coop.wgsl` (and `attention_coop_passes.wgsl`, composed after it):
//! fused causal attention on cooperative matrices, the mixed-precision counterpart of
//! `attention` (same params and algorithm, the forward in one pass with its row max kept stale;
//! f16 products, f32 softmax and accumulation; its backward is one dispatch of both passes
//! after `wgsl/attention_d.wgsl`'s D). Chosen for an autocast
//! forward on adapters with cooperative matrices, when D and every view's offset and strides
//! are multiples of 4 (the kernels read q, k, v, dO four elements at a time). q, k, v, dO and
//! the outputs are each f32 or f16 (`Io`).

use super::attention::{AttentionParams, Pass, HEAD_DIMS};
use super::matmul_coop::Coop;
use super::{Access, DType, Family, KernelDesc, Spec};

pub static FAMILY: Family = Family {
    name: "attention_coop",
    source: concat!(
        include_str!("../../wgsl/attention_coop.wgsl"),
        include_str!("../../wgsl/attention_coop_passes.wgsl")
    ),
    workgroup_reduce: false,
};

const PARAMS: u64 = std::mem::size_of::<AttentionParams>() as u64;

/// O (B, H, T, D), lse (B, H, T) <- q, k, v (and the rotary table), in one pass over the keys
/// (the row max kept stale, O rescaled where it moves). The backward's dO, lse and D slots are
/// laid out unread, so the table has one binding (9) in both entry points.
pub static ATTN_COOP_FWD: KernelDesc = KernelDesc {
    name: "attn_coop_fwd",
    family: &FAMILY,
    storage: &[
        Access::ReadWrite, // O
        Access::ReadWrite, // lse
        Access::Read,      // q
        Access::Read,      // k
        Access::Read,      // v
        Access::Read,      // - (dO)
        Access::Read,      // - (lse)
        Access::Read,      // - (D)
        Access::Read,      // rotary table (positions, D)
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
        Access::Read,      // rotary table (positions, D)
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

/// `ATTN_D`'s variant for dO of `grad` elements and O of `out` (each f32 or f16).
pub fn d_spec(grad: DType, out: DType) -> Spec {
    Spec::new().ty("GT", grad.wgsl()).ty("OT", out.wgsl())
}

/// The element types of a pass's bindings, each f32 or f16: q, k and v (`input`), dO
/// (`grad`), and the outputs (`out`: O; or dQ, dK and dV). Under autocast the engine stores
/// q, k, v, O and their gradients f16 where their producers and consumers are products that
/// round them to f16 anyway (`ops::attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Io {
    pub input: DType,
    pub grad: DType,
    pub out: DType,
}

impl Io {
    /// Every binding f32.
    pub const F32: Io = Io {
        input: DType::F32,
        grad: DType::F32,
        out: DType::F32,
    };
}

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
        // The f32 arrays are of vectors of 4: an unused one takes one vector.
        let one = |used: bool, n: u32| if used { n } else { 4 };
        let floats = rows * (bc + 8) // sc
            + one(bwd, rows * (bc + 8)) // sc2
            + 2 * one(bwd, bc); // lse_c, dvec_c
        2 * halves + 4 * floats
    }
}

/// The tile of `pass` at padded head dim `dmax` on `coop`: the first of the candidates (most
/// rows per workgroup first) that fits `max_workgroup_bytes`.
pub fn tile(pass: Pass, dmax: u32, coop: Coop, max_workgroup_bytes: u32) -> Option<Tile> {
    tile_or(pass, dmax, coop, max_workgroup_bytes, None)
}

/// `tile`, trying `forced` (subgroups, block rows: a `lab` build's `WGRAD_ATTN_TILE`) first.
pub fn tile_or(
    pass: Pass,
    dmax: u32,
    coop: Coop,
    max_workgroup_bytes: u32,
    forced: Option<(u32, u32)>,
) -> Option<Tile> {
    // Every pass keeps its outputs in accumulators, so 4 x 16 takes 15 KiB (forward) and 23 KiB
    // (backward) at D = 64, the backward 29 KiB at D = 128, and two or three workgroups share a
    // core (NVIDIA's Vulkan driver gives a core about 48 KiB of workgroup memory;
    // PROFILING.md). DistilGPT-2 at 4 x 128 on an H200, 2026-11-24: 2 x 16 ran the
    // forward in 32 us against 36 (4 x 16) but dQ in 42 against 36, 1 x 16 slower still.
    let candidates: &[(u32, u32)] = &[(4, 16), (2, 16), (1, 16)];
    forced
        .into_iter()
        .chain(candidates.iter().copied())
        .map(|(sg, bc)| Tile { sg, bc, dmax })
        .find(|t| {
            t.dmax.is_multiple_of(coop.fs)
                && t.bc.is_multiple_of(coop.fs)
                && (t.bc * coop.fs / coop.sgs).is_multiple_of(4) // a lane's columns, 4 at a time
                && t.bc <= t.sg * coop.sgs // a lane fetches a block's lse and D
                && t.workgroup_bytes(pass, coop) <= max_workgroup_bytes
        })
}

/// Whether a block's loads are issued while the block before it works (into registers held
/// across that block's work), rather than just before the block is stored into the tiles.
/// Unlike the matmul's f16 products, attention keeps the prefetch: on an H100 (2026-11-26)
/// without it the 8 x 512 --amp forward took 133 us a block against 108, the backward 226
/// against 211, the step 20.93 ms against 20.68 (docs/decisions.md).
const PREFETCH: bool = true;

/// The SYNC snippet: a subgroup waits for its own lanes, where it reads what they wrote of
/// its own rows (scores, P, dS).
const SYNC_SUBGROUP: &str = "fn own_sync() {\n    subgroupBarrier();\n}\n";
/// The SYNC snippet that waits for the whole workgroup (`workgroup_sync`).
const SYNC_WORKGROUP: &str = "fn own_sync() {\n    workgroupBarrier();\n}\n";

/// `spec` with its subgroups waiting for the whole workgroup where they read what their own
/// lanes wrote (`AttentionSync::Workgroup`: for a driver whose subgroup barrier does not order
/// workgroup memory; NVIDIA's does).
pub fn workgroup_sync(spec: Spec) -> Spec {
    spec.with_source("SYNC", SYNC_WORKGROUP)
}

/// Whether a workgroup whose rows are all inside T (D = DMAX, the views on 16-byte boundaries)
/// stores its f32 output accumulators straight to the outputs (`coopStoreT` into the binding,
/// and loads them so where it accumulates) rather than a fragment at a time through the
/// subgroup's scratch rows, as on the edge of T: measured faster on an H100
/// (docs/decisions.md).
const DIRECT_OUT: bool = true;

/// The forward's variant, or (`Pass::Dq` or `Pass::Dkv`) the backward kernel's: `acc_a`
/// adds into dQ and dK instead of overwriting them, `acc_b` into dV; `io` the bindings' types
/// (the forward's `grad` unused). f16 outputs pass the scratch rows (no straight stores), 4
/// elements a lane: their views' offsets and strides must be multiples of 4 (`aligned4`).
pub fn spec(pass: Pass, t: Tile, coop: Coop, acc_a: bool, acc_b: bool, io: Io) -> Spec {
    let (kind, [dq, dk, dv]) = match pass {
        Pass::Forward => (Pass::Forward as u32, [false; 3]),
        Pass::Dq | Pass::Dkv => (KIND_BWD, [acc_a, acc_a, acc_b]),
    };
    let fwd = pass == Pass::Forward;
    // The forward's grad is unbound: its type is the inputs', so NX1 (v) follows them.
    let grad = if fwd { io.input } else { io.grad };
    let out32 = io.out == DType::F32;
    // f16 outputs are bound as u32 words of two halves; the forward's out_b is lse, f32.
    let out_a = if out32 { "f32" } else { "u32" };
    let out_b = if fwd { "f32" } else { out_a };
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
        .bool("PREFETCH", PREFETCH)
        .bool("DIRECT_OUT", DIRECT_OUT && out32)
        .bool("OUT_F32", out32)
        .ty("OA", out_a)
        .ty("OB", out_b)
        .source("READ", read_source(io.input, grad))
        .source("OWN", own_source(t.dmax / coop.fs, coop.fs, out32))
        .source("SYNC", SYNC_SUBGROUP)
        .bool("ROPE", false)
        .u32("ABLATE", 0)
}

/// `spec` with parts of its block loop left out (a `lab` build's `WGRAD_ATTN_ABLATE`; the
/// results are wrong): bits of attention_coop.wgsl's ABLATE, 16 the subgroup waits.
pub fn ablated(spec: Spec, bits: u32) -> Spec {
    let spec = spec.with_u32("ABLATE", bits);
    if bits & 16 != 0 {
        spec.with_source("SYNC", "fn own_sync() {\n}\n")
    } else {
        spec
    }
}

/// Whether the kernels take a rotary embedding at head dim `d` on `coop`: D fills its padded
/// head dim (no column past D among the fragments) and D/2 is a whole number of fragments (dQ
/// and dK are rotated back a pair of fragments at a time, `edge_rope`).
pub fn takes_rope(d: usize, dmax: u32, coop: Coop) -> bool {
    d == dmax as usize && (d / 2).is_multiple_of(coop.fs as usize)
}

/// The READ snippet: the binding types of q, k, v (QV) and dO (GV), 4 elements an entry
/// (`vec4<f32>`; f16 as `vec2<u32>`, u32 words of two halves: on an H100, DistilGPT-2 8 x 512
/// --amp, 2026-11-27, the backward read them in 213.5 us a dispatch against 231.6 as f16
/// vectors, the forward in 88.3 against 94.9; docs/decisions.md), `qf` / `gf` making an entry
/// an f32 vector, and NX1, the registers holding the next block's v or dO: an entry as bound
/// where both are bound alike, else an f32 vector (`q_nx1`, `g_nx1` to it, `nx1f` from it).
/// Generated once per type set and kept for the process.
fn read_source(input: DType, grad: DType) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    type Key = (bool, bool);
    static CACHE: Mutex<BTreeMap<Key, &'static str>> = Mutex::new(BTreeMap::new());
    let key = (input == DType::F16, grad == DType::F16);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache.entry(key).or_insert_with(|| {
        // (binding type, its entry as an f32 vector of `x`)
        let bound = |half: bool| match half {
            false => ("vec4<f32>", "x"),
            true => (
                "vec2<u32>",
                "vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y))",
            ),
        };
        let (qv, qf) = bound(key.0);
        let (gv, gf) = bound(key.1);
        let (nx1, q_nx1, g_nx1, nx1f) = if qv == gv {
            (qv, "x", "x", qf)
        } else {
            ("vec4<f32>", qf, gf, "x")
        };
        let text = format!(
            "alias QV = {qv};\nalias GV = {gv};\nalias NX1 = {nx1};\n\
             fn qf(x: QV) -> vec4<f32> {{\n    return {qf};\n}}\n\
             fn gf(x: GV) -> vec4<f32> {{\n    return {gf};\n}}\n\
             fn q_nx1(x: QV) -> NX1 {{\n    return {q_nx1};\n}}\n\
             fn g_nx1(x: GV) -> NX1 {{\n    return {g_nx1};\n}}\n\
             fn nx1f(x: NX1) -> vec4<f32> {{\n    return {nx1f};\n}}\n"
        );
        Box::leak(text.into_boxed_str())
    })
}

/// The OWN snippet for `nf` fragments of `fs` columns across the head dim: the subgroup's own
/// rows' fragments (`oa*`, `ob*`), the backward's output accumulators (`acc*`: dQ or dK;
/// `acc2_*`: dV) as separate variables, and the functions that use them with every loop over
/// them unrolled (a loop the shader compiler keeps would index them at run time and push them
/// out of registers). `out32`: the outputs are f32, which the direct functions (`load_out`,
/// `store_out`, `load_dv`, `store_dv`) load and store straight; for f16 outputs their bodies
/// are empty (DIRECT_OUT is off: an f32 accumulator cannot be stored into f16, and the WGSL's
/// const_assert holds the launcher to it). Generated once per shape and kept for the process.
fn own_source(nf: u32, fs: u32, out32: bool) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static CACHE: Mutex<BTreeMap<(u32, u32, bool), &'static str>> = Mutex::new(BTreeMap::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry((nf, fs, out32))
        .or_insert_with(|| Box::leak(write_own_source(nf, fs, out32).into_boxed_str()))
}

fn write_own_source(nf: u32, fs: u32, out32: bool) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let w = &mut s;
    let frags = || (0..nf).map(move |i| (i, i * fs));
    // One function: its header, a line per fragment, its end.
    let func = |w: &mut String, head: &str, line: &dyn Fn(u32, u32) -> String, end: &str| {
        let _ = writeln!(w, "\n{head}");
        for (i, d) in frags() {
            let l = line(i, d);
            if !l.is_empty() {
                let _ = writeln!(w, "{l}");
            }
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
        "fn add_dv(r0: u32) {\n    for (var c0 = 0u; c0 < BC; c0 += FS) {\n        let pp = a_scores(PP_OFF, r0, c0);",
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
    // dK) through `va`, dV through p.dv. f32 outputs only: for f16 ones, no line.
    let direct = |line: String| {
        if out32 {
            line
        } else {
            String::new()
        }
    };
    func(
        w,
        "fn load_out(bh: u32, row0: u32, r0: u32, va: vec4<u32>) {\n    let sa = va.w;",
        &|i, d| {
            direct(format!(
                "    if (ACC_A) {{\n        let i{i} = at(va, bh, row0 + r0, {d}u);\n        acc{i} = coopLoadT<MC>(&out_a[i{i}], sa);\n    }}"
            ))
        },
        "}",
    );
    func(
        w,
        "fn load_dv(bh: u32, row0: u32, r0: u32) {\n    let sb = p.dv.w;",
        &|i, d| {
            direct(format!(
                "    if (ACC_DV) {{\n        let j{i} = at(p.dv, bh, row0 + r0, {d}u);\n        acc2_{i} = coopLoadT<MC>(&out_b[j{i}], sb);\n    }}"
            ))
        },
        "}",
    );
    func(
        w,
        "fn store_out(bh: u32, row0: u32, r0: u32, va: vec4<u32>) {\n    let sa = va.w;",
        &|i, d| {
            direct(format!(
                "    let i{i} = at(va, bh, row0 + r0, {d}u);\n    coopStoreT(acc{i}, &out_a[i{i}], sa);"
            ))
        },
        "}",
    );
    func(
        w,
        "fn store_dv(bh: u32, row0: u32, r0: u32) {\n    let sb = p.dv.w;",
        &|i, d| {
            direct(format!(
                "    let j{i} = at(p.dv, bh, row0 + r0, {d}u);\n    coopStoreT(acc2_{i}, &out_b[j{i}], sb);"
            ))
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
    // ROPE: dQ or dK a pair of fragments at a time (d0 and d0 + D/2, D = DMAX) through the
    // subgroup's scratch rows, rotated back (`edge_rope`). No line for an odd count (the
    // launcher runs no rotary embedding there, `takes_rope`).
    let _ = writeln!(
        w,
        "\nfn edge_store_rope(bh: u32, row0: u32, r0: u32, lane: u32, va: vec4<u32>) {{"
    );
    if nf.is_multiple_of(2) {
        for i in 0..nf / 2 {
            let _ = writeln!(
                w,
                "    store_sc(acc{i}, r0, 0u);\n    store_sc2(acc{}, r0, 0u);\n    own_sync();\n    edge_rope(va, bh, row0, r0, {}u, lane);\n    own_sync();",
                i + nf / 2,
                i * fs
            );
        }
    }
    let _ = writeln!(w, "}}");
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

/// Every variant on `coop` with `max_workgroup_bytes`: each pass, padded head dim, accumulate
/// flag and binding types the engine makes (`Io::made`), without and (where `takes_rope` at
/// D = DMAX) with a rotary embedding.
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
            let ropes: &[bool] = match takes_rope(dmax as usize, dmax, coop) {
                true => &[false, true],
                false => &[false],
            };
            for &rope in ropes {
                for io in Io::made(pass) {
                    for &(a, b) in accs {
                        let s = spec(pass, t, coop, a, b, io);
                        v.push((kernel(pass), super::attention::with_rope(s, rope)));
                    }
                }
            }
        }
    }
    // D reads dO and O (whose type is the inputs': the forward's `out`).
    for (grad, o) in [
        (DType::F32, DType::F32),
        (DType::F16, DType::F16),
        (DType::F32, DType::F16),
    ] {
        v.push((&ATTN_D, d_spec(grad, o)));
    }
    v
}

impl Io {
    /// The types the engine binds for `pass`: all f32; or f16 inputs, whose forward writes an
    /// f16 O, and whose backward reads dO and writes the gradients as f32 or f16 (each f16
    /// where its only producer or consumer is a product under autocast).
    pub fn made(pass: Pass) -> Vec<Io> {
        use DType::{F16, F32};
        let io = |input, grad, out| Io { input, grad, out };
        match pass {
            // f16 inputs with an f32 O: f16 inputs where the precision keeps O f32.
            Pass::Forward => vec![Io::F32, io(F16, F16, F16), io(F16, F16, F32)],
            Pass::Dq | Pass::Dkv => vec![
                Io::F32,
                io(F16, F16, F16),
                io(F16, F16, F32),
                io(F16, F32, F16),
                io(F16, F32, F32),
            ],
        }
    }
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
