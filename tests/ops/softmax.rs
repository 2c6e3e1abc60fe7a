//! Softmax and log-softmax over rows against f64: many row lengths, without subgroups, views
//! and rank 3, masked entries.

use crate::common::*;
use crate::{make, Dom, V};
use wgrad::{Device, Tensor};

// ------------------------------------------------------------------------------------------
// Softmax.

fn check_softmax_on(d: &Device, tag: &str, x: &Tensor, a: &Arr) {
    for log in [false, true] {
        poison(d, a.numel());
        let got = if log { x.log_softmax() } else { x.softmax() }.unwrap();
        let name = if log { "log_softmax" } else { "softmax" };
        check(&got, &a.softmax(log), TOL, &format!("{name} {tag}"));
    }
}

/// Rows of `x * 20` (and shifted by 80: exp of the unshifted values would overflow f32).
fn softmax_rows(d: &Device, tag: &str) {
    let mut rng = rng(tag);
    for (rows, cols) in [(3, 1), (5, 7), (4, 255), (3, 1000), (2, 50257)] {
        let a = Arr::rand(&mut rng, &[rows, cols], -1.0, 1.0).map(|x| x * 20.0);
        check_softmax_on(d, &format!("{tag} [{rows}, {cols}]"), &a.upload(d), &a);
    }
    let a = Arr::rand(&mut rng, &[3, 1000], -1.0, 1.0).map(|x| x * 20.0 + 80.0);
    check_softmax_on(d, &format!("{tag} [3, 1000] + 80"), &a.upload(d), &a);
}

#[test]
fn softmax_rows_of_many_lengths() {
    softmax_rows(dev(), "softmax");
}

#[test]
fn softmax_rows_without_subgroups() {
    softmax_rows(tree_dev(), "softmax tree");
}

#[test]
fn softmax_of_views_and_rank_3() {
    let d = dev();
    let mut rng = rng("softmax views");
    for v in [
        V::T(9, 7),
        V::N(&[6, 300], 0, 2, 3),
        V::N(&[6, 300], 1, 5, 260),
        V::C(&[2, 3, 257]),
        V::P(&[3, 4, 5], &[1, 2, 0]),
    ] {
        let (x, a) = make(d, &mut rng, Dom::Sym(20.0), v);
        check_softmax_on(d, &format!("{v:?}"), &x, &a);
    }
}

#[test]
fn softmax_with_masked_entries() {
    // Causal-style masks: a large negative number, and -inf, in all but the first entries.
    let d = dev();
    let mut rng = rng("softmax mask");
    for (mask, name) in [(-1e9f64, "-1e9"), (f64::NEG_INFINITY, "-inf")] {
        let a = Arr::rand(&mut rng, &[6, 300], -3.0, 3.0);
        let masked = Arr::build(&[6, 300], |c| if c[1] > c[0] * 50 { mask } else { a.at(c) });
        let x = masked.upload(d);
        for log in [false, true] {
            if log && mask.is_infinite() {
                continue; // log_softmax of -inf is -inf: checked below for the finite entries
            }
            poison(d, masked.numel());
            let got = if log { x.log_softmax() } else { x.softmax() }.unwrap();
            check(
                &got,
                &masked.softmax(log),
                TOL,
                &format!("softmax(log {log}) mask {name}"),
            );
        }
    }
}
