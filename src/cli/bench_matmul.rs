//! `wgrad bench matmul --dtype f32|f16|mixed [--search]`: TFLOP/s per product and the kernel
//! variant each runs on (the cooperative-matrix kernel for f16 where the adapter has one, else
//! the tiled kernel), with the bytes moved at least (each operand read once, C written once) as
//! GB/s, each against the roof measured in the same run (device-to-device copy GB/s; in a `lab`
//! build f16 cooperative-matrix or f32 FMA TFLOP/s: `profile::ceilings`). A product over the
//! adapter's limits is skipped with a line naming the limit. `--search` measures every
//! tile the product's kernel can run, lists them, keeps the fastest in the adapter's tile table
//! and writes it to its cache file. Prints a table, or `--json`.

use super::limits::{or_skip, percent, print_skipped, roofs_line};
use serde::Serialize;
use wgrad::kernels::tuning::{natural_rows_aligned, ProductKey};
use wgrad::ops::matmul_variant;
use wgrad::profile::ceilings::{self, Ceilings};
use wgrad::tune::{self, Search};
use wgrad::{Device, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dtype {
    /// f32 operands, f32 arithmetic.
    F32,
    /// f16 operands, f32 accumulation.
    F16,
    /// f32 A (rounded to f16 under autocast) times f16 B: a training step's forward products.
    Mixed,
}

#[derive(clap::Args)]
pub struct Args {
    /// Operand types.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Small sizes only (a smoke run; lavapipe in CI).
    #[arg(long)]
    quick: bool,
    /// Timed repetitions per product (the median is reported).
    #[arg(long, default_value_t = 10, value_parser = super::setup::reps())]
    reps: usize,
    /// Square sizes to run instead of the default list (e.g. `--sizes 1024,4096`).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Products to run instead of the default list, `MxNxK` each, `:at` or `:bt` after it for
    /// A or B read as a transposed view (e.g. `--shapes 4096x3072x768,768x3072x4096:at`).
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    shapes: Vec<Shape>,
    /// Measure every tile of each product's kernel, keep the fastest (the adapter's tile table,
    /// written to its cache file) and list them all.
    #[arg(long)]
    search: bool,
}

#[derive(Serialize)]
struct Row {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// `NN`, `TN` (A transposed view), `NT`, `TT`.
    layout: String,
    dtype: &'static str,
    kernel: String,
    ms: f64,
    tflops: f64,
    /// Bytes moved at least (A and B read once, C written once) per second.
    gbps: f64,
    /// Shares of the measured roofs: TFLOP/s of the kernel's arithmetic roof (cooperative
    /// matrices for a mixed-precision product where the adapter has them, a third of theirs
    /// for an f32 product on them (X3: three f16 products), else f32 FMA), GB/s of the
    /// device-to-device copy. (The compute roofs are a `lab` build's: null without them.)
    of_compute_roof: Option<f64>,
    of_copy: f64,
    /// With --search: every tile measured, and the heuristic tile's time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tiles: Vec<TileRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    default_ms: Option<f64>,
}

#[derive(Serialize)]
struct TileRow {
    tile: String,
    ms: f64,
    tflops: f64,
}

#[derive(Serialize)]
struct Report {
    adapter: String,
    backend: String,
    dtype: &'static str,
    timing: &'static str,
    ceilings: Ceilings,
    rows: Vec<Row>,
    /// With --search: where the tile table was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    tile_table: Option<String>,
    /// Products over this adapter's limits, not run: what and which limit.
    skipped: Vec<String>,
}

/// (m, n, k, batch, A transposed, B transposed).
type Shape = (usize, usize, usize, usize, bool, bool);

/// `MxNxK`, `MxNxK:at` or `MxNxK:bt`.
/// A product's size at most: 2^24, so that a product's element counts never overflow (larger
/// operands are over every adapter's storage-binding limit anyway).
const MAX_SIZE: usize = 1 << 24;

/// One of `--sizes`: 1 to `MAX_SIZE`.
fn parse_size(s: &str) -> std::result::Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|v| (1..=MAX_SIZE).contains(v))
        .ok_or_else(|| format!("`{s}`: a size is a whole number from 1 to {MAX_SIZE}"))
}

fn parse_shape(s: &str) -> std::result::Result<Shape, String> {
    let (dims, view) = s.split_once(':').unwrap_or((s, ""));
    let d: Vec<usize> = dims
        .split('x')
        .map(|v| parse_size(v).ok())
        .collect::<Option<_>>()
        .filter(|d: &Vec<usize>| d.len() == 3)
        .ok_or_else(|| format!("`{s}`: a product is MxNxK, three sizes from 1 to {MAX_SIZE}"))?;
    let (a_t, b_t) = match view {
        "" => (false, false),
        "at" => (true, false),
        "bt" => (false, true),
        v => return Err(format!("`{s}`: `:{v}` is neither `:at` nor `:bt`")),
    };
    Ok((d[0], d[1], d[2], 1, a_t, b_t))
}

/// (m, n, k, batch, A transposed, B transposed): squares, the products of a DistilGPT-2 step at
/// 8 x 512 tokens (forward, the LM head, and the backward products with their transposed
/// views), odd sizes.
fn default_shapes(quick: bool) -> Vec<Shape> {
    if quick {
        return vec![
            (256, 256, 256, 1, false, false),
            (255, 257, 129, 1, false, false),
            (64, 64, 32, 12, false, false),
            (72, 40, 96, 1, true, true),
        ];
    }
    vec![
        (1024, 1024, 1024, 1, false, false),
        (2048, 2048, 2048, 1, false, false),
        (4096, 4096, 4096, 1, false, false),
        (8192, 8192, 8192, 1, false, false),
        (4096, 2304, 768, 1, false, false),
        (4096, 3072, 768, 1, false, false),
        (4096, 768, 3072, 1, false, false),
        (4096, 768, 3072, 1, false, true),
        (768, 3072, 4096, 1, true, false),
        (4096, 50257, 768, 1, false, true),
        (4096, 768, 50257, 1, false, false),
        (50257, 768, 4096, 1, true, false),
        (1000, 1000, 1000, 1, false, false),
        (4095, 4097, 4099, 1, false, false),
    ]
}

