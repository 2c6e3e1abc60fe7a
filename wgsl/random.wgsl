// Seeded random numbers, counter based: element i of a draw is a pure function of
// (seed, counter + i), so a draw is reproducible on any adapter and in any split.
//
// DIST 0: uniform in [lo, hi) with lo = p.a, hi = p.b.
// DIST 1: normal with mean p.a and std p.b (Box-Muller on two hashed uniforms).
// Workgroup mapping: 256 threads, one element each; linear workgroup = wid.y*nwg.x+wid.x.

struct Params {
    numel: u32,
    seed_lo: u32,
    seed_hi: u32,
    counter: u32,
    a: f32,
    b: f32,
    out_offset: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;

// PCG output permutation as a 32-bit hash (O'Neill; as in Jarzynski & Olano 2020).
fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// 24 random bits as a float in [0, 1).
fn unit(h: u32) -> f32 {
    return f32(h >> 8u) * (1.0 / 16777216.0);
}

@compute @workgroup_size(WG)
fn random(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.numel) { return; }
    let key = pcg(p.seed_lo ^ pcg(p.seed_hi));
    let h1 = pcg(key ^ pcg(p.counter + i));
    var v: f32;
    if (DIST == 0u) {
        v = p.a + (p.b - p.a) * unit(h1);
    } else {
        let h2 = pcg(h1 ^ 0x9e3779b9u);
        let u1 = 1.0 - unit(h1);          // (0, 1]: log stays finite
        let u2 = unit(h2);
        let r = sqrt(-2.0 * log(u1));
        v = p.a + p.b * r * cos(6.283185307179586 * u2);
    }
    out[p.out_offset + i] = v;
}
