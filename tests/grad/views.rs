//! Gradients through views, of leaves (the gradient lands through a view of the leaf's
//! gradient) and of op results (a broadcast result among them): reshape, permute, transpose,
//! narrow, unsqueeze and squeeze, broadcast_to, contiguous, and chains of views and ops.

use crate::common::reference::sigmoid;
use crate::common::*;
use crate::{all_pass, draw, grad_check, Dom};

// ------------------------------------------------------------------------------------------
// Views: of a leaf (the gradient lands through a view of the leaf's gradient) and of an op's
// result.

#[test]
fn grad_reshape() {
    all_pass(vec![
        grad_check(
            "reshape leaf [2, 3, 4] -> [4, 6]",
            &[(&[2, 3, 4], Dom::Sym(2.0))],
            |t| t[0].reshape(&[4, 6]),
            |a| a[0].reshape(&[4, 6]),
        ),
        grad_check(
            "reshape tanh [2, 3, 4] -> [6, 4], then sin",
            &[(&[2, 3, 4], Dom::Sym(2.0))],
            |t| t[0].tanh()?.reshape(&[6, 4])?.sin(),
            |a| a[0].map(f64::tanh).reshape(&[6, 4]).map(f64::sin),
        ),
        // Not expressible as a view: reshape copies.
        grad_check(
            "reshape of [3, 5].t() -> [15]",
            &[(&[3, 5], Dom::Sym(2.0))],
            |t| t[0].t()?.reshape(&[15])?.exp(),
            |a| a[0].t().reshape(&[15]).map(f64::exp),
        ),
    ]);
}

#[test]
fn grad_permute() {
    all_pass(vec![
        grad_check(
            "permute leaf [2, 3, 4] by [2, 0, 1]",
            &[(&[2, 3, 4], Dom::Sym(2.0))],
            |t| t[0].permute(&[2, 0, 1]),
            |a| a[0].permute(&[2, 0, 1]),
        ),
        grad_check(
            "permute exp [2, 3, 4] by [1, 2, 0], then square",
            &[(&[2, 3, 4], Dom::Sym(1.0))],
            |t| t[0].exp()?.permute(&[1, 2, 0])?.square(),
            |a| a[0].map(f64::exp).permute(&[1, 2, 0]).map(|v| v * v),
        ),
    ]);
}

#[test]
fn grad_transpose() {
    all_pass(vec![
        grad_check(
            "transpose leaf [2, 3, 4] dims 0, 2",
            &[(&[2, 3, 4], Dom::Sym(2.0))],
            |t| t[0].transpose(0, 2),
            |a| a[0].transpose(0, 2),
        ),
        grad_check(
            "t() of sigmoid [3, 5], times itself",
            &[(&[3, 5], Dom::Sym(2.0))],
            |t| {
                let y = t[0].sigmoid()?.t()?;
                y.mul(&y)
            },
            |a| {
                let s = a[0].map(sigmoid).t();
                s.zip(&s, |x, y| x * y)
            },
        ),
    ]);
}

#[test]
fn grad_narrow() {
    all_pass(vec![
        grad_check(
            "narrow leaf [2, 5, 4] dim 1 from 1 len 3",
            &[(&[2, 5, 4], Dom::Sym(2.0))],
            |t| t[0].narrow(1, 1, 3),
            |a| a[0].narrow(1, 1, 3),
        ),
        grad_check(
            "narrow leaf [5, 3] dim 0 from 2 len 2, then exp",
            &[(&[5, 3], Dom::Sym(2.0))],
            |t| t[0].narrow(0, 2, 2)?.exp(),
            |a| a[0].narrow(0, 2, 2).map(f64::exp),
        ),
        grad_check(
            "narrow of cos [3, 7] dim 1 from 4 len 3",
            &[(&[3, 7], Dom::Sym(2.0))],
            |t| t[0].cos()?.narrow(1, 4, 3),
            |a| a[0].map(f64::cos).narrow(1, 4, 3),
        ),
        // Two overlapping slices of one leaf: the overlap gets both contributions.
        grad_check(
            "narrow rows 0..3 + rows 1..4 of [4, 5]",
            &[(&[4, 5], Dom::Sym(2.0))],
            |t| t[0].narrow(0, 0, 3)?.add(&t[0].narrow(0, 1, 3)?),
            |a| {
                a[0].narrow(0, 0, 3)
                    .zip(&a[0].narrow(0, 1, 3), |x, y| x + y)
            },
        ),
    ]);
}

