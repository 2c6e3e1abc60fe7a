//! Pipelines compiled on worker threads.
//!
//! A cold training step records a few dozen kernel variants that were never compiled. Compiled
//! where each is first recorded (naga's WGSL to SPIR-V, then the driver), their times added up
//! end to end: 1.4-5.0 s for a DistilGPT-2 step on a fresh H200 (PROFILING.md). Here recording
//! only queues a variant's compile and goes on; a flush waits for the pipelines it encodes, so
//! the variants of a step compile side by side while the step is being recorded.
//!
//! `WGRAD_COMPILE_THREADS=N` sets the workers (default: the machine's cores, at most 16);
//! `0` compiles on the recording thread, as before the workers existed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// Most workers started: a step's variants number a few dozen, and each compile is one
/// thread's work inside the driver.
const MAX_THREADS: usize = 16;

type Job = Box<dyn FnOnce() + Send>;

/// A queue of compile jobs and the threads that run them (started on the first job).
pub struct Compiler {
    threads: usize,
    sender: Option<mpsc::Sender<Job>>,
    /// Nanoseconds the jobs took, summed over the workers.
    busy_ns: Arc<AtomicU64>,
}

impl Compiler {
    /// `threads` workers if given (`Execution::compile_threads`), else one per core; at most
    /// `MAX_THREADS`.
    pub fn with_threads(threads: Option<usize>) -> Compiler {
        let threads = threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
            .min(MAX_THREADS);
        Compiler::new(threads)
    }

    /// `threads` workers; 0 runs every job where it is queued.
    pub fn new(threads: usize) -> Compiler {
        Compiler {
            threads,
            sender: None,
            busy_ns: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Workers (those started, once the first job has started them).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Milliseconds the jobs have taken so far, summed over the workers (a job still running
    /// is not counted).
    pub fn busy_ms(&self) -> f64 {
        self.busy_ns.load(Ordering::Relaxed) as f64 * 1e-6
    }

    /// Runs `job` on a worker, or here when there are none (or none could be started).
    pub fn run(&mut self, job: impl FnOnce() + Send + 'static) {
        let busy = self.busy_ns.clone();
        let timed = move || {
            let start = std::time::Instant::now();
            job();
            busy.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        };
        if self.threads == 0 {
            return timed();
        }
        if self.sender.is_none() {
            match start_workers(self.threads) {
                Some((sender, started)) => {
                    self.sender = Some(sender);
                    self.threads = started;
                }
                None => {
                    self.threads = 0;
                    return timed();
                }
            }
        }
        let sender = self.sender.as_ref().expect("workers started above");
        if let Err(mpsc::SendError(job)) = sender.send(Box::new(timed)) {
            // Every worker is gone (a panic outside a job): compile here from now on.
            self.threads = 0;
            self.sender = None;
            job();
        }
    }
}

/// Starts `n` workers sharing one queue; they end when its sender is dropped. The sender and
/// the workers started, None when not even one could be.
fn start_workers(n: usize) -> Option<(mpsc::Sender<Job>, usize)> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    let mut started = 0;
    for i in 0..n {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("wgrad-compile-{i}"))
            .spawn(move || loop {
                // The lock is held only to take a job, not while running it.
                let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                match job {
                    Ok(job) => job(),
                    Err(mpsc::RecvError) => return,
                }
            });
        match spawned {
            Ok(_) => started += 1,
            Err(e) => tracing::warn!("compile worker {i} not started: {e}"),
        }
    }
    (started > 0).then_some((tx, started))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_on_workers_and_their_time_is_summed() {
        let mut c = Compiler::new(3);
        let (tx, rx) = mpsc::channel();
        for i in 0..12 {
            let tx = tx.clone();
            c.run(move || {
                std::thread::sleep(std::time::Duration::from_millis(2));
                let name = std::thread::current().name().map(str::to_owned);
                tx.send((i, name)).expect("the test waits");
            });
        }
        let mut got: Vec<_> = (0..12)
            .map(|_| rx.recv().expect("every job runs"))
            .collect();
        got.sort();
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            (0..12).collect::<Vec<_>>()
        );
        assert!(got.iter().all(|(_, n)| n
            .as_deref()
            .is_some_and(|n| n.starts_with("wgrad-compile-"))));
        // Each job's time is added once it has returned: the last may still be adding.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while c.busy_ms() < 24.0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(c.busy_ms() >= 24.0, "{} ms", c.busy_ms());
        assert_eq!(c.threads(), 3);
    }

    #[test]
    fn no_workers_runs_jobs_in_place() {
        let mut c = Compiler::new(0);
        let here = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        c.run(move || {
            tx.send(std::thread::current().id())
                .expect("received below")
        });
        assert_eq!(rx.try_recv().expect("ran before run returned"), here);
    }
}
