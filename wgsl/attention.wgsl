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
// Workgroup tiles hold vectors of 4 (`vec4`), so one workgroup load feeds 4 FMAs or more
// (with scalar tiles, about one load an FMA, the loads bound the kernels):
//   [row][d] tiles (q, k, v, dO): row r's d = 4 * d4 + e at [r * DP4 + d4][e], DP4 = DMAX/4 + 1
//     vectors a row; the odd stride puts the same d4 of 8 consecutive rows on 8 different
//     16-byte bank groups.
//   [query][key] tiles (S or P, dS): (r, c) at [r * SP4 + c / 4][c % 4], SP4 = BC/4 + 1.
// Staging zero-pads past T and past D (a D that is not a multiple of 4 fills its last vector
// with zeros), so any T and any D <= DMAX work; no row past T is written, and in attn_bwd_dkv
// a query past T gets probability 0.
//
// Workgroup mapping: ROWL x COLL = WG lanes (128 by default; 64 to 256).
//   S = q k^T, dP = dO v^T (sums over d): lane (tr, tc) (`score_lane`: a subgroup of 32 covers
//     4 rows x 8 columns) owns queries tr + i * ROWL and keys tc + j * COLL; per 4 d's it loads
//     one vector of q (dO) per query and of k (v) per key.
//   O = P v, dQ = dS k (sums over keys): the same lane owns the same queries and the vectors
//     of d's tc + g * COLL; per 4 keys it loads one vector of P (dS) per query and one of v
//     (k) per key and vector of d's.
//   dV = P^T dO, dK = dS^T q (sums over queries): lane (qs, kr, kc), kc = lid % D4 with
//     D4 = DMAX / 4, owns the runs of 4 keys 4 * (kr + i * DKV_ROWL) + 0..3 and the vector kc
//     of d's; per query it loads one vector of P and of dS per run and one of dO and of q.
//     Where the lanes outnumber the BC / 4 x D4 (run, vector) pairs, DKV_QS lanes share a
//     pair (BR a multiple of DKV_QS), lane qs summing the block's queries qs, qs + DKV_QS,
//     ...; their partial sums meet through tile_k and tile_v (free by then) once every block
//     is done. The loop over a block's queries has a constant trip count, and where none
//     share qs is the constant 0: started at a lane's qs, it cost dK/dV 3.08 -> 3.47 ms a step
//     at 8 x 512 (H100 and H200, 2026-11-25/26, PROFILING.md).
//   Accumulators that outlive a block (O, dQ, dK, dV) are module-scope vectors (`acc`,
//   `acc_dv`).
// Workgroups:
//   attn_fwd, attn_bwd_dq: one workgroup per (block of BR queries, b * H + h) = (wid.x
//     reversed, wid.y), looping over blocks of BC keys up to the diagonal; the last query
//     blocks have the most keys, so they are numbered first.
//   attn_bwd_dkv: one workgroup per (block of BC keys, b * H + h), looping over the blocks of
//     BR queries at or after it (the first key blocks have the most, and come first).
// The blocks a workgroup loops over (keys; queries for attn_bwd_dkv) arrive a block ahead: a
// lane loads its share of the next block into registers (`fetch_*`) as soon as the current one
// is in the tiles and stores it (`put_*`) when the tiles are free again, so the loads' latency
// hides behind a block's arithmetic instead of stalling every block.
//
// Specialization: KIND (0 fwd, 1 dq, 2 dkv; sizes the workgroup arrays: every entry point is
// compiled under each variant's constants, and HLSL declares every groupshared array of the
// file, so the arrays a kind does not use get one element), DMAX (head dim padded: 32, 64 or
// 128), BR, BC (query and key block, multiples of 4), ROWL, COLL (lane grid, COLL a multiple
// of 8; `Tile::runs` in src/kernels/attention.rs lists what the mappings above need), ACC_DQ,
// ACC_DK, ACC_DV (add the gradient into its target instead of overwriting it), ROPE (rotary
// position embedding of q and k, below).
//
// Grouped-query attention: H = p.heads query heads share H / G key/value heads, G = p.group
// (1: plain multi-head attention); query head h reads kv head h / G (`kv_bh`). k, v, dK, dV
// are (B, H / G, T, D) views, read through `head` with a bh whose h is the kv head. attn_bwd_dkv
// runs one workgroup per (block of keys, b * H / G + kv head) and loops over the G query heads
// of its group, accumulating dK and dV in registers (FlashAttention-2's GQA backward, no
// atomics).
// Rotary position embedding (ROPE, Hugging Face's rotate_half convention, Su et al. 2021): q and
// k are rotated as they are loaded, x_rot[d] = x[d] cos - x[d + D/2] sin (d < D/2) and
// x[d] cos + x[d - D/2] sin (d >= D/2), at angle (p.start + t) * inv_freq[d mod D/2], cos and
// sin read from the table `rope` ((positions, D) f32: a row's D/2 cosines then its D/2 sines,
// computed on the host). dQ and dK leave rotated back (the transpose, `back`), so the kernels'
// inputs and gradients are the un-rotated projections; v is not rotated.

