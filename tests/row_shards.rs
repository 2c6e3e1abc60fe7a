//! The ops over a table stored as row shards (an embedding over the storage-binding limit):
//! `Tensor::index_select_shards` and `Tensor::matmul_t_shards` against the CPU f64 reference of
//! the whole table (outputs poisoned first), their gradients against finite differences, and
//! the tied use GPT-2 makes of them (one table read by the lookup and the head: the shards'
//! gradients add up).
//!
//! Error metric (gradcheck's and `assert_close`'s): |got - want| / max(|want|, 1).

mod common;

use common::*;
use wgrad::autograd::gradcheck::{self, Input};
use wgrad::{Error, Tensor};

type R = wgrad::Result<Tensor>;

/// Finite-difference step (f64, on the exact CPU reference).
const EPS: f64 = 1e-4;
/// Tolerance of an f32 GPU gradient against the f64 finite difference.
const GRAD_TOL: f64 = 1e-5;

/// The table the shards make, stacked by rows.
fn cat_rows(parts: &[Arr]) -> Arr {
    let cols = parts[0].shape[1];
    let rows: usize = parts.iter().map(|p| p.shape[0]).sum();
    let data = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
    Arr::new(&[rows, cols], data)
}

/// Shards of (rows_i, cols) cut from one flat buffer at offsets that are not 0, as parameter
/// chunks hold them; and their reference.
fn shards_in_one_buffer(tag: &str, rows: &[usize], cols: usize) -> (Vec<Tensor>, Vec<Arr>) {
    let mut rng = rng(tag);
    let total: usize = rows.iter().sum::<usize>() * cols + 3 * rows.len();
    let flat = Arr::rand(&mut rng, &[total], -2.0, 2.0);
    let buf = flat.upload(dev());
    let (mut tensors, mut arrs) = (Vec::new(), Vec::new());
    let mut off = 3;
    for &r in rows {
        let t = buf
            .narrow(0, off, r * cols)
            .and_then(|t| t.reshape(&[r, cols]))
            .expect("a shard view");
        tensors.push(t);
        arrs.push(Arr::new(
            &[r, cols],
            flat.data[off..off + r * cols].to_vec(),
        ));
        off += r * cols + 3;
    }
    (tensors, arrs)
}

#[test]
fn index_select_shards_matches_the_whole_table() {
    let d = dev();
    let (shards, parts) = shards_in_one_buffer("gather shards", &[4, 4, 3], 5);
    let table = cat_rows(&parts);
    // Each shard's first and last rows, repeats, and an index past the table (reads 0).
    let idx = [0u32, 3, 4, 7, 8, 10, 3, 3, 11, 5, 0, 40];
    let ids = Tensor::from_u32(d, &idx, &[idx.len()]).unwrap();
    poison(d, idx.len() * 5);
    let refs: Vec<&Tensor> = shards.iter().collect();
    let got = Tensor::index_select_shards(&refs, &ids).unwrap();
    check(&got, &table.index_select(0, &idx), 0.0, "3 shards");
    // One shard is index_select itself.
    let one = Tensor::index_select_shards(&refs[..1], &ids).unwrap();
    check(&one, &parts[0].index_select(0, &idx), 0.0, "1 shard");
}

#[test]
fn index_select_shards_refuses_mismatched_shards() {
    let d = dev();
    let a = Tensor::zeros(d, &[3, 4]).unwrap();
    let b = Tensor::zeros(d, &[3, 5]).unwrap();
    let ids = Tensor::from_u32(d, &[0, 1], &[2]).unwrap();
    match Tensor::index_select_shards(&[&a, &b], &ids) {
        Err(e @ Error::ShapeMismatch { .. }) => {
            assert!(e.to_string().contains("shard 1"), "{e}")
        }
        other => panic!("want ShapeMismatch, got {other:?}"),
    }
    assert!(Tensor::index_select_shards(&[], &ids).is_err());
}

#[test]
fn matmul_t_shards_matches_the_whole_product() {
    let d = dev();
    let cases: [(&str, &[usize], &[usize]); 2] = [
        ("x [2, 3, 7], shards 5 + 5 + 2", &[2, 3, 7], &[5, 5, 2]),
        // Several matmul tiles per shard, partial ones at the edges.
        ("x [37, 19], shards 70 + 66", &[37, 19], &[70, 66]),
    ];
    for (tag, x_shape, rows) in cases {
        let k = *x_shape.last().unwrap();
        let (shards, parts) = shards_in_one_buffer(tag, rows, k);
        let x = Arr::rand(&mut rng(tag), x_shape, -1.0, 1.0);
        let n: usize = rows.iter().sum();
        poison(d, x.numel() / k * n);
        let refs: Vec<&Tensor> = shards.iter().collect();
        let got = x.upload(d).matmul_t_shards(&refs).unwrap();
        check(&got, &x.matmul(&cat_rows(&parts).t()), TOL, tag);
    }
}

