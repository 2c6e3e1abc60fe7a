// Cross-entropy of (rows, V) logits against u32 targets (rows): per-row loss forward, dlogits
// backward. The host has checked every target that is not ignore_index against V, and turns
// the per-row losses into the mean over the non-ignored rows.
//
// cross_entropy_forward: one workgroup of 256 lanes per row (linear workgroup id = row). One
//   pass over the row: each lane keeps a running max m and a sum s of exp(x - m), rescaled
//   when m grows (online softmax); the workgroup then takes M = max m and
//   S = sum s * exp(m - M), so
//     lse[r] = M + log(S),  loss[r] = lse[r] - x[r, target[r]]   (0 where target = ignore)
//   all in f32 (XT logits, f32 or f16, widened as they load); lse is saved for backward.
// cross_entropy_forward_vec4: the same, 4 columns a lane through vec4 loads (rows on
//   4-element boundaries, checked by the launcher), two vectors a step in flight; the running
//   max moves once a vector (5 exponentials a vector, no branch). Components past V (the last
//   vector's, in the row's padding) count as the lowest f32: exp of them is 0.
// cross_entropy_backward: one workgroup per row, one pass, no reduction:
//     dlogits[r, j] = g * inv_n * (exp(x[r, j] - lse[r]) - (j == target[r]))   (0 if ignored)
//   with g the upstream gradient of the mean loss (one f32 read from its buffer: no host
//   read-back) and inv_n = 1 / (non-ignored rows), stored as OT (f32, or f16 for a consumer
//   that rounds it to f16 anyway).
// cross_entropy_backward_vec4: the same, 4 columns a lane through vec4 loads and stores (rows
//   on 4-element boundaries, checked by the launcher). The last vector of a row may reach past
//   V into the row's padding: its components there are read back and stored unchanged.
//
// Memory: logits (rows, V) from x_offset, rows x_rs apart (unit column stride); targets (rows)
// from target_offset; loss and lse (rows); dlogits (rows, V) from out_offset, rows out_rs
// apart; g at g_offset.
// Bindings: each entry point has its own signature (listed in src/kernels/cross_entropy.rs);
// WGSL lets different entry points reuse a binding number, and a variable read by several
// kernels keeps one slot.
// Specialization: ACC (backward adds into dlogits: gradient accumulation); OT (dlogits' type);
// XT (the logits' type: f32, or f16 from a half-precision LM head).

struct Params {
    rows: u32,
    cols: u32,          // V
    x_offset: u32,
    target_offset: u32,
    ignore_index: u32,  // 0xffffffff when none: no valid target reaches it (targets < V)
    out_offset: u32,
    g_offset: u32,
    inv_n: f32,
    x_rs: u32,          // row stride of the logits
    out_rs: u32,        // row stride of dlogits
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// Shared by both kernels.
@group(0) @binding(3) var<storage, read> logits: array<XT>;   // (rows, V)
@group(0) @binding(4) var<storage, read> targets: array<u32>; // (rows)

// cross_entropy_forward: loss, lse, logits, targets.
@group(0) @binding(1) var<storage, read_write> loss: array<f32>;    // (rows)
@group(0) @binding(2) var<storage, read_write> lse_out: array<f32>; // (rows)

// cross_entropy_backward(_vec4): dlogits, lse, logits, targets, g.
@group(0) @binding(1) var<storage, read_write> dlogits: array<OT>;        // (rows, V)
@group(0) @binding(2) var<storage, read> lse: array<f32>;                 // (rows)
@group(0) @binding(5) var<storage, read> g: array<f32>;                   // [] at g_offset
// The _vec4 kernels' views of the logits and dlogits, 4 elements a vector.
@group(0) @binding(3) var<storage, read> logits4: array<vec4<XT>>;
@group(0) @binding(1) var<storage, read_write> dlogits4: array<vec4<OT>>;

// The most negative f32: the running max before any logit (exp(-FLT_MAX - M) is 0, where
// -inf could make inf - inf).
const LOWEST: f32 = -3.4028234663852886e38;

@compute @workgroup_size(RED_WG)
fn cross_entropy_forward(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.y * nwg.x + wid.x;
    // row is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (row >= p.rows) { return; }
    let base = p.x_offset + row * p.x_rs;

    var m = LOWEST;
    var s = 0.0;
    for (var j = lanes.lid; j < p.cols; j += RED_WG) {
        let v = f32(logits[base + j]);
        if (v > m) {
            s = s * exp(m - v) + 1.0;
            m = v;
        } else {
            s += exp(v - m);
        }
    }
    let t = targets[p.target_offset + row];
    var picked = 0.0;
    if (lanes.lid == 0u && t != p.ignore_index) {
        picked = f32(logits[base + t]);
    }
    finish_row(row, t, picked, m, s, lanes);
}

// The workgroup's lse and loss of a row from each lane's running max m and sum s; `picked` is
// the target's logit, read by lane 0 (each entry point through its own view of the logits).
fn finish_row(row: u32, t: u32, picked: f32, m: f32, s: f32, lanes: Lanes) {
    let row_max = wg_max(m, lanes);
    let sum = wg_sum(s * exp(m - row_max), lanes);

    if (lanes.lid == 0u) {
        let l = row_max + log(sum);
        lse_out[row] = l;
        loss[row] = select(l - picked, 0.0, t == p.ignore_index);
    }
}

// A vector of logits in f32, its components at columns past V the lowest f32.
fn logits_vec(base4: u32, q: u32) -> vec4<f32> {
    let j = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(logits4[base4 + q]), vec4<f32>(LOWEST), j >= vec4<u32>(p.cols));
}

