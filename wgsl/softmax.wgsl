// Softmax and log-softmax over the last axis of a contiguous (rows, cols) input.
//
// y[r, j] = exp(x[r, j] - max_r) / sum_r            (LOG = false)
// y[r, j] = x[r, j] - max_r - log(sum_r)            (LOG = true)
// with max_r = max_j x[r, j] and sum_r = sum_j exp(x[r, j] - max_r), all in f32.
//
// One workgroup of 256 lanes per row (linear workgroup id = row); lanes stride over columns;
// three passes over the row (max, sum, write), each followed by a workgroup reduction.

struct Params {
    rows: u32,
    cols: u32,
    in_offset: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

@compute @workgroup_size(RED_WG)
fn softmax_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                lanes: Lanes) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) { return; }
    let base = p.in_offset + row * p.cols;
    let out_base = row * p.cols;

    var m = -3.4028234663852886e38;
    for (var j = lanes.lid; j < p.cols; j += RED_WG) {
        m = max(m, x[base + j]);
    }
    let row_max = wg_max(m, lanes);

    var s = 0.0;
    for (var j = lanes.lid; j < p.cols; j += RED_WG) {
        s += exp(x[base + j] - row_max);
    }
    let sum = wg_sum(s, lanes);

    if (LOG) {
        let lse = row_max + log(sum);
        for (var j = lanes.lid; j < p.cols; j += RED_WG) {
            y[out_base + j] = x[base + j] - lse;
        }
    } else {
        let inv = 1.0 / sum;
        for (var j = lanes.lid; j < p.cols; j += RED_WG) {
            y[out_base + j] = exp(x[base + j] - row_max) * inv;
        }
    }
}
