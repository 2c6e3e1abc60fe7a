// Elementwise kernels: unary (with scalar operands), binary with broadcasting, ternary (where,
// and the backward rules of the elementwise, reduction and softmax ops), fill.
//
// out[io] (+)= f(a[ia], b[ib], c[ic]) for every i < numel. When STRIDED, ia/ib/ic/io come
// from i's coordinates in `shape` times each operand's strides (0 on broadcast dims) plus its
// offset, so the output may be a view too (a gradient routed into a slice); otherwise every
// operand is contiguous and V may be vec4<f32> (numel then counts vec4s): the vectorized path.
// ACC adds into the output instead of overwriting it (gradient accumulation in place). The
// output's elements are VO: V, or its f16 form (f16 or vec4<f16>), each value rounded once as
// it is stored (a gradient that f16 products read next, under autocast).
//
// Workgroup mapping: 256 threads, one element each; linear workgroup = wid.y * nwg.x + wid.x.
// The inputs' elements are VA, VB, VC: V, or its f16 form (an f16 tensor, read as f32).
// Specialization: OP (the operation), V (f32 or vec4<f32>), VO, VA, VB, VC (V or its f16
// form), STRIDED, ACC.

struct Params {
    numel: u32,
    rank: u32,
    scalar: f32,
    scalar2: f32,
    shape: array<vec4<u32>, 2>,     // (rank) output shape
    a_strides: array<vec4<u32>, 2>, // (rank) elements, 0 where broadcast
    b_strides: array<vec4<u32>, 2>,
    c_strides: array<vec4<u32>, 2>,
    out_strides: array<vec4<u32>, 2>,
    offsets: vec4<u32>,             // a, b, c, out
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<VO>;
@group(0) @binding(2) var<storage, read> a: array<VA>;
@group(0) @binding(3) var<storage, read> b: array<VB>;
@group(0) @binding(4) var<storage, read> c: array<VC>;

const WG: u32 = 256u;

// The element offsets of a, b, c and out for element i.
fn operand_offsets(i: u32) -> vec4<u32> {
    if (!STRIDED) {
        return p.offsets + vec4<u32>(i);
    }
    var rem = i;
    var off = p.offsets;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        let coord = rem % n;
        rem = rem / n;
        off += coord * vec4<u32>(p.a_strides[q][r], p.b_strides[q][r], p.c_strides[q][r], p.out_strides[q][r]);
    }
    return off;
}

fn store(o: u32, v: V) {
    if (ACC) {
        out[o] = VO(V(out[o]) + v);
    } else {
        out[o] = VO(v);
    }
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

// (g, x, y) -> value, with g in a, x in b, y in c. Codes 0: where; 100 + unary code: that
// unary op's backward (x its input, y its output); 200 + 2 * binary code (+1 for the right
// operand): that binary op's backward (x, y its operands); 300 and up: reductions, softmax.
fn ternary_op(g: V, x: V, y: V) -> V {
    let s = V(p.scalar);
    let zero = V(0.0);
    switch OP {
        case 0u: { return select(y, x, g != zero); }                 // where(cond = g, x, y)
        case 100u, 120u: { return g; }                               // copy, add_scalar
        case 101u, 125u: { return -g; }                              // neg, rsub_scalar
        case 102u: { return g * y; }                                 // exp
        case 103u: { return g / x; }                                 // log
        case 104u: { return g * V(0.5) / y; }                        // sqrt
        case 105u: { return V(-0.5) * g * y * y * y; }               // rsqrt
        case 106u: { return g * sign(x); }                           // abs
        case 107u: { return select(zero, g, x > zero); }             // relu
        case 108u: { return g * (V(1.0) - y * y); }                  // tanh
        case 109u: { return g * y * (V(1.0) - y); }                  // sigmoid
        case 110u: {                                                 // gelu (tanh approximation)
            let k = V(0.7978845608028654);
            let c = V(0.044715);
            let t = tanh_safe(k * (x + c * x * x * x));
            let dt = (V(1.0) - t * t) * k * (V(1.0) + V(3.0) * c * x * x);
            return g * (V(0.5) * (V(1.0) + t) + V(0.5) * x * dt);
        }
        case 111u: { return g * cos(x); }                            // sin
        case 112u: { return -g * sin(x); }                           // cos
        case 113u: { return V(2.0) * g * x; }                        // square
        case 114u: { return -g * y * y; }                            // recip
        case 121u, 128u: { return g * s; }                           // mul_scalar, affine
        case 122u: {                                                 // pow_scalar
            // scalar2 as in unary_op: 1 odd integer s, 0 even integer s, 2 otherwise
            let m = abs(x);
            if (p.scalar2 == 0.0) { return g * s * pow(m, s - V(1.0)) * sign(x); }
            if (p.scalar2 == 1.0) { return g * s * pow(m, s - V(1.0)); }
            return g * s * pow(x, s - V(1.0));
        }
        case 123u: { return select(zero, g, x > s); }                // max_scalar
        case 124u: { return select(zero, g, x < s); }                // min_scalar
        case 126u: { return -g * s / (x * x); }                      // rdiv_scalar
        case 127u: { return select(zero, g, (x >= s) & (x <= V(p.scalar2))); } // clamp
        case 200u, 201u, 202u: { return g; }                         // add (both), sub left
        case 203u: { return -g; }                                    // sub right
        case 204u: { return g * y; }                                 // mul left
        case 205u: { return g * x; }                                 // mul right
        case 206u: { return g / y; }                                 // div left
        case 207u: { return -g * x / (y * y); }                      // div right
        case 208u: { return select(zero, g, x >= y); }               // maximum left
        case 209u: { return select(zero, g, y > x); }                // maximum right
        case 210u: { return select(zero, g, x <= y); }               // minimum left
        case 211u: { return select(zero, g, y < x); }                // minimum right
        case 212u: { return g * y * pow(x, y - V(1.0)); }            // pow left
        case 213u: { return g * log(x) * pow(x, y); }                // pow right
        case 300u: { return select(zero, g, x == y); }               // max/min reduction: g where x is the extremum y
        case 301u: { return y * (g - x); }                           // softmax: y (g - sum(g y)), x = the sum
        case 302u: { return g - exp(y) * x; }                        // log_softmax: g - exp(y) sum(g), x = the sum
        default: { return g; }
    }
}

@compute @workgroup_size(WG)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    let o = operand_offsets(i);
    store(o.w, unary_op(V(a[o.x])));
}

@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    let o = operand_offsets(i);
    store(o.w, binary_op(V(a[o.x]), V(b[o.y])));
}

@compute @workgroup_size(WG)
fn ternary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    let o = operand_offsets(i);
    store(o.w, ternary_op(V(a[o.x]), V(b[o.y]), V(c[o.z])));
}

@compute @workgroup_size(WG)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i >= p.numel) { return; }
    let o = operand_offsets(i);
    out[o.w] = VO(V(p.scalar));
}
