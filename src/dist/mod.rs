//! Data-parallel training: one process per GPU, each with the whole model, its own shard of
//! every batch and the averaged gradient. A `Collective` is how the processes talk (MPI's
//! `MpiWorld` with `--features mpi`; a later NCCL path implements the same trait); the rest
//! of this module is what the trainer does with one, on host buffers:
//!
//! - `broadcast_weights`: rank 0's parameters to every rank, once, before the first step;
//! - `GradientReducer::average`: after each step's backward, before the optimizer, every
//!   parameter chunk's gradient read back to the host, summed over the ranks in one allreduce
//!   (with the step's loss in the same buffer), divided by the world size and written back.
//!   Every rank then holds the same bits, so every rank's optimizer makes the same update and
//!   the weights stay bitwise identical with no further traffic. Under mixed precision an
//!   overflow on any rank makes the sum non-finite on all of them, so every rank's optimizer
//!   skips the same step (the loss-scale decision is agreed without a message of its own);
//! - `weights_agree`: a check that the ranks' weights are still the same bits.
//!
//! Host staging costs a read-back and an upload of every gradient a step: correctness first;
//! buckets overlapping the backward, and device-memory reduction, are later work (DESIGN.md).

#[cfg(feature = "mpi")]
pub mod mpi;

use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::nn::Parameters;

/// The processes of one data-parallel run and the collectives they take part in. Every rank
/// calls the same collectives in the same order; a call returns once all have made it.
pub trait Collective {
    /// This process's rank, 0..world_size.
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// `buf` of rank `root` into every rank's `buf` (the same length on every rank).
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()>;
    /// Every rank's `buf` summed elementwise into every rank's `buf`, in place; every rank
    /// gets the same bits.
    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()>;
    /// Whether any rank's `flag` is set (a stop, a failed check).
    fn any(&self, flag: bool) -> Result<bool>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
    /// Ends every rank of the run (after this rank failed with `reason`, so the others do not
    /// wait for it). Does not return.
    fn abort(&self, reason: &str) -> !;
}

/// An error of this rank, naming it.
pub fn error(c: &dyn Collective, reason: impl Into<String>) -> Error {
    Error::Distributed {
        rank: c.rank(),
        world: c.world_size(),
        reason: reason.into(),
    }
}

/// Rank 0's parameters into every rank's (before the first step: fresh weights of the same
/// seed already agree, a loaded model read on every rank should; this makes sure). The f16
/// copies of a mixed-precision model are refreshed from them.
pub fn broadcast_weights(c: &dyn Collective, params: &Parameters) -> Result<()> {
    for chunk in &params.chunks {
        let mut host = chunk.data.to_vec()?;
        c.broadcast(&mut host, 0)?;
        chunk.data.copy_from_slice(&host)?;
    }
    params.refresh_half()
}

/// FNV-1a of every parameter chunk's bits, in chunk order.
pub fn weights_fingerprint(params: &Parameters) -> Result<u64> {
    let mut hash = crate::model::FNV_OFFSET;
    for chunk in &params.chunks {
        let host = chunk.data.to_vec()?;
        hash = crate::model::fnv1a64(hash, bytemuck::cast_slice(&host));
    }
    Ok(hash)
}

/// Whether every rank's weights are rank 0's, bit for bit: each rank's fingerprint against
/// rank 0's (broadcast as four 16-bit pieces, exact in f32), then agreed by all. An error
/// naming this rank's and rank 0's fingerprints where they differ.
pub fn weights_agree(c: &dyn Collective, params: &Parameters, step: usize) -> Result<()> {
    let mine = weights_fingerprint(params)?;
    let mut root: Vec<f32> = (0..4)
        .map(|i| ((mine >> (16 * i)) & 0xffff) as f32)
        .collect();
    c.broadcast(&mut root, 0)?;
    let root = root
        .iter()
        .enumerate()
        .fold(0u64, |h, (i, &p)| h | ((p as u64) << (16 * i)));
    if c.any(root != mine)? {
        return Err(error(
            c,
            format!(
                "the ranks' weights differ after step {step} (this rank's fingerprint \
                 {mine:016x}, rank 0's {root:016x}): the gradient reduction did not give every \
                 rank the same bits"
            ),
        ));
    }
    Ok(())
}

/// Averages gradients (and the step's loss) over the ranks through host buffers.
pub struct GradientReducer {
    /// Every chunk's gradient, then the loss: one allreduce a step. Kept between steps (no
    /// allocation after the first).
    staging: Vec<f32>,
}

impl Default for GradientReducer {
    fn default() -> Self {
        GradientReducer::new()
    }
}

impl GradientReducer {
    pub fn new() -> GradientReducer {
        GradientReducer {
            staging: Vec::new(),
        }
    }

    /// Replaces every gradient chunk of `params` by its mean over the ranks and returns the
    /// mean of `loss` (a scalar, this rank's step loss) over the ranks, as a new scalar tensor.
    /// Waits for this rank's step so far (the read-back), then for every rank (the allreduce).
    pub fn average(
        &mut self,
        c: &dyn Collective,
        params: &Parameters,
        loss: &Tensor,
    ) -> Result<Tensor> {
        // Gradients no backward wrote hold stale values until the optimizer zeroes them; zero
        // them now so none travels (every rank leaves the same ones unwritten, so the sum is
        // zero there and the optimizer's own zeroing changes nothing).
        params.zero_unwritten_grads()?;
        self.staging.clear();
        for chunk in &params.chunks {
            self.staging.extend(chunk.grad.to_vec()?);
        }
        let loss_host = loss.to_vec()?;
        if loss_host.len() != 1 {
            return Err(Error::InvalidArgument {
                op: "GradientReducer::average",
                reason: format!("the loss has {} elements, not 1", loss_host.len()),
            });
        }
        self.staging.push(loss_host[0]);
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
        Tensor::from_slice(params.device(), &self.staging[at..], &[])
    }
}

/// Rows `rank * per_rank .. (rank + 1) * per_rank` of a global batch of `world * per_rank`
/// rows, each `row_len` long: this rank's shard.
pub fn shard_rows<T: Copy>(
    global: &[T],
    row_len: usize,
    rank: usize,
    per_rank: usize,
) -> Result<&[T]> {
    let (start, end) = (rank * per_rank * row_len, (rank + 1) * per_rank * row_len);
    global
        .get(start..end)
        .ok_or_else(|| Error::InvalidArgument {
            op: "shard_rows",
            reason: format!(
            "rank {rank}'s {per_rank} rows of {row_len} lie past the global batch's {} elements",
            global.len()
        ),
        })
}

#[cfg(test)]
mod tests;
