//! The direct-load probe (`wgrad::kernels::probe_direct`) beside the shipped cooperative-matrix
//! product, in one run: f16 x f16 -> f32 squares, GPU timestamps, medians. A `lab` build's
//! measuring aid, not part of the engine.
//!
//! ```sh
//! cargo run --release --features lab --example matmul_probe -- 4096,8192 2x2/4x4 2x4/4x4 2x2/4x4/h
//! ```

use wgrad::kernels::probe_direct::DirectTile;
use wgrad::kernels::tuning::{natural_rows_aligned, ProductKey};
use wgrad::profile::ceilings::direct_probe;
use wgrad::{tune, DType, Device, Tensor};

fn main() -> wgrad::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args
        .first()
        .map(|s| {
            s.split(',')
                .map(|v| v.parse().expect("sizes: 4096,8192"))
                .collect()
        })
        .unwrap_or_else(|| vec![4096, 8192]);
    let tiles: Vec<DirectTile> = args
        .iter()
        .skip(1)
        .map(|a| {
            DirectTile::parse(a)
                .unwrap_or_else(|| panic!("`{a}`: a tile is SGMxSGN/FMxFN[/h][/np]"))
        })
        .collect();
    let device = Device::new()?;
    println!("adapter: {}", device.report().adapter);
    println!(
        "{:>6} {:<22} {:>9} {:>8} {:>10}",
        "n", "kernel", "ms", "TFLOP/s", "rel err"
    );
    let reps = 20;
    for &n in &sizes {
        let key = ProductKey {
            m: n as u32,
            n: n as u32,
            k: n as u32,
            batch: 1,
            half: true,
            a_f16: true,
            b_f16: true,
            a_t: false,
            b_t: false,
            bias: false,
            gelu: false,
            residual: false,
            aligned: natural_rows_aligned(n, n, n, 1, false, false),
        };
        let a = Tensor::rand_uniform(&device, &[n, n], -1.0, 1.0, 1)?.to_dtype(DType::F16)?;
        let b = Tensor::rand_uniform(&device, &[n, n], -1.0, 1.0, 2)?.to_dtype(DType::F16)?;
        let reference = a.matmul(&b)?.to_vec()?;
        let ms = tune::time_product(&device, &a, &b, &key, reps)?;
        let flop = 2.0 * (n as f64).powi(3);
        println!(
            "{n:>6} {:<22} {ms:>9.3} {:>8.1} {:>10}",
            "shipped (matmul_coop)",
            flop / ms / 1e9,
            "-"
        );
        for &t in &tiles {
            match direct_probe(&device, &a, &b, Some(&reference), t, reps) {
                Ok(r) => println!(
                    "{n:>6} {:<22} {:>9.3} {:>8.1} {:>10.2e}",
                    format!("direct {}", r.tile),
                    r.ms,
                    r.tflops,
                    r.rel_err
                ),
                Err(e) => println!("{n:>6} direct {:<15} {e}", t.name()),
            }
        }
    }
    Ok(())
}
