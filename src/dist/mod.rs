//! Data-parallel training: one process per GPU, each with the whole model, its own shard of
//! every batch and the averaged gradient. A `Collective` is how the processes talk (MPI's
//! `MpiWorld` with `--features mpi`, started by `launch`); a `Reduction` is how a step's
//! gradients become the ranks' mean, one of two chosen at run time (`reduction`):
//!
//! | reduction | where the gradients travel | adapters |
//! | --- | --- | --- |
//! | `host::HostReduction` | read back to the host, MPI's allreduce, written back | any, any number of hosts |
//! | `nccl::NcclReduction` (`--features nccl`) | a Vulkan buffer CUDA maps, NCCL's allreduce | NVIDIA under Vulkan |
//!
//! Either gives every rank the same bits, so every rank's optimizer makes the same update
//! and the weights stay bitwise identical with no further traffic; under mixed precision an
//! overflow on any rank makes the mean non-finite on all of them, so every rank's optimizer
//! skips the same step (the loss-scale decision is agreed without a message of its own).
//! Besides: `broadcast_weights` (rank 0's parameters to every rank, once), `weights_agree`
//! (a check that the ranks' weights are still the same bits) and `shard_rows`.

mod host;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "nccl")]
mod vulkan_export;

use std::rc::Rc;
use std::time::Duration;

use crate::config::Options;
use crate::error::{Error, Result};
use crate::graph::{Device, Tensor};
use crate::nn::Parameters;

pub use host::HostReduction;

/// The processes of one data-parallel run and the collectives they take part in. Every rank
/// calls the same collectives in the same order; a call returns once all have made it.
pub trait Collective {
    /// This process's rank, 0..world_size.
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// `buf` of rank `root` into every rank's `buf` (the same length on every rank).
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()>;
    /// `buf` of rank `root` into every rank's `buf`, bytes (an identifier NCCL's ranks share).
    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<()>;
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

/// How a step's gradients become the ranks' mean (`host::HostReduction` or, on NVIDIA GPUs,
/// `nccl::NcclReduction`).
pub trait Reduction {
    /// The ranks it averages over.
    fn collective(&self) -> &Rc<dyn Collective>;
    /// What the run's header says of it: the library and where the gradients travel.
    fn describe(&self) -> String;
    /// Places the gradients where this reduction reads them (NCCL: in exported buffers),
    /// once, before the first step.
    fn attach(&mut self, params: &mut Parameters) -> Result<()> {
        let _ = params;
        Ok(())
    }
    /// Replaces every gradient chunk of `params` by its mean over the ranks and returns the
    /// mean over the ranks of `loss` (a scalar, this rank's step loss), as a new scalar
    /// tensor: the work that reads them may be recorded at once, and is submitted after
    /// `finish`. Waits for this rank's step so far.
    fn average(&mut self, params: &Parameters, loss: &Tensor) -> Result<Tensor>;
    /// Waits for what `average` left running (NCCL's allreduce, which the work recorded since
    /// reads), once that work (the optimizer's) is recorded and before it is submitted.
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
    /// How long the last reduction took once this rank's backward had finished: the staging
    /// (host) or the allreduce (NCCL), each waiting for the slowest rank.
    fn last_time(&self) -> Duration;
}

/// An error unless `loss` is one f32, as `Reduction::average` takes it.
fn check_loss(loss: &Tensor) -> Result<()> {
    if loss.dtype() != crate::graph::DType::F32 || loss.numel() != 1 {
        return Err(Error::InvalidArgument {
            op: "Reduction::average",
            reason: format!(
                "the loss is {:?} of {} elements, not one f32",
                loss.dtype(),
                loss.numel()
            ),
        });
    }
    Ok(())
}

/// Which reduction a run asks for (`--reduce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReduceChoice {
    /// NCCL where this build has it and the adapter is an NVIDIA GPU under Vulkan, else host.
    #[default]
    Auto,
    /// `HostReduction`: MPI over host buffers, on any adapter.
    Host,
    /// `NcclReduction`: an error where it cannot run.
    Nccl,
}

/// The ranks an MPI launcher started, if one did (None: a run of one process, which never
/// initializes MPI). A build without the `mpi` feature refuses several ranks: each would
/// train alone and write over the others.
pub fn launch(options: &Options) -> Result<Option<Rc<dyn Collective>>> {
    #[cfg(feature = "mpi")]
    {
        let world = mpi::MpiWorld::from_launcher(&options.dist)?;
        Ok(world.map(|w| Rc::new(w) as Rc<dyn Collective>))
    }
    #[cfg(not(feature = "mpi"))]
    match options.dist.launcher_world_size {
        Some(n) if n > 1 => Err(Error::InvalidArgument {
            op: "mpirun",
            reason: format!(
                "an MPI launcher started {n} ranks, but this wgrad was built without the `mpi` \
                 feature, so each would train alone (build it with `--features mpi`)"
            ),
        }),
        _ => Ok(None),
    }
}

/// The reduction `choice` asks for over `world`, on `device`'s adapter. Every rank must ask
/// for the same; the ranks agree whether NCCL can run (on every rank, one GPU each) before
/// `Auto` takes it.
pub fn reduction(
    choice: ReduceChoice,
    world: &Rc<dyn Collective>,
    device: &Device,
) -> Result<Box<dyn Reduction>> {
    let host = || -> Result<Box<dyn Reduction>> { Ok(Box::new(HostReduction::new(world.clone()))) };
    if choice == ReduceChoice::Host {
        return host();
    }
    #[cfg(feature = "nccl")]
    {
        match nccl::agreed_unavailable(world.as_ref(), device)? {
            None => Ok(Box::new(nccl::NcclReduction::new(world.clone(), device)?)),
            Some(_) if choice == ReduceChoice::Auto => host(),
            Some(why) => Err(error(world.as_ref(), format!("--reduce nccl: {why}"))),
        }
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = device;
        match choice {
            ReduceChoice::Nccl => Err(error(
                world.as_ref(),
                "--reduce nccl: this wgrad was built without the `nccl` feature (build it with \
                 `--features nccl`)",
            )),
            _ => host(),
        }
    }
}
