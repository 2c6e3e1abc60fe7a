// LayerNorm over the last dim of a contiguous (rows, C) input: forward, and backward from the
// statistics the forward saved (they are never recomputed).
//
// layernorm_forward: one workgroup of 256 lanes per row (linear workgroup id = row), lanes
//   stride over c. All in f32 from the f32 x; the variance is biased (divided by C, as
//   PyTorch) and taken from the deviations in a second pass over the row (no
//   E[x^2] - E[x]^2 cancellation); y is stored as YT (f32, or f16 for a matmul consumer):
//     mean[r] = sum_c x[r, c] / C
//     rstd[r] = 1 / sqrt(sum_c (x[r, c] - mean[r])^2 / C + eps)
//     y[r, c] = (x[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c]
// layernorm_backward: one workgroup per chunk of chunk_rows rows (linear workgroup id =
//   chunk), lanes stride over c, the rows one after another. Per row (when DX):
//     xhat = (x - mean) * rstd,  dxhat = dy * gamma
//     dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat))
//   and (when PARAMS) stage 1 of dgamma[c] = sum_r dy * xhat and dbeta[c] = sum_r dy: a lane
//   keeps the sums of its first LANE_COLS columns in registers over the chunk's rows (columns
//   past LANE_COLS * 256 take a second pass over the rows), then writes them into the
//   (2, n_chunks, C) scratch: partial[0, chunk, c] (dgamma), partial[1, chunk, c] (dbeta).
// layernorm_backward_sum: stage 2, SUM_COLS columns a workgroup, each summed by SUM_GROUPS
//   lanes over interleaved chunks, then in workgroup memory: the n_chunks partials of dgamma
//   and of dbeta into dgamma[dgamma_offset + c * dgamma_stride] and dbeta[...] (each written
//   per its mode G_OUT, B_OUT: none, overwrite or add). Fixed summation order: the same bits
//   every run (no atomics).
//
// Memory: x (f32) and dy (DY: f32 or f16) are (rows, C) row-major from x_offset / dy_offset;
// gamma and beta (C) from their offsets; mean and rstd (rows); y (rows, C) from 0, dx (rows, C)
// from out_offset.
// Bindings: each entry point has its own signature (listed in src/kernels/layernorm.rs); WGSL
// lets different entry points reuse a binding number, and a variable read by several kernels
// keeps one slot. A binding a variant does not touch (dx without DX, partial without PARAMS,
// a target whose mode is NONE) is bound to another read-write buffer of the dispatch.
// Specialization: YT (y's type), DY (dy's type), ACC (dx adds into its output: gradient
// accumulation), DX and PARAMS (what layernorm_backward writes), G_OUT and B_OUT (stage 2's
// modes). Every variant defines them all; each kernel reads its own. (Stage 2 in the
// backward's own dispatch, its last workgroups summing the partials, measured slower than the
// second dispatch on an H100: docs/decisions.md.)

struct Params {
    rows: u32,
    cols: u32,            // C
    eps: f32,
    x_offset: u32,
    gamma_offset: u32,
    beta_offset: u32,
    dy_offset: u32,
    out_offset: u32,      // dx
    n_chunks: u32,        // backward and stage 2
    chunk_rows: u32,      // backward
    dgamma_offset: u32,   // stage 2: where the (C) targets start, and their element strides
    dgamma_stride: u32,
    dbeta_offset: u32,
    dbeta_stride: u32,
    _pad0: u32,
    _pad1: u32,
}

// Stage 2's modes per target.
const NONE: u32 = 0u;
const WRITE: u32 = 1u;
const ADD: u32 = 2u;

@group(0) @binding(0) var<uniform> p: Params;

// Shared: layernorm_forward, layernorm_backward.
@group(0) @binding(2) var<storage, read> x: array<f32>;           // (rows, C)
@group(0) @binding(6) var<storage, read> gamma: array<f32>;       // (C)

// layernorm_forward: y, x, beta, mean, rstd, gamma.
@group(0) @binding(1) var<storage, read_write> y: array<YT>;      // (rows, C)
@group(0) @binding(3) var<storage, read> beta: array<f32>;        // (C)
@group(0) @binding(4) var<storage, read_write> mean_out: array<f32>; // (rows)
@group(0) @binding(5) var<storage, read_write> rstd_out: array<f32>; // (rows)

// layernorm_backward: dx, x, dy, mean, rstd, gamma, partial.
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;    // (rows, C)
@group(0) @binding(3) var<storage, read> dy: array<DY>;           // (rows, C)
@group(0) @binding(4) var<storage, read> mean: array<f32>;        // (rows)
@group(0) @binding(5) var<storage, read> rstd: array<f32>;        // (rows)
@group(0) @binding(7) var<storage, read_write> partial: array<f32>; // (2, n_chunks, C)

// layernorm_backward_sum: dgamma, dbeta, partial_in.
@group(0) @binding(1) var<storage, read_write> dgamma: array<f32>; // (C), strided
@group(0) @binding(2) var<storage, read_write> dbeta: array<f32>;  // (C), strided
@group(0) @binding(3) var<storage, read> partial_in: array<f32>;   // (2, n_chunks, C)

