//! Subcommands. Each one parses its flags and calls the library; no engine logic lives here.

mod bench_matmul;
mod bench_ops;
mod bench_step;
mod dist;
mod eval;
mod generate;
mod info;
mod limits;
pub mod log;
mod profile;
mod setup;
mod signals;
mod train;
mod wgsl;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "wgrad",
    version,
    about = "Train small transformers on any GPU that wgpu reaches"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log more on stderr: warnings are shown by default; -v info, -vv debug, -vvv trace.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

impl Cli {
    /// The log level `-v` asks for.
    pub fn log_level(&self) -> tracing::Level {
        log::level(self.verbose)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Train a model (GPT-2, Llama, Qwen2, Qwen3; the tiny preset on the bundled corpus by
    /// default): progress bar, held-out evaluations, checkpoints, a summary.
    Train(train::Args),
    /// The next-token loss and perplexity of a model directory over a text file.
    Eval(eval::Args),
    /// Continue a prompt with a model directory (KV cache; temperature, top-k, top-p).
    Generate(generate::Args),
    /// Print the adapter, backend, driver, features, limits and cooperative-matrix shapes.
    Info {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Profile training steps: GPU time per kernel, CPU phases, counters, Chrome trace.
    Profile(profile::Args),
    /// Print the complete WGSL of kernel variants (e.g. `coop:2x2/4x4/32:matmul_coop_bias`).
    Wgsl(wgsl::Args),
    /// Benchmarks that print tables (never assert on timing).
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Kernel throughput, CPU cost per recorded dispatch, submits and pool reuse.
    Ops(bench_ops::Args),
    /// A full training step: median ms, tokens/s, submits and buffers per step.
    Step(bench_step::Args),
    /// Matmul TFLOP/s per size, f32 or f16 operands, and the kernel variant chosen.
    Matmul(bench_matmul::Args),
}

pub fn run(cli: Cli) -> wgrad::Result<()> {
    match cli.command {
        Command::Train(args) => train::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Info { json } => info::run(json),
        Command::Profile(args) => skip_over_limits(profile::run(&args)),
        Command::Wgsl(args) => wgsl::run(&args),
        Command::Bench { which } => match which {
            BenchCommand::Ops(args) => bench_ops::run(&args),
            BenchCommand::Step(args) => skip_over_limits(bench_step::run(&args)),
            BenchCommand::Matmul(args) => bench_matmul::run(&args),
        },
    }
}

/// A measurement of one size over this adapter's limits is skipped, not failed: the line says
/// which limit (the same command runs on lavapipe and on an H100).
fn skip_over_limits(r: wgrad::Result<()>) -> wgrad::Result<()> {
    match limits::or_skip(r)? {
        Ok(()) => Ok(()),
        Err(limit) => {
            limits::print_skipped(&[limit]);
            Ok(())
        }
    }
}
