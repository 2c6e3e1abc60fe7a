// SwiGLU over x = [gate | up] along the last dim (one matmul's output against Hugging Face's
// gate_proj and up_proj weights concatenated), F = half of x's last dim:
//
// swiglu_forward: one lane per output element (linear index i = row * F + j):
//     y[row, j] = silu(g) * u,  g = x[row, j], u = x[row, F + j],  silu(g) = g * sigmoid(g)
//   computed in f32 from x (XT: f32 or f16), stored as YT (f32, or f16 for a matmul consumer).
// swiglu_backward: one lane per (row, j), writing both halves of the (rows, 2F) gradient:
//     dx[row, j]     = dy * u * s * (1 + g * (1 - s)),  s = sigmoid(g)   (dgate)
//     dx[row, F + j] = dy * silu(g)                                       (dup)
//   in f32 from dy (DY: f32 or f16), stored as DXT (f32, or f16 for the gate/up matmul's
//   backward under mixed precision, which rounds it to f16 as it loads it); ACC adds into an
//   f32 dx (gradient accumulation).
// sigmoid is taken from exp(-|g|), which never overflows: g = +-100 give 1 and 0 (no inf or
// NaN), so silu and both gradients are finite for any finite g.
//
// Memory: x's rows start x_row_stride apart from x_offset, its last dim of unit stride (a
// row-major x: x_row_stride = 2F); y (rows, F) row-major from 0; dy (rows, F) row-major from
// dy_offset; dx (rows, 2F) row-major from out_offset.
// Workgroups: WG lanes each, linear workgroup id = wid.y * nwg.x + wid.x.

struct Params {
    numel: u32,           // rows * F
    f: u32,               // F
    x_offset: u32,
    x_row_stride: u32,
    dy_offset: u32,
    out_offset: u32,      // dx
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(2) var<storage, read> x: array<XT>;            // (rows, 2F), a view

// swiglu_forward: y, x.
@group(0) @binding(1) var<storage, read_write> y: array<YT>;      // (rows, F)

// swiglu_backward: dx, x, dy.
@group(0) @binding(1) var<storage, read_write> dx: array<DXT>;    // (rows, 2F)
@group(0) @binding(3) var<storage, read> dy: array<DY>;           // (rows, F)

fn sigmoid(g: f32) -> f32 {
    let e = exp(-abs(g)); // in (0, 1]
    return select(e / (1.0 + e), 1.0 / (1.0 + e), g >= 0.0);
}

@compute @workgroup_size(WG)
fn swiglu_forward(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.numel) { return; }
    let row = i / p.f;
    let j = i - row * p.f;
    let base = p.x_offset + row * p.x_row_stride + j;
    let g = f32(x[base]);
    let u = f32(x[base + p.f]);
    y[i] = YT(g * sigmoid(g) * u);
}

fn store_dx(o: u32, v: f32) {
    if (ACC) {
        dx[o] = DXT(f32(dx[o]) + v);
    } else {
        dx[o] = DXT(v);
    }
}

@compute @workgroup_size(WG)
fn swiglu_backward(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.numel) { return; }
    let row = i / p.f;
    let j = i - row * p.f;
    let base = p.x_offset + row * p.x_row_stride + j;
    let g = f32(x[base]);
    let u = f32(x[base + p.f]);
    let d = f32(dy[p.dy_offset + i]);
    let s = sigmoid(g);
    let out = p.out_offset + row * 2u * p.f + j;
    store_dx(out, d * u * s * (1.0 + g * (1.0 - s)));
    store_dx(out + p.f, d * g * s);
}
