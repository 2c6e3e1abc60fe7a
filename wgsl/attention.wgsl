// Fused causal self-attention, forward and backward (FlashAttention-2, Dao 2023), never
// writing the T x T score matrix.
//
// Query row i attends key j <= i. S = scale * q k^T with scale = 1/sqrt(D), P = softmax(S)
// row by row, O = P v. Backward, with dO the gradient of O:
//   attn_fwd      O by blocks of keys with the online softmax: per query row a running max m
//                 and sum l (f32), each new block rescaling O and l by exp(m_old - m_new).
//                 Writes O and lse = m + log(l). Every lane keeps m for its rows and its
//                 columns' share of l in registers; a block's row maxima (and, at the end, the
//                 sums) meet through `red`, one partial per lane of the row.
//   attn_bwd_dq   D = rowsum(dO * O) for its queries (written for attn_bwd_dkv), then per key
//                 block P = exp(S - lse), dP = dO v^T, dS = P * (dP - D); dQ = scale * dS k.
//   attn_bwd_dkv  the same P and dS per query block; dV = P^T dO, dK = scale * dS^T q.
//                 Runs after attn_bwd_dq (it reads D).
//
// Memory: q, k, v, O, dO, dQ, dK, dV are (B, H, T, D), each read or written through a view
// vec4(offset, b stride, h stride, t stride) with unit stride along D, so head-split views of
// a fused qkv tensor (and their gradient buffers) need no copy. lse and D are contiguous
// (B, H, T). Bindings (one layout per slot, shared by the entry points):
//   1 out_a  rw  attn_fwd O,   attn_bwd_dq dQ,  attn_bwd_dkv dK
//   2 out_b  rw  attn_fwd lse, attn_bwd_dq D,   attn_bwd_dkv dV
//   3 q, 4 k, 5 v, 6 dout (dO), 7 lse (backward), 8 aux (attn_bwd_dq O, attn_bwd_dkv D)
//
// Workgroup mapping: ROWL x COLL = 128 lanes, lane (tr, tc) = (lid / COLL, lid % COLL). A lane
// owns a register block of each tile it computes: rows tr + i * ROWL, columns tc + j * COLL
// (interleaved, so the lanes of a subgroup touch consecutive words).
//   attn_fwd, attn_bwd_dq: one workgroup per (block of BR queries, b * H + h) = (wid.x
//     reversed, wid.y), looping over blocks of BC keys up to the diagonal; the last query
//     blocks have the most keys, so they are numbered first.
//   attn_bwd_dkv: one workgroup per (block of BC keys, b * H + h), looping over the blocks of
//     BR queries at or after it (the first key blocks have the most, and come first).
// The blocks a workgroup loops over (keys; queries for attn_bwd_dkv) arrive a block ahead: a
// lane loads its share of the next block into registers (`fetch_*`) as soon as the current one
// is in the tiles and stores it (`put_*`) when the tiles are free again, so the loads' latency
// hides behind a block's arithmetic instead of stalling every block.
// Workgroup tiles are [row][d] with row stride DP = DMAX + 1 and [query][key] with stride
// SP = BC + 1: the +1 puts a column of different rows on different banks. Staging zero-pads
// past T and past D, so any T and any D <= DMAX work; no row past T is written, and in
// attn_bwd_dkv a query past T gets probability 0.
//
// Specialization: KIND (0 fwd, 1 dq, 2 dkv; sizes the workgroup arrays: every entry point is
// compiled under each variant's constants, and HLSL declares every groupshared array of the
// file, so the arrays a kind does not use get one element), DMAX (head dim padded: 32, 64 or
// 128), BR, BC (query and key block), ROWL, COLL (lane grid), ACC_DQ, ACC_DK, ACC_DV (add the
// gradient into its target instead of overwriting it).

