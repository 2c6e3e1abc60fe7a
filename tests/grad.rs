//! Gradient checks of every op's backward rule: the gradients `backward` records on the GPU
//! (f32) against central finite differences of a CPU f64 reference (`common::Arr`), through
//! `wgrad::autograd::gradcheck::check`. Each checked scalar is `sum(f(inputs) * w)` with a
//! fixed random weight `w` of f's output shape, so every output element carries a distinct
//! upstream gradient. Inputs are kept inside each op's domain and at least 0.1 from its kinks
//! (relu, abs, max/min, clamp), and extrema of max/min reductions are unique.
//!
//! Then, outside gradcheck: accumulation of a leaf used several times, persistence of
//! gradients across backward calls and `zero_grad` (through every kind of kernel that writes a
//! leaf's gradient: elementwise, copy, reduction, broadcast sum, matmul, scatter, views),
//! `no_grad` and `detach`, and the errors of backward. Views are checked over leaves and op
//! results whose own layout is not row-major too (a leaf made from a slice or a transpose, a
//! broadcast result, a parameter inside a flat `nn::Parameters` chunk): a view's gradient must
//! land at the viewed elements of its base's gradient.
//!
//! Error metric (gradcheck's and `assert_close`'s): |got - want| / max(|want|, 1).

mod common;

use common::reference::{gelu, sigmoid};
use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use wgrad::autograd::gradcheck::{self, GradCheckReport, Input};
use wgrad::{Error, Tensor};

type R = wgrad::Result<Tensor>;

/// Finite-difference step (f64, on the exact CPU reference).
const EPS: f64 = 1e-4;
/// Tolerance of an f32 GPU gradient against the f64 finite difference.
const GRAD_TOL: f64 = 1e-5;

// ------------------------------------------------------------------------------------------
// Inputs.

