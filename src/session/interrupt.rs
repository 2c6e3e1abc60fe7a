//! Stopping a run from outside: the command's signal handler (SIGINT, SIGTERM) calls
//! `request`, and the run finishes the step it is on, saves its checkpoint when it has a
//! directory, and returns with `RunSummary::interrupted` set. A save in progress always
//! finishes first; a process killed outright leaves the previous checkpoint (`atomic.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A request to stop, shared between whoever asks and the run.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Asks the run to stop after its current step.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl PartialEq for Interrupt {
    fn eq(&self, other: &Interrupt) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
