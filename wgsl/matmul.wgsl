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
// Grid: x over N tiles, y over M tiles, z over the batch.
// Specialization: BM, BN, BK, TM, TN, ACC.

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
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;

const ROW_LANES: u32 = BM / TM;
const COL_LANES: u32 = BN / TN;
const WG: u32 = ROW_LANES * COL_LANES;

var<workgroup> a_tile: array<f32, BK * BM>; // [k][m]
var<workgroup> b_tile: array<f32, BK * BN>; // [k][n]

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
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

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // Stage A: consecutive lanes take consecutive k (coalesced for row-major A).
        for (var e = lid; e < BM * BK; e += WG) {
            let mm = e / BK;
            let kk = e % BK;
            let gm = row0 + mm;
            let gk = k0 + kk;
            var v = 0.0;
            if (gm < p.m && gk < p.k) {
                v = a[a_base + gm * p.a_ms + gk * p.a_ks];
            }
            a_tile[kk * BM + mm] = v;
        }
        // Stage B: consecutive lanes take consecutive n (coalesced for row-major B).
        for (var e = lid; e < BK * BN; e += WG) {
            let kk = e / BN;
            let nn = e % BN;
            let gk = k0 + kk;
            let gn = col0 + nn;
            var v = 0.0;
            if (gk < p.k && gn < p.n) {
                v = b[b_base + gk * p.b_ks + gn * p.b_ns];
            }
            b_tile[kk * BN + nn] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            for (var i = 0u; i < TM; i++) {
                a_reg[i] = a_tile[kk * BM + tr + i * ROW_LANES];
            }
            for (var j = 0u; j < TN; j++) {
                b_reg[j] = b_tile[kk * BN + tc + j * COL_LANES];
            }
            for (var i = 0u; i < TM; i++) {
                for (var j = 0u; j < TN; j++) {
                    acc[i * TN + j] = fma(a_reg[i], b_reg[j], acc[i * TN + j]);
                }
            }
        }
        workgroupBarrier();
    }

    let c_base = p.c_off + batch * p.c_bs;
    for (var i = 0u; i < TM; i++) {
        let gm = row0 + tr + i * ROW_LANES;
        if (gm >= p.m) { continue; }
        for (var j = 0u; j < TN; j++) {
            let gn = col0 + tc + j * COL_LANES;
            if (gn < p.n) {
                let o = c_base + gm * p.c_ms + gn * p.c_ns;
                if (ACC) {
                    c[o] = c[o] + acc[i * TN + j];
                } else {
                    c[o] = acc[i * TN + j];
                }
            }
        }
    }
}
