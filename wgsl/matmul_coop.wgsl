// Mixed-precision batched matmul on cooperative matrices (tensor cores): C[b] (+)= A[b] @ B[b]
// with the operands rounded to f16 and the products accumulated in f32. Same Params and
// epilogues as matmul.wgsl (whose TS = f16 variant computes the same thing without cooperative
// matrices), so the launcher picks either kernel for a product. Entry points: matmul_coop,
// matmul_coop_bias, matmul_coop_bias_gelu, matmul_coop_bias_res, matmul_coop_sums,
// matmul_coop_split (a range of K of a split product, summed in the same dispatch:
// matmul_coop_split.wgsl and matmul_split_tail.wgsl, appended to all but the X3 kernels).
//
// Memory layout. A (batch, M, K), B (batch, K, N), C (batch, M, N), each read or written
// through its strides (a_ms/a_ks, b_ks/b_ns, c_ms/c_ns; a batch stride of 0 broadcasts). A and
// B are bound as arrays of 4-element vectors (AV, AV_B: vec4<f32>, or f16 as vec2<u32>, u32
// words of two halves each, unpacked as they are loaded: faster than f16 vectors on NVIDIA's
// driver; the READ snippet) and read in *units*: 8 consecutive elements along one dim of the
// operand, its unit dim (A_UK: k, else m; B_UN: n, else k), rounded to f16. With A_VEC (B_VEC)
// the launcher has checked that the unit dim is unit-stride and every unit starts on a vector,
// so a unit is two vector loads; otherwise it is gathered element by element. With A_WIDE
// (B_WIDE: f16 units on 16 bytes) the operand is bound as vec4<u32> (8 halves an entry) and a
// unit is one 16-byte load. Units past M, N or K read as zero (a partial unit is masked), so
// any size works.
// A tile inside C (`inside_c`) reads the steps of K that lie whole in its range without bounds
// or masks (the generated `product`'s first loop; 4096³ 172 -> 195 TFLOP/s on an H100).
//
// Workgroup mapping. The workgroup tile BM x BN = (SG_M * FM * FS) x (SG_N * FN * FS): SG_M x
// SG_N subgroups of SGS lanes, each owning FM x FN accumulators of FS x FS (16 on NVIDIA's
// Vulkan driver, 8 on Apple): MA, MB, MC alias the f16 A, f16 B and f32 accumulator matrix
// types. K advances BK at a time. With STAGES 1 each lane loads its UA + UB units of a step,
// stores them into the tiles, and after a barrier the subgroups multiply the step out of
// workgroup memory (X3 instead fetches the next step's units into registers while this one
// multiplies: the launcher's `prefetches`); with STAGES 2 the next step's units go into a
// second set of tiles while this one multiplies (one barrier a step). The tiles are stored along
// the unit dim (A as [m][k] or [k][m], B as [k][n] or [n][k]) in SHT elements of SHW halves
// each (the tile snippet: vec4<f16> where cooperative loads take vectors, else f16), rows
// padded by 8 halves so the rows a fragment load touches fall in different banks (and with
// SPREAD the units of tiles with rows of 4 or 2 units go to rows out of order so the stores do
// too: `unit_rc`); fragments are loaded row-major (coopLoadT) or column-major (coopLoad) to match.
// The epilogue goes through an FS x FS f32 scratch tile per subgroup: the subgroup stores one
// accumulator there, then its lanes add the bias, apply GELU or accumulate, and write C (f32 or
// f16) through its strides with bounds checks: an element a lane, or with C_VEC (C's columns
// unit-stride, its rows on vectors of 4: the launcher checks) 4 consecutive columns a lane,
// stored as one vector.
// X3 (f32 operands on the tensor cores): each f32 element x, scaled by its operand's power of
// two s (the largest finite |x| of the operand to just under 2^14: `scales_init`, from the
// partial maxima the absmax kernel wrote to the `scales` binding at p.scale_off), is stored as
// its high part h (s x rounded to 11 significant bits by masking bits, which f16 holds
// exactly) and its low part l = f16(s x - h), into a second copy of each tile (PARTS 2); each
// fragment of K multiplies A_l B_h + A_h B_l + A_h B_h from zero on the tensor cores (the
// dropped A_l B_l is 2^-22 of a term) and the accumulator adds that in f32; the epilogue reads
// the accumulators times 1 / (s_A s_B) (two factors, each inside f32's range). A's ones row
// is not scaled, so the sums row is read times 1 / s_B.
// Grid: x over N tiles, y over M tiles, z over the batch (or over ranges of K: `k_range`); a
// workgroup's tile of C is `tile_of` its workgroup id (GROUP_M rows of tiles at a time).
// A_ONES: A's last row is not read but taken as ones (the launcher checks M - 1 is a multiple
// of 8), so C's last row is the column sums of B; matmul_coop_sums stores it to `pre` at
// bias_off (a linear's bias gradient beside dW = x^T dz; split, the partials keep it).
// Specialization: snippet READ; FS, SGS, SG_M, SG_N, FM, FN, BK, STAGES, PARTS, A_UK, B_UN,
// A_VEC, B_VEC, A_WIDE, B_WIDE, C_VEC, ACC, A_ONES, SPLIT_EPI, SPREAD, EPI_FRAGS;
// types
// MA, MB, MC (fragments), AV, AV_B (operand vectors), TC (C's elements), CB (its binding's), PB
// (`pre`'s binding's), PE (`pre`'s elements: f32, or f16 for GELU's pre-activation under
// autocast); snippets TILE, C, PRE and UNROLLED.
//
// Indices and strides handed to coopLoad/coopStore are bound to `let`s first (naga's SPIR-V
// backend needs named expressions there).

