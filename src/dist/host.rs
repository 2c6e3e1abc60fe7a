//! The host-staged reduction: every gradient read back to the host, summed over the ranks in
//! one MPI allreduce, divided by the world size and written back. Any adapter, any number of
//! hosts; costs a read-back and an upload of every gradient a step.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::{check_loss, Collective, Reduction};
use crate::error::Result;
use crate::graph::Tensor;
use crate::nn::Parameters;

/// Averages gradients (and the step's loss) over the ranks through host buffers.
pub struct HostReduction {
    collective: Rc<dyn Collective>,
    last: Duration,
    /// Every chunk's gradient, then the loss: one allreduce a step. Kept between steps (no
    /// allocation after the first).
    staging: Vec<f32>,
}

impl HostReduction {
    pub fn new(collective: Rc<dyn Collective>) -> HostReduction {
        HostReduction {
            collective,
            last: Duration::ZERO,
            staging: Vec::new(),
        }
    }
}

impl Reduction for HostReduction {
    fn collective(&self) -> &Rc<dyn Collective> {
        &self.collective
    }

    fn describe(&self) -> String {
        "MPI allreduce of the gradients staged through the host, f32".into()
    }

    fn average(&mut self, params: &Parameters, loss: &Tensor) -> Result<Tensor> {
        let c = self.collective.as_ref();
        check_loss(loss)?;
        // Gradients no backward wrote hold stale values until the optimizer zeroes them; zero
        // them now so none travels (every rank leaves the same ones unwritten, so the sum is
        // zero there and the optimizer's own zeroing changes nothing).
        params.zero_unwritten_grads()?;
        params.device().sync()?;
        let _span = tracing::info_span!("gradient reduction").entered();
        let start = Instant::now();
        self.staging.clear();
        for chunk in &params.chunks {
            self.staging.extend(chunk.grad.to_vec()?);
        }
        self.staging.push(loss.item()?);
        c.allreduce_sum(&mut self.staging)?;
        // The sum over ranks divided by their count: the gradient of the mean loss over the
        // global batch (every shard is the same number of sequences).
        let inv = 1.0 / c.world_size() as f32;
        self.staging.iter_mut().for_each(|g| *g *= inv);
        let mut at = 0;
        for chunk in &params.chunks {
            chunk
                .grad
                .copy_from_slice(&self.staging[at..at + chunk.numel])?;
            at += chunk.numel;
        }
        let mean = Tensor::from_slice(params.device(), &self.staging[at..], &[]);
        self.last = start.elapsed();
        mean
    }

    fn last_time(&self) -> Duration {
        self.last
    }
}
