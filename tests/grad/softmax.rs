//! Gradients of softmax and log-softmax over rows, of contiguous tensors and a transposed view.

use crate::{all_pass, grad_check, Dom};
use wgrad::Tensor;

// ------------------------------------------------------------------------------------------
// Softmax.

#[track_caller]
fn check_softmax(log: bool) {
    let name = if log { "log_softmax" } else { "softmax" };
    let f = move |x: &Tensor| if log { x.log_softmax() } else { x.softmax() };
    all_pass(vec![
        grad_check(
            &format!("{name} rows of [3, 7]"),
            &[(&[3, 7], Dom::Sym(3.0))],
            |t| f(&t[0]),
            |a| a[0].softmax(log),
        ),
        grad_check(
            &format!("{name} rows of [2, 3, 5]"),
            &[(&[2, 3, 5], Dom::Sym(3.0))],
            |t| f(&t[0]),
            |a| a[0].softmax(log),
        ),
        grad_check(
            &format!("{name} rows of [7, 3].t()"),
            &[(&[7, 3], Dom::Sym(3.0))],
            |t| f(&t[0].t()?),
            |a| a[0].t().softmax(log),
        ),
    ]);
}

#[test]
fn grad_softmax_rows() {
    check_softmax(false);
}

#[test]
fn grad_log_softmax_rows() {
    check_softmax(true);
}
