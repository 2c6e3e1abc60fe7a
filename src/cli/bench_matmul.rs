//! `wgrad bench matmul --dtype f16|f32`: TFLOP/s per size and the kernel variant each product
//! runs on (the cooperative-matrix kernel for f16 where the adapter has one, else the tiled
//! kernel), with the bytes moved at least (each operand read once, C written once) as GB/s, so
//! a row reads against both the compute and the memory roof. Prints a table, or `--json`.

use std::time::Instant;

use serde::Serialize;
use wgrad::ops::matmul_variant;
use wgrad::{DType, Device, Result, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dtype {
    F32,
    F16,
}

#[derive(clap::Args)]
pub struct Args {
    /// Operand type: f32, or f16 (f16 operands, f32 accumulation and output).
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Small sizes only (a smoke run; lavapipe in CI).
    #[arg(long)]
    quick: bool,
    /// Timed repetitions per size (the median is reported).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Square sizes to run instead of the default list (e.g. `--sizes 1024,4096`).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
}

#[derive(Serialize)]
struct Row {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    dtype: &'static str,
    kernel: String,
    ms: f64,
    tflops: f64,
    /// Bytes moved at least (A and B read once, C written once) per second.
    gbps: f64,
}

#[derive(Serialize)]
struct Report {
    adapter: String,
    backend: String,
    dtype: &'static str,
    rows: Vec<Row>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(args: &Args) -> Result<()> {
    let device = Device::new()?;
    let info = device.report();
    device.warmup();
    let (dtype, name) = match args.dtype {
        Dtype::F32 => (DType::F32, "f32"),
        Dtype::F16 => (DType::F16, "f16"),
    };
    // (m, n, k, batch): squares, then GPT-2 shapes at 8 x 512 tokens (the MLP projection and
    // its weight gradient, the LM head) and odd sizes.
    let shapes: Vec<(usize, usize, usize, usize)> = if !args.sizes.is_empty() {
        args.sizes.iter().map(|&s| (s, s, s, 1)).collect()
    } else if args.quick {
        vec![(256, 256, 256, 1), (255, 257, 129, 1), (64, 64, 32, 12)]
    } else {
        vec![
            (1024, 1024, 1024, 1),
            (2048, 2048, 2048, 1),
            (4096, 4096, 4096, 1),
            (8192, 8192, 8192, 1),
            (4096, 3072, 768, 1),
            (768, 3072, 4096, 1),
            (4096, 50257, 768, 1),
            (1000, 1000, 1000, 1),
            (4095, 4097, 4099, 1),
        ]
    };
    let mut rows = Vec::new();
    for (m, n, k, batch) in shapes {
        let a = Tensor::rand_uniform(&device, &[batch, m, k], -1.0, 1.0, 1)?.to_dtype(dtype)?;
        let b = Tensor::rand_uniform(&device, &[batch, k, n], -1.0, 1.0, 2)?.to_dtype(dtype)?;
        drop(a.matmul(&b)?);
        device.sync()?;
        let mut times = Vec::with_capacity(args.reps);
        for _ in 0..args.reps.max(1) {
            let start = Instant::now();
            let c = a.matmul(&b)?;
            device.sync()?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
            drop(c);
        }
        let ms = median(times);
        let flops = 2.0 * (m * n * k * batch) as f64;
        let bytes = (batch * (m * k + k * n) * dtype.size() + batch * m * n * 4) as f64;
        rows.push(Row {
            m,
            n,
            k,
            batch,
            dtype: name,
            kernel: matmul_variant(&device, m, n, batch, dtype == DType::F16),
            ms,
            tflops: flops / (ms * 1e-3) / 1e12,
            gbps: bytes / (ms * 1e-3) / 1e9,
        });
    }
    let report = Report {
        adapter: info.adapter,
        backend: info.backend,
        dtype: name,
        rows,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serializes")
        );
        return Ok(());
    }
    println!(
        "adapter: {} ({}), {} operands, f32 accumulation\n",
        report.adapter, report.backend, name
    );
    println!(
        "{:>6} {:>6} {:>6} {:>5} {:<48} {:>10} {:>9} {:>9}",
        "M", "N", "K", "batch", "kernel", "ms", "TFLOP/s", "GB/s"
    );
    for r in &report.rows {
        println!(
            "{:>6} {:>6} {:>6} {:>5} {:<48} {:>10.3} {:>9.2} {:>9.1}",
            r.m, r.n, r.k, r.batch, r.kernel, r.ms, r.tflops, r.gbps
        );
    }
    Ok(())
}
