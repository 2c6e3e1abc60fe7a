// Tile snippet of matmul_coop.wgsl: tiles of f16, eight stores per unit (MSL's simdgroup
// loads take a pointer to the matrix's own element type).
alias SHT = f16;
const SHW: u32 = 1u; // halves per tile element

fn put_a(h: u32, u: Unit) {
    for (var j = 0u; j < 4u; j++) {
        a_sh[h + j] = u.lo[j];
        a_sh[h + 4u + j] = u.hi[j];
    }
}

fn put_b(h: u32, u: Unit) {
    for (var j = 0u; j < 4u; j++) {
        b_sh[h + j] = u.lo[j];
        b_sh[h + 4u + j] = u.hi[j];
    }
}
