//! `wgrad bench ops`: the adapter's measured roofs (device-to-device copy GB/s; in a `lab` build
//! also f32 FMA and f16 cooperative-matrix TFLOP/s), matmul GFLOP/s, elementwise and reduction
//! GB/s, each against its roof (sizes over the adapter's limits skipped, each named), the CPU
//! cost of recording a dispatch (a 1,000-op chain with one read-back, against
//! the same chain flushed after every op), and pool reuse over a repeated workload. Kernel
//! times are GPU timestamps where the adapter has them. Prints tables, or `--json`.

use std::time::Instant;

use super::limits::{or_skip, percent, print_skipped, roofs_line};
use serde::Serialize;
use wgrad::kernels::tuning::{natural_rows_aligned, ProductKey};
use wgrad::ops::matmul_variant;
use wgrad::profile::ceilings::{self, Ceilings};
use wgrad::profile::timed::gpu_ms as time_ms;
use wgrad::{Device, Result, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// One JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Small sizes only (a smoke run; lavapipe in CI).
    #[arg(long)]
    quick: bool,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 10, value_parser = super::setup::reps())]
    reps: usize,
}

#[derive(Serialize)]
struct MatmulRow {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    b_transposed: bool,
    tile: String,
    ms: f64,
    gflops: f64,
    /// Share of the measured f32 FMA roof (a `lab` build's; else null).
    of_fma_roof: Option<f64>,
}

#[derive(Serialize)]
struct BandwidthRow {
    name: String,
    elements: usize,
    ms: f64,
    gbps: f64,
    /// Share of the measured device-to-device copy bandwidth.
    of_copy: f64,
}

#[derive(Serialize)]
struct ChainRow {
    ops: usize,
    submits: u64,
    /// CPU microseconds per recorded op (recording only, for `chain`; recording plus the
    /// per-op submit, for `eager_chain`).
    us_per_op: f64,
    /// Wall time of the whole chain including the read-back.
    wall_ms: f64,
    /// CPU time of the flush that encodes and submits what is still pending.
    encode_submit_ms: f64,
    /// Time then spent waiting for the GPU to finish.
    wait_ms: f64,
}

#[derive(Serialize)]
struct PoolRow {
    repeats: usize,
    buffers_created_first: u64,
    buffers_created_after_first: u64,
    hit_rate: f64,
    peak_bytes_live: u64,
    bind_groups_created_after_first: u64,
}

#[derive(Serialize)]
struct Report {
    adapter: String,
    backend: String,
    ceilings: Ceilings,
    matmul: Vec<MatmulRow>,
    elementwise: Vec<BandwidthRow>,
    reduction: Vec<BandwidthRow>,
    chain: ChainRow,
    eager_chain: ChainRow,
    pool: PoolRow,
    /// Sizes over this adapter's limits, not run: what and which limit.
    skipped: Vec<String>,
}

fn bench_matmul(
    device: &Device,
    args: &Args,
    roofs: &Ceilings,
    skipped: &mut Vec<String>,
) -> Result<Vec<MatmulRow>> {
    // (m, n, k, batch, b transposed): square, a GPT-2 projection (B*T x C @ C x 4C), its
    // weight-gradient shape (A^T B, reads through strides), and attention-score batches.
    let shapes: &[(usize, usize, usize, usize, bool)] = if args.quick {
        &[
            (256, 256, 256, 1, false),
            (255, 257, 129, 1, true),
            (64, 64, 32, 12, false),
        ]
    } else {
        &[
            (1024, 1024, 1024, 1, false),
            (2048, 2048, 2048, 1, false),
            (4096, 4096, 4096, 1, false),
            (4096, 3072, 768, 1, false),
            (768, 3072, 4096, 1, true),
            (512, 512, 64, 96, false),
            (1000, 1000, 1000, 1, false),
        ]
    };
    let mut rows = Vec::new();
    for &(m, n, k, batch, bt) in shapes {
        let timed = or_skip((|| {
            let a = Tensor::rand_uniform(device, &[batch, m, k], -1.0, 1.0, 1)?;
            let b = if bt {
                Tensor::rand_uniform(device, &[batch, n, k], -1.0, 1.0, 2)?.t()?
            } else {
                Tensor::rand_uniform(device, &[batch, k, n], -1.0, 1.0, 2)?
            };
            time_ms(device, args.reps, || a.matmul(&b))
        })())?;
        let ms = match timed {
            Ok(ms) => ms,
            Err(limit) => {
                skipped.push(format!("matmul {m}x{n}x{k} (batch {batch}): {limit}"));
                continue;
            }
        };
        let key = ProductKey {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            batch: batch as u32,
            half: false,
            a_f16: false,
            b_f16: false,
            a_t: false,
            b_t: bt,
            bias: false,
            gelu: false,
            residual: false,
            aligned: natural_rows_aligned(m, n, k, batch, false, bt),
        };
        let gflops = 2.0 * (m * n * k * batch) as f64 / (ms * 1e-3) / 1e9;
        rows.push(MatmulRow {
            m,
            n,
            k,
            batch,
            b_transposed: bt,
            tile: matmul_variant(device, &key),
            ms,
            gflops,
            of_fma_roof: roofs.fma_tflops.map(|roof| gflops / 1e3 / roof),
        });
    }
    Ok(rows)
}

