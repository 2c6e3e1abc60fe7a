// Batched matmul: C[b] (+)= A[b] @ B[b], A (batch, M, K), B (batch, K, N), C (batch, M, N).
// Every operand is read or written through strides, so a transposed operand (or a transposed
// gradient target) is a view, not a copy (a_ms/a_ks are A's strides along m and k; b_ks/b_ns
// B's along k and n; c_ms/c_ns C's along m and n; a batch stride of 0 broadcasts). With ACC
// the product is added into C (gradient accumulation without a temporary).
//
// Workgroup tile BM x BN, K in steps of BK staged in workgroup memory (zero-padded past M, N,
// K, so any size works); each of the (BM/TM)*(BN/TN) lanes accumulates a TM x TN register
// block, rows tr + i*(BM/TM) and columns tc + j*(BN/TN) (interleaved, so lanes of a subgroup
// read distinct workgroup-memory words and write coalesced columns). With VEC (TM and TN
// multiples of 4) the block is made of runs of 4 consecutive rows and columns instead: rows
// g*(BM/TM)*4 + tr*4 + (0..3) for each run g, columns likewise, and the tiles are vectors of 4,
// so a step of K reads a lane's TM + TN operands in (TM + TN) / 4 workgroup loads, not TM + TN
// (64x64x16/4x4 at 4096^3 on an H100: 24.4 TFLOP/s interleaved, 26.4 in runs, 2026-11-25).
// Grid: x over N tiles, y over M tiles, z over the batch (or over ranges of K: `k_range`).
// Epilogues (entry points): matmul (C (+)= A B), matmul_bias (+ bias per column),
// matmul_bias_gelu (also saves the pre-activation), matmul_bias_res (+ bias + a residual read
// through `pre`), matmul_sums (with ONES: the column sums of B too, below), matmul_split (one
// range of K of a split product, the sum and SPLIT_EPI's epilogue in the same dispatch:
// matmul_split_tail.wgsl). Specialization: BM, BN, BK, TM, TN, VEC, A_V4, B_V4 (operands read
// as vectors, below), ACC, ONES, SPLIT_EPI.
//
// ONES: A's last row (m = M - 1) is not read but taken as ones, so C's last row is the column
// sums of B (a linear's bias gradient beside its weight gradient, dW = x^T dz: the sums of dz
// over rows come with the product). matmul_sums stores that row to `pre` at bias_off (added
// into it with ACC); split into ranges of K (k_split > 0), the partials keep it as their row
// M - 1, and the split sum stores it.
//
// Types (aliases prepended with the constants): TA, TB, TC the element types of A, B and C
// (f32 or f16); TS the type the tiles are staged in: f16 for a mixed-precision product
// (operands rounded to f16 whatever their storage type, products accumulated in f32: the
// numerics of the cooperative-matrix kernel, on adapters without one), else f32. PE the
// element type of `pre`: f32, or f16 for GELU's pre-activation under autocast.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    a_off: u32,
    a_bs: u32,
    a_ms: u32,
    a_ks: u32,
    b_off: u32,
    b_bs: u32,
    b_ks: u32,
    b_ns: u32,
    c_off: u32,
    c_bs: u32,
    c_ms: u32,
    c_ns: u32,
    bias_off: u32,
    k_split: u32,
    res_off: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<TC>;
// A (batch, M, K) and B (batch, K, N) through strides, as vectors: element i is a[i >> 2][i & 3].
@group(0) @binding(2) var<storage, read> a: array<vec4<TA>>;
@group(0) @binding(3) var<storage, read> b: array<vec4<TB>>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;     // (N), matmul_bias*
// PE: f32, or f16 for GELU's pre-activation under autocast (matmul_bias_gelu only).
@group(0) @binding(5) var<storage, read_write> pre: array<PE>; // (batch, M, N), matmul_bias_gelu

