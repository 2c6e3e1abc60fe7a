// Element type conversion of a contiguous range: out[out_off + i] = TO(a[a_off + i]).
// The f16 copies of parameters after loading weights; in a step under autocast, the input of
// a linear whose output has 3 K columns or more (rounded once instead of by every tile of the
// product that loads it); other casts in a step are folded into the kernels.
// Workgroup mapping: 256 threads, one element each; linear workgroup = wid.y * nwg.x + wid.x.
// Specialization: TI, TO (the element types in and out).

struct Params {
    numel: u32,
    a_off: u32,
    out_off: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<TO>;
@group(0) @binding(2) var<storage, read> a: array<TI>;

const WG: u32 = 256u;

@compute @workgroup_size(WG)
fn convert(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.numel) { return; }
    out[p.out_off + i] = TO(a[p.a_off + i]);
}
