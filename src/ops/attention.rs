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
    match device.options().kernels.attention_sync {
        AttentionSync::Subgroup => spec,
        AttentionSync::Workgroup => attention_coop::workgroup_sync(spec),
    }
}

/// Saved by the forward: its (unit-D-stride) inputs, its output and the row statistics.
struct CausalAttentionBackward {
    q: Tensor,   // (B, H, T, D)
    k: Tensor,   // (B, H, T, D)
    v: Tensor,   // (B, H, T, D)
    o: Tensor,   // (B, H, T, D)
    lse: Tensor, // (B, H, T), contiguous
    /// The forward ran on cooperative matrices (an autocast forward): so does the backward.
    coop: Option<Coop>,
    /// The output was (B, T, H * D) (`causal_attention_merged`): so is its gradient.
    merged: bool,
    /// q, k and v were the heads of one (B, T, 3 * H * D) input (`causal_self_attention`):
    /// dQ, dK and dV are written into the three thirds of its gradient.
    fused_qkv: bool,
}

impl Backward for CausalAttentionBackward {
    fn name(&self) -> &'static str {
        OP
    }

    /// The cooperative-matrix backward reads dO of either type, as it reads O: an f16 O's
    /// gradient may be stored f16 (the output projection's dX under autocast).
    fn takes_half_grad(&self) -> bool {
        self.coop.is_some() && self.o.dtype() == DType::F16
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let shape = self.q.shape().to_vec();
        let device = self.q.device().clone();
        if self.q.numel() == 0 {
            for i in 0..3 {
                ctx.put_with(i, |out| Target::new(out, &shape, &device, &[])?.finish())?;
            }
            return Ok(());
        }
        let g = if self.merged {
            let [b, h, t, d] = [shape[0], shape[1], shape[2], shape[3]];
            g.reshape(&[b, t, h, d])?.permute(&[0, 2, 1, 3])?
        } else {
            g.clone()
        };
        let mut g = unit_d(&g)?;
        if self.coop.is_none() && g.dtype() != DType::F32 {
            g = g.to_dtype(DType::F32)?; // the f32 kernels read f32
        }
        if self.coop.is_some() && !aligned4(&g) {
            g = g.contiguous()?;
        }
        let dvec = Tensor::uninit(g.device(), &shape[..3], DType::F32, OP)?; // D (B, H, T)
        if self.fused_qkv {
            return self.backward_qkv(&g, &dvec, ctx);
        }
        if self.coop.is_some() {
            return self.backward_coop(&g, &dvec, ctx);
        }
        let reads = [&self.q, &self.k, &self.v, &self.o, &self.lse, &g, &dvec];

        // dQ first: its kernel also writes D, which the dK/dV kernel reads.
        if ctx.needed(0) {
            ctx.put_with(0, |out| {
                let dq = Target::new(out, &shape, &device, &reads)?;
                self.launch_dq(&g, &dvec, &dq)?;
                dq.finish()
            })?;
        } else {
            self.launch_dq(&g, &dvec, &Target::scratch(&shape, &device)?)?;
        }

        // dK and dV come from one kernel, but each input's target is only known inside its own
        // `put_with`. v goes first: a target that already exists is kept for the kernel,
        // recorded in k's `put_with`; a new one (which `put_with` may read as soon as the
        // closure returns) is written at once, with dK into a new tensor passed on to k.
        let (need_k, need_v) = (ctx.needed(1), ctx.needed(2));
        if !need_k && !need_v {
            return Ok(());
        }
        let mut dv_kept: Option<Target<'static>> = None;
        let mut dk_done: Option<Tensor> = None;
        if need_v {
            ctx.put_with(2, |out| {
                let dv = Target::new(out, &shape, &device, &reads)?;
                if let (Target::Direct { t, acc }, Out::Write(_) | Out::Acc(_)) = (&dv, out) {
                    dv_kept = Some(Target::Direct {
                        t: t.clone(),
                        acc: *acc,
                    });
                    return Ok(t.clone());
                }
                let dk = Target::scratch(&shape, &device)?;
                self.launch_dkv(&g, &dvec, &dk, &dv)?;
                dk_done = Some(dk.finish()?);
                dv.finish()
            })?;
        }
        if let Some(dk) = dk_done {
            if !need_k {
                return Ok(());
            }
            return ctx.put_with(1, |out| match out {
                Out::New => Ok(dk),
                _ => launch_copy(&dk, out),
            });
        }
        let dv = match dv_kept {
            Some(dv) => dv,
            None => Target::scratch(&shape, &device)?, // v needs no gradient
        };
        if need_k {
            ctx.put_with(1, |out| {
                let mut dk = Target::new(out, &shape, &device, &reads)?;
                if !disjoint(dk.kernel_out().0, dv.kernel_out().0) {
                    dk = Target::staged(out, &shape, &device)?;
                }
                self.launch_dkv(&g, &dvec, &dk, &dv)?;
                dk.finish()
            })
        } else {
            self.launch_dkv(&g, &dvec, &Target::scratch(&shape, &device)?, &dv)
        }
    }
}