// Element i of `pre` (the split tail, matmul_split_tail.wgsl, reads and writes `pre` through
// these; the cooperative-matrix kernel may bind it as vectors).
fn pre_get(i: u32) -> f32 {
    return f32(pre[i]);
}

fn pre_put(i: u32, v: f32) {
    pre[i] = PE(v);
}

const ROW_LANES: u32 = BM / TM;
const COL_LANES: u32 = BN / TN;
const WG: u32 = ROW_LANES * COL_LANES;

// The K range of this workgroup: all of K; or, split (k_split > 0, batch 1: z numbers the
// ranges, and C, or matmul_split's `part`, holds one partial product per range),
// [z * k_split, min(K, (z + 1) * k_split)).
var<private> k_lo: u32;
var<private> k_hi: u32;

fn k_range(wid: vec3<u32>) {
    k_lo = 0u;
    k_hi = p.k;
    if (p.k_split > 0u) {
        k_lo = wid.z * p.k_split;
        k_hi = min(p.k, k_lo + p.k_split);
    }
}


// Tiles in workgroup memory, [k][m] and [k][n], each row padded by one word so that lanes
// storing consecutive k (a row-major A read along k) land in different banks. With VEC the
// same as vectors of 4 (a_tile4, b_tile4: rows padded by one vector, which keeps lanes storing
// consecutive k of one m in different banks for BK up to 8), and the scalar tiles unused.
const A_ROW: u32 = BM + 1u;
const B_ROW: u32 = BN + 1u;
const A_ROW4: u32 = BM / 4u + 1u;
const B_ROW4: u32 = BN / 4u + 1u;
var<workgroup> a_tile: array<TS, select(BK * A_ROW, 1u, VEC)>;
var<workgroup> b_tile: array<TS, select(BK * B_ROW, 1u, VEC)>;
var<workgroup> a_tile4: array<vec4<TS>, select(1u, BK * A_ROW4, VEC)>;
var<workgroup> b_tile4: array<vec4<TS>, select(1u, BK * B_ROW4, VEC)>;

// Elements each lane stages per step of K, of A and of B.
const A_LOADS: u32 = (BM * BK + WG - 1u) / WG;
const B_LOADS: u32 = (BK * BN + WG - 1u) / WG;

// Element e of a step's A tile: (m, k) in the tile; consecutive lanes walk A's unit-stride dim
// (k for a row-major A, m for a transposed view), so global reads coalesce either way.
fn a_unit_m() -> bool {
    return p.a_ms == 1u && p.a_ks != 1u;
}

fn a_at(e: u32) -> vec2<u32> {
    if (a_unit_m()) {
        return vec2<u32>(e % BM, e / BM);
    }
    return vec2<u32>(e / BK, e % BK);
}

// Element e of a step's B tile: (k, n), along n for a row-major B, along k for a transposed view.
fn b_unit_k() -> bool {
    return p.b_ks == 1u && p.b_ns != 1u;
}

fn b_at(e: u32) -> vec2<u32> {
    if (b_unit_k()) {
        return vec2<u32>(e % BK, e / BK);
    }
    return vec2<u32>(e / BN, e % BN);
}

// A_V4 (B_V4): a step reads A (B) as whole vectors of 4 along its unit-stride dim, one load
// where there were four. The launcher sets it for VEC tiles only, where the operand's offset,
// batch stride and other stride are multiples of 4, every row's last vector, rounded up to 4
// elements, lies inside the binding, and (along k) BK is a multiple of 4 (so are the tile
// origins and the split ranges' starts, whole K steps: every vector starts on 4). Vector e of
// a step's tile starts at (m, k) (A) or (k, n) (B); the elements of a vector past M, N or the
// K range are masked to zero when it is stored.
const A_VECS: u32 = BM * BK / 4u;
const B_VECS: u32 = BK * BN / 4u;
const A_VLOADS: u32 = max((A_VECS + WG - 1u) / WG, 1u); // (1 where a tile holds under 4)
const B_VLOADS: u32 = max((B_VECS + WG - 1u) / WG, 1u);
// Vectors along a tile's m, n and k (1 where the tile is narrower than a vector: no A_V4 or
// B_V4 there).
const BM4: u32 = max(BM / 4u, 1u);
const BN4: u32 = max(BN / 4u, 1u);
const BK4: u32 = max(BK / 4u, 1u);

