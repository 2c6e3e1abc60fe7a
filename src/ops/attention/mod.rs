//! Fused causal self-attention: q, k, v (B, H, T, D) -> O (B, H, T, D) with
//! O = softmax(scale * q k^T, keys j <= query i) v, scale = 1/sqrt(D), D up to 128.
//!
//! One forward dispatch saves lse (B, H, T) instead of the (B, H, T, T) probabilities;
//! backward recomputes them block by block in two dispatches: with the f32 kernels dQ (which
//! also writes D = rowsum(dO * O)) then dK with dV; with the cooperative-matrix kernels D, then
//! dQ and dK/dV side by side in one. The kernels read and write (B, H, T, D) views with
//! unit stride along D directly, so the head split of a fused qkv projection and its gradient
//! cost no copy. `causal_attention_reference` is the same function from unfused ops.
//!
//! q, k and v are f32 or f16. The cooperative-matrix kernels (autocast) read either and write O
//! in the inputs' type; their backward reads dO of either type and writes dQ, dK, dV f32, or
//! f16 into the gradient of a fused qkv input that a linear made and nothing else reads (the
//! linear's products round it to f16 as they load it). Elsewhere f16 inputs are cast to f32.
//! GPT-2 under mixed precision stores its qkv projection f16 for them (`stores_half`).
//!
//! Grouped-query attention and rotary embeddings (the Llama family) run in the same kernels:
//! `causal_self_attention_grouped` reads a packed (B, T, (H + 2 Hkv) D) projection, query head
//! h using key/value head h / (H / Hkv) (never repeated in memory), and with a `Rope` rotates
//! q and k as the kernels load them and dQ, dK back as they write them (rope.rs).

use crate::autograd::{record, Backward, BackwardCtx};
use crate::config::{AttentionSync, Float};
use crate::error::{Error, Result};
use crate::graph::{DType, Device, Layout, Storage, Tensor};
use crate::kernels::attention::{self, AttentionParams, Pass, MAX_HEAD_DIM};
use crate::kernels::attention_coop::Io;
use crate::kernels::matmul_coop::Coop;
use crate::kernels::{attention_coop, Spec};
use crate::ops::autocast_enabled;
use crate::ops::elementwise::launch_copy;
use crate::ops::Out;

mod backward;
mod grouped;
mod rope;

use backward::CausalAttentionBackward;
use grouped::heads_of;
pub use rope::Rope;

/// A forward's rotary embedding: the table and the position of row t = 0.
#[derive(Clone)]
struct RopeAt {
    table: Tensor, // (positions, D)
    start: usize,
}

const OP: &str = "causal_attention";

/// Whether a model under autocast on `device` should store its qkv projection f16 for the
/// attention: the adapter has cooperative matrices (whose kernels read f16 inputs and write an
/// f16 O) and the precision says f16 (`Precision::attention`).
pub fn stores_half(device: &Device) -> bool {
    half_io(device) && Coop::available(device.gpu()).is_some()
}

/// Whether the attention's O takes f16 inputs' type, and its gradients may be f16, on
/// `device` (`Precision::attention`; f32 keeps them f32).
fn half_io(device: &Device) -> bool {
    device.options().precision.attention == Float::F16
}

/// The cooperative-matrix attention's tile of `pass` on `device` (a `lab` build's forced
/// blocking first, `WGRAD_ATTN_TILE`).
fn coop_tile(device: &Device, pass: Pass, dmax: u32, coop: Coop) -> Option<attention_coop::Tile> {
    let limit = device.gpu().limits.max_compute_workgroup_storage_size;
    let forced = device.options().lab.attention_tile(pass);
    attention_coop::tile_or(pass, dmax, coop, limit, forced)
}

/// The cooperative-matrix attention's specialization on `device` (its `AttentionSync`).
fn coop_spec(
    device: &Device,
    pass: Pass,
    (t, coop): (attention_coop::Tile, Coop),
    (acc_a, acc_b): (bool, bool),
    io: Io,
) -> Spec {
    let spec = attention_coop::spec(pass, t, coop, acc_a, acc_b, io);
    let ablate = device.options().lab.attention_ablation();
    let spec = match device.options().kernels.attention_sync {
        AttentionSync::Subgroup => spec,
        AttentionSync::Workgroup => attention_coop::workgroup_sync(spec),
    };
    if ablate == 0 {
        spec
    } else {
        attention_coop::ablated(spec, ablate)
    }
}

fn scale(d: usize) -> f32 {
    1.0 / (d as f32).sqrt()
}

fn unit_d_stride(t: &Tensor) -> bool {
    t.shape()[3] <= 1 || t.strides()[3] == 1
}

