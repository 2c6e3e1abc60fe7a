// Reductions: over one axis, and over everything in two stages.
//
// reduce_axis: out[o] = scale * fold_{r < reduce_len} x[base(o) + r * reduce_stride], where
//   base(o) is o's coordinates in the kept `shape` (rank dims) times the input `strides`, plus
//   in_offset. One workgroup of 256 lanes per output element (linear workgroup id = o); lanes
//   stride over r, then a workgroup reduction (subgroups where present).
// reduce_partial: stage 1 of a reduction over all numel elements (strided by shape/strides):
//   n_groups workgroups, workgroup g folds elements g*256+lid, stepping n_groups*256, into
//   partial[g] (times scale: the final result when n_groups is 1). Stage 2 is reduce_axis
//   over the partials.
//
// Specialization: OP (0 sum, 1 max, 2 min).

struct Params {
    out_numel: u32,
    reduce_len: u32,
    reduce_stride: u32,
    rank: u32,
    in_offset: u32,
    scale: f32,
    n_groups: u32,
    numel: u32,
    shape: array<vec4<u32>, 2>,   // (rank) kept dims, or all dims for reduce_partial
    strides: array<vec4<u32>, 2>, // (rank) input strides of those dims
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

fn identity() -> f32 {
    switch OP {
        case 1u: { return -3.4028234663852886e38; }
        case 2u: { return 3.4028234663852886e38; }
        default: { return 0.0; }
    }
}

fn fold(acc: f32, v: f32) -> f32 {
    switch OP {
        case 1u: { return max(acc, v); }
        case 2u: { return min(acc, v); }
        default: { return acc + v; }
    }
}

fn strided_offset(i: u32) -> u32 {
    var rem = i;
    var off = p.in_offset;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        off += (rem % n) * p.strides[q][r];
        rem = rem / n;
    }
    return off;
}

@compute @workgroup_size(RED_WG)
fn reduce_axis(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               lanes: Lanes) {
    let o = wid.y * nwg.x + wid.x;
    // o is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (o >= p.out_numel) { return; }
    let base = strided_offset(o);
    var acc = identity();
    for (var r = lanes.lid; r < p.reduce_len; r += RED_WG) {
        acc = fold(acc, x[base + r * p.reduce_stride]);
    }
    acc = wg_reduce(acc, lanes, OP);
    if (lanes.lid == 0u) {
        out[o] = acc * p.scale;
    }
}

@compute @workgroup_size(RED_WG)
fn reduce_partial(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let g = wid.x;
    var acc = identity();
    for (var i = g * RED_WG + lanes.lid; i < p.numel; i += p.n_groups * RED_WG) {
        acc = fold(acc, x[strided_offset(i)]);
    }
    acc = wg_reduce(acc, lanes, OP);
    if (lanes.lid == 0u) {
        out[g] = acc * p.scale;
    }
}