struct Params {
    heads: u32,
    t: u32,
    d: u32,
    batch: u32,
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
@group(0) @binding(3) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read> k: array<f32>;
@group(0) @binding(5) var<storage, read> v: array<f32>;
@group(0) @binding(6) var<storage, read> dout: array<f32>;
@group(0) @binding(7) var<storage, read> lse: array<f32>;
@group(0) @binding(8) var<storage, read> aux: array<f32>;

const KIND_FWD: u32 = 0u;
const KIND_DQ: u32 = 1u;
const KIND_DKV: u32 = 2u;

const WG: u32 = ROWL * COLL;
const DP: u32 = DMAX + 1u;
const SP: u32 = BC + 1u;
// Register blocks per lane; at least 1, since an entry point's locals are validated under the
// other kinds' constants too.
const Q_PER_LANE: u32 = max(1u, BR / ROWL);   // query rows of a [query][key] tile
const K_PER_LANE: u32 = max(1u, BC / COLL);   // key columns of a [query][key] tile
const KR_PER_LANE: u32 = max(1u, BC / ROWL);  // key rows of dK, dV
const D_PER_LANE: u32 = max(1u, DMAX / COLL); // head-dim columns of O, dQ, dK, dV
// The score of a masked pair: finite, so exp(NEG_BIG - m) is 0 and exp(m_old - m_new) is
// never NaN (every query row has key 0 in its first block, so m is finite after it).
const NEG_BIG: f32 = -1e30;

const BWD: bool = KIND != KIND_FWD;
var<workgroup> tile_q: array<f32, BR * DP>;                                    // scale * q
var<workgroup> tile_k: array<f32, BC * DP>;                                    // k (fwd: then v)
var<workgroup> tile_do: array<f32, select(1u, BR * DP, BWD)>;                  // dO
var<workgroup> tile_v: array<f32, select(1u, BC * DP, BWD)>;                   // v
var<workgroup> tile_s: array<f32, select(1u, BR * SP, KIND != KIND_DQ)>;       // S, then P
var<workgroup> tile_ds: array<f32, select(1u, BR * SP, BWD)>;                  // dS
var<workgroup> red: array<f32, select(1u, BR * COLL, !BWD)>;                  // a row's partials
var<workgroup> lse_row: array<f32, select(1u, BR, BWD)>;
var<workgroup> dvec_row: array<f32, select(1u, BR, BWD)>;                      // D

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
// The next block in flight: NEXT rows (BC keys; BR queries for attn_bwd_dkv) of one or two
// views, a lane's share NPL elements of each (nx0: k, or scale * q; nx1: v, or dO), and for
// attn_bwd_dkv the lse and D of query `lid` of the block (nl, nd). Element e of a block is row
// e / DMAX, column e % DMAX. Loads are branch-free (outside the view: element 0; loads under
// per-lane branches are not overlapped); `put` selects zero outside T and D.
const NEXT: u32 = select(BC, BR, KIND == KIND_DKV);
const NPL: u32 = (NEXT * DMAX + WG - 1u) / WG;
var<private> nx0: array<f32, NPL>;
var<private> nx1: array<f32, NPL>;
var<private> nl: f32;
var<private> nd: f32;

// Element j of this lane's share of the block from row row0: its offset in `view` from the
// head at `base` (0 outside the view, with ok false) and its place in a [row][d] tile.
struct Elem {
    i: u32,
    tile: u32,
    ok: bool,
    inside: bool, // within the block (NPL * WG may pass it)
}

fn elem(view: vec4<u32>, base: u32, row0: u32, lid: u32, j: u32) -> Elem {
    let e = lid + j * WG;
    let r = e / DMAX;
    let d = e % DMAX;
    let inside = e < NEXT * DMAX;
    let ok = inside && row0 + r < p.t && d < p.d;
    return Elem(select(0u, base + (row0 + r) * view.w + d, ok), r * DP + d, ok, inside);
}

// (One function per source: each entry point binds only what it reads.)
fn fetch_k(bh: u32, row0: u32, lid: u32) {
    let base = head(p.k, bh);
    for (var j = 0u; j < NPL; j++) {
        nx0[j] = k[elem(p.k, base, row0, lid, j).i];
    }
}

fn fetch_v(bh: u32, row0: u32, lid: u32) {
    let base = head(p.v, bh);
    for (var j = 0u; j < NPL; j++) {
        nx1[j] = v[elem(p.v, base, row0, lid, j).i];
    }
}

fn fetch_q(bh: u32, row0: u32, lid: u32) {
    let base = head(p.q, bh);
    for (var j = 0u; j < NPL; j++) {
        nx0[j] = q[elem(p.q, base, row0, lid, j).i] * p.scale;
    }
}

fn fetch_do(bh: u32, row0: u32, lid: u32) {
    let base = head(p.dout, bh);
    for (var j = 0u; j < NPL; j++) {
        nx1[j] = dout[elem(p.dout, base, row0, lid, j).i];
    }
}

// attn_bwd_dkv: lse and D of query row0 + lid (0 past the block or T).
fn fetch_ld(bh: u32, row0: u32, lid: u32) {
    let ok = lid < BR && row0 + lid < p.t;
    let i = select(0u, bh * p.t + row0 + lid, ok);
    nl = select(0.0, lse[i], ok);
    nd = select(0.0, aux[i], ok);
}

// The fetched block (rows row0.. of `view`, head bh) into tile_k (nx0) or tile_v (nx1); the
// forward's v goes into tile_k too (`put_v_in_k`), the dK/dV pass's queries into tile_q and
// tile_do.
fn put_k(view: vec4<u32>, bh: u32, row0: u32, lid: u32) {
    let base = head(view, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(view, base, row0, lid, j);
        if (a.inside) {
            tile_k[a.tile] = select(0.0, nx0[j], a.ok);
        }
    }
}

fn put_v_in_k(view: vec4<u32>, bh: u32, row0: u32, lid: u32) {
    let base = head(view, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(view, base, row0, lid, j);
        if (a.inside) {
            tile_k[a.tile] = select(0.0, nx1[j], a.ok);
        }
    }
}

fn put_v(view: vec4<u32>, bh: u32, row0: u32, lid: u32) {
    let base = head(view, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(view, base, row0, lid, j);
        if (a.inside) {
            tile_v[a.tile] = select(0.0, nx1[j], a.ok);
        }
    }
}

fn put_queries(bh: u32, row0: u32, lid: u32) {
    let base = head(p.q, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(p.q, base, row0, lid, j);
        if (a.inside) {
            tile_q[a.tile] = select(0.0, nx0[j], a.ok);
            tile_do[a.tile] = select(0.0, nx1[j], a.ok);
        }
    }
    if (lid < BR) {
        lse_row[lid] = nl;
        dvec_row[lid] = nd;
    }
}

// ------------------------------------------------------------------------------------------
// Forward.

@compute @workgroup_size(WG)
fn attn_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let bh = wid.y;
    let q0 = (nwg.x - 1u - wid.x) * BR;
    let tr = lid / COLL;
    let tc = lid % COLL;