struct Params {
    heads: u32,
    t: u32,
    d: u32,
    batch: u32,
    scale: f32,
    group: u32, // query heads per key/value head
    start: u32, // the position of row t = 0 (ROPE)
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
@group(0) @binding(9) var<storage, read> rope: array<f32>; // (positions, D): cos | sin (ROPE)

const KIND_FWD: u32 = 0u;
const KIND_DQ: u32 = 1u;
const KIND_DKV: u32 = 2u;

const WG: u32 = ROWL * COLL;
const D4: u32 = DMAX / 4u;     // vectors of 4 along the head dim
const DP4: u32 = D4 + 1u;      // [row][d] tile row stride, in vectors
const SP4: u32 = BC / 4u + 1u; // [query][key] tile row stride, in vectors
// Register blocks per lane; at least 1, since an entry point's locals are validated under the
// other kinds' constants too.
const Q_PER_LANE: u32 = max(1u, BR / ROWL);  // query rows of a [query][key] tile, O and dQ
const K_PER_LANE: u32 = max(1u, BC / COLL);  // key columns of a [query][key] tile
const D4_PER_LANE: u32 = max(1u, D4 / COLL); // vectors of d columns of O, dQ
// dK and dV: D4 lanes across the head dim (one vector each), DKV_ROWL across runs of 4 keys,
// DKV_QS across the queries of a block (1 unless WG > BC / 4 * D4).
const DKV_ROWL: u32 = max(1u, min(BC / 4u, WG / D4));
const DKV_QS: u32 = max(1u, WG / (D4 * DKV_ROWL));
const KRUNS_PER_LANE: u32 = max(1u, BC / 4u / DKV_ROWL);
// The score of a masked pair: finite, so exp(NEG_BIG - m) is 0 and exp(m_old - m_new) is
// never NaN (every query row has key 0 in its first block, so m is finite after it).
const NEG_BIG: f32 = -1e30;

const BWD: bool = KIND != KIND_FWD;
var<workgroup> tile_q: array<vec4<f32>, BR * DP4>;                              // scale * q
var<workgroup> tile_k: array<vec4<f32>, BC * DP4>;                              // k (fwd: then v)
var<workgroup> tile_do: array<vec4<f32>, select(1u, BR * DP4, BWD)>;            // dO
var<workgroup> tile_v: array<vec4<f32>, select(1u, BC * DP4, BWD)>;             // v
var<workgroup> tile_s: array<vec4<f32>, select(1u, BR * SP4, KIND != KIND_DQ)>; // S, then P
var<workgroup> tile_ds: array<vec4<f32>, select(1u, BR * SP4, BWD)>;            // dS
var<workgroup> red: array<f32, select(1u, BR * COLL, !BWD)>;                    // a row's partials
var<workgroup> lse_row: array<f32, select(1u, BR, BWD)>;
var<workgroup> dvec_row: array<f32, select(1u, BR, BWD)>;                       // D

// The accumulators a lane keeps across blocks, vectors of 4 d's: O or dQ (row i's vector g at
// acc[i * D4_PER_LANE + g]), or dK (key 4 * (kr + i * DKV_ROWL) + e at acc[4 * i + e]) with dV
// in acc_dv. Module-scope, as in wgsl/matmul.wgsl (where an accumulator array returned by value
// went to local memory on NVIDIA); not checked with `shader_stats` for this kernel.
const ACC4: u32 = max(Q_PER_LANE * D4_PER_LANE, 4u * KRUNS_PER_LANE);
var<private> acc: array<vec4<f32>, ACC4>;
var<private> acc_dv: array<vec4<f32>, 4u * KRUNS_PER_LANE>;

// c + a . b, summed along d in order (the same rounding as the scalar loop it replaced).
fn dot_add(a: vec4<f32>, b: vec4<f32>, c: f32) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, c))));
}

