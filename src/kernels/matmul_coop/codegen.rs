//! The WGSL of the cooperative-matrix matmul generated per variant (`Variant::spec` takes it
//! as snippets): the operands' loads (READ: `read_source`) and the unrolled body of the main
//! loop and epilogue (UNROLLED: `generated`). `wgrad wgsl coop:TILE[:ENTRY]` prints a
//! variant's whole composed source.

use super::{Ablation, Coop, CoopTile};
use crate::kernels::DType;

/// The part of the kernel generated per tile shape: FM x FN accumulators and the UA + UB
/// units a lane keeps in flight, as separate variables, with every loop over them unrolled
/// (a loop the shader compiler keeps would index them at run time and push them out of
/// registers). Generated once per shape and kept for the process.
pub(super) fn generated(t: CoopTile, coop: Coop, x3: bool, ablation: Ablation) -> &'static str {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    type Key = (CoopTile, u32, u32, bool, Ablation);
    static CACHE: Mutex<BTreeMap<Key, &'static str>> = Mutex::new(BTreeMap::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry((t, coop.fs, coop.sgs, x3, ablation))
        .or_insert_with(|| Box::leak(unrolled_source(t, coop, x3, ablation).into_boxed_str()))
}

/// The READ snippet: for each operand x = a, b, `UnitX` (a unit as loaded, in f16), `unit_x(i,
/// st, nv)` (its loads, always issued) and `half_x(u)` (masked to nv), written for the
/// operand's element type and binding: vectors of 4, or (`wide` f16) 16-byte units
/// (`operand_vec`). With A_VEC / B_VEC a unit is one or two vector loads, else 8 gathered
/// elements. Generated once per combination and kept for the process.
///
/// With `x3` (f32 operands) a unit stays f32 until its store, where `half_x` gives its scaled
/// high part and `low_x` its low part.
pub(super) fn read_source(a: (DType, bool), b: (DType, bool), x3: bool) -> &'static str {
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
    // f32: two vector loads (4 elements each). f16: u32 words of two halves each, unpacked as
    // they are loaded (as f16 vectors or matrices of halves, 4096³ ran at 210 TFLOP/s against
    // 229 on an H100, 2026-11-27; docs/decisions.md): one 16-byte load of 8 halves (`wide`),
    // or two 8-byte ones. `elem`: element e.
    let (vec_load, elem, binding) = match (dtype, wide) {
        (DType::F16, true) => (
            format!(
                "let w = {x}[first >> 3u];\n        \
                 u.lo = vec4<f16>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)));\n        \
                 u.hi = vec4<f16>(vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));"
            ),
            format!("f16(unpack2x16float({x}[e >> 3u][(e >> 1u) & 3u])[e & 1u])"),
            "16-byte units (vec4<u32>: two halves a word)",
        ),
        (DType::F16, false) => (
            format!(
                "let l = {x}[first >> 2u];\n        let h = {x}[(first >> 2u) + 1u];\n        \
                 u.lo = vec4<f16>(vec4<f32>(unpack2x16float(l.x), unpack2x16float(l.y)));\n        \
                 u.hi = vec4<f16>(vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y)));"
            ),
            format!("f16(unpack2x16float({x}[e >> 2u][(e >> 1u) & 1u])[e & 1u])"),
            "vectors of 4 (vec2<u32>: two halves a word)",
        ),
        _ => (
            format!(
                "u.lo = vec4<f16>({x}[first >> 2u]);\n        u.hi = vec4<f16>({x}[(first >> 2u) + 1u]);"
            ),
            format!("f16({x}[e >> 2u][e & 3u])"),
            "vectors of 4",
        ),
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

/// Accumulators the scratch epilogue stores (EPI_FRAGS in the WGSL): all of them, or one with
/// the epilogue ablated (`noepilogue`).
pub(super) fn epi_frags(t: CoopTile, ablation: Ablation) -> u32 {
    if ablation.leaves_out("noepilogue") {
        1
    } else {
        t.fm * t.fn_
    }
}

/// The UNROLLED snippet: the per-tile-shape body of `product`, `spill`, `zero_acc` and, with
/// `x3`, the low parts' stores. `ablation` (a `lab` build's) leaves parts out to time the
/// rest (`Ablation`); what is left runs as it would, so the time of a part is the difference.
///
/// Whether a one-stage tile's loop fetches the next step's units while this step multiplies
/// (the units held in registers across the multiply), rather than loading, storing and then
/// multiplying each step in turn, depends on the operands: on an H100 (2026-11-26) f16
/// products ran faster in turn (4096³ 158.3 -> 172.6 TFLOP/s; the 8 x 512 --amp step 21.8 ->
/// 20.8 ms), X3 products (f32 units, twice the registers) faster with the prefetch (4096³ 60.4
/// -> 65.7 TFLOP/s; the 8 x 512 f32 step 48.9 -> 44.3 ms). So X3 prefetches and the f16 kernel
/// does not. Two-stage tiles always overlap.
fn unrolled_source(t: CoopTile, coop: Coop, x3: bool, ablation: Ablation) -> String {
    use std::fmt::Write as _;
    let off = |what: &str| ablation.leaves_out(what);
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
    // Padding (a `lab` build's ablation) declares that much more workgroup memory, touched so
    // the compiler keeps it: how the time moves with it tells how many workgroups share a core.
    let pad = ablation.pad_bytes();
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
    let _ = writeln!(
        w,
        "}}\n\n// Adds the workgroup's tile of A @ B into the subgroup's accumulators (with one stage, each\n\
         // step's units loaded and stored before it multiplies, or the next step's fetched while it\n\
         // multiplies); a whole tile's units through `fetch_whole`.\n\
         fn product(wid: vec3<u32>, lid: u32, sg: u32) {{\n    let sm = sg / SG_N;\n    let sn = sg % SG_N;\n    k_range(wid);"
    );
    let in_turn = off("noprefetch") || !x3;
    // A loop of their own for tiles inside C: a branch a step between the two fetches took 222
    // registers a lane against 207 and ran 4096³ at 168 TFLOP/s against 195 (every tile
    // through the bounded loads: 172). The ragged last step of such a tile, and every step of
    // the others, go through one bounded loop after it: two copies of the loop, not three (a
    // copy for the ragged step had doubled what the driver compiles: 0.8-1.15 s for the
    // longest variants on an H100 against 0.41 with the bounded loop alone, 2026-11-27).
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
    let _ = writeln!(
        w,
        "// Accumulator f into the subgroup's scratch tile (row-major FS x FS).\n\
         fn spill(f: u32, sg: u32) {{\n    let off = sg * FE;\n    let s = FS;\n    switch f {{"
    );
    let folded = off("noepilogue");
    if folded {
        // Every accumulator folded into the one spilled fragment (EPI_FRAGS 1), so the
        // product is kept and the epilogue is a sixteenth or so of its own.
        let sum: Vec<String> = (0..fm * fn_).map(|f| format!("acc{f}")).collect();
        let _ = writeln!(
            w,
            "        case 0u: {{ let all = {}; coopStoreT(all, &c_sh[off], s); }}",
            sum.join(" + ")
        );
    }
    for f in (folded as u32)..fm * fn_ {
        let _ = writeln!(
            w,
            "        case {f}u: {{ coopStoreT(acc{f}, &c_sh[off], s); }}"
        );
    }
    let _ = writeln!(w, "        default: {{}}\n    }}\n}}");
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
        parts = crate::kernels::absmax::PARTS
    );
}