// Columns a lane keeps in registers: the forward's x, the backward's x-hat, dy and gamma, and
// its dgamma and dbeta sums over a chunk's rows: C up to 1024 = 4 x 256 in one pass (GPT-2
// small and medium).
const LANE_COLS: u32 = 4u;

@compute @workgroup_size(RED_WG)
fn layernorm_forward(@builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.y * nwg.x + wid.x;
    // row is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (row >= p.rows) { return; }
    let base = p.x_offset + row * p.cols;
    let n = f32(p.cols);

    // The lane's first LANE_COLS columns of x stay in registers for the three passes (loaded
    // branch-free: a column past C reads the last one's and counts as 0); the columns past
    // LANE_COLS * 256 are read again in each.
    var xs: array<f32, LANE_COLS>;
    var s = 0.0;
    for (var j = 0u; j < LANE_COLS; j++) {
        let c = lanes.lid + j * RED_WG;
        xs[j] = select(0.0, x[base + min(c, p.cols - 1u)], c < p.cols);
        s += xs[j];
    }
    for (var c = lanes.lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
        s += x[base + c];
    }
    let mu = wg_sum(s, lanes) / n;

    var v = 0.0;
    for (var j = 0u; j < LANE_COLS; j++) {
        let d = select(0.0, xs[j] - mu, lanes.lid + j * RED_WG < p.cols);
        v += d * d;
    }
    for (var c = lanes.lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
        let d = x[base + c] - mu;
        v += d * d;
    }
    let r = inverseSqrt(wg_sum(v, lanes) / n + p.eps);

    let out_base = row * p.cols;
    for (var j = 0u; j < LANE_COLS; j++) {
        let c = lanes.lid + j * RED_WG;
        if (c < p.cols) {
            let xhat = (xs[j] - mu) * r;
            y[out_base + c] = YT(xhat * gamma[p.gamma_offset + c] + beta[p.beta_offset + c]);
        }
    }
    for (var c = lanes.lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
        let xhat = (x[base + c] - mu) * r;
        y[out_base + c] = YT(xhat * gamma[p.gamma_offset + c] + beta[p.beta_offset + c]);
    }
    if (lanes.lid == 0u) {
        mean_out[row] = mu;
        rstd_out[row] = r;
    }
}

// A lane's dgamma and dbeta sums for its columns c0 + j * RED_WG, j < LANE_COLS.
struct LaneSums {
    g: array<f32, LANE_COLS>,
    b: array<f32, LANE_COLS>,
}

fn store_dx(o: u32, g: f32) {
    if (ACC) {
        dx[o] = dx[o] + g;
    } else {
        dx[o] = g;
    }
}

// The chunk first..last's rows: dx (when DX), and the lane's sums of dgamma and dbeta over
// them for its first LANE_COLS columns (lid + j * RED_WG). Call from uniform control flow.
fn backward_rows(first: u32, last: u32, lanes: Lanes) -> LaneSums {
    let n = f32(p.cols);
    let lid = lanes.lid;
    var sums: LaneSums;
    // The lane's first LANE_COLS columns in registers: gamma once for the chunk, x-hat and dy
    // once a row (loaded branch-free: a column past C reads the last one's, and its dy counts
    // as 0); the columns past LANE_COLS * 256 are read again where used.
    var gs: array<f32, LANE_COLS>;
    for (var j = 0u; j < LANE_COLS; j++) {
        gs[j] = gamma[p.gamma_offset + min(lid + j * RED_WG, p.cols - 1u)];
    }
    for (var row = first; row < last; row++) {
        let base = p.x_offset + row * p.cols;
        let dy_base = p.dy_offset + row * p.cols;
        let mu = mean[row];
        let r = rstd[row];
        var xh: array<f32, LANE_COLS>;
        var dd: array<f32, LANE_COLS>;
        for (var j = 0u; j < LANE_COLS; j++) {
            let c = lid + j * RED_WG;
            let cc = min(c, p.cols - 1u);
            xh[j] = (x[base + cc] - mu) * r;
            dd[j] = select(0.0, f32(dy[dy_base + cc]), c < p.cols);
        }
        if (DX) {
            // mean_c(dxhat) and mean_c(dxhat * xhat) in one reduction.
            var s = vec2<f32>();
            for (var j = 0u; j < LANE_COLS; j++) {
                let dxhat = dd[j] * gs[j];
                s += vec2<f32>(dxhat, dxhat * xh[j]);
            }
            for (var c = lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
                let xhat = (x[base + c] - mu) * r;
                let dxhat = f32(dy[dy_base + c]) * gamma[p.gamma_offset + c];
                s += vec2<f32>(dxhat, dxhat * xhat);
            }
            let m = wg_sum2(s, lanes) / n;

            let out_base = p.out_offset + row * p.cols;
            for (var j = 0u; j < LANE_COLS; j++) {
                let c = lid + j * RED_WG;
                if (c < p.cols) {
                    let dxhat = dd[j] * gs[j];
                    store_dx(out_base + c, r * (dxhat - m.x - xh[j] * m.y));
                }
            }
            for (var c = lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
                let xhat = (x[base + c] - mu) * r;
                let dxhat = f32(dy[dy_base + c]) * gamma[p.gamma_offset + c];
                store_dx(out_base + c, r * (dxhat - m.x - xhat * m.y));
            }
        }
        for (var j = 0u; j < LANE_COLS; j++) {
            sums.g[j] += dd[j] * xh[j];
            sums.b[j] += dd[j];
        }
    }
    return sums;
}

