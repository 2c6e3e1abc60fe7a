// Arithmetic ceiling of f32 shader code: no memory traffic but one store per lane, so its rate
// is what FMA-bound code can reach through wgpu on this adapter (the roof `wgrad bench` sets
// kernels against).
//
// peak_fma: each lane runs `iters` steps of 8 independent FMA chains (16 FLOP a step; the
// chains hide the FMA latency) and stores their sum, so nothing is optimized away.
// Grid: 1-D, 256 lanes a workgroup.

struct Params {
    iters: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn peak_fma(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = f32(gid.x) * 1e-9;
    var a = array<f32, 8>(x, x + 1e-3, x + 2e-3, x + 3e-3, x + 4e-3, x + 5e-3, x + 6e-3, x + 7e-3);
    let m = 0.999999;
    let c = 1e-7;
    for (var i = 0u; i < p.iters; i++) {
        a[0] = fma(a[0], m, c);
        a[1] = fma(a[1], m, c);
        a[2] = fma(a[2], m, c);
        a[3] = fma(a[3], m, c);
        a[4] = fma(a[4], m, c);
        a[5] = fma(a[5], m, c);
        a[6] = fma(a[6], m, c);
        a[7] = fma(a[7], m, c);
    }
    out[gid.x] = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}
