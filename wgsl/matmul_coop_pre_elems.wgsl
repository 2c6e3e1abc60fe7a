// `pre` snippet of matmul_coop.wgsl: `pre` bound as f32 elements (PB = f32).

fn pre_get(i: u32) -> f32 {
    return pre[i];
}

fn pre_put(i: u32, v: f32) {
    pre[i] = v;
}

// Elements i .. i + 3: one by one (as `pre_put4` stores them).
fn pre_get4(i: u32) -> vec4<f32> {
    return vec4<f32>(pre[i], pre[i + 1u], pre[i + 2u], pre[i + 3u]);
}

fn pre_put4(i: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        pre[i + j] = v[j];
    }
}
