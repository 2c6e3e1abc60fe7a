//! Reductions against f64: every reduction along every axis, of contiguous tensors and views,
//! over long axes and tall matrices, full reductions at the workgroup and stage boundaries,
//! without subgroups, on rank 8 views, and over more than 65,535 rows.

use crate::common::*;
use crate::{rank8_reversed, R};
use wgrad::{Device, Tensor};

// ------------------------------------------------------------------------------------------
// Reductions.

type Reduction = (
    &'static str,
    fn(&Tensor, isize, bool) -> R,
    fn(&Arr, usize, bool) -> Arr,
);

const REDUCTIONS: [Reduction; 4] = [
    ("sum", Tensor::sum, Arr::sum),
    ("mean", Tensor::mean, Arr::mean),
    ("max", Tensor::max, Arr::max),
    ("min", Tensor::min, Arr::min),
];

/// Every reduction along every axis (given as d and d - rank), keepdim both ways.
fn check_axis_reductions(d: &Device, tag: &str, x: &Tensor, a: &Arr) {
    let rank = a.rank();
    for (name, gpu, cpu) in REDUCTIONS {
        for dim in 0..rank {
            for keepdim in [false, true] {
                let signed = if keepdim {
                    dim as isize - rank as isize
                } else {
                    dim as isize
                };
                let want = cpu(a, dim, keepdim);
                poison(d, want.numel());
                let got = gpu(x, signed, keepdim).unwrap();
                check(
                    &got,
                    &want,
                    TOL,
                    &format!("{tag}: {name}(dim {signed}, keepdim {keepdim})"),
                );
            }
        }
    }
}

#[test]
fn reduce_each_axis_of_a_3d_tensor() {
    let d = dev();
    let a = Arr::rand(&mut rng("reduce 3d"), &[5, 19, 300], -1.0, 1.0);
    check_axis_reductions(d, "[5, 19, 300]", &a.upload(d), &a);
}

#[test]
fn reduce_each_axis_of_a_permuted_view() {
    let d = dev();
    let base = Arr::rand(&mut rng("reduce permuted"), &[19, 261, 5], -1.0, 1.0);
    let x = base.upload(d).permute(&[2, 0, 1]).unwrap();
    check_axis_reductions(d, "permuted [5, 19, 261]", &x, &base.permute(&[2, 0, 1]));
}

#[test]
fn reduce_each_axis_of_a_narrowed_view() {
    let d = dev();
    let base = Arr::rand(&mut rng("reduce narrowed"), &[7, 21, 300], -1.0, 1.0);
    let x = base
        .upload(d)
        .narrow(0, 1, 5)
        .unwrap()
        .narrow(1, 2, 17)
        .unwrap()
        .narrow(2, 13, 259)
        .unwrap();
    let a = base.narrow(0, 1, 5).narrow(1, 2, 17).narrow(2, 13, 259);
    check_axis_reductions(d, "narrowed [5, 17, 259]", &x, &a);
}

#[test]
fn reduce_a_long_axis_and_a_broadcast_axis() {
    let d = dev();
    let a = Arr::rand(&mut rng("reduce long"), &[3, 5003], -1.0, 1.0);
    check_axis_reductions(d, "[3, 5003]", &a.upload(d), &a);
    // A stride-0 axis: every element of the reduced axis is the same one.
    let b = Arr::rand(&mut rng("reduce bcast"), &[4, 1], -1.0, 1.0);
    let x = b.upload(d).broadcast_to(&[4, 300]).unwrap();
    check_axis_reductions(d, "broadcast [4, 300]", &x, &b.broadcast_to(&[4, 300]));
}

/// Matrices reduced over their rows run with lanes along the columns (`reduce_cols`), in
/// one workgroup row (up to 256 rows) or in chunks (of about sqrt(rows) rows, at least 64:
/// 64 for 300 and 1000 rows, 68 for 4500) and a second pass over the chunks' partials; also
/// through a view whose rows are longer than its columns. 13 and 67 rows leave the 4 row phases
/// of a workgroup unequal shares.
#[test]
fn reduce_over_the_rows_of_tall_matrices() {
    let d = dev();
    for shape in [
        [13, 70],
        [64, 33],
        [67, 40],
        [300, 130],
        [1000, 77],
        [4500, 20],
    ] {
        let a = Arr::rand(
            &mut rng(&format!("reduce rows {shape:?}")),
            &shape,
            -1.0,
            1.0,
        );
        check_axis_reductions(d, &format!("{shape:?}"), &a.upload(d), &a);
    }
    let base = Arr::rand(&mut rng("reduce rows view"), &[700, 90], -1.0, 1.0);
    let x = base.upload(d).narrow(1, 5, 77).unwrap();
    check_axis_reductions(d, "[700, 90][:, 5..82]", &x, &base.narrow(1, 5, 77));
}

