//! AdamW (decoupled weight decay, PyTorch's formulation) with optional global gradient-norm
//! clipping. A step is: the squared norm of all gradients reduced on the GPU (stage 1 per
//! chunk into one partials buffer, stage 2 into a scalar), then one fused AdamW dispatch per
//! parameter chunk that reads that scalar itself: no host round-trip. Moments are allocated
//! once; gradients are marked zero afterwards (no dispatch).
//!
//! Mixed precision (`enable_loss_scaling`, with the parameters' f16 copies on): the loss is
//! seeded with the loss scale (`loss_seed`), so every gradient arrives scaled; the norm is
//! always reduced, an overflow (inf or NaN in any gradient) shows as a non-finite norm, and
//! the update kernel then skips the step; one more dispatch halves the scale after an overflow
//! and doubles it after `growth_interval` clean steps. The scale lives on the GPU: no host
//! sync per step.

use crate::error::{Error, Result};
use crate::graph::{Phase, Tensor};
use crate::kernels::adamw::{self, AdamWParams};
use crate::kernels::loss_scale::{self, LossScaleParams};
use crate::kernels::pack8;
use crate::kernels::reduce::{self, ReduceOp, ReduceParams};
use crate::nn::Parameters;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub betas: (f32, f32),
    pub eps: f32,
    pub weight_decay: f32,
    /// Clip the global gradient norm to this (None: no clipping).
    pub max_grad_norm: Option<f32>,
}

impl Default for AdamWConfig {
    /// PyTorch's AdamW defaults.
    fn default() -> Self {
        AdamWConfig {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: None,
        }
    }
}

/// Dynamic loss scaling (PyTorch's GradScaler defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaleConfig {
    pub init_scale: f32,
    /// Clean steps before the scale grows.
    pub growth_interval: u32,
    pub growth: f32,
    /// Factor after an overflow.
    pub backoff: f32,
    pub max_scale: f32,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        LossScaleConfig {
            init_scale: 65536.0,
            growth_interval: 2000,
            growth: 2.0,
            backoff: 0.5,
            max_scale: 16_777_216.0,
        }
    }
}

/// Where the loss scale stands (read back from the GPU).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaleState {
    pub scale: f32,
    /// Steps applied (not skipped) so far.
    pub applied_steps: u64,
    /// Steps skipped on an overflow so far.
    pub skipped_steps: u64,
}

/// Lanes of the norm's stage 1 fold this many elements each before another partial pays off.
const ELEMENTS_PER_LANE: u64 = 8;
/// Stage-1 workgroups per chunk at most (stage 2 folds all partials in one workgroup): enough
/// to fill a large GPU (64 left a DistilGPT-2 chunk of 82M gradients at 1.3 ms on an H200,
/// 0.25 TB/s; 2,048 workgroups of 256 lanes fold about 160 elements a lane there).
const MAX_PARTIALS_PER_CHUNK: u64 = 2048;

pub struct AdamW {
    config: AdamWConfig,
    step: u64,
    /// (m, v) per chunk, same layout as the chunk.
    moments: Vec<(Tensor, Tensor)>,
    /// Stage-1 partial sums of squares, per chunk at its offset.
    partials: Tensor,
    partial_groups: Vec<(u32, u32)>, // (offset, groups) per chunk
    /// The global squared gradient norm of the last step, shape [1].
    norm_sq: Tensor,
    /// Mixed precision: the loss-scale state [scale, clean steps, applied, skipped].
    scaler: Option<(LossScaleConfig, Tensor)>,
}

impl AdamW {
    pub fn new(params: &Parameters, config: AdamWConfig) -> Result<AdamW> {
        let dev = params.device();
        let mut moments = Vec::new();
        let mut partial_groups = Vec::new();
        let mut total = 0u32;
        for c in &params.chunks {
            moments.push((
                Tensor::zeros(dev, &[c.numel])?,
                Tensor::zeros(dev, &[c.numel])?,
            ));
            let groups = (c.numel as u64)
                .div_ceil(reduce::WORKGROUP * ELEMENTS_PER_LANE)
                .clamp(1, MAX_PARTIALS_PER_CHUNK) as u32;
            partial_groups.push((total, groups));
            total += groups;
        }
        Ok(AdamW {
            config,
            step: 0,
            moments,
            partials: Tensor::zeros(dev, &[total as usize])?,
            partial_groups,
            norm_sq: Tensor::zeros(dev, &[1])?,
            scaler: None,
        })
    }