/// Elementwise and reduction bandwidth over vectors of 4M elements and (unless quick) 64M
/// (a size whose tensors exceed the adapter's storage-binding limit is skipped).
fn bench_bandwidth(
    device: &Device,
    args: &Args,
    roofs: &Ceilings,
    skipped: &mut Vec<String>,
) -> Result<(Vec<BandwidthRow>, Vec<BandwidthRow>)> {
    let sizes: &[usize] = if args.quick {
        &[1 << 20]
    } else {
        &[1 << 22, 1 << 26]
    };
    let (mut ew, mut red) = (Vec::new(), Vec::new());
    for &n in sizes {
        match or_skip(bandwidth_at(device, args, roofs, n))? {
            Ok((e, r)) => {
                ew.extend(e);
                red.extend(r);
            }
            Err(limit) => skipped.push(format!(
                "elementwise and reductions over {n} elements: {limit}"
            )),
        }
    }
    Ok((ew, red))
}

fn bandwidth_at(
    device: &Device,
    args: &Args,
    roofs: &Ceilings,
    n: usize,
) -> Result<(Vec<BandwidthRow>, Vec<BandwidthRow>)> {
    let x = Tensor::rand_uniform(device, &[n], -1.0, 1.0, 3)?;
    let y = Tensor::rand_uniform(device, &[n], -1.0, 1.0, 4)?;
    let gbps = |bytes: usize, ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
    let row = |name: &str, bytes: usize, ms: f64| BandwidthRow {
        name: name.into(),
        elements: n,
        ms,
        gbps: gbps(bytes, ms),
        of_copy: gbps(bytes, ms) / roofs.copy_gbps,
    };
    let mut ew = Vec::new();
    let ms = time_ms(device, args.reps, || x.add(&y))?;
    ew.push(row("add (vec4)", 12 * n, ms));
    let ms = time_ms(device, args.reps, || x.mul_scalar(2.0))?;
    ew.push(row("mul_scalar (vec4)", 8 * n, ms));
    let rows = 1024;
    let x2 = x.reshape(&[rows, n / rows])?;
    let bias = Tensor::rand_uniform(device, &[n / rows], -1.0, 1.0, 5)?;
    let ms = time_ms(device, args.reps, || x2.add(&bias))?;
    ew.push(row("add broadcast row (strided)", 8 * n, ms));
    let xt = x2.t()?;
    let ms = time_ms(device, args.reps, || xt.contiguous())?;
    ew.push(row("transpose copy (strided)", 8 * n, ms));

    let mut red = Vec::new();
    let ms = time_ms(device, args.reps, || x.sum_all())?;
    red.push(row("sum over all", 4 * n, ms));
    let ms = time_ms(device, args.reps, || x2.sum(-1, false))?;
    red.push(row("sum over last axis", 4 * n, ms));
    let ms = time_ms(device, args.reps, || x2.max(0, false))?;
    red.push(row("max over first axis", 4 * n, ms));
    let ms = time_ms(device, args.reps, || x2.softmax())?;
    red.push(row("softmax last axis", 8 * n, ms));
    Ok((ew, red))
}

/// A chain of `ops` small dependent ops ending in one read-back; `eager` flushes after each.
fn bench_chain(device: &Device, ops: usize, eager: bool) -> Result<ChainRow> {
    let x = Tensor::rand_uniform(device, &[256], -1.0, 1.0, 6)?;
    device.sync()?;
    let before = device.counters();
    let start = Instant::now();
    let mut y = x.clone();
    let mut record_s = 0.0;
    for i in 0..ops {
        let t = Instant::now();
        y = if i % 2 == 0 {
            y.mul_scalar(0.999)?
        } else {
            y.add(&x)?
        };
        if eager {
            device.flush();
        }
        record_s += t.elapsed().as_secs_f64();
    }
    let _ = y.sum_all()?.item()?;
    let wall = start.elapsed().as_secs_f64();
    let c = device.counters() - before;
    Ok(ChainRow {
        ops,
        submits: c.submits,
        us_per_op: record_s * 1e6 / ops as f64,
        wall_ms: wall * 1e3,
        encode_submit_ms: c.encode_submit_ns as f64 * 1e-6,
        wait_ms: c.wait_ns as f64 * 1e-6,
    })
}

