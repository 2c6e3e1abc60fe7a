//! A session as one rank of a data-parallel run (`crate::dist`).

use super::TrainSession;
use crate::dist::Reduction;
use crate::error::Result;

impl TrainSession {
    /// Makes this session one rank of a data-parallel run over `reduction`'s ranks: rank 0's
    /// weights are broadcast to every rank, each step draws the global batch of `world_size`
    /// times `options.batch` sequences (the same stream as one process with that batch) and
    /// trains on this rank's rows of it, and the gradients and losses are averaged over the
    /// ranks by `reduction` (`Trainer::set_reduction`). Rank 0 alone evaluates and saves
    /// (`run`). Every rank must join with the same options.
    pub fn join(&mut self, reduction: Box<dyn Reduction>) -> Result<()> {
        let world = reduction.collective().world_size();
        let position = self.sampler.position();
        self.sampler = self.data.train_batches(
            self.options.batch * world,
            self.options.seq,
            self.options.seed,
        )?;
        self.sampler.set_position(position)?;
        self.trainer.set_reduction(reduction)?;
        Ok(())
    }

    /// The ranks training together (1 without `join`).
    pub fn world_size(&self) -> usize {
        self.trainer.collective().map_or(1, |c| c.world_size())
    }

    /// This process's rank (0 without `join`).
    pub fn rank(&self) -> usize {
        self.trainer.collective().map_or(0, |c| c.rank())
    }
}
