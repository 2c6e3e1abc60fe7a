// Split-K, second pass: C (+)= the sum over s of part[s], the partial products the matmul
// kernels wrote for S ranges of K (a product whose M x N gives too few workgroups to fill the
// GPU, over a long K); matmul_split_sum_bias adds bias[column] to the sum first (a bias
// product's epilogue: its ranges write partials without it), matmul_split_sum_bias_res the
// bias and a residual (read through `sums`); matmul_split_sum_sums stores
// the partials' last row (the column sums of a product with ONES, see matmul.wgsl) to `sums`
// at bias_off instead of C.
//
// Memory: part (S, M, N) contiguous f32; C (M, N) of type TC at c_off through its strides
// c_ms, c_ns; bias (N) f32 at bias_off. A lane sums W consecutive elements of one row of C (W
// = 4 where the launcher has checked that N, C's offset and row stride, and the bias's, the
// residual's and the sums' offsets are multiples of 4 and C's columns unit-stride: every
// binding is then read and written in vectors, PV = vec4<f32>, CV = vec4<TC>; else W = 1, PV =
// f32, CV = TC). The grid is 2-D past 65,535 workgroups (linear workgroup id
// wid.y * nwg.x + wid.x). Specialization: TC, W, PV, CV, ACC (add into C).

struct Params {
    m: u32,
    n: u32,
    splits: u32,
    c_off: u32,
    c_ms: u32,
    c_ns: u32,
    bias_off: u32,
    res_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<CV>;   // (M, N) through c_ms, c_ns
@group(0) @binding(2) var<storage, read> part: array<PV>;     // (S, M, N)
@group(0) @binding(3) var<storage, read> bias: array<PV>;     // (N), matmul_split_sum_bias
@group(0) @binding(4) var<storage, read_write> sums: array<PV>; // (N), matmul_split_sum_sums

const WG: u32 = 256u;

// The first of the W elements of C this lane sums (row-major over (M, N); past the end in the
// last workgroup).
fn element(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return ((wid.y * nwg.x + wid.x) * WG + lid) * W;
}

fn partial_sum(e: u32) -> PV {
    let mn = p.m * p.n;
    var sum = PV();
    for (var s = 0u; s < p.splits; s++) {
        sum += part[(s * mn + e) / W];
    }
    return sum;
}

fn store_c(e: u32, v: PV) {
    let o = (p.c_off + (e / p.n) * p.c_ms + (e % p.n) * p.c_ns) / W;
    if (ACC) {
        c[o] = CV(PV(c[o]) + v);
    } else {
        c[o] = CV(v);
    }
}

@compute @workgroup_size(WG)
fn matmul_split_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let e = element(wid, nwg, lid);
    if (e >= p.m * p.n) {
        return;
    }
    store_c(e, partial_sum(e));
}

// C (+)= the sum + bias (bias indexed by column).
@compute @workgroup_size(WG)
fn matmul_split_sum_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let e = element(wid, nwg, lid);
    if (e >= p.m * p.n) {
        return;
    }
    store_c(e, partial_sum(e) + bias[(p.bias_off + e % p.n) / W]);
}

// C = the sum + bias + R, with R (the residual a block adds the product to: contiguous (M, N)
// f32) read through `sums` from res_off.
@compute @workgroup_size(WG)
fn matmul_split_sum_bias_res(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                             @builtin(local_invocation_index) lid: u32) {
    let e = element(wid, nwg, lid);
    if (e >= p.m * p.n) {
        return;
    }
    store_c(e, partial_sum(e) + bias[(p.bias_off + e % p.n) / W] + sums[(p.res_off + e) / W]);
}

// C (+)= the sum, its last row to sums (bias_off) instead.
@compute @workgroup_size(WG)
fn matmul_split_sum_sums(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let e = element(wid, nwg, lid);
    if (e >= p.m * p.n) {
        return;
    }
    let v = partial_sum(e);
    if (e / p.n == p.m - 1u) {
        let o = (p.bias_off + e % p.n) / W;
        sums[o] = select(v, sums[o] + v, ACC);
    } else {
        store_c(e, v);
    }
}