// Lane lid's place (tr, tc) in the ROWL x COLL grid of [query][key] blocks, such that a
// subgroup of 32 lanes covers 4 rows x 8 columns: a step of S = q k^T loads 4 rows of q and
// 8 of k (128 bytes on 8 bank groups) per vector load, not 2 and 16.
fn score_lane(lid: u32) -> vec2<u32> {
    return vec2<u32>((lid / 8u) % ROWL, lid % 8u + 8u * (lid / (8u * ROWL)));
}

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

// The bh of query head bh's key/value head, for `head` on a (B, H / G, T, D) view.
fn kv_bh(bh: u32) -> u32 {
    let h = bh % p.heads;
    return bh - h + h / p.group;
}

// Element d of a row at position `pos` rotated (x its value, xp its partner's at
// (d + D/2) mod D), or with `back` rotated back (the transpose, for gradients).
fn rotate(x: f32, xp: f32, pos: u32, d: u32, back: bool) -> f32 {
    let half = p.d / 2u;
    let row = (p.start + pos) * p.d + d % half;
    let sign = select(1.0, -1.0, (d < half) != back);
    return fma(x, rope[row], sign * xp * rope[row + half]);
}

// Element i (column d, at position pos) of q or k as the scores see it: rotated under ROPE
// (its partner read too; outside the view, !ok, element 0 of the table).
fn partner(i: u32, d: u32, ok: bool) -> u32 {
    return select(0u, i - d + (d + p.d / 2u) % p.d, ok);
}

fn q_at(i: u32, d: u32, pos: u32, ok: bool) -> f32 {
    if (!ROPE) {
        return q[i];
    }
    return rotate(q[i], q[partner(i, d, ok)], select(0u, pos, ok), select(0u, d, ok), false);
}

fn k_at(i: u32, d: u32, pos: u32, ok: bool) -> f32 {
    if (!ROPE) {
        return k[i];
    }
    return rotate(k[i], k[partner(i, d, ok)], select(0u, pos, ok), select(0u, d, ok), false);
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
// head at `base` (0 outside the view, with ok false) and its place in a [row][d] tile (vector
// tile / 4, component tile % 4).
struct Elem {
    i: u32,
    r: u32,
    d: u32,
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
    return Elem(select(0u, base + (row0 + r) * view.w + d, ok), r, d, r * DP4 * 4u + d, ok,
                inside);
}
// (One function per source: each entry point binds only what it reads.)
fn fetch_k(bh: u32, row0: u32, lid: u32) {
    let base = head(p.k, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(p.k, base, row0, lid, j);
        nx0[j] = k_at(a.i, a.d, row0 + a.r, a.ok);
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
        let a = elem(p.q, base, row0, lid, j);
        nx0[j] = q_at(a.i, a.d, row0 + a.r, a.ok) * p.scale;
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
            tile_k[a.tile / 4u][a.tile % 4u] = select(0.0, nx0[j], a.ok);
        }
    }
}

fn put_v_in_k(view: vec4<u32>, bh: u32, row0: u32, lid: u32) {
    let base = head(view, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(view, base, row0, lid, j);
        if (a.inside) {
            tile_k[a.tile / 4u][a.tile % 4u] = select(0.0, nx1[j], a.ok);
        }
    }
}

