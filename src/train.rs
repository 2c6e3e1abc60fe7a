//! One training step of a GPT-2: forward, backward and the AdamW update recorded into the lazy
//! Segments with no host read-back in between (the loss comes back as a tensor; read it late).
//! Each phase is a tracing span (`forward`, `backward`, `optimizer`), so the profiler can time
//! it and nothing pays when no profiler is installed.

use std::rc::Rc;

use crate::dist::{broadcast_weights, Collective, Reduction};
use crate::error::{Error, Result};
use crate::graph::{Phase, Tensor};
use crate::memory::Reuse;
use crate::nn::Decoder;
use crate::optim::{AdamW, AdamWConfig, LossScaleConfig, LrSchedule};

/// The dispatches a step's first submit carries (`Device::submit_early`): about the
/// embeddings and a GPT-2 block, enough GPU work to cover the CPU recording and encoding the
/// rest of the forward (a forward dispatch costs the CPU about 8 us and an H200 25-250 us at
/// DistilGPT-2's 4x128 to 8x512), so the GPU starts within a few hundred microseconds of the
/// step instead of after the whole forward is recorded. A `lab` build's `WGRAD_FIRST_SUBMIT`
/// sets it.
const FIRST_SUBMIT_DISPATCHES: usize = 16;

pub struct Trainer {
    pub model: Decoder,
    pub opt: AdamW,
    pub schedule: LrSchedule,
    /// The peak learning rate.
    pub lr: f32,
    /// Optimizer steps taken.
    pub step: usize,
    /// Dispatches of a step's first submit (`FIRST_SUBMIT_DISPATCHES`).
    first_submit: usize,
    /// Data parallel: how each step's gradients (and loss) are averaged over the ranks
    /// (`dist`).
    reduction: Option<Box<dyn Reduction>>,
}

impl Trainer {
    /// A trainer for `model`; a model in mixed precision (`Decoder::set_amp`) gets dynamic loss
    /// scaling.
    pub fn new(
        model: Decoder,
        config: AdamWConfig,
        lr: f32,
        schedule: LrSchedule,
    ) -> Result<Trainer> {
        let mut opt = AdamW::new(&model.params, config)?;
        // Steps repeat: buffers made in the first serve every later one, and the dispatches
        // that write them do not wait for the ones before (`memory::Reuse`).
        model.params.device().set_pool_reuse(Reuse::REPEATING);
        if model.amp() {
            opt.enable_loss_scaling(&model.params, LossScaleConfig::default())?;
        }
        let first_submit = model
            .params
            .device()
            .options()
            .lab
            .first_submit()
            .unwrap_or(FIRST_SUBMIT_DISPATCHES);
        Ok(Trainer {
            model,
            opt,
            schedule,
            lr,
            step: 0,
            first_submit,
            reduction: None,
        })
    }

    /// Makes this trainer one rank of a data-parallel run: rank 0's weights are broadcast to
    /// every rank, the reduction places the gradients where it reads them
    /// (`Reduction::attach`), and each step's gradients and loss are averaged over the ranks
    /// by it before the update, so every rank steps with the same gradient.
    pub fn set_reduction(&mut self, mut reduction: Box<dyn Reduction>) -> Result<()> {
        broadcast_weights(reduction.collective().as_ref(), &self.model.params)?;
        reduction.attach(&mut self.model.params)?;
        self.reduction = Some(reduction);
        Ok(())
    }

    /// How this trainer averages gradients over the ranks, if it does.
    pub fn reduction(&self) -> Option<&dyn Reduction> {
        self.reduction.as_deref()
    }

    /// The ranks this trainer averages over, if any.
    pub fn collective(&self) -> Option<&Rc<dyn Collective>> {
        self.reduction.as_ref().map(|r| r.collective())
    }

    /// One optimizer step over `micro_batches` of (inputs, targets), each (B, T) u32: their
    /// gradients accumulate in place (each loss seeded with 1/n, times the loss scale under
    /// mixed precision), then one AdamW update at the scheduled rate (skipped on a gradient
    /// overflow). Returns the mean loss, still on the GPU. The first micro-batch's first
    /// `FIRST_SUBMIT_DISPATCHES` dispatches are submitted as soon as they are recorded, and each
    /// micro-batch's forward before its backward is recorded (a queue.submit each, one more
    /// for the rest: 3 a step for one micro-batch), where their pipelines have compiled (a
    /// cold step skips those of its early submits that would wait for a compile). With a
    /// reduction (`set_reduction`), the gradients and the loss are the ranks' means before the
    /// update (`dist::Reduction`).
    pub fn step(&mut self, micro_batches: &[(Tensor, Tensor)]) -> Result<Tensor> {
        if micro_batches.is_empty() {
            return Err(Error::InvalidArgument {
                op: "train step",
                reason: "no micro-batches".into(),
            });
        }
        let dev = self.model.params.device().clone();
        let n = micro_batches.len() as f32;
        let mut total: Option<Tensor> = None;
        dev.submit_early(self.first_submit);
        for (x, y) in micro_batches {
            dev.set_phase(Phase::Forward);
            let loss = {
                let _span = tracing::info_span!("forward").entered();
                self.model.loss(x, y)?
            };
            // The forward goes to the GPU now, and runs while the backward is recorded and
            // encoded (a step whose loss is read back would otherwise wait for all of it). In
            // a cold step whose pipelines are still compiling, the backward is recorded first,
            // so its variants compile beside the forward's.
            dev.flush_if_compiled();
            {
                let _span = tracing::info_span!("backward").entered();
                let seed = self.opt.loss_seed(1.0 / n)?;
                loss.backward_with(&seed)?;
            }
            let loss = loss.detach();
            total = Some(match total {
                None => loss,
                Some(t) => t.add(&loss)?,
            });
        }
        let total = total.expect("at least one micro-batch ran");
        let mean = |total: Tensor| {
            if micro_batches.len() == 1 {
                Ok(total)
            } else {
                total.mul_scalar(1.0 / n)
            }
        };
        // Data parallel: every rank's gradients and loss become the ranks' means here.
        let reduced = match &mut self.reduction {
            Some(reduction) => {
                // A span inside, once this rank's backward has finished ("gradient
                // reduction").
                let local = mean(total.clone())?;
                Some(reduction.average(&self.model.params, &local)?)
            }
            None => None,
        };
        let updated = {
            let _span = tracing::info_span!("optimizer").entered();
            let lr = self.schedule.lr_at(self.step, self.lr);
            self.opt.step(&self.model.params, lr)
        };
        let finished = match &mut self.reduction {
            // The update was recorded while the ranks' allreduce ran; it is submitted now
            // (and the allreduce waited for even when recording the update failed, so that
            // the device is not left holding its submits).
            Some(reduction) => reduction.finish(),
            None => Ok(()),
        };
        dev.set_phase(Phase::Forward);
        updated?;
        finished?;
        self.step += 1;
        match reduced {
            Some(reduced) => Ok(reduced),
            None => mean(total),
        }
    }
}
