// Tile snippet of matmul_coop.wgsl: tiles of vec4<f16>, two 8-byte stores per unit (most likely
// joined into one 16-byte store by NVIDIA's compiler, whose code this driver does not show:
// storing the high half first in every other group of 8 lanes, so that each 16 lanes' 8-byte
// stores reach 16 bank pairs, was slower, 4096³ 189.7-190.2 against 194.1-194.2 TFLOP/s on an
// H100, 2026-11-26); the cooperative loads read vector elements (Vulkan's loads take vector
// pointers, strides counted in those vectors).
alias SHT = vec4<f16>;
const SHW: u32 = 4u; // halves per tile element

fn put_a(h: u32, u: Unit) {
    a_sh[h / SHW] = u.lo;
    a_sh[h / SHW + 1u] = u.hi;
}

fn put_b(h: u32, u: Unit) {
    b_sh[h / SHW] = u.lo;
    b_sh[h / SHW + 1u] = u.hi;
}