    /// Turns on dynamic loss scaling (the mixed-precision step; the parameters need their
    /// f16 copies, `Parameters::enable_half`).
    pub fn enable_loss_scaling(
        &mut self,
        params: &Parameters,
        config: LossScaleConfig,
    ) -> Result<()> {
        if params.chunks.iter().any(|c| c.half.is_none()) {
            return Err(Error::InvalidArgument {
                op: "AdamW loss scaling",
                reason: "the parameters have no f16 copies (Parameters::enable_half first)".into(),
            });
        }
        let state = Tensor::from_slice(params.device(), &[config.init_scale, 0.0, 0.0, 0.0], &[4])?;
        self.scaler = Some((config, state));
        Ok(())
    }

    /// The seed of a loss's backward: `factor` (e.g. 1 / micro-batches) times the loss scale
    /// when scaling is on, read on the GPU (one dispatch either way).
    pub fn loss_seed(&self, factor: f32) -> Result<Tensor> {
        match &self.scaler {
            Some((_, state)) => state.narrow(0, 0, 1)?.reshape(&[])?.mul_scalar(factor),
            None => Tensor::full(self.norm_sq.device(), &[], factor),
        }
    }

    /// The loss-scale state tensor [scale, clean steps, applied, skipped] (checkpoints save it).
    pub(crate) fn loss_scale_tensor(&self) -> Option<&Tensor> {
        self.scaler.as_ref().map(|(_, t)| t)
    }

