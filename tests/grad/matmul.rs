//! Gradients of matmul: odd sizes, transposed operands, batches and broadcast batches, one leaf
//! on both sides.

use crate::{all_pass, gc, grad_check, Dom};

// ------------------------------------------------------------------------------------------
// Matmul.

#[test]
fn grad_matmul_2d_odd_sizes() {
    gc(
        "matmul 5x3 @ 3x4",
        &[(&[5, 3], Dom::Sym(1.5)), (&[3, 4], Dom::Sym(1.5))],
        |t| t[0].matmul(&t[1]),
        |a| a[0].matmul(&a[1]),
    );
}

#[test]
fn grad_matmul_transposed_right_operand() {
    gc(
        "matmul 5x3 @ [4, 3].t()",
        &[(&[5, 3], Dom::Sym(1.5)), (&[4, 3], Dom::Sym(1.5))],
        |t| t[0].matmul(&t[1].t()?),
        |a| a[0].matmul(&a[1].t()),
    );
}

#[test]
fn grad_matmul_transposed_left_operand() {
    gc(
        "matmul [3, 5].t() @ 3x4",
        &[(&[3, 5], Dom::Sym(1.5)), (&[3, 4], Dom::Sym(1.5))],
        |t| t[0].t()?.matmul(&t[1]),
        |a| a[0].t().matmul(&a[1]),
    );
}

#[test]
fn grad_matmul_batched() {
    gc(
        "matmul [2, 5, 3] @ [2, 3, 4]",
        &[(&[2, 5, 3], Dom::Sym(1.5)), (&[2, 3, 4], Dom::Sym(1.5))],
        |t| t[0].matmul(&t[1]),
        |a| a[0].matmul(&a[1]),
    );
}

#[test]
fn grad_matmul_broadcast_right_batch() {
    gc(
        "matmul [2, 5, 3] @ [3, 4]",
        &[(&[2, 5, 3], Dom::Sym(1.5)), (&[3, 4], Dom::Sym(1.5))],
        |t| t[0].matmul(&t[1]),
        |a| a[0].matmul(&a[1]),
    );
}

#[test]
fn grad_matmul_broadcast_left_batch() {
    gc(
        "matmul [5, 3] @ [2, 3, 4]",
        &[(&[5, 3], Dom::Sym(1.5)), (&[2, 3, 4], Dom::Sym(1.5))],
        |t| t[0].matmul(&t[1]),
        |a| a[0].matmul(&a[1]),
    );
}

#[test]
fn grad_matmul_same_leaf_on_both_sides() {
    all_pass(vec![
        grad_check(
            "matmul x @ x",
            &[(&[3, 3], Dom::Sym(1.5))],
            |t| t[0].matmul(&t[0]),
            |a| a[0].matmul(&a[0]),
        ),
        grad_check(
            "matmul x @ x.t()",
            &[(&[3, 5], Dom::Sym(1.5))],
            |t| t[0].matmul(&t[0].t()?),
            |a| a[0].matmul(&a[0].t()),
        ),
        // Several tiles, with partial ones at the edges.
        grad_check(
            "matmul x @ x.t(), x [37, 19]",
            &[(&[37, 19], Dom::Sym(1.0))],
            |t| t[0].matmul(&t[0].t()?),
            |a| a[0].matmul(&a[0].t()),
        ),
    ]);
}
