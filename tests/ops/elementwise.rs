//! Elementwise ops against f64: unary ops, ops with scalar operands, binary ops on same
//! shapes and broadcast, comparisons (with ties) and where, on operands of odd sizes
//! (the scalar path), multiples of 4 (vec4) and views (strided); on rank 8 views, and past
//! 65,535 workgroups.

use crate::common::reference::{gelu, sigmoid};
use crate::common::*;
use crate::{make, rank8_reversed, Dom, R, V};
use wgrad::{Device, Error, Tensor};

/// Operands of unary ops: odd contiguous sizes (scalar path), multiples of 4 (vec4 path),
/// offsets, transposed, narrowed, permuted and broadcast views (strided path).
const UNARY_VIEWS: &[V] = &[
    V::C(&[1]),
    V::C(&[3]),
    V::C(&[257]),
    V::C(&[1031]),
    V::C(&[1032]),
    V::C(&[4, 65]),
    V::N(&[9, 8], 0, 2, 5),  // contiguous, offset 16: vec4 with an offset
    V::N(&[9, 6], 0, 1, 6),  // contiguous, offset 6: no vec4
    V::N(&[7, 10], 1, 3, 5), // non-contiguous
    V::T(13, 11),
    V::P(&[3, 5, 7], &[2, 0, 1]),
    V::B(&[5, 1], &[5, 6]),
];

fn check_unary_on(
    d: &Device,
    tag: &str,
    dom: Dom,
    tol: f64,
    gpu: impl Fn(&Tensor) -> R,
    cpu: impl Fn(f64) -> f64,
) {
    let mut rng = rng(tag);
    for &v in UNARY_VIEWS {
        let (x, a) = make(d, &mut rng, dom, v);
        poison(d, x.numel());
        let y = gpu(&x).unwrap_or_else(|e| panic!("{tag} {v:?}: {e}"));
        check(&y, &a.map(&cpu), tol, &format!("{tag} on {v:?}"));
    }
}

fn check_unary(tag: &str, dom: Dom, gpu: impl Fn(&Tensor) -> R, cpu: impl Fn(f64) -> f64) {
    check_unary_on(dev(), tag, dom, TOL, gpu, cpu)
}

/// Pairs of same-shape operands: odd sizes (scalar path), multiples of 4 (vec4 path), and
/// views (strided path).
const BINARY_PAIRS: &[(V, V)] = &[
    (V::C(&[1]), V::C(&[1])),
    (V::C(&[3]), V::C(&[3])),
    (V::C(&[257]), V::C(&[257])),
    (V::C(&[1031]), V::C(&[1031])),
    (V::C(&[70001]), V::C(&[70001])),
    (V::C(&[4]), V::C(&[4])),
    (V::C(&[260]), V::C(&[260])),
    (V::C(&[1032]), V::C(&[1032])),
    (V::C(&[70004]), V::C(&[70004])),
    (V::T(29, 37), V::C(&[37, 29])),
    (V::C(&[37, 29]), V::T(29, 37)),
    (V::T(29, 37), V::T(29, 37)),
    (V::N(&[9, 8], 0, 2, 5), V::C(&[5, 8])),
    (V::N(&[9, 8], 0, 2, 5), V::N(&[7, 8], 0, 1, 5)),
    (V::N(&[9, 6], 0, 1, 6), V::C(&[6, 6])),
    (V::C(&[7, 5]), V::N(&[7, 10], 1, 3, 5)),
    (V::P(&[3, 5, 7], &[2, 0, 1]), V::C(&[7, 3, 5])),
];

/// Broadcasting corners (shapes differ; includes views).
const BROADCAST_PAIRS: &[(V, V)] = &[
    (V::C(&[3, 1, 5]), V::C(&[4, 1])),
    (V::C(&[]), V::C(&[7])),
    (V::C(&[7]), V::C(&[])),
    (V::C(&[2, 3]), V::C(&[3])),
    (V::C(&[6, 7]), V::C(&[1, 7])), // row
    (V::C(&[6, 7]), V::C(&[6, 1])), // column
    (V::C(&[1, 7]), V::C(&[6, 7])),
    (V::C(&[4, 1]), V::C(&[1, 5])), // outer
    (V::T(7, 6), V::C(&[7])),       // transposed view + row
    (V::C(&[3, 4, 5]), V::T(5, 4)), // a transposed view broadcast over a batch
    (V::T(5, 4), V::C(&[3, 4, 5])),
    (V::B(&[5, 1], &[5, 6]), V::C(&[6])),
    (V::C(&[257, 1]), V::C(&[1, 259])),
    (V::C(&[2, 1, 3, 1]), V::C(&[4, 1, 5])),
];