/// `t` detached, with unit stride along D (copied when it has not).
fn unit_d(t: &Tensor) -> Result<Tensor> {
    let t = t.detach();
    if unit_d_stride(&t) {
        Ok(t)
    } else {
        t.contiguous()
    }
}

/// (offset, b stride, h stride, t stride) of a (B, H, T, D) tensor.
fn view(t: &Tensor) -> [u32; 4] {
    let s = t.strides();
    [
        t.layout().offset as u32,
        s[0] as u32,
        s[1] as u32,
        s[2] as u32,
    ]
}

/// Whether two (B, H, T, D) views (unit stride along D) provably share no element: other
/// storage, element ranges apart, or (same strides) offsets in different residues of the
/// period of their rows. Merging the dims whose stride continues the contiguous run along D
/// (the heads of a fused qkv tensor: h stride D) gives a run of L elements; the other dims'
/// strides are multiples of their gcd g, so every element is offset + [0, L) mod g.
fn disjoint(a: &Tensor, b: &Tensor) -> bool {
    if !a.same_storage(b) {
        return true;
    }
    let (la, lb) = (a.layout(), b.layout());
    if la.storage_extent() <= lb.offset || lb.storage_extent() <= la.offset {
        return true;
    }
    if la.strides != lb.strides || la.shape != lb.shape {
        return false;
    }
    let mut dims: Vec<(usize, usize)> = (0..3)
        .map(|i| (la.strides[i], la.shape[i]))
        .filter(|&(_, n)| n > 1)
        .collect();
    dims.sort_unstable();
    let mut run = la.shape[3];
    let mut rest = dims.as_slice();
    while let Some((&(stride, n), tail)) = rest.split_first() {
        if stride != run {
            break;
        }
        run *= n;
        rest = tail;
    }
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    let period = rest.iter().fold(0, |g, &(s, _)| gcd(g, s));
    if period == 0 || run > period {
        return false;
    }
    let diff = (lb.offset % period + period - la.offset % period) % period;
    diff >= run && period - diff >= run
}

/// The (B, H, T, D) shape of q, whose element type is q's: f32, or (where `half` allows)
/// f16. k and v have q's shape, or (`grouped`) (B, Hkv, T, D) with Hkv dividing H.
fn check_shapes(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    op: &'static str,
    half: bool,
    grouped: bool,
) -> Result<[usize; 4]> {
    if !(half && q.dtype() == DType::F16) {
        q.expect_dtype(op, DType::F32)?;
    }
    for t in [q, k, v] {
        t.expect_dtype(op, q.dtype())?;
        q.expect_same_device(op, t)?;
        if t.rank() != 4 {
            return Err(Error::ShapeMismatch {
                op,
                expected: "q, k and v of rank 4, (B, H, T, D)".into(),
                got: t.shape().to_vec(),
            });
        }
    }
    let (qs, ks) = (q.shape(), k.shape());
    let kv_fits = grouped
        && ks[1] > 0
        && qs[1].is_multiple_of(ks[1])
        && [0, 2, 3].iter().all(|&i| ks[i] == qs[i]);
    for (name, t) in [("k", k), ("v", v)] {
        if t.shape() != q.shape() && !(kv_fits && t.shape() == ks) {
            return Err(Error::ShapeMismatch {
                op,
                expected: format!("{name} of q's shape {:?}", q.shape()),
                got: t.shape().to_vec(),
            });
        }
    }
    let s = q.shape();
    Ok([s[0], s[1], s[2], s[3]])
}

/// Whether the cooperative-matrix kernels can read `t` (B, H, T, D) four elements at a time:
/// D, its offset and its strides multiples of 4.
fn aligned4(t: &Tensor) -> bool {
    t.shape()[3].is_multiple_of(4)
        && t.layout().offset.is_multiple_of(4)
        && t.strides()[..3].iter().all(|s| s.is_multiple_of(4))
}

/// The cooperative matrices an attention of q, k, v runs on: under autocast, where the
/// adapter has them, a tile fits, the inputs are `aligned4`, and (`rope`) they take the rotary
/// embedding at this head dim (`attention_coop::takes_rope`).
fn coop_for(q: &Tensor, k: &Tensor, v: &Tensor, rope: bool) -> Option<Coop> {
    if !autocast_enabled() || ![q, k, v].into_iter().all(aligned4) {
        return None;
    }
    let coop = Coop::available(q.device().gpu())?;
    let dmax = attention::head_dim_bucket(q.shape()[3])?;
    if rope && !attention_coop::takes_rope(q.shape()[3], dmax, coop) {
        return None;
    }
    [Pass::Forward, Pass::Dq, Pass::Dkv]
        .into_iter()
        .all(|pass| coop_tile(q.device(), pass, dmax, coop).is_some())
        .then_some(coop)
}

