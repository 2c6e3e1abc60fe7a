// attention_coop.wgsl, continued (composed right after it, src/kernels/attention_coop.rs):
// the cooperative fragments, the outputs, and the forward and backward entry points.

// ------------------------------------------------------------------------------------------
// Fragments: A operands (rows x inner) and B operands (inner x cols), row-major from a
// [row][inner] tile or column-major (the transpose) from a [col][inner] tile.

fn a_tile(off: u32, r0: u32, d0: u32) -> MA {
    let i = off + r0 * DS + d0;
    let v = i / 4u;
    let s = DS / 4u;
    return coopLoadT<MA>(&h_sh[v], s);
}

// (rows r0.., columns c0..) of the [row][col] P or dS tile at `off` (PP_OFF, DS_OFF).
fn a_scores(off: u32, r0: u32, c0: u32) -> MA {
    let i = off + r0 * PS + c0;
    let v = i / 4u;
    let s = PS / 4u;
    return coopLoadT<MA>(&h_sh[v], s);
}

// (d0.., rows c0..) of the transpose of the [row][d] tile at `off`: column-major.
fn bt_tile(off: u32, c0: u32, d0: u32) -> MB {
    let i = off + c0 * DS + d0;
    let v = i / 4u;
    let s = DS / 4u;
    return coopLoad<MB>(&h_sh[v], s);
}

fn bt_k(c0: u32, d0: u32) -> MB {
    return bt_tile(K_OFF, c0, d0);
}

fn bt_v(c0: u32, d0: u32) -> MB {
    return bt_tile(V_OFF, c0, d0);
}

// (rows r0.., d0..) of the [row][d] tile at `off` as a B operand: row-major.
fn b_tile(off: u32, r0: u32, d0: u32) -> MB {
    let i = off + r0 * DS + d0;
    let v = i / 4u;
    let s = DS / 4u;
    return coopLoadT<MB>(&h_sh[v], s);
}

fn b_k(r0: u32, d0: u32) -> MB {
    return b_tile(K_OFF, r0, d0);
}

fn b_v(r0: u32, d0: u32) -> MB {
    return b_tile(V_OFF, r0, d0);
}

fn b_do(r0: u32, d0: u32) -> MB {
    return b_tile(DO_OFF, r0, d0);
}

// The backward's B operands: of S (k^T for dQ, (scale q)^T for dK/dV), of dP (v^T, dO^T) and
// of the dS product into the first output (k, scale q). Both passes stage them at the same
// offsets (Q_OFF = K_OFF, DO_OFF = V_OFF), so one workgroup's pass needs no branch around the
// cooperative loads (naga takes a branch on a function's argument as non-uniform).
const_assert Q_OFF == K_OFF && DO_OFF == V_OFF;

fn bt_s(c0: u32, d0: u32) -> MB {
    return bt_k(c0, d0);
}

fn bt_dp(c0: u32, d0: u32) -> MB {
    return bt_v(c0, d0);
}

// The forward's P v, or the backward's dS k (dQ) and dS^T (scale q) (dK/dV).
fn b_out(c0: u32, d0: u32) -> MB {
    if (KIND == KIND_FWD) {
        return b_v(c0, d0);
    }
    return b_k(c0, d0);
}

// Fragments to and from the scratch rows (columns c0.., a multiple of 4).
fn store_sc(acc: MC, r0: u32, c0: u32) {
    let i = (r0 * SW + c0) / 4u;
    let s = SW / 4u;
    coopStoreT(acc, &sc[i], s);
}

fn load_sc(r0: u32, c0: u32) -> MC {
    let i = (r0 * SW + c0) / 4u;
    let s = SW / 4u;
    return coopLoadT<MC>(&sc[i], s);
}

fn store_sc2(acc: MC, r0: u32, c0: u32) {
    let i = (r0 * SW2 + c0) / 4u;
    let s = SW2 / 4u;
    coopStoreT(acc, &sc2[i], s);
}

