// The largest magnitude of each operand of an f32 product on the tensor cores (the X3 variant of
// matmul_coop.wgsl, which scales each operand by a power of two from it), as partial maxima:
// workgroup (g, z) folds the rows g, g + PARTS, ... of operand z (0: a, 1: b) and writes the
// bits of its largest |x| (an f32 magnitude's bits order as u32, NaN above infinity) to
// out[out_off + z * PARTS + g]; the product's workgroups take the largest of the PARTS.
//
// An operand is a (batch, rows, cols) view of its binding, element (i, r, c) at
// off + i * bs + r * rs + c * cs (the launcher puts a unit-stride dim in cols, so a row's lanes
// read neighbours, and merges contiguous rows and batches into one row).
//
// Specialization: PARTS (workgroups per operand); AT, the element a load reads (f32, or with
// the snippet VEC vec4<f32>: both operands contiguous rows on vectors of 4, whose views the
// launcher gives in vectors), and `bits_max(x: AT) -> u32` (the largest magnitude's bits).

struct Operand {
    off: u32,
    bs: u32,
    rs: u32,
    cs: u32,
    batch: u32,
    rows: u32,
    cols: u32,
    _pad: u32,
}

struct Params {
    a: Operand,
    b: Operand,
    out_off: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<AT>;
@group(0) @binding(3) var<storage, read> b: array<AT>;

const WG: u32 = 256u;
var<workgroup> red: array<u32, WG>;

fn magnitude(z: u32, i: u32) -> u32 {
    var x: AT;
    if (z == 0u) {
        x = a[i];
    } else {
        x = b[i];
    }
    return bits_max(x);
}

// Items: (row, chunk of CHUNK columns), workgroup g taking items g, g + PARTS, ...; each lane
// has LOADS loads in flight an item (a contiguous operand is one row: its chunks spread over
// every workgroup).
const LOADS: u32 = 8u;
const CHUNK: u32 = LOADS * WG;

@compute @workgroup_size(WG)
fn absmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.y;
    var o = p.a;
    if (z == 1u) {
        o = p.b;
    }
    let chunks = (o.cols + CHUNK - 1u) / CHUNK;
    var m = 0u;
    for (var item = wid.x; item < o.batch * o.rows * chunks; item += PARTS) {
        let r = item / chunks;
        let c0 = (item - r * chunks) * CHUNK + lid;
        let bi = r / o.rows;
        let base = o.off + bi * o.bs + (r - bi * o.rows) * o.rs;
        var x: array<u32, LOADS>;
        for (var q = 0u; q < LOADS; q++) {
            let c = c0 + q * WG;
            x[q] = magnitude(z, base + select(0u, c, c < o.cols) * o.cs);
        }
        for (var q = 0u; q < LOADS; q++) {
            m = max(m, select(0u, x[q], c0 + q * WG < o.cols));
        }
    }
    red[lid] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[p.out_off + z * PARTS + wid.x] = red[0];
    }
}
