// Fused causal self-attention on cooperative matrices (tensor cores), forward and backward:
// the mixed-precision counterpart of attention.wgsl (same Params, bindings, entry-point
// contracts and FlashAttention-2 algorithm; read that file's header for the math). The products
// q k^T, P v, dO v^T, dS k, P^T dO and dS^T q run on f16 fragments with f32 accumulation; the
// softmax, its statistics (m, l, lse), D and every accumulated output stay f32.
//
// Memory: q, k, v, dO are (B, H, T, D) f32 views read 4 elements at a time (the launcher checks
// that D, every offset and every stride are multiples of 4); O, dQ, dK, dV are written as f32
// scalars through their views; lse and D are contiguous (B, H, T) f32. Bindings as in
// attention.wgsl: 1 out_a (O / dQ / dK), 2 out_b (lse / D / dV), 3 q, 4 k, 5 v, 6 dO, 7 lse,
// 8 aux (O for attn_coop_dq, D for attn_coop_dkv).
//
// Workgroup mapping: SG subgroups of SGS lanes; subgroup sg owns FS rows of the workgroup's
// ROWS = SG * FS (queries for attn_coop_fwd and attn_coop_dq, keys for attn_coop_dkv) and loops
// over blocks of BC rows of the other side. Each product of a block runs one FS x FS output
// fragment at a time (its accumulator a single variable: nothing indexes coop matrices at run
// time) and is stored to the subgroup's f32 scratch rows; then the subgroup's lanes, LPR = SGS /
// FS per row, each owning W / LPR consecutive columns of its row, do the elementwise work
// (mask, exp, rescale) and accumulate the outputs in registers. Row statistics are combined
// across a row's lanes with subgroup shuffles.
// Tiles, f16, rows padded by 8 halves: q_sh and do_sh hold the query side (scale * q, dO),
// k_sh and v_sh the key side, [row][d] with row stride DS; fragments are loaded row-major
// (coopLoadT) as A or B operands, or column-major (coopLoad) for the transposed operands
// (k^T, v^T, q^T, dO^T). pp_sh and ds_sh hold P and dS in f16 for the products that read them.
// Grid: x over blocks of ROWS (attn_coop_fwd and attn_coop_dq numbered from the last queries,
// which have the most keys), y over b * H + h.
//
// Specialization: KIND (0 fwd, 1 dq, 2 dkv), FS, SGS, SG, BC, DMAX (head dim padded to a
// multiple of FS), DPARTS (the column parts the [row][d] outputs pass the scratch in, so it is
// DMAX / DPARTS wide), MA, MB, MC (the f16 A, B and f32 accumulator fragment types), ACC_DQ,
// ACC_DK, ACC_DV (add into the target instead of overwriting it).

enable wgpu_cooperative_matrix;