// Element i of the scratch, and the 4 from i (a multiple of 4).
fn sc_at(i: u32) -> f32 {
    return sc[i / 4u][i % 4u];
}

fn sc4(i: u32) -> vec4<f32> {
    return sc[i / 4u];
}

fn sc2_4(i: u32) -> vec4<f32> {
    return sc2[i / 4u];
}

// The first of a lane's k-th group of 4 columns of a [row][BC] block (part: its place among
// its row's LPR lanes), and the 4 columns' offsets from it.
fn col4(part: u32, k: u32) -> u32 {
    return (part + k * LPR) * 4u;
}

const OFFS4: vec4<u32> = vec4<u32>(0u, 1u, 2u, 3u);

// The lane's part of its scratch row `row` (the FS columns of a fragment stored there) times f.
fn scale_row(row: u32, part: u32, f: f32) {
    let w = FS / LPR;
    for (var j = 0u; j < w; j++) {
        let i = row * SW + part * w + j;
        sc[i / 4u][i % 4u] *= f;
    }
}

// Row max and row sum over the LPR lanes sharing a scratch row (consecutive lanes).
fn row_max(x: f32) -> f32 {
    var m = x;
    for (var o = 1u; o < LPR; o <<= 1u) {
        m = max(m, subgroupShuffleXor(m, o));
    }
    return m;
}

