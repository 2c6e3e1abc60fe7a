// `pre` snippet of matmul_coop.wgsl: `pre` bound as vectors of 4 (PB = vec4<PE>, PE f32, or
// f16 for GELU's pre-activation under autocast), where the launcher has checked that the
// epilogue's vector accesses (i a multiple of 4) and the elements around them lie inside the
// binding.

fn pre_get(i: u32) -> f32 {
    return f32(pre[i / 4u][i % 4u]);
}

fn pre_put(i: u32, v: f32) {
    pre[i / 4u][i % 4u] = PE(v);
}

// Elements i .. i + 3 (i a multiple of 4): one vector.
fn pre_get4(i: u32) -> vec4<f32> {
    return vec4<f32>(pre[i / 4u]);
}

fn pre_put4(i: u32, v: vec4<f32>) {
    pre[i / 4u] = PB(v);
}
