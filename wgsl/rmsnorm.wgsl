// RMSNorm over the last dim (Llama's LlamaRMSNorm, Qwen2's, Qwen3's q_norm and k_norm over
// head_dim): forward, and backward from the rstd the forward saved (never recomputed).
//
// rmsnorm_forward: one workgroup of 256 lanes per row (linear workgroup id = row), lanes
//   stride over c. All in f32 from x (XT: f32 or f16); y stored as YT (f32, or f16 for a
//   matmul consumer):
//     rstd[r] = 1 / sqrt(sum_c x[r, c]^2 / C + eps)
//     y[r, c] = weight[c] * (x[r, c] * rstd[r])
// rmsnorm_backward: one workgroup per chunk of chunk_rows rows (linear workgroup id = chunk),
//   lanes stride over c, the rows one after another. Per row (when DX):
//     xhat = x * rstd,  dxhat = dy * weight
//     dx = rstd * (dxhat - xhat * mean_c(dxhat * xhat))
//   and (when PARAMS) stage 1 of dweight[c] = sum_r dy * xhat: a lane keeps the sums of its
//   first LANE_COLS columns in registers over the chunk's rows (columns past LANE_COLS * 256
//   take a second pass over the rows), then writes them into the (n_chunks, C) scratch
//   partial[chunk, c]. Stage 2 is layernorm_backward_sum (wgsl/layernorm.wgsl) with dbeta
//   not wanted: it reads the first (n_chunks, C) block only.
//
// Memory: x (XT) is a view whose rows have unit stride: row r = (i0 * n1 + i1) * n2 + i2
// starts at x_offset + i0 * s0 + i1 * s1 + i2 * s2 (a (B, T, H, D) narrow of a packed qkv
// tensor, or row-major rows: n1 = n2 = 1, s0 = C). dy (DY: f32 or f16) is (rows, C) row-major
// from dy_offset; weight (C) from weight_offset; rstd (rows); y (rows, C) from 0, dx
// (rows, C) from out_offset.
// Bindings: each entry point has its own signature (listed in src/kernels/rmsnorm.rs); a
// variable read by both kernels keeps one slot. A binding a variant does not touch (dx without
// DX, partial without PARAMS) is bound to the other read-write buffer of the dispatch.
// Specialization: XT (x's type), YT (y's type), DY (dy's type), ACC (dx adds into its output:
// gradient accumulation), DX and PARAMS (what rmsnorm_backward writes).

