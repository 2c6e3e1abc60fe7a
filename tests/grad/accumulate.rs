//! Accumulation of gradients: an intermediate result with several consumers, a leaf used
//! several times, and gradients that add up across backward calls until `zero_grad` (through
//! every kind of kernel that writes a leaf's gradient), partial backwards after `zero_grad`,
//! a seeded backward of a non-scalar.

use crate::common::*;
use crate::{all_pass, draw, fd_grad, grad_check, scalar, Dom, EMBED_IDX, GRAD_TOL, R};
use wgrad::Tensor;

// ------------------------------------------------------------------------------------------
// Gradient flowing into an intermediate result from several consumers (its own gradient
// made from a borrowed one, an owned one, and through views).

#[test]
fn grad_intermediate_with_several_consumers() {
    all_pass(vec![
        grad_check(
            "y = exp(x); y * y + y",
            &[(&[3, 5], Dom::Sym(1.0))],
            |t| {
                let y = t[0].exp()?;
                y.mul(&y)?.add(&y)
            },
            |a| a[0].map(|v| v.exp() * v.exp() + v.exp()),
        ),
        grad_check(
            "y = exp(x); y + y * sin(y)",
            &[(&[3, 5], Dom::Sym(1.0))],
            |t| {
                let y = t[0].exp()?;
                y.add(&y.mul(&y.sin()?)?)
            },
            |a| a[0].map(|v| v.exp() + v.exp() * v.exp().sin()),
        ),
        grad_check(
            "y = tanh(x); y + y.t().t() + y.narrow(1, 0, 1)",
            &[(&[3, 5], Dom::Sym(1.0))],
            |t| {
                let y = t[0].tanh()?;
                y.add(&y.t()?.t()?)?.add(&y.narrow(1, 0, 1)?)
            },
            |a| {
                let y = a[0].map(f64::tanh);
                y.zip(&y, |p, q| p + q)
                    .zip(&y.narrow(1, 0, 1), |p, q| p + q)
            },
        ),
        grad_check(
            "x + x.t().t() + x.narrow(0, 1, 1) (leaf through views)",
            &[(&[3, 5], Dom::Sym(1.0))],
            |t| {
                let x = &t[0];
                x.narrow(0, 1, 1)?.add(&x.t()?.t()?)?.add(x)?.square()
            },
            |a| {
                let x = &a[0];
                x.narrow(0, 1, 1)
                    .zip(x, |p, q| p + q)
                    .zip(x, |p, q| p + q)
                    .map(|v| v * v)
            },
        ),
    ]);
}

// ------------------------------------------------------------------------------------------
// Accumulation and persistence of leaf gradients (not through gradcheck).

#[test]
fn leaf_used_several_times_gets_the_sum_of_contributions() {
    let d = dev();
    let x = draw(&mut rng("accumulate"), &[3, 5], Dom::Sym(1.5));
    let xt = x.upload(d).requires_grad();
    let loss = xt
        .mul(&xt)
        .unwrap()
        .add(&xt.exp().unwrap())
        .unwrap()
        .add(&xt)
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    let want = x.map(|v| 2.0 * v + v.exp() + 1.0);
    check(
        &xt.grad().expect("a gradient"),
        &want,
        GRAD_TOL,
        "d/dx sum(x*x + exp x + x)",
    );
}

/// Two backwards of `loss(x)` add up (2x), `zero_grad` clears (grad() is None), the next
/// backward overwrites (1x), and the one after adds again (2x): the new, accumulate and
/// overwrite paths of the kernel that writes x's gradient.
#[track_caller]
fn check_persistence(
    tag: &str,
    shape: &[usize],
    dom: Dom,
    gpu: impl Fn(&Tensor) -> R,
    cpu: impl Fn(&Arr) -> Arr,
) {
    let d = dev();
    let mut r = rng(tag);
    let x = draw(&mut r, shape, dom);
    let w = draw(&mut r, &cpu(&x).shape, Dom::Sym(1.5));
    let wt = w.upload(d);
    let want = fd_grad(&x, &|a| cpu(a).zip(&w, |p, q| p * q).sum_all());
    let twice: Vec<f64> = want.iter().map(|v| 2.0 * v).collect();
    let xt = x.upload(d).requires_grad();
    let step = || {
        poison(d, x.numel());
        gpu(&xt)
            .and_then(|y| y.mul(&wt))
            .and_then(|y| y.sum_all())
            .and_then(|l| l.backward())
            .unwrap_or_else(|e| panic!("{tag}: {e}"));
        xt.grad()
            .unwrap_or_else(|| panic!("{tag}: no gradient after backward"))
            .to_vec()
            .unwrap()
    };
    assert!(xt.grad().is_none(), "{tag}: a gradient before backward");
    assert_close(&step(), &want, GRAD_TOL, &format!("{tag}: first backward"));
    assert_close(
        &step(),
        &twice,
        GRAD_TOL,
        &format!("{tag}: second backward (accumulated)"),
    );
    xt.zero_grad();
    assert!(xt.grad().is_none(), "{tag}: a gradient after zero_grad");
    assert_close(
        &step(),
        &want,
        GRAD_TOL,
        &format!("{tag}: backward after zero_grad"),
    );
    assert_close(&step(), &twice, GRAD_TOL, &format!("{tag}: and one more"));
}

#[test]
fn grads_add_up_across_backwards_until_zero_grad_elementwise() {
    check_persistence(
        "persist exp",
        &[3, 5],
        Dom::Sym(1.0),
        |x| x.exp(),
        |a| a.map(f64::exp),
    );
    check_persistence(
        "persist exp vec4",
        &[2, 3, 4],
        Dom::Sym(1.0),
        |x| x.exp(),
        |a| a.map(f64::exp),
    );
}