enable wgpu_cooperative_matrix;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    a_off: u32,
    a_bs: u32,
    a_ms: u32,
    a_ks: u32,
    b_off: u32,
    b_bs: u32,
    b_ks: u32,
    b_ns: u32,
    c_off: u32,
    c_bs: u32,
    c_ms: u32,
    c_ns: u32,
    bias_off: u32,
    k_split: u32,
    res_off: u32,
    scale_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> c: array<CB>;     // C (CB = TC, or with C_VEC vec4<TC>)
@group(0) @binding(2) var<storage, read> a: array<AV>;         // A's elements, 4 or 8 an entry
@group(0) @binding(3) var<storage, read> b: array<AV_B>;       // B's elements (READ snippet)
@group(0) @binding(4) var<storage, read> bias: array<f32>;     // (N), matmul_coop_bias*
@group(0) @binding(5) var<storage, read_write> pre: array<PB>;  // GELU's z, the residual, the
                                                                // sums row; PB: the PRE snippet

const WG: u32 = SG_M * SG_N * SGS;
const BM: u32 = SG_M * FM * FS;
const BN: u32 = SG_N * FN * FS;

// Units per tile row, and tile rows padded by one unit (8 halves), in halves.
const A_UNITS: u32 = select(BM, BK, A_UK) / 8u;
// The A tile is [m][k] when its units run along k, else [k][m].
const A_MK: bool = A_UK;
const B_UNITS: u32 = select(BK, BN, B_UN) / 8u;
const AS: u32 = (select(BM, BK, A_MK) / 8u + 1u) * 8u;
const BS: u32 = (B_UNITS + 1u) * 8u;
// Units each lane fetches per step of K.
const UA: u32 = BM * BK / 8u / WG;
const UB: u32 = BK * BN / 8u / WG;

// Halves of one stage of each tile; STAGES (1 or 2) stages: with 2 the next step's units are
// stored into the other stage while this one multiplies, one barrier a step.
const A_TILE: u32 = select(BK, BM, A_MK) * AS;
const B_TILE: u32 = select(BN, BK, B_UN) * BS;
// With X3 (PARTS 2) the low parts' stages follow the high parts': stage STAGES + s.
var<workgroup> a_sh: array<SHT, PARTS * STAGES * A_TILE / SHW>;
var<workgroup> b_sh: array<SHT, PARTS * STAGES * B_TILE / SHW>;