impl CausalAttentionBackward {
    /// The cooperative-matrix backward of separate q, k, v: its one kernel writes dQ, dK and dV
    /// through views of one buffer, so they go to a new (3, B, H, T, D) tensor, each handed on
    /// as a view or copied (added) into its target. Where two of q, k, v are one tensor, the
    /// gradient kept for the first is a view of that buffer, which the second's add may not
    /// read and write at once: it adds a copy.
    fn backward_coop(&self, g: &Tensor, dvec: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let shape = self.q.shape().to_vec();
        let mut all = vec![3];
        all.extend_from_slice(&shape);
        let grads = Tensor::uninit(self.q.device(), &all, DType::F32, OP)?;
        let views = (0..3)
            .map(|i| grads.narrow(0, i, 1)?.reshape(&shape))
            .collect::<Result<Vec<_>>>()?;
        self.launch_both(g, dvec, [&views[0], &views[1], &views[2]], false)?;
        for (i, grad) in views.into_iter().enumerate() {
            if ctx.needed(i) {
                ctx.put_with(i, |out| match out {
                    Out::New => Ok(grad),
                    Out::Write(t) | Out::Acc(t) if t.same_storage(&grad) => {
                        launch_copy(&launch_copy(&grad, Out::New)?, out)
                    }
                    _ => launch_copy(&grad, out),
                })?;
            }
        }
        Ok(())
    }

    /// dQ, dK, dV into the thirds of the fused (B, T, 3C) input's gradient: a new gradient
    /// is written whole by the kernels (no zeroed buffer to add into, as three separate
    /// views of it would need); one that cannot be viewed so, or shares storage with what the
    /// kernels read, is staged.
    fn backward_qkv(&self, g: &Tensor, dvec: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let [b, h, t, d] = [
            self.q.shape()[0],
            self.q.shape()[1],
            self.q.shape()[2],
            self.q.shape()[3],
        ];
        let full = [b, t, 3 * h * d];
        let device = self.q.device().clone();
        let reads = [&self.q, &self.k, &self.v, &self.o, &self.lse, g, dvec];
        // f16 where the cooperative-matrix kernels read f16 inputs made for them alone by an
        // op that reads f16 gradients (a linear under autocast, whose products round the
        // gradient to f16 as they load it anyway).
        let dtype = if self.coop.is_some()
            && self.q.dtype() == DType::F16
            && half_io(&device)
            && ctx.input_takes_half(0)
            && ctx.sole_contribution(0)
        {
            DType::F16
        } else {
            DType::F32
        };
        ctx.put_with_typed(0, dtype, |out| {
            let want = match out {
                Out::New => dtype,
                Out::Write(t) | Out::Acc(t) => t.dtype(),
            };
            let (target, acc) = out.resolve_typed(OP, &device, &full, &[], want)?;
            // The f32 kernels write f32 alone: another target is staged.
            let writes = if self.coop.is_some() {
                want
            } else {
                DType::F32
            };
            let direct = match heads_of(&target, h)? {
                [dq, dk, dv]
                    if writes == want
                        && [&dq, &dk, &dv].iter().all(|x| unit_d_stride(x))
                        // f16 outputs are written 4 elements at a time.
                        && (want == DType::F32 || [&dq, &dk, &dv].iter().all(|x| aligned4(x)))
                        && !reads.iter().any(|r| r.same_storage(&target)) =>
                {
                    Some([dq, dk, dv])
                }
                _ => None,
            };
            let (heads, acc, fresh) = match direct {
                Some(views) => (views, acc, None),
                None => {
                    let fresh = Tensor::uninit(&device, &full, writes, OP)?;
                    (heads_of(&fresh, h)?, false, Some(fresh))
                }
            };
            let [dq, dk, dv] = heads;
            if self.coop.is_some() {
                // Views of one buffer: both passes in one dispatch.
                self.launch_both(g, dvec, [&dq, &dk, &dv], acc)?;
            } else {
                let target_of = |t: Tensor| Target::Direct { t, acc };
                self.launch_dq(g, dvec, &target_of(dq))?;
                self.launch_dkv(g, dvec, &target_of(dk), &target_of(dv))?;
            }
            match fresh {
                None => Ok(target),
                Some(fresh) => match out {
                    Out::New => Ok(fresh),
                    _ => launch_copy(&fresh, out),
                },
            }
        })
    }

