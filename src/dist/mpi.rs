//! `Collective` over MPI (the `mpi` crate, rsmpi): host buffers, any adapter, any number of
//! hosts, with Open MPI or MPICH. Every collective is started non-blocking and polled until
//! it completes or `DistOptions::timeout` passes; then this rank says which operation waited
//! too long and aborts the job (`MPI_Abort`), so a rank that died or hangs ends the others
//! with an error instead of leaving them waiting. (Open MPI's and MPICH's launchers also end
//! the job when a rank exits on an error or a signal; the bound covers a rank that hangs.)

use std::cell::RefCell;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::Collective;
use crate::config::DistOptions;
use crate::error::{Error, Result};

/// How long a waiting rank polls its request back to back (yielding the core between two
/// polls): Open MPI's non-blocking collectives progress only inside a poll, so sleeping
/// between polls slows a large allreduce (H200, 2026-11-28, DistilGPT-2's 328 MB between two
/// ranks: 1274 ms a step sleeping 50 us between polls, 549 polling back to back). Longer
/// than the largest preset's allreduce takes.
const SPIN: Duration = Duration::from_secs(5);

/// How long a rank that has waited past `SPIN` sleeps between two polls (a rank waiting for
/// rank 0's save or evaluation leaves the cores to others).
const POLL_INTERVAL: Duration = Duration::from_micros(50);

/// MPI's world of processes, initialized once for the process (finalized when dropped).
pub struct MpiWorld {
    world: SimpleCommunicator,
    timeout: Duration,
    /// The allreduce's send copy (rsmpi has no in-place allreduce), kept between steps.
    send: RefCell<Vec<f32>>,
    /// Declared last: MPI is finalized after the communicator is let go.
    _universe: Universe,
}

impl MpiWorld {
    /// MPI's world when an MPI launcher started this process (`options.launcher_world_size`),
    /// else None: a run of one process, which never initializes MPI.
    pub fn from_launcher(options: &DistOptions) -> Result<Option<MpiWorld>> {
        let Some(expected) = options.launcher_world_size else {
            return Ok(None);
        };
        let universe = mpi::initialize().ok_or_else(|| Error::Distributed {
            rank: 0,
            world: expected,
            reason: "MPI was already initialized in this process".into(),
        })?;
        let world = universe.world();
        let size = world.size() as usize;
        if size != expected {
            return Err(Error::Distributed {
                rank: world.rank() as usize,
                world: size,
                reason: format!(
                    "the launcher's environment says {expected} ranks, MPI's world has {size} \
                     (a wgrad built against another MPI than the launcher's mpirun?)"
                ),
            });
        }
        Ok(Some(MpiWorld {
            world,
            timeout: options.timeout,
            send: RefCell::new(Vec::new()),
            _universe: universe,
        }))
    }

    /// Polls `request` until it completes, or aborts the job naming `what` once `timeout` has
    /// passed.
    fn wait<'a, D: ?Sized, S: Scope<'a>>(&self, mut request: Request<'a, D, S>, what: &str) {
        let start = Instant::now();
        loop {
            match request.test() {
                Ok(_) => return,
                Err(pending) => request = pending,
            }
            if start.elapsed() > self.timeout {
                // The request cannot be completed or freed while another rank may still
                // write into its buffer: end the job from here.
                self.abort(&format!(
                    "{what} waited {} s for the other ranks (WGRAD_DIST_TIMEOUT_S): one of them \
                     has died or hangs",
                    self.timeout.as_secs()
                ));
            }
            if start.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }
}

impl MpiWorld {
    /// `buf` of rank `root` into every rank's.
    fn broadcast_any<T: Equivalence>(&self, buf: &mut [T], root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(super::error(self, format!("broadcast from rank {root}")));
        }
        let root = self.world.process_at_rank(root as i32);
        mpi::request::scope(|scope| {
            let request = root.immediate_broadcast_into(scope, buf);
            self.wait(request, "a broadcast");
        });
        Ok(())
    }
}

impl Collective for MpiWorld {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn world_size(&self) -> usize {
        self.world.size() as usize
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        self.broadcast_any(buf, root)
    }

    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<()> {
        self.broadcast_any(buf, root)
    }

    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let mut send = self.send.borrow_mut();
        send.clear();
        send.extend_from_slice(buf);
        mpi::request::scope(|scope| {
            let request =
                self.world
                    .immediate_all_reduce_into(scope, &send[..], buf, SystemOperation::sum());
            self.wait(request, "the gradient allreduce");
        });
        Ok(())
    }

    fn any(&self, flag: bool) -> Result<bool> {
        let send = u32::from(flag);
        let mut any = 0u32;
        mpi::request::scope(|scope| {
            let request = self.world.immediate_all_reduce_into(
                scope,
                &send,
                &mut any,
                SystemOperation::max(),
            );
            self.wait(request, "an agreement (stop or check)");
        });
        Ok(any != 0)
    }

    fn barrier(&self) -> Result<()> {
        self.wait(self.world.immediate_barrier(), "a barrier");
        Ok(())
    }

    fn abort(&self, reason: &str) -> ! {
        eprintln!(
            "error: rank {} of {}: {reason}; ending every rank",
            self.rank(),
            self.world_size()
        );
        self.world.abort(1)
    }
}
