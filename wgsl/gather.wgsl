// Gather along one axis (index_select): out[.., j, ..] = x[.., idx[j], ..].
//
// For each element i of the contiguous output (shape `shape`, rank dims), its coordinate along
// `dim` picks idx[idx_offset + coord * idx_stride]; every coordinate then meets the input
// `strides`. x holds the rows row_lo .. row_lo + src_len of the table the indices address (a
// row shard of it; row_lo is 0 for a whole table): an index outside them reads 0.
// Specialization: KEEP_OTHERS (an index outside x's rows leaves the output element as it is,
// for the other shards' dispatches to write).
// Workgroup mapping: 256 threads, one output element each; linear workgroup = wid.y*nwg.x+wid.x.

struct Params {
    numel: u32,
    rank: u32,
    dim: u32,
    src_len: u32,
    in_offset: u32,
    idx_offset: u32,
    idx_stride: u32,
    row_lo: u32,
    shape: array<vec4<u32>, 2>,   // (rank) output shape
    strides: array<vec4<u32>, 2>, // (rank) input strides
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> idx: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(WG)
fn index_select(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.numel) { return; }
    var rem = i;
    var off = p.in_offset;
    var valid = true;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        var coord = rem % n;
        rem = rem / n;
        if (u32(d) == p.dim) {
            let row = idx[p.idx_offset + coord * p.idx_stride];
            valid = row >= p.row_lo && row - p.row_lo < p.src_len;
            coord = select(0u, row - p.row_lo, valid);
        }
        off += coord * p.strides[q][r];
    }
    if (KEEP_OTHERS && !valid) { return; }
    out[i] = select(0.0, x[off], valid);
}