    /// Where the loss scale stands; None without scaling. Reads back (a host sync).
    pub fn loss_scale(&self) -> Result<Option<LossScaleState>> {
        let Some((_, t)) = &self.scaler else {
            return Ok(None);
        };
        let v = t.to_vec()?;
        Ok(Some(LossScaleState {
            scale: v[0],
            applied_steps: v[2] as u64,
            skipped_steps: v[3] as u64,
        }))
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The (m, v) moments per parameter chunk, each shaped like its chunk (checkpoints save
    /// them).
    pub(crate) fn moments(&self) -> &[(Tensor, Tensor)] {
        &self.moments
    }

    /// Restores the moments and the step count a checkpoint saved (the bias corrections
    /// continue from `steps`). The moments must match this optimizer's chunk sizes.
    pub(crate) fn restore(
        &mut self,
        moments: &[(Vec<f32>, Vec<f32>)],
        steps: u64,
        loss_scale: Option<&[f32]>,
    ) -> Result<()> {
        let built: Vec<usize> = self.moments.iter().map(|(m, _)| m.numel()).collect();
        let given: Vec<usize> = moments.iter().map(|(m, _)| m.len()).collect();
        let v_ok = moments.iter().all(|(m, v)| m.len() == v.len());
        if built != given || !v_ok {
            return Err(Error::InvalidArgument {
                op: "AdamW restore",
                reason: format!(
                    "the optimizer has chunks of {built:?} elements, the saved moments {given:?} \
                     (parameters are chunked by the max storage-binding size: resume where it \
                     is the saved run's, e.g. with WGRAD_MAX_BINDING lowering a larger one)"
                ),
            });
        }
        match (&self.scaler, loss_scale) {
            (Some((_, t)), Some(saved)) => t.copy_from_slice(saved)?,
            (None, None) => {}
            (Some(_), None) => {
                return Err(Error::InvalidArgument {
                    op: "AdamW restore",
                    reason: "this run scales the loss (mixed precision) but the checkpoint \
                             saved no loss-scale state"
                        .into(),
                })
            }
            (None, Some(_)) => {
                return Err(Error::InvalidArgument {
                    op: "AdamW restore",
                    reason: "the checkpoint is of a mixed-precision run (a loss-scale state) but \
                             this run is f32"
                        .into(),
                })
            }
        }
        for ((m, v), (hm, hv)) in self.moments.iter().zip(moments) {
            m.copy_from_slice(hm)?;
            v.copy_from_slice(hv)?;
        }
        self.step = steps;
        Ok(())
    }

    /// The squared global gradient norm the last step computed (before clipping), on the GPU;
    /// only filled when clipping is on.
    pub fn grad_norm_sq(&self) -> &Tensor {
        &self.norm_sq
    }

    /// One update of every parameter with learning rate `lr`; gradients are then marked zero.
    pub fn step(&mut self, params: &Parameters, lr: f32) -> Result<()> {
        let dev = params.device();
        let previous = dev.set_phase(Phase::Optimizer);
        let result = self.record_step(params, lr);
        dev.set_phase(previous);
        params.zero_grad();
        result
    }

    fn record_step(&mut self, params: &Parameters, lr: f32) -> Result<()> {
        let dev = params.device();
        let layout: Vec<usize> = params.chunks.iter().map(|c| c.numel).collect();
        let built: Vec<usize> = self.moments.iter().map(|(m, _)| m.numel()).collect();
        if layout != built {
            return Err(Error::InvalidArgument {
                op: "AdamW step",
                reason: format!(
                    "the optimizer was built for parameter chunks of {built:?} elements, this parameter set has {layout:?}"
                ),
            });
        }
        params.zero_unwritten_grads()?;
        self.step += 1;
        let c = self.config;
        if c.max_grad_norm.is_some() || self.scaler.is_some() {
            self.record_norm(params)?;
        }
        let t = self.step as i32;
        for (chunk, (m, v)) in params.chunks.iter().zip(&self.moments) {
            // The kernel updates a vec4 a lane; `Parameters` lays chunks out in 4s.
            if !(chunk.numel.is_multiple_of(4) && chunk.n_decay.is_multiple_of(4)) {
                return Err(Error::InvalidArgument {
                    op: "AdamW step",
                    reason: format!(
                        "a parameter chunk of {} elements ({} decayed) is not laid out in 4s",
                        chunk.numel, chunk.n_decay
                    ),
                });
            }
            let p = AdamWParams {
                numel: chunk.numel as u32,
                n_decay: chunk.n_decay as u32,
                lr,
                beta1: c.betas.0,
                beta2: c.betas.1,
                eps: c.eps,
                weight_decay: c.weight_decay,
                bc1: 1.0 - c.betas.0.powi(t),
                bc2: 1.0 - c.betas.1.powi(t),
                max_norm: c.max_grad_norm.unwrap_or(0.0),
                _pad: [0; 2],
            };
            let groups = dev
                .grid((chunk.numel as u64).div_ceil(adamw::WORKGROUP * adamw::ELEMENTS_PER_LANE));
            let mut storages = vec![
                chunk.data.storage(),
                m.storage(),
                v.storage(),
                chunk.grad.storage(),
                self.norm_sq.storage(),
            ];
            match (&self.scaler, &chunk.half) {
                (Some((_, state)), Some(half)) => {
                    storages.extend([state.storage(), half.storage()]);
                    dev.record(&adamw::ADAMW_AMP, &adamw::spec(true), &p, &storages, groups);
                }
                (Some(_), None) => unreachable!("enable_loss_scaling checked the f16 copies"),
                (None, _) => {
                    dev.record(&adamw::ADAMW, &adamw::spec(false), &p, &storages, groups);
                }
            }
        }
        if let Some((cfg, state)) = &self.scaler {
            let p = LossScaleParams {
                growth_interval: cfg.growth_interval,
                growth: cfg.growth,
                backoff: cfg.backoff,
                max_scale: cfg.max_scale,
            };
            dev.record(
                &loss_scale::LOSS_SCALE_UPDATE,
                &crate::kernels::Spec::new(),
                &p,
                &[state.storage(), self.norm_sq.storage()],
                [1, 1, 1],
            );
        }
        Ok(())
    }

    /// norm_sq = sum of squares of every gradient chunk, in two stages on the GPU.
    fn record_norm(&self, params: &Parameters) -> Result<()> {
        let dev = params.device();
        let squares = reduce::spec(ReduceOp::SumSquares, false);
        for (chunk, &(offset, groups)) in params.chunks.iter().zip(&self.partial_groups) {
            let stage1 = ReduceParams {
                out_numel: groups,
                rank: 1,
                scale: 1.0,
                n_groups: groups,
                numel: chunk.numel as u32,
                out_offset: offset,
                shape: pack8(&[chunk.numel]),
                strides: pack8(&[1]),
                ..Default::default()
            };
            let offset = chunk.grad.layout().offset;
            let stage1 = ReduceParams {
                in_offset: offset as u32,
                ..stage1
            };
            let kernel = if chunk.numel.is_multiple_of(4) && offset.is_multiple_of(4) {
                &reduce::REDUCE_PARTIAL_VEC4
            } else {
                &reduce::REDUCE_PARTIAL
            };
            dev.record(
                kernel,
                &squares,
                &stage1,
                &[self.partials.storage(), chunk.grad.storage()],
                [groups, 1, 1],
            );
        }
        let total = self.partials.numel();
        let stage2 = ReduceParams {
            out_numel: 1,
            red_numel: total as u32,
            red_rank: 1,
            scale: 1.0,
            red_shape: pack8(&[total]),
            red_strides: pack8(&[1]),
            ..Default::default()
        };
        dev.record(
            &reduce::REDUCE_DIMS,
            &reduce::spec(ReduceOp::Sum, false),
            &stage2,
            &[self.norm_sq.storage(), self.partials.storage()],
            [1, 1, 1],
        );
        Ok(())
    }
}
