// The largest magnitude of each operand of an f32 product on the tensor cores (the X3 variant of
// matmul_coop.wgsl, which scales each operand by a power of two from it), as partial maxima:
// workgroup (g, z) folds items g, g + PARTS, ... of operand z (0: a, 1: b) and writes the bits
// of its largest finite |x| (an f32 magnitude's bits order as u32) to
// out[out_off + z * PARTS + g]; the product's workgroups take the largest of the PARTS.
//
// An operand is a (batch, rows, cols) view of its binding, element (i, r, c) at
// off + i * bs + r * rs + c * cs (the launcher puts a unit-stride dim in cols, so a row's lanes
// read neighbours, and merges contiguous rows and batches into one row). The bindings are
// arrays of vectors of 4: with `vec` (cs 1, every row starting on a vector, its last vector
// inside the binding: the launcher checks) a load reads 4 elements of a row, those past its
// end masked; else one element. An item is a chunk of a row, LOADS loads a lane (a contiguous
// operand is one row: its chunks spread over every workgroup).
//
// Specialization: PARTS (workgroups per operand). Uses the workgroup reductions (`wg_max`).

struct Operand {
    off: u32,
    bs: u32,
    rs: u32,
    cs: u32,
    batch: u32,
    rows: u32,
    cols: u32,
    vec: u32,
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
@group(0) @binding(2) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> b: array<vec4<f32>>;

const WG: u32 = 256u;
const LOADS: u32 = 8u;

// The vector holding element i of operand z.
fn load(z: u32, i: u32) -> vec4<f32> {
    if (z == 0u) {
        return a[i >> 2u];
    }
    return b[i >> 2u];
}

@compute @workgroup_size(WG)
fn absmax(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let lid = lanes.lid;
    let z = wid.y;
    var o = p.a;
    if (z == 1u) {
        o = p.b;
    }
    // Elements a lane's load covers, and a row's chunk.
    let step = select(1u, 4u, o.vec != 0u);
    let chunk = LOADS * WG * step;
    let chunks = (o.cols + chunk - 1u) / chunk;
    let j = vec4<u32>(0u, 1u, 2u, 3u);
    var m = 0u;
    for (var item = wid.x; item < o.batch * o.rows * chunks; item += PARTS) {
        let r = item / chunks;
        let c0 = (item - r * chunks) * chunk + lid * step;
        let bi = r / o.rows;
        let base = o.off + bi * o.bs + (r - bi * o.rows) * o.rs;
        var x: array<vec4<f32>, LOADS>;
        for (var q = 0u; q < LOADS; q++) {
            let c = c0 + q * WG * step;
            x[q] = load(z, base + select(0u, c, c < o.cols) * o.cs);
        }
        for (var q = 0u; q < LOADS; q++) {
            let c = c0 + q * WG * step;
            // Infinities and NaN left out: an operand's other elements keep their scale (the
            // product still gives NaN where they enter it).
            var bits = bitcast<vec4<u32>>(x[q]) & vec4<u32>(0x7fffffffu);
            bits = select(bits, vec4<u32>(), bits >= vec4<u32>(0x7f800000u));
            // vec: the components inside the row; else the one element, component i & 3.
            let e = base + c * o.cs;
            let keep = select(j == vec4<u32>(e & 3u), vec4<u32>(c) + j < vec4<u32>(o.cols), o.vec != 0u)
                & vec4<bool>(c < o.cols);
            let v = select(vec4<u32>(), bits, keep);
            m = max(m, max(max(v.x, v.y), max(v.z, v.w)));
        }
    }
    // Finite magnitudes order as their bits do: the workgroup's largest as an f32.
    let largest = wg_max(bitcast<f32>(m), lanes);
    if (lid == 0u) {
        out[p.out_off + z * PARTS + wid.x] = bitcast<u32>(largest);
    }
}
