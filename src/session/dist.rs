//! A session as one rank of a data-parallel run (`crate::dist`).

use std::rc::Rc;

use super::TrainSession;
use crate::dist::{Collective, Reduction};
use crate::error::Result;

impl TrainSession {
    /// Makes this session one rank of a data-parallel run over `collective`: rank 0's weights
    /// are broadcast to every rank, each step draws the global batch of `world_size` times
    /// `options.batch` sequences (the same stream as one process with that batch) and trains
    /// on this rank's rows of it, and the gradients and losses are averaged over the ranks
    /// by `reduction` (`Trainer::set_collective`). Rank 0 alone evaluates and saves (`run`). Every rank must
    /// join with the same options.
    pub fn join(
        &mut self,
        collective: Rc<dyn Collective>,
        reduction: Box<dyn Reduction>,
    ) -> Result<()> {
        let world = collective.world_size();
        crate::dist::broadcast_weights(collective.as_ref(), &self.trainer.model.params)?;
        let position = self.sampler.position();
        self.sampler = self.data.train_batches(
            self.options.batch * world,
            self.options.seq,
            self.options.seed,
        )?;
        self.sampler.set_position(position)?;
        self.trainer.set_collective(collective, reduction)?;
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