/// Where inputs are drawn (all as f32, so the GPU and the reference see the same values).
#[derive(Clone, Copy, Debug)]
enum Dom {
    /// Uniform in [-a, a).
    Sym(f32),
    /// Uniform in [lo, hi).
    Pos(f32, f32),
    /// Magnitude uniform in [lo, hi), random sign.
    Away(f32, f32),
    /// Uniform in [-a, a), at least 0.1 from each kink.
    Avoid(f32, &'static [f32]),
    /// k / 4 plus jitter in (-0.04, 0.04), k odd (true) or even (false) in [-8, 9]: a draw of
    /// each parity differ by at least 0.17 (operands of maximum / minimum).
    Grid(bool),
    /// Pairwise distinct values, spaced about `step` apart, shuffled (max / min reductions).
    Distinct(f32),
}

fn draw1(rng: &mut StdRng, dom: Dom) -> f32 {
    match dom {
        Dom::Sym(a) => rng.random_range(-a..a),
        Dom::Pos(lo, hi) => rng.random_range(lo..hi),
        Dom::Away(lo, hi) => {
            let m = rng.random_range(lo..hi);
            if rng.random_bool(0.5) {
                -m
            } else {
                m
            }
        }
        Dom::Avoid(a, kinks) => loop {
            let x: f32 = rng.random_range(-a..a);
            if kinks.iter().all(|k| (x - k).abs() >= 0.1) {
                break x;
            }
        },
        Dom::Grid(odd) => {
            let k = 2 * rng.random_range(-4..=4) + odd as i32;
            k as f32 * 0.25 + rng.random_range(-0.04..0.04)
        }
        Dom::Distinct(_) => unreachable!("drawn as a whole in draw"),
    }
}

fn draw(rng: &mut StdRng, shape: &[usize], dom: Dom) -> Arr {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = match dom {
        Dom::Distinct(step) => {
            let mid = (n as f32 - 1.0) / 2.0;
            let mut v: Vec<f32> = (0..n)
                .map(|i| (i as f32 - mid) * step + rng.random_range(-0.1 * step..0.1 * step))
                .collect();
            v.shuffle(rng);
            v
        }
        _ => (0..n).map(|_| draw1(rng, dom)).collect(),
    };
    Arr::from_f32(shape, &v)
}

// ------------------------------------------------------------------------------------------
// The gradient check.

/// Checks the gradients of `sum(gpu(inputs) * w)` against finite differences of
/// `sum(cpu(inputs) * w)`; the inputs are drawn per `inputs` from `rng(tag)`, then `w` (of
/// the reference output's shape, which the GPU output must have too).
fn grad_check(
    tag: &str,
    inputs: &[(&[usize], Dom)],
    gpu: impl Fn(&[Tensor]) -> R,
    cpu: impl Fn(&[Arr]) -> Arr,
) -> Result<GradCheckReport, String> {
    let d = dev();
    let mut rng = rng(tag);
    let xs: Vec<Arr> = inputs
        .iter()
        .map(|(s, dom)| draw(&mut rng, s, *dom))
        .collect();
    let out_shape = cpu(&xs).shape;
    let w = draw(&mut rng, &out_shape, Dom::Sym(1.5));
    let wt = w.upload(d);
    let shapes: Vec<Vec<usize>> = xs.iter().map(|a| a.shape.clone()).collect();
    let ins: Vec<Input> = xs
        .iter()
        .map(|a| Input {
            data: a.f32s(),
            shape: a.shape.clone(),
        })
        .collect();
    // Buffers the pool hands out for the gradients hold NaN until written.
    for a in xs.iter().chain([&w]) {
        poison(d, a.numel());
    }
    let res = gradcheck::check(
        d,
        &ins,
        |ts| {
            let y = gpu(ts)?;
            if y.shape() != &out_shape[..] {
                return Err(Error::ShapeMismatch {
                    op: "grad test",
                    expected: format!("an output of shape {out_shape:?}"),
                    got: y.shape().to_vec(),
                });
            }
            y.mul(&wt)?.sum_all()
        },
        |vs| {
            let arrs: Vec<Arr> = vs
                .iter()
                .zip(&shapes)
                .map(|(v, s)| Arr::new(s, v.clone()))
                .collect();
            cpu(&arrs).zip(&w, |a, b| a * b).sum_all()
        },
        EPS,
        GRAD_TOL,
    );
    match res {
        Ok(r) => {
            eprintln!("gradcheck `{tag}`: worst error {:.2e}", r.error);
            Ok(r)
        }
        Err(e) => Err(format!("`{tag}`: {e}")),
    }
}

/// Panics listing every failed case.
#[track_caller]
fn all_pass<T>(results: Vec<Result<T, String>>) {
    let n = results.len();
    let failed: Vec<String> = results.into_iter().filter_map(|r| r.err()).collect();
    if !failed.is_empty() {
        panic!(
            "{} of {n} gradient checks failed:\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
    }
}

/// One gradient check; panics when it fails.
#[track_caller]
fn gc(
    tag: &str,
    inputs: &[(&[usize], Dom)],
    gpu: impl Fn(&[Tensor]) -> R,
    cpu: impl Fn(&[Arr]) -> Arr,
) {
    all_pass(vec![grad_check(tag, inputs, gpu, cpu)]);
}

fn scalar(v: f64) -> Arr {
    Arr::new(&[], vec![v])
}

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

// ------------------------------------------------------------------------------------------
// index_select (embedding lookup).

const EMBED_IDX: [u32; 6] = [0, 3, 3, 5, 0, 1];

#[test]
fn grad_index_select_embedding_repeated_indices() {
    let idx = Tensor::from_u32(dev(), &EMBED_IDX, &[6]).unwrap();
    gc(
        "index_select [6, 4] rows [0, 3, 3, 5, 0, 1]",
        &[(&[6, 4], Dom::Sym(2.0))],
        |t| t[0].index_select(0, &idx),
        |a| a[0].index_select(0, &EMBED_IDX),
    );
}

#[test]
fn grad_index_select_of_views_and_nodes() {
    let idx = Tensor::from_u32(dev(), &EMBED_IDX, &[6]).unwrap();
    all_pass(vec![
        // Rows of a column slice: the gradient lands in a strided view of the weight's.
        grad_check(
            "index_select of [6, 7].narrow(1, 2, 4)",
            &[(&[6, 7], Dom::Sym(2.0))],
            |t| t[0].narrow(1, 2, 4)?.index_select(0, &idx),
            |a| a[0].narrow(1, 2, 4).index_select(0, &EMBED_IDX),
        ),
        // Rows of a transposed weight (a non-contiguous gradient target).
        grad_check(
            "index_select of [4, 6].t()",
            &[(&[4, 6], Dom::Sym(2.0))],
            |t| t[0].t()?.index_select(0, &idx),
            |a| a[0].t().index_select(0, &EMBED_IDX),
        ),
        // Rows of an op's result, then another op.
        grad_check(
            "index_select of tanh(x), squared",
            &[(&[6, 4], Dom::Sym(2.0))],
            |t| t[0].tanh()?.index_select(0, &idx)?.square(),
            |a| {
                a[0].map(f64::tanh)
                    .index_select(0, &EMBED_IDX)
                    .map(|v| v * v)
            },
        ),
    ]);
}

#[test]
fn index_select_backward_along_dim_1_is_refused() {
    let d = dev();
    let idx = Tensor::from_u32(d, &[1, 0], &[2]).unwrap();
    let x = Tensor::zeros(d, &[3, 4]).unwrap().requires_grad();
    match x.index_select(1, &idx) {
        Err(e @ Error::InvalidArgument { .. }) => {
            assert!(e.to_string().contains("dim 0"), "{e}")
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
}

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

/// A leaf made from a strided view of another tensor (`a.narrow(..).requires_grad()`,
/// `a.t().requires_grad()`): its gradient has the leaf's logical shape, and views of the leaf
/// must map into it by logical position.
fn check_strided_leaf(
    tag: &str,
    base_shape: &[usize],
    leaf_of: impl Fn(&Tensor) -> R,
    leaf_ref: impl Fn(&Arr) -> Arr,
    gpu: impl Fn(&Tensor) -> R,
    cpu: impl Fn(&Arr) -> Arr,
) -> Result<(), String> {
    let d = dev();
    let mut r = rng(tag);
    let base = draw(&mut r, base_shape, Dom::Sym(1.0));
    let x = leaf_ref(&base);
    let w = draw(&mut r, &cpu(&x).shape, Dom::Sym(1.5));
    let want = fd_grad(&x, &|a| cpu(a).zip(&w, |p, q| p * q).sum_all());
    poison(d, x.numel());
    let leaf = leaf_of(&base.upload(d)).unwrap().requires_grad();
    gpu(&leaf)
        .and_then(|y| y.mul(&w.upload(d)))
        .and_then(|y| y.sum_all())
        .and_then(|l| l.backward())
        .map_err(|e| format!("`{tag}`: {e}"))?;
    let g = leaf.grad().ok_or_else(|| format!("`{tag}`: no gradient"))?;
    if g.shape() != &x.shape[..] {
        return Err(format!(
            "`{tag}`: gradient of shape {:?}, want {:?}",
            g.shape(),
            x.shape
        ));
    }
    let got = g.to_vec().unwrap();
    let err = |i: usize| (got[i] as f64 - want[i]).abs() / want[i].abs().max(1.0);
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| err(i).is_nan() || err(i) > GRAD_TOL)
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    let round = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(format!(
        "`{tag}`: {} of {} gradient elements off (error over {GRAD_TOL:e});\n    got  [{}]\n    want [{}]",
        bad.len(),
        got.len(),
        round(&got.iter().map(|&v| v as f64).collect::<Vec<_>>()),
        round(&want),
    ))
}

#[test]
fn grad_of_a_leaf_that_is_a_column_slice() {
    let leaf = |t: &Tensor| t.narrow(1, 1, 3);
    let leaf_ref = |a: &Arr| a.narrow(1, 1, 3);
    all_pass(vec![
        check_strided_leaf(
            "[4, 5].narrow(1, 1, 3) leaf, exp",
            &[4, 5],
            leaf,
            leaf_ref,
            |x| x.exp(),
            |a| a.map(f64::exp),
        ),
        check_strided_leaf(
            "[4, 5].narrow(1, 1, 3) leaf, t()",
            &[4, 5],
            leaf,
            leaf_ref,
            |x| x.t(),
            |a| a.t(),
        ),
        check_strided_leaf(
            "[4, 5].narrow(1, 1, 3) leaf, narrow(0, 1, 2)",
            &[4, 5],
            leaf,
            leaf_ref,
            |x| x.narrow(0, 1, 2),
            |a| a.narrow(0, 1, 2),
        ),
    ]);
}

#[test]
fn grad_of_a_leaf_that_is_a_transposed_view() {
    let leaf = |t: &Tensor| t.t();
    let leaf_ref = |a: &Arr| a.t();
    all_pass(vec![
        check_strided_leaf(
            "[5, 3].t() leaf, exp",
            &[5, 3],
            leaf,
            leaf_ref,
            |x| x.exp(),
            |a| a.map(f64::exp),
        ),
        check_strided_leaf(
            "[5, 3].t() leaf, narrow(1, 1, 3)",
            &[5, 3],
            leaf,
            leaf_ref,
            |x| x.narrow(1, 1, 3),
            |a| a.narrow(1, 1, 3),
        ),
        check_strided_leaf(
            "[5, 3].t() leaf, t()",
            &[5, 3],
            leaf,
            leaf_ref,
            |x| x.t(),
            |a| a.t(),
        ),
    ]);
}

/// Parameters from `nn::Parameters` are views into one flat chunk, their gradients views into
/// the chunk's gradient buffer (at the parameter's offset): a view of a parameter (a tied
/// embedding's `w.t()`, a slice) must route its gradient to that parameter's own region.
#[test]
fn grad_of_views_of_parameters_in_a_flat_chunk() {
    use wgrad::nn::{ParamSpec, Parameters};
    let d = dev();
    let spec = |name: &str, shape: &[usize]| ParamSpec {
        name: name.into(),
        shape: shape.to_vec(),
        decay: true,
    };
    let params = Parameters::new(d, &[spec("a", &[4]), spec("w", &[6, 4])]).unwrap();
    let (a, w) = (params.get("a").unwrap(), params.get("w").unwrap());
    let mut r = rng("flat chunk views");
    let av = draw(&mut r, &[4], Dom::Sym(1.0));
    let wv = draw(&mut r, &[6, 4], Dom::Sym(1.0));
    a.copy_from_slice(&av.f32s()).unwrap();
    w.copy_from_slice(&wv.f32s()).unwrap();
    let c = draw(&mut r, &[4], Dom::Sym(1.5));
    let x = draw(&mut r, &[3, 4], Dom::Sym(1.5));
    let gw = draw(&mut r, &[3, 6], Dom::Sym(1.5));
    let h = draw(&mut r, &[3, 4], Dom::Sym(1.5));
    let up = |v: &Arr| v.upload(d);
    let mut results: Vec<Result<(), String>> = Vec::new();
    let mut compare = |what: &str, t: &Tensor, want: &Arr| {
        let got = t.grad().expect("a gradient").to_vec().unwrap();
        let bad = got.iter().zip(&want.data).any(|(&g, &w)| {
            let e = (g as f64 - w).abs() / w.abs().max(1.0);
            e.is_nan() || e > GRAD_TOL
        });
        if bad {
            let show = |v: &mut dyn Iterator<Item = f64>| {
                v.map(|x| format!("{x:.4}")).collect::<Vec<_>>().join(", ")
            };
            results.push(Err(format!(
                "{what}:\n    got  [{}]\n    want [{}]",
                show(&mut got.iter().map(|&v| v as f64)),
                show(&mut want.data.iter().copied())
            )));
        }
    };

    // sum(a * c) + sum((x @ w.t()) * gw) + sum(w.narrow(0, 2, 3) * h)
    let loss = a
        .mul(&up(&c))
        .unwrap()
        .sum_all()
        .unwrap()
        .add(
            &up(&x)
                .matmul(&w.t().unwrap())
                .unwrap()
                .mul(&up(&gw))
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap()
        .add(
            &w.narrow(0, 2, 3)
                .unwrap()
                .mul(&up(&h))
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap();
    loss.backward().unwrap();
    let want_w = gw.t().matmul(&x).zip(
        &Arr::build(&[6, 4], |i| {
            if (2..5).contains(&i[0]) {
                h.at(&[i[0] - 2, i[1]])
            } else {
                0.0
            }
        }),
        |p, q| p + q,
    );
    compare("a (after backward through views of w)", a, &c);
    compare("w (through w.t() and w.narrow)", w, &want_w);

    // Only views of w, after zero_grad: the slice-only contribution lands in w's region.
    params.zero_grad();
    w.narrow(0, 2, 3)
        .unwrap()
        .mul(&up(&h))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let want_slice = Arr::build(&[6, 4], |i| {
        if (2..5).contains(&i[0]) {
            h.at(&[i[0] - 2, i[1]])
        } else {
            0.0
        }
    });
    compare("w (slice only, after zero_grad)", w, &want_slice);
    assert!(
        a.grad().is_none(),
        "a got a gradient from a loss over w alone"
    );
    all_pass(results);
}

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

/// Central finite differences of the f64 `f` at `x`.
fn fd_grad(x: &Arr, f: &impl Fn(&Arr) -> f64) -> Vec<f64> {
    (0..x.numel())
        .map(|i| {
            let (mut p, mut m) = (x.clone(), x.clone());
            p.data[i] += EPS;
            m.data[i] -= EPS;
            (f(&p) - f(&m)) / (2.0 * EPS)
        })
        .collect()
}

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
