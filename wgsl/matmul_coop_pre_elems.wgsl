// `pre` snippet of matmul_coop.wgsl: `pre` bound as its elements (PB = PE, f32, or f16 for
// GELU's pre-activation under autocast).

fn pre_get(i: u32) -> f32 {
    return f32(pre[i]);
}

fn pre_put(i: u32, v: f32) {
    pre[i] = PE(v);
}

// Elements i .. i + 3: one by one (as `pre_put4` stores them).
fn pre_get4(i: u32) -> vec4<f32> {
    return vec4<f32>(pre_get(i), pre_get(i + 1u), pre_get(i + 2u), pre_get(i + 3u));
}

fn pre_put4(i: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        pre_put(i + j, v[j]);
    }
}