type ReductionAll = (&'static str, fn(&Tensor) -> R, fn(&Arr) -> f64);

const SUM_MAX_MIN_ALL: [ReductionAll; 3] = [
    ("sum_all", Tensor::sum_all, Arr::sum_all),
    ("max_all", Tensor::max_all, Arr::max_all),
    ("min_all", Tensor::min_all, Arr::min_all),
];

const MEAN_ALL: [ReductionAll; 1] = [("mean_all", Tensor::mean_all, Arr::mean_all)];

/// Sizes around the workgroup (256 lanes), the one-workgroup stage-1 share (2048 elements:
/// up to there one dispatch, past it a second stage), and past the cap of 256 partials.
const REDUCE_ALL_SIZES: [usize; 8] = [1, 255, 256, 257, 2048, 2049, 100_003, 600_001];

fn check_full_reductions(d: &Device, which: &[ReductionAll], tag: &str, x: &Tensor, a: &Arr) {
    for &(name, gpu, cpu) in which {
        poison(d, 1);
        let got = gpu(x).unwrap();
        assert_eq!(got.shape(), &[] as &[usize], "{tag}: {name} shape");
        check(
            &got,
            &Arr::new(&[], vec![cpu(a)]),
            TOL,
            &format!("{tag}: {name}"),
        );
    }
}

/// mean_all over each size, every failing size reported together.
fn check_mean_all_sizes(d: &Device, tag: &str, sizes: &[usize]) {
    let mut rng = rng(tag);
    let mut failures = Vec::new();
    for &n in sizes {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        poison(d, 1);
        let got = a.upload(d).mean_all().unwrap().item().unwrap();
        let want = a.mean_all();
        let err = (got as f64 - want).abs() / want.abs().max(1.0);
        if err.is_nan() || err > TOL {
            failures.push(format!(
                "n={n}: got {got}, want {want} (sum {})",
                a.sum_all()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{tag}: mean_all wrong for\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn sum_max_min_all_at_workgroup_and_stage_boundaries() {
    let d = dev();
    let mut rng = rng("reduce all");
    for n in REDUCE_ALL_SIZES {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        check_full_reductions(d, &SUM_MAX_MIN_ALL, &format!("n={n}"), &a.upload(d), &a);
    }
}

#[test]
fn mean_all_at_workgroup_and_stage_boundaries() {
    check_mean_all_sizes(dev(), "mean_all", &REDUCE_ALL_SIZES);
}

#[test]
fn reduce_all_of_noncontiguous_views() {
    let d = dev();
    let both: Vec<ReductionAll> = SUM_MAX_MIN_ALL.iter().chain(&MEAN_ALL).copied().collect();
    let base = Arr::rand(&mut rng("reduce all views"), &[301, 257], -1.0, 1.0);
    let x = base.upload(d);
    let t = x.t().unwrap();
    check_full_reductions(d, &both, "transposed [257, 301]", &t, &base.t());
    let n = x.narrow(1, 3, 250).unwrap().narrow(0, 1, 299).unwrap();
    let na = base.narrow(1, 3, 250).narrow(0, 1, 299);
    check_full_reductions(d, &both, "narrowed [299, 250]", &n, &na);
    let p = x
        .reshape(&[7, 43, 257])
        .unwrap()
        .permute(&[2, 0, 1])
        .unwrap();
    let pa = base.reshape(&[7, 43, 257]).permute(&[2, 0, 1]);
    check_full_reductions(d, &both, "permuted [257, 7, 43]", &p, &pa);
    // A small view: one stage-1 workgroup.
    let s = x
        .narrow(0, 5, 13)
        .unwrap()
        .narrow(1, 7, 11)
        .unwrap()
        .t()
        .unwrap();
    let sa = base.narrow(0, 5, 13).narrow(1, 7, 11).t();
    check_full_reductions(d, &SUM_MAX_MIN_ALL, "small view [11, 13]", &s, &sa);
}

#[test]
fn reductions_without_subgroups() {
    let d = tree_dev();
    assert!(
        !d.has_subgroups(),
        "the tree device has subgroups turned off"
    );
    let mut rng = rng("reduce tree");
    let a = Arr::rand(&mut rng, &[5, 19, 300], -1.0, 1.0);
    check_axis_reductions(d, "tree [5, 19, 300]", &a.upload(d), &a);
    for n in [1usize, 257, 100_003] {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        check_full_reductions(
            d,
            &SUM_MAX_MIN_ALL,
            &format!("tree n={n}"),
            &a.upload(d),
            &a,
        );
    }
}

#[test]
fn mean_all_without_subgroups() {
    check_mean_all_sizes(tree_dev(), "mean_all tree", &[1, 257, 2049, 100_003]);
}

// ------------------------------------------------------------------------------------------
// Rank 8 views, grids past 65,535 workgroups.

#[test]
fn reductions_on_rank_8_views() {
    let d = dev();
    let (x, a) = rank8_reversed(d, &mut rng("rank 8 reduce"));
    for dim in [0usize, 3, 7] {
        poison(d, a.numel() / a.shape[dim]);
        let got = x.sum(dim as isize, true).unwrap();
        check(
            &got,
            &a.sum(dim, true),
            TOL,
            &format!("sum(dim {dim}) on rank 8"),
        );
    }
    check_full_reductions(d, &SUM_MAX_MIN_ALL, "rank 8", &x, &a);
}

#[test]
fn reductions_and_softmax_over_more_than_65535_rows() {
    // One workgroup per output row: 66_001 rows need a 2-D grid of workgroups.
    let d = dev();
    let a = Arr::rand(&mut rng("many rows"), &[66_001, 3], -4.0, 4.0);
    let x = a.upload(d);
    poison(d, 66_001);
    check(
        &x.sum(1, false).unwrap(),
        &a.sum(1, false),
        TOL,
        "sum over 66001 rows",
    );
    poison(d, a.numel());
    check(
        &x.softmax().unwrap(),
        &a.softmax(false),
        TOL,
        "softmax of 66001 rows",
    );
}