/// The gradient of a slice is the upstream gradient inside it and exactly 0 elsewhere (also
/// when the pool hands out a buffer of NaN for it).
#[test]
fn narrow_gradient_is_zero_outside_the_slice() {
    let d = dev();
    let mut r = rng("narrow zeros");
    let x = draw(&mut r, &[4, 5], Dom::Sym(2.0));
    let w = draw(&mut r, &[4, 2], Dom::Pos(0.5, 1.5));
    poison(d, 20);
    let xt = x.upload(d).requires_grad();
    xt.narrow(1, 2, 2)
        .unwrap()
        .mul(&w.upload(d))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = xt.grad().expect("a gradient").to_vec().unwrap();
    let want = Arr::build(&[4, 5], |c| {
        if (2..4).contains(&c[1]) {
            w.at(&[c[0], c[1] - 2])
        } else {
            0.0
        }
    });
    assert_close(&g, &want.data, 1e-6, "narrow gradient");
    for (i, v) in g.iter().enumerate() {
        if !(2..4).contains(&(i % 5)) {
            assert_eq!(*v, 0.0, "element {i} outside the slice");
        }
    }
}

#[test]
fn grad_unsqueeze_squeeze() {
    all_pass(vec![
        grad_check(
            "unsqueeze leaf [3, 5] at 1, broadcast to [3, 4, 5]",
            &[(&[3, 5], Dom::Sym(2.0))],
            |t| t[0].unsqueeze(1)?.broadcast_to(&[3, 4, 5]),
            |a| a[0].reshape(&[3, 1, 5]).broadcast_to(&[3, 4, 5]),
        ),
        grad_check(
            "unsqueeze leaf [3, 5] at -1",
            &[(&[3, 5], Dom::Sym(2.0))],
            |t| t[0].unsqueeze(-1),
            |a| a[0].reshape(&[3, 5, 1]),
        ),
        grad_check(
            "squeeze leaf [3, 1, 5] at 1, then exp",
            &[(&[3, 1, 5], Dom::Sym(2.0))],
            |t| t[0].squeeze(1)?.exp(),
            |a| a[0].reshape(&[3, 5]).map(f64::exp),
        ),
        grad_check(
            "squeeze(unsqueeze(tanh x))",
            &[(&[3, 5], Dom::Sym(2.0))],
            |t| t[0].tanh()?.unsqueeze(0)?.squeeze(0),
            |a| a[0].map(f64::tanh),
        ),
    ]);
}

#[test]
fn grad_broadcast_to() {
    let cases: [(&[usize], &[usize]); 4] = [
        (&[3, 1], &[2, 3, 4]),
        (&[4], &[2, 3, 4]),
        (&[], &[3, 5]),
        (&[3, 5], &[3, 5]),
    ];
    let mut results: Vec<_> = cases
        .iter()
        .map(|&(from, to)| {
            grad_check(
                &format!("broadcast_to leaf {from:?} -> {to:?}"),
                &[(from, Dom::Sym(2.0))],
                |t| t[0].broadcast_to(to),
                |a| a[0].broadcast_to(to),
            )
        })
        .collect();
    results.push(grad_check(
        "broadcast_to of exp [1, 5] -> [3, 5], times sin",
        &[(&[1, 5], Dom::Sym(1.0))],
        |t| t[0].exp()?.broadcast_to(&[3, 5])?.sin(),
        |a| a[0].map(f64::exp).broadcast_to(&[3, 5]).map(f64::sin),
    ));
    all_pass(results);
}

#[test]
fn grad_contiguous_of_transposed_view() {
    all_pass(vec![
        grad_check(
            "contiguous of [3, 5].t()",
            &[(&[3, 5], Dom::Sym(2.0))],
            |t| t[0].t()?.contiguous(),
            |a| a[0].t(),
        ),
        grad_check(
            "contiguous of [2, 3, 4].permute([2, 0, 1]), then square",
            &[(&[2, 3, 4], Dom::Sym(2.0))],
            |t| t[0].permute(&[2, 0, 1])?.contiguous()?.square(),
            |a| a[0].permute(&[2, 0, 1]).map(|v| v * v),
        ),
    ]);
}

