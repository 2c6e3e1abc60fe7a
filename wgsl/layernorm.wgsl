// LayerNorm over the last dim of a contiguous (rows, C) input: forward, and backward from the
// statistics the forward saved (they are never recomputed).
//
// layernorm_forward: one workgroup of 256 lanes per row (linear workgroup id = row), lanes
//   stride over c. All in f32; the variance is biased (divided by C, as PyTorch) and taken
//   from the deviations in a second pass over the row (no E[x^2] - E[x]^2 cancellation):
//     mean[r] = sum_c x[r, c] / C
//     rstd[r] = 1 / sqrt(sum_c (x[r, c] - mean[r])^2 / C + eps)
//     y[r, c] = (x[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c]
// layernorm_backward_dx: one workgroup per row, lanes stride over c:
//     xhat = (x - mean) * rstd,  dxhat = dy * gamma
//     dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat))
// layernorm_backward_partial: stage 1 of dgamma[c] = sum_r dy * xhat and dbeta[c] = sum_r dy.
//   Linear workgroup g = chunk * col_blocks + block; lane lid owns column block * 256 + lid and
//   sums rows [chunk * chunk_rows, (chunk + 1) * chunk_rows) into the (2, n_chunks, C)
//   scratch: partial[0, chunk, c] (dgamma), partial[1, chunk, c] (dbeta).
// layernorm_backward_sum: stage 2, one lane per column: sums the n_chunks partials starting
//   at partial_offset (0: dgamma, n_chunks * C: dbeta) into dparam[out_offset + c * out_stride],
//   SUM_LANES chunks at a time into SUM_LANES running sums (the last few into one), added in order.
//   Fixed summation order: the same bits every run (no atomics).
//
// Memory: x and dy are (rows, C) row-major from x_offset / dy_offset; gamma and beta (C) from
// their offsets; mean and rstd (rows); y and dx (rows, C) from out_offset (y from 0).
// Bindings: each entry point has its own signature (listed in src/kernels/layernorm.rs); WGSL
// lets different entry points reuse a binding number, and a variable read by several kernels
// keeps one slot.
// Specialization: ACC (dx and stage 2 add into their output: gradient accumulation; the
// forward and stage 1 ignore it).

struct Params {
    rows: u32,
    cols: u32,           // C
    eps: f32,
    x_offset: u32,
    gamma_offset: u32,
    beta_offset: u32,
    dy_offset: u32,
    out_offset: u32,
    out_stride: u32,     // stage 2: element stride of the (C) gradient target
    n_chunks: u32,       // stages 1 and 2
    chunk_rows: u32,     // stage 1
    partial_offset: u32, // stage 2
}

@group(0) @binding(0) var<uniform> p: Params;

// Shared: layernorm_forward, layernorm_backward_dx, layernorm_backward_partial.
@group(0) @binding(2) var<storage, read> x: array<f32>;           // (rows, C)
// Shared: layernorm_forward, layernorm_backward_dx.
@group(0) @binding(6) var<storage, read> gamma: array<f32>;       // (C)

// layernorm_forward: y, x, beta, mean, rstd, gamma.
@group(0) @binding(1) var<storage, read_write> y: array<f32>;     // (rows, C)
@group(0) @binding(3) var<storage, read> beta: array<f32>;        // (C)
@group(0) @binding(4) var<storage, read_write> mean_out: array<f32>; // (rows)
@group(0) @binding(5) var<storage, read_write> rstd_out: array<f32>; // (rows)

// layernorm_backward_dx: dx, x, dy, mean, rstd, gamma.
// layernorm_backward_partial: partial, x, dy, mean, rstd.
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;    // (rows, C)
@group(0) @binding(1) var<storage, read_write> partial: array<f32>; // (2, n_chunks, C)
@group(0) @binding(3) var<storage, read> dy: array<f32>;          // (rows, C)
@group(0) @binding(4) var<storage, read> mean: array<f32>;        // (rows)
@group(0) @binding(5) var<storage, read> rstd: array<f32>;        // (rows)

// layernorm_backward_sum: dparam, partial_in.
@group(0) @binding(1) var<storage, read_write> dparam: array<f32>; // (C), strided
@group(0) @binding(2) var<storage, read> partial_in: array<f32>;  // (2, n_chunks, C)

