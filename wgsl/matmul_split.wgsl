// Split-K, second pass: C (+)= the sum over s of part[s], the partial products the matmul
// kernels wrote for S ranges of K (a product whose M x N gives too few workgroups to fill the
// GPU, over a long K).
//
// Memory: part (S, M, N) contiguous f32; C (M, N) of type TC at c_off through its strides
// c_ms, c_ns. One lane per element of C; the grid is 2-D past 65,535 workgroups (linear
// workgroup id wid.y * nwg.x + wid.x). Specialization: TC, ACC (add into C).

struct Params {
    m: u32,
    n: u32,
    splits: u32,
    c_off: u32,
    c_ms: u32,
    c_ns: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<TC>;
@group(0) @binding(2) var<storage, read> part: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(WG)
fn matmul_split_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let e = (wid.y * nwg.x + wid.x) * WG + lid;
    let mn = p.m * p.n;
    if (e >= mn) {
        return;
    }
    var sum = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        sum += part[s * mn + e];
    }
    let o = p.c_off + (e / p.n) * p.c_ms + (e % p.n) * p.c_ns;
    if (ACC) {
        c[o] = TC(f32(c[o]) + sum);
    } else {
        c[o] = TC(sum);
    }
}
