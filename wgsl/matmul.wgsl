// Batched matmul: C[b] (+)= A[b] @ B[b], A (batch, M, K), B (batch, K, N), C (batch, M, N).
// Every operand is read or written through strides, so a transposed operand (or a transposed
// gradient target) is a view, not a copy (a_ms/a_ks are A's strides along m and k; b_ks/b_ns
// B's along k and n; c_ms/c_ns C's along m and n; a batch stride of 0 broadcasts). With ACC
// the product is added into C (gradient accumulation without a temporary).
//
// Workgroup tile BM x BN, K in steps of BK staged in workgroup memory (zero-padded past M, N,
// K, so any size works); each of the (BM/TM)*(BN/TN) lanes accumulates a TM x TN register
// block, rows tr + i*(BM/TM) and columns tc + j*(BN/TN) (interleaved, so lanes of a subgroup
// read distinct workgroup-memory words and write coalesced columns).
// Grid: x over N tiles, y over M tiles, z over the batch (or over ranges of K: `k_range`).
// Epilogues (entry points): matmul (C (+)= A B), matmul_bias (+ bias per column),
// matmul_bias_gelu (also saves the pre-activation). Specialization: BM, BN, BK, TM, TN, ACC.
//
// Types (aliases prepended with the constants): TA, TB, TC the element types of A, B and C
// (f32 or f16); TS the type the tiles are staged in: f16 for a mixed-precision product
// (operands rounded to f16 whatever their storage type, products accumulated in f32: the
// numerics of the cooperative-matrix kernel, on adapters without one), else f32.

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
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<TC>;
@group(0) @binding(2) var<storage, read> a: array<TA>;
@group(0) @binding(3) var<storage, read> b: array<TB>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;     // (N), matmul_bias*
@group(0) @binding(5) var<storage, read_write> pre: array<f32>; // (batch, M, N), matmul_bias_gelu

const ROW_LANES: u32 = BM / TM;
const COL_LANES: u32 = BN / TN;
const WG: u32 = ROW_LANES * COL_LANES;

// The K range of this workgroup: all of K; or, split (k_split > 0, batch 1: z numbers the
// ranges, and C holds one partial product per range, c_bs apart),
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
// storing consecutive k (a row-major A read along k) land in different banks.
const A_ROW: u32 = BM + 1u;
const B_ROW: u32 = BN + 1u;
var<workgroup> a_tile: array<TS, BK * A_ROW>;
var<workgroup> b_tile: array<TS, BK * B_ROW>;

// The (TM x TN) block of A @ B this lane owns, for the workgroup's tile.
fn tile_product(wid: vec3<u32>, lid: u32) -> array<f32, TM * TN> {
    let batch = wid.z;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let tr = lid / COL_LANES;
    let tc = lid % COL_LANES;
    let a_base = p.a_off + batch * p.a_bs;
    let b_base = p.b_off + batch * p.b_bs;

    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }
    var a_reg: array<f32, TM>;
    var b_reg: array<f32, TN>;

    k_range(wid);
    for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
        // Stage A: consecutive lanes walk A's unit-stride dim (k for a row-major A, m for a
        // transposed view), so global reads coalesce either way.
        let a_m_fast = p.a_ms == 1u && p.a_ks != 1u;
        for (var e = lid; e < BM * BK; e += WG) {
            var mm = e / BK;
            var kk = e % BK;
            if (a_m_fast) {
                mm = e % BM;
                kk = e / BM;
            }
            let gm = row0 + mm;
            let gk = k0 + kk;
            // Branch-free: every lane loads (element 0 of the binding when outside A) and
            // selects zero, so the loads of the whole stage are in flight together.
            let ok = gm < p.m && gk < k_hi;
            let v = TS(a[select(0u, a_base + gm * p.a_ms + gk * p.a_ks, ok)]);
            a_tile[kk * A_ROW + mm] = select(TS(0.0), v, ok);
        }
        // Stage B: likewise along n for a row-major B, along k for a transposed view.
        let b_k_fast = p.b_ks == 1u && p.b_ns != 1u;
        for (var e = lid; e < BK * BN; e += WG) {
            var kk = e / BN;
            var nn = e % BN;
            if (b_k_fast) {
                kk = e % BK;
                nn = e / BK;
            }
            let gk = k0 + kk;
            let gn = col0 + nn;
            let ok = gk < k_hi && gn < p.n;
            let v = TS(b[select(0u, b_base + gk * p.b_ks + gn * p.b_ns, ok)]);
            b_tile[kk * B_ROW + nn] = select(TS(0.0), v, ok);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            for (var i = 0u; i < TM; i++) {
                a_reg[i] = f32(a_tile[kk * A_ROW + tr + i * ROW_LANES]);
            }
            for (var j = 0u; j < TN; j++) {
                b_reg[j] = f32(b_tile[kk * B_ROW + tc + j * COL_LANES]);
            }
            for (var i = 0u; i < TM; i++) {
                for (var j = 0u; j < TN; j++) {
                    acc[i * TN + j] = fma(a_reg[i], b_reg[j], acc[i * TN + j]);
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}

// Row gm, column gn of this lane's block element (i, j); gm >= m or gn >= n is outside C.
fn lane_row(wid: vec3<u32>, lid: u32, i: u32) -> u32 {
    return wid.y * BM + lid / COL_LANES + i * ROW_LANES;
}

fn lane_col(wid: vec3<u32>, lid: u32, j: u32) -> u32 {
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
    let acc = tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, acc[i * TN + j]);
            }
        }
    }
}

// C = A @ B + bias (bias indexed by column).
@compute @workgroup_size(WG)
fn matmul_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let acc = tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                let z = acc[i * TN + j] + bias[p.bias_off + gn];
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, z);
            }
        }
    }
}

// z = A @ B + bias saved to pre (contiguous (batch, M, N): GELU's backward reads it), and
// C = gelu(z), tanh approximation (GPT-2's).
@compute @workgroup_size(WG)
fn matmul_bias_gelu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let acc = tile_product(wid, lid);
    for (var i = 0u; i < TM; i++) {
        let gm = lane_row(wid, lid, i);
        for (var j = 0u; j < TN; j++) {
            let gn = lane_col(wid, lid, j);
            if (gm < p.m && gn < p.n) {
                let z = acc[i * TN + j] + bias[p.bias_off + gn];
                pre[(wid.z * p.m + gm) * p.n + gn] = z;
                let k = 0.7978845608028654; // sqrt(2 / pi)
                let t = tanh(clamp(k * (z + 0.044715 * z * z * z), -15.0, 15.0));
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, 0.5 * z * (1.0 + t));
            }
        }
    }
}