fn a_vec_at(e: u32) -> vec2<u32> {
    if (a_unit_m()) {
        return vec2<u32>((e % BM4) * 4u, e / BM4);
    }
    return vec2<u32>(e / BK4, (e % BK4) * 4u);
}

fn b_vec_at(e: u32) -> vec2<u32> {
    if (b_unit_k()) {
        return vec2<u32>((e % BK4) * 4u, e / BK4);
    }
    return vec2<u32>(e / BN4, (e % BN4) * 4u);
}

// The lane's TM x TN accumulators, element e = i * TN + j at acc[e / 4][e % 4] (with VEC, row
// i's run g of 4 columns is acc[i * TN / 4 + g]). A private variable, not a returned array: an
// 8 x 8 block returned by value went to local memory (256 bytes a lane), as a private variable
// it stays in registers (H100, 2026-11-25; `examples/shader_stats`).
const ACC4: u32 = (TM * TN + 3u) / 4u;
var<private> acc: array<vec4<f32>, ACC4>;

fn acc_at(e: u32) -> f32 {
    return acc[e / 4u][e % 4u];
}

// The next step's share of this lane, in registers while the current step multiplies: elements
// (or, with A_V4 / B_V4, vectors) and which of them lie inside the operand: bit i (4 bits a
// vector, one an element of it) of a_ok / b_ok; a_one (A_V4 with ONES): the elements that are
// A's row of ones.
var<private> a_next: array<TS, A_LOADS>;
var<private> b_next: array<TS, B_LOADS>;
var<private> a_next4: array<vec4<TS>, A_VLOADS>;
var<private> b_next4: array<vec4<TS>, B_VLOADS>;
var<private> a_ok: u32;
var<private> b_ok: u32;
var<private> a_one: u32;

const BIT4: vec4<u32> = vec4<u32>(1u, 2u, 4u, 8u);

// Of 4-bit group i of `bits`, which elements are set.
fn bits4(bits: u32, i: u32) -> vec4<bool> {
    return (vec4<u32>(bits >> (4u * i)) & BIT4) != vec4<u32>(0u);
}

// Loads the lane's share of the A tile at k0, rows from row0: branch-free (a lane outside the
// operand reads the binding's first vector), masked when stored.
fn fetch_a(lid: u32, row0: u32, k0: u32, base: u32) {
    a_ok = 0u;
    a_one = 0u;
    if (A_V4) {
        let rows = p.m - u32(ONES); // A's rows as stored: with ONES the last is not read
        for (var i = 0u; i < A_VLOADS; i++) {
            let e = lid + i * WG;
            let mk = a_vec_at(e);
            let gm = row0 + mk.x;
            let gk = k0 + mk.y;
            let inside = e < A_VECS && gm < rows && gk < k_hi;
            let nv = select(0u, min(4u, select(k_hi - gk, rows - gm, a_unit_m())), inside);
            a_next4[i] = vec4<TS>(a[select(0u, (base + gm * p.a_ms + gk * p.a_ks) >> 2u, nv > 0u)]);
            a_ok |= ((1u << nv) - 1u) << (4u * i);
            if (ONES) {
                // The elements of row M - 1 inside the K range are ones.
                let last = p.m - 1u;
                var one = 0u;
                if (a_unit_m()) {
                    one = select(0u, 1u << ((last - gm) & 3u), gm <= last && last < gm + 4u);
                } else {
                    one = select(0u, (1u << min(4u, k_hi - gk)) - 1u, gm == last);
                }
                a_one |= select(0u, one, e < A_VECS && gk < k_hi) << (4u * i);
            }
        }
        return;
    }
    for (var i = 0u; i < A_LOADS; i++) {
        let e = lid + i * WG;
        let mk = a_at(e);
        let gm = row0 + mk.x;
        let gk = k0 + mk.y;
        let inside = e < BM * BK && gm < p.m && gk < k_hi;
        let ones = ONES && gm == p.m - 1u;
        let o = select(0u, base + gm * p.a_ms + gk * p.a_ks, inside && !ones);
        a_next[i] = TS(a[o >> 2u][o & 3u]);
        if (ONES) {
            a_next[i] = select(a_next[i], TS(1.0), ones);
        }
        a_ok |= select(0u, 1u << i, inside);
    }
}

