//! The `wgrad` command: a thin layer over the library.

mod cli;

use clap::Parser;

/// mimalloc instead of the system allocator: recording a step makes and frees a few thousand
/// small objects (tensor handles, layouts, dispatch records), and glibc's malloc and free were
/// about 30% of the host's samples a step (`perf` on the noop backend, PROFILING.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args = cli::Cli::parse();
    cli::log::init(args.log_level());
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