    fn params(&self, g: &Tensor) -> AttentionParams {
        let s = self.q.shape();
        AttentionParams {
            batch: s[0] as u32,
            heads: s[1] as u32,
            t: s[2] as u32,
            d: s[3] as u32,
            scale: scale(s[3]),
            q: view(&self.q),
            k: view(&self.k),
            v: view(&self.v),
            o: view(&self.o),
            dout: view(g),
            ..Default::default()
        }
    }

    /// A backward kernel's bindings: its two outputs, q, k, v, dO, lse, and `aux` (O or D).
    fn bindings<'a>(
        &'a self,
        [out_a, out_b]: [&'a Tensor; 2],
        g: &'a Tensor,
        aux: &'a Tensor,
    ) -> [&'a Storage; 8] {
        [
            out_a.storage(),
            out_b.storage(),
            self.q.storage(),
            self.k.storage(),
            self.v.storage(),
            g.storage(),
            self.lse.storage(),
            aux.storage(),
        ]
    }

    /// dQ into `dq`, and D into `dvec` (f32 kernels).
    fn launch_dq(&self, g: &Tensor, dvec: &Tensor, dq: &Target<'_>) -> Result<()> {
        let (out, acc) = dq.kernel_out();
        let params = AttentionParams {
            dq: view(out),
            ..self.params(g)
        };
        let storage = self.bindings([out, dvec], g, &self.o);
        dispatch(
            Pass::Dq,
            &self.q,
            &params,
            &storage,
            acc,
            false,
            None,
            Io::F32,
        )
    }

    /// dQ, dK and dV (views of one buffer) from one dispatch of the cooperative-matrix
    /// kernels' `ATTN_COOP_BWD`, its dQ and dK/dV workgroups side by side; `acc` adds into
    /// all three.
    fn launch_both(
        &self,
        g: &Tensor,
        dvec: &Tensor,
        [dq, dk, dv]: [&Tensor; 3],
        acc: bool,
    ) -> Result<()> {
        let coop = self
            .coop
            .expect("launch_both is for the cooperative-matrix kernels");
        debug_assert!(dq.same_storage(dk) && dk.same_storage(dv));
        let s = self.q.shape();
        let dmax = head_dim_bucket(&self.q)?;
        let device = self.q.device();
        let t = coop_tile(device, Pass::Dkv, dmax, coop).ok_or_else(|| Error::InvalidArgument {
            op: OP,
            reason: "no cooperative-matrix attention tile fits (checked by the forward)".into(),
        })?;
        let params = AttentionParams {
            dq: view(dq),
            dk: view(dk),
            dv: view(dv),
            ..self.params(g)
        };
        // D = rowsum(dO * O) first: both passes read it.
        device.record(
            &attention_coop::ATTN_D,
            &attention_coop::d_spec(g.dtype(), self.o.dtype()),
            &params,
            &[dvec.storage(), g.storage(), self.o.storage()],
            device.grid(attention_coop::d_workgroups(s[0] * s[1] * s[2])),
        );
        let storage = self.bindings([dq, dv], g, dvec);
        // Each pass's blocks of T, interleaved (x = 2 i + pass), over b * H + h.
        let blocks = s[2].div_ceil(t.rows(coop) as usize);
        let groups = [2 * blocks, s[0] * s[1]];
        let max = device.gpu().limits.max_compute_workgroups_per_dimension as usize;
        if let Some(&count) = groups.iter().find(|&&n| n > max) {
            return Err(Error::TooManyWorkgroups {
                what: format!("{OP} backward over q of shape {s:?}"),
                count: count as u64,
                limit: max as u64,
            });
        }
        let io = Io {
            input: self.q.dtype(),
            grad: g.dtype(),
            out: dq.dtype(),
        };
        device.record(
            &attention_coop::ATTN_COOP_BWD,
            &coop_spec(device, Pass::Dkv, (t, coop), (acc, acc), io),
            &params,
            &storage,
            [groups[0] as u32, groups[1] as u32, 1],
        );
        Ok(())
    }