fn fetch_b(lid: u32, col0: u32, k0: u32, base: u32) {
    b_ok = 0u;
    if (B_V4) {
        for (var i = 0u; i < B_VLOADS; i++) {
            let e = lid + i * WG;
            let kn = b_vec_at(e);
            let gk = k0 + kn.x;
            let gn = col0 + kn.y;
            let inside = e < B_VECS && gk < k_hi && gn < p.n;
            let nv = select(0u, min(4u, select(p.n - gn, k_hi - gk, b_unit_k())), inside);
            b_next4[i] = vec4<TS>(b[select(0u, (base + gk * p.b_ks + gn * p.b_ns) >> 2u, nv > 0u)]);
            b_ok |= ((1u << nv) - 1u) << (4u * i);
        }
        return;
    }
    for (var i = 0u; i < B_LOADS; i++) {
        let e = lid + i * WG;
        let kn = b_at(e);
        let gk = k0 + kn.x;
        let gn = col0 + kn.y;
        let ok = e < BK * BN && gk < k_hi && gn < p.n;
        let o = select(0u, base + gk * p.b_ks + gn * p.b_ns, ok);
        b_next[i] = TS(b[o >> 2u][o & 3u]);
        b_ok |= select(0u, 1u << i, ok);
    }
}

// Stores the fetched share into the tiles, zero where it lies outside the operand. A vector
// along the tile's rows (A's m, B's n) is one store; along k, four.
fn stage_a(lid: u32) {
    if (A_V4) {
        for (var i = 0u; i < A_VLOADS; i++) {
            let e = lid + i * WG;
            if (e < A_VECS) {
                let mk = a_vec_at(e);
                var v = select(vec4<TS>(0.0), a_next4[i], bits4(a_ok, i));
                if (ONES) {
                    v = select(v, vec4<TS>(1.0), bits4(a_one, i));
                }
                if (a_unit_m()) {
                    a_tile4[mk.y * A_ROW4 + mk.x / 4u] = v;
                } else {
                    for (var c = 0u; c < 4u; c++) {
                        a_tile4[(mk.y + c) * A_ROW4 + mk.x / 4u][mk.x % 4u] = v[c];
                    }
                }
            }
        }
        return;
    }
    for (var i = 0u; i < A_LOADS; i++) {
        let e = lid + i * WG;
        if (e < BM * BK) {
            let mk = a_at(e);
            let v = select(TS(0.0), a_next[i], (a_ok & (1u << i)) != 0u);
            if (VEC) {
                a_tile4[mk.y * A_ROW4 + mk.x / 4u][mk.x % 4u] = v;
            } else {
                a_tile[mk.y * A_ROW + mk.x] = v;
            }
        }
    }
}

