// Arithmetic ceiling of cooperative-matrix code: every subgroup runs `iters` steps of 4
// independent FS x FS x FS multiply-adds (f16 operands loaded once, f32 accumulators; 4 * 2 * FS^3
// FLOP a step) and stores its accumulators, so nothing is optimized away. Its rate is what a
// tensor-core kernel can reach through wgpu on this adapter.
// Grid: 1-D, SG subgroups of SGS lanes a workgroup; `src` holds one f16 fragment (FS x FS),
// `out` 4 f32 fragments per subgroup. Specialization: FS, SGS, SG, MA, MB, MC.

enable wgpu_cooperative_matrix;

struct Params {
    iters: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f16>;

@compute @workgroup_size(SG * SGS)
fn peak_coop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32) {
    let s = FS;
    let a = coopLoadT<MA>(&src[0], s);
    let b = coopLoadT<MB>(&src[0], s);
    var c0 = MC();
    var c1 = MC();
    var c2 = MC();
    var c3 = MC();
    for (var i = 0u; i < p.iters; i++) {
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2);
        c3 = coopMultiplyAdd(a, b, c3);
    }
    let base = (wid.x * SG + sg) * 4u * FS * FS;
    let o0 = base;
    let o1 = base + FS * FS;
    let o2 = base + 2u * FS * FS;
    let o3 = base + 3u * FS * FS;
    coopStoreT(c0, &out[o0], s);
    coopStoreT(c1, &out[o1], s);
    coopStoreT(c2, &out[o2], s);
    coopStoreT(c3, &out[o3], s);
}

// The same multiply-adds with the fragments loaded from workgroup memory every step, two loads
// per four multiply-adds (the ratio of a 4 x 4-fragment subgroup tile of matmul_coop): the rate
// of tensor-core code bound by its fragment loads rather than its multiply-adds.
const TILE_ROWS: u32 = 4u * FS;
var<workgroup> frags: array<f16, TILE_ROWS * (FS + 8u)>;

@compute @workgroup_size(SG * SGS)
fn peak_coop_shared(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32,
                    @builtin(local_invocation_index) lid: u32) {
    for (var e = lid; e < TILE_ROWS * (FS + 8u); e += SG * SGS) {
        frags[e] = src[e % (FS * FS)];
    }
    workgroupBarrier();
    let s = FS + 8u;
    var c0 = MC();
    var c1 = MC();
    var c2 = MC();
    var c3 = MC();
    for (var i = 0u; i < p.iters; i++) {
        let ia = (i % 4u) * FS * s;
        let ib = ((i + 1u) % 4u) * FS * s;
        let a = coopLoadT<MA>(&frags[ia], s);
        let b = coopLoadT<MB>(&frags[ib], s);
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2);
        c3 = coopMultiplyAdd(a, b, c3);
    }
    let base = (wid.x * SG + sg) * 4u * FS * FS;
    let o0 = base;
    let o1 = base + FS * FS;
    let o2 = base + 2u * FS * FS;
    let o3 = base + 3u * FS * FS;
    let t = FS;
    coopStoreT(c0, &out[o0], t);
    coopStoreT(c1, &out[o1], t);
    coopStoreT(c2, &out[o2], t);
    coopStoreT(c3, &out[o3], t);
}