    // The first block of keys and values in flight while the queries are staged.
    fetch_k(bh, 0u, lid);
    fetch_v(bh, 0u, lid);
    for (var e = lid; e < BR * DMAX; e += WG) {
        let r = e / DMAX;
        let d = e % DMAX;
        // Branch-free (loads under per-lane branches are not overlapped): outside the view a
        // lane reads element 0 and selects zero.
        let ok = q0 + r < p.t && d < p.d;
        let x = q[select(0u, at(p.q, bh, q0 + r, d), ok)] * p.scale;
        tile_q[r * DP + d] = select(0.0, x, ok);
    }
    // The running max of each of this lane's rows (the same in every lane of the row) and the
    // sum of exp(s - m) over this lane's columns of it.
    var m: array<f32, Q_PER_LANE>;
    var l: array<f32, Q_PER_LANE>;
    var acc: array<f32, Q_PER_LANE * D_PER_LANE>; // O, unnormalized
    for (var i = 0u; i < Q_PER_LANE; i++) {
        m[i] = NEG_BIG;
        l[i] = 0.0;
    }
    for (var i = 0u; i < Q_PER_LANE * D_PER_LANE; i++) {
        acc[i] = 0.0;
    }

    let keys = min(q0 + BR, p.t); // the causal mask ends at the block's last query
    for (var k0 = 0u; k0 < keys; k0 += BC) {
        put_k(p.k, bh, k0, lid); // tile_k is free: the previous block's P v is done
        workgroupBarrier();
        if (k0 + BC < keys) {
            fetch_k(bh, k0 + BC, lid);
        }

        // S = (scale q) k^T for this lane's block, masked to keys <= query.
        var s: array<f32, Q_PER_LANE * K_PER_LANE>;
        for (var i = 0u; i < Q_PER_LANE * K_PER_LANE; i++) {
            s[i] = 0.0;
        }
        for (var d = 0u; d < DMAX; d++) {
            var qr: array<f32, Q_PER_LANE>;
            var kc: array<f32, K_PER_LANE>;
            for (var i = 0u; i < Q_PER_LANE; i++) {
                qr[i] = tile_q[(tr + i * ROWL) * DP + d];
            }
            for (var j = 0u; j < K_PER_LANE; j++) {
                kc[j] = tile_k[(tc + j * COLL) * DP + d];
            }
            for (var i = 0u; i < Q_PER_LANE; i++) {
                for (var j = 0u; j < K_PER_LANE; j++) {
                    s[i * K_PER_LANE + j] = fma(qr[i], kc[j], s[i * K_PER_LANE + j]);
                }
            }
        }
        // Each row's maximum over this lane's columns, then over the row's COLL lanes.
        for (var i = 0u; i < Q_PER_LANE; i++) {
            let r = tr + i * ROWL;
            var mx = NEG_BIG;
            for (var j = 0u; j < K_PER_LANE; j++) {
                let c = tc + j * COLL;
                s[i * K_PER_LANE + j] = select(NEG_BIG, s[i * K_PER_LANE + j], k0 + c <= q0 + r);
                mx = max(mx, s[i * K_PER_LANE + j]);
            }
            red[r * COLL + tc] = mx;
        }
        workgroupBarrier();
        // P = exp(S - m_new) into tile_s; O and l rescaled by exp(m_old - m_new). Every lane is
        // done with k: v goes in its place.
        for (var i = 0u; i < Q_PER_LANE; i++) {
            let r = tr + i * ROWL;
            var m_new = m[i];
            for (var c = 0u; c < COLL; c++) {
                m_new = max(m_new, red[r * COLL + c]);
            }
            let alpha = exp(m[i] - m_new);
            var sum = 0.0;
            for (var j = 0u; j < K_PER_LANE; j++) {
                let pc = exp(s[i * K_PER_LANE + j] - m_new);
                tile_s[r * SP + tc + j * COLL] = pc;
                sum += pc;
            }
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
            for (var j = 0u; j < D_PER_LANE; j++) {
                acc[i * D_PER_LANE + j] *= alpha;
            }
        }
        put_v_in_k(p.v, bh, k0, lid);
        workgroupBarrier();
        if (k0 + BC < keys) {
            fetch_v(bh, k0 + BC, lid);
        }

        // O += P v.
        for (var c = 0u; c < BC; c++) {
            var pr: array<f32, Q_PER_LANE>;
            var vc: array<f32, D_PER_LANE>;
            for (var i = 0u; i < Q_PER_LANE; i++) {
                pr[i] = tile_s[(tr + i * ROWL) * SP + c];
            }
            for (var j = 0u; j < D_PER_LANE; j++) {
                vc[j] = tile_k[c * DP + tc + j * COLL];
            }
            for (var i = 0u; i < Q_PER_LANE; i++) {
                for (var j = 0u; j < D_PER_LANE; j++) {
                    acc[i * D_PER_LANE + j] = fma(pr[i], vc[j], acc[i * D_PER_LANE + j]);
                }
            }
        }
        workgroupBarrier(); // tile_k, tile_s and red are written again next block
    }

