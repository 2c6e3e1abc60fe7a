// Fused causal self-attention on cooperative matrices (tensor cores), forward and backward:
// the mixed-precision counterpart of attention.wgsl (same Params and FlashAttention-2
// algorithm, the forward's row max kept stale as below; read that file's header for the math).
// The products q k^T, P v, dO v^T, dS k, P^T dO and dS^T q run on f16 fragments with f32
// accumulation; the softmax, its statistics (m, l, lse), D and every accumulated output stay
// f32.
//
// Memory: q, k, v and dO are (B, H, T, D) views read 4 elements at a time (the launcher checks
// that D, every offset and every stride are multiples of 4); O, dQ, dK and dV are written
// through their views; lse and D are contiguous (B, H, T) f32. Each of q, k, v, dO and the
// outputs is f32, or f16 where autocast stores it so (the kernels round every operand to f16
// as they stage it, so f16 inputs give the same products; f16 outputs are what the next
// product would round them to). f16 outputs (OUT_F32 false) are bound as u32 words of two
// halves (OA, OB u32; else f32; the forward's out_b, lse, f32) and written 4 elements a lane
// as two words (their views on multiples of 4 elements: the launcher checks). Bindings: 1 out_a (O; dQ
// and dK, views of one buffer), 2 out_b (lse; dV), 3 q, 4 k, 5 v, 6 dO, 7 lse, 8 aux (-; D)
// for attn_coop_fwd; attn_coop_bwd, which runs both backward passes of attention.wgsl in one
// dispatch (side by side, where two dispatches writing one gradient buffer would run one after
// the other behind a barrier) after attention_d.wgsl has written D = rowsum(dO * O).
//
// Workgroup mapping: SG subgroups of SGS lanes; subgroup sg owns FS rows of the workgroup's
// ROWS = SG * FS (queries for the forward and dQ, keys for dK/dV) and loops
// over blocks of BC rows of the other side. The scores of a block (S, dP) run one FS x FS
// fragment at a time (its accumulator a single variable: nothing indexes coop matrices at run
// time) and are stored to the subgroup's f32 scratch rows; then the subgroup's lanes, LPR =
// SGS / FS per row, each owning every LPR-th group of 4 columns of its row (read and written 4
// at a time), do the elementwise work (mask, exp). Row statistics are combined across a row's lanes with subgroup shuffles.
// The outputs (O; dQ; dK and dV) stay in accumulators across blocks, the subgroup's own rows'
// operands (q; q and dO; k and v) in fragments (the OWN snippet), so the tiles take little
// workgroup memory and two workgroups share a core (NVIDIA's Vulkan driver gives a core about
// 48 KiB of workgroup memory in all; PROFILING.md).
// The forward runs one pass over the key blocks with the softmax's row max kept stale: a
// block's P = exp(S - m) against the row's running max m, which moves only when a block's max
// passes it by more than RESCALE (P stays under e^RESCALE, well inside f16). Only then does a
// subgroup rescale its O rows (through its scratch rows), and once at the end by 1 / l; a
// row's max settles within its first blocks, so O rarely leaves the accumulators (it replaced
// two passes, the row statistics from S alone and then O += P v with P normalized, that kept O
// in the accumulators by repeating S; PROFILING.md).
// Within a block a subgroup's scores, P and dS are its own rows of the scratch and the tiles, so
// it waits for its own lanes alone there (`own_sync`, the SYNC snippet: a subgroup barrier, or
// the workgroup's to measure); the blocks' shared tiles are behind workgroup barriers.
// The forward's rescale decision takes no branch of a lane's own (`|`, `&`, `select` and the
// subgroup's vote): a first one-pass forward with one (one lane storing a workgroup flag) and
// with `||` / `&&` in that decision computed wrong outputs on NVIDIA's driver, and so did the
// two passes beside it in one entry point, its branch never taken; which construct did it was
// not found (PROFILING.md). The subgroup barriers rely on a subgroup's own workgroup-memory
// stores being visible to its lanes after one, which the SPIR-V naga writes (subgroup memory
// semantics) does not promise; NVIDIA's Vulkan driver was checked (tests on an H100), and
// naga's MSL orders threadgroup memory there.
// With PREFETCH a block's rows of the other side are in flight while the block before it works:
// each lane loads its share of the next block into registers (`fetch_*`) right after the current
// block is stored into the tiles, and stores it (`put_*`) once the current block is done with
// them, so the loads' latency hides behind a block's products and softmax. Without it each
// block is loaded (`fetch_*`) just before it is stored (the registers free during the block's
// work; the launcher's `prefetches` chooses).
// Tiles, f16, rows padded by 8 halves, regions of one array h_sh (see its declaration); fragments
// are loaded row-major (coopLoadT) as A or B operands, or column-major (coopLoad) for the
// transposed operands (k^T, v^T, q^T, dO^T).
// Grid: x over blocks of ROWS (the forward's numbered from the last queries, which have the
// most keys; attn_coop_bwd's twice as many, both passes' blocks interleaved), y over b * H + h.
//
// Specialization: KIND (0 forward, 3 backward), FS, SGS, SG, BC, DMAX (head dim padded to a
// multiple of FS), MA, MB, MC (the f16 A, B and f32 accumulator fragment types), ACC_DQ,
// ACC_DK, ACC_DV (add into the target instead of overwriting it), PREFETCH (the next block in
// flight), DIRECT_OUT (outputs inside T stored straight from the accumulators, else through the
// scratch like the edge's: f32 outputs only), types OA, OB (above); snippets OWN, SYNC and READ
// (q, k, v and dO as bound, QV and GV: vec4<f32>, vec4<f16>, or f16 in vec2<u32> words; `qf`
// and `gf` make them f32 vectors; a block in flight holds k or q as bound and v or dO as NX1,
// which `q_nx1`, `g_nx1` and `nx1f` convert to and from); ROPE (below).
//
// Grouped-query attention and rotary position embedding as in attention.wgsl (read its header):
// k, v, dK, dV are (B, H / G, T, D) views read through `head` with a bh whose h is the kv head
// (`kv_bh`); the dK/dV workgroups of the first B * H / G of y loop over their group's query
// heads (the others have no work). Under ROPE (D = DMAX, D/2 a multiple of FS: the launcher
// checks) q and k are rotated in f32 as they are staged, then rounded to f16; dQ and dK leave
// through the scratch rows a pair of fragments at a time (d0.. in sc, its partner d0 + D/2.. in
// sc2), rotated back (`edge_rope`), never straight from the accumulators.

