// C snippet of matmul_coop.wgsl: C bound as its elements (CB = TC).

// Element o of C is v (with ACC: v added to it).
fn store_c(o: u32, v: f32) {
    if (ACC) {
        c[o] = TC(f32(c[o]) + v);
    } else {
        c[o] = TC(v);
    }
}

// Elements o .. o + 3 of C are v: one by one (the vector epilogue runs only with the vectors'
// snippet, C_VEC; this one makes it type-check).
fn store_c4(o: u32, v: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        store_c(o + i, v[i]);
    }
}