fn tflops(key: &ProductKey, ms: f64) -> f64 {
    2.0 * key.m as f64 * key.n as f64 * key.k as f64 * key.batch as f64 / (ms * 1e-3) / 1e12
}

pub fn run(args: &Args) -> Result<()> {
    let device = Device::new()?;
    let info = device.report();
    let timing = if device.set_gpu_timing(true).is_some() {
        "GPU timestamps per product"
    } else {
        "wall time over back-to-back products"
    };
    device.set_gpu_timing(false);
    let roofs = ceilings::measure(&device, args.quick)?;
    let (a_f16, b_f16, half, name) = match args.dtype {
        Dtype::F32 => (false, false, false, "f32"),
        Dtype::F16 => (true, true, true, "f16"),
        Dtype::Mixed => (false, true, true, "mixed"),
    };
    let shapes = if !args.shapes.is_empty() {
        args.shapes.clone()
    } else if args.sizes.is_empty() {
        default_shapes(args.quick)
    } else {
        args.sizes
            .iter()
            .map(|&s| (s, s, s, 1, false, false))
            .collect()
    };
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for (m, n, k, batch, a_t, b_t) in shapes {
        let key = ProductKey {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            batch: batch as u32,
            half,
            a_f16,
            b_f16,
            a_t,
            b_t,
            bias: false,
            gelu: false,
            residual: false,
            aligned: natural_rows_aligned(m, n, k, batch, a_t, b_t),
        };
        let measured = or_skip((|| {
            let search: Option<Search> = if args.search {
                Some(tune::search(&device, &key, args.reps)?)
            } else {
                None
            };
            let (a, b) = tune::operands(&device, &key)?;
            let ms = tune::time_product(&device, &a, &b, &key, args.reps)?;
            Ok((search, ms))
        })())?;
        let (search, ms) = match measured {
            Ok(m) => m,
            Err(limit) => {
                skipped.push(format!("{}: {limit}", key.describe()));
                continue;
            }
        };
        let c_bytes = 4 * m * n * batch;
        let bytes = batch * (m * k * if a_f16 { 2 } else { 4 } + k * n * if b_f16 { 2 } else { 4 })
            + c_bytes;
        let tiles = search
            .as_ref()
            .map(|s| {
                s.measured
                    .iter()
                    .map(|t| TileRow {
                        tile: t.name(),
                        ms: t.ms,
                        tflops: tflops(&key, t.ms),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let kernel = matmul_variant(&device, &key);
        // An X3 product (f32 on cooperative matrices) makes three f16 products of each f32
        // one: its roof, counted in the f32 product's flops, is a third of theirs.
        let compute_roof = match (kernel.starts_with("coop"), roofs.coop_tflops) {
            (true, Some(t)) if kernel.contains(" x3") => Some(t / 3.0),
            (true, Some(t)) => Some(t),
            _ => roofs.fma_tflops,
        };
        let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
        let achieved = tflops(&key, ms);
        rows.push(Row {
            m,
            n,
            k,
            batch,
            layout: format!(
                "{}{}",
                if a_t { "T" } else { "N" },
                if b_t { "T" } else { "N" }
            ),
            dtype: name,
            kernel,
            ms,
            tflops: achieved,
            gbps,
            of_compute_roof: compute_roof.map(|roof| achieved / roof),
            of_copy: gbps / roofs.copy_gbps,
            tiles,
            default_ms: search.as_ref().and_then(Search::default_ms),
        });
    }
    let tile_table = if args.search {
        tune::save_tiles(&device)?.map(|p| p.display().to_string())
    } else {
        None
    };
    let report = Report {
        adapter: info.adapter,
        backend: info.backend,
        dtype: name,
        timing,
        ceilings: roofs,
        rows,
        tile_table,
        skipped,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serializes")
        );
        return Ok(());
    }
    println!(
        "adapter: {} ({}), {} operands, f32 accumulation; {}",
        report.adapter, report.backend, name, report.timing
    );
    println!("{}\n", roofs_line(&report.ceilings));
    println!(
        "{:>6} {:>6} {:>6} {:>5} {:>3} {:<44} {:>9} {:>8} {:>6} {:>8} {:>6}",
        "M", "N", "K", "batch", "AB", "kernel", "ms", "TFLOP/s", "roof", "GB/s", "copy"
    );
    for r in &report.rows {
        println!(
            "{:>6} {:>6} {:>6} {:>5} {:>3} {:<44} {:>9.3} {:>8.2} {:>6} {:>8.1} {:>5.1}%",
            r.m,
            r.n,
            r.k,
            r.batch,
            r.layout,
            r.kernel,
            r.ms,
            r.tflops,
            percent(r.of_compute_roof),
            r.gbps,
            r.of_copy * 100.0
        );
        for t in &r.tiles {
            println!(
                "{:>31}   {:<42} {:>9.3} {:>8.2}",
                "", t.tile, t.ms, t.tflops
            );
        }
    }
    if let Some(p) = &report.tile_table {
        println!("\ntile table written to {p} (the fastest tile of each product above)");
    }
    if !report.skipped.is_empty() {
        println!();
        print_skipped(&report.skipped);
    }
    Ok(())
}
