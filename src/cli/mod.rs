//! Subcommands. Each one parses its flags and calls the library; no engine logic lives here.

mod bench_ops;
mod info;

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
}

#[derive(Subcommand)]
enum Command {
    /// Print the adapter, backend, driver, features, limits and cooperative-matrix shapes.
    Info {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
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
}

pub fn run(cli: Cli) -> wgrad::Result<()> {
    match cli.command {
        Command::Info { json } => info::run(json),
        Command::Bench { which } => match which {
            BenchCommand::Ops(args) => bench_ops::run(&args),
        },
    }
}