// This file has the declarations, the helpers and the staging; attention_coop_passes.wgsl,
// composed after it, the fragments, the outputs and the two entry points.

enable wgpu_cooperative_matrix;

struct Params {
    heads: u32,
    t: u32,
    d: u32,
    batch: u32,
    scale: f32,
    group: u32,
    start: u32,
    _pad3: u32,
    q: vec4<u32>,
    k: vec4<u32>,
    v: vec4<u32>,
    o: vec4<u32>,
    dout: vec4<u32>,
    dq: vec4<u32>,
    dk: vec4<u32>,
    dv: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out_a: array<OA>;
@group(0) @binding(2) var<storage, read_write> out_b: array<OB>;
@group(0) @binding(3) var<storage, read> q: array<QV>;  // 4 elements of QT an entry (READ)
@group(0) @binding(4) var<storage, read> k: array<QV>;
@group(0) @binding(5) var<storage, read> v: array<QV>;
@group(0) @binding(6) var<storage, read> dout: array<GV>; // 4 elements of GT an entry
@group(0) @binding(7) var<storage, read> lse: array<f32>;
@group(0) @binding(8) var<storage, read> aux: array<f32>; // D (backward)
// (positions, D) f32, 4 an entry: a row's D/2 cosines, then its D/2 sines (ROPE)
@group(0) @binding(9) var<storage, read> rope: array<vec4<f32>>;

// Measurement only (`WGRAD_ATTN_ABLATE`, results wrong): parts of the block loop left out.
const ABL_SOFTMAX: bool = (ABLATE & 1u) != 0u;  // the elementwise work on the scores
const ABL_STAGING: bool = (ABLATE & 2u) != 0u;  // every block's tiles but the first
const ABL_SCORES: bool = (ABLATE & 4u) != 0u;   // the score products (S, dP) and their stores
const ABL_OUT: bool = (ABLATE & 8u) != 0u;      // the output products
// (16: the subgroups' own waits, in the launcher's SYNC snippet)
const ABL_BARRIERS: bool = (ABLATE & 32u) != 0u; // the block staging's workgroup barriers
const ABL_PUTS: bool = (ABLATE & 64u) != 0u;     // the block staging's stores into the tiles
// The rotary embedding (ROPE) as the kernels apply it: off with 128 (q and k taken as rotated).
const ROPE_ON: bool = ROPE && (ABLATE & 128u) == 0u;

const KIND_FWD: u32 = 0u;
const KIND_BWD: u32 = 3u; // dQ and dK/dV, workgroups of both in one dispatch
const BWD: bool = KIND != KIND_FWD;
// An f32 accumulator is stored straight only into f32 outputs (the OWN snippet's direct
// functions are empty for f16 ones).
const_assert !DIRECT_OUT || OUT_F32;

const WG: u32 = SG * SGS;
const ROWS: u32 = SG * FS;
const LPR: u32 = SGS / FS;                 // lanes per scratch row
const DS: u32 = DMAX + 8u;                 // tile row stride (halves)
const PS: u32 = BC + 8u;                   // P / dS row stride (halves)
// Scratch row strides (f32), padded by 8 words: a lane reads its row's columns 4 at a time (16
// bytes), the 8 lanes of a quarter subgroup (4 rows, 2 lanes a row at BC 16) 8 different bank
// groups (a stride of BC + 4 put two of them in one; an unpadded stride of 32 or 64 words put all
// 16 rows of a fragment in one bank). Scores go through it, and output fragments one at a
// time: on the edge of T or D, and the forward's O where a subgroup rescales it (`rescale_out`:
// where a row's max moves, and once at the end by 1 / l).
const SW: u32 = BC + 8u;
const SW2: u32 = BC + 8u;
const BW: u32 = BC / LPR;                  // a lane's columns of a [row][BC] block
// A lane's columns are BW / 4 groups of 4, every LPR-th group of its row (`col4`).
const_assert BW % 4u == 0u;
const FE: u32 = FS * FS;                   // elements of a fragment
// The score of a masked pair: finite, so exp(NEG_BIG - m) is 0 and exp(m_old - m_new) is
// never NaN (every query row has key 0 in its first block, so m is finite after it).
const NEG_BIG: f32 = -1e30;

// The f16 tiles, regions of one array of vectors of 4 halves (offsets and strides below in
// halves, all multiples of 4; a cooperative load's pointer is the vector holding its first
// half, its stride counted in vectors), each [row][d] with row stride DS or, for P and dS,
// [row][key] with row stride PS:
// - forward: k and v (BC rows each), P (ROWS rows);
// - dQ: k and v, dS;
// - dK/dV: q and dO (BC rows), P^T and dS^T (ROWS rows).
// Before the loop over blocks the workgroup's own rows (q; q, then dO; k, then v) pass through
// the start of the array on their way into the subgroups' fragments.
const OWN_N: u32 = ROWS * DS;
const Q_OFF: u32 = 0u;
const K_OFF: u32 = 0u;
const V_OFF: u32 = BC * DS;
const DO_OFF: u32 = BC * DS;
const PP_OFF: u32 = 2u * BC * DS;
const DS_OFF: u32 = PP_OFF + ROWS * PS;
const BLOCK_N: u32 = select(DS_OFF, PP_OFF, KIND == KIND_FWD) + ROWS * PS;
var<workgroup> h_sh: array<vec4<f16>, max(OWN_N, BLOCK_N) / 4u>;
// The scratch rows, f32 in vectors of 4 (indices below in elements, `sc4`, `sc_at`).
var<workgroup> sc: array<vec4<f32>, ROWS * SW / 4u>;                    // scores / fragments out
var<workgroup> sc2: array<vec4<f32>, select(1u, ROWS * SW2 / 4u, BWD)>; // dP (dkv: dP^T)
var<workgroup> lse_c: array<vec4<f32>, select(1u, BC / 4u, BWD)>; // dK/dV: the block's queries
var<workgroup> dvec_c: array<vec4<f32>, select(1u, BC / 4u, BWD)>;
// The forward's one pass: how far (in the exponent) a block's row max may pass the row's
// running max before that max moves and O is rescaled; P stays under e^8 (about 3000).
const RESCALE: f32 = 8.0;

// Element (t, d) of head `bh` of a (B, H, T, D) view.
fn at(view: vec4<u32>, bh: u32, t: u32, d: u32) -> u32 {
    return head(view, bh) + t * view.w + d;
}

// Element (0, 0) of head `bh` of a (B, H, T, D) view.
fn head(view: vec4<u32>, bh: u32) -> u32 {
    let b = bh / p.heads;
    let h = bh % p.heads;
    return view.x + b * view.y + h * view.z;
}

// The bh of query head bh's key/value head, for `head` on a (B, H / G, T, D) view.
fn kv_bh(bh: u32) -> u32 {
    let h = bh % p.heads;
    return bh - h + h / p.group;
}

// Columns d..d+3 (d a multiple of 4) of a row at position `pos` rotated: x the row's values
// there, xp its partner's at (d + D/2) mod D.
fn rope4(x: vec4<f32>, xp: vec4<f32>, pos: u32, d: u32) -> vec4<f32> {
    let half = p.d / 2u;
    let row = ((p.start + pos) * p.d + d % half) / 4u;
    return x * rope[row] + select(xp, -xp, d < half) * rope[row + half / 4u];
}

// The vector of the partner columns (d + D/2) mod D of vector i (columns d..), 0 outside the
// view.
fn partner4(a: At4) -> u32 {
    return select(0u, a.i - a.d / 4u + ((a.d + p.d / 2u) % p.d) / 4u, a.ok);
}

// Vector i (a) of q or k as the scores see it: rotated under ROPE.
fn q_roped(a: At4, row0: u32) -> vec4<f32> {
    if (!ROPE_ON) {
        return qf(q[a.i]);
    }
    return rope4(qf(q[a.i]), qf(q[partner4(a)]), select(0u, row0 + a.r, a.ok), select(0u, a.d, a.ok));
}

fn k_roped(a: At4, row0: u32) -> vec4<f32> {
    if (!ROPE_ON) {
        return qf(k[a.i]);
    }
    return rope4(qf(k[a.i]), qf(k[partner4(a)]), select(0u, row0 + a.r, a.ok), select(0u, a.d, a.ok));
}

// ------------------------------------------------------------------------------------------
// Staging: rows of a (B, H, T, D) view into a tile of h_sh, 4 elements a load, rounded to
// f16, zero past T and D (x `scale` for q). Branch-free (loads under per-lane branches are not
// overlapped): outside the view a lane reads vector 0 and selects zero. The workgroup's own ROWS
// rows are staged at once (`stage_*`, into the start of h_sh); the blocks of the other side
// arrive through registers a block ahead (`fetch_*`, then `put_*`).

fn put4(off: u32, r: u32, d: u32, x: vec4<f32>, ok: bool) {
    h_sh[(off + r * DS + d) / 4u] = vec4<f16>(select(vec4<f32>(), x, ok));
}

// Tile element e (4 elements a vector) of rows row0.. of `view` from the head at `base` (its
// element (0, 0), `head(view, bh)`, hoisted out of the loops: it divides): its row r and column
// d in the tile, and the vector to load (0, with ok false, outside T and D).
struct At4 {
    i: u32,
    r: u32,
    d: u32,
    ok: bool,
}

fn at4(view: vec4<u32>, base: u32, row0: u32, e: u32) -> At4 {
    let r = e / (DMAX / 4u);
    let d = (e % (DMAX / 4u)) * 4u;
    let ok = row0 + r < p.t && d < p.d;
    return At4(select(0u, (base + (row0 + r) * view.w + d) / 4u, ok), r, d, ok);
}

// The workgroup's own rows row0.. (one function per source: each entry point binds only what
// it reads).
fn stage_q(bh: u32, row0: u32, lid: u32) {
    let base = head(p.q, bh);
    for (var e = lid; e < ROWS * DMAX / 4u; e += WG) {
        let a = at4(p.q, base, row0, e);
        put4(0u, a.r, a.d, q_roped(a, row0) * p.scale, a.ok);
    }
}

fn stage_do(bh: u32, row0: u32, lid: u32) {
    let base = head(p.dout, bh);
    for (var e = lid; e < ROWS * DMAX / 4u; e += WG) {
        let a = at4(p.dout, base, row0, e);
        put4(0u, a.r, a.d, gf(dout[a.i]), a.ok);
    }
}

fn stage_k(bh: u32, row0: u32, lid: u32) {
    let base = head(p.k, bh);
    for (var e = lid; e < ROWS * DMAX / 4u; e += WG) {
        let a = at4(p.k, base, row0, e);
        put4(0u, a.r, a.d, k_roped(a, row0), a.ok);
    }
}

fn stage_v(bh: u32, row0: u32, lid: u32) {
    let base = head(p.v, bh);
    for (var e = lid; e < ROWS * DMAX / 4u; e += WG) {
        let a = at4(p.v, base, row0, e);
        put4(0u, a.r, a.d, qf(v[a.i]), a.ok);
    }
}

// A block's rows in flight (the next block's, loaded while this one works): a lane's share of
// one view's BC x DMAX block is SLOTS vectors (nx0: k, or q for dK/dV; nx1: v, or dO), and for
// dK/dV the lse and D of query `lid` of the block (nl, nd). Loads are branch-free (outside the
// view: vector 0); `put_*` select zero outside T and D and skip a lane's vectors past the block.
const BLOCK_V: u32 = BC * DMAX / 4u;
const VPL: u32 = (BLOCK_V + WG - 1u) / WG;
const_assert BC <= WG;
// Under ROPE a lane holds pairs of vectors, columns d.. (d < D/2) and their partners d + D/2..
// of the same row (the rotation of both needs both, and one pair of table loads), so its slots
// come in twos.
const HALF_V: u32 = DMAX / 8u;             // vectors in half a row
const VPL_PAIRS: u32 = 2u * ((BLOCK_V / 2u + WG - 1u) / WG);
const SLOTS: u32 = select(VPL, VPL_PAIRS, ROPE_ON);
var<private> nx0: array<QV, SLOTS>;
var<private> nx1: array<NX1, SLOTS>;
var<private> nl: f32;
var<private> nd: f32;

// The block's vector (an index into its BC x DMAX / 4 vectors) in slot j of lane `lid`: under
// ROPE, slot 2i is the first half of a row's pair i and slot 2i + 1 its partner.
fn slot(lid: u32, j: u32) -> u32 {
    if (!ROPE_ON) {
        return lid + j * WG;
    }
    let pair = lid + (j / 2u) * WG;
    return (pair / HALF_V) * (DMAX / 4u) + pair % HALF_V + (j % 2u) * HALF_V;
}

fn fetch_k(bh: u32, row0: u32, lid: u32) {
    let base = head(p.k, bh);
    for (var j = 0u; j < SLOTS; j++) {
        nx0[j] = k[at4(p.k, base, row0, slot(lid, j)).i];
    }
}

fn fetch_v(bh: u32, row0: u32, lid: u32) {
    let base = head(p.v, bh);
    for (var j = 0u; j < SLOTS; j++) {
        nx1[j] = q_nx1(v[at4(p.v, base, row0, slot(lid, j)).i]);
    }
}

fn fetch_q(bh: u32, row0: u32, lid: u32) {
    let base = head(p.q, bh);
    for (var j = 0u; j < SLOTS; j++) {
        nx0[j] = q[at4(p.q, base, row0, slot(lid, j)).i];
    }
}

fn fetch_do(bh: u32, row0: u32, lid: u32) {
    let base = head(p.dout, bh);
    for (var j = 0u; j < SLOTS; j++) {
        nx1[j] = g_nx1(dout[at4(p.dout, base, row0, slot(lid, j)).i]);
    }
}

// dK/dV: lse and D of query row0 + lid (lanes past the block or T read element 0).
fn fetch_ld(bh: u32, row0: u32, lid: u32) {
    let ok = lid < BC && row0 + lid < p.t;
    let i = select(0u, bh * p.t + row0 + lid, ok);
    nl = lse[i];
    nd = aux[i];
}

// The fetched block (rows row0.. of `view`, its head `bh`: k, or q) into the tile at `off`,
// rotated under ROPE, times s.
fn put_nx0(view: vec4<u32>, bh: u32, row0: u32, off: u32, s: f32, lid: u32) {
    let base = head(view, bh);
    if (ROPE_ON) {
        // A pair: x (columns d.., d < D/2) and its partner y (d + D/2..), rotated as rope4
        // does, with one load of the row's cosines and sines.
        for (var j = 0u; j < SLOTS; j += 2u) {
            let e = slot(lid, j);
            if (e < BLOCK_V) {
                let a = at4(view, base, row0, e);
                let b = at4(view, base, row0, e + HALF_V);
                let row = ((p.start + select(0u, row0 + a.r, a.ok)) * p.d + a.d) / 4u;
                let cs = rope[row];
                let sn = rope[row + HALF_V];
                let x = qf(nx0[j]);
                let y = qf(nx0[j + 1u]);
                put4(off, a.r, a.d, (x * cs - y * sn) * s, a.ok);
                put4(off, b.r, b.d, (y * cs + x * sn) * s, b.ok);
            }
        }
        return;
    }
    for (var j = 0u; j < SLOTS; j++) {
        let e = slot(lid, j);
        if (e < BLOCK_V) {
            let a = at4(view, base, row0, e);
            put4(off, a.r, a.d, qf(nx0[j]) * s, a.ok);
        }
    }
}

fn put_nx1(view: vec4<u32>, bh: u32, row0: u32, off: u32, lid: u32) {
    let base = head(view, bh);
    for (var j = 0u; j < SLOTS; j++) {
        let e = slot(lid, j);
        if (e < BLOCK_V) {
            let a = at4(view, base, row0, e);
            put4(off, a.r, a.d, nx1f(nx1[j]), a.ok);
        }
    }
}

// The block of keys and values from k0 into the tiles (from the registers, once the previous
// block, or the own rows, is done with them), and the next block's loads issued (none after
// the last block before `keys`): the forward and dQ.
fn kv_block(bh: u32, k0: u32, keys: u32, lid: u32) {
    if (!PREFETCH) {
        fetch_k(bh, k0, lid);
        fetch_v(bh, k0, lid);
    }
    if (!ABL_BARRIERS) {
        workgroupBarrier();
    }
    if (!ABL_PUTS) {
        put_nx0(p.k, bh, k0, K_OFF, 1.0, lid);
        put_nx1(p.v, bh, k0, V_OFF, lid);
    }
    if (!ABL_BARRIERS) {
        workgroupBarrier();
    }
    if (PREFETCH && k0 + BC < keys) {
        fetch_k(bh, k0 + BC, lid);
        fetch_v(bh, k0 + BC, lid);
    }
}

// The backward's own rows row0.. (dQ: scale * q, then dO; dK/dV: k, then v) through the start
// of h_sh into the subgroups' fragments (own_a, own_b; rows r0.. of the subgroup).
fn own_rows(bh: u32, row0: u32, r0: u32, lid: u32, dkv: bool) {
    if (!dkv) {
        stage_q(bh, row0, lid);
    } else {
        stage_k(bh, row0, lid);
    }
    workgroupBarrier();
    own_a(r0);
    workgroupBarrier();
    if (!dkv) {
        stage_do(bh, row0, lid);
    } else {
        stage_v(bh, row0, lid);
    }
    workgroupBarrier();
    own_b(r0);
}