    /// dK into `dk` and dV into `dv` (f32 kernels); needs D from `launch_dq`.
    fn launch_dkv(
        &self,
        g: &Tensor,
        dvec: &Tensor,
        dk: &Target<'_>,
        dv: &Target<'_>,
    ) -> Result<()> {
        let ((dk, acc_k), (dv, acc_v)) = (dk.kernel_out(), dv.kernel_out());
        let params = AttentionParams {
            dk: view(dk),
            dv: view(dv),
            ..self.params(g)
        };
        let storage = self.bindings([dk, dv], g, dvec);
        dispatch(
            Pass::Dkv,
            &self.q,
            &params,
            &storage,
            acc_k,
            acc_v,
            None, // the f32 kernels (the cooperative-matrix backward is `launch_both`)
            Io::F32,
        )
    }
}

/// Where a gradient kernel writes: straight into the target, or (a target that is not unit
/// stride along D, or shares storage with a tensor the kernel reads) into a new tensor that
/// `finish` then copies or adds into the target.
enum Target<'a> {
    Direct { t: Tensor, acc: bool },
    Staged { fresh: Tensor, out: Out<'a> },
}

impl<'a> Target<'a> {
    fn new(
        out: Out<'a>,
        shape: &[usize],
        device: &Device,
        reads: &[&Tensor],
    ) -> Result<Target<'a>> {
        // Aliasing the reads is not an error here: such a target is staged.
        let (t, acc) = out.resolve(OP, device, shape, &[])?;
        if !unit_d_stride(&t) || reads.iter().any(|r| r.same_storage(&t)) {
            return Target::staged(out, shape, device);
        }
        Ok(Target::Direct { t, acc })
    }

    fn staged(out: Out<'a>, shape: &[usize], device: &Device) -> Result<Target<'a>> {
        Ok(Target::Staged {
            fresh: Tensor::uninit(device, shape, DType::F32, OP)?,
            out,
        })
    }

    /// A new tensor for an output nobody needs.
    fn scratch(shape: &[usize], device: &Device) -> Result<Target<'static>> {
        Ok(Target::Direct {
            t: Tensor::uninit(device, shape, DType::F32, OP)?,
            acc: false,
        })
    }

    /// The tensor the kernel writes, and whether it adds into it.
    fn kernel_out(&self) -> (&Tensor, bool) {
        match self {
            Target::Direct { t, acc } => (t, *acc),
            Target::Staged { fresh, .. } => (fresh, false),
        }
    }

    /// The gradient as `put_with` expects it (a staged one copied into its target first).
    fn finish(self) -> Result<Tensor> {
        match self {
            Target::Direct { t, .. } => Ok(t),
            Target::Staged { fresh, out } => match out {
                Out::New => Ok(fresh),
                _ => launch_copy(&fresh, out),
            },
        }
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

/// q, k and v of a fused (B, T, 3 * H * D) tensor (any strides) as (B, H, T, D) views of its
/// storage: its last dim split into (3, H, D).
fn heads_of(qkv: &Tensor, heads: usize) -> Result<[Tensor; 3]> {
    let l = qkv.layout();
    let (b, t, c3) = (l.shape[0], l.shape[1], l.shape[2]);
    let (c, d, sc) = (c3 / 3, c3 / (3 * heads), l.strides[2]);
    let split = qkv.with_layout(Layout {
        shape: vec![b, t, 3, heads, d],
        strides: vec![l.strides[0], l.strides[1], sc * c, sc * d, sc],
        offset: l.offset,
    });
    let head = |k: usize| split.narrow(2, k, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3]);
    Ok([head(0)?, head(1)?, head(2)?])
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

/// The (B, H, T, D) shape shared by q, k and v, whose element type is q's: f32, or (where
/// `half` allows) f16.
fn check_shapes(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    op: &'static str,
    half: bool,
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
    for (name, t) in [("k", k), ("v", v)] {
        if t.shape() != q.shape() {
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
/// adapter has them, a tile fits, and the inputs are `aligned4`.
fn coop_for(q: &Tensor, k: &Tensor, v: &Tensor) -> Option<Coop> {
    if !autocast_enabled() || ![q, k, v].into_iter().all(aligned4) {
        return None;
    }
    let coop = Coop::available(q.device().gpu())?;
    let dmax = attention::head_dim_bucket(q.shape()[3])?;
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

/// Records `pass` over every block of q's (B, H, T, D): workgroups (blocks of T, B * H); on
/// the cooperative-matrix kernels when `coop` (the forward only: their backward runs both
/// passes in one dispatch, `launch_both`), their bindings of `io`'s types (the f32 kernels
/// bind f32 alone).
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
    let groups = [s[2].div_ceil(block as usize), s[0] * s[1]];
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
    pub fn causal_self_attention(&self, heads: usize) -> Result<Tensor> {
        let s = self.shape();
        if self.rank() != 3 || heads == 0 || !s[2].is_multiple_of(3 * heads) {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("a fused qkv input (B, T, 3 x {heads} heads x D)"),
                got: s.to_vec(),
            });
        }
        let [q, k, v] = heads_of(&self.detach(), heads)?;
        let (out, state) = attention_forward(&q, &k, &v, true)?;
        Ok(record(out, &[self], || CausalAttentionBackward {
            fused_qkv: true,
            ..state
        }))
    }

    fn causal_attention_as(&self, k: &Tensor, v: &Tensor, merged: bool) -> Result<Tensor> {
        let (out, state) = attention_forward(self, k, v, merged)?;
        Ok(record(out, &[self, k, v], || state))
    }

    /// The same function as `causal_attention` from unfused ops (matmul, a where-mask,
    /// softmax, matmul), materializing the (B, H, T, T) probabilities; its gradients come from
    /// those ops' backward rules. The definition the fused kernels are tested against.
    pub fn causal_attention_reference(&self, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        const REF: &str = "causal_attention_reference";
        let [_, _, t, d] = check_shapes(self, k, v, REF, false)?;
        let s = self.matmul(&k.t()?)?.mul_scalar(scale(d))?;
        let keep: Vec<f32> = (0..t * t)
            .map(|e| if e % t <= e / t { 1.0 } else { 0.0 })
            .collect();
        let keep = Tensor::from_slice(self.device(), &keep, &[t, t])?;
        let masked = Tensor::full(self.device(), &[1], f32::NEG_INFINITY)?;
        Tensor::where_cond(&keep, &s, &masked)?.softmax()?.matmul(v)
    }
}

/// The forward of `causal_attention` (merged: O as (B, T, H * D)) and what its backward saves.
fn attention_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    merged: bool,
) -> Result<(Tensor, CausalAttentionBackward)> {
    let [b, h, t, d] = check_shapes(q, k, v, OP, true)?;
    if d == 0 || d > MAX_HEAD_DIM {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: format!("a head dim (last axis) of 1 to {MAX_HEAD_DIM}"),
            got: q.shape().to_vec(),
        });
    }
    let (mut q, mut kd, mut vd) = (unit_d(q)?, unit_d(k)?, unit_d(v)?);
    let coop = coop_for(&q, &kd, &vd);
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
            q: view(&q),
            k: view(&kd),
            v: view(&vd),
            o: view(&o),
            ..Default::default()
        };
        let storage = [
            o.storage(),
            lse.storage(),
            q.storage(),
            kd.storage(),
            vd.storage(),
        ];
        dispatch(Pass::Forward, &q, &params, &storage, false, false, coop, io)?;
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
        },
    ))
}
