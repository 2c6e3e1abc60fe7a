// C snippet of matmul_coop.wgsl: C bound as vectors of 4 (CB = vec4<TC>, C_VEC), where the
// launcher has checked that C's columns are unit-stride, its offset and row and batch strides
// multiples of 4, and its last element's vector inside the binding.

// Element o of C is v (with ACC: v added to it): one component of its vector.
fn store_c(o: u32, v: f32) {
    let i = o / 4u;
    let j = o % 4u;
    if (ACC) {
        c[i][j] = TC(f32(c[i][j]) + v);
    } else {
        c[i][j] = TC(v);
    }
}

// Elements o .. o + 3 of C (o a multiple of 4) are v: one vector store.
fn store_c4(o: u32, v: vec4<f32>) {
    let i = o / 4u;
    if (ACC) {
        c[i] = vec4<TC>(vec4<f32>(c[i]) + v);
    } else {
        c[i] = vec4<TC>(v);
    }
}