/// Checks the gradients of `sum(gpu(inputs) * w)` against finite differences of
/// `sum(cpu(inputs) * w)` (inputs uniform in [-1.5, 1.5), w in [-1.5, 1.5)).
#[track_caller]
fn grad_check(
    tag: &str,
    shapes: &[&[usize]],
    gpu: impl Fn(&[Tensor]) -> R,
    cpu: impl Fn(&[Arr]) -> Arr,
) {
    let d = dev();
    let mut rng = rng(tag);
    let xs: Vec<Arr> = shapes
        .iter()
        .map(|s| Arr::rand(&mut rng, s, -1.5, 1.5))
        .collect();
    let out_shape = cpu(&xs).shape;
    let w = Arr::rand(&mut rng, &out_shape, -1.5, 1.5);
    let wt = w.upload(d);
    let ins: Vec<Input> = xs
        .iter()
        .map(|a| Input {
            data: a.f32s(),
            shape: a.shape.clone(),
        })
        .collect();
    for a in xs.iter().chain([&w]) {
        poison(d, a.numel());
    }
    let report = gradcheck::check(
        d,
        &ins,
        |ts| {
            let y = gpu(ts)?;
            assert_eq!(y.shape(), &out_shape[..], "{tag}: output shape");
            y.mul(&wt)?.sum_all()
        },
        |vs| {
            let arrs: Vec<Arr> = vs
                .iter()
                .zip(shapes)
                .map(|(v, s)| Arr::new(s, v.clone()))
                .collect();
            cpu(&arrs).zip(&w, |a, b| a * b).sum_all()
        },
        EPS,
        GRAD_TOL,
    )
    .unwrap_or_else(|e| panic!("`{tag}`: {e}"));
    eprintln!("gradcheck `{tag}`: worst error {:.2e}", report.error);
}

const IDX: [u32; 7] = [0, 3, 4, 4, 8, 1, 0];

#[test]
fn grad_index_select_shards() {
    let ids = Tensor::from_u32(dev(), &IDX, &[IDX.len()]).unwrap();
    grad_check(
        "index_select_shards 4 + 4 + 3 rows",
        &[&[4, 5], &[4, 5], &[3, 5]],
        |t| Tensor::index_select_shards(&[&t[0], &t[1], &t[2]], &ids),
        |a| cat_rows(a).index_select(0, &IDX),
    );
    // No index falls in the second shard: its gradient is written zero.
    let ids = Tensor::from_u32(dev(), &[0, 6, 6, 1], &[4]).unwrap();
    grad_check(
        "index_select_shards, a shard no index reads",
        &[&[3, 2], &[2, 2], &[3, 2]],
        |t| Tensor::index_select_shards(&[&t[0], &t[1], &t[2]], &ids),
        |a| cat_rows(a).index_select(0, &[0, 6, 6, 1]),
    );
}

#[test]
fn grad_matmul_t_shards() {
    grad_check(
        "matmul_t_shards x [3, 4, 6], shards 5 + 4",
        &[&[3, 4, 6], &[5, 6], &[4, 6]],
        |t| t[0].matmul_t_shards(&[&t[1], &t[2]]),
        |a| a[0].matmul(&cat_rows(&a[1..]).t()),
    );
}

#[test]
fn grad_tied_lookup_and_head_over_the_same_shards() {
    // GPT-2's pattern: h = tanh(table[idx]), logits = h @ table^T; each shard's gradient gets
    // the head's and the lookup's contributions.
    let ids = Tensor::from_u32(dev(), &IDX, &[IDX.len()]).unwrap();
    grad_check(
        "tied index_select_shards and matmul_t_shards, 4 + 4 + 3 rows",
        &[&[4, 5], &[4, 5], &[3, 5]],
        |t| {
            let shards = [&t[0], &t[1], &t[2]];
            Tensor::index_select_shards(&shards, &ids)?
                .tanh()?
                .matmul_t_shards(&shards)
        },
        |a| {
            let table = cat_rows(a);
            table
                .index_select(0, &IDX)
                .map(f64::tanh)
                .matmul(&table.t())
        },
    );
}