// X3: the operands' scales, 1 / (s_A s_B) as two factors (`unscale`), and 1 / s_B
// (`scales_init`, generated); 1 otherwise.
var<private> sc_a: f32 = 1.0;
var<private> sc_b: f32 = 1.0;
var<private> unscale: vec2<f32> = vec2<f32>(1.0);
var<private> inv_b: f32 = 1.0;

// The K range of this workgroup: all of K; or, split (k_split > 0, batch 1: z numbers the
// ranges, and C holds one partial product per range, c_bs apart),
// [z * k_split, min(K, (z + 1) * k_split)).
var<private> k_lo: u32;
var<private> k_hi: u32;

fn k_range(wid: vec3<u32>) {
    k_lo = 0u;
    k_hi = p.k;
    if (p.k_split > 0u) {
        k_lo = wid.z * p.k_split;
        // A range starting past K is empty (the launcher dispatches none such).
        k_hi = max(k_lo, min(p.k, k_lo + p.k_split));
    }
}

const FE: u32 = FS * FS; // elements of a fragment
const FRAGS: u32 = FM * FN;
var<workgroup> c_sh: array<f32, SG_M * SG_N * FE>;

// A unit as stored into a tile: 8 elements rounded to f16.
struct Unit {
    lo: vec4<f16>,
    hi: vec4<f16>,
}

// How a lane reads its units comes with the READ snippet, written for each operand's binding
// type: `UnitA` / `UnitB` (8 elements as loaded, rounded to f16, and how many are valid),
// `unit_a(i, st, nv)` / `unit_b` (the loads: one 16-byte load for a wide operand, two vector
// loads with A_VEC / B_VEC, else 8 gathered elements; no branches: a lane with nv = 0 reads
// the binding's first element) and `half_a(u)` / `half_b` (zero past nv). The masking waits
// for the loads, so it runs when the unit is stored, after the multiply: loads behind per-lane
// branches, or used at once, are not overlapped with it (4096^3 on an H200: 77 TFLOP/s with
// branches, 137 with selects at the load, 155 with the masking at the store).

// Rows of tiles a group of the grid takes (`tile_of`): 8 (4096³ on an H100 198.6 -> 200.5
// TFLOP/s against the grid's own order, 2026-11-26; docs/decisions.md).
const GROUP_M: u32 = 8u;

// The tile of C (x: column of tiles, y: row of tiles, z: batch or range of K) that workgroup g
// of the grid (N tiles, M tiles, z) computes: the grid taken GROUP_M rows of tiles at a time,
// down each column of such a group before the next column, so that the workgroups that run at
// one time read fewer rows of A and columns of B (more of them found in L2).
fn tile_of(g: vec3<u32>) -> vec3<u32> {
    let nx = (p.n + BN - 1u) / BN;
    let ny = (p.m + BM - 1u) / BM;
    let per = GROUP_M * nx;
    let lin = g.y * nx + g.x;
    let first = lin / per * GROUP_M;
    let rows = min(GROUP_M, ny - first);
    let r = lin % per;
    return vec3<u32>(r / rows, first + r % rows, g.z);
}

// Tile row and unit column of unit t of a tile of `units` units a row: t / units and t % units,
// or with SPREAD, in tiles of 4 or 2 units a row, rows taken out of order so that the 8 lanes
// that store a vector of 16 bytes together reach 8 different 16-byte bank groups. A row of 4
// units padded by one spans 5 of the 8 groups, so rows r and r + 1 share one and rows r and
// r + 4 none: 8 consecutive units lie in rows r and r + 4. A row of 2 units padded by one spans
// 3, so rows r, r + 2, r + 4 and r + 6 cover the 8 groups once. (4096³ on an H100, 2026-11-26:
// 194.2 -> 198.6 TFLOP/s.) Rows of 8 or 16 units reach 8 groups in order; rows of 12 (the
// 96-wide tiles' B read along N) reach 7 in every third group of 8 lanes (not measured).
fn unit_rc(t: u32, units: u32) -> vec2<u32> {
    if (SPREAD && units == 4u) {
        let i = t % 32u;
        return vec2<u32>(t / 32u * 8u + i % 8u / 4u * 4u + i / 8u, i % 4u);
    }
    if (SPREAD && units == 2u) {
        let i = t % 16u;
        return vec2<u32>(t / 16u * 8u + i % 8u / 2u * 2u + i / 8u, i % 2u);
    }
    return vec2<u32>(t / units, t % units);
}