fn stage_b(lid: u32) {
    if (B_V4) {
        for (var i = 0u; i < B_VLOADS; i++) {
            let e = lid + i * WG;
            if (e < B_VECS) {
                let kn = b_vec_at(e);
                let v = select(vec4<TS>(0.0), b_next4[i], bits4(b_ok, i));
                if (b_unit_k()) {
                    for (var c = 0u; c < 4u; c++) {
                        b_tile4[(kn.x + c) * B_ROW4 + kn.y / 4u][kn.y % 4u] = v[c];
                    }
                } else {
                    b_tile4[kn.x * B_ROW4 + kn.y / 4u] = v;
                }
            }
        }
        return;
    }
    for (var i = 0u; i < B_LOADS; i++) {
        let e = lid + i * WG;
        if (e < BK * BN) {
            let kn = b_at(e);
            let v = select(TS(0.0), b_next[i], (b_ok & (1u << i)) != 0u);
            if (VEC) {
                b_tile4[kn.x * B_ROW4 + kn.y / 4u][kn.y % 4u] = v;
            } else {
                b_tile[kn.x * B_ROW + kn.y] = v;
            }
        }
    }
}

// The (TM x TN) block of A @ B this lane owns, for the workgroup's tile, into `acc`. The next
// step's elements are loaded into registers while this step multiplies, and stored after it; the
// loads are branch-free and masked at the store, so they are in flight during the multiply.
fn tile_product(wid: vec3<u32>, lid: u32) {
    let batch = wid.z;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let tr = lid / COL_LANES;
    let tc = lid % COL_LANES;
    let a_base = p.a_off + batch * p.a_bs;
    let b_base = p.b_off + batch * p.b_bs;

    for (var i = 0u; i < ACC4; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    var a_reg: array<f32, TM>;
    var b_reg: array<f32, TN>;

    k_range(wid);
    var k0 = k_lo;
    loop {
        // Loads for the step at k0 (the first one, or the next while this one multiplies).
        fetch_a(lid, row0, k0, a_base);
        fetch_b(lid, col0, k0, b_base);
        if (k0 > k_lo) {
            // Multiply the previous step out of the tiles, then store this one's elements.
            if (VEC) {
                multiply_vec(tr, tc);
            } else {
                for (var kk = 0u; kk < BK; kk++) {
                    for (var i = 0u; i < TM; i++) {
                        a_reg[i] = f32(a_tile[kk * A_ROW + tr + i * ROW_LANES]);
                    }
                    for (var j = 0u; j < TN; j++) {
                        b_reg[j] = f32(b_tile[kk * B_ROW + tc + j * COL_LANES]);
                    }
                    for (var i = 0u; i < TM; i++) {
                        for (var j = 0u; j < TN; j++) {
                            let e = i * TN + j;
                            acc[e / 4u][e % 4u] = fma(a_reg[i], b_reg[j], acc[e / 4u][e % 4u]);
                        }
                    }
                }
            }
            workgroupBarrier();
        }
        if (k0 >= k_hi) {
            break;
        }
        stage_a(lid);
        stage_b(lid);
        workgroupBarrier();
        k0 += BK;
    }
}

// VEC's multiply of one step: per k, the lane's TM / 4 runs of A and TN / 4 runs of B as one
// vector load each, then the TM x TN FMAs as TM x TN / 4 vector ones.
fn multiply_vec(tr: u32, tc: u32) {
    var a4: array<vec4<f32>, max(TM / 4u, 1u)>; // (one vector where a tile is not VEC's)
    var b4: array<vec4<f32>, max(TN / 4u, 1u)>;
    for (var kk = 0u; kk < BK; kk++) {
        for (var g = 0u; g < TM / 4u; g++) {
            a4[g] = vec4<f32>(a_tile4[kk * A_ROW4 + g * ROW_LANES + tr]);
        }
        for (var g = 0u; g < TN / 4u; g++) {
            b4[g] = vec4<f32>(b_tile4[kk * B_ROW4 + g * COL_LANES + tc]);
        }
        for (var i = 0u; i < TM; i++) {
            let x = vec4<f32>(a4[i / 4u][i % 4u]);
            for (var g = 0u; g < TN / 4u; g++) {
                let o = i * (TN / 4u) + g;
                acc[o] = fma(x, b4[g], acc[o]);
            }
        }
    }
}

// Row gm, column gn of this lane's block element (i, j); gm >= m or gn >= n is outside C.
fn lane_row(wid: vec3<u32>, lid: u32, i: u32) -> u32 {
    if (VEC) {
        return wid.y * BM + (i / 4u) * ROW_LANES * 4u + (lid / COL_LANES) * 4u + i % 4u;
    }
    return wid.y * BM + lid / COL_LANES + i * ROW_LANES;
}

fn lane_col(wid: vec3<u32>, lid: u32, j: u32) -> u32 {
    if (VEC) {
        return wid.x * BN + (j / 4u) * COL_LANES * 4u + (lid % COL_LANES) * 4u + j % 4u;
    }
    return wid.x * BN + lid % COL_LANES + j * COL_LANES;
}

fn store_c(o: u32, v: f32) {
    if (ACC) {
        c[o] = TC(f32(c[o]) + v);
    } else {
        c[o] = TC(v);
    }
}

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, acc_at(i * TN + j));
            }
        }
    }
}

