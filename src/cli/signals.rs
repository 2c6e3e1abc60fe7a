//! SIGINT (Ctrl-C) and SIGTERM during `wgrad train`: the first asks the run to stop after its
//! current step, saving its checkpoint when it has a directory; a second quits at once, and the
//! directory keeps its previous checkpoint (a save in progress is abandoned whole, `atomic.rs`).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use wgrad::session::Interrupt;

/// Which signal stopped the run (0: none yet).
#[derive(Clone, Default)]
pub struct Caught(Arc<AtomicI32>);

impl Caught {
    /// The signal's name and the exit status a shell gives it (128 + its number).
    pub fn signal(&self) -> Option<(&'static str, i32)> {
        let n = self.0.load(Ordering::SeqCst);
        (n != 0).then(|| (name(n), 128 + n))
    }
}

fn name(signal: i32) -> &'static str {
    #[cfg(unix)]
    if signal == signal_hook::consts::SIGTERM {
        return "SIGTERM";
    }
    let _ = signal;
    "SIGINT"
}

/// Routes SIGINT and SIGTERM to `interrupt` (`saving`: what the stop will save, for the
/// message). Where signals cannot be caught (not Unix), the default handling stays.
pub fn stop_on_signals(interrupt: Interrupt, saving: Option<String>) -> Caught {
    let caught = Caught::default();
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
            return caught;
        };
        let first = caught.clone();
        std::thread::spawn(move || {
            for signal in signals.forever() {
                let name = name(signal);
                if first.0.load(Ordering::SeqCst) == 0 {
                    first.0.store(signal, Ordering::SeqCst);
                    interrupt.request();
                    let save = match &saving {
                        Some(dir) => format!(" and saving a checkpoint into {dir}"),
                        None => String::new(),
                    };
                    eprintln!("\n{name}: stopping after this step{save} (again to quit at once)");
                } else {
                    let kept = match &saving {
                        Some(dir) => format!("; {dir} keeps its previous checkpoint"),
                        None => String::new(),
                    };
                    eprintln!("\n{name} again: quitting now{kept}");
                    // At once, without running exit handlers under a thread that may be
                    // inside the GPU driver: the directory's journal makes any moment safe.
                    signal_hook::low_level::exit(128 + signal);
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (interrupt, saving);
    caught
}