struct Params {
    rows: u32,
    cols: u32,            // C
    eps: f32,
    x_offset: u32,
    weight_offset: u32,
    dy_offset: u32,
    out_offset: u32,      // dx
    n_chunks: u32,        // backward
    chunk_rows: u32,      // backward
    n1: u32,              // x's rows: the inner two merged leading dims' sizes
    n2: u32,
    s0: u32,              // and the three dims' strides
    s1: u32,
    s2: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// Shared: rmsnorm_forward, rmsnorm_backward.
@group(0) @binding(2) var<storage, read> x: array<XT>;            // (rows, C), a view

// rmsnorm_forward: y, x, rstd, weight.
@group(0) @binding(1) var<storage, read_write> y: array<YT>;      // (rows, C)
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>; // (rows)
@group(0) @binding(4) var<storage, read> weight_f: array<f32>;    // (C)

// rmsnorm_backward: dx, x, dy, rstd, weight, partial.
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;    // (rows, C)
@group(0) @binding(3) var<storage, read> dy: array<DY>;           // (rows, C)
@group(0) @binding(4) var<storage, read> rstd: array<f32>;        // (rows)
@group(0) @binding(5) var<storage, read> weight: array<f32>;      // (C)
@group(0) @binding(6) var<storage, read_write> partial: array<f32>; // (n_chunks, C)

// Columns a lane keeps in registers: the forward's x, the backward's x-hat, dy and weight,
// and its dweight sums over a chunk's rows: C up to 1024 = 4 x 256 in one pass.
const LANE_COLS: u32 = 4u;

// Where row r of x starts.
fn x_row(r: u32) -> u32 {
    let i2 = r % p.n2;
    let i1 = (r / p.n2) % p.n1;
    let i0 = r / (p.n1 * p.n2);
    return p.x_offset + i0 * p.s0 + i1 * p.s1 + i2 * p.s2;
}

@compute @workgroup_size(RED_WG)
fn rmsnorm_forward(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.y * nwg.x + wid.x;
    // row is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (row >= p.rows) { return; }
    let base = x_row(row);

    // The lane's first LANE_COLS columns of x stay in registers for both passes (loaded
    // branch-free: a column past C reads the last one's and counts as 0); the columns past
    // LANE_COLS * 256 are read again.
    var xs: array<f32, LANE_COLS>;
    var s = 0.0;
    for (var j = 0u; j < LANE_COLS; j++) {
        let c = lanes.lid + j * RED_WG;
        xs[j] = select(0.0, f32(x[base + min(c, p.cols - 1u)]), c < p.cols);
        s += xs[j] * xs[j];
    }
    for (var c = lanes.lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
        let v = f32(x[base + c]);
        s += v * v;
    }
    let r = inverseSqrt(wg_sum(s, lanes) / f32(p.cols) + p.eps);

    let out_base = row * p.cols;
    for (var j = 0u; j < LANE_COLS; j++) {
        let c = lanes.lid + j * RED_WG;
        if (c < p.cols) {
            y[out_base + c] = YT(weight_f[p.weight_offset + c] * (xs[j] * r));
        }
    }
    for (var c = lanes.lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
        y[out_base + c] = YT(weight_f[p.weight_offset + c] * (f32(x[base + c]) * r));
    }
    if (lanes.lid == 0u) {
        rstd_out[row] = r;
    }
}

fn store_dx(o: u32, g: f32) {
    if (ACC) {
        dx[o] = dx[o] + g;
    } else {
        dx[o] = g;
    }
}

@compute @workgroup_size(RED_WG)
fn rmsnorm_backward(@builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let chunk = wid.y * nwg.x + wid.x;
    // chunk is the same for the whole workgroup, so this exit skips no lane's barrier.
    if (chunk >= p.n_chunks) { return; }
    let first = chunk * p.chunk_rows;
    let last = min(first + p.chunk_rows, p.rows);
    let lid = lanes.lid;
    let n = f32(p.cols);

    // The lane's first LANE_COLS columns in registers: weight once for the chunk, x-hat and dy
    // once a row (loaded branch-free: a column past C reads the last one's, and its dy counts
    // as 0); the columns past LANE_COLS * 256 are read again where used.
    var ws: array<f32, LANE_COLS>;
    var sums: array<f32, LANE_COLS>;
    for (var j = 0u; j < LANE_COLS; j++) {
        ws[j] = weight[p.weight_offset + min(lid + j * RED_WG, p.cols - 1u)];
    }
    for (var row = first; row < last; row++) {
        let base = x_row(row);
        let dy_base = p.dy_offset + row * p.cols;
        let r = rstd[row];
        var xh: array<f32, LANE_COLS>;
        var dd: array<f32, LANE_COLS>;
        for (var j = 0u; j < LANE_COLS; j++) {
            let c = lid + j * RED_WG;
            let cc = min(c, p.cols - 1u);
            xh[j] = f32(x[base + cc]) * r;
            dd[j] = select(0.0, f32(dy[dy_base + cc]), c < p.cols);
        }
        if (DX) {
            // mean_c(dxhat * xhat).
            var s = 0.0;
            for (var j = 0u; j < LANE_COLS; j++) {
                s += dd[j] * ws[j] * xh[j];
            }
            for (var c = lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
                let xhat = f32(x[base + c]) * r;
                s += f32(dy[dy_base + c]) * weight[p.weight_offset + c] * xhat;
            }
            let m = wg_sum(s, lanes) / n;

            let out_base = p.out_offset + row * p.cols;
            for (var j = 0u; j < LANE_COLS; j++) {
                let c = lid + j * RED_WG;
                if (c < p.cols) {
                    store_dx(out_base + c, r * (dd[j] * ws[j] - xh[j] * m));
                }
            }
            for (var c = lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
                let xhat = f32(x[base + c]) * r;
                let dxhat = f32(dy[dy_base + c]) * weight[p.weight_offset + c];
                store_dx(out_base + c, r * (dxhat - xhat * m));
            }
        }
        for (var j = 0u; j < LANE_COLS; j++) {
            sums[j] += dd[j] * xh[j];
        }
    }
    if (!PARAMS) { return; }
    let g_base = chunk * p.cols;
    for (var j = 0u; j < LANE_COLS; j++) {
        let c = lid + j * RED_WG;
        if (c < p.cols) {
            partial[g_base + c] = sums[j];
        }
    }
    // Columns past the lane's registers (rows wider than LANE_COLS * 256): the chunk's rows
    // again.
    for (var c = lid + LANE_COLS * RED_WG; c < p.cols; c += RED_WG) {
        var sg = 0.0;
        for (var row = first; row < last; row++) {
            let d = f32(dy[p.dy_offset + row * p.cols + c]);
            sg += d * f32(x[x_row(row) + c]) * rstd[row];
        }
        partial[g_base + c] = sg;
    }
}
