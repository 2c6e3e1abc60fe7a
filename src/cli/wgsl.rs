//! `wgrad wgsl VARIANT...`: the complete WGSL of kernel variants, as naga compiles them (the
//! specialization's constants, types and generated snippets prepended to the family's source).
//! `wgrad::kernels::named` lists the names (`coop:2x2/4x4/32`, `tiled:128x64x8/8x4v`,
//! `attn:fwd:f16`, with an entry point after them).

use wgrad::kernels::named;
use wgrad::{Error, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Variants: `coop:TILE[:ENTRY[:vec]]`, `tiled:TILE[:ENTRY[:v4]]`,
    /// `attn:fwd|bwd:IN[:GRAD[:OUT]]` (e.g. `coop:2x2/4x4/32:matmul_coop_bias_gelu`).
    #[arg(required = true)]
    variants: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    for name in &args.variants {
        let n =
            named::parse(name).map_err(|reason| Error::InvalidArgument { op: "wgsl", reason })?;
        println!(
            "// {} (family {}, entry point {})\n{}",
            n.name,
            n.family.name,
            n.entry,
            n.source()
        );
    }
    Ok(())
}