// (dgamma, dbeta) of column c summed over rows first..last: for the columns past the lane's
// registers (rows wider than LANE_COLS * 256), the chunk's rows again.
fn column_sums(first: u32, last: u32, c: u32) -> vec2<f32> {
    var sg = 0.0;
    var sb = 0.0;
    for (var row = first; row < last; row++) {
        let d = f32(dy[p.dy_offset + row * p.cols + c]);
        sg += d * (x[p.x_offset + row * p.cols + c] - mean[row]) * rstd[row];
        sb += d;
    }
    return vec2(sg, sb);
}

@compute @workgroup_size(RED_WG)
fn layernorm_backward(@builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let chunk = wid.y * nwg.x + wid.x;
    // chunk is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (chunk >= p.n_chunks) { return; }
    let first = chunk * p.chunk_rows;
    let last = min(first + p.chunk_rows, p.rows);
    let lid = lanes.lid;
    let sums = backward_rows(first, last, lanes);
    if (!PARAMS) { return; }
    let g_base = chunk * p.cols;
    let b_base = (p.n_chunks + chunk) * p.cols;
    for (var j = 0u; j < LANE_COLS; j++) {
        let c = lid + j * RED_WG;
        if (c < p.cols) {
            partial[g_base + c] = sums.g[j];
            partial[b_base + c] = sums.b[j];
        }
    }
    for (var c = lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
        let s = column_sums(first, last, c);
        partial[g_base + c] = s.x;
        partial[b_base + c] = s.y;
    }
}

// Stage 2's workgroup: SUM_COLS columns x SUM_GROUPS groups of chunks (group g sums chunks g,
// g + SUM_GROUPS, ...), so that 768 columns make 48 workgroups instead of 3 and a lane issues
// n_chunks / 16 loads, not n_chunks; the groups' sums meet in workgroup memory.
const SUM_COLS: u32 = 16u;
const SUM_GROUPS: u32 = RED_WG / SUM_COLS;
// Running sums a lane keeps, so that as many of its loads are in flight at once.
const SUM_LANES: u32 = 4u;
var<workgroup> sum_scratch: array<f32, 2u * RED_WG>;

@compute @workgroup_size(RED_WG)
fn layernorm_backward_sum(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let col = lid % SUM_COLS;
    let group = lid / SUM_COLS;
    let c = (wid.y * nwg.x + wid.x) * SUM_COLS + col;
    // No early exit: every lane reaches the barrier; lanes past C load nothing.
    let valid = c < p.cols;
    let b_start = p.n_chunks * p.cols;
    var part_g: array<f32, SUM_LANES>;
    var part_b: array<f32, SUM_LANES>;
    if (valid) {
        var k = group;
        for (; k + (SUM_LANES - 1u) * SUM_GROUPS < p.n_chunks; k += SUM_LANES * SUM_GROUPS) {
            for (var u = 0u; u < SUM_LANES; u++) {
                let i = (k + u * SUM_GROUPS) * p.cols + c;
                if (G_OUT != NONE) { part_g[u] += partial_in[i]; }
                if (B_OUT != NONE) { part_b[u] += partial_in[b_start + i]; }
            }
        }
        for (; k < p.n_chunks; k += SUM_GROUPS) {
            let i = k * p.cols + c;
            if (G_OUT != NONE) { part_g[0] += partial_in[i]; }
            if (B_OUT != NONE) { part_b[0] += partial_in[b_start + i]; }
        }
    }
    var sg = 0.0;
    var sb = 0.0;
    for (var u = 0u; u < SUM_LANES; u++) {
        sg += part_g[u];
        sb += part_b[u];
    }
    sum_scratch[lid] = sg;
    sum_scratch[RED_WG + lid] = sb;
    workgroupBarrier();
    if (group != 0u || !valid) { return; }
    // The groups' sums in a fixed order: the same bits every run (no atomics).
    sg = 0.0;
    sb = 0.0;
    for (var g = 0u; g < SUM_GROUPS; g++) {
        sg += sum_scratch[g * SUM_COLS + col];
        sb += sum_scratch[RED_WG + g * SUM_COLS + col];
    }
    let og = p.dgamma_offset + c * p.dgamma_stride;
    if (G_OUT == WRITE) { dgamma[og] = sg; }
    if (G_OUT == ADD) { dgamma[og] = dgamma[og] + sg; }
    let ob = p.dbeta_offset + c * p.dbeta_stride;
    if (B_OUT == WRITE) { dbeta[ob] = sb; }
    if (B_OUT == ADD) { dbeta[ob] = dbeta[ob] + sb; }
}
