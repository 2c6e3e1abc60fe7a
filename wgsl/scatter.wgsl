// Scatter-add of rows: the backward of index_select along dim 0 (embedding lookup).
//
// dx[row, :] (+)= sum of dy[j, :] over the positions j whose index is row. The host groups
// positions by row (CSR; deterministic: no atomics, the same summation order every run): csr
// holds rows[n_rows], then starts[n_rows + 1] (into positions) at starts_offset, then the
// positions at positions_offset. One workgroup per listed row; lanes stride over columns.
// Specialization: ACC (add into dx instead of overwriting the listed rows).

const WG: u32 = 256u;
struct Params {
    n_rows: u32,
    cols: u32,
    dy_offset: u32,
    dy_row_stride: u32,
    out_offset: u32,
    out_row_stride: u32,
    starts_offset: u32,
    positions_offset: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read> csr: array<u32>;

@compute @workgroup_size(WG)
fn index_add_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let u = wid.y * nwg.x + wid.x;
    if (u >= p.n_rows) { return; }
    let row = csr[u];
    let first = csr[p.starts_offset + u];
    let last = csr[p.starts_offset + u + 1u];
    for (var col = lid; col < p.cols; col += WG) {
        var sum = 0.0;
        for (var j = first; j < last; j++) {
            let pos = csr[p.positions_offset + j];
            sum += dy[p.dy_offset + pos * p.dy_row_stride + col];
        }
        let o = p.out_offset + row * p.out_row_stride + col;
        if (ACC) {
            dx[o] = dx[o] + sum;
        } else {
            dx[o] = sum;
        }
    }
}
