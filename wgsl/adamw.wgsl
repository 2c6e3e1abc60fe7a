// AdamW over one flat chunk of parameters (every parameter of the chunk in one dispatch).
//
// For element i of the chunk (p, g, m, v all (numel) f32, the same offsets):
//   g' = g * clip, clip = min(1, max_norm / (sqrt(norm_sq[0]) + 1e-6)) when max_norm > 0
//        (norm_sq: the global squared gradient norm, reduced on the GPU: no host round-trip)
//   m = beta1 m + (1 - beta1) g';  v = beta2 v + (1 - beta2) g'^2
//   p = p (1 - lr wd) - lr (m / bc1) / (sqrt(v / bc2) + eps)
// with wd = weight_decay for i < n_decay (decayed parameters are laid out first) and 0 after
// (biases, LayerNorm weights), bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (PyTorch's AdamW).
//
// adamw_amp, the mixed-precision step: gradients arrive multiplied by the loss scale
// (scaler[0]); an inf or NaN anywhere makes norm_sq non-finite (overflow found inside the
// norm's reduction), and then no element is updated (the step is skipped; loss_scale.wgsl then
// halves the scale). Otherwise g is divided by the scale before clipping and the moments, the
// bias corrections use the count of applied steps (scaler[2] + 1, on the GPU: skipped steps do
// not count), and the decayed prefix's f16 copy (the matmul operand) is rewritten from the new
// value: the cast folded into the update.
// Workgroup mapping: 256 threads, 4 consecutive elements each (one vec4 of every buffer: a
// lane issues 4 loads, not 16); linear workgroup = wid.y * nwg.x + wid.x. numel and n_decay
// are multiples of 4 (parameter offsets are: `nn::params`), so a vec4 is wholly decayed or not.
// Specialization: TH, the copy's element type (f16 for adamw_amp; f32 otherwise, unused).

struct Params {
    numel: u32,
    n_decay: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bc1: f32,
    bc2: f32,
    max_norm: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> param: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> m: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> v: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> grad: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> norm_sq: array<f32>;
@group(0) @binding(6) var<storage, read> scaler: array<f32>;        // adamw_amp: scale, ...
@group(0) @binding(7) var<storage, read_write> half_copy: array<vec4<TH>>; // adamw_amp: (n_decay)

const WG: u32 = 256u;

// Updates elements 4i..4i+3's moments with gradient g (unscaled, clipped) and returns their
// new values (not yet stored).
fn update(i: u32, g: vec4<f32>, bc1: f32, bc2: f32) -> vec4<f32> {
    let m1 = p.beta1 * m[i] + (1.0 - p.beta1) * g;
    let v1 = p.beta2 * v[i] + (1.0 - p.beta2) * g * g;
    m[i] = m1;
    v[i] = v1;
    let wd = select(0.0, p.weight_decay, 4u * i < p.n_decay);
    let step = (m1 / bc1) / (sqrt(v1 / bc2) + p.eps);
    return param[i] * (1.0 - p.lr * wd) - p.lr * step;
}

@compute @workgroup_size(WG)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (4u * i >= p.numel) { return; }
    var clip = 1.0;
    if (p.max_norm > 0.0) {
        clip = min(1.0, p.max_norm / (sqrt(norm_sq[0]) + 1e-6));
    }
    param[i] = update(i, grad[i] * clip, p.bc1, p.bc2);
}

@compute @workgroup_size(WG)
fn adamw_amp(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    let nsq = norm_sq[0];
    // Not `<=` the largest f32: inf or NaN (NaN compares false).
    if (4u * i >= p.numel || !(nsq <= 3.4028235e38)) { return; }
    let inv_scale = 1.0 / scaler[0];
    var clip = 1.0;
    if (p.max_norm > 0.0) {
        clip = min(1.0, p.max_norm / (sqrt(nsq) * inv_scale + 1e-6));
    }
    let t = scaler[2] + 1.0;
    let bc1 = 1.0 - pow(p.beta1, t);
    let bc2 = 1.0 - pow(p.beta2, t);
    let x = update(i, grad[i] * inv_scale * clip, bc1, bc2);
    param[i] = x;
    if (4u * i < p.n_decay) {
        half_copy[i] = vec4<TH>(x);
    }
}