fn check_binary_pairs(
    tag: &str,
    pairs: &[(V, V)],
    (da, db): (Dom, Dom),
    gpu: impl Fn(&Tensor, &Tensor) -> R,
    cpu: impl Fn(f64, f64) -> f64,
) {
    let d = dev();
    let mut rng = rng(tag);
    for &(va, vb) in pairs {
        let (x, a) = make(d, &mut rng, da, va);
        let (y, b) = make(d, &mut rng, db, vb);
        let want = a.zip(&b, &cpu);
        poison(d, want.numel());
        let z = gpu(&x, &y).unwrap_or_else(|e| panic!("{tag} {va:?} {vb:?}: {e}"));
        check(&z, &want, TOL, &format!("{tag} on {va:?} and {vb:?}"));
    }
}

fn check_binary(
    tag: &str,
    doms: (Dom, Dom),
    gpu: impl Fn(&Tensor, &Tensor) -> R,
    cpu: impl Fn(f64, f64) -> f64,
) {
    check_binary_pairs(tag, BINARY_PAIRS, doms, &gpu, &cpu);
    check_binary_pairs(
        &format!("{tag} broadcast"),
        BROADCAST_PAIRS,
        doms,
        &gpu,
        &cpu,
    );
}

// ------------------------------------------------------------------------------------------
// Unary ops.

#[test]
fn unary_neg() {
    check_unary("neg", Dom::Sym(3.0), |x| x.neg(), |x| -x);
}

#[test]
fn unary_exp() {
    check_unary("exp", Dom::Sym(5.0), |x| x.exp(), f64::exp);
}

#[test]
fn unary_log_on_positives() {
    check_unary("log", Dom::Pos(0.01, 10.0), |x| x.log(), f64::ln);
}

#[test]
fn unary_sqrt_on_positives() {
    check_unary("sqrt", Dom::Pos(0.01, 10.0), |x| x.sqrt(), f64::sqrt);
}

#[test]
fn unary_rsqrt_on_positives() {
    check_unary(
        "rsqrt",
        Dom::Pos(0.01, 10.0),
        |x| x.rsqrt(),
        |x| 1.0 / x.sqrt(),
    );
}

#[test]
fn unary_abs() {
    check_unary("abs", Dom::Sym(3.0), |x| x.abs(), f64::abs);
}

#[test]
fn unary_relu() {
    check_unary("relu", Dom::Sym(3.0), |x| x.relu(), |x| x.max(0.0));
}

#[test]
fn unary_tanh_including_saturation() {
    check_unary("tanh", Dom::Sym(20.0), |x| x.tanh(), f64::tanh);
}

#[test]
fn unary_sigmoid_including_saturation() {
    check_unary("sigmoid", Dom::Sym(30.0), |x| x.sigmoid(), sigmoid);
}

#[test]
fn unary_gelu_tanh_approximation() {
    check_unary("gelu", Dom::Sym(6.0), |x| x.gelu(), gelu);
}

#[test]
fn unary_sin() {
    check_unary("sin", Dom::Sym(4.0), |x| x.sin(), f64::sin);
}

#[test]
fn unary_cos() {
    check_unary("cos", Dom::Sym(4.0), |x| x.cos(), f64::cos);
}

#[test]
fn unary_square() {
    check_unary("square", Dom::Sym(3.0), |x| x.square(), |x| x * x);
}

#[test]
fn unary_recip_away_from_zero() {
    check_unary("recip", Dom::Away(0.25, 4.0), |x| x.recip(), |x| 1.0 / x);
}

// ------------------------------------------------------------------------------------------
// Ops with scalar operands.

#[test]
fn scalar_add() {
    check_unary(
        "add_scalar",
        Dom::Sym(3.0),
        |x| x.add_scalar(2.5),
        |x| x + 2.5,
    );
}

#[test]
fn scalar_mul() {
    check_unary(
        "mul_scalar",
        Dom::Sym(3.0),
        |x| x.mul_scalar(-1.75),
        |x| x * -1.75,
    );
}

#[test]
fn scalar_pow_2_on_negatives_and_positives() {
    check_unary(
        "pow_scalar 2",
        Dom::Sym(3.0),
        |x| x.pow_scalar(2.0),
        |x| x.powi(2),
    );
}

#[test]
fn scalar_pow_3_on_negatives_and_positives() {
    check_unary(
        "pow_scalar 3",
        Dom::Sym(3.0),
        |x| x.pow_scalar(3.0),
        |x| x.powi(3),
    );
}