/// What an operand is bound as: vectors of 4 elements, or (`wide` f16) 8 halves in 16 bytes;
/// f16 as u32 words of two halves (naga has no bitcast from a word to a pair of halves).
pub(super) fn operand_vec(t: DType, wide: bool) -> &'static str {
    match t {
        DType::F16 if wide => "vec4<u32>",
        DType::F16 => "vec2<u32>",
        _ => vec4_of(t),
    }
}

/// The vector of 4 C is bound as where the epilogue stores 4 columns at once.
pub(super) fn vec4_of(t: DType) -> &'static str {
    match t {
        DType::F16 => "vec4<f16>",
        _ => "vec4<f32>",
    }
}

#[cfg(test)]
mod tests {
    use super::super::{COOP_TILES, X3_TILES};
    use super::*;

    #[test]
    fn the_generated_part_names_every_accumulator_and_unit_once() {
        let none = Ablation::NONE;
        let t = COOP_TILES[0];
        let src = generated(t, Coop::NVIDIA, false, none);
        let frags = (t.fm * t.fn_) as usize;
        assert_eq!(src.matches("var<private> acc").count(), frags);
        // Each accumulator spilled to the scratch tile once, nothing stored straight to C.
        assert_eq!(src.matches("coopStoreT(acc").count(), frags);
        assert_eq!(src.matches("&c[").count(), 0);
        // Every accumulator multiplies once per fragment of K in a step.
        let kf = (t.bk / Coop::NVIDIA.fs) as usize;
        assert_eq!(src.matches("coopMultiplyAdd").count(), frags * kf);
        // Two loops over K: a tile inside C's whole steps without bounds, then one bounded
        // loop for its ragged last step and every step of the other tiles.
        let product = &src[src.find("fn product(").unwrap()..src.find("fn spill(").unwrap()];
        assert_eq!(product.matches("multiply(sm, sn, 0u);").count(), 2);
        assert_eq!(product.matches("fetch_whole(wid, lid, k0);").count(), 1);
        assert_eq!(product.matches("fetch_units(wid, lid, k0);").count(), 1);
        assert!(
            product.contains("k0 = k_lo; k0 < k_mid;")
                && product.contains("k_from = k_mid;")
                && product.contains("k0 = k_from; k0 < k_hi;")
        );
        // Generated once: the same text (address) for the same tile.
        assert!(std::ptr::eq(src, generated(t, Coop::NVIDIA, false, none)));
        // X3: three multiply-adds a fragment pair, the low parts from the stages after the
        // high parts', every unit stored twice, the next step fetched during the multiply.
        let t3 = X3_TILES[0];
        let x3 = generated(t3, Coop::NVIDIA, true, none);
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
        assert!(x3.contains("fetch_units(wid, lid, k0 + BK);"));
        assert!(!src.contains("fetch_units(wid, lid, k0 + BK);"));
        assert!(x3.contains("@binding(6)") && !src.contains("@binding(6)"));
    }

    /// A `lab` build's ablations change the generated text (and so the variant), and an empty
    /// one is the default build's.
    #[cfg(feature = "lab")]
    #[test]
    fn ablations_leave_their_parts_out() {
        let t = COOP_TILES[0];
        let full = generated(t, Coop::NVIDIA, false, Ablation::NONE);
        let ab = Ablation::parse("nomultiply,noepilogue").expect("known parts");
        let cut = generated(t, Coop::NVIDIA, false, ab);
        assert_eq!(cut.matches("coopMultiplyAdd").count(), 0);
        // The scratch epilogue spills one fragment (EPI_FRAGS 1): the accumulators' sum.
        assert!(cut.contains("case 0u: { let all = acc0 + acc1"), "{cut}");
        assert!(!full.contains("let all ="));
        assert!(full.matches("coopMultiplyAdd").count() > 0);
        assert_eq!((epi_frags(t, ab), epi_frags(t, Ablation::NONE)), (1, 16));
        assert_eq!(Ablation::parse("nosuch"), Err("nosuch".to_string()));
    }
}