    // Each row's sum over its COLL lanes.
    for (var i = 0u; i < Q_PER_LANE; i++) {
        red[(tr + i * ROWL) * COLL + tc] = l[i];
    }
    workgroupBarrier();
    for (var i = 0u; i < Q_PER_LANE; i++) {
        let r = tr + i * ROWL;
        if (q0 + r >= p.t) { continue; }
        var l_row = 0.0;
        for (var c = 0u; c < COLL; c++) {
            l_row += red[r * COLL + c];
        }
        let inv_l = 1.0 / l_row;
        for (var j = 0u; j < D_PER_LANE; j++) {
            let d = tc + j * COLL;
            if (d < p.d) {
                out_a[at(p.o, bh, q0 + r, d)] = acc[i * D_PER_LANE + j] * inv_l;
            }
        }
        if (tc == 0u) {
            out_b[bh * p.t + q0 + r] = m[i] + log(l_row);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward. Both kernels stage (scale q) and dO for BR queries and k, v for BC keys, and
// compute P and dS of the same [query][key] block per lane.

// P and dS of this lane's block of (query block q0, key block k0), into tile_ds and (for
// attn_bwd_dkv, which needs P too) tile_s. Needs tile_q, tile_do, tile_k, tile_v, lse_row and
// dvec_row staged.
fn probabilities(q0: u32, k0: u32, tr: u32, tc: u32) {
    var s: array<f32, Q_PER_LANE * K_PER_LANE>;
    var dp: array<f32, Q_PER_LANE * K_PER_LANE>;
    for (var i = 0u; i < Q_PER_LANE * K_PER_LANE; i++) {
        s[i] = 0.0;
        dp[i] = 0.0;
    }
    for (var d = 0u; d < DMAX; d++) {
        var qr: array<f32, Q_PER_LANE>;
        var dor: array<f32, Q_PER_LANE>;
        var kc: array<f32, K_PER_LANE>;
        var vc: array<f32, K_PER_LANE>;
        for (var i = 0u; i < Q_PER_LANE; i++) {
            qr[i] = tile_q[(tr + i * ROWL) * DP + d];
            dor[i] = tile_do[(tr + i * ROWL) * DP + d];
        }
        for (var j = 0u; j < K_PER_LANE; j++) {
            kc[j] = tile_k[(tc + j * COLL) * DP + d];
            vc[j] = tile_v[(tc + j * COLL) * DP + d];
        }
        for (var i = 0u; i < Q_PER_LANE; i++) {
            for (var j = 0u; j < K_PER_LANE; j++) {
                s[i * K_PER_LANE + j] = fma(qr[i], kc[j], s[i * K_PER_LANE + j]);
                dp[i * K_PER_LANE + j] = fma(dor[i], vc[j], dp[i * K_PER_LANE + j]);
            }
        }
    }
    for (var i = 0u; i < Q_PER_LANE; i++) {
        let r = tr + i * ROWL;
        for (var j = 0u; j < K_PER_LANE; j++) {
            let c = tc + j * COLL;
            let valid = k0 + c <= q0 + r && q0 + r < p.t;
            let pij = select(0.0, exp(s[i * K_PER_LANE + j] - lse_row[r]), valid);
            if (KIND == KIND_DKV) {
                tile_s[r * SP + c] = pij;
            }
            tile_ds[r * SP + c] = pij * (dp[i * K_PER_LANE + j] - dvec_row[r]);
        }
    }
}

// Stages the dQ pass's own BR rows of (scale q) and dO from query q0 (zero past T and D).
fn stage_queries(bh: u32, q0: u32, lid: u32) {
    for (var e = lid; e < BR * DMAX; e += WG) {
        let r = e / DMAX;
        let d = e % DMAX;
        let ok = q0 + r < p.t && d < p.d;
        let x = q[select(0u, at(p.q, bh, q0 + r, d), ok)] * p.scale;
        let g = dout[select(0u, at(p.dout, bh, q0 + r, d), ok)];
        tile_q[r * DP + d] = select(0.0, x, ok);
        tile_do[r * DP + d] = select(0.0, g, ok);
    }
}

// Stages the dK/dV pass's own BC rows of k and v from key k0 (zero past T and D).
fn stage_keys(bh: u32, k0: u32, lid: u32) {
    for (var e = lid; e < BC * DMAX; e += WG) {
        let c = e / DMAX;
        let d = e % DMAX;
        let ok = k0 + c < p.t && d < p.d;
        let x = k[select(0u, at(p.k, bh, k0 + c, d), ok)];
        let y = v[select(0u, at(p.v, bh, k0 + c, d), ok)];
        tile_k[c * DP + d] = select(0.0, x, ok);
        tile_v[c * DP + d] = select(0.0, y, ok);
    }
}

@compute @workgroup_size(WG)
fn attn_bwd_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let bh = wid.y;
    let q0 = (nwg.x - 1u - wid.x) * BR;
    let tr = lid / COLL;
    let tc = lid % COLL;

    // The first block of keys and values in flight while the queries are staged.
    fetch_k(bh, 0u, lid);
    fetch_v(bh, 0u, lid);
    stage_queries(bh, q0, lid);
    // D = rowsum(dO * O): each lane sums its columns of its rows, partials meet in tile_ds.
    for (var i = 0u; i < Q_PER_LANE; i++) {
        let r = tr + i * ROWL;
        var part = 0.0;
        if (q0 + r < p.t) {
            for (var d = tc; d < p.d; d += COLL) {
                part = fma(dout[at(p.dout, bh, q0 + r, d)], aux[at(p.o, bh, q0 + r, d)], part);
            }
        }
        tile_ds[r * SP + tc] = part;
    }
    workgroupBarrier();
    if (lid < BR) {
        var dsum = 0.0;
        for (var c = 0u; c < COLL; c++) {
            dsum += tile_ds[lid * SP + c];
        }
        dvec_row[lid] = dsum;
        var l = 0.0;
        if (q0 + lid < p.t) {
            out_b[bh * p.t + q0 + lid] = dsum;
            l = lse[bh * p.t + q0 + lid];
        }
        lse_row[lid] = l;
    }

    var acc: array<f32, Q_PER_LANE * D_PER_LANE>; // dQ / scale
    for (var i = 0u; i < Q_PER_LANE * D_PER_LANE; i++) {
        acc[i] = 0.0;
    }
    let keys = min(q0 + BR, p.t);
    for (var k0 = 0u; k0 < keys; k0 += BC) {
        workgroupBarrier(); // the previous block (or D's partials) is done with the tiles
        put_k(p.k, bh, k0, lid);
        put_v(p.v, bh, k0, lid);
        workgroupBarrier();
        if (k0 + BC < keys) {
            fetch_k(bh, k0 + BC, lid);
            fetch_v(bh, k0 + BC, lid);
        }
        probabilities(q0, k0, tr, tc);
        workgroupBarrier();
        // dQ += dS k
        for (var c = 0u; c < BC; c++) {
            var dsr: array<f32, Q_PER_LANE>;
            var kc: array<f32, D_PER_LANE>;
            for (var i = 0u; i < Q_PER_LANE; i++) {
                dsr[i] = tile_ds[(tr + i * ROWL) * SP + c];
            }
            for (var j = 0u; j < D_PER_LANE; j++) {
                kc[j] = tile_k[c * DP + tc + j * COLL];
            }
            for (var i = 0u; i < Q_PER_LANE; i++) {
                for (var j = 0u; j < D_PER_LANE; j++) {
                    acc[i * D_PER_LANE + j] = fma(dsr[i], kc[j], acc[i * D_PER_LANE + j]);
                }
            }
        }
    }

    for (var i = 0u; i < Q_PER_LANE; i++) {
        let r = tr + i * ROWL;
        if (q0 + r >= p.t) { continue; }
        for (var j = 0u; j < D_PER_LANE; j++) {
            let d = tc + j * COLL;
            if (d < p.d) {
                let o = at(p.dq, bh, q0 + r, d);
                let g = acc[i * D_PER_LANE + j] * p.scale;
                if (ACC_DQ) {
                    out_a[o] = out_a[o] + g;
                } else {
                    out_a[o] = g;
                }
            }
        }
    }
}

@compute @workgroup_size(WG)
fn attn_bwd_dkv(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let bh = wid.y;
    let k0 = wid.x * BC;
    let tr = lid / COLL;
    let tc = lid % COLL;

    // The first block of queries (scale * q, dO, lse, D) in flight while the keys are staged.
    // Queries before k0 see none of these keys.
    let first = (k0 / BR) * BR;
    fetch_q(bh, first, lid);
    fetch_do(bh, first, lid);
    fetch_ld(bh, first, lid);
    stage_keys(bh, k0, lid);
    var dk: array<f32, KR_PER_LANE * D_PER_LANE>;
    var dv: array<f32, KR_PER_LANE * D_PER_LANE>;
    for (var i = 0u; i < KR_PER_LANE * D_PER_LANE; i++) {
        dk[i] = 0.0;
        dv[i] = 0.0;
    }
    for (var q0 = first; q0 < p.t; q0 += BR) {
        put_queries(bh, q0, lid); // the tiles are free: the previous block is done with them
        workgroupBarrier();
        if (q0 + BR < p.t) {
            fetch_q(bh, q0 + BR, lid);
            fetch_do(bh, q0 + BR, lid);
            fetch_ld(bh, q0 + BR, lid);
        }
        probabilities(q0, k0, tr, tc);
        workgroupBarrier();
        // dV += P^T dO, dK += dS^T (scale q), over this block's queries.
        for (var r = 0u; r < BR; r++) {
            var pc: array<f32, KR_PER_LANE>;
            var dsc: array<f32, KR_PER_LANE>;
            var dor: array<f32, D_PER_LANE>;
            var qr: array<f32, D_PER_LANE>;
            for (var i = 0u; i < KR_PER_LANE; i++) {
                pc[i] = tile_s[r * SP + tr + i * ROWL];
                dsc[i] = tile_ds[r * SP + tr + i * ROWL];
            }
            for (var j = 0u; j < D_PER_LANE; j++) {
                dor[j] = tile_do[r * DP + tc + j * COLL];
                qr[j] = tile_q[r * DP + tc + j * COLL];
            }
            for (var i = 0u; i < KR_PER_LANE; i++) {
                for (var j = 0u; j < D_PER_LANE; j++) {
                    dv[i * D_PER_LANE + j] = fma(pc[i], dor[j], dv[i * D_PER_LANE + j]);
                    dk[i * D_PER_LANE + j] = fma(dsc[i], qr[j], dk[i * D_PER_LANE + j]);
                }
            }
        }
        workgroupBarrier(); // the query tiles are staged again next block
    }

    for (var i = 0u; i < KR_PER_LANE; i++) {
        let c = tr + i * ROWL;
        if (k0 + c >= p.t) { continue; }
        for (var j = 0u; j < D_PER_LANE; j++) {
            let d = tc + j * COLL;
            if (d < p.d) {
                let ok = at(p.dk, bh, k0 + c, d);
                let ov = at(p.dv, bh, k0 + c, d);
                if (ACC_DK) {
                    out_a[ok] = out_a[ok] + dk[i * D_PER_LANE + j];
                } else {
                    out_a[ok] = dk[i * D_PER_LANE + j];
                }
                if (ACC_DV) {
                    out_b[ov] = out_b[ov] + dv[i * D_PER_LANE + j];
                } else {
                    out_b[ov] = dv[i * D_PER_LANE + j];
                }
            }
        }
    }
}