// The running (m, s) after the vector v.
fn online_add(ms: vec2<f32>, v: vec4<f32>) -> vec2<f32> {
    let m = max(ms.x, max(max(v.x, v.y), max(v.z, v.w)));
    let e = exp(v - vec4<f32>(m));
    return vec2<f32>(m, ms.y * exp(ms.x - m) + (e.x + e.y) + (e.z + e.w));
}

@compute @workgroup_size(RED_WG)
fn cross_entropy_forward_vec4(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) { return; }
    let base = p.x_offset + row * p.x_rs;
    let base4 = base / 4u;
    let quads = (p.cols + 3u) / 4u;
    // Two running pairs, so two vectors' loads are in flight a step.
    var a = vec2<f32>(LOWEST, 0.0);
    var b = vec2<f32>(LOWEST, 0.0);
    var q = lanes.lid;
    for (; q + RED_WG < quads; q += 2u * RED_WG) {
        let u = logits_vec(base4, q);
        let v = logits_vec(base4, q + RED_WG);
        a = online_add(a, u);
        b = online_add(b, v);
    }
    if (q < quads) {
        a = online_add(a, logits_vec(base4, q));
    }
    let m = max(a.x, b.x);
    let s = a.y * exp(a.x - m) + b.y * exp(b.x - m);
    let t = targets[p.target_offset + row];
    var picked = 0.0;
    if (lanes.lid == 0u && t != p.ignore_index) {
        let e = base + t; // base is a multiple of 4
        picked = f32(logits4[e / 4u][e % 4u]);
    }
    finish_row(row, t, picked, m, s, lanes);
}

// What both backward kernels read of a row: its target, whether it is ignored, the scale of
// d loss / d logit (the upstream gradient over the counted rows) and the row's log-sum-exp.
struct BackwardRow {
    t: u32,
    ignored: bool,
    scale: f32,
    lse: f32,
}

fn backward_row(row: u32) -> BackwardRow {
    let t = targets[p.target_offset + row];
    return BackwardRow(t, t == p.ignore_index, g[p.g_offset] * p.inv_n, lse[row]);
}

@compute @workgroup_size(RED_WG)
fn cross_entropy_backward(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) { return; }
    let base = p.x_offset + row * p.x_rs;
    let out_base = p.out_offset + row * p.out_rs;
    let r = backward_row(row);
    for (var j = lid; j < p.cols; j += RED_WG) {
        var d = 0.0;
        if (!r.ignored) {
            let onehot = select(0.0, 1.0, j == r.t);
            d = r.scale * (exp(f32(logits[base + j]) - r.lse) - onehot);
        }
        let o = out_base + j;
        if (ACC) {
            dlogits[o] = OT(f32(dlogits[o]) + d);
        } else {
            dlogits[o] = OT(d);
        }
    }
}

@compute @workgroup_size(RED_WG)
fn cross_entropy_backward_vec4(@builtin(workgroup_id) wid: vec3<u32>,
                               @builtin(num_workgroups) nwg: vec3<u32>,
                               @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) { return; }
    let base = (p.x_offset + row * p.x_rs) / 4u;
    let out_base = (p.out_offset + row * p.out_rs) / 4u;
    let r = backward_row(row);
    let quads = (p.cols + 3u) / 4u;
    for (var q = lid; q < quads; q += RED_WG) {
        let j = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
        var d = vec4<f32>(0.0);
        if (!r.ignored) {
            let onehot = select(vec4<f32>(0.0), vec4<f32>(1.0), j == vec4<u32>(r.t));
            d = r.scale * (exp(vec4<f32>(logits4[base + q]) - r.lse) - onehot);
        }
        let o = out_base + q;
        let past = j >= vec4<u32>(p.cols);
        if (ACC || past.w) {
            let old = vec4<f32>(dlogits4[o]);
            let v = select(d, vec4<f32>(0.0), past) + select(vec4<f32>(0.0), old, past | vec4<bool>(ACC));
            dlogits4[o] = vec4<OT>(v);
        } else {
            dlogits4[o] = vec4<OT>(d);
        }
    }
}
