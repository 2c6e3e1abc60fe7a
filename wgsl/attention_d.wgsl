// D = rowsum(dO * O) of every query of a causal attention, the statistic its backward
// subtracts from dP (dS = P (dP - D)): written (B, H, T) f32 contiguous, one dispatch before
// attention_coop.wgsl's attn_coop_bwd, whose dQ and dK/dV workgroups, running side by side,
// both read it.
//
// Memory: dO (elements GT) and O (OT), each f32 or f16, are (B, H, T, D) views read 4 elements
// at a time (offsets, strides and D multiples of 4, as attention_coop.wgsl's launcher checks),
// through the views of `Params` (attention.wgsl's: `dout` and `o`); the sums are f32.
//
// Mapping: LANES consecutive lanes of a subgroup a query row (row = global lane / LANES, over
// B * H * T), each summing every LANES-th vector of the row; the row's lanes combined with
// subgroup shuffles (no branch around them: lanes past the last row sum nothing). The grid is
// linear over (x, y) workgroups of WG lanes.

struct Params {
    heads: u32,
    t: u32,
    d: u32,
    batch: u32,
    scale: f32,
    group: u32,
    start: u32,
    _pad3: u32,
    q: vec4<u32>,
    k: vec4<u32>,
    v: vec4<u32>,
    o: vec4<u32>,
    dout: vec4<u32>,
    dq: vec4<u32>,
    dk: vec4<u32>,
    dv: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> dvec: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<vec4<GT>>;
@group(0) @binding(3) var<storage, read> o: array<vec4<OT>>;

const WG: u32 = 256u;
const LANES: u32 = 4u;

// Element (t, 0) of head `bh` of a (B, H, T, D) view.
fn row_at(view: vec4<u32>, bh: u32, t: u32) -> u32 {
    let b = bh / p.heads;
    let h = bh % p.heads;
    return view.x + b * view.y + h * view.z + t * view.w;
}

@compute @workgroup_size(WG)
fn attn_d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(subgroup_id) sg: u32, @builtin(subgroup_size) sgs: u32,
          @builtin(subgroup_invocation_id) lane: u32) {
    // The lane's index within the workgroup as the subgroups number it, so that a row's
    // LANES lanes are consecutive lanes of one subgroup.
    let g = (wid.y * nwg.x + wid.x) * WG + sg * sgs + lane;
    let row = g / LANES;
    let part = g % LANES;
    let rows = p.batch * p.heads * p.t;
    var x = 0.0;
    if (row < rows) {
        let bh = row / p.t;
        let t = row % p.t;
        let a = row_at(p.dout, bh, t) / 4u;
        let b = row_at(p.o, bh, t) / 4u;
        for (var j = part; j < p.d / 4u; j += LANES) {
            x += dot(vec4<f32>(dout[a + j]), vec4<f32>(o[b + j]));
        }
    }
    for (var s = 1u; s < LANES; s <<= 1u) {
        x += subgroupShuffleXor(x, s);
    }
    if (row < rows && part == 0u) {
        dvec[row] = x;
    }
}
