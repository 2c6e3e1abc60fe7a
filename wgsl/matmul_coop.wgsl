// Mixed-precision batched matmul on cooperative matrices (tensor cores): C[b] (+)= A[b] @ B[b]
// with the operands rounded to f16 and the products accumulated in f32. Same Params, bindings
// and epilogues as matmul.wgsl (whose TS = f16 variant computes the same thing without
// cooperative matrices), so the launcher picks either kernel for a product. Entry points:
// matmul_coop, matmul_coop_bias, matmul_coop_bias_gelu.
//
// Fragments are FS x FS (16 on NVIDIA's Vulkan driver, 8 on Apple): MA, MB, MC alias the
// f16 A and B and the f32 accumulator cooperative-matrix types of that size.
// Workgroup tile BM x BN = (SG_M * FM * FS) x (SG_N * FN * FS): SG_M x SG_N subgroups of SGS
// lanes, each owning FM x FN f32 accumulators. K advances BK at a time: every lane stages
// its share of the A (BM x BK) and B (BK x BN) tiles into workgroup memory as f16, reading
// either operand through its strides along its unit-stride dim (zero past M, N and K, so any
// size works); then each subgroup multiplies its fragments out of workgroup memory. The
// epilogue goes through an FS x FS f32 scratch tile per subgroup: the subgroup stores one
// accumulator there, then its lanes add the bias, apply GELU or accumulate, and write C (f32
// or f16) through its strides with bounds checks.
//
// coopLoadT/coopStoreT are the row-major forms; Vulkan wants their pointers and strides
// 16-byte aligned, hence the tile row strides (BK + 8 and BN + 8 halves; the padding also
// spreads rows over banks). Indices and strides are bound to `let`s first (naga's SPIR-V
// backend needs named expressions there).
// Grid: x over N tiles, y over M tiles, z over the batch.
// Specialization: FS, SGS, SG_M, SG_N, FM, FN, BK, ACC; types MA, MB, MC, TA, TB, TC (TS is
// unused: the tiles are always f16).

enable wgpu_cooperative_matrix;

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
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<TC>;
@group(0) @binding(2) var<storage, read> a: array<TA>;
@group(0) @binding(3) var<storage, read> b: array<TB>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;     // (N), matmul_bias*
@group(0) @binding(5) var<storage, read_write> pre: array<f32>; // (batch, M, N), matmul_bias_gelu

const WG: u32 = SG_M * SG_N * SGS;
const BM: u32 = SG_M * FM * FS;
const BN: u32 = SG_N * FN * FS;
const AS: u32 = BK + 8u; // row stride of the A tile, [m][k]
const BS: u32 = BN + 8u; // row stride of the B tile, [k][n]
const FRAGS: u32 = FM * FN;

var<workgroup> a_sh: array<f16, BM * AS>;
var<workgroup> b_sh: array<f16, BK * BS>;
const FE: u32 = FS * FS; // elements of a fragment
var<workgroup> c_sh: array<f32, SG_M * SG_N * FE>;

var<private> acc: array<MC, FRAGS>;

fn stage(wid: vec3<u32>, lid: u32, k0: u32) {
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let a_base = p.a_off + wid.z * p.a_bs;
    let b_base = p.b_off + wid.z * p.b_bs;
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
        var v = f16(0.0);
        if (gm < p.m && gk < p.k) {
            v = f16(a[a_base + gm * p.a_ms + gk * p.a_ks]);
        }
        a_sh[mm * AS + kk] = v;
    }
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
        var v = f16(0.0);
        if (gk < p.k && gn < p.n) {
            v = f16(b[b_base + gk * p.b_ks + gn * p.b_ns]);
        }
        b_sh[kk * BS + nn] = v;
    }
}

// The subgroup's FM x FN accumulators of the workgroup's tile of A @ B, in `acc`.
fn product(wid: vec3<u32>, lid: u32, sg: u32) {
    let sm = sg / SG_N;
    let sn = sg % SG_N;
    for (var f = 0u; f < FRAGS; f++) {
        acc[f] = MC();
    }
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        stage(wid, lid, k0);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += FS) {
            var bf: array<MB, FN>;
            for (var j = 0u; j < FN; j++) {
                let off = kk * BS + (sn * FN + j) * FS;
                let s = BS;
                bf[j] = coopLoadT<MB>(&b_sh[off], s);
            }
            for (var i = 0u; i < FM; i++) {
                let off = (sm * FM + i) * FS * AS + kk;
                let s = AS;
                let af = coopLoadT<MA>(&a_sh[off], s);
                for (var j = 0u; j < FN; j++) {
                    acc[i * FN + j] = coopMultiplyAdd(af, bf[j], acc[i * FN + j]);
                }
            }
        }
        workgroupBarrier();
    }
}

// Accumulator f of subgroup sg into the subgroup's scratch tile (row-major FS x FS); the
// barrier after it makes the tile visible to the subgroup's lanes.
fn spill(f: u32, sg: u32) {
    let off = sg * FE;
    let s = FS;
    coopStoreT(acc[f], &c_sh[off], s);
}

// Row and column in C of element e (< FE) of accumulator f of subgroup sg.
fn frag_row(wid: vec3<u32>, sg: u32, f: u32, e: u32) -> u32 {
    return wid.y * BM + ((sg / SG_N) * FM + f / FN) * FS + e / FS;
}

fn frag_col(wid: vec3<u32>, sg: u32, f: u32, e: u32) -> u32 {
    return wid.x * BN + ((sg % SG_N) * FN + f % FN) * FS + e % FS;
}

fn store_c(o: u32, v: f32) {
    if (ACC) {
        c[o] = TC(f32(c[o]) + v);
    } else {
        c[o] = TC(v);
    }
}

@compute @workgroup_size(WG)
fn matmul_coop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    product(wid, lid, sg);
    for (var f = 0u; f < FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        for (var e = lane; e < FE; e += SGS) {
            let gm = frag_row(wid, sg, f, e);
            let gn = frag_col(wid, sg, f, e);
            if (gm < p.m && gn < p.n) {
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, c_sh[sg * FE + e]);
            }
        }
        workgroupBarrier();
    }
}

// C = A @ B + bias (bias indexed by column).
@compute @workgroup_size(WG)
fn matmul_coop_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    product(wid, lid, sg);
    for (var f = 0u; f < FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        for (var e = lane; e < FE; e += SGS) {
            let gm = frag_row(wid, sg, f, e);
            let gn = frag_col(wid, sg, f, e);
            if (gm < p.m && gn < p.n) {
                let z = c_sh[sg * FE + e] + bias[p.bias_off + gn];
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, z);
            }
        }
        workgroupBarrier();
    }
}

// z = A @ B + bias saved to pre (contiguous (batch, M, N), f32), C = gelu(z) (tanh form).
@compute @workgroup_size(WG)
fn matmul_coop_bias_gelu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                    @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    product(wid, lid, sg);
    for (var f = 0u; f < FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        for (var e = lane; e < FE; e += SGS) {
            let gm = frag_row(wid, sg, f, e);
            let gn = frag_col(wid, sg, f, e);
            if (gm < p.m && gn < p.n) {
                let z = c_sh[sg * FE + e] + bias[p.bias_off + gn];
                pre[(wid.z * p.m + gm) * p.n + gn] = z;
                let k = 0.7978845608028654; // sqrt(2 / pi)
                let t = tanh(clamp(k * (z + 0.044715 * z * z * z), -15.0, 15.0));
                store_c(p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns, 0.5 * z * (1.0 + t));
            }
        }
        workgroupBarrier();
    }
}