fn row_sum(x: f32) -> f32 {
    var s = x;
    for (var o = 1u; o < LPR; o <<= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}

// ------------------------------------------------------------------------------------------
// Every pass keeps its outputs (O; dQ; dK and dV) in accumulators across blocks. The OWN
// snippet, generated per DMAX, holds them and the subgroup's own rows' fragments as separate
// variables: `own_a(r0)` / `own_b(r0)` load those fragments (q; q and dO; k and v) from the
// start of h_sh; `s_only(r0, c0)` stores a block's S fragment to the scratch, `s_dp(r0, c0)`
// its S and dP fragments (S^T and dP^T for dK/dV); `add_out(r0)` adds the block's product
// into the first output (P v; scale dS k; dS^T (scale q)), `add_dv(r0)` P^T dO into dV;
// `zero_out()`, `load_out`, `store_out` and `edge_store` (the first output, through the view
// passed) and `load_dv`, `store_dv`, `edge_dv` begin and end them; `rescale_out(r0, row, part,
// f)` multiplies the forward's O rows by each lane's row factor through the subgroup's scratch
// rows; `b_out` picks the forward's or the backward's operand. With DIRECT_OUT a workgroup
// whose rows are all inside T, with D = DMAX and the output views on 16-byte boundaries, loads
// (when accumulating) and stores its accumulators straight from and to the outputs (`direct`);
// otherwise each output fragment passes the subgroup's scratch rows and its lanes write what
// is inside T and D (adding into it when accumulating).

// Whether the first output (O, dQ or dK) is accumulated into (O never is; the launcher sets
// ACC_DQ and ACC_DK together).
const ACC_A: bool = ACC_DQ || ACC_DK;

// The A operand of the first output's product: P (forward: O += P v), else scale * dS.
fn a_out(r0: u32, c0: u32) -> MA {
    return a_scores(select(DS_OFF, PP_OFF, KIND == KIND_FWD), r0, c0);
}

// The fragment in the subgroup's scratch rows r0.. to rows row0 + r0.., columns d0.. of output
// `which` (0: out_a, 1: out_b) through `view`, where inside T and D; `acc` adds into it. f32
// outputs an element a lane; f16 ones 4 columns a lane, two words of halves (D a multiple of 4,
// so 4 columns lie inside D or outside it together).
fn edge_out(which: u32, view: vec4<u32>, acc: bool, bh: u32, row0: u32, r0: u32, d0: u32,
            lane: u32) {
    if (OUT_F32) {
        for (var e = lane; e < FE; e += SGS) {
            let r = e / FS;
            let c = e % FS;
            let t = row0 + r0 + r;
            let d = d0 + c;
            if (t < p.t && d < p.d) {
                let o = at(view, bh, t, d);
                let x = sc_at((r0 + r) * SW + c);
                put_word(which, o, bitcast<u32>(select(x, bitcast<f32>(word(which, o)) + x, acc)));
            }
        }
        return;
    }
    for (var e = lane; e < FE / 4u; e += SGS) {
        let r = e / (FS / 4u);
        let c = e % (FS / 4u) * 4u;
        let t = row0 + r0 + r;
        let d = d0 + c;
        if (t < p.t && d < p.d) {
            let o = at(view, bh, t, d) / 2u;
            let i = (r0 + r) * SW + c;
            var x = sc4(i);
            if (acc) {
                x += vec4<f32>(unpack2x16float(word(which, o)), unpack2x16float(word(which, o + 1u)));
            }
            put_word(which, o, pack2x16float(x.xy));
            put_word(which, o + 1u, pack2x16float(x.zw));
        }
    }
}

// ROPE: the gradient fragments in the subgroup's scratch rows r0.. (sc: columns d0.. with
// d0 < D/2; sc2: its partner columns d0 + D/2..) rotated back (the transpose of the rotation)
// into rows row0 + r0.. of out_a (dQ or dK) through `view`, where inside T (D = DMAX: every
// column is inside), 4 columns a lane.
fn edge_rope(view: vec4<u32>, bh: u32, row0: u32, r0: u32, d0: u32, lane: u32) {
    let half = p.d / 2u;
    for (var e = lane; e < FE / 4u; e += SGS) {
        let r = e / (FS / 4u);
        let c = e % (FS / 4u) * 4u;
        let t = row0 + r0 + r;
        if (t < p.t) {
            let i = (r0 + r) * SW + c;
            let j = (r0 + r) * SW2 + c;
            let x = sc4(i);
            let y = sc2_4(j);
            let row = ((p.start + t) * p.d + d0 + c) / 4u;
            let cs = rope[row];
            let sn = rope[row + half / 4u];
            out4(at(view, bh, t, d0 + c), x * cs + y * sn);
            out4(at(view, bh, t, d0 + half + c), y * cs - x * sn);
        }
    }
}

// Elements o..o+3 of out_a (o a multiple of 4): f32 words or two words of halves; ACC_A adds.
fn out4(o: u32, x: vec4<f32>) {
    if (OUT_F32) {
        for (var c = 0u; c < 4u; c++) {
            let w = select(x[c], bitcast<f32>(word(0u, o + c)) + x[c], ACC_A);
            put_word(0u, o + c, bitcast<u32>(w));
        }
        return;
    }
    var y = x;
    if (ACC_A) {
        y += vec4<f32>(unpack2x16float(word(0u, o / 2u)), unpack2x16float(word(0u, o / 2u + 1u)));
    }
    put_word(0u, o / 2u, pack2x16float(y.xy));
    put_word(0u, o / 2u + 1u, pack2x16float(y.zw));
}

// Word i of output `which` as u32 bits, and storing them (an f32 element, or two halves).
fn word(which: u32, i: u32) -> u32 {
    if (which == 0u) {
        return bitcast<u32>(out_a[i]);
    }
    return bitcast<u32>(out_b[i]);
}

fn put_word(which: u32, i: u32, x: u32) {
    if (which == 0u) {
        out_a[i] = bitcast<OA>(x);
    } else {
        out_b[i] = bitcast<OB>(x);
    }
}

// ------------------------------------------------------------------------------------------
// Forward: O and lse for ROWS queries, in one pass over the blocks of keys, the row max kept
// stale.

@compute @workgroup_size(WG)
fn attn_coop_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32,
                 @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wid.y;
    let kv = kv_bh(bh);
    let q0 = (nwg.x - 1u - wid.x) * ROWS;
    let r0 = sg * FS;                 // the subgroup's rows of the tiles
    let row = r0 + lane / LPR;        // this lane's scratch row
    let part = lane % LPR;
    let qi = q0 + row;                // its query

    // The first block of keys and values in flight while the subgroup's queries (scale * q)
    // become fragments.
    if (PREFETCH) {
        fetch_k(kv, 0u, lid);
        fetch_v(kv, 0u, lid);
    }
    stage_q(bh, q0, lid);
    workgroupBarrier();
    own_a(r0);
    let keys = min(q0 + ROWS, p.t);
    // (Computed here from the workgroup id: naga takes it as uniform, and cooperative
    // operations need uniform control flow.)
    let direct = DIRECT_OUT && q0 + ROWS <= p.t && p.d == DMAX
        && all(p.o % vec4<u32>(4u) == vec4<u32>());

    // O = sum over the blocks of P v, P = exp(S - m) in f16 against the row's running max m,
    // which moves (O's rows times exp(m_old - m_new)) only when a block's max passes it by
    // more than RESCALE; l the sum of P; O / l at the end.
    var m = NEG_BIG;
    var l = 0.0;
    zero_out();
    for (var k0 = 0u; k0 < keys; k0 += BC) {
        if (!ABL_STAGING || k0 == 0u) {
            kv_block(kv, k0, keys, lid);
        }
        if (!ABL_SCORES) {
            for (var c0 = 0u; c0 < BC; c0 += FS) {
                s_only(r0, c0);
            }
        }
        own_sync();
        if (ABL_SOFTMAX) {
            own_sync();
            if (!ABL_OUT) {
                add_out(r0);
            }
            continue;
        }
        // The lane's scores, read once, 4 at a time (masked: NEG_BIG, whose exp below is 0).
        var sv: array<vec4<f32>, BW / 4u>;
        var mx = NEG_BIG;
        for (var k = 0u; k < BW / 4u; k++) {
            let c = col4(part, k);
            let x = select(vec4<f32>(NEG_BIG), sc4(row * SW + c), vec4<u32>(k0 + c) + OFFS4 <= vec4<u32>(qi));
            sv[k] = x;
            mx = max(mx, max(max(x.x, x.y), max(x.z, x.w)));
        }
        mx = row_max(mx);
        // The first block holds key 0, so every row's max is finite after it (and O is still
        // zero: nothing to rescale). (`|` and `&`: naga makes `||` and `&&` branches.)
        let moves = (k0 == 0u) | (mx > m + RESCALE);
        let m_new = select(m, mx, moves);
        var sum = 0.0;
        for (var k = 0u; k < BW / 4u; k++) {
            let c = col4(part, k);
            let pc = select(vec4<f32>(), exp(sv[k] - m_new), qi < p.t);
            sum += pc.x + pc.y + pc.z + pc.w;
            h_sh[(PP_OFF + row * PS + c) / 4u] = vec4<f16>(pc);
        }
        let f = select(1.0, exp(m - m_new), moves);
        l = l * f + row_sum(sum);
        m = m_new;
        own_sync();
        // A subgroup whose rows' max moved rescales its own O rows (the same branch for all
        // its lanes).
        if (subgroupAny(moves & (k0 > 0u))) {
            rescale_out(r0, row, part, f);
        }
        if (!ABL_OUT) {
            add_out(r0);
        }
    }
    rescale_out(r0, row, part, select(0.0, 1.0 / l, l > 0.0));
    if (direct) {
        store_out(bh, q0, r0, p.o);
    } else {
        edge_store(bh, q0, r0, lane, p.o);
    }
    if (qi < p.t && part == 0u) {
        out_b[bh * p.t + qi] = bitcast<OB>(m + log(l)); // lse: OB is f32 in the forward
    }
}