/// The same small MLP-like workload, `repeats` times: the pool must serve every repeat after
/// the first without creating a buffer.
fn bench_pool(device: &Device, repeats: usize) -> Result<PoolRow> {
    let w1 = Tensor::rand_normal(device, &[64, 256], 0.0, 0.05, 7)?;
    let w2 = Tensor::rand_normal(device, &[256, 10], 0.0, 0.05, 8)?;
    let data: Vec<f32> = (0..32 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
    device.sync()?;
    device.reset_pool_counters();
    let mut first = 0;
    let mut bind_after_first = 0;
    for r in 0..repeats {
        let before = device.pool_stats().buffers_created;
        let bind_before = device.counters().bind_groups_created;
        let x = Tensor::from_slice(device, &data, &[32, 64])?;
        let h = x.matmul(&w1)?.relu()?;
        let logits = h.matmul(&w2)?;
        let loss = logits.log_softmax()?.mean_all()?;
        loss.item()?;
        if r == 0 {
            first = device.pool_stats().buffers_created - before;
        } else {
            bind_after_first += device.counters().bind_groups_created - bind_before;
        }
    }
    let s = device.pool_stats();
    Ok(PoolRow {
        repeats,
        buffers_created_first: first,
        buffers_created_after_first: s.buffers_created - first,
        hit_rate: s.hit_rate(),
        peak_bytes_live: s.peak_bytes_live,
        bind_groups_created_after_first: bind_after_first,
    })
}

pub fn run(args: &Args) -> Result<()> {
    let device = Device::new()?;
    let info = device.report();
    device.warmup();
    let roofs = ceilings::measure(&device, args.quick)?;
    let mut skipped = Vec::new();
    let matmul = bench_matmul(&device, args, &roofs, &mut skipped)?;
    let (elementwise, reduction) = bench_bandwidth(&device, args, &roofs, &mut skipped)?;
    let chain = bench_chain(&device, 1000, false)?;
    let eager_chain = bench_chain(&device, 1000, true)?;
    let pool = bench_pool(&device, 5)?;
    let report = Report {
        adapter: info.adapter,
        backend: info.backend,
        ceilings: roofs,
        matmul,
        elementwise,
        reduction,
        chain,
        eager_chain,
        pool,
        skipped,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serializes")
        );
    } else {
        print_tables(&report);
    }
    Ok(())
}

fn print_tables(r: &Report) {
    println!("adapter: {} ({})\n", r.adapter, r.backend);
    println!("{}\n", roofs_line(&r.ceilings));
    println!(
        "{:>6} {:>6} {:>6} {:>5} {:>4} {:>20} {:>10} {:>10} {:>7}",
        "M", "N", "K", "batch", "B^T", "tile", "ms", "GFLOP/s", "of FMA"
    );
    for m in &r.matmul {
        println!(
            "{:>6} {:>6} {:>6} {:>5} {:>4} {:>20} {:>10.3} {:>10.1} {:>7}",
            m.m,
            m.n,
            m.k,
            m.batch,
            if m.b_transposed { "yes" } else { "no" },
            m.tile,
            m.ms,
            m.gflops,
            percent(m.of_fma_roof)
        );
    }
    println!(
        "\n{:<32} {:>10} {:>10} {:>8} {:>8}",
        "elementwise / reduction", "elements", "ms", "GB/s", "of copy"
    );
    for b in r.elementwise.iter().chain(&r.reduction) {
        println!(
            "{:<32} {:>10} {:>10.3} {:>8.1} {:>7.1}%",
            b.name,
            b.elements,
            b.ms,
            b.gbps,
            b.of_copy * 100.0
        );
    }
    println!(
        "\n{:<6} {:>6} {:>8} {:>13} {:>17} {:>9} {:>9}",
        "chain", "ops", "submits", "record us/op", "encode+submit ms", "wait ms", "wall ms"
    );
    for (name, c) in [("lazy", &r.chain), ("eager", &r.eager_chain)] {
        println!(
            "{:<6} {:>6} {:>8} {:>13.2} {:>17.2} {:>9.2} {:>9.2}",
            name, c.ops, c.submits, c.us_per_op, c.encode_submit_ms, c.wait_ms, c.wall_ms
        );
    }
    let p = &r.pool;
    println!(
        "\npool over {} repeats: {} buffers created by the first, {} after it; hit rate {:.1}%; peak {} bytes live; {} bind groups created after the first",
        p.repeats,
        p.buffers_created_first,
        p.buffers_created_after_first,
        p.hit_rate * 100.0,
        p.peak_bytes_live,
        p.bind_groups_created_after_first
    );
    if !r.skipped.is_empty() {
        println!();
        print_skipped(&r.skipped);
    }
}