// C = A @ B + bias (bias indexed by column).
@compute @workgroup_size(WG)
fn matmul_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                let z = acc_at(i * TN + j) + bias[p.bias_off + gn];
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, z);
            }
        }
    }
}

// C = A @ B + bias + R, with R (the residual a block adds the product to: contiguous (M, N) f32,
// batch 1) read through `pre` from res_off.
@compute @workgroup_size(WG)
fn matmul_bias_res(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                let z = acc_at(i * TN + j) + bias[p.bias_off + gn] + pre_get(p.res_off + gm * p.n + gn);
                store_c(p.c_off + gm * p.c_ms + gn * p.c_ns, z);
            }
        }
    }
}

// z = A @ B + bias saved to pre (contiguous (batch, M, N): GELU's backward reads it), and
// C = gelu(z), tanh approximation (GPT-2's).
@compute @workgroup_size(WG)
fn matmul_bias_gelu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                let z = acc_at(i * TN + j) + bias[p.bias_off + gn];
                pre_put((wid.z * p.m + gm) * p.n + gn, z);
                let k = 0.7978845608028654; // sqrt(2 / pi)
                let t = tanh(clamp(k * (z + 0.044715 * z * z * z), -15.0, 15.0));
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, 0.5 * z * (1.0 + t));
            }
        }
    }
}

// C (+)= A @ B with ONES, C's last row (the column sums of B) stored to pre at bias_off instead
// (unless split: the partials keep it). An entry point of its own: matmul's layout has no `pre`.
@compute @workgroup_size(WG)
fn matmul_sums(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                let v = acc_at(i * TN + j);
                if (gm == p.m - 1u && p.k_split == 0u) {
                    let o = p.bias_off + gn;
                    pre_put(o, select(v, pre_get(o) + v, ACC));
                } else {
                    store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, v);
                }
            }
        }
    }
}

// Whether this workgroup took its tile's last ticket (matmul_split_tail.wgsl): lane 0 stores
// the verdict, the workgroup reads it.
var<workgroup> split_last: u32;

fn split_verdict(last: bool) {
    split_last = select(0u, 1u, last);
}

fn split_is_last() -> bool {
    return workgroupUniformLoad(&split_last) != 0u;
}

// One range of K of a split product (p.batch ranges, z numbering them), its partial stored into
// `part` and the tile finished by the workgroup of its last range (matmul_split_tail.wgsl).
@compute @workgroup_size(WG)
fn matmul_split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_product(wid, lid);
    let base = part_base(wid);
    for (var i = 0u; i < TM; i++) {
        let r = lane_row(wid, lid, i) - wid.y * BM;
        for (var j = 0u; j < TN; j++) {
            put_part(base + r * BN + lane_col(wid, lid, j) - wid.x * BN, acc_at(i * TN + j));
        }
    }
    split_finish(wid, lid);
}
