//! Gradients of the elementwise ops: unary ops, ops with a scalar, binary ops (same shapes and
//! broadcast, a 0-d operand), and where (to x and y, not the condition).

use crate::common::reference::{gelu, sigmoid};
use crate::common::*;
use crate::{all_pass, grad_check, Dom, R};
use rand::Rng;
use wgrad::Tensor;

// ------------------------------------------------------------------------------------------
// Unary ops: on [3, 5] (the strided kernel) and [2, 3, 4] (the vec4 kernel).

#[track_caller]
fn check_unary(name: &str, dom: Dom, gpu: impl Fn(&Tensor) -> R, cpu: impl Fn(f64) -> f64) {
    let results = [&[3usize, 5][..], &[2, 3, 4]]
        .into_iter()
        .map(|shape| {
            grad_check(
                &format!("{name} {shape:?}"),
                &[(shape, dom)],
                |t| gpu(&t[0]),
                |a| a[0].map(&cpu),
            )
        })
        .collect();
    all_pass(results);
}

#[test]
fn grad_neg() {
    check_unary("neg", Dom::Sym(2.0), |x| x.neg(), |x| -x);
}

#[test]
fn grad_exp() {
    check_unary("exp", Dom::Sym(2.0), |x| x.exp(), f64::exp);
}

#[test]
fn grad_log_on_positives() {
    check_unary("log", Dom::Pos(0.2, 3.0), |x| x.log(), f64::ln);
}

#[test]
fn grad_sqrt_on_positives() {
    check_unary("sqrt", Dom::Pos(0.2, 3.0), |x| x.sqrt(), f64::sqrt);
}

#[test]
fn grad_rsqrt_on_positives() {
    check_unary(
        "rsqrt",
        Dom::Pos(0.2, 3.0),
        |x| x.rsqrt(),
        |x| 1.0 / x.sqrt(),
    );
}

#[test]
fn grad_abs_away_from_zero() {
    check_unary("abs", Dom::Avoid(2.0, &[0.0]), |x| x.abs(), f64::abs);
}

#[test]
fn grad_relu_away_from_zero() {
    check_unary(
        "relu",
        Dom::Avoid(2.0, &[0.0]),
        |x| x.relu(),
        |x| x.max(0.0),
    );
}

#[test]
fn grad_tanh() {
    check_unary("tanh", Dom::Sym(3.0), |x| x.tanh(), f64::tanh);
}

#[test]
fn grad_sigmoid() {
    check_unary("sigmoid", Dom::Sym(4.0), |x| x.sigmoid(), sigmoid);
}

#[test]
fn grad_gelu() {
    check_unary("gelu", Dom::Sym(3.0), |x| x.gelu(), gelu);
}

#[test]
fn grad_sin() {
    check_unary("sin", Dom::Sym(3.0), |x| x.sin(), f64::sin);
}

#[test]
fn grad_cos() {
    check_unary("cos", Dom::Sym(3.0), |x| x.cos(), f64::cos);
}

#[test]
fn grad_square() {
    check_unary("square", Dom::Sym(2.0), |x| x.square(), |x| x * x);
}

#[test]
fn grad_recip_on_positives() {
    check_unary("recip", Dom::Pos(0.4, 2.0), |x| x.recip(), |x| 1.0 / x);
}

#[test]
fn grad_recip_on_negatives_too() {
    check_unary(
        "recip mixed",
        Dom::Away(0.4, 2.0),
        |x| x.recip(),
        |x| 1.0 / x,
    );
}

// ------------------------------------------------------------------------------------------
// Ops with a scalar.

#[test]
fn grad_add_scalar() {
    check_unary(
        "add_scalar",
        Dom::Sym(2.0),
        |x| x.add_scalar(0.7),
        |x| x + 0.7,
    );
}

#[test]
fn grad_mul_scalar() {
    check_unary(
        "mul_scalar",
        Dom::Sym(2.0),
        |x| x.mul_scalar(-1.3),
        |x| x * -1.3,
    );
}

#[test]
fn grad_pow_scalar_2_mixed_sign() {
    check_unary(
        "pow_scalar 2",
        Dom::Sym(2.0),
        |x| x.pow_scalar(2.0),
        |x| x.powi(2),
    );
}

#[test]
fn grad_pow_scalar_3_mixed_sign() {
    check_unary(
        "pow_scalar 3",
        Dom::Sym(2.0),
        |x| x.pow_scalar(3.0),
        |x| x.powi(3),
    );
}

#[test]
fn grad_pow_scalar_half_on_positives() {
    check_unary(
        "pow_scalar 0.5",
        Dom::Pos(0.2, 3.0),
        |x| x.pow_scalar(0.5),
        f64::sqrt,
    );
}

#[test]
fn grad_pow_scalar_negative_integers_mixed_sign() {
    check_unary(
        "pow_scalar -1",
        Dom::Away(0.5, 2.0),
        |x| x.pow_scalar(-1.0),
        |x| x.powi(-1),
    );
    check_unary(
        "pow_scalar -2",
        Dom::Away(0.5, 2.0),
        |x| x.pow_scalar(-2.0),
        |x| x.powi(-2),
    );
}

#[test]
fn grad_max_scalar_away_from_kink() {
    check_unary(
        "max_scalar",
        Dom::Avoid(2.0, &[0.3]),
        |x| x.max_scalar(0.3),
        |x| x.max(0.3),
    );
}

#[test]
fn grad_min_scalar_away_from_kink() {
    check_unary(
        "min_scalar",
        Dom::Avoid(2.0, &[-0.2]),
        |x| x.min_scalar(-0.2),
        |x| x.min(-0.2),
    );
}

