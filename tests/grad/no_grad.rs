//! `no_grad` and `detach`: what they record and what gradients they let through.

use crate::common::*;
use crate::{draw, Dom, GRAD_TOL};
use wgrad::{Error, Tensor};

// ------------------------------------------------------------------------------------------
// no_grad and detach.

#[test]
fn no_grad_records_nothing() {
    let d = dev();
    let x = Tensor::from_slice(d, &[0.5, -1.0, 2.0], &[3])
        .unwrap()
        .requires_grad();
    let y = wgrad::no_grad(|| x.exp().unwrap().mul(&x).unwrap());
    assert!(!y.needs_grad(), "a result made under no_grad needs grad");
    match y.sum_all().unwrap().backward() {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("backward of a no_grad result: want InvalidArgument, got {other:?}"),
    }
    assert!(x.grad().is_none());
    assert!(wgrad::autograd::grad_enabled(), "no_grad did not restore");
}

#[test]
fn no_grad_part_of_a_loss_contributes_nothing() {
    let d = dev();
    let mut r = rng("no_grad part");
    let x = draw(&mut r, &[3, 5], Dom::Sym(1.0));
    let w = draw(&mut r, &[3, 5], Dom::Sym(1.5));
    let xt = x.upload(d).requires_grad();
    let frozen = wgrad::no_grad(|| xt.exp().unwrap().sum_all().unwrap());
    xt.mul(&w.upload(d))
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&frozen)
        .unwrap()
        .backward()
        .unwrap();
    check(
        &xt.grad().unwrap(),
        &w,
        1e-6,
        "gradient without the no_grad term",
    );
}

#[test]
fn detach_stops_the_gradient() {
    let d = dev();
    let x = draw(&mut rng("detach"), &[3, 5], Dom::Sym(1.0));
    let xt = x.upload(d).requires_grad();
    let xd = xt.detach();
    assert!(!xd.needs_grad());
    // d/dx sum(exp(stop(x)) * x) = exp(x), without the x exp(x) of the detached factor.
    xd.exp()
        .unwrap()
        .mul(&xt)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    check(
        &xt.grad().unwrap(),
        &x.map(f64::exp),
        GRAD_TOL,
        "gradient past detach",
    );
    assert!(xd.grad().is_none(), "the detached tensor got a gradient");

    // A loss of detached inputs only has nothing to differentiate.
    let loss = xd.square().unwrap().sum_all().unwrap();
    assert!(matches!(
        loss.backward(),
        Err(Error::InvalidArgument { .. })
    ));
}
