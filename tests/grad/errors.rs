//! Errors of backward: a non-scalar without a seed, nothing requiring grad, a seed of the wrong
//! shape, and a graph (or part of one) already released.

use crate::common::*;
use crate::{draw, Dom, GRAD_TOL};
use wgrad::{Error, Tensor};

// ------------------------------------------------------------------------------------------
// Errors.

#[test]
fn backward_without_seed_on_non_scalar_errors() {
    let d = dev();
    let x = Tensor::from_slice(d, &[0.5, -1.0, 2.0], &[3])
        .unwrap()
        .requires_grad();
    let y = x.exp().unwrap();
    match y.backward() {
        Err(e @ Error::InvalidArgument { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("one-element") && m.contains("[3]"),
                "message: {m}"
            );
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
    assert!(x.grad().is_none());
    // The refused call left the graph intact.
    y.backward_with(&Tensor::ones(d, &[3]).unwrap()).unwrap();
    let want: Vec<f64> = [0.5f64, -1.0, 2.0].iter().map(|v| v.exp()).collect();
    assert_close(
        &x.grad().unwrap().to_vec().unwrap(),
        &want,
        GRAD_TOL,
        "after the refusal",
    );
}

#[test]
fn backward_without_any_grad_input_errors() {
    let d = dev();
    let x = Tensor::from_slice(d, &[0.5, -1.0, 2.0], &[3]).unwrap();
    match x.exp().unwrap().sum_all().unwrap().backward() {
        Err(e @ Error::InvalidArgument { .. }) => {
            let m = e.to_string();
            assert!(m.contains("does not require grad"), "message: {m}");
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
}

#[test]
fn backward_with_a_seed_of_the_wrong_shape_errors() {
    let d = dev();
    let x = Tensor::zeros(d, &[3, 5]).unwrap().requires_grad();
    let y = x.exp().unwrap();
    match y.backward_with(&Tensor::ones(d, &[5, 3]).unwrap()) {
        Err(e @ Error::ShapeMismatch { .. }) => {
            let m = e.to_string();
            assert!(m.contains("[3, 5]") && m.contains("seed"), "message: {m}");
        }
        other => panic!("want ShapeMismatch, got {other:?}"),
    }
    assert!(x.grad().is_none());
}

#[test]
fn second_backward_over_a_released_graph_errors() {
    let d = dev();
    let x = draw(&mut rng("second backward"), &[3, 5], Dom::Sym(1.0));
    let xt = x.upload(d).requires_grad();
    let loss = xt.exp().unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    match loss.backward() {
        Err(e @ Error::InvalidArgument { .. }) => {
            let m = e.to_string();
            assert!(m.contains("released"), "message: {m}");
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
    // The refused backward added nothing.
    check(
        &xt.grad().unwrap(),
        &x.map(f64::exp),
        GRAD_TOL,
        "gradient after the refusal",
    );
}

#[test]
fn backward_through_a_released_subgraph_errors() {
    let d = dev();
    let x = draw(&mut rng("released subgraph"), &[3, 5], Dom::Sym(1.0));
    let xt = x.upload(d).requires_grad();
    let y = xt.exp().unwrap();
    y.sum_all().unwrap().backward().unwrap();
    // A new loss over y: y's own node was released by the first backward.
    let loss = y.mul_scalar(2.0).unwrap().sum_all().unwrap();
    match loss.backward() {
        Err(e @ Error::InvalidArgument { .. }) => {
            let m = e.to_string();
            assert!(m.contains("released"), "message: {m}");
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
    check(
        &xt.grad().unwrap(),
        &x.map(f64::exp),
        GRAD_TOL,
        "gradient after the refusal",
    );
}
