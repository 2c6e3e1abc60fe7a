// Counts the non-finite elements (NaN, +Inf, -Inf) of one f32 tensor, a contiguous range of its
// binding: elements off .. off + n. An f32 is non-finite where its exponent bits are all ones;
// the test is on the bits (bitcast), not `x != x`, which a compiler may fold to false. Each lane
// counts its elements (a grid-stride loop) and adds a count that is not 0 to counts[slot]: on
// finite weights no lane touches the atomic.
//
// No specialization; grid (x, y) workgroups, the linear index wid.y * nwg.x + wid.x.

struct Params {
    off: u32,
    n: u32,
    slot: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read> x: array<u32>;

const WG: u32 = 256u;
const EXPONENT: u32 = 0x7f800000u;

@compute @workgroup_size(WG)
fn count_nonfinite(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let lanes = nwg.x * nwg.y * WG;
    var c = 0u;
    for (var i = (wid.y * nwg.x + wid.x) * WG + lid; i < p.n; i += lanes) {
        c += select(0u, 1u, (x[p.off + i] & EXPONENT) == EXPONENT);
    }
    if (c != 0u) {
        atomicAdd(&counts[p.slot], c);
    }
}