struct Params {
    heads: u32,
    t: u32,
    d: u32,
    _pad0: u32,
    scale: f32,
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
    q: vec4<u32>,
    k: vec4<u32>,
    v: vec4<u32>,
    o: vec4<u32>,
    dout: vec4<u32>,
    dq: vec4<u32>,
    dk: vec4<u32>,
    dv: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out_a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out_b: array<f32>;
@group(0) @binding(3) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> dout: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> lse: array<f32>;
@group(0) @binding(8) var<storage, read> aux: array<f32>;

const KIND_FWD: u32 = 0u;
const KIND_DQ: u32 = 1u;
const KIND_DKV: u32 = 2u;
const BWD: bool = KIND != KIND_FWD;

const WG: u32 = SG * SGS;
const ROWS: u32 = SG * FS;
const LPR: u32 = SGS / FS;                 // lanes per scratch row
const QROWS: u32 = select(ROWS, BC, KIND == KIND_DKV);
const KROWS: u32 = select(BC, ROWS, KIND == KIND_DKV);
const DS: u32 = DMAX + 8u;                 // tile row stride (halves)
const PS: u32 = BC + 8u;                   // P / dS row stride (halves)
// Scratch row strides (f32), padded by 4 words: the LPR lanes of a row read consecutive words
// and the rows of a fragment fall in different banks (an unpadded stride of 32 or 64 words put
// all 16 rows of a fragment in one bank).
const DPW: u32 = DMAX / DPARTS;            // columns of a [row][d] output per scratch part
const SW: u32 = max(BC, DPW) + 4u;
const SW2: u32 = BC + 4u;
const BW: u32 = BC / LPR;                  // a lane's columns of a [row][BC] block
const DW: u32 = DMAX / LPR;                // a lane's columns of a [row][d] block
// The score of a masked pair: finite, so exp(NEG_BIG - m) is 0 and exp(m_old - m_new) is
// never NaN (every query row has key 0 in its first block, so m is finite after it).
const NEG_BIG: f32 = -1e30;

var<workgroup> q_sh: array<f16, QROWS * DS>;                        // scale * q
var<workgroup> k_sh: array<f16, KROWS * DS>;
var<workgroup> v_sh: array<f16, KROWS * DS>;
var<workgroup> do_sh: array<f16, select(1u, QROWS * DS, BWD)>;      // dO
var<workgroup> pp_sh: array<f16, select(1u, ROWS * PS, KIND != KIND_DQ)>; // P (dkv: P^T)
var<workgroup> ds_sh: array<f16, select(1u, ROWS * PS, BWD)>;      // dS (dkv: dS^T)
var<workgroup> sc: array<f32, ROWS * SW>;                           // fragments out
var<workgroup> sc2: array<f32, select(1u, ROWS * SW2, BWD)>;        // dP (dkv: dP^T)
var<workgroup> lse_c: array<f32, select(1u, BC, KIND == KIND_DKV)>; // the block's queries
var<workgroup> dvec_c: array<f32, select(1u, BC, KIND == KIND_DKV)>;

// Element (t, d) of head `bh` of a (B, H, T, D) view.
fn at(view: vec4<u32>, bh: u32, t: u32, d: u32) -> u32 {
    return head(view, bh) + t * view.w + d;
}

// Element (0, 0) of head `bh` of a (B, H, T, D) view.
fn head(view: vec4<u32>, bh: u32) -> u32 {
    let b = bh / p.heads;
    let h = bh % p.heads;
    return view.x + b * view.y + h * view.z;
}

// ------------------------------------------------------------------------------------------
// Staging: rows r0.. of a (B, H, T, D) view into a tile, 4 elements a load, f32 -> f16, zero
// past T and D (x `scale` for q).

fn stage_q(bh: u32, r0: u32, lid: u32) {
    let base = head(p.q, bh);
    for (var e = lid; e < QROWS * DMAX / 4u; e += WG) {
        let r = e / (DMAX / 4u);
        let d = (e % (DMAX / 4u)) * 4u;
        // Branch-free (loads under per-lane branches are not overlapped): outside the view a
        // lane reads vector 0 and selects zero.
        let ok = r0 + r < p.t && d < p.d;
        let x = q[select(0u, (base + (r0 + r) * p.q.w + d) / 4u, ok)] * p.scale;
        let h = vec4<f16>(select(vec4<f32>(), x, ok));
        for (var c = 0u; c < 4u; c++) {
            q_sh[r * DS + d + c] = h[c];
        }
    }
}

fn stage_do(bh: u32, r0: u32, lid: u32) {
    let base = head(p.dout, bh);
    for (var e = lid; e < QROWS * DMAX / 4u; e += WG) {
        let r = e / (DMAX / 4u);
        let d = (e % (DMAX / 4u)) * 4u;
        let ok = r0 + r < p.t && d < p.d;
        let x = dout[select(0u, (base + (r0 + r) * p.dout.w + d) / 4u, ok)];
        let h = vec4<f16>(select(vec4<f32>(), x, ok));
        for (var c = 0u; c < 4u; c++) {
            do_sh[r * DS + d + c] = h[c];
        }
    }
}

fn stage_kv(bh: u32, r0: u32, lid: u32) {
    let kb = head(p.k, bh);
    let vb = head(p.v, bh);
    for (var e = lid; e < KROWS * DMAX / 4u; e += WG) {
        let r = e / (DMAX / 4u);
        let d = (e % (DMAX / 4u)) * 4u;
        let ok = r0 + r < p.t && d < p.d;
        let x = k[select(0u, (kb + (r0 + r) * p.k.w + d) / 4u, ok)];
        let y = v[select(0u, (vb + (r0 + r) * p.v.w + d) / 4u, ok)];
        let hx = vec4<f16>(select(vec4<f32>(), x, ok));
        let hy = vec4<f16>(select(vec4<f32>(), y, ok));
        for (var c = 0u; c < 4u; c++) {
            k_sh[r * DS + d + c] = hx[c];
            v_sh[r * DS + d + c] = hy[c];
        }
    }
}

// ------------------------------------------------------------------------------------------
// Fragments: A operands (rows x inner) and B operands (inner x cols), row-major from a
// [row][inner] tile or column-major (the transpose) from a [col][inner] tile.

fn a_q(r0: u32, d0: u32) -> MA {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MA>(&q_sh[i], s);
}

fn a_do(r0: u32, d0: u32) -> MA {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MA>(&do_sh[i], s);
}

fn a_k(r0: u32, d0: u32) -> MA {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MA>(&k_sh[i], s);
}

fn a_v(r0: u32, d0: u32) -> MA {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MA>(&v_sh[i], s);
}

fn a_pp(r0: u32, c0: u32) -> MA {
    let i = r0 * PS + c0;
    let s = PS;
    return coopLoadT<MA>(&pp_sh[i], s);
}

fn a_ds(r0: u32, c0: u32) -> MA {
    let i = r0 * PS + c0;
    let s = PS;
    return coopLoadT<MA>(&ds_sh[i], s);
}

// (d0.., rows c0..) of q^T, k^T, v^T, dO^T: column-major from the [row][d] tile.
fn bt_q(c0: u32, d0: u32) -> MB {
    let i = c0 * DS + d0;
    let s = DS;
    return coopLoad<MB>(&q_sh[i], s);
}

fn bt_k(c0: u32, d0: u32) -> MB {
    let i = c0 * DS + d0;
    let s = DS;
    return coopLoad<MB>(&k_sh[i], s);
}

fn bt_v(c0: u32, d0: u32) -> MB {
    let i = c0 * DS + d0;
    let s = DS;
    return coopLoad<MB>(&v_sh[i], s);
}

fn bt_do(c0: u32, d0: u32) -> MB {
    let i = c0 * DS + d0;
    let s = DS;
    return coopLoad<MB>(&do_sh[i], s);
}

// (rows r0.., d0..) of q, k, dO as B operands: row-major from the [row][d] tile.
fn b_q(r0: u32, d0: u32) -> MB {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MB>(&q_sh[i], s);
}

fn b_k(r0: u32, d0: u32) -> MB {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MB>(&k_sh[i], s);
}

fn b_v(r0: u32, d0: u32) -> MB {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MB>(&v_sh[i], s);
}

fn b_do(r0: u32, d0: u32) -> MB {
    let i = r0 * DS + d0;
    let s = DS;
    return coopLoadT<MB>(&do_sh[i], s);
}

fn store_sc(acc: MC, r0: u32, c0: u32) {
    let i = r0 * SW + c0;
    let s = SW;
    coopStoreT(acc, &sc[i], s);
}

fn store_sc2(acc: MC, r0: u32, c0: u32) {
    let i = r0 * SW2 + c0;
    let s = SW2;
    coopStoreT(acc, &sc2[i], s);
}

// Row max and row sum over the LPR lanes sharing a scratch row (consecutive lanes).
fn row_max(x: f32) -> f32 {
    var m = x;
    for (var o = 1u; o < LPR; o <<= 1u) {
        m = max(m, subgroupShuffleXor(m, o));
    }
    return m;
}

// Adds part h of a [row][d] output (its columns h * DPW.., in the scratch) into this lane's
// columns of it, part * DW...
fn add_part(acc: ptr<function, array<f32, DW>>, h: u32, row: u32, part: u32) {
    for (var j = 0u; j < DW; j++) {
        let d = part * DW + j;
        if (d / DPW == h) {
            (*acc)[j] += sc[row * SW + d - h * DPW];
        }
    }
}

fn row_sum(x: f32) -> f32 {
    var s = x;
    for (var o = 1u; o < LPR; o <<= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}

// ------------------------------------------------------------------------------------------
// Forward: O and lse for ROWS queries.

@compute @workgroup_size(WG)
fn attn_coop_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32,
                 @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wid.y;
    let q0 = (nwg.x - 1u - wid.x) * ROWS;
    let r0 = sg * FS;                 // the subgroup's rows of the tiles
    let row = r0 + lane / LPR;        // this lane's scratch row
    let part = lane % LPR;
    let qi = q0 + row;                // its query

    stage_q(bh, q0, lid);
    var m = NEG_BIG;
    var l = 0.0;
    var o: array<f32, DW>;            // O (unnormalized), columns part * DW ..
    for (var j = 0u; j < DW; j++) {
        o[j] = 0.0;
    }

    let keys = min(q0 + ROWS, p.t);
    for (var k0 = 0u; k0 < keys; k0 += BC) {
        workgroupBarrier(); // the previous block is done with k_sh, v_sh
        stage_kv(bh, k0, lid);
        workgroupBarrier();
        // S = (scale q) k^T, one fragment of keys at a time.
        for (var c0 = 0u; c0 < BC; c0 += FS) {
            var acc = MC();
            for (var d0 = 0u; d0 < DMAX; d0 += FS) {
                acc = coopMultiplyAdd(a_q(r0, d0), bt_k(c0, d0), acc);
            }
            store_sc(acc, r0, c0);
        }
        workgroupBarrier();
        // Online softmax on this lane's columns of its row; P to pp_sh in f16.
        var mx = m;
        for (var j = 0u; j < BW; j++) {
            let c = part * BW + j;
            let s = select(NEG_BIG, sc[row * SW + c], k0 + c <= qi);
            sc[row * SW + c] = s;
            mx = max(mx, s);
        }
        mx = row_max(mx);
        let alpha = exp(m - mx);
        var sum = 0.0;
        for (var j = 0u; j < BW; j++) {
            let c = part * BW + j;
            let pc = exp(sc[row * SW + c] - mx);
            sum += pc;
            pp_sh[row * PS + c] = f16(pc);
        }
        l = l * alpha + row_sum(sum);
        m = mx;
        for (var j = 0u; j < DW; j++) {
            o[j] *= alpha;
        }
        workgroupBarrier();
        // O += P v, one fragment of d at a time, through the scratch (DPARTS column parts).
        for (var h = 0u; h < DPARTS; h++) {
            for (var d0 = h * DPW; d0 < (h + 1u) * DPW; d0 += FS) {
                var acc = MC();
                for (var c0 = 0u; c0 < BC; c0 += FS) {
                    acc = coopMultiplyAdd(a_pp(r0, c0), b_v(c0, d0), acc);
                }
                store_sc(acc, r0, d0 - h * DPW);
            }
            workgroupBarrier();
            add_part(&o, h, row, part);
            if (h + 1u < DPARTS) {
                workgroupBarrier();
            }
        }
    }

    if (qi < p.t) {
        let inv_l = 1.0 / l;
        for (var j = 0u; j < DW; j++) {
            let d = part * DW + j;
            if (d < p.d) {
                out_a[at(p.o, bh, qi, d)] = o[j] * inv_l;
            }
        }
        if (part == 0u) {
            out_b[bh * p.t + qi] = m + log(l);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward, dQ (and D = rowsum(dO * O)) for ROWS queries.

@compute @workgroup_size(WG)
fn attn_coop_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32,
                @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wid.y;
    let q0 = (nwg.x - 1u - wid.x) * ROWS;
    let r0 = sg * FS;
    let row = r0 + lane / LPR;
    let part = lane % LPR;
    let qi = q0 + row;

    stage_q(bh, q0, lid);
    stage_do(bh, q0, lid);
    // D for this lane's query: its columns, then the row's lanes combined.
    var dpart = 0.0;
    var lse_i = 0.0;
    if (qi < p.t) {
        for (var j = 0u; j < DW; j++) {
            let d = part * DW + j;
            if (d < p.d) {
                let g = dout[at(p.dout, bh, qi, d) / 4u][d % 4u];
                dpart = fma(g, aux[at(p.o, bh, qi, d)], dpart);
            }
        }
        lse_i = lse[bh * p.t + qi];
    }
    let dvec = row_sum(dpart);
    if (qi < p.t && part == 0u) {
        out_b[bh * p.t + qi] = dvec;
    }
    var dq: array<f32, DW>;           // dQ / scale, columns part * DW ..
    for (var j = 0u; j < DW; j++) {
        dq[j] = 0.0;
    }

    let keys = min(q0 + ROWS, p.t);
    for (var k0 = 0u; k0 < keys; k0 += BC) {
        workgroupBarrier();
        stage_kv(bh, k0, lid);
        workgroupBarrier();
        // S = (scale q) k^T and dP = dO v^T.
        for (var c0 = 0u; c0 < BC; c0 += FS) {
            var s = MC();
            var dp = MC();
            for (var d0 = 0u; d0 < DMAX; d0 += FS) {
                s = coopMultiplyAdd(a_q(r0, d0), bt_k(c0, d0), s);
                dp = coopMultiplyAdd(a_do(r0, d0), bt_v(c0, d0), dp);
            }
            store_sc(s, r0, c0);
            store_sc2(dp, r0, c0);
        }
        workgroupBarrier();
        // dS = P (dP - D), P = exp(S - lse) on unmasked pairs.
        for (var j = 0u; j < BW; j++) {
            let c = part * BW + j;
            let valid = k0 + c <= qi && qi < p.t;
            let pc = select(0.0, exp(sc[row * SW + c] - lse_i), valid);
            ds_sh[row * PS + c] = f16(pc * (sc2[row * SW2 + c] - dvec));
        }
        workgroupBarrier();
        // dQ += dS k.
        for (var h = 0u; h < DPARTS; h++) {
            for (var d0 = h * DPW; d0 < (h + 1u) * DPW; d0 += FS) {
                var acc = MC();
                for (var c0 = 0u; c0 < BC; c0 += FS) {
                    acc = coopMultiplyAdd(a_ds(r0, c0), b_k(c0, d0), acc);
                }
                store_sc(acc, r0, d0 - h * DPW);
            }
            workgroupBarrier();
            add_part(&dq, h, row, part);
            if (h + 1u < DPARTS) {
                workgroupBarrier();
            }
        }
    }

    if (qi < p.t) {
        for (var j = 0u; j < DW; j++) {
            let d = part * DW + j;
            if (d < p.d) {
                let o = at(p.dq, bh, qi, d);
                let g = dq[j] * p.scale;
                if (ACC_DQ) {
                    out_a[o] = out_a[o] + g;
                } else {
                    out_a[o] = g;
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward, dK and dV for ROWS keys, over the blocks of BC queries at or after them. The
// products run transposed: S^T = k (scale q)^T, dP^T = v dO^T, dV += P^T dO, dK += dS^T (scale q).

@compute @workgroup_size(WG)
fn attn_coop_dkv(@builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32,
                 @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wid.y;
    let k0 = wid.x * ROWS;
    let r0 = sg * FS;
    let row = r0 + lane / LPR;
    let part = lane % LPR;
    let kj = k0 + row;                // this lane's key

    stage_kv(bh, k0, lid);
    var dk: array<f32, DW>;
    var dv: array<f32, DW>;
    for (var j = 0u; j < DW; j++) {
        dk[j] = 0.0;
        dv[j] = 0.0;
    }
    // Queries before k0 see none of these keys.
    for (var q0 = (k0 / BC) * BC; q0 < p.t; q0 += BC) {
        workgroupBarrier(); // the previous block is done with q_sh, do_sh, lse_c, dvec_c
        stage_q(bh, q0, lid);
        stage_do(bh, q0, lid);
        for (var c = lid; c < BC; c += WG) {
            var l = 0.0;
            var dsum = 0.0;
            if (q0 + c < p.t) {
                l = lse[bh * p.t + q0 + c];
                dsum = aux[bh * p.t + q0 + c];
            }
            lse_c[c] = l;
            dvec_c[c] = dsum;
        }
        workgroupBarrier();
        for (var c0 = 0u; c0 < BC; c0 += FS) {
            var s = MC();
            var dp = MC();
            for (var d0 = 0u; d0 < DMAX; d0 += FS) {
                s = coopMultiplyAdd(a_k(r0, d0), bt_q(c0, d0), s);
                dp = coopMultiplyAdd(a_v(r0, d0), bt_do(c0, d0), dp);
            }
            store_sc(s, r0, c0);
            store_sc2(dp, r0, c0);
        }
        workgroupBarrier();
        for (var j = 0u; j < BW; j++) {
            let c = part * BW + j;
            let qc = q0 + c;
            let valid = kj <= qc && qc < p.t;
            let pc = select(0.0, exp(sc[row * SW + c] - lse_c[c]), valid);
            pp_sh[row * PS + c] = f16(pc);
            ds_sh[row * PS + c] = f16(pc * (sc2[row * SW2 + c] - dvec_c[c]));
        }
        workgroupBarrier();
        // dV += P^T dO.
        for (var h = 0u; h < DPARTS; h++) {
            for (var d0 = h * DPW; d0 < (h + 1u) * DPW; d0 += FS) {
                var acc = MC();
                for (var c0 = 0u; c0 < BC; c0 += FS) {
                    acc = coopMultiplyAdd(a_pp(r0, c0), b_do(c0, d0), acc);
                }
                store_sc(acc, r0, d0 - h * DPW);
            }
            workgroupBarrier();
            add_part(&dv, h, row, part);
            if (h + 1u < DPARTS) {
                workgroupBarrier();
            }
        }
        workgroupBarrier();
        // dK += dS^T (scale q).
        for (var h = 0u; h < DPARTS; h++) {
            for (var d0 = h * DPW; d0 < (h + 1u) * DPW; d0 += FS) {
                var acc = MC();
                for (var c0 = 0u; c0 < BC; c0 += FS) {
                    acc = coopMultiplyAdd(a_ds(r0, c0), b_q(c0, d0), acc);
                }
                store_sc(acc, r0, d0 - h * DPW);
            }
            workgroupBarrier();
            add_part(&dk, h, row, part);
            if (h + 1u < DPARTS) {
                workgroupBarrier();
            }
        }
    }

    if (kj < p.t) {
        for (var j = 0u; j < DW; j++) {
            let d = part * DW + j;
            if (d < p.d) {
                let ok = at(p.dk, bh, kj, d);
                let ov = at(p.dv, bh, kj, d);
                if (ACC_DK) {
                    out_a[ok] = out_a[ok] + dk[j];
                } else {
                    out_a[ok] = dk[j];
                }
                if (ACC_DV) {
                    out_b[ov] = out_b[ov] + dv[j];
                } else {
                    out_b[ov] = dv[j];
                }
            }
        }
    }
}