#[test]
fn grads_add_up_across_backwards_until_zero_grad_pass_through() {
    // add passes the gradient through: the leaf's gradient is a copy of it.
    check_persistence(
        "persist add",
        &[3, 5],
        Dom::Sym(1.0),
        |x| x.add(&Tensor::ones(x.device(), &[3, 5])?),
        |a| a.map(|v| v + 1.0),
    );
}

#[test]
fn grads_add_up_across_backwards_until_zero_grad_broadcast_sum() {
    check_persistence(
        "persist broadcast mul",
        &[3, 1],
        Dom::Sym(1.0),
        |x| x.mul(&Tensor::full(x.device(), &[3, 5], 1.5)?),
        |a| a.broadcast_to(&[3, 5]).map(|v| v * 1.5),
    );
    check_persistence(
        "persist broadcast_to",
        &[4],
        Dom::Sym(1.0),
        |x| x.broadcast_to(&[2, 3, 4]),
        |a| a.broadcast_to(&[2, 3, 4]),
    );
}

#[test]
fn grads_add_up_across_backwards_until_zero_grad_reductions() {
    check_persistence(
        "persist mean_all",
        &[3, 5],
        Dom::Sym(1.0),
        |x| x.mean_all(),
        |a| scalar(a.mean_all()),
    );
    check_persistence(
        "persist max dim 1",
        &[3, 5],
        Dom::Distinct(0.15),
        |x| x.max(1, false),
        |a| a.max(1, false),
    );
    check_persistence(
        "persist softmax",
        &[3, 7],
        Dom::Sym(2.0),
        |x| x.softmax(),
        |a| a.softmax(false),
    );
}

#[test]
fn grads_add_up_across_backwards_until_zero_grad_matmul() {
    let b = draw(&mut rng("persist matmul b"), &[3, 4], Dom::Sym(1.0));
    let bt = b.upload(dev());
    check_persistence(
        "persist matmul",
        &[5, 3],
        Dom::Sym(1.0),
        |x| x.matmul(&bt),
        |a| a.matmul(&b),
    );
    check_persistence(
        "persist matmul of x.t()",
        &[4, 3],
        Dom::Sym(1.0),
        |x| bt.t()?.matmul(&x.t()?),
        |a| b.t().matmul(&a.t()),
    );
}

#[test]
fn grads_add_up_across_backwards_until_zero_grad_views() {
    check_persistence(
        "persist narrow",
        &[4, 5],
        Dom::Sym(1.0),
        |x| x.narrow(1, 1, 3)?.exp(),
        |a| a.narrow(1, 1, 3).map(f64::exp),
    );
    check_persistence(
        "persist transpose",
        &[3, 5],
        Dom::Sym(1.0),
        |x| x.t()?.exp(),
        |a| a.t().map(f64::exp),
    );
}

#[test]
fn grads_add_up_across_backwards_until_zero_grad_index_select() {
    let idx = Tensor::from_u32(dev(), &EMBED_IDX, &[6]).unwrap();
    check_persistence(
        "persist index_select",
        &[6, 4],
        Dom::Sym(1.0),
        |x| x.index_select(0, &idx),
        |a| a.index_select(0, &EMBED_IDX),
    );
    check_persistence(
        "persist index_select of a column slice",
        &[6, 7],
        Dom::Sym(1.0),
        |x| x.narrow(1, 2, 4)?.index_select(0, &idx),
        |a| a.narrow(1, 2, 4).index_select(0, &EMBED_IDX),
    );
}

/// After zero_grad, a backward that reaches only part of the leaf (a slice) leaves the rest
/// of the gradient at 0, not at the stale values.
#[test]
fn zero_grad_then_partial_backward_zeroes_the_rest() {
    let d = dev();
    let x = draw(&mut rng("zero_grad partial"), &[4, 5], Dom::Sym(1.0));
    let xt = x.upload(d).requires_grad();
    xt.exp().unwrap().sum_all().unwrap().backward().unwrap();
    assert_close(
        &xt.grad().unwrap().to_vec().unwrap(),
        &x.map(f64::exp).data,
        GRAD_TOL,
        "full backward",
    );
    xt.zero_grad();
    xt.narrow(0, 1, 2)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let want = Arr::build(&[4, 5], |c| if (1..3).contains(&c[0]) { 1.0 } else { 0.0 });
    check(
        &xt.grad().unwrap(),
        &want,
        0.0,
        "slice backward after zero_grad",
    );

    // And an index_select that skips rows 2 and 4, after zero_grad.
    let e = Tensor::from_slice(d, &[1.0; 24], &[6, 4])
        .unwrap()
        .requires_grad();
    e.exp().unwrap().sum_all().unwrap().backward().unwrap();
    e.zero_grad();
    let idx = Tensor::from_u32(d, &EMBED_IDX, &[6]).unwrap();
    e.index_select(0, &idx)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let counts = [2.0, 1.0, 0.0, 2.0, 0.0, 1.0];
    let want = Arr::build(&[6, 4], |c| counts[c[0]]);
    check(
        &e.grad().unwrap(),
        &want,
        0.0,
        "index_select backward after zero_grad",
    );
}

#[test]
fn backward_with_a_seed_on_a_non_scalar() {
    let d = dev();
    let mut r = rng("backward_with");
    let x = draw(&mut r, &[3, 5], Dom::Sym(1.0));
    let seed = draw(&mut r, &[3, 5], Dom::Sym(1.5));
    let xt = x.upload(d).requires_grad();
    xt.exp().unwrap().backward_with(&seed.upload(d)).unwrap();
    let want = x.zip(&seed, |v, s| v.exp() * s);
    check(
        &xt.grad().unwrap(),
        &want,
        GRAD_TOL,
        "seeded backward of exp",
    );
}
