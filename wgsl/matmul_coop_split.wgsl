// Appended to matmul_coop.wgsl and matmul_split_tail.wgsl (not in the X3 kernels' source, whose
// `scales` take the partials' binding).

// Whether this workgroup took its tile's last ticket (matmul_split_tail.wgsl), handed from
// lane 0 through the scratch tile's first element (free once the partials are stored). Not a
// workgroup variable of its own: beside the tiles, one gave wrong products (every product of
// this entry point on NVIDIA's driver, 2026-11-26; PROFILING.md).
fn split_verdict(last: bool) {
    c_sh[0] = select(0.0, 1.0, last);
}

fn split_is_last() -> bool {
    return workgroupUniformLoad(&c_sh[0]) != 0.0;
}

// One range of K of a split product (k_split > 0, z: the range; p.batch: the ranges), the sum
// in the same dispatch: the accumulators go through the scratch tile to the range's partial,
// element (r, c) of the tile at r * BN + c, then `split_finish` (the tile's last range sums
// the partials and stores C through SPLIT_EPI).
@compute @workgroup_size(WG)
fn matmul_coop_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                     @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let wid = tile_of(wg);
    scales_init(lane);
    zero_acc();
    product(wid, lid, sg);
    let base = part_base(wid);
    for (var f = 0u; f < EPI_FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        let l = epi_lane(wid, sg, f, lane);
        let first = base + (l.gm - wid.y * BM) * BN + l.gn - wid.x * BN;
        for (var q = 0u; q < EPI_STEPS; q++) {
            put_part(first + q * EPI_ROWS * BN, epi_sh(l, sg, lane, q));
        }
        workgroupBarrier();
    }
    split_finish(wid, lid);
}