fn put_v(view: vec4<u32>, bh: u32, row0: u32, lid: u32) {
    let base = head(view, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(view, base, row0, lid, j);
        if (a.inside) {
            tile_v[a.tile / 4u][a.tile % 4u] = select(0.0, nx1[j], a.ok);
        }
    }
}

fn put_queries(bh: u32, row0: u32, lid: u32) {
    let base = head(p.q, bh);
    for (var j = 0u; j < NPL; j++) {
        let a = elem(p.q, base, row0, lid, j);
        if (a.inside) {
            tile_q[a.tile / 4u][a.tile % 4u] = select(0.0, nx0[j], a.ok);
            tile_do[a.tile / 4u][a.tile % 4u] = select(0.0, nx1[j], a.ok);
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
    let kv = kv_bh(bh);
    let q0 = (nwg.x - 1u - wid.x) * BR;
    let lane = score_lane(lid);
    let tr = lane.x;
    let tc = lane.y;

    // The first block of keys and values in flight while the queries are staged.
    fetch_k(kv, 0u, lid);
    fetch_v(kv, 0u, lid);
    for (var e = lid; e < BR * DMAX; e += WG) {
        let r = e / DMAX;
        let d = e % DMAX;
        // Branch-free (loads under per-lane branches are not overlapped): outside the view a
        // lane reads element 0 and selects zero.
        let ok = q0 + r < p.t && d < p.d;
        let x = q_at(select(0u, at(p.q, bh, q0 + r, d), ok), d, q0 + r, ok) * p.scale;
        tile_q[r * DP4 + d / 4u][d % 4u] = select(0.0, x, ok);
    }
    // The running max of each of this lane's rows (the same in every lane of the row) and the
    // sum of exp(s - m) over this lane's columns of it; O, unnormalized, in `acc`.
    var m: array<f32, Q_PER_LANE>;
    var l: array<f32, Q_PER_LANE>;
    for (var i = 0u; i < Q_PER_LANE; i++) {
        m[i] = NEG_BIG;
        l[i] = 0.0;
    }
    for (var i = 0u; i < ACC4; i++) {
        acc[i] = vec4<f32>(0.0);
    }

    let keys = min(q0 + BR, p.t); // the causal mask ends at the block's last query
    for (var k0 = 0u; k0 < keys; k0 += BC) {
        put_k(p.k, kv, k0, lid); // tile_k is free: the previous block's P v is done
        workgroupBarrier();
        if (k0 + BC < keys) {
            fetch_k(kv, k0 + BC, lid);
        }

        // S = (scale q) k^T for this lane's block, masked to keys <= query.
        var s: array<f32, Q_PER_LANE * K_PER_LANE>;
        for (var i = 0u; i < Q_PER_LANE * K_PER_LANE; i++) {
            s[i] = 0.0;
        }
        for (var d4 = 0u; d4 < D4; d4++) {
            var qr: array<vec4<f32>, Q_PER_LANE>;
            var kc: array<vec4<f32>, K_PER_LANE>;
            for (var i = 0u; i < Q_PER_LANE; i++) {
                qr[i] = tile_q[(tr + i * ROWL) * DP4 + d4];
            }
            for (var j = 0u; j < K_PER_LANE; j++) {
                kc[j] = tile_k[(tc + j * COLL) * DP4 + d4];
            }
            for (var i = 0u; i < Q_PER_LANE; i++) {
                for (var j = 0u; j < K_PER_LANE; j++) {
                    s[i * K_PER_LANE + j] = dot_add(qr[i], kc[j], s[i * K_PER_LANE + j]);
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
                let c = tc + j * COLL;
                let pc = exp(s[i * K_PER_LANE + j] - m_new);
                tile_s[r * SP4 + c / 4u][c % 4u] = pc;
                sum += pc;
            }
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
            for (var g = 0u; g < D4_PER_LANE; g++) {
                acc[i * D4_PER_LANE + g] *= alpha;
            }
        }
        put_v_in_k(p.v, kv, k0, lid);
        workgroupBarrier();
        if (k0 + BC < keys) {
            fetch_v(kv, k0 + BC, lid);
        }

        // O += P v (tile_k holds v).
        rows_times_keys(tr, tc);
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
        for (var g = 0u; g < D4_PER_LANE; g++) {
            for (var e = 0u; e < 4u; e++) {
                let d = 4u * (tc + g * COLL) + e;
                if (d < p.d) {
                    out_a[at(p.o, bh, q0 + r, d)] = acc[i * D4_PER_LANE + g][e] * inv_l;
                }
            }
        }
        if (tc == 0u) {
            out_b[bh * p.t + q0 + r] = m[i] + log(l_row);
        }
    }
}

// acc += X Y over this block's keys: X the [query][key] tile (tile_s: P, forward; tile_ds: dS,
// dQ), Y the [key][d] tile_k (forward: v; dQ: k). Per 4 keys a lane loads one vector of X per
// row and one of Y per key and vector of d: Q_PER_LANE + 4 * D4_PER_LANE loads for
// 16 * Q_PER_LANE * D4_PER_LANE FMAs.
fn rows_times_keys(tr: u32, tc: u32) {
    for (var c4 = 0u; c4 < BC / 4u; c4++) {
        var xr: array<vec4<f32>, Q_PER_LANE>;
        for (var i = 0u; i < Q_PER_LANE; i++) {
            let at_x = (tr + i * ROWL) * SP4 + c4;
            if (KIND == KIND_DQ) {
                xr[i] = tile_ds[at_x];
            } else {
                xr[i] = tile_s[at_x];
            }
        }
        for (var e = 0u; e < 4u; e++) {
            var yc: array<vec4<f32>, D4_PER_LANE>;
            for (var g = 0u; g < D4_PER_LANE; g++) {
                yc[g] = tile_k[(4u * c4 + e) * DP4 + tc + g * COLL];
            }
            for (var i = 0u; i < Q_PER_LANE; i++) {
                for (var g = 0u; g < D4_PER_LANE; g++) {
                    let o = i * D4_PER_LANE + g;
                    acc[o] = fma(vec4<f32>(xr[i][e]), yc[g], acc[o]);
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward. Both kernels stage (scale q) and dO for BR queries and k, v for BC keys, and
// compute P and dS of the same [query][key] block per lane.

// P and dS of this lane's block of (query block q0, key block k0), into tile_ds and (for
// attn_bwd_dkv, which needs P too) tile_s. Needs tile_q, tile_do, tile_k, tile_v, lse_row and
// dvec_row staged. A step of 4 d's loads 2 * (Q_PER_LANE + K_PER_LANE) vectors for
// 8 * Q_PER_LANE * K_PER_LANE FMAs.
fn probabilities(q0: u32, k0: u32, tr: u32, tc: u32) {
    var s: array<f32, Q_PER_LANE * K_PER_LANE>;
    var dp: array<f32, Q_PER_LANE * K_PER_LANE>;
    for (var i = 0u; i < Q_PER_LANE * K_PER_LANE; i++) {
        s[i] = 0.0;
        dp[i] = 0.0;
    }
    for (var d4 = 0u; d4 < D4; d4++) {
        var qr: array<vec4<f32>, Q_PER_LANE>;
        var dor: array<vec4<f32>, Q_PER_LANE>;
        var kc: array<vec4<f32>, K_PER_LANE>;
        var vc: array<vec4<f32>, K_PER_LANE>;
        for (var i = 0u; i < Q_PER_LANE; i++) {
            qr[i] = tile_q[(tr + i * ROWL) * DP4 + d4];
            dor[i] = tile_do[(tr + i * ROWL) * DP4 + d4];
        }
        for (var j = 0u; j < K_PER_LANE; j++) {
            kc[j] = tile_k[(tc + j * COLL) * DP4 + d4];
            vc[j] = tile_v[(tc + j * COLL) * DP4 + d4];
        }
        for (var i = 0u; i < Q_PER_LANE; i++) {
            for (var j = 0u; j < K_PER_LANE; j++) {
                s[i * K_PER_LANE + j] = dot_add(qr[i], kc[j], s[i * K_PER_LANE + j]);
                dp[i * K_PER_LANE + j] = dot_add(dor[i], vc[j], dp[i * K_PER_LANE + j]);
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
                tile_s[r * SP4 + c / 4u][c % 4u] = pij;
            }
            tile_ds[r * SP4 + c / 4u][c % 4u] = pij * (dp[i * K_PER_LANE + j] - dvec_row[r]);
        }
    }
}

// Stages the dQ pass's own BR rows of (scale q) and dO from query q0 (zero past T and D).
fn stage_queries(bh: u32, q0: u32, lid: u32) {
    for (var e = lid; e < BR * DMAX; e += WG) {
        let r = e / DMAX;
        let d = e % DMAX;
        let ok = q0 + r < p.t && d < p.d;
        let x = q_at(select(0u, at(p.q, bh, q0 + r, d), ok), d, q0 + r, ok) * p.scale;
        let g = dout[select(0u, at(p.dout, bh, q0 + r, d), ok)];
        tile_q[r * DP4 + d / 4u][d % 4u] = select(0.0, x, ok);
        tile_do[r * DP4 + d / 4u][d % 4u] = select(0.0, g, ok);
    }
}

// Stages the dK/dV pass's own BC rows of k and v from key k0 (zero past T and D).
fn stage_keys(bh: u32, k0: u32, lid: u32) {
    for (var e = lid; e < BC * DMAX; e += WG) {
        let c = e / DMAX;
        let d = e % DMAX;
        let ok = k0 + c < p.t && d < p.d;
        let x = k_at(select(0u, at(p.k, bh, k0 + c, d), ok), d, k0 + c, ok);
        let y = v[select(0u, at(p.v, bh, k0 + c, d), ok)];
        tile_k[c * DP4 + d / 4u][d % 4u] = select(0.0, x, ok);
        tile_v[c * DP4 + d / 4u][d % 4u] = select(0.0, y, ok);
    }
}

@compute @workgroup_size(WG)
fn attn_bwd_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let bh = wid.y;
    let kv = kv_bh(bh);
    let q0 = (nwg.x - 1u - wid.x) * BR;
    let lane = score_lane(lid);
    let tr = lane.x;
    let tc = lane.y;

    // The first block of keys and values in flight while the queries are staged.
    fetch_k(kv, 0u, lid);
    fetch_v(kv, 0u, lid);
    stage_queries(bh, q0, lid);
    // D = rowsum(dO * O): each lane sums its columns of its rows, partials meet in tile_ds
    // (row r's COLL partials at words 0.. of its row: COLL <= BC + 4).
    for (var i = 0u; i < Q_PER_LANE; i++) {
        let r = tr + i * ROWL;
        var part = 0.0;
        if (q0 + r < p.t) {
            for (var d = tc; d < p.d; d += COLL) {
                part = fma(dout[at(p.dout, bh, q0 + r, d)], aux[at(p.o, bh, q0 + r, d)], part);
            }
        }
        tile_ds[r * SP4 + tc / 4u][tc % 4u] = part;
    }
    workgroupBarrier();
    if (lid < BR) {
        var dsum = 0.0;
        for (var c = 0u; c < COLL; c++) {
            dsum += tile_ds[lid * SP4 + c / 4u][c % 4u];
        }
        dvec_row[lid] = dsum;
        var l = 0.0;
        if (q0 + lid < p.t) {
            out_b[bh * p.t + q0 + lid] = dsum;
            l = lse[bh * p.t + q0 + lid];
        }
        lse_row[lid] = l;
    }

    for (var i = 0u; i < ACC4; i++) {
        acc[i] = vec4<f32>(0.0); // dQ / scale
    }
    let keys = min(q0 + BR, p.t);
    for (var k0 = 0u; k0 < keys; k0 += BC) {
        workgroupBarrier(); // the previous block (or D's partials) is done with the tiles
        put_k(p.k, kv, k0, lid);
        put_v(p.v, kv, k0, lid);
        workgroupBarrier();
        if (k0 + BC < keys) {
            fetch_k(kv, k0 + BC, lid);
            fetch_v(kv, k0 + BC, lid);
        }
        probabilities(q0, k0, tr, tc);
        workgroupBarrier();
        rows_times_keys(tr, tc); // dQ += dS k
    }

    // ROPE: dQ rotated back needs each element's partner at d +- D/2, another lane's: all of
    // dQ / scale goes through tile_q (no lane reads it after the last block's `probabilities`).
    if (ROPE) {
        for (var i = 0u; i < Q_PER_LANE; i++) {
            for (var g = 0u; g < D4_PER_LANE; g++) {
                tile_q[(tr + i * ROWL) * DP4 + tc + g * COLL] = acc[i * D4_PER_LANE + g];
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < Q_PER_LANE; i++) {
        let r = tr + i * ROWL;
        if (q0 + r >= p.t) { continue; }
        for (var g = 0u; g < D4_PER_LANE; g++) {
            for (var e = 0u; e < 4u; e++) {
                let d = 4u * (tc + g * COLL) + e;
                if (d < p.d) {
                    let o = at(p.dq, bh, q0 + r, d);
                    var grad = acc[i * D4_PER_LANE + g][e] * p.scale;
                    if (ROPE) {
                        let dp = (d + p.d / 2u) % p.d;
                        let gp = tile_q[r * DP4 + dp / 4u][dp % 4u] * p.scale;
                        grad = rotate(grad, gp, q0 + r, d, true);
                    }
                    if (ACC_DQ) {
                        out_a[o] = out_a[o] + grad;
                    } else {
                        out_a[o] = grad;
                    }
                }
            }
        }
    }
}

@compute @workgroup_size(WG)
fn attn_bwd_dkv(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    // wid.y = b * H / G + its kv head hk: k, v, dK, dV through bhk, the group's query heads
    // bh0 ..= bh0 + G - 1.
    let kv_heads = p.heads / p.group;
    let b = wid.y / kv_heads;
    let hk = wid.y % kv_heads;
    let bhk = b * p.heads + hk;
    let bh0 = b * p.heads + hk * p.group;
    let k0 = wid.x * BC;
    let lane = score_lane(lid);
    let tr = lane.x;
    let tc = lane.y;
    // This lane's runs of 4 keys of dK, dV (kr + i * DKV_ROWL), its vector of d's (kc) and
    // its share of a block's queries (qs + j * DKV_QS).
    let kc = lid % D4;
    let kr = (lid / D4) % DKV_ROWL;
    let qs = select(lid / (D4 * DKV_ROWL), 0u, DKV_QS == 1u); // a constant where none share

    // The first block of queries (scale * q, dO, lse, D) in flight while the keys are staged.
    // Queries before k0 see none of these keys. The blocks run head by head over the group,
    // from `first` to T for query head bh0, then bh0 + 1, ... (bh, q0 step along: no division
    // in the loop).
    let first = (k0 / BR) * BR;
    let blocks = (p.t - first + BR - 1u) / BR * p.group;
    var bh = bh0;
    var q0 = first;
    fetch_q(bh0, first, lid);
    fetch_do(bh0, first, lid);
    fetch_ld(bh0, first, lid);
    stage_keys(bhk, k0, lid);
    for (var i = 0u; i < 4u * KRUNS_PER_LANE; i++) {
        acc[i] = vec4<f32>(0.0); // dK
        acc_dv[i] = vec4<f32>(0.0);
    }
    for (var jb = 0u; jb < blocks; jb++) {
        var next_bh = bh;
        var next_q0 = q0 + BR;
        if (next_q0 >= p.t) {
            next_bh = bh + 1u;
            next_q0 = first;
        }
        put_queries(bh, q0, lid); // the tiles are free: the previous block is done with them
        workgroupBarrier();
        if (jb + 1u < blocks) {
            fetch_q(next_bh, next_q0, lid);
            fetch_do(next_bh, next_q0, lid);
            fetch_ld(next_bh, next_q0, lid);
        }
        probabilities(q0, k0, tr, tc);
        workgroupBarrier();
        // dV += P^T dO, dK += dS^T (scale q), over this lane's share of the block's queries
        // (all of them where DKV_QS is 1): per query a lane loads P and dS of its keys (a
        // vector per run) and a vector of dO and of q, for 32 * KRUNS_PER_LANE FMAs.
        for (var j = 0u; j < BR / DKV_QS; j++) {
            let r = j * DKV_QS + qs;
            var pc: array<vec4<f32>, KRUNS_PER_LANE>;
            var dsc: array<vec4<f32>, KRUNS_PER_LANE>;
            for (var i = 0u; i < KRUNS_PER_LANE; i++) {
                pc[i] = tile_s[r * SP4 + kr + i * DKV_ROWL];
                dsc[i] = tile_ds[r * SP4 + kr + i * DKV_ROWL];
            }
            let dor = tile_do[r * DP4 + kc];
            let qr = tile_q[r * DP4 + kc];
            for (var i = 0u; i < KRUNS_PER_LANE; i++) {
                for (var e = 0u; e < 4u; e++) {
                    let o = 4u * i + e;
                    acc_dv[o] = fma(vec4<f32>(pc[i][e]), dor, acc_dv[o]);
                    acc[o] = fma(vec4<f32>(dsc[i][e]), qr, acc[o]);
                }
            }
        }
        workgroupBarrier(); // the query tiles are staged again next block
        bh = next_bh;
        q0 = next_q0;
    }

    // The query shares' partial sums meet in tile_k (dK) and tile_v (dV), [key][d] tiles no
    // block reads any more: share 1 stores its own, the others add theirs in turn, share 0
    // adds the total to its own and writes it.
    if (DKV_QS > 1u) {
        for (var g = 1u; g < DKV_QS; g++) {
            if (qs == g) {
                for (var i = 0u; i < KRUNS_PER_LANE; i++) {
                    for (var e = 0u; e < 4u; e++) {
                        let o = 4u * i + e;
                        let at_kd = (4u * (kr + i * DKV_ROWL) + e) * DP4 + kc;
                        if (g == 1u) {
                            tile_k[at_kd] = acc[o];
                            tile_v[at_kd] = acc_dv[o];
                        } else {
                            tile_k[at_kd] += acc[o];
                            tile_v[at_kd] += acc_dv[o];
                        }
                    }
                }
            }
            workgroupBarrier();
        }
        if (qs == 0u) {
            for (var i = 0u; i < KRUNS_PER_LANE; i++) {
                for (var e = 0u; e < 4u; e++) {
                    let o = 4u * i + e;
                    let at_kd = (4u * (kr + i * DKV_ROWL) + e) * DP4 + kc;
                    acc[o] += tile_k[at_kd];
                    acc_dv[o] += tile_v[at_kd];
                }
            }
        }
    }

    // ROPE: dK rotated back needs each element's partner at d +- D/2, another lane's: the
    // totals go through tile_k (free once the shares' sums are read out of it).
    if (ROPE) {
        workgroupBarrier();
        if (qs == 0u) {
            for (var i = 0u; i < KRUNS_PER_LANE; i++) {
                for (var e = 0u; e < 4u; e++) {
                    tile_k[(4u * (kr + i * DKV_ROWL) + e) * DP4 + kc] = acc[4u * i + e];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < KRUNS_PER_LANE; i++) {
        for (var e = 0u; e < 4u; e++) {
            let c = 4u * (kr + i * DKV_ROWL) + e;
            if (k0 + c >= p.t || qs != 0u) { continue; }
            for (var f = 0u; f < 4u; f++) {
                let d = 4u * kc + f;
                if (d < p.d) {
                    let ok = at(p.dk, bhk, k0 + c, d);
                    let ov = at(p.dv, bhk, k0 + c, d);
                    var dk = acc[4u * i + e][f];
                    if (ROPE) {
                        let dp = (d + p.d / 2u) % p.d;
                        dk = rotate(dk, tile_k[c * DP4 + dp / 4u][dp % 4u], k0 + c, d, true);
                    }
                    if (ACC_DK) {
                        out_a[ok] = out_a[ok] + dk;
                    } else {
                        out_a[ok] = dk;
                    }
                    if (ACC_DV) {
                        out_b[ov] = out_b[ov] + acc_dv[4u * i + e][f];
                    } else {
                        out_b[ov] = acc_dv[4u * i + e][f];
                    }
                }
            }
        }
    }
}
