//! AdamW (decoupled weight decay, PyTorch's formulation) with optional global gradient-norm
//! clipping. A step is: the squared norm of all gradients reduced on the GPU (stage 1 per
//! chunk into one partials buffer, stage 2 into a scalar), then one fused AdamW dispatch per
//! parameter chunk that reads that scalar itself: no host round-trip. Moments are allocated
//! once; gradients are marked zero afterwards (no dispatch).

use crate::error::{Error, Result};
use crate::graph::{Phase, Tensor};
use crate::kernels::adamw::{self, AdamWParams};
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

/// Lanes of the norm's stage 1 fold this many elements each before another partial pays off.
const ELEMENTS_PER_LANE: u64 = 8;
/// Stage-1 workgroups per chunk at most (stage 2 folds all partials in one workgroup).
const MAX_PARTIALS_PER_CHUNK: u64 = 64;

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
        })
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
    pub(crate) fn restore(&mut self, moments: &[(Vec<f32>, Vec<f32>)], steps: u64) -> Result<()> {
        let built: Vec<usize> = self.moments.iter().map(|(m, _)| m.numel()).collect();
        let given: Vec<usize> = moments.iter().map(|(m, _)| m.len()).collect();
        let v_ok = moments.iter().all(|(m, v)| m.len() == v.len());
        if built != given || !v_ok {
            return Err(Error::InvalidArgument {
                op: "AdamW restore",
                reason: format!(
                    "the optimizer has chunks of {built:?} elements, the saved moments {given:?}"
                ),
            });
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
        if c.max_grad_norm.is_some() {
            self.record_norm(params)?;
        }
        let t = self.step as i32;
        for (chunk, (m, v)) in params.chunks.iter().zip(&self.moments) {
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
            let groups = dev.grid((chunk.numel as u64).div_ceil(adamw::WORKGROUP));
            dev.record(
                &adamw::ADAMW,
                &crate::kernels::Spec::new(),
                &p,
                &[
                    chunk.data.storage(),
                    m.storage(),
                    v.storage(),
                    chunk.grad.storage(),
                    self.norm_sq.storage(),
                ],
                groups,
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
            dev.record(
                &reduce::REDUCE_PARTIAL,
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