// Where unit j of this lane's share of the A tile at k0 starts, (m, k): unit t = lid + j * WG
// of the tile is in tile row `unit_rc(t, A_UNITS).x` (m, or k when the units run along m), unit
// column `.y`.
fn pos_a(wid: vec3<u32>, lid: u32, k0: u32, j: u32) -> vec2<u32> {
    let rc = unit_rc(lid + j * WG, A_UNITS);
    let row = rc.x;
    let col = rc.y * 8u;
    if (A_UK) {
        return vec2<u32>(wid.y * BM + row, k0 + col);
    }
    return vec2<u32>(wid.y * BM + col, k0 + row);
}

// Where unit j of this lane's share of the B tile at k0 starts, (k, n).
fn pos_b(wid: vec3<u32>, lid: u32, k0: u32, j: u32) -> vec2<u32> {
    let rc = unit_rc(lid + j * WG, B_UNITS);
    let row = rc.x;
    let col = rc.y * 8u;
    if (B_UN) {
        return vec2<u32>(k0 + row, wid.x * BN + col);
    }
    return vec2<u32>(k0 + col, wid.x * BN + row);
}

// Unit j of this lane's share of the A tile at k0. Units past M or the K range have nv = 0.
fn fetch_a(wid: vec3<u32>, lid: u32, k0: u32, j: u32) -> UnitA {
    let at = pos_a(wid, lid, k0, j);
    let gm = at.x;
    let gk = at.y;
    let ok = gm < p.m && gk < k_hi;
    let i = p.a_off + wid.z * p.a_bs + gm * p.a_ms + gk * p.a_ks;
    let left = select(p.m - gm, k_hi - gk, A_UK);
    let nv = select(0u, min(8u, left), ok);
    if (A_ONES) {
        // The unit of A's last row (along k), or starting on it (along m: M - 1 is a multiple
        // of 8, so the unit's first element): nothing loaded, ones at the store (nv + 16).
        let ones = gm == p.m - 1u && ok;
        var u = unit_a(i, select(p.a_ms, p.a_ks, A_UK), select(nv, 0u, ones));
        u.nv = select(u.nv, nv + 16u, ones);
        return u;
    }
    return unit_a(i, select(p.a_ms, p.a_ks, A_UK), nv);
}

fn fetch_b(wid: vec3<u32>, lid: u32, k0: u32, j: u32) -> UnitB {
    let at = pos_b(wid, lid, k0, j);
    let gk = at.x;
    let gn = at.y;
    let ok = gk < k_hi && gn < p.n;
    let i = p.b_off + wid.z * p.b_bs + gk * p.b_ks + gn * p.b_ns;
    let left = select(k_hi - gk, p.n - gn, B_UN);
    let nv = select(0u, min(8u, left), ok);
    return unit_b(i, select(p.b_ks, p.b_ns, B_UN), nv);
}

// A tile inside C (`inside_c`) reads the steps of K that lie whole in its range without
// bounds or masks, in a loop of its own (the generated `product`): each unit's offset in A and
// B at k_lo is found once (`base_a`, `base_b`), then moved BK rows of K a step (`fetch_whole`).
fn inside_c(wid: vec3<u32>) -> bool {
    return (wid.y + 1u) * BM <= p.m && (wid.x + 1u) * BN <= p.n;
}

fn base_a(wid: vec3<u32>, lid: u32, j: u32) -> u32 {
    let at = pos_a(wid, lid, k_lo, j);
    return p.a_off + wid.z * p.a_bs + at.x * p.a_ms + at.y * p.a_ks;
}

fn base_b(wid: vec3<u32>, lid: u32, j: u32) -> u32 {
    let at = pos_b(wid, lid, k_lo, j);
    return p.b_off + wid.z * p.b_bs + at.x * p.b_ks + at.y * p.b_ns;
}

