
// Split-K in one dispatch (appended to matmul.wgsl and matmul_coop.wgsl, whose entry points
// matmul_split and matmul_coop_split end in `split_finish`). Each of a tile's S workgroups (z:
// its range of K; p.batch = S) stores its partial product into `part`, tile by tile: range s of tile t (t = y * tiles_x + x) is the
// BM x BN block at (s * tiles + t) * BM * BN, rows BN apart, so no cache line holds two tiles'
// partials. It then takes a ticket (tickets[t], 0 between products); the workgroup that takes
// the last one sums the tile's S partials in range order (as the second kernel of a split,
// matmul_split.wgsl, sums them) and stores C through the split's epilogue, SPLIT_EPI: 0 plain,
// 1 bias, 2 bias and the residual (through `pre` from res_off), 3 column sums (C's last row to
// `pre` at bias_off); then it sets the ticket back to 0.
// Ordering: a workgroup's partial stores, a device-scope barrier, then its ticket; the last
// workgroup's ticket, a device-scope barrier, then its loads. The partials are stored and
// loaded as atomics (f32 bits in u32): naga does not decorate storage buffers Coherent, so
// plain loads of another workgroup's stores are not ordered by the barriers in either of
// SPIR-V's memory models. Lane 0 hands the ticket's verdict to its workgroup through
// `split_verdict` and `split_is_last`, which the kernel defines: a workgroup variable of its
// own in the tiled kernel; in the cooperative-matrix kernel, the scratch tile's first element
// (a workgroup variable beside its tiles gave wrong products on NVIDIA's driver, PROFILING.md).

@group(0) @binding(6) var<storage, read_write> part: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> tickets: array<atomic<u32>>;

// Elements of a tile a lane sums at once (`SPLIT_CHUNK` in the launcher, ops/matmul.rs).
const SPLIT_CHUNK: u32 = 8u;

fn split_tiles_x() -> u32 {
    return (p.n + BN - 1u) / BN;
}

// This workgroup's tile among the product's.
fn split_tile(wid: vec3<u32>) -> u32 {
    return wid.y * split_tiles_x() + wid.x;
}

// BM * BN times the tiles of the product: how far apart two ranges' partials of a tile are.
fn split_range_stride() -> u32 {
    return split_tiles_x() * ((p.m + BM - 1u) / BM) * BM * BN;
}

// Where this workgroup's partial (its tile, its range of K) starts in `part`.
fn part_base(wid: vec3<u32>) -> u32 {
    return wid.z * split_range_stride() + split_tile(wid) * BM * BN;
}

// Element i of `part`, stored (`put_part`) and loaded as atomics.
fn put_part(i: u32, v: f32) {
    atomicStore(&part[i], bitcast<u32>(v));
}

fn part_at(i: u32) -> f32 {
    return bitcast<f32>(atomicLoad(&part[i]));
}

// The bias and the residual the epilogue adds to element e of the tile (SPLIT_EPI 1: the
// bias; 2: both; else none), read at indices clamped into C and behind no branch, so that the
// loads are in flight with the partials'. (Loaded behind `split_out`'s bounds checks they
// waited one after another: the residual products' dispatch took 54.4 us against the plain
// ones' 40.4 at 4 x 128 --amp on an H100, 43.6 with this; 2026-11-26.)
fn split_addend(wid: vec3<u32>, e: u32) -> vec2<f32> {
    if (SPLIT_EPI != 1u && SPLIT_EPI != 2u) {
        return vec2<f32>(0.0);
    }
    let t = min(e, BM * BN - 1u);
    let gm = min(wid.y * BM + t / BN, p.m - 1u);
    let gn = min(wid.x * BN + t % BN, p.n - 1u);
    let b = bias[p.bias_off + gn];
    if (SPLIT_EPI == 1u) {
        return vec2<f32>(b, 0.0);
    }
    return vec2<f32>(b, pre_get(p.res_off + gm * p.n + gn));
}

// Element (gm, gn) of C is v, the sum of the partials, through the split's epilogue (a: its
// `split_addend`, added in the second dispatch's order: the sum, the bias, the residual).
fn split_store(gm: u32, gn: u32, v: f32, a: vec2<f32>) {
    let o = p.c_off + gm * p.c_ms + gn * p.c_ns;
    if (SPLIT_EPI == 3u && gm == p.m - 1u) {
        let s = p.bias_off + gn;
        pre_put(s, select(v, pre_get(s) + v, ACC));
    } else if (SPLIT_EPI == 2u) {
        store_c(o, v + a.x + a.y);
    } else if (SPLIT_EPI == 1u) {
        store_c(o, v + a.x);
    } else {
        store_c(o, v);
    }
}

// Element e of this workgroup's tile (row-major) is v, where it lies inside C.
fn split_out(wid: vec3<u32>, e: u32, v: f32, a: vec2<f32>) {
    let gm = wid.y * BM + e / BN;
    let gn = wid.x * BN + e % BN;
    if (e < BM * BN && gm < p.m && gn < p.n) {
        split_store(gm, gn, v, a);
    }
}

// Called by every lane once the workgroup's partial is stored.
fn split_finish(wid: vec3<u32>, lid: u32) {
    storageBarrier();
    let t = split_tile(wid);
    if (lid == 0u) {
        let last = atomicAdd(&tickets[t], 1u) + 1u == p.batch;
        if (last) {
            atomicStore(&tickets[t], 0u);
        }
        split_verdict(last);
    }
    if (!split_is_last()) {
        return;
    }
    storageBarrier();
    let first = t * BM * BN;
    let stride = split_range_stride();
    // The tile in passes of 8 elements a lane (consecutive lanes, consecutive elements), in 8
    // sums of their own: each range's 8 loads of a pass are issued together, so a pass waits
    // about one load's latency a range. (Elements past the tile read its last one.)
    let end = BM * BN - 1u;
    for (var e = lid; e < BM * BN; e += WG * SPLIT_CHUNK) {
        let a0 = split_addend(wid, e);
        let a1 = split_addend(wid, e + WG);
        let a2 = split_addend(wid, e + 2u * WG);
        let a3 = split_addend(wid, e + 3u * WG);
        let a4 = split_addend(wid, e + 4u * WG);
        let a5 = split_addend(wid, e + 5u * WG);
        let a6 = split_addend(wid, e + 6u * WG);
        let a7 = split_addend(wid, e + 7u * WG);
        var s0 = 0.0;
        var s1 = 0.0;
        var s2 = 0.0;
        var s3 = 0.0;
        var s4 = 0.0;
        var s5 = 0.0;
        var s6 = 0.0;
        var s7 = 0.0;
        for (var s = 0u; s < p.batch; s++) {
            let o = first + s * stride;
            s0 += part_at(o + e);
            s1 += part_at(o + min(e + WG, end));
            s2 += part_at(o + min(e + 2u * WG, end));
            s3 += part_at(o + min(e + 3u * WG, end));
            s4 += part_at(o + min(e + 4u * WG, end));
            s5 += part_at(o + min(e + 5u * WG, end));
            s6 += part_at(o + min(e + 6u * WG, end));
            s7 += part_at(o + min(e + 7u * WG, end));
        }
        split_out(wid, e, s0, a0);
        split_out(wid, e + WG, s1, a1);
        split_out(wid, e + 2u * WG, s2, a2);
        split_out(wid, e + 3u * WG, s3, a3);
        split_out(wid, e + 4u * WG, s4, a4);
        split_out(wid, e + 5u * WG, s5, a5);
        split_out(wid, e + 6u * WG, s6, a6);
        split_out(wid, e + 7u * WG, s7, a7);
    }
}