#[test]
fn scalar_pow_half_on_positives() {
    check_unary(
        "pow_scalar 0.5",
        Dom::Pos(0.0, 10.0),
        |x| x.pow_scalar(0.5),
        |x| x.powf(0.5),
    );
}

#[test]
fn scalar_pow_negative_integer_away_from_zero() {
    check_unary(
        "pow_scalar -1",
        Dom::Away(0.5, 3.0),
        |x| x.pow_scalar(-1.0),
        |x| x.powi(-1),
    );
}

#[test]
fn scalar_max() {
    check_unary(
        "max_scalar",
        Dom::Sym(1.0),
        |x| x.max_scalar(0.25),
        |x| x.max(0.25),
    );
}

#[test]
fn scalar_min() {
    check_unary(
        "min_scalar",
        Dom::Sym(1.0),
        |x| x.min_scalar(-0.25),
        |x| x.min(-0.25),
    );
}

#[test]
fn scalar_rsub() {
    check_unary(
        "rsub_scalar",
        Dom::Sym(3.0),
        |x| x.rsub_scalar(3.0),
        |x| 3.0 - x,
    );
}

#[test]
fn scalar_rdiv_away_from_zero() {
    check_unary(
        "rdiv_scalar",
        Dom::Away(0.25, 4.0),
        |x| x.rdiv_scalar(2.0),
        |x| 2.0 / x,
    );
}

#[test]
fn scalar_clamp() {
    check_unary(
        "clamp",
        Dom::Sym(1.0),
        |x| x.clamp(-0.3, 0.4),
        |x| x.clamp(-0.3, 0.4),
    );
}

#[test]
fn scalar_affine() {
    check_unary(
        "affine",
        Dom::Sym(3.0),
        |x| x.affine(1.5, -0.5),
        |x| x * 1.5 - 0.5,
    );
}

// ------------------------------------------------------------------------------------------
// Binary ops, same shapes and broadcast.

const SYM: (Dom, Dom) = (Dom::Sym(3.0), Dom::Sym(3.0));

#[test]
fn binary_add() {
    check_binary("add", SYM, |a, b| a.add(b), |x, y| x + y);
}

#[test]
fn binary_sub() {
    check_binary("sub", SYM, |a, b| a.sub(b), |x, y| x - y);
}

#[test]
fn binary_mul() {
    check_binary("mul", SYM, |a, b| a.mul(b), |x, y| x * y);
}

#[test]
fn binary_div_away_from_zero() {
    check_binary(
        "div",
        (Dom::Sym(3.0), Dom::Away(0.25, 4.0)),
        |a, b| a.div(b),
        |x, y| x / y,
    );
}

#[test]
fn binary_maximum() {
    check_binary("maximum", SYM, |a, b| a.maximum(b), f64::max);
}

#[test]
fn binary_minimum() {
    check_binary("minimum", SYM, |a, b| a.minimum(b), f64::min);
}

#[test]
fn binary_pow_positive_base() {
    check_binary(
        "pow",
        (Dom::Pos(0.1, 3.0), Dom::Sym(2.0)),
        |a, b| a.pow(b),
        f64::powf,
    );
}

// ------------------------------------------------------------------------------------------
// Comparisons and where.