#[test]
fn grad_chain_of_views_and_ops() {
    all_pass(vec![
        grad_check(
            "x.t().matmul(y).narrow(0, 1, 2).reshape([5, 2]).exp()",
            &[(&[3, 4], Dom::Sym(1.0)), (&[3, 5], Dom::Sym(1.0))],
            |t| {
                t[0].t()?
                    .matmul(&t[1])?
                    .narrow(0, 1, 2)?
                    .reshape(&[5, 2])?
                    .exp()
            },
            |a| {
                a[0].t()
                    .matmul(&a[1])
                    .narrow(0, 1, 2)
                    .reshape(&[5, 2])
                    .map(f64::exp)
            },
        ),
        grad_check(
            "(x @ y).narrow(1, 1, 3).t().reshape([6]).tanh() * x.sum(1)[..]",
            &[(&[2, 5], Dom::Sym(1.0)), (&[5, 4], Dom::Sym(1.0))],
            |t| {
                let p = t[0]
                    .matmul(&t[1])?
                    .narrow(1, 1, 3)?
                    .t()?
                    .reshape(&[6])?
                    .tanh()?;
                let s = t[0].sum(1, false)?; // [2]
                p.reshape(&[3, 2])?.mul(&s)?.reshape(&[6])
            },
            |a| {
                let p = a[0]
                    .matmul(&a[1])
                    .narrow(1, 1, 3)
                    .t()
                    .reshape(&[6])
                    .map(f64::tanh);
                let s = a[0].sum(1, false);
                p.reshape(&[3, 2]).zip(&s, |x, y| x * y).reshape(&[6])
            },
        ),
        grad_check(
            "log_softmax(x.permute([1, 0, 2]).reshape([3, 8]) @ w).mean(1)",
            &[(&[2, 3, 4], Dom::Sym(1.0)), (&[8, 5], Dom::Sym(1.0))],
            |t| {
                t[0].permute(&[1, 0, 2])?
                    .reshape(&[3, 8])?
                    .matmul(&t[1])?
                    .log_softmax()?
                    .mean(1, false)
            },
            |a| {
                a[0].permute(&[1, 0, 2])
                    .reshape(&[3, 8])
                    .matmul(&a[1])
                    .softmax(true)
                    .mean(1, false)
            },
        ),
    ]);
}

/// Views of a broadcast result (a node whose own layout has stride 0): the view's gradient
/// must land in the node's gradient at the view's positions.
#[test]
fn grad_views_of_a_broadcast_result() {
    all_pass(vec![
        grad_check(
            "x[5].broadcast_to([3, 5]).t()",
            &[(&[5], Dom::Sym(2.0))],
            |t| t[0].broadcast_to(&[3, 5])?.t(),
            |a| a[0].broadcast_to(&[3, 5]).t(),
        ),
        grad_check(
            "x[5].broadcast_to([3, 5]).narrow(0, 1, 2)",
            &[(&[5], Dom::Sym(2.0))],
            |t| t[0].broadcast_to(&[3, 5])?.narrow(0, 1, 2),
            |a| a[0].broadcast_to(&[3, 5]).narrow(0, 1, 2),
        ),
        grad_check(
            "x[3, 1].broadcast_to([3, 4]).reshape([2, 6]).exp()",
            &[(&[3, 1], Dom::Sym(1.0))],
            |t| t[0].broadcast_to(&[3, 4])?.reshape(&[2, 6])?.exp(),
            |a| a[0].broadcast_to(&[3, 4]).reshape(&[2, 6]).map(f64::exp),
        ),
    ]);
}

/// Broadcasting ops whose operands are views of leaves (the reduced gradient is written
/// through a strided view of the leaf's gradient), and a leaf on both sides of an outer
/// product.
#[test]
fn grad_broadcast_ops_on_views_of_leaves() {
    all_pass(vec![
        grad_check(
            "[4, 3].t() + [2, 3, 4]",
            &[(&[4, 3], Dom::Sym(2.0)), (&[2, 3, 4], Dom::Sym(2.0))],
            |t| t[0].t()?.add(&t[1]),
            |a| a[0].t().zip(&a[1], |p, q| p + q),
        ),
        grad_check(
            "[4, 3].t() * [2, 3, 4]",
            &[(&[4, 3], Dom::Sym(2.0)), (&[2, 3, 4], Dom::Sym(2.0))],
            |t| t[0].t()?.mul(&t[1]),
            |a| a[0].t().zip(&a[1], |p, q| p * q),
        ),
        grad_check(
            "x[3, 1] * x.t() (outer product with itself)",
            &[(&[3, 1], Dom::Sym(2.0))],
            |t| t[0].mul(&t[0].t()?),
            |a| a[0].zip(&a[0].t(), |p, q| p * q),
        ),
    ]);
}
