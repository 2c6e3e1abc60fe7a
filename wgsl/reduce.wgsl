// Reductions: over a set of dims, and over everything in two stages.
//
// reduce_dims: out[out_offset + o] (+)= scale * fold_{r < red_numel} x[base(o) + red(r)], where
//   base(o) is o's coordinates in the kept `shape` (rank dims) times the input `strides`, plus
//   in_offset, and red(r) is r's coordinates in `red_shape` (red_rank dims) times
//   `red_strides`. One workgroup of 256 lanes per output element (linear workgroup id = o);
//   lanes stride over r, then a workgroup reduction (subgroups where present).
// reduce_cols: the same over the rows of a matrix with contiguous kept columns (below).
// reduce_partial: stage 1 of a reduction over all numel elements (strided by shape/strides):
//   n_groups workgroups, workgroup g folds elements g*256+lid, stepping n_groups*256, into
//   partial[g] (times scale). Stage 2 is reduce_dims over the partials.
// reduce_partial_vec4: the same over a contiguous input from in_offset, both in_offset and
//   numel multiples of 4 (checked by the launcher), folding vector g*256+lid, stepping
//   n_groups*256 vectors, component by component.
//
// Specialization: OP (0 sum, 1 max, 2 min), ACC (add into the output: gradient accumulation).
// X: the input's elements for reduce_dims, reduce_partial and reduce_cols (f32, or f16 for a
// gradient stored f16 under autocast), folded in f32.

struct Params {
    out_numel: u32,
    red_numel: u32,
    rank: u32,
    red_rank: u32,
    in_offset: u32,
    scale: f32,
    n_groups: u32,
    numel: u32,
    out_offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,       // (rank) kept dims, or all dims for reduce_partial
    strides: array<vec4<u32>, 2>,     // (rank) input strides of those dims
    red_shape: array<vec4<u32>, 2>,   // (red_rank) reduced dims
    red_strides: array<vec4<u32>, 2>, // (red_rank) input strides of the reduced dims
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<X>;

// OP 3 (sum of squares) folds v * v (the squared norm of gradients, for clipping); its
// partial results then combine as a sum.
const COMBINE: u32 = select(OP, 0u, OP == 3u);

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
        case 3u: { return acc + v * v; }
        default: { return acc + v; }
    }
}

fn kept_offset(i: u32) -> u32 {
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

fn reduced_offset(i: u32) -> u32 {
    if (p.red_rank == 1u) {
        return i * p.red_strides[0][0];
    }
    var rem = i;
    var off = 0u;
    for (var d = i32(p.red_rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.red_shape[q][r];
        off += (rem % n) * p.red_strides[q][r];
        rem = rem / n;
    }
    return off;
}

fn store(o: u32, v: f32) {
    if (ACC) {
        out[o] = out[o] + v;
    } else {
        out[o] = v;
    }
}

@compute @workgroup_size(RED_WG)
fn reduce_dims(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               lanes: Lanes) {
    let o = wid.y * nwg.x + wid.x;
    // o is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (o >= p.out_numel) { return; }
    let base = kept_offset(o);
    var acc = identity();
    for (var r = lanes.lid; r < p.red_numel; r += RED_WG) {
        acc = fold(acc, f32(x[base + reduced_offset(r)]));
    }
    acc = wg_reduce(acc, lanes, COMBINE);
    if (lanes.lid == 0u) {
        store(p.out_offset + o, acc * p.scale);
    }
}

@compute @workgroup_size(RED_WG)
fn reduce_partial(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let g = wid.x;
    var acc = identity();
    // A contiguous input (a flat parameter chunk's gradients) skips the index arithmetic.
    let flat = p.rank == 1u && p.strides[0][0] == 1u;
    for (var i = g * RED_WG + lanes.lid; i < p.numel; i += p.n_groups * RED_WG) {
        if (flat) {
            acc = fold(acc, f32(x[p.in_offset + i]));
        } else {
            acc = fold(acc, f32(x[kept_offset(i)]));
        }
    }
    acc = wg_reduce(acc, lanes, COMBINE);
    if (lanes.lid == 0u) {
        store(p.out_offset + g, acc * p.scale);
    }
}

// reduce_cols: a fold over the rows of a matrix whose kept dim is contiguous (the bias
// gradient: the sum over B*T rows of an (B*T, N) gradient), so lanes read consecutive columns.
// out[out_offset + wid.y * out_numel + c] (+)= scale * fold over rows r in chunk wid.y of
// x[in_offset + r * red_strides[0][0] + c * strides[0][0]], chunks of n_groups rows. A
// workgroup of 256 lanes covers COL_LANES = 64 columns and 4 row phases; the phases meet in
// workgroup memory. With several chunks the partials go out one row per chunk and a second
// reduce_cols folds them (scale and ACC apply there).
const COL_LANES: u32 = 64u;
var<workgroup> col_part: array<f32, RED_WG>;

@compute @workgroup_size(RED_WG)
fn reduce_cols(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x * COL_LANES + lid % COL_LANES;
    let phase = lid / COL_LANES;
    let r0 = wid.y * p.n_groups;
    let r1 = min(p.red_numel, r0 + p.n_groups);
    var acc = identity();
    if (c < p.out_numel) {
        let base = p.in_offset + c * p.strides[0][0];
        for (var r = r0 + phase; r < r1; r += RED_WG / COL_LANES) {
            acc = fold(acc, f32(x[base + r * p.red_strides[0][0]]));
        }
    }
    col_part[lid] = acc;
    workgroupBarrier();
    if (phase == 0u && c < p.out_numel) {
        var total = col_part[lid];
        for (var q = 1u; q < RED_WG / COL_LANES; q++) {
            total = red_combine(total, col_part[lid + q * COL_LANES], COMBINE); // squares combine as sums
        }
        store(p.out_offset + wid.y * p.out_numel + c, total * p.scale);
    }
}

// reduce_partial_vec4's view of the input, 4 elements a vector (binding 2, as x: WGSL lets
// entry points that do not share it reuse a binding number).
@group(0) @binding(2) var<storage, read> x4: array<vec4<f32>>;

@compute @workgroup_size(RED_WG)
fn reduce_partial_vec4(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let g = wid.x;
    let base = p.in_offset / 4u;
    let n4 = p.numel / 4u;
    var acc = identity();
    for (var i = g * RED_WG + lanes.lid; i < n4; i += p.n_groups * RED_WG) {
        let v = x4[base + i];
        acc = fold(fold(fold(fold(acc, v.x), v.y), v.z), v.w);
    }
    acc = wg_reduce(acc, lanes, COMBINE);
    if (lanes.lid == 0u) {
        store(p.out_offset + g, acc * p.scale);
    }
}