// Unit t of a tile in stage `stage` goes to halves row * AS (BS) + column * 8 of that stage (row
// and column from `unit_rc`; put_a / put_b come with the tile snippet).
fn at_a(t: u32, stage: u32) -> u32 {
    let rc = unit_rc(t, A_UNITS);
    return stage * A_TILE + rc.x * AS + rc.y * 8u;
}

fn at_b(t: u32, stage: u32) -> u32 {
    let rc = unit_rc(t, B_UNITS);
    return stage * B_TILE + rc.x * BS + rc.y * 8u;
}

fn store_a(lid: u32, j: u32, u: UnitA, stage: u32) {
    let t = lid + j * WG;
    put_a(at_a(t, stage), half_a(u));
}

fn store_b(lid: u32, j: u32, u: UnitB, stage: u32) {
    let t = lid + j * WG;
    put_b(at_b(t, stage), half_b(u));
}

// The A fragment of tile rows m0.. and columns k0.. (in halves), and the B fragment of rows
// k0.., columns n0...
fn frag_a(m0: u32, k0: u32, stage: u32) -> MA {
    if (A_MK) {
        let i = (stage * A_TILE + m0 * AS + k0) / SHW;
        let s = AS / SHW;
        return coopLoadT<MA>(&a_sh[i], s);
    }
    let i = (stage * A_TILE + k0 * AS + m0) / SHW;
    let s = AS / SHW;
    return coopLoad<MA>(&a_sh[i], s);
}

fn frag_b(k0: u32, n0: u32, stage: u32) -> MB {
    if (B_UN) {
        let i = (stage * B_TILE + k0 * BS + n0) / SHW;
        let s = BS / SHW;
        return coopLoadT<MB>(&b_sh[i], s);
    }
    let i = (stage * B_TILE + n0 * BS + k0) / SHW;
    let s = BS / SHW;
    return coopLoad<MB>(&b_sh[i], s);
}

// `zero_acc()`, `product(wid, lid, sg)` (adds the workgroup's tile of A @ B into the
// subgroup's accumulators) and `spill(f, sg)` (accumulator f into the subgroup's FS x FS f32
// scratch tile, row-major) come with the generated snippet (kernels/matmul_coop/codegen.rs):
// the accumulators and the units in flight are separate variables there and the loops over
// them unrolled, so they stay in registers.

// Row and column in C of element e (< FE) of accumulator f of subgroup sg.
fn frag_row(wid: vec3<u32>, sg: u32, f: u32, e: u32) -> u32 {
    return wid.y * BM + ((sg / SG_N) * FM + f / FN) * FS + e / FS;
}

fn frag_col(wid: vec3<u32>, sg: u32, f: u32, e: u32) -> u32 {
    return wid.x * BN + ((sg % SG_N) * FN + f % FN) * FS + e % FS;
}

// `store_c(o, v)` (element o of C) and `store_c4(o, v)` (elements o .. o + 3) come with the
// C snippet: C bound as its elements, or with C_VEC as vectors of 4.


// The scratch-tile epilogue: a spilled fragment is stored lane by lane, lane l taking elements
// l, l + SGS, l + 2 SGS, ... of it: one column (the fragment's column l % FS) and every
// (SGS / FS)-th row from row l / FS. So a lane finds its column, its first row and offset
// (`epi_lane`) and its column's bias once a fragment, and its q-th element's row and offset
// from them (`epi_row`, `epi_c`), where each element had computed all of it (GELU's forward
// product 217 -> 204 us at 8 x 512 on an H200); each store instruction still writes SGS / FS
// whole fragment rows.
const EPI_ROWS: u32 = SGS / FS; // rows one pass of a subgroup's lanes covers
const EPI_STEPS: u32 = FE / SGS; // elements of a fragment a lane stores
const_assert SGS % FS == 0u && FE % SGS == 0u;

struct EpiLane {
    gm: u32, // the lane's first row in C
    gn: u32, // its column
    o: u32,  // C's offset of its first element
}