fn b2f(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

const INTS: (Dom, Dom) = (Dom::Int(2), Dom::Int(2));

#[test]
fn compare_eq_with_ties() {
    check_binary("eq", INTS, |a, b| a.eq(b), |x, y| b2f(x == y));
}

#[test]
fn compare_ne_with_ties() {
    check_binary("ne", INTS, |a, b| a.ne(b), |x, y| b2f(x != y));
}

#[test]
fn compare_lt_with_ties() {
    check_binary("lt", INTS, |a, b| a.lt(b), |x, y| b2f(x < y));
}

#[test]
fn compare_le_with_ties() {
    check_binary("le", INTS, |a, b| a.le(b), |x, y| b2f(x <= y));
}

#[test]
fn compare_gt_with_ties() {
    check_binary("gt", INTS, |a, b| a.gt(b), |x, y| b2f(x > y));
}

#[test]
fn compare_ge_with_ties() {
    check_binary("ge", INTS, |a, b| a.ge(b), |x, y| b2f(x >= y));
}

#[test]
fn where_cond_same_shapes_and_broadcast() {
    let d = dev();
    let mut rng = rng("where");
    // (cond, x, y): vec4 path, odd size, views, and three-way broadcasting.
    let cases: &[(V, V, V)] = &[
        (V::C(&[1032]), V::C(&[1032]), V::C(&[1032])),
        (V::C(&[257]), V::C(&[257]), V::C(&[257])),
        (V::T(9, 7), V::C(&[7, 9]), V::T(9, 7)),
        (V::C(&[4, 1, 6]), V::C(&[5, 6]), V::C(&[])),
        (V::C(&[6]), V::C(&[3, 1]), V::T(6, 3)),
        (V::C(&[]), V::C(&[2, 3]), V::C(&[3])),
    ];
    for &(vc, vx, vy) in cases {
        let (c, ca) = make(d, &mut rng, Dom::Int(1), vc); // -1, 0, 1: nonzero is true
        let (x, xa) = make(d, &mut rng, Dom::Sym(3.0), vx);
        let (y, ya) = make(d, &mut rng, Dom::Sym(3.0), vy);
        let want = Arr::where_cond(&ca, &xa, &ya);
        poison(d, want.numel());
        let z = Tensor::where_cond(&c, &x, &y).unwrap();
        check(&z, &want, 0.0, &format!("where {vc:?} {vx:?} {vy:?}"));
    }
}

#[test]
fn where_cond_on_a_comparison_result() {
    let d = dev();
    let mut rng = rng("where cmp");
    let a = Arr::rand(&mut rng, &[33, 17], -1.0, 1.0);
    let b = Arr::rand(&mut rng, &[17], -1.0, 1.0);
    let (x, y) = (a.upload(d), b.upload(d));
    let cond = x.gt(&y).unwrap();
    poison(d, a.numel());
    let z = Tensor::where_cond(&cond, &x, &y).unwrap();
    check(&z, &a.zip(&b, f64::max), 0.0, "where(x > y, x, y)");
}

// ------------------------------------------------------------------------------------------
// Rank 8 views, grids past 65,535 workgroups.

#[test]
fn elementwise_on_rank_8_views() {
    let d = dev();
    let mut rng = rng("rank 8");
    let (x, a) = rank8_reversed(d, &mut rng);
    let (y, b) = rank8_reversed(d, &mut rng);
    poison(d, a.numel());
    check(&x.exp().unwrap(), &a.map(f64::exp), TOL, "exp on rank 8");
    poison(d, a.numel());
    check(
        &x.sub(&y).unwrap(),
        &a.zip(&b, |p, q| p - q),
        TOL,
        "sub on rank 8",
    );
    let c = Tensor::where_cond(&x.gt(&y).unwrap(), &x, &y).unwrap();
    check(&c, &a.zip(&b, f64::max), 0.0, "where on rank 8");
    // A ninth non-mergeable dim is refused with a clear error.
    let x9 = Tensor::zeros(d, &[2, 3, 2, 3, 2, 3, 2, 3, 2]).unwrap();
    let p9 = x9.permute(&[8, 7, 6, 5, 4, 3, 2, 1, 0]).unwrap();
    let e = p9.neg().unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
}

#[test]
fn elementwise_and_gather_past_65535_workgroups() {
    // 256 elements per workgroup: 65_535 * 256 + 300 elements need a 2-D grid.
    let d = dev();
    let n = 65_535 * 256 + 300;
    let v = rand_vec(&mut rng("big grid"), n, -1.0, 1.0);
    let x = Tensor::from_slice(d, &v, &[n]).unwrap();
    let got = x.affine(2.0, 1.0).unwrap().to_vec().unwrap();
    let want: Vec<f64> = v.iter().map(|&a| a as f64 * 2.0 + 1.0).collect();
    assert_close(&got, &want, TOL, "affine past 65535 workgroups");
    let r = Tensor::rand_uniform(d, &[n], 0.0, 1.0, 3)
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(
        r.iter().all(|&v| (0.0..1.0).contains(&v)),
        "rand past 65535 workgroups"
    );
    // Gather every row of [n / 4, 4] in reverse order (plus one index past the end).
    let rows = n / 4;
    let mut idx: Vec<u32> = (0..rows as u32).rev().collect();
    idx[1] = rows as u32 + 7;
    let i = Tensor::from_u32(d, &idx, &[rows]).unwrap();
    let got = x
        .reshape(&[rows, 4])
        .unwrap()
        .index_select(0, &i)
        .unwrap()
        .to_vec()
        .unwrap();
    let want: Vec<f64> = idx
        .iter()
        .flat_map(|&r| (0..4).map(move |c| (r as usize, c)))
        .map(|(r, c)| if r < rows { v[r * 4 + c] as f64 } else { 0.0 })
        .collect();
    assert_close(&got, &want, 0.0, "gather past 65535 workgroups");
}
