// Workgroup reductions over 256 lanes in workgroup memory (the fallback where the adapter has
// no subgroup operations). Call from uniform control flow; every lane gets the result.

const RED_WG: u32 = 256u;

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
}

var<workgroup> red_scratch: array<f32, RED_WG>;

fn red_combine(x: f32, y: f32, kind: u32) -> f32 {
    switch kind {
        case 1u: { return max(x, y); }
        case 2u: { return min(x, y); }
        default: { return x + y; }
    }
}

// kind: 0 sum, 1 max, 2 min.
fn wg_reduce(v: f32, l: Lanes, kind: u32) -> f32 {
    red_scratch[l.lid] = v;
    workgroupBarrier();
    for (var s = RED_WG / 2u; s > 0u; s = s >> 1u) {
        if (l.lid < s) {
            red_scratch[l.lid] = red_combine(red_scratch[l.lid], red_scratch[l.lid + s], kind);
        }
        workgroupBarrier();
    }
    let r = red_scratch[0];
    workgroupBarrier(); // the scratch may be reused right away
    return r;
}

fn wg_sum(v: f32, l: Lanes) -> f32 { return wg_reduce(v, l, 0u); }
fn wg_max(v: f32, l: Lanes) -> f32 { return wg_reduce(v, l, 1u); }
fn wg_min(v: f32, l: Lanes) -> f32 { return wg_reduce(v, l, 2u); }

// Two sums at once (one reduction's barriers).
var<workgroup> red_scratch2: array<vec2<f32>, RED_WG>;

fn wg_sum2(v: vec2<f32>, l: Lanes) -> vec2<f32> {
    red_scratch2[l.lid] = v;
    workgroupBarrier();
    for (var s = RED_WG / 2u; s > 0u; s = s >> 1u) {
        if (l.lid < s) {
            red_scratch2[l.lid] = red_scratch2[l.lid] + red_scratch2[l.lid + s];
        }
        workgroupBarrier();
    }
    let r = red_scratch2[0];
    workgroupBarrier(); // the scratch may be reused right away
    return r;
}