fn epi_lane(wid: vec3<u32>, sg: u32, f: u32, lane: u32) -> EpiLane {
    let gm = frag_row(wid, sg, f, lane);
    let gn = frag_col(wid, sg, f, lane);
    return EpiLane(gm, gn, p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn * p.c_ns);
}

// The row in C of the lane's q-th element.
fn epi_row(l: EpiLane, q: u32) -> u32 {
    return l.gm + q * EPI_ROWS;
}

// C's offset of the lane's q-th element.
fn epi_c(l: EpiLane, q: u32) -> u32 {
    return l.o + q * EPI_ROWS * p.c_ms;
}

// The lane's q-th element in subgroup sg's spilled fragment; X3: unscaled (A's ones row,
// not scaled, times 1 / s_B alone).
fn epi_sh(l: EpiLane, sg: u32, lane: u32, q: u32) -> f32 {
    let c = c_sh[sg * FE + lane + q * SGS];
    if (A_ONES && epi_row(l, q) == p.m - 1u) {
        return c * inv_b;
    }
    return c * unscale.x * unscale.y;
}

// The vector epilogue (C_VEC): lane l takes 4 consecutive columns of a spilled fragment,
// columns 4 (l % EPI4_LANES) .. + 3 of its rows l / EPI4_LANES + q EPI4_ROWS, reads them from
// the scratch tile together and stores them to C as one vector: a quarter of the element-wise
// epilogue's stores (each a whole 32-byte sector of an f16 row) and address arithmetic.
const EPI4_LANES: u32 = FS / 4u; // lanes a fragment row takes
const EPI4_ROWS: u32 = SGS / EPI4_LANES; // rows one pass of the subgroup covers
const EPI4_STEPS: u32 = FE / (4u * SGS); // passes over a fragment
const_assert !C_VEC || (FS % 4u == 0u && FE % (4u * SGS) == 0u);

fn epi4_lane(wid: vec3<u32>, sg: u32, f: u32, lane: u32) -> EpiLane {
    let e = lane / EPI4_LANES * FS + lane % EPI4_LANES * 4u;
    let gm = frag_row(wid, sg, f, e);
    let gn = frag_col(wid, sg, f, e);
    return EpiLane(gm, gn, p.c_off + wid.z * p.c_bs + gm * p.c_ms + gn);
}

fn epi4_row(l: EpiLane, q: u32) -> u32 {
    return l.gm + q * EPI4_ROWS;
}

fn epi4_c(l: EpiLane, q: u32) -> u32 {
    return l.o + q * EPI4_ROWS * p.c_ms;
}

// The lane's q-th 4 elements of subgroup sg's spilled fragment, scaled as `epi_sh` does.
fn epi4_sh(l: EpiLane, sg: u32, lane: u32, q: u32) -> vec4<f32> {
    let i = sg * FE + (lane / EPI4_LANES + q * EPI4_ROWS) * FS + lane % EPI4_LANES * 4u;
    let v = vec4<f32>(c_sh[i], c_sh[i + 1u], c_sh[i + 2u], c_sh[i + 3u]);
    if (A_ONES && epi4_row(l, q) == p.m - 1u) {
        return v * inv_b;
    }
    return v * unscale.x * unscale.y;
}

// C's elements from offset o, columns gn .. gn + 3, are v (with ACC: v added): one vector
// store where all four lie inside C, else those that do, one by one.
fn store_c4_in(o: u32, gn: u32, v: vec4<f32>) {
    if (gn + 3u < p.n) {
        store_c4(o, v);
    } else {
        for (var i = 0u; i < 4u; i++) {
            if (gn + i < p.n) {
                store_c(o + i, v[i]);
            }
        }
    }
}

// Columns gn .. gn + 3 of row `row` of a contiguous (M, N) f32 array in `pre` from `off`: one
// vector where all four lie inside C, else one by one, columns clamped into C.
fn pre4(off: u32, row: u32, gn: u32) -> vec4<f32> {
    let r = off + row * p.n;
    if (gn + 3u < p.n) {
        return pre_get4(r + gn);
    }
    let last = p.n - 1u;
    return vec4<f32>(pre_get(r + min(gn, last)), pre_get(r + min(gn + 1u, last)),
                     pre_get(r + min(gn + 2u, last)), pre_get(r + min(gn + 3u, last)));
}

