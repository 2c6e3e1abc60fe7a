//! Gradients of the reductions: over each dim (keepdim both ways, of a permuted view), and over
//! everything (one and two stages, a transposed view); max and min at unique extrema.

use crate::common::*;
use crate::{all_pass, grad_check, scalar, Dom, R};
use wgrad::Tensor;

// ------------------------------------------------------------------------------------------
// Reductions.

/// Over each dim of [2, 3, 4] (and dim -1), keepdim on and off, and over a permuted view.
#[track_caller]
fn check_reduce(
    name: &str,
    dom: Dom,
    gpu: impl Fn(&Tensor, isize, bool) -> R,
    cpu: impl Fn(&Arr, usize, bool) -> Arr,
) {
    let mut results = Vec::new();
    for dim in [0isize, 1, 2, -1] {
        for keepdim in [false, true] {
            let d = dim.rem_euclid(3) as usize;
            results.push(grad_check(
                &format!("{name} [2, 3, 4] dim {dim} keepdim {keepdim}"),
                &[(&[2, 3, 4], dom)],
                |t| gpu(&t[0], dim, keepdim),
                |a| cpu(&a[0], d, keepdim),
            ));
        }
    }
    for dim in [0usize, 2] {
        results.push(grad_check(
            &format!("{name} of [4, 2, 3].permute([1, 2, 0]) dim {dim}"),
            &[(&[4, 2, 3], dom)],
            |t| gpu(&t[0].permute(&[1, 2, 0])?, dim as isize, false),
            |a| cpu(&a[0].permute(&[1, 2, 0]), dim, false),
        ));
    }
    all_pass(results);
}

#[test]
fn grad_sum_over_each_dim() {
    check_reduce(
        "sum",
        Dom::Sym(2.0),
        |x, d, k| x.sum(d, k),
        |a, d, k| a.sum(d, k),
    );
}

#[test]
fn grad_mean_over_each_dim() {
    check_reduce(
        "mean",
        Dom::Sym(2.0),
        |x, d, k| x.mean(d, k),
        |a, d, k| a.mean(d, k),
    );
}

#[test]
fn grad_max_over_each_dim_unique_argmax() {
    check_reduce(
        "max",
        Dom::Distinct(0.15),
        |x, d, k| x.max(d, k),
        |a, d, k| a.max(d, k),
    );
}

#[test]
fn grad_min_over_each_dim_unique_argmin() {
    check_reduce(
        "min",
        Dom::Distinct(0.15),
        |x, d, k| x.min(d, k),
        |a, d, k| a.min(d, k),
    );
}

/// Over [3, 5], [2, 3, 4] and a transposed [5, 3] view.
#[track_caller]
fn check_reduce_all(name: &str, dom: Dom, gpu: impl Fn(&Tensor) -> R, cpu: impl Fn(&Arr) -> f64) {
    let mut results = Vec::new();
    for shape in [&[3usize, 5][..], &[2, 3, 4]] {
        results.push(grad_check(
            &format!("{name} {shape:?}"),
            &[(shape, dom)],
            |t| gpu(&t[0]),
            |a| scalar(cpu(&a[0])),
        ));
    }
    // Over 2048 elements: two-stage reduction (partials, then their fold).
    results.push(grad_check(
        &format!("{name} [45, 47]"),
        &[(&[45, 47], dom)],
        |t| gpu(&t[0]),
        |a| scalar(cpu(&a[0])),
    ));
    results.push(grad_check(
        &format!("{name} of [5, 3].t()"),
        &[(&[5, 3], dom)],
        |t| gpu(&t[0].t()?),
        |a| scalar(cpu(&a[0].t())),
    ));
    all_pass(results);
}

#[test]
fn grad_sum_all() {
    check_reduce_all("sum_all", Dom::Sym(2.0), |x| x.sum_all(), Arr::sum_all);
}

#[test]
fn grad_mean_all() {
    check_reduce_all("mean_all", Dom::Sym(2.0), |x| x.mean_all(), Arr::mean_all);
}

#[test]
fn grad_max_all_unique_argmax() {
    check_reduce_all(
        "max_all",
        Dom::Distinct(0.15),
        |x| x.max_all(),
        Arr::max_all,
    );
}

#[test]
fn grad_min_all_unique_argmin() {
    check_reduce_all(
        "min_all",
        Dom::Distinct(0.15),
        |x| x.min_all(),
        Arr::min_all,
    );
}