/// The padded head dim (`attention::HEAD_DIMS`) of q's (B, H, T, D), which the forward has
/// checked.
fn head_dim_bucket(q: &Tensor) -> Result<u32> {
    let d = q.shape()[3];
    attention::head_dim_bucket(d).ok_or_else(|| Error::InvalidArgument {
        op: OP,
        reason: format!("head dim {d} is over {MAX_HEAD_DIM} (checked by the forward)"),
    })
}

/// Records `pass` over every block of q's (B, H, T, D): workgroups (blocks of T, B * H; for
/// dK/dV B * H / group, the kv heads); on the cooperative-matrix kernels when `coop` (the
/// forward only: their backward runs both passes in one dispatch, `launch_both`), their
/// bindings of `io`'s types (the f32 kernels bind f32 alone); with the rotary table bound last
/// when `rope`.
#[allow(clippy::too_many_arguments)]
fn dispatch(
    pass: Pass,
    q: &Tensor,
    params: &AttentionParams,
    storage: &[&Storage],
    acc_a: bool,
    acc_b: bool,
    coop: Option<Coop>,
    io: Io,
    rope: bool,
) -> Result<()> {
    debug_assert!(
        coop.is_none() || pass == Pass::Forward,
        "the cooperative-matrix backward is launch_both"
    );
    let s = q.shape();
    let dmax = head_dim_bucket(q)?;
    let limit_bytes = q.device().gpu().limits.max_compute_workgroup_storage_size;
    let device = q.device();
    let tile = coop.and_then(|c| Some((coop_tile(device, pass, dmax, c)?, c)));
    let (kernel, spec, block) = match tile {
        Some((t, c)) => (
            attention_coop::kernel(pass),
            coop_spec(device, pass, (t, c), (acc_a, acc_b), io),
            t.rows(c),
        ),
        None => {
            let lanes = q
                .device()
                .gpu()
                .limits
                .max_compute_invocations_per_workgroup;
            let forced = device.attention_tiles();
            let t = attention::chosen_tile(pass, dmax, (limit_bytes, lanes), &forced);
            let block = if pass == Pass::Dkv { t.bc } else { t.br };
            (pass.kernel(), attention::spec(pass, t, acc_a, acc_b), block)
        }
    };
    let spec = attention::with_rope(spec, rope);
    let heads = match pass {
        Pass::Dkv => s[1] / params.group as usize,
        _ => s[1],
    };
    let groups = [s[2].div_ceil(block as usize), s[0] * heads];
    let limit = q.device().gpu().limits.max_compute_workgroups_per_dimension as usize;
    if let Some(&count) = groups.iter().find(|&&n| n > limit) {
        return Err(Error::TooManyWorkgroups {
            what: format!("{OP} over q of shape {s:?}"),
            count: count as u64,
            limit: limit as u64,
        });
    }
    q.device().record(
        kernel,
        &spec,
        params,
        storage,
        [groups[0] as u32, groups[1] as u32, 1],
    );
    Ok(())
}

impl Tensor {
    /// Causal self-attention of queries `self`, keys `k` and values `v`, each (B, H, T, D)
    /// with D <= 128 (any strides), all f32 or all f16: softmax(q k^T / sqrt(D), keys j <=
    /// query i) v, fused. Under autocast, on an adapter with cooperative matrices, its
    /// products (forward and backward) run in f16 with f32 accumulation, softmax and
    /// statistics in f32, and O is of the inputs' type; elsewhere f16 inputs are cast to f32
    /// and O is f32.
    pub fn causal_attention(&self, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        self.causal_attention_as(k, v, false)
    }

    /// `causal_attention` with the heads merged back into the model's width: (B, T, H * D),
    /// the layout the attention's output projection reads. The kernels write it so and read
    /// its gradient so: no copy either way (`permute` and `reshape` after `causal_attention`
    /// make one forward and one backward).
    pub fn causal_attention_merged(&self, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        self.causal_attention_as(k, v, true)
    }

    /// Causal self-attention of a fused projection: `self` is (B, T, 3C), q, k and v side by
    /// side along its last dim, each C = `heads` x D with D <= 128 (GPT-2's c_attn output);
    /// returns (B, T, C) as `causal_attention_merged` does. The heads are read in place, and
    /// the backward writes dQ, dK and dV into the thirds of one (B, T, 3C) gradient.
    /// `causal_self_attention_grouped(heads, heads, None)`.
    pub fn causal_self_attention(&self, heads: usize) -> Result<Tensor> {
        self.causal_self_attention_at(heads, heads, None, 0)
    }