// The bias of columns gn .. gn + 3 (clamped into C).
fn bias4(gn: u32) -> vec4<f32> {
    let last = p.bias_off + p.n - 1u;
    let i = p.bias_off + gn;
    return vec4<f32>(bias[min(i, last)], bias[min(i + 1u, last)], bias[min(i + 2u, last)],
                     bias[min(i + 3u, last)]);
}

@compute @workgroup_size(WG)
fn matmul_coop(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let wid = tile_of(wg);
    scales_init(lane);
    zero_acc();
    product(wid, lid, sg);
    for (var f = 0u; f < EPI_FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        if (C_VEC) {
            let l = epi4_lane(wid, sg, f, lane);
            for (var q = 0u; q < EPI4_STEPS; q++) {
                if (l.gn < p.n && epi4_row(l, q) < p.m) {
                    store_c4_in(epi4_c(l, q), l.gn, epi4_sh(l, sg, lane, q));
                }
            }
        } else {
            let l = epi_lane(wid, sg, f, lane);
            for (var q = 0u; q < EPI_STEPS; q++) {
                if (l.gn < p.n && epi_row(l, q) < p.m) {
                    store_c(epi_c(l, q), epi_sh(l, sg, lane, q));
                }
            }
        }
        workgroupBarrier();
    }
}

// C = A @ B + bias (bias indexed by column).
@compute @workgroup_size(WG)
fn matmul_coop_bias(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let wid = tile_of(wg);
    scales_init(lane);
    zero_acc();
    product(wid, lid, sg);
    for (var f = 0u; f < EPI_FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        if (C_VEC) {
            let l = epi4_lane(wid, sg, f, lane);
            if (l.gn < p.n) {
                let b = bias4(l.gn);
                for (var q = 0u; q < EPI4_STEPS; q++) {
                    if (epi4_row(l, q) < p.m) {
                        store_c4_in(epi4_c(l, q), l.gn, epi4_sh(l, sg, lane, q) + b);
                    }
                }
            }
        } else {
            let l = epi_lane(wid, sg, f, lane);
            if (l.gn < p.n) {
                let b = bias[p.bias_off + l.gn];
                for (var q = 0u; q < EPI_STEPS; q++) {
                    if (epi_row(l, q) < p.m) {
                        store_c(epi_c(l, q), epi_sh(l, sg, lane, q) + b);
                    }
                }
            }
        }
        workgroupBarrier();
    }
}

// C = A @ B + bias + R, with R (the residual a block adds the product to: contiguous (M, N) f32,
// batch 1) read through `pre` from res_off. An entry point of its own, like matmul_coop_sums: a shader naming `pre` needs it in its layout.
@compute @workgroup_size(WG)
fn matmul_coop_bias_res(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let wid = tile_of(wg);
    scales_init(lane);
    zero_acc();
    product(wid, lid, sg);
    for (var f = 0u; f < EPI_FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        if (C_VEC) {
            let l = epi4_lane(wid, sg, f, lane); // batch 1: wid.z = 0
            if (l.gn < p.n) {
                let b = bias4(l.gn);
                for (var q = 0u; q < EPI4_STEPS; q++) {
                    let gm = epi4_row(l, q);
                    if (gm < p.m) {
                        let r = pre4(p.res_off, gm, l.gn);
                        store_c4_in(epi4_c(l, q), l.gn, epi4_sh(l, sg, lane, q) + b + r);
                    }
                }
            }
        } else {
            let l = epi_lane(wid, sg, f, lane); // batch 1: wid.z = 0
            if (l.gn < p.n) {
                let b = bias[p.bias_off + l.gn];
                for (var q = 0u; q < EPI_STEPS; q++) {
                    let gm = epi_row(l, q);
                    if (gm < p.m) {
                        let r = pre_get(p.res_off + gm * p.n + l.gn);
                        store_c(epi_c(l, q), epi_sh(l, sg, lane, q) + b + r);
                    }
                }
            }
        }
        workgroupBarrier();
    }
}

