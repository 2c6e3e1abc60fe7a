//! What the commands that train share for data-parallel runs: `--reduce`, and joining the
//! ranks an MPI launcher started.

use std::rc::Rc;

use wgrad::dist::{Collective, ReduceChoice, Reduction};
use wgrad::{Device, Options, Result};

/// `--reduce`: how a data-parallel run's gradients are averaged over the ranks.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum ReduceArg {
    /// NCCL in device memory on NVIDIA GPUs (a build with the `nccl` feature), else host.
    #[default]
    Auto,
    /// MPI's allreduce over gradients staged through the host: any adapter, any hosts.
    Host,
    /// NCCL's allreduce in device memory (NVIDIA under Vulkan; an error elsewhere).
    Nccl,
}

impl From<ReduceArg> for ReduceChoice {
    fn from(a: ReduceArg) -> ReduceChoice {
        match a {
            ReduceArg::Auto => ReduceChoice::Auto,
            ReduceArg::Host => ReduceChoice::Host,
            ReduceArg::Nccl => ReduceChoice::Nccl,
        }
    }
}

/// Runs `f` on a device with the environment's options, as one rank of the ranks an MPI
/// launcher started (with the reduction `reduce` asks for) or alone. Under several ranks an
/// error on this one, `f`'s or the device's or the reduction's, ends them all with its message.
pub fn with_ranks<T>(
    reduce: ReduceArg,
    f: impl FnOnce(&Device, Option<Box<dyn Reduction>>) -> Result<T>,
) -> Result<T> {
    let options = Options::from_env()?;
    let world = wgrad::dist::launch(&options)?;
    let result = (|| {
        let dev = Device::with_options(&options)?;
        let reduction = match &world {
            Some(w) => Some(wgrad::dist::reduction(reduce.into(), w, &dev)?),
            None => None,
        };
        f(&dev, reduction)
    })();
    abort_others_on_error(world.as_ref(), result)
}

/// `result`; under several ranks an error on this one ends them all, with its message.
pub fn abort_others_on_error<T>(
    world: Option<&Rc<dyn Collective>>,
    result: Result<T>,
) -> Result<T> {
    match (&result, world) {
        (Err(e), Some(world)) if world.world_size() > 1 => world.abort(&e.to_string()),
        _ => result,
    }
}