    fn causal_attention_as(&self, k: &Tensor, v: &Tensor, merged: bool) -> Result<Tensor> {
        let (out, state) = attention_forward(self, k, v, merged, None)?;
        Ok(record(out, &[self, k, v], || state))
    }

    /// The same function as `causal_attention` from unfused ops (matmul, a where-mask,
    /// softmax, matmul), materializing the (B, H, T, T) probabilities; its gradients come from
    /// those ops' backward rules. The definition the fused kernels are tested against.
    pub fn causal_attention_reference(&self, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        const REF: &str = "causal_attention_reference";
        let [_, _, t, d] = check_shapes(self, k, v, REF, false, false)?;
        let s = self.matmul(&k.t()?)?.mul_scalar(scale(d))?;
        let keep: Vec<f32> = (0..t * t)
            .map(|e| if e % t <= e / t { 1.0 } else { 0.0 })
            .collect();
        let keep = Tensor::from_slice(self.device(), &keep, &[t, t])?;
        let masked = Tensor::full(self.device(), &[1], f32::NEG_INFINITY)?;
        Tensor::where_cond(&keep, &s, &masked)?.softmax()?.matmul(v)
    }
}

/// The forward of `causal_attention` (merged: O as (B, T, H * D)) and what its backward saves;
/// k and v may have fewer heads than q (grouped-query attention), and `rope` rotates q and k.
fn attention_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    merged: bool,
    rope: Option<RopeAt>,
) -> Result<(Tensor, CausalAttentionBackward)> {
    let [b, h, t, d] = check_shapes(q, k, v, OP, true, true)?;
    let group = h / k.shape()[1];
    if d == 0 || d > MAX_HEAD_DIM {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: format!("a head dim (last axis) of 1 to {MAX_HEAD_DIM}"),
            got: q.shape().to_vec(),
        });
    }
    let (mut q, mut kd, mut vd) = (unit_d(q)?, unit_d(k)?, unit_d(v)?);
    let coop = coop_for(&q, &kd, &vd, rope.is_some());
    if coop.is_none() && q.dtype() != DType::F32 {
        // The f32 kernels read f32.
        (q, kd, vd) = (
            q.to_dtype(DType::F32)?,
            kd.to_dtype(DType::F32)?,
            vd.to_dtype(DType::F32)?,
        );
    }
    // O in the inputs' type (f32 after a cast).
    let out = if half_io(q.device()) {
        q.dtype()
    } else {
        DType::F32
    };
    let io = Io {
        input: q.dtype(),
        grad: q.dtype(),
        out,
    };
    let device = q.device();
    // Merged: O in (B, T, H, D) memory (`base`), seen by the kernels as (B, H, T, D).
    let base = if merged {
        Tensor::uninit(device, &[b, t, h, d], io.out, OP)?
    } else {
        Tensor::uninit(device, &[b, h, t, d], io.out, OP)?
    };
    let o = if merged {
        base.permute(&[0, 2, 1, 3])?
    } else {
        base.clone()
    };
    let lse = Tensor::uninit(device, &[b, h, t], DType::F32, OP)?;
    if o.numel() > 0 {
        let params = AttentionParams {
            batch: b as u32,
            heads: h as u32,
            t: t as u32,
            d: d as u32,
            scale: scale(d),
            group: group as u32,
            start: rope.as_ref().map_or(0, |r| r.start as u32),
            q: view(&q),
            k: view(&kd),
            v: view(&vd),
            o: view(&o),
            ..Default::default()
        };
        // The backward's slots unread (q bound there); the rotary table last (q without one).
        let table = rope.as_ref().map_or(q.storage(), |r| r.table.storage());
        let storage = [
            o.storage(),
            lse.storage(),
            q.storage(),
            kd.storage(),
            vd.storage(),
            q.storage(),
            q.storage(),
            q.storage(),
            table,
        ];
        let has_rope = rope.is_some();
        dispatch(
            Pass::Forward,
            &q,
            &params,
            &storage,
            false,
            false,
            coop,
            io,
            has_rope,
        )?;
    }
    let out = if merged {
        base.reshape(&[b, t, h * d])?
    } else {
        base
    };
    Ok((
        out,
        CausalAttentionBackward {
            q,
            k: kd,
            v: vd,
            o,
            lse,
            coop,
            merged,
            fused_qkv: false,
            rope,
        },
    ))
}