// C = A @ B with A_ONES: C's last row (the column sums of B) to pre at bias_off instead
// (unless split: the partials keep it). An entry point of its own, as matmul_coop's layout has no `pre` (a shader that names a binding
// needs it in its layout, even behind a constant that is false).
@compute @workgroup_size(WG)
fn matmul_coop_sums(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let wid = tile_of(wg);
    scales_init(lane);
    zero_acc();
    product(wid, lid, sg);
    for (var f = 0u; f < EPI_FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        if (C_VEC) {
            let l = epi4_lane(wid, sg, f, lane);
            for (var q = 0u; q < EPI4_STEPS; q++) {
                let gm = epi4_row(l, q);
                let v = epi4_sh(l, sg, lane, q);
                if (gm == p.m - 1u && l.gn < p.n && p.k_split == 0u) {
                    for (var i = 0u; i < 4u; i++) {
                        if (l.gn + i < p.n) {
                            let o = p.bias_off + l.gn + i;
                            pre_put(o, select(v[i], pre_get(o) + v[i], ACC));
                        }
                    }
                } else if (gm < p.m && l.gn < p.n) {
                    store_c4_in(epi4_c(l, q), l.gn, v);
                }
            }
        } else {
            let l = epi_lane(wid, sg, f, lane);
            for (var q = 0u; q < EPI_STEPS; q++) {
                let gm = epi_row(l, q);
                let v = epi_sh(l, sg, lane, q);
                if (gm == p.m - 1u && l.gn < p.n && p.k_split == 0u) {
                    let o = p.bias_off + l.gn;
                    pre_put(o, select(v, pre_get(o) + v, ACC));
                } else if (gm < p.m && l.gn < p.n) {
                    store_c(epi_c(l, q), v);
                }
            }
        }
        workgroupBarrier();
    }
}

// z = A @ B + bias saved to pre (contiguous (batch, M, N), f32), C = gelu(z) (tanh form).
@compute @workgroup_size(WG)
fn matmul_coop_bias_gelu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                    @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let wid = tile_of(wg);
    scales_init(lane);
    zero_acc();
    product(wid, lid, sg);
    for (var f = 0u; f < EPI_FRAGS; f++) {
        spill(f, sg);
        workgroupBarrier();
        if (C_VEC) {
            let l = epi4_lane(wid, sg, f, lane);
            if (l.gn < p.n) {
                let b = bias4(l.gn);
                for (var q = 0u; q < EPI4_STEPS; q++) {
                    let gm = epi4_row(l, q);
                    if (gm < p.m) {
                        let z = epi4_sh(l, sg, lane, q) + b;
                        let r = (wid.z * p.m + gm) * p.n + l.gn;
                        if (l.gn + 3u < p.n) {
                            pre_put4(r, z);
                        } else {
                            for (var i = 0u; i < 4u; i++) {
                                if (l.gn + i < p.n) {
                                    pre_put(r + i, z[i]);
                                }
                            }
                        }
                        let k = 0.7978845608028654; // sqrt(2 / pi)
                        let u = k * (z + 0.044715 * z * z * z);
                        let t = tanh(clamp(u, vec4<f32>(-15.0), vec4<f32>(15.0)));
                        store_c4_in(epi4_c(l, q), l.gn, 0.5 * z * (1.0 + t));
                    }
                }
            }
        } else {
            let l = epi_lane(wid, sg, f, lane);
            if (l.gn < p.n) {
                let b = bias[p.bias_off + l.gn];
                for (var q = 0u; q < EPI_STEPS; q++) {
                    let gm = epi_row(l, q);
                    if (gm < p.m) {
                        let z = epi_sh(l, sg, lane, q) + b;
                        pre_put((wid.z * p.m + gm) * p.n + l.gn, z);
                        let k = 0.7978845608028654; // sqrt(2 / pi)
                        let t = tanh(clamp(k * (z + 0.044715 * z * z * z), -15.0, 15.0));
                        store_c(epi_c(l, q), 0.5 * z * (1.0 + t));
                    }
                }
            }
        }
        workgroupBarrier();
    }
}
