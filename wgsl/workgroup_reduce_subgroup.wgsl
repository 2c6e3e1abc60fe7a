// Workgroup reductions over 256 lanes with subgroup operations: each subgroup reduces in
// registers, its first lane writes one partial, and every lane folds the partials in the same
// order (so all lanes agree bit for bit). Call from uniform control flow.

const RED_WG: u32 = 256u;

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
}

// One partial per subgroup; a subgroup has at least one lane, so RED_WG partials at most.
var<workgroup> red_scratch: array<f32, RED_WG>;

fn red_combine(x: f32, y: f32, kind: u32) -> f32 {
    switch kind {
        case 1u: { return max(x, y); }
        case 2u: { return min(x, y); }
        default: { return x + y; }
    }
}

fn red_subgroup(v: f32, kind: u32) -> f32 {
    switch kind {
        case 1u: { return subgroupMax(v); }
        case 2u: { return subgroupMin(v); }
        default: { return subgroupAdd(v); }
    }
}

// kind: 0 sum, 1 max, 2 min.
fn wg_reduce(v: f32, l: Lanes, kind: u32) -> f32 {
    let s = red_subgroup(v, kind);
    if (l.sg_lane == 0u) {
        red_scratch[l.sg_id] = s;
    }
    workgroupBarrier();
    var r = red_scratch[0];
    for (var i = 1u; i < l.n_sg; i++) {
        r = red_combine(r, red_scratch[i], kind);
    }
    workgroupBarrier(); // the scratch may be reused right away
    return r;
}

fn wg_sum(v: f32, l: Lanes) -> f32 { return wg_reduce(v, l, 0u); }
fn wg_max(v: f32, l: Lanes) -> f32 { return wg_reduce(v, l, 1u); }
fn wg_min(v: f32, l: Lanes) -> f32 { return wg_reduce(v, l, 2u); }

// Two sums at once (one reduction's barriers): each subgroup's pair in registers, then the
// pairs folded in the same order by every lane.
var<workgroup> red_scratch2: array<vec2<f32>, RED_WG>;

fn wg_sum2(v: vec2<f32>, l: Lanes) -> vec2<f32> {
    let s = subgroupAdd(v);
    if (l.sg_lane == 0u) {
        red_scratch2[l.sg_id] = s;
    }
    workgroupBarrier();
    var r = red_scratch2[0];
    for (var i = 1u; i < l.n_sg; i++) {
        r += red_scratch2[i];
    }
    workgroupBarrier(); // the scratch may be reused right away
    return r;
}
