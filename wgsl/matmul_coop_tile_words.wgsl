// Tile snippet of matmul_coop.wgsl: tiles of vec4<f16>, two 8-byte stores per unit (which
// NVIDIA's compiler joins: storing the high half first in every other group of 8 lanes, so
// that each 16 lanes' 8-byte stores reach 16 bank pairs, was slower); the cooperative loads read
// vector elements (Vulkan's loads take vector pointers, strides counted in those vectors).
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