#[test]
fn grad_rsub_scalar() {
    check_unary(
        "rsub_scalar",
        Dom::Sym(2.0),
        |x| x.rsub_scalar(1.5),
        |x| 1.5 - x,
    );
}

#[test]
fn grad_rdiv_scalar_away_from_zero() {
    check_unary(
        "rdiv_scalar",
        Dom::Away(0.5, 2.0),
        |x| x.rdiv_scalar(2.5),
        |x| 2.5 / x,
    );
}

#[test]
fn grad_clamp_away_from_bounds() {
    check_unary(
        "clamp",
        Dom::Avoid(2.0, &[-0.5, 0.8]),
        |x| x.clamp(-0.5, 0.8),
        |x| x.clamp(-0.5, 0.8),
    );
}

#[test]
fn grad_affine() {
    check_unary(
        "affine",
        Dom::Sym(2.0),
        |x| x.affine(1.7, -0.4),
        |x| x * 1.7 - 0.4,
    );
}

// ------------------------------------------------------------------------------------------
// Binary ops, both operands requiring grad: same shape (strided and vec4 kernels), and
// broadcast either way, including a 0-d operand.

const BINARY_SHAPES: [(&[usize], &[usize]); 7] = [
    (&[3, 5], &[3, 5]),
    (&[2, 3, 4], &[2, 3, 4]),
    (&[2, 3, 4], &[3, 1]),
    (&[4], &[2, 3, 4]),
    (&[], &[3, 5]),
    (&[3, 5], &[]),
    (&[3, 1], &[1, 4]),
];

#[track_caller]
fn check_binary(
    name: &str,
    da: Dom,
    db: Dom,
    gpu: impl Fn(&Tensor, &Tensor) -> R,
    cpu: impl Fn(f64, f64) -> f64,
) {
    let results = BINARY_SHAPES
        .iter()
        .map(|&(sa, sb)| {
            grad_check(
                &format!("{name} {sa:?} {sb:?}"),
                &[(sa, da), (sb, db)],
                |t| gpu(&t[0], &t[1]),
                |a| a[0].zip(&a[1], &cpu),
            )
        })
        .collect();
    all_pass(results);
}

#[test]
fn grad_add() {
    check_binary(
        "add",
        Dom::Sym(2.0),
        Dom::Sym(2.0),
        |a, b| a.add(b),
        |a, b| a + b,
    );
}

#[test]
fn grad_sub() {
    check_binary(
        "sub",
        Dom::Sym(2.0),
        Dom::Sym(2.0),
        |a, b| a.sub(b),
        |a, b| a - b,
    );
}

#[test]
fn grad_mul() {
    check_binary(
        "mul",
        Dom::Sym(2.0),
        Dom::Sym(2.0),
        |a, b| a.mul(b),
        |a, b| a * b,
    );
}

#[test]
fn grad_div_away_from_zero() {
    check_binary(
        "div",
        Dom::Sym(2.0),
        Dom::Away(0.5, 2.0),
        |a, b| a.div(b),
        |a, b| a / b,
    );
}

#[test]
fn grad_maximum_without_ties() {
    check_binary(
        "maximum",
        Dom::Grid(true),
        Dom::Grid(false),
        |a, b| a.maximum(b),
        f64::max,
    );
}

#[test]
fn grad_minimum_without_ties() {
    check_binary(
        "minimum",
        Dom::Grid(true),
        Dom::Grid(false),
        |a, b| a.minimum(b),
        f64::min,
    );
}

#[test]
fn grad_pow_positive_base() {
    check_binary(
        "pow",
        Dom::Pos(0.5, 2.0),
        Dom::Sym(2.0),
        |a, b| a.pow(b),
        f64::powf,
    );
}

#[test]
fn grad_where_to_x_and_y_not_cond() {
    let shapes: [(&[usize], &[usize], &[usize]); 3] = [
        (&[3, 5], &[3, 5], &[3, 5]),
        (&[3, 5], &[3, 1], &[]),
        (&[2, 3, 4], &[4], &[3, 1]),
    ];
    let results = shapes
        .iter()
        .map(|&(sc, sx, sy)| {
            let tag = format!("where {sc:?} {sx:?} {sy:?}");
            let mut r = rng(&format!("{tag} cond"));
            let n: usize = sc.iter().product();
            let cv: Vec<f32> = (0..n).map(|_| r.random_range(0..2) as f32).collect();
            let cond = Arr::from_f32(sc, &cv);
            let ct = cond.upload(dev());
            grad_check(
                &tag,
                &[(sx, Dom::Sym(2.0)), (sy, Dom::Sym(2.0))],
                |t| Tensor::where_cond(&ct, &t[0], &t[1]),
                |a| Arr::where_cond(&cond, &a[0], &a[1]),
            )
        })
        .collect();
    all_pass(results);

    // A condition that requires grad still gets none (it is not differentiable).
    let d = dev();
    let cond = Tensor::from_slice(d, &[1.0, 0.0, 1.0], &[3])
        .unwrap()
        .requires_grad();
    let x = Tensor::from_slice(d, &[1.0, 2.0, 3.0], &[3])
        .unwrap()
        .requires_grad();
    let y = Tensor::from_slice(d, &[4.0, 5.0, 6.0], &[3])
        .unwrap()
        .requires_grad();
    Tensor::where_cond(&cond, &x, &y)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(cond.grad().is_none(), "the condition got a gradient");
    assert_eq!(x.grad().unwrap().to_vec().unwrap(), [1.0, 0.0, 1.0]);
    assert_eq!(y.grad().unwrap().to_vec().unwrap(), [0.0, 1.0, 0.0]);
}