@compute @workgroup_size(RED_WG)
fn layernorm_forward(@builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.y * nwg.x + wid.x;
    // row is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (row >= p.rows) { return; }
    let base = p.x_offset + row * p.cols;
    let n = f32(p.cols);

    var s = 0.0;
    for (var c = lanes.lid; c < p.cols; c += RED_WG) {
        s += x[base + c];
    }
    let mu = wg_sum(s, lanes) / n;

    var v = 0.0;
    for (var c = lanes.lid; c < p.cols; c += RED_WG) {
        let d = x[base + c] - mu;
        v += d * d;
    }
    let r = inverseSqrt(wg_sum(v, lanes) / n + p.eps);

    let out_base = row * p.cols;
    for (var c = lanes.lid; c < p.cols; c += RED_WG) {
        let xhat = (x[base + c] - mu) * r;
        y[out_base + c] = xhat * gamma[p.gamma_offset + c] + beta[p.beta_offset + c];
    }
    if (lanes.lid == 0u) {
        mean_out[row] = mu;
        rstd_out[row] = r;
    }
}

@compute @workgroup_size(RED_WG)
fn layernorm_backward_dx(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.y * nwg.x + wid.x;
    // row is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (row >= p.rows) { return; }
    let base = p.x_offset + row * p.cols;
    let dy_base = p.dy_offset + row * p.cols;
    let mu = mean[row];
    let r = rstd[row];
    let n = f32(p.cols);

    var s_dxhat = 0.0;
    var s_dxhat_xhat = 0.0;
    for (var c = lanes.lid; c < p.cols; c += RED_WG) {
        let xhat = (x[base + c] - mu) * r;
        let dxhat = dy[dy_base + c] * gamma[p.gamma_offset + c];
        s_dxhat += dxhat;
        s_dxhat_xhat += dxhat * xhat;
    }
    let mean_dxhat = wg_sum(s_dxhat, lanes) / n;
    let mean_dxhat_xhat = wg_sum(s_dxhat_xhat, lanes) / n;

    let out_base = p.out_offset + row * p.cols;
    for (var c = lanes.lid; c < p.cols; c += RED_WG) {
        let xhat = (x[base + c] - mu) * r;
        let dxhat = dy[dy_base + c] * gamma[p.gamma_offset + c];
        let g = r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        let o = out_base + c;
        if (ACC) {
            dx[o] = dx[o] + g;
        } else {
            dx[o] = g;
        }
    }
}

@compute @workgroup_size(RED_WG)
fn layernorm_backward_partial(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nwg: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    let g = wid.y * nwg.x + wid.x;
    let col_blocks = (p.cols + RED_WG - 1u) / RED_WG;
    let chunk = g / col_blocks;
    let c = (g % col_blocks) * RED_WG + lid;
    if (chunk >= p.n_chunks || c >= p.cols) { return; }
    let first = chunk * p.chunk_rows;
    let last = min(first + p.chunk_rows, p.rows);
    var dgamma = 0.0;
    var dbeta = 0.0;
    for (var r = first; r < last; r++) {
        let d = dy[p.dy_offset + r * p.cols + c];
        let xhat = (x[p.x_offset + r * p.cols + c] - mean[r]) * rstd[r];
        dgamma += d * xhat;
        dbeta += d;
    }
    partial[chunk * p.cols + c] = dgamma;
    partial[(p.n_chunks + chunk) * p.cols + c] = dbeta;
}

const SUM_LANES: u32 = 8u;

@compute @workgroup_size(RED_WG)
fn layernorm_backward_sum(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let c = (wid.y * nwg.x + wid.x) * RED_WG + lid;
    if (c >= p.cols) { return; }
    // SUM_LANES partial sums, so that as many loads are in flight a lane (a handful of
    // workgroups run this: one chain of dependent adds took 15 us for 128 chunks on an H200);
    // added in a fixed order.
    var part: array<f32, SUM_LANES>;
    var k = 0u;
    for (; k + SUM_LANES <= p.n_chunks; k += SUM_LANES) {
        for (var u = 0u; u < SUM_LANES; u++) {
            part[u] += partial_in[p.partial_offset + (k + u) * p.cols + c];
        }
    }
    var s = 0.0;
    for (; k < p.n_chunks; k++) {
        s += partial_in[p.partial_offset + k * p.cols + c];
    }
    for (var u = 0u; u < SUM_LANES; u++) {
        s += part[u];
    }
    let o = p.out_offset + c * p.out_stride;
    if (ACC) {
        dparam[o] = dparam[o] + s;
    } else {
        dparam[o] = s;
    }
}
