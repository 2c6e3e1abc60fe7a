// Measurement probe (`lab`): a square f16 x f16 -> f32 matmul C = A @ B (n x n, row-major,
// n a multiple of the workgroup tile) on cooperative matrices whose fragments are loaded
// straight from the storage buffers, no workgroup memory and no barriers: each subgroup owns
// FM x FN accumulators and loads its own FM + FN fragments a step of 16 along K (with PF, the
// next step's while this one multiplies). What the subgroups of a workgroup share comes from
// the L1 cache. The entry point is generated per tile (`kernels::probe_direct`).
// Specialization: FS, SGS, SG_M, SG_N, FM, FN, W (halves an entry of a and b: 1 or 4), GROUP_M;
// types MA, MB, MC, ET (f16 or vec4<f16>); snippet BODY (the entry point).

enable wgpu_cooperative_matrix;

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<ET>;
@group(0) @binding(3) var<storage, read> b: array<ET>;

const WG: u32 = SG_M * SG_N * SGS;
const BM: u32 = SG_M * FM * FS;
const BN: u32 = SG_N * FN * FS;

// The workgroup's tile of C (row, column of tiles), GROUP_M rows of tiles at a time so the
// workgroups running together share A's rows and B's columns in L2.
fn tile_of(lin: u32, tiles_m: u32, tiles_n: u32) -> vec2<u32> {
    let per_group = GROUP_M * tiles_n;
    let first_m = (lin / per_group) * GROUP_M;
    let rows = min(tiles_m - first_m, GROUP_M);
    let r = lin % per_group;
    return vec2<u32>(first_m + r % rows, r / rows);
}