// ------------------------------------------------------------------------------------------
// Backward: dQ, and dK with dV, in one dispatch. Workgroup x = 2 i + pass: pass 0 the dQ of
// the i-th block of ROWS queries from the last (which have the most keys), pass 1 the dK and
// dV of the i-th block of ROWS keys (the first have the most queries), so the longest of both
// start first and the two run side by side. dQ and dK go to out_a through their views, dV to
// out_b; both read D = rowsum(dO * O) from aux, written by attention_d.wgsl just before (dK/dV
// finding it for each block of queries from dO and O as they arrive cost more than that
// dispatch at every shape measured; PROFILING.md). Both passes are written out here, in the
// entry point: their rows come from the workgroup id, which naga takes as uniform, and
// cooperative operations need uniform control flow (naga takes a function's arguments as
// non-uniform).

@compute @workgroup_size(WG)
fn attn_coop_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32,
                 @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wid.y;
    let blocks = nwg.x / 2u;
    let i = wid.x / 2u;
    let r0 = sg * FS;                 // the subgroup's rows of the tiles
    let row = r0 + lane / LPR;        // this lane's scratch row
    let part = lane % LPR;
    if (wid.x % 2u == 0u) {
        // dQ for ROWS queries from q0, over the blocks of BC keys up to them.
        let q0 = (blocks - 1u - i) * ROWS;
        let qi = q0 + row;
        let kv = kv_bh(bh);
        // The first block of keys and values in flight while the subgroup's queries become
        // fragments: scale * q, then dO.
        if (PREFETCH) {
            fetch_k(kv, 0u, lid);
            fetch_v(kv, 0u, lid);
        }
        own_rows(bh, q0, r0, lid, false);
        // This lane's query's lse and D.
        var lse_i = 0.0;
        var dvec = 0.0;
        if (qi < p.t) {
            lse_i = lse[bh * p.t + qi];
            dvec = aux[bh * p.t + qi];
        }
        let direct = DIRECT_OUT && !ROPE_ON && q0 + ROWS <= p.t && p.d == DMAX
            && all(p.dq % vec4<u32>(4u) == vec4<u32>());
        zero_out();
        if (direct) {
            load_out(bh, q0, r0, p.dq);
        }
        let keys = min(q0 + ROWS, p.t);
        for (var k0 = 0u; k0 < keys; k0 += BC) {
            if (!ABL_STAGING || k0 == 0u) {
                kv_block(kv, k0, keys, lid);
            }
            // S = (scale q) k^T and dP = dO v^T.
            if (!ABL_SCORES) {
                for (var c0 = 0u; c0 < BC; c0 += FS) {
                    s_dp(r0, c0);
                }
            }
            own_sync();
            // dS = P (dP - D), P = exp(S - lse) on unmasked pairs; times scale, so that
            // dQ = (scale dS) k.
            for (var k = 0u; k < select(BW / 4u, 0u, ABL_SOFTMAX); k++) {
                let c = col4(part, k);
                let valid = (vec4<u32>(k0 + c) + OFFS4 <= vec4<u32>(qi)) & vec4<bool>(qi < p.t);
                let pc = select(vec4<f32>(), exp(sc4(row * SW + c) - lse_i), valid);
                let ds = pc * (sc2_4(row * SW2 + c) - dvec) * p.scale;
                h_sh[(DS_OFF + row * PS + c) / 4u] = vec4<f16>(ds);
            }
            own_sync();
            // dQ += (scale dS) k.
            if (!ABL_OUT) {
                add_out(r0);
            }
        }
        if (direct) {
            store_out(bh, q0, r0, p.dq);
        } else if (ROPE_ON) {
            edge_store_rope(bh, q0, r0, lane, p.dq);
        } else {
            edge_store(bh, q0, r0, lane, p.dq);
        }
    } else if (wid.y < p.batch * (p.heads / p.group)) {
        // dK and dV for ROWS keys from k0 of kv head wid.y = b * H / G + hk (through bhk),
        // over the blocks of BC queries at or after them of each of its group's query heads
        // bh0.. in turn. The products run transposed: S^T = k (scale q)^T, dP^T = v dO^T,
        // dV += P^T dO, dK += dS^T (scale q).
        let kv_heads = p.heads / p.group;
        let bhk = wid.y / kv_heads * p.heads + wid.y % kv_heads;
        let bh0 = wid.y / kv_heads * p.heads + wid.y % kv_heads * p.group;
        let k0 = i * ROWS;
        let kj = k0 + row;                // this lane's key
        // The first block of queries (q, dO, lse, D) in flight while the subgroup's keys
        // become fragments: k, then v. Queries before k0 see none of these keys; the blocks
        // run from `first` to T for query head bh0, then bh0 + 1, ... (where G is 1, the
        // loop as it was before the grouping).
        let first = (k0 / BC) * BC;
        if (PREFETCH) {
            fetch_q(bh0, first, lid);
            fetch_do(bh0, first, lid);
            fetch_ld(bh0, first, lid);
        }
        own_rows(bhk, k0, r0, lid, true);
        let direct = DIRECT_OUT && !ROPE_ON && k0 + ROWS <= p.t && p.d == DMAX
            && all(p.dk % vec4<u32>(4u) == vec4<u32>())
            && all(p.dv % vec4<u32>(4u) == vec4<u32>());
        zero_out();
        if (direct) {
            load_out(bhk, k0, r0, p.dk);
            load_dv(bhk, k0, r0);
        }
        for (var g = 0u; g < p.group; g++) {
            let bh = bh0 + g;
            for (var q0 = first; q0 < p.t; q0 += BC) {
                let staged = !ABL_STAGING || (q0 == first && g == 0u);
                if (!PREFETCH && staged) {
                    fetch_q(bh, q0, lid);
                    fetch_do(bh, q0, lid);
                    fetch_ld(bh, q0, lid);
                }
                if (staged && !ABL_BARRIERS) {
                    workgroupBarrier(); // h_sh, lse_c, dvec_c: the previous block (or own rows) is done
                }
                if (staged && !ABL_PUTS) {
                    put_nx0(p.q, bh, q0, Q_OFF, p.scale, lid);
                    put_nx1(p.dout, bh, q0, DO_OFF, lid);
                    if (lid < BC) {
                        let inside = q0 + lid < p.t;
                        lse_c[lid / 4u][lid % 4u] = select(0.0, nl, inside);
                        dvec_c[lid / 4u][lid % 4u] = select(0.0, nd, inside);
                    }
                }
                if (staged && !ABL_BARRIERS) {
                    workgroupBarrier();
                }
                if (PREFETCH && staged) {
                    if (q0 + BC < p.t) {
                        fetch_q(bh, q0 + BC, lid);
                        fetch_do(bh, q0 + BC, lid);
                        fetch_ld(bh, q0 + BC, lid);
                    } else if (g + 1u < p.group) {
                        fetch_q(bh + 1u, first, lid);
                        fetch_do(bh + 1u, first, lid);
                        fetch_ld(bh + 1u, first, lid);
                    }
                }
                if (!ABL_SCORES) {
                    for (var c0 = 0u; c0 < BC; c0 += FS) {
                        s_dp(r0, c0);
                    }
                }
                own_sync();
                for (var k = 0u; k < select(BW / 4u, 0u, ABL_SOFTMAX); k++) {
                    let c = col4(part, k);
                    let qc = vec4<u32>(q0 + c) + OFFS4;
                    let valid = (vec4<u32>(kj) <= qc) & (qc < vec4<u32>(p.t));
                    let pc = select(vec4<f32>(), exp(sc4(row * SW + c) - lse_c[c / 4u]), valid);
                    let o = row * PS + c;
                    h_sh[(PP_OFF + o) / 4u] = vec4<f16>(pc);
                    h_sh[(DS_OFF + o) / 4u] = vec4<f16>(pc * (sc2_4(row * SW2 + c) - dvec_c[c / 4u]));
                }
                own_sync();
                // dK += dS^T (scale q), dV += P^T dO.
                if (!ABL_OUT) {
                    add_out(r0);
                    add_dv(r0);
                }
            }
        }
        if (direct) {
            store_out(bhk, k0, r0, p.dk);
            store_dv(bhk, k0, r0);
        } else {
            if (ROPE_ON) {
                edge_store_rope(bhk, k0, r0, lane, p.dk);
            } else {
                edge_store(bhk, k0, r0, lane, p.dk);
            }
            edge_dv(bhk, k0, r0, lane);
        }
    }
}
