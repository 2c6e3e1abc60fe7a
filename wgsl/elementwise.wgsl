// Elementwise kernels: unary (with scalar operands), binary with broadcasting, where, fill.
//
// out[i] = f(a[ia], b[ib], c[ic]) for every i < numel of the contiguous output (offset
// offsets.w). When STRIDED, ia/ib/ic come from i's coordinates in `shape` times each
// operand's strides (0 on broadcast dims) plus its offset; otherwise operands are contiguous
// and V may be vec4<f32> (numel then counts vec4s): the vectorized path.
//
// Workgroup mapping: 256 threads, one element each; linear workgroup = wid.y * nwg.x + wid.x.
// Specialization: OP (the operation), V (f32 or vec4<f32>), STRIDED.

struct Params {
    numel: u32,
    rank: u32,
    scalar: f32,
    scalar2: f32,
    shape: array<vec4<u32>, 2>,     // (rank) output shape
    a_strides: array<vec4<u32>, 2>, // (rank) elements, 0 where broadcast
    b_strides: array<vec4<u32>, 2>,
    c_strides: array<vec4<u32>, 2>,
    offsets: vec4<u32>,             // a, b, c, out
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<V>;
@group(0) @binding(2) var<storage, read> a: array<V>;
@group(0) @binding(3) var<storage, read> b: array<V>;
@group(0) @binding(4) var<storage, read> c: array<V>;

const WG: u32 = 256u;

// The element offsets of a, b and c for output element i.
fn operand_offsets(i: u32) -> vec3<u32> {
    if (!STRIDED) {
        return p.offsets.xyz + vec3<u32>(i);
    }
    var rem = i;
    var off = p.offsets.xyz;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        let coord = rem % n;
        rem = rem / n;
        off += coord * vec3<u32>(p.a_strides[q][r], p.b_strides[q][r], p.c_strides[q][r]);
    }
    return off;
}

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid;
}

// tanh without the overflow some drivers show for large |x| (tanh(15) == 1 in f32).
fn tanh_safe(x: V) -> V {
    return tanh(clamp(x, V(-15.0), V(15.0)));
}

fn unary_op(x: V) -> V {
    let s = V(p.scalar);
    switch OP {
        case 0u: { return x; }                                   // copy
        case 1u: { return -x; }                                  // neg
        case 2u: { return exp(x); }
        case 3u: { return log(x); }
        case 4u: { return sqrt(x); }
        case 5u: { return inverseSqrt(x); }
        case 6u: { return abs(x); }
        case 7u: { return max(x, V(0.0)); }                      // relu
        case 8u: { return tanh_safe(x); }
        case 9u: { return V(1.0) / (V(1.0) + exp(-x)); }         // sigmoid
        case 10u: {                                              // gelu, tanh approximation
            let k = V(0.7978845608028654);                       // sqrt(2 / pi)
            return V(0.5) * x * (V(1.0) + tanh_safe(k * (x + V(0.044715) * x * x * x)));
        }
        case 11u: { return sin(x); }
        case 12u: { return cos(x); }
        case 13u: { return x * x; }                              // square
        case 14u: { return V(1.0) / x; }                         // recip
        case 20u: { return x + s; }                              // add_scalar
        case 21u: { return x * s; }                              // mul_scalar
        case 22u: {                                              // pow_scalar
            // scalar2: 1 odd integer exponent, 0 even integer, 2 otherwise (x < 0 gives NaN)
            let r = pow(abs(x), s);
            if (p.scalar2 == 1.0) { return r * sign(x); }
            if (p.scalar2 == 0.0) { return r; }
            return pow(x, s);
        }
        case 23u: { return max(x, s); }                          // max_scalar
        case 24u: { return min(x, s); }                          // min_scalar
        case 25u: { return s - x; }                              // rsub_scalar
        case 26u: { return s / x; }                              // rdiv_scalar
        case 27u: { return clamp(x, s, V(p.scalar2)); }          // clamp
        case 28u: { return x * s + V(p.scalar2); }               // affine
        default: { return x; }
    }
}

fn binary_op(x: V, y: V) -> V {
    switch OP {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return max(x, y); }
        case 5u: { return min(x, y); }
        case 6u: { return pow(x, y); }
        case 10u: { return select(V(0.0), V(1.0), x == y); }
        case 11u: { return select(V(0.0), V(1.0), x != y); }
        case 12u: { return select(V(0.0), V(1.0), x < y); }
        case 13u: { return select(V(0.0), V(1.0), x <= y); }
        case 14u: { return select(V(0.0), V(1.0), x > y); }
        case 15u: { return select(V(0.0), V(1.0), x >= y); }
        default: { return x; }
    }
}

@compute @workgroup_size(WG)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    let o = operand_offsets(i);
    out[p.offsets.w + i] = unary_op(a[o.x]);
}

@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    let o = operand_offsets(i);
    out[p.offsets.w + i] = binary_op(a[o.x], b[o.y]);
}

// out = cond != 0 ? x : y, with cond in a, x in b, y in c.
@compute @workgroup_size(WG)
fn select_where(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    let o = operand_offsets(i);
    out[p.offsets.w + i] = select(c[o.z], b[o.y], a[o.x] != V(0.0));
}

@compute @workgroup_size(WG)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    out[p.offsets.w + i] = V(p.scalar);
}
