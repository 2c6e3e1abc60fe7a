//! The `wgrad` command: a thin layer over the library.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
