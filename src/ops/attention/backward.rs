//! The causal attention's backward: D = rowsum(dO * O) and the dQ, dK, dV passes (two f32
//! dispatches, or one cooperative-matrix dispatch of both), into the gradients' targets
//! directly where their views allow (a fused qkv input's thirds), else through a staged copy.

use super::*;

/// Saved by the forward: its (unit-D-stride) inputs, its output and the row statistics.
pub(super) struct CausalAttentionBackward {
    pub(super) q: Tensor,   // (B, H, T, D)
    pub(super) k: Tensor,   // (B, Hkv, T, D), Hkv = H except under `causal_self_attention_at`
    pub(super) v: Tensor,   // (B, Hkv, T, D)
    pub(super) o: Tensor,   // (B, H, T, D)
    pub(super) lse: Tensor, // (B, H, T), contiguous
    /// The forward ran on cooperative matrices (an autocast forward): so does the backward.
    pub(super) coop: Option<Coop>,
    /// The output was (B, T, H * D) (`causal_attention_merged`): so is its gradient.
    pub(super) merged: bool,
    /// q, k and v were the heads of one packed (B, T, (H + 2 Hkv) D) input
    /// (`causal_self_attention_at`): dQ, dK and dV are written into its gradient's parts.
    pub(super) fused_qkv: bool,
    /// The forward rotated q and k: the backward rotates them alike, and dQ, dK back.
    pub(super) rope: Option<RopeAt>,
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

    /// dQ, dK, dV into the parts of the packed (B, T, (H + 2 Hkv) D) input's gradient: a new
    /// gradient is written whole by the kernels (no zeroed buffer to add into, as three
    /// separate views of it would need); one that cannot be viewed so, or shares storage with
    /// what the kernels read, is staged.
    fn backward_qkv(&self, g: &Tensor, dvec: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let [b, h, t, d] = [
            self.q.shape()[0],
            self.q.shape()[1],
            self.q.shape()[2],
            self.q.shape()[3],
        ];
        let hkv = self.k.shape()[1];
        let full = [b, t, (h + 2 * hkv) * d];
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
            let direct = match heads_of(&target, h, hkv) {
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
                    (heads_of(&fresh, h, hkv), false, Some(fresh))
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
            group: (s[1] / self.k.shape()[1]) as u32,
            start: self.rope.as_ref().map_or(0, |r| r.start as u32),
            q: view(&self.q),
            k: view(&self.k),
            v: view(&self.v),
            o: view(&self.o),
            dout: view(g),
            ..Default::default()
        }
    }

    /// A backward kernel's bindings: its two outputs, q, k, v, dO, lse, `aux` (O or D), and
    /// the rotary table (q where there is none).
    fn bindings<'a>(
        &'a self,
        [out_a, out_b]: [&'a Tensor; 2],
        g: &'a Tensor,
        aux: &'a Tensor,
    ) -> [&'a Storage; 9] {
        [
            out_a.storage(),
            out_b.storage(),
            self.q.storage(),
            self.k.storage(),
            self.v.storage(),
            g.storage(),
            self.lse.storage(),
            aux.storage(),
            self.rope
                .as_ref()
                .map_or(self.q.storage(), |r| r.table.storage()),
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
            self.rope.is_some(),
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
            &attention::with_rope(
                coop_spec(device, Pass::Dkv, (t, coop), (acc, acc), io),
                self.rope.is_some(),
            ),
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
            self.rope.is_some(),
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
