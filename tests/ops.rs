//! Every op against a CPU f64 reference on seeded random inputs: odd sizes (not multiples of
//! 4 or of a workgroup), the vec4 and the strided paths, views, broadcasting, empty and
//! one-element tensors, error cases; plus laziness (submits), pool reuse, and the
//! buffer-reuse hazard of dropped inputs. Outputs are poisoned with NaN before each op (see
//! `common::poison`), so an element a kernel leaves unwritten fails the comparison.

mod common;

use common::reference::{gelu, linear, sigmoid};
use common::*;
use rand::rngs::StdRng;
use rand::Rng;
use wgrad::kernels::matmul::{choose_tile, TILES};
use wgrad::{Device, Error, Tensor};

type R = wgrad::Result<Tensor>;

// ------------------------------------------------------------------------------------------
// Inputs: value domains and views.

/// Where inputs are drawn.
#[derive(Clone, Copy, Debug)]
enum Dom {
    /// Uniform in [-a, a).
    Sym(f32),
    /// Uniform in [lo, hi).
    Pos(f32, f32),
    /// Magnitude uniform in [lo, hi), random sign (away from zero).
    Away(f32, f32),
    /// Integers in [-k, k] (ties for comparisons).
    Int(i32),
}

fn draw(rng: &mut StdRng, shape: &[usize], dom: Dom) -> Arr {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| match dom {
            Dom::Sym(a) => rng.random_range(-a..a) as f64,
            Dom::Pos(lo, hi) => rng.random_range(lo..hi) as f64,
            Dom::Away(lo, hi) => {
                let m = rng.random_range(lo..hi) as f64;
                if rng.random_bool(0.5) {
                    -m
                } else {
                    m
                }
            }
            Dom::Int(k) => rng.random_range(-k..=k) as f64,
        })
        .collect();
    Arr::new(shape, v)
}

/// How an operand is laid out.
#[derive(Clone, Copy, Debug)]
enum V {
    /// Contiguous of this shape.
    C(&'static [usize]),
    /// A [r, c] tensor transposed: shape [c, r], non-contiguous.
    T(usize, usize),
    /// `base.narrow(dim, start, len)`.
    N(&'static [usize], usize, usize, usize),
    /// `base.permute(dims)`.
    P(&'static [usize], &'static [usize]),
    /// `base.broadcast_to(shape)`.
    B(&'static [usize], &'static [usize]),
}

/// The operand `v` on `d` with values from `dom`, and its reference.
fn make(d: &Device, rng: &mut StdRng, dom: Dom, v: V) -> (Tensor, Arr) {
    match v {
        V::C(s) => {
            let a = draw(rng, s, dom);
            (a.upload(d), a)
        }
        V::T(r, c) => {
            let a = draw(rng, &[r, c], dom);
            (a.upload(d).t().unwrap(), a.t())
        }
        V::N(s, dim, start, len) => {
            let a = draw(rng, s, dom);
            (
                a.upload(d).narrow(dim as isize, start, len).unwrap(),
                a.narrow(dim, start, len),
            )
        }
        V::P(s, dims) => {
            let a = draw(rng, s, dom);
            (a.upload(d).permute(dims).unwrap(), a.permute(dims))
        }
        V::B(s, to) => {
            let a = draw(rng, s, dom);
            (a.upload(d).broadcast_to(to).unwrap(), a.broadcast_to(to))
        }
    }
}

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
// Empty and one-element tensors.

#[test]
fn empty_tensors_through_elementwise_ops() {
    let d = dev();
    for shape in [&[0usize][..], &[3, 0], &[0, 4, 5]] {
        let x = Tensor::from_slice(d, &[], shape).unwrap();
        assert_eq!(x.shape(), shape);
        assert_eq!(x.to_vec().unwrap(), Vec::<f32>::new());
        let y = x.exp().unwrap().add(&x).unwrap();
        assert_eq!(y.shape(), shape);
        assert!(y.to_vec().unwrap().is_empty());
        assert!(Tensor::zeros(d, shape)
            .unwrap()
            .to_vec()
            .unwrap()
            .is_empty());
    }
    // [3, 0] + [0] broadcasts to [3, 0]; [3, 0] + [3, 1] too.
    let a = Tensor::zeros(d, &[3, 0]).unwrap();
    let b = Tensor::zeros(d, &[0]).unwrap();
    assert_eq!(a.add(&b).unwrap().shape(), &[3, 0]);
    let c = Tensor::ones(d, &[3, 1]).unwrap();
    assert_eq!(a.mul(&c).unwrap().shape(), &[3, 0]);
    let w = Tensor::where_cond(&a, &c, &b).unwrap();
    assert_eq!(w.shape(), &[3, 0]);
    assert!(w.to_vec().unwrap().is_empty());
}

#[test]
fn empty_tensors_through_reductions_softmax_matmul_gather() {
    let d = dev();
    let x = Tensor::zeros(d, &[3, 0]).unwrap();
    // Summing an empty axis gives zeros; reducing the other axis gives an empty tensor.
    poison(d, 3);
    let s = x.sum(1, false).unwrap();
    check(&s, &Arr::full(&[3], 0.0), 0.0, "sum over an empty axis");
    assert_eq!(x.sum(0, false).unwrap().shape(), &[0]);
    assert_eq!(x.sum(0, true).unwrap().shape(), &[1, 0]);
    poison(d, 1);
    let total = x.sum_all().unwrap();
    assert_eq!(total.shape(), &[] as &[usize]);
    assert_eq!(total.item().unwrap(), 0.0, "sum_all of an empty tensor");
    // Softmax of rows of length 0, and of zero rows.
    assert_eq!(x.softmax().unwrap().shape(), &[3, 0]);
    assert!(x.log_softmax().unwrap().to_vec().unwrap().is_empty());
    let rows0 = Tensor::zeros(d, &[0, 5]).unwrap();
    assert_eq!(rows0.softmax().unwrap().shape(), &[0, 5]);
    // Matmul with M = 0 and N = 0.
    let a = Tensor::zeros(d, &[0, 4]).unwrap();
    let b = Tensor::ones(d, &[4, 5]).unwrap();
    assert_eq!(a.matmul(&b).unwrap().shape(), &[0, 5]);
    let b0 = Tensor::ones(d, &[4, 0]).unwrap();
    assert_eq!(b.t().unwrap().matmul(&b0).unwrap().shape(), &[5, 0]);
    // index_select with no indices, and from an empty axis (every index out of range).
    let src = Tensor::ones(d, &[4, 5]).unwrap();
    let none = Tensor::from_u32(d, &[], &[0]).unwrap();
    assert_eq!(src.index_select(0, &none).unwrap().shape(), &[0, 5]);
    let idx = Tensor::from_u32(d, &[0, 2], &[2]).unwrap();
    poison(d, 6);
    let picked = x.index_select(1, &idx).unwrap();
    check(
        &picked,
        &Arr::full(&[3, 2], 0.0),
        0.0,
        "gather from an empty axis of [3, 0]",
    );
    let picked = x.t().unwrap().index_select(1, &idx).unwrap();
    assert_eq!(picked.shape(), &[0, 2]);
}

#[test]
fn one_element_tensors() {
    let d = dev();
    let s = Tensor::from_slice(d, &[-2.5], &[]).unwrap();
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.numel(), 1);
    assert_eq!(s.item().unwrap(), -2.5);
    assert_eq!(s.abs().unwrap().item().unwrap(), 2.5);
    let one = Tensor::from_slice(d, &[4.0], &[1, 1, 1]).unwrap();
    poison(d, 1);
    let p = s.mul(&one).unwrap();
    assert_eq!(p.shape(), &[1, 1, 1]);
    assert_eq!(p.item().unwrap(), -10.0);
    assert_eq!(one.sum_all().unwrap().item().unwrap(), 4.0);
    assert_eq!(one.mean(1, false).unwrap().shape(), &[1, 1]);
    assert_eq!(one.max(-1, true).unwrap().item().unwrap(), 4.0);
    assert_eq!(one.min_all().unwrap().item().unwrap(), 4.0);
    let v = Tensor::from_slice(d, &[7.0], &[1]).unwrap();
    assert_eq!(v.softmax().unwrap().item().unwrap(), 1.0);
    assert_eq!(v.log_softmax().unwrap().item().unwrap(), 0.0);
    let m = Tensor::from_slice(d, &[3.0], &[1, 1]).unwrap();
    assert_eq!(
        m.matmul(&one.squeeze(0).unwrap()).unwrap().item().unwrap(),
        12.0
    );
    let idx = Tensor::from_u32(d, &[0], &[1]).unwrap();
    assert_eq!(v.index_select(0, &idx).unwrap().item().unwrap(), 7.0);
}

// ------------------------------------------------------------------------------------------
// Reductions.

type Reduction = (
    &'static str,
    fn(&Tensor, isize, bool) -> R,
    fn(&Arr, usize, bool) -> Arr,
);

const REDUCTIONS: [Reduction; 4] = [
    ("sum", Tensor::sum, Arr::sum),
    ("mean", Tensor::mean, Arr::mean),
    ("max", Tensor::max, Arr::max),
    ("min", Tensor::min, Arr::min),
];

/// Every reduction along every axis (given as d and d - rank), keepdim both ways.
fn check_axis_reductions(d: &Device, tag: &str, x: &Tensor, a: &Arr) {
    let rank = a.rank();
    for (name, gpu, cpu) in REDUCTIONS {
        for dim in 0..rank {
            for keepdim in [false, true] {
                let signed = if keepdim {
                    dim as isize - rank as isize
                } else {
                    dim as isize
                };
                let want = cpu(a, dim, keepdim);
                poison(d, want.numel());
                let got = gpu(x, signed, keepdim).unwrap();
                check(
                    &got,
                    &want,
                    TOL,
                    &format!("{tag}: {name}(dim {signed}, keepdim {keepdim})"),
                );
            }
        }
    }
}

#[test]
fn reduce_each_axis_of_a_3d_tensor() {
    let d = dev();
    let a = Arr::rand(&mut rng("reduce 3d"), &[5, 19, 300], -1.0, 1.0);
    check_axis_reductions(d, "[5, 19, 300]", &a.upload(d), &a);
}

#[test]
fn reduce_each_axis_of_a_permuted_view() {
    let d = dev();
    let base = Arr::rand(&mut rng("reduce permuted"), &[19, 261, 5], -1.0, 1.0);
    let x = base.upload(d).permute(&[2, 0, 1]).unwrap();
    check_axis_reductions(d, "permuted [5, 19, 261]", &x, &base.permute(&[2, 0, 1]));
}

#[test]
fn reduce_each_axis_of_a_narrowed_view() {
    let d = dev();
    let base = Arr::rand(&mut rng("reduce narrowed"), &[7, 21, 300], -1.0, 1.0);
    let x = base
        .upload(d)
        .narrow(0, 1, 5)
        .unwrap()
        .narrow(1, 2, 17)
        .unwrap()
        .narrow(2, 13, 259)
        .unwrap();
    let a = base.narrow(0, 1, 5).narrow(1, 2, 17).narrow(2, 13, 259);
    check_axis_reductions(d, "narrowed [5, 17, 259]", &x, &a);
}

#[test]
fn reduce_a_long_axis_and_a_broadcast_axis() {
    let d = dev();
    let a = Arr::rand(&mut rng("reduce long"), &[3, 5003], -1.0, 1.0);
    check_axis_reductions(d, "[3, 5003]", &a.upload(d), &a);
    // A stride-0 axis: every element of the reduced axis is the same one.
    let b = Arr::rand(&mut rng("reduce bcast"), &[4, 1], -1.0, 1.0);
    let x = b.upload(d).broadcast_to(&[4, 300]).unwrap();
    check_axis_reductions(d, "broadcast [4, 300]", &x, &b.broadcast_to(&[4, 300]));
}

/// Matrices reduced over their rows run with lanes along the columns (`reduce_cols`), in
/// one workgroup row (up to 256 rows) or in chunks (of about sqrt(rows) rows, at least 64:
/// 64 for 300 and 1000 rows, 68 for 4500) and a second pass over the chunks' partials; also
/// through a view whose rows are longer than its columns. 13 and 67 rows leave the 4 row phases
/// of a workgroup unequal shares.
#[test]
fn reduce_over_the_rows_of_tall_matrices() {
    let d = dev();
    for shape in [
        [13, 70],
        [64, 33],
        [67, 40],
        [300, 130],
        [1000, 77],
        [4500, 20],
    ] {
        let a = Arr::rand(
            &mut rng(&format!("reduce rows {shape:?}")),
            &shape,
            -1.0,
            1.0,
        );
        check_axis_reductions(d, &format!("{shape:?}"), &a.upload(d), &a);
    }
    let base = Arr::rand(&mut rng("reduce rows view"), &[700, 90], -1.0, 1.0);
    let x = base.upload(d).narrow(1, 5, 77).unwrap();
    check_axis_reductions(d, "[700, 90][:, 5..82]", &x, &base.narrow(1, 5, 77));
}

type ReductionAll = (&'static str, fn(&Tensor) -> R, fn(&Arr) -> f64);

const SUM_MAX_MIN_ALL: [ReductionAll; 3] = [
    ("sum_all", Tensor::sum_all, Arr::sum_all),
    ("max_all", Tensor::max_all, Arr::max_all),
    ("min_all", Tensor::min_all, Arr::min_all),
];

const MEAN_ALL: [ReductionAll; 1] = [("mean_all", Tensor::mean_all, Arr::mean_all)];

/// Sizes around the workgroup (256 lanes), the one-workgroup stage-1 share (2048 elements:
/// up to there one dispatch, past it a second stage), and past the cap of 256 partials.
const REDUCE_ALL_SIZES: [usize; 8] = [1, 255, 256, 257, 2048, 2049, 100_003, 600_001];

fn check_full_reductions(d: &Device, which: &[ReductionAll], tag: &str, x: &Tensor, a: &Arr) {
    for &(name, gpu, cpu) in which {
        poison(d, 1);
        let got = gpu(x).unwrap();
        assert_eq!(got.shape(), &[] as &[usize], "{tag}: {name} shape");
        check(
            &got,
            &Arr::new(&[], vec![cpu(a)]),
            TOL,
            &format!("{tag}: {name}"),
        );
    }
}

/// mean_all over each size, every failing size reported together.
fn check_mean_all_sizes(d: &Device, tag: &str, sizes: &[usize]) {
    let mut rng = rng(tag);
    let mut failures = Vec::new();
    for &n in sizes {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        poison(d, 1);
        let got = a.upload(d).mean_all().unwrap().item().unwrap();
        let want = a.mean_all();
        let err = (got as f64 - want).abs() / want.abs().max(1.0);
        if err.is_nan() || err > TOL {
            failures.push(format!(
                "n={n}: got {got}, want {want} (sum {})",
                a.sum_all()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{tag}: mean_all wrong for\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn sum_max_min_all_at_workgroup_and_stage_boundaries() {
    let d = dev();
    let mut rng = rng("reduce all");
    for n in REDUCE_ALL_SIZES {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        check_full_reductions(d, &SUM_MAX_MIN_ALL, &format!("n={n}"), &a.upload(d), &a);
    }
}

#[test]
fn mean_all_at_workgroup_and_stage_boundaries() {
    check_mean_all_sizes(dev(), "mean_all", &REDUCE_ALL_SIZES);
}

#[test]
fn reduce_all_of_noncontiguous_views() {
    let d = dev();
    let both: Vec<ReductionAll> = SUM_MAX_MIN_ALL.iter().chain(&MEAN_ALL).copied().collect();
    let base = Arr::rand(&mut rng("reduce all views"), &[301, 257], -1.0, 1.0);
    let x = base.upload(d);
    let t = x.t().unwrap();
    check_full_reductions(d, &both, "transposed [257, 301]", &t, &base.t());
    let n = x.narrow(1, 3, 250).unwrap().narrow(0, 1, 299).unwrap();
    let na = base.narrow(1, 3, 250).narrow(0, 1, 299);
    check_full_reductions(d, &both, "narrowed [299, 250]", &n, &na);
    let p = x
        .reshape(&[7, 43, 257])
        .unwrap()
        .permute(&[2, 0, 1])
        .unwrap();
    let pa = base.reshape(&[7, 43, 257]).permute(&[2, 0, 1]);
    check_full_reductions(d, &both, "permuted [257, 7, 43]", &p, &pa);
    // A small view: one stage-1 workgroup.
    let s = x
        .narrow(0, 5, 13)
        .unwrap()
        .narrow(1, 7, 11)
        .unwrap()
        .t()
        .unwrap();
    let sa = base.narrow(0, 5, 13).narrow(1, 7, 11).t();
    check_full_reductions(d, &SUM_MAX_MIN_ALL, "small view [11, 13]", &s, &sa);
}

#[test]
fn reductions_without_subgroups() {
    let d = tree_dev();
    assert!(
        !d.has_subgroups(),
        "the tree device has subgroups turned off"
    );
    let mut rng = rng("reduce tree");
    let a = Arr::rand(&mut rng, &[5, 19, 300], -1.0, 1.0);
    check_axis_reductions(d, "tree [5, 19, 300]", &a.upload(d), &a);
    for n in [1usize, 257, 100_003] {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        check_full_reductions(
            d,
            &SUM_MAX_MIN_ALL,
            &format!("tree n={n}"),
            &a.upload(d),
            &a,
        );
    }
}

#[test]
fn mean_all_without_subgroups() {
    check_mean_all_sizes(tree_dev(), "mean_all tree", &[1, 257, 2049, 100_003]);
}

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

// ------------------------------------------------------------------------------------------
// Matmul.

/// A (M, K) @ B (K, N) with A and/or B given as transposed views of stored transposes.
fn check_matmul(
    d: &Device,
    rng: &mut StdRng,
    (m, k, n): (usize, usize, usize),
    ta: bool,
    tb: bool,
) {
    let (x, a) = if ta {
        let at = Arr::rand(rng, &[k, m], -1.0, 1.0);
        (at.upload(d).t().unwrap(), at.t())
    } else {
        let a = Arr::rand(rng, &[m, k], -1.0, 1.0);
        (a.upload(d), a)
    };
    let (y, b) = if tb {
        let bt = Arr::rand(rng, &[n, k], -1.0, 1.0);
        (bt.upload(d).t().unwrap(), bt.t())
    } else {
        let b = Arr::rand(rng, &[k, n], -1.0, 1.0);
        (b.upload(d), b)
    };
    poison(d, m * n);
    let c = x.matmul(&y).unwrap();
    check(
        &c,
        &a.matmul(&b),
        TOL,
        &format!("matmul {m}x{k}x{n} (MxKxN), A transposed {ta}, B transposed {tb}"),
    );
}

/// The worst per-row relative error of C (`||c_r - want_r|| / ||want_r||`), every element
/// finite.
fn worst_row_error(c: &Tensor, want: &Arr) -> f64 {
    let got = c.to_vec().unwrap();
    assert!(got.iter().all(|g| g.is_finite()), "a non-finite element");
    let n = want.shape[1];
    got.chunks(n)
        .zip(want.data.chunks(n))
        .map(|(g, w)| {
            let diff: f64 = g.iter().zip(w).map(|(&g, w)| (g as f64 - w).powi(2)).sum();
            let norm: f64 = w.iter().map(|w| w * w).sum();
            (diff / norm).sqrt()
        })
        .fold(0.0, f64::max)
}

/// f32 products keep f32's precision at any magnitude: operands of 2^-60 to 2^30, A's rows
/// alternating between its largest magnitude and 2^-12 of it, B stored or transposed, K up to
/// 3000 (split into ranges), the bias epilogue. Each row of C within 2e-5 of f64 (f32's
/// rounding over K = 3000 reaches about 3e-6; one f16 product about 3e-4). On an adapter
/// with cooperative matrices these are X3 products (three f16 products of each operand's
/// scaled high and low parts), which must stay as close (`WGRAD_F32_MATMUL=tiled` runs the
/// tiled kernel instead); the errors are printed (`--nocapture`) to compare the two.
#[test]
fn f32_products_keep_f32_precision_at_any_magnitude() {
    let d = dev();
    let mut rng = rng("f32 precision");
    for (m, k, n, sa, sb, tb) in [
        (130, 257, 70, -40, 30, false),
        (64, 1024, 96, 20, -60, true),
        (33, 3000, 17, 0, 0, false),
        (256, 768, 256, -10, -5, true),
    ] {
        let a = Arr::rand(&mut rng, &[m, k], -1.0, 1.0);
        let a = Arr::build(&[m, k], |i| {
            a.at(i) * 2f64.powi(sa - 12 * (i[0] % 2) as i32)
        });
        let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0).map(|x| x * 2f64.powi(sb));
        let bias = Arr::rand(&mut rng, &[n], -1.0, 1.0).map(|x| x * 2f64.powi(sa + sb));
        let x = a.upload(d);
        let y = if tb {
            b.t().upload(d).t().unwrap()
        } else {
            b.upload(d)
        };
        let what = format!("f32 product {m}x{k}x{n}, A 2^{sa}, B 2^{sb}, B transposed {tb}");
        let plain = worst_row_error(&x.matmul(&y).unwrap(), &a.matmul(&b));
        let want = linear(&a, &b, Some(&bias));
        let biased = worst_row_error(
            &x.linear(&y, Some(&bias.upload(d)), wgrad::ops::Activation::None)
                .unwrap(),
            &want,
        );
        println!("{what}: worst row error {plain:.3e}, with the bias {biased:.3e}");
        assert!(plain < 2e-5, "{what}: worst row error {plain:.3e}");
        assert!(biased < 2e-5, "{what} + bias: worst row error {biased:.3e}");
    }
}

const MATMUL_SIZES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (7, 5, 3),
    (65, 63, 17),
    (130, 257, 33),
    (300, 200, 100),
];

#[test]
fn matmul_odd_sizes() {
    let mut rng = rng("matmul");
    for s in MATMUL_SIZES {
        check_matmul(dev(), &mut rng, s, false, false);
    }
}

#[test]
fn matmul_transposed_operands() {
    let mut rng = rng("matmul t");
    for s in &MATMUL_SIZES[1..4] {
        for (ta, tb) in [(true, false), (false, true), (true, true)] {
            check_matmul(dev(), &mut rng, *s, ta, tb);
        }
    }
}

#[test]
fn matmul_every_tile_size() {
    let mut rng = rng("matmul tiles");
    // Shapes for which choose_tile picks each tile, so each kernel variant runs at odd sizes.
    let shapes = [
        (1030, 17, 1040),
        (520, 17, 513),
        (257, 31, 260),
        (65, 63, 17),
    ];
    for (tile, s) in TILES.iter().zip(shapes) {
        assert_eq!(
            choose_tile(s.0, s.2, 1),
            *tile,
            "shape {s:?} picks tile {tile:?}"
        );
        check_matmul(dev(), &mut rng, s, false, false);
        check_matmul(dev(), &mut rng, s, true, true);
    }
}

#[test]
fn matmul_every_tile_size_batched() {
    let d = dev();
    let mut rng = rng("matmul tiles batched");
    // (batch, m, k, n): batches large enough for each tile; B broadcast over the batch.
    let shapes = [
        (16, 130, 19, 200),
        (16, 70, 19, 66),
        (8, 40, 23, 97),
        (3, 13, 9, 11),
    ];
    for (tile, (bt, m, k, n)) in TILES.iter().zip(shapes) {
        assert_eq!(
            choose_tile(m, n, bt),
            *tile,
            "batch {bt} of {m}x{n} picks {tile:?}"
        );
        let a = Arr::rand(&mut rng, &[bt, m, k], -1.0, 1.0);
        let b = Arr::rand(&mut rng, &[k, n], -1.0, 1.0);
        let want = a.matmul(&b);
        poison(d, want.numel());
        let c = a.upload(d).matmul(&b.upload(d)).unwrap();
        check(
            &c,
            &want,
            TOL,
            &format!("matmul [{bt}, {m}, {k}] @ [{k}, {n}]"),
        );
    }
}

#[test]
fn matmul_long_inner_dim() {
    let mut rng = rng("matmul long k");
    check_matmul(dev(), &mut rng, (3, 5003, 2), false, false);
    check_matmul(dev(), &mut rng, (3, 5003, 2), true, true);
}

/// Few outputs over a long K run as ranges of K in workgroups of their own, summed by a second
/// kernel (`matmul::split_k`): written, added into an existing gradient, and through views.
#[test]
fn matmul_split_k_writes_accumulates_and_reaches_views() {
    use wgrad::kernels::matmul::split_k;
    let d = dev();
    let mut rng = rng("matmul split k");
    let (m, k, n) = (37, 3001, 29);
    assert!(split_k(4, k) > 1, "the shape splits K");
    check_matmul(d, &mut rng, (m, k, n), false, false);
    check_matmul(d, &mut rng, (m, k, n), true, false);
    // dW = x^T g over K = 3001 rows, twice: the second adds into the first.
    let x = Arr::rand(&mut rng, &[k, m], -1.0, 1.0);
    let w = Arr::rand(&mut rng, &[m, n], -1.0, 1.0);
    let (g1, g2) = (
        Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
        Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
    );
    let wl = w.upload(d).requires_grad();
    let xt = x.upload(d);
    for g in [&g1, &g2] {
        xt.matmul(&wl).unwrap().backward_with(&g.upload(d)).unwrap();
    }
    let want = x.t().matmul(&g1).zip(&x.t().matmul(&g2), |a, b| a + b);
    check(
        &wl.grad().unwrap(),
        &want,
        TOL,
        "two split-K dW accumulated",
    );
}

/// The numbers of K ranges a tile search tries (and a table may hold): every one, and one
/// larger than K has steps, gives the product, written and accumulated.
#[test]
fn matmul_every_measured_split_of_k() {
    use wgrad::tune::SPLITS;
    let d = private_dev();
    let mut rng = rng("matmul measured splits");
    let (m, k, n) = (37, 3001, 29);
    for split in SPLITS.into_iter().chain([100_000]) {
        d.force_split(Some(split));
        check_matmul(&d, &mut rng, (m, k, n), false, false);
        check_matmul(&d, &mut rng, (m, k, n), true, true);
        let x = Arr::rand(&mut rng, &[k, m], -1.0, 1.0);
        let w = Arr::rand(&mut rng, &[m, n], -1.0, 1.0);
        let (g1, g2) = (
            Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
            Arr::rand(&mut rng, &[k, n], -1.0, 1.0),
        );
        let wl = w.upload(&d).requires_grad();
        let xt = x.upload(&d);
        for g in [&g1, &g2] {
            xt.matmul(&wl)
                .unwrap()
                .backward_with(&g.upload(&d))
                .unwrap();
        }
        let want = x.t().matmul(&g1).zip(&x.t().matmul(&g2), |a, b| a + b);
        check(
            &wl.grad().unwrap(),
            &want,
            TOL,
            &format!("dW accumulated, K in {split} ranges"),
        );
    }
    d.force_split(None);
}

#[test]
fn matmul_batched_and_broadcast_batches() {
    let d = dev();
    let mut rng = rng("matmul batched");
    let (m, k, n) = (13, 9, 11);
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, m, k], &[3, k, n]),
        (&[2, 3, m, k], &[3, k, n]),
        (&[m, k], &[4, k, n]),
        (&[4, m, k], &[k, n]),
        (&[2, 1, m, k], &[1, 3, k, n]),
        (&[1, 3, m, k], &[3, k, n]),
    ];
    for &(sa, sb) in cases {
        let a = Arr::rand(&mut rng, sa, -1.0, 1.0);
        let b = Arr::rand(&mut rng, sb, -1.0, 1.0);
        let want = a.matmul(&b);
        poison(d, want.numel());
        let c = a.upload(d).matmul(&b.upload(d)).unwrap();
        check(&c, &want, TOL, &format!("matmul {sa:?} @ {sb:?}"));
    }
}

#[test]
fn matmul_batched_views() {
    let d = dev();
    let mut rng = rng("matmul batched views");
    let (m, k, n) = (17, 33, 65);
    // B transposed per batch: [3, n, k] -> [3, k, n].
    let a = Arr::rand(&mut rng, &[3, m, k], -1.0, 1.0);
    let bt = Arr::rand(&mut rng, &[3, n, k], -1.0, 1.0);
    poison(d, 3 * m * n);
    let c = a.upload(d).matmul(&bt.upload(d).t().unwrap()).unwrap();
    check(&c, &a.matmul(&bt.t()), TOL, "matmul [3,m,k] @ [3,n,k].t()");
    // A with the batch in the middle: [m, 3, k] permuted to [3, m, k] (batch stride k).
    let am = Arr::rand(&mut rng, &[m, 3, k], -1.0, 1.0);
    let b = Arr::rand(&mut rng, &[3, k, n], -1.0, 1.0);
    poison(d, 3 * m * n);
    let x = am.upload(d).permute(&[1, 0, 2]).unwrap();
    let c = x.matmul(&b.upload(d)).unwrap();
    check(
        &c,
        &am.permute(&[1, 0, 2]).matmul(&b),
        TOL,
        "matmul [m,3,k].permute(1,0,2) @ [3,k,n]",
    );
    // Narrowed operands (offsets, row strides wider than the row).
    let abig = Arr::rand(&mut rng, &[70, 40], -1.0, 1.0);
    let bbig = Arr::rand(&mut rng, &[40, 30], -1.0, 1.0);
    let x = abig
        .upload(d)
        .narrow(0, 3, 65)
        .unwrap()
        .narrow(1, 5, 33)
        .unwrap();
    let y = bbig
        .upload(d)
        .narrow(0, 2, 33)
        .unwrap()
        .narrow(1, 1, 27)
        .unwrap();
    poison(d, 65 * 27);
    let c = x.matmul(&y).unwrap();
    let want = abig
        .narrow(0, 3, 65)
        .narrow(1, 5, 33)
        .matmul(&bbig.narrow(0, 2, 33).narrow(1, 1, 27));
    check(&c, &want, TOL, "matmul of narrowed views");
}

#[test]
fn matmul_with_k_zero_gives_zeros() {
    let d = dev();
    let a = Tensor::from_slice(d, &[], &[5, 0]).unwrap();
    let b = Tensor::from_slice(d, &[], &[0, 7]).unwrap();
    poison(d, 35);
    check(
        &a.matmul(&b).unwrap(),
        &Arr::full(&[5, 7], 0.0),
        0.0,
        "[5,0] @ [0,7]",
    );
    let a = Tensor::from_slice(d, &[], &[2, 5, 0]).unwrap();
    poison(d, 70);
    check(
        &a.matmul(&b).unwrap(),
        &Arr::full(&[2, 5, 7], 0.0),
        0.0,
        "[2,5,0] @ [0,7]",
    );
}

// ------------------------------------------------------------------------------------------
// index_select.

fn check_index_select(d: &Device, tag: &str, x: &Tensor, a: &Arr, dim: isize, idx: &[u32]) {
    let i = Tensor::from_u32(d, idx, &[idx.len()]).unwrap();
    let ud = if dim < 0 {
        dim + a.rank() as isize
    } else {
        dim
    } as usize;
    let want = a.index_select(ud, idx);
    poison(d, want.numel());
    let got = x.index_select(dim, &i).unwrap();
    check(
        &got,
        &want,
        0.0,
        &format!("index_select {tag} dim {dim} {idx:?}"),
    );
}

#[test]
fn index_select_dim0_repeats_and_out_of_range() {
    let d = dev();
    let a = Arr::rand(&mut rng("gather 0"), &[7, 5], -1.0, 1.0);
    check_index_select(d, "[7,5]", &a.upload(d), &a, 0, &[3, 0, 3, 6, 9, 1, 6]);
}

#[test]
fn index_select_dim1_repeats_and_out_of_range() {
    let d = dev();
    let a = Arr::rand(&mut rng("gather 1"), &[4, 6], -1.0, 1.0);
    check_index_select(
        d,
        "[4,6]",
        &a.upload(d),
        &a,
        1,
        &[5, 5, 0, 100, 2, u32::MAX],
    );
    let b = Arr::rand(&mut rng("gather -1"), &[3, 4, 5], -1.0, 1.0);
    check_index_select(d, "[3,4,5]", &b.upload(d), &b, -1, &[4, 0, 4]);
    check_index_select(d, "[3,4,5]", &b.upload(d), &b, 1, &[3, 3, 1, 0, 4]);
}

#[test]
fn index_select_from_views_and_with_index_views() {
    let d = dev();
    let mut rng = rng("gather views");
    let (x, a) = make(d, &mut rng, Dom::Sym(1.0), V::T(6, 4));
    check_index_select(d, "transposed [4,6]", &x, &a, 0, &[3, 1, 1, 7]);
    check_index_select(d, "transposed [4,6]", &x, &a, 1, &[5, 0, 2]);
    let (x, a) = make(d, &mut rng, Dom::Sym(1.0), V::N(&[9, 8], 1, 2, 5));
    check_index_select(d, "narrowed [9,5]", &x, &a, 0, &[8, 0, 4, 9]);
    // Indices at an offset (narrowed) and with a stride (a column of a 2-D u32 tensor).
    let src = Arr::rand(&mut rng, &[10, 3], -1.0, 1.0);
    let x = src.upload(d);
    let all = Tensor::from_u32(d, &[9, 9, 2, 5, 0, 7, 11, 3, 1, 4], &[10]).unwrap();
    let idx = all.narrow(0, 2, 5).unwrap(); // [2, 5, 0, 7, 11]
    poison(d, 15);
    let got = x.index_select(0, &idx).unwrap();
    check(
        &got,
        &src.index_select(0, &[2, 5, 0, 7, 11]),
        0.0,
        "narrowed indices",
    );
    let grid = Tensor::from_u32(d, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], &[4, 3]).unwrap();
    let col = grid.narrow(1, 1, 1).unwrap().squeeze(1).unwrap(); // [1, 4, 7, 10], stride 3
    assert_eq!(col.strides(), &[3]);
    poison(d, 12);
    let got = x.index_select(0, &col).unwrap();
    check(
        &got,
        &src.index_select(0, &[1, 4, 7, 10]),
        0.0,
        "strided indices",
    );
}

#[test]
fn index_select_embedding_lookup() {
    let d = dev();
    let mut rng = rng("gather embedding");
    let table = Arr::rand(&mut rng, &[1000, 33], -1.0, 1.0);
    let idx: Vec<u32> = (0..257).map(|_| rng.random_range(0..1010)).collect();
    check_index_select(d, "[1000,33]", &table.upload(d), &table, 0, &idx);
}

// ------------------------------------------------------------------------------------------
// Views.

#[test]
fn reshape_of_contiguous_is_a_view() {
    let d = dev();
    let a = Arr::rand(&mut rng("reshape"), &[4, 6], -1.0, 1.0);
    let x = a.upload(d);
    for shape in [&[2usize, 12][..], &[24], &[2, 3, 4], &[1, 24, 1]] {
        let r = x.reshape(shape).unwrap();
        assert!(r.same_storage(&x), "reshape {shape:?} of contiguous copied");
        assert!(r.is_contiguous());
        check(&r, &a.reshape(shape), 0.0, &format!("reshape {shape:?}"));
    }
    // A contiguous narrowed view (offset) reshapes without a copy too.
    let n = x.narrow(0, 1, 2).unwrap();
    let r = n.reshape(&[3, 4]).unwrap();
    assert!(r.same_storage(&x));
    check(
        &r,
        &a.narrow(0, 1, 2).reshape(&[3, 4]),
        0.0,
        "reshape of narrowed rows",
    );
}

#[test]
fn reshape_of_transposed_copies() {
    let d = dev();
    let a = Arr::rand(&mut rng("reshape t"), &[4, 6], -1.0, 1.0);
    let x = a.upload(d);
    let t = x.t().unwrap();
    assert!(!t.is_contiguous());
    assert!(t.same_storage(&x));
    poison(d, 24);
    let r = t.reshape(&[24]).unwrap();
    assert!(
        !r.same_storage(&x),
        "reshape of a transposed view must copy"
    );
    assert!(r.is_contiguous());
    check(&r, &a.t().reshape(&[24]), 0.0, "reshape of transposed");
    let r = t.reshape(&[2, 3, 4]).unwrap();
    check(
        &r,
        &a.t().reshape(&[2, 3, 4]),
        0.0,
        "reshape of transposed to 3-D",
    );
}

#[test]
fn narrow_then_contiguous() {
    let d = dev();
    let a = Arr::rand(&mut rng("narrow"), &[6, 9], -1.0, 1.0);
    let x = a.upload(d);
    let n = x.narrow(1, 2, 5).unwrap();
    assert_eq!(n.shape(), &[6, 5]);
    assert_eq!(n.strides(), &[9, 1]);
    assert!(!n.is_contiguous());
    poison(d, 30);
    let c = n.contiguous().unwrap();
    assert!(c.is_contiguous() && !c.same_storage(&x));
    check(&c, &a.narrow(1, 2, 5), 0.0, "narrow(1, 2, 5).contiguous()");
    let n2 = x.narrow(-2, 4, 2).unwrap().narrow(1, 8, 1).unwrap();
    check(
        &n2,
        &a.narrow(0, 4, 2).narrow(1, 8, 1),
        0.0,
        "narrow of narrow",
    );
    // contiguous() of a contiguous tensor is the tensor itself.
    assert!(x.contiguous().unwrap().same_storage(&x));
}

#[test]
fn permute_transpose_and_strides() {
    let d = dev();
    let a = Arr::rand(&mut rng("permute"), &[2, 3, 4], -1.0, 1.0);
    let x = a.upload(d);
    assert_eq!(x.strides(), &[12, 4, 1]);
    let p = x.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    assert_eq!(p.strides(), &[1, 12, 4]);
    assert!(p.same_storage(&x));
    check(&p, &a.permute(&[2, 0, 1]), 0.0, "permute(2, 0, 1)");
    poison(d, 24);
    check(
        &p.contiguous().unwrap(),
        &a.permute(&[2, 0, 1]),
        0.0,
        "permute then contiguous",
    );
    let t = x.transpose(0, -1).unwrap();
    assert_eq!(t.shape(), &[4, 3, 2]);
    check(&t, &a.transpose(0, 2), 0.0, "transpose(0, -1)");
    check(&x.t().unwrap(), &a.t(), 0.0, "t()");
    check(&x.t().unwrap().t().unwrap(), &a, 0.0, "t().t()");
}

#[test]
fn broadcast_unsqueeze_squeeze() {
    let d = dev();
    let a = Arr::rand(&mut rng("broadcast view"), &[3, 1], -1.0, 1.0);
    let x = a.upload(d);
    let b = x.broadcast_to(&[2, 3, 4]).unwrap();
    assert_eq!(b.shape(), &[2, 3, 4]);
    assert_eq!(b.strides(), &[0, 1, 0]);
    check(
        &b,
        &a.broadcast_to(&[2, 3, 4]),
        0.0,
        "broadcast_to [2, 3, 4]",
    );
    let u = x.unsqueeze(0).unwrap();
    assert_eq!(u.shape(), &[1, 3, 1]);
    let u = x.unsqueeze(-1).unwrap();
    assert_eq!(u.shape(), &[3, 1, 1]);
    let s = x.squeeze(1).unwrap();
    assert_eq!(s.shape(), &[3]);
    assert!(s.same_storage(&x));
    check(&s, &a.reshape(&[3]), 0.0, "squeeze(1)");
}

// ------------------------------------------------------------------------------------------
// Random.

fn moments(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn rand_uniform_in_range_with_expected_moments() {
    let d = dev();
    let (lo, hi) = (-2.0f32, 3.0f32);
    let n = 100_003;
    poison(d, n);
    let v = Tensor::rand_uniform(d, &[n], lo, hi, 7)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(v.len(), n);
    assert!(
        v.iter().all(|&x| x >= lo && x < hi),
        "a draw outside [{lo}, {hi}) (or NaN: an element left unwritten)"
    );
    let (mean, std) = moments(&v);
    let width = (hi - lo) as f64;
    assert!((mean - 0.5).abs() < 0.02, "uniform mean {mean}, want 0.5");
    assert!(
        (std - width / 12f64.sqrt()).abs() < 0.02,
        "uniform std {std}"
    );
}

#[test]
fn rand_normal_with_expected_moments() {
    let d = dev();
    let n = 100_003;
    for (m, s) in [(0.0f32, 1.0f32), (1.5, 2.0), (-3.0, 0.02)] {
        poison(d, n);
        let v = Tensor::rand_normal(d, &[n], m, s, 11)
            .unwrap()
            .to_vec()
            .unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "a non-finite normal draw");
        let (mean, std) = moments(&v);
        let scale = (s as f64).max(1.0);
        assert!(
            (mean - m as f64).abs() < 0.02 * scale,
            "normal({m}, {s}) mean {mean}"
        );
        assert!(
            (std - s as f64).abs() < 0.02 * s as f64,
            "normal({m}, {s}) std {std}"
        );
    }
}

#[test]
fn random_is_deterministic_per_seed() {
    let d = dev();
    let a = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 42)
        .unwrap()
        .to_vec()
        .unwrap();
    let b = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 42)
        .unwrap()
        .to_vec()
        .unwrap();
    let c = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 43)
        .unwrap()
        .to_vec()
        .unwrap();
    let hi = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 42 | (1 << 40))
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(a, b, "same seed, same draws");
    let same = a.iter().zip(&c).filter(|(x, y)| x == y).count();
    assert!(same < 10, "seeds 42 and 43 agree on {same} of 1031 draws");
    let same = a.iter().zip(&hi).filter(|(x, y)| x == y).count();
    assert!(
        same < 10,
        "the high seed word is ignored: {same} of 1031 draws agree"
    );
    // Element i is a function of (seed, i): a prefix of a longer draw, whatever the shape.
    let long = Tensor::rand_uniform(d, &[7, 300], 0.0, 1.0, 42)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(&long[..1031], &a[..]);
    let na = Tensor::rand_normal(d, &[257], 0.0, 1.0, 5)
        .unwrap()
        .to_vec()
        .unwrap();
    let nb = Tensor::rand_normal(d, &[257], 0.0, 1.0, 5)
        .unwrap()
        .to_vec()
        .unwrap();
    let nc = Tensor::rand_normal(d, &[257], 0.0, 1.0, 6)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(na, nb);
    assert_ne!(na, nc);
}

// ------------------------------------------------------------------------------------------
// Errors.

#[test]
fn add_of_unbroadcastable_shapes_is_broadcast_mismatch() {
    let d = dev();
    let a = Tensor::zeros(d, &[2, 3]).unwrap();
    let b = Tensor::zeros(d, &[4]).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(
        matches!(&e, Error::BroadcastMismatch { lhs, rhs, .. } if lhs == &[2, 3] && rhs == &[4]),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("[2, 3]") && e.to_string().contains("[4]"),
        "{e}"
    );
    let e = Tensor::where_cond(&a, &b, &a).unwrap_err();
    assert!(matches!(e, Error::BroadcastMismatch { .. }), "{e:?}");
    let e = a.broadcast_to(&[3, 3]).unwrap_err();
    assert!(matches!(e, Error::BroadcastMismatch { .. }), "{e:?}");
    let e = a.broadcast_to(&[3]).unwrap_err();
    assert!(matches!(e, Error::BroadcastMismatch { .. }), "{e:?}");
}

#[test]
fn matmul_inner_dim_mismatch_is_shape_mismatch() {
    let d = dev();
    let a = Tensor::zeros(d, &[3, 4]).unwrap();
    let b = Tensor::zeros(d, &[5, 6]).unwrap();
    let e = a.matmul(&b).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { op: "matmul", .. }),
        "{e:?}"
    );
    let v = Tensor::zeros(d, &[4]).unwrap();
    let e = a.matmul(&v).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { .. }),
        "rank-1 operand: {e:?}"
    );
    let a3 = Tensor::zeros(d, &[2, 3, 4]).unwrap();
    let b3 = Tensor::zeros(d, &[3, 4, 5]).unwrap();
    let e = a3.matmul(&b3).unwrap_err();
    assert!(
        matches!(e, Error::BroadcastMismatch { .. }),
        "batch 2 vs 3: {e:?}"
    );
}

#[test]
fn from_slice_with_wrong_length_is_element_count() {
    let d = dev();
    let e = Tensor::from_slice(d, &[1.0; 5], &[2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ElementCount {
                expected: 6,
                got: 5,
                ..
            }
        ),
        "{e:?}"
    );
    let e = Tensor::from_u32(d, &[1; 7], &[2, 3]).unwrap_err();
    assert!(matches!(e, Error::ElementCount { .. }), "{e:?}");
}

#[test]
fn transpose_out_of_range_is_dim_out_of_range() {
    let d = dev();
    let a = Tensor::zeros(d, &[2, 3]).unwrap();
    let e = a.transpose(5, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DimOutOfRange {
                dim: 5,
                rank: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(matches!(
        a.transpose(0, -3).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.sum(2, false).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.mean(-3, true).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.narrow(2, 0, 1).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.unsqueeze(4).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    let i = Tensor::from_u32(d, &[0], &[1]).unwrap();
    assert!(matches!(
        a.index_select(2, &i).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
}

#[test]
fn item_of_two_elements_errors() {
    let d = dev();
    let a = Tensor::zeros(d, &[2]).unwrap();
    let e = a.item().unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { op: "item", .. }),
        "{e:?}"
    );
    let empty = Tensor::zeros(d, &[0]).unwrap();
    assert!(empty.item().is_err());
}

#[test]
fn index_select_with_f32_indices_is_dtype_mismatch() {
    let d = dev();
    let a = Tensor::zeros(d, &[4, 3]).unwrap();
    let idx = Tensor::from_slice(d, &[0.0, 1.0], &[2]).unwrap();
    let e = a.index_select(0, &idx).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e:?}");
    let u = Tensor::from_u32(d, &[0, 1, 2, 3], &[2, 2]).unwrap();
    let e = a.index_select(0, &u).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { .. }),
        "2-D indices: {e:?}"
    );
    let e = u
        .index_select(0, &Tensor::from_u32(d, &[0], &[1]).unwrap())
        .unwrap_err();
    assert!(
        matches!(e, Error::DTypeMismatch { .. }),
        "u32 source: {e:?}"
    );
    // Reading back with the wrong dtype, and ops on u32 tensors.
    assert!(matches!(
        u.to_vec().unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
    assert!(matches!(
        a.to_vec_u32().unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
    assert!(matches!(u.exp().unwrap_err(), Error::DTypeMismatch { .. }));
    assert!(matches!(
        u.sum_all().unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
    assert_eq!(u.to_vec_u32().unwrap(), vec![0, 1, 2, 3]);
}

#[test]
fn bad_view_arguments_are_clear_errors() {
    let d = dev();
    let a = Tensor::zeros(d, &[2, 3]).unwrap();
    assert!(matches!(
        a.reshape(&[4, 2]).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    assert!(matches!(
        a.permute(&[0, 0]).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        a.permute(&[0]).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        a.narrow(1, 2, 2).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        a.squeeze(0).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    let s = Tensor::zeros(d, &[]).unwrap();
    assert!(matches!(
        s.softmax().unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    assert!(matches!(
        s.sum(0, false).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
}

// ------------------------------------------------------------------------------------------
// Laziness, pool reuse, hazards (each on a private device: the shared one sees other threads).

#[test]
fn thousand_chained_ops_cost_one_submit() {
    let d = private_dev();
    let x = Tensor::from_slice(&d, &[1.0, 2.0, 3.0], &[3]).unwrap();
    d.sync().unwrap();
    let before = d.counters();
    let mut y = x.clone();
    for i in 0..1000 {
        y = if i % 2 == 0 {
            y.add_scalar(1.0)
        } else {
            y.mul_scalar(0.5)
        }
        .unwrap();
    }
    let mid = d.counters() - before;
    assert_eq!(mid.submits, 0, "recording submitted work: {mid:?}");
    let got = y.to_vec().unwrap();
    let c = d.counters() - before;
    assert_eq!(c.submits, 1, "1000 ops and one read-back: {c:?}");
    assert_eq!(c.dispatches, 1000, "{c:?}");
    assert_eq!(c.read_backs, 1, "{c:?}");
    // y <- (y + 1) / 2 converges to 1.
    let want: Vec<f64> = [1.0, 2.0, 3.0]
        .iter()
        .map(|&v: &f64| (0..500).fold(v, |y, _| (y + 1.0) * 0.5))
        .collect();
    assert_close(&got, &want, 1e-6, "chained ops");
}

/// A small step: upload, matmul, bias, gelu, softmax, reductions, gather; read one value.
fn workload(d: &Device, rng: &mut StdRng) -> f32 {
    let x = Tensor::from_slice(d, &rand_vec(rng, 37 * 29, -1.0, 1.0), &[37, 29]).unwrap();
    let w = Tensor::from_slice(d, &rand_vec(rng, 29 * 19, -1.0, 1.0), &[29, 19]).unwrap();
    let b = Tensor::from_slice(d, &rand_vec(rng, 19, -1.0, 1.0), &[19]).unwrap();
    let idx = Tensor::from_u32(d, &[3, 1, 4, 1, 5], &[5]).unwrap();
    let h = x.matmul(&w).unwrap().add(&b).unwrap().gelu().unwrap();
    let p = h.log_softmax().unwrap().index_select(0, &idx).unwrap();
    let s = p.sum(1, false).unwrap().mean_all().unwrap();
    let t = h.t().unwrap().contiguous().unwrap().max_all().unwrap();
    s.add(&t).unwrap().item().unwrap()
}

#[test]
fn repeated_workload_creates_no_buffers_after_the_first() {
    let d = private_dev();
    let mut rng = rng("workload");
    workload(&d, &mut rng);
    let first = d.pool_stats();
    for rep in 1..4 {
        workload(&d, &mut rng);
        let s = d.pool_stats();
        assert_eq!(
            s.buffers_created, first.buffers_created,
            "repetition {rep} created buffers ({first:?} -> {s:?})"
        );
    }
    let s = d.pool_stats();
    assert!(s.reuses > first.reuses && s.hit_rate() > 0.5, "{s:?}");
}

/// segment.rs: "pooled buffers come back in the same combinations every step, so a
/// steady-state step creates none" (bind groups). The third and later repetitions of the same
/// workload must create no bind group and no arena or read-back buffer.
#[test]
fn repeated_workload_creates_no_bind_groups_after_the_second() {
    let d = private_dev();
    let mut rng = rng("workload bind groups");
    workload(&d, &mut rng);
    workload(&d, &mut rng);
    let others = d.other_buffers_created();
    let per_rep: Vec<u64> = (0..4)
        .map(|_| {
            let before = d.counters();
            workload(&d, &mut rng);
            (d.counters() - before).bind_groups_created
        })
        .collect();
    assert_eq!(
        d.other_buffers_created(),
        others,
        "arena or read-back buffers created"
    );
    assert!(
        per_rep.iter().all(|&n| n == 0),
        "repetitions 3..=6 of a 10-dispatch workload created {per_rep:?} bind groups \
         ({} cached)",
        d.bind_groups_cached()
    );
}

#[test]
fn dropped_input_reused_by_an_upload_keeps_its_original_data_for_earlier_ops() {
    let d = private_dev();
    let mut rng = rng("hazard");
    let n = 1031;
    d.sync().unwrap();
    let before = d.counters();
    let mut reused = 0;
    let mut checks: Vec<(Tensor, Arr, String)> = Vec::new();
    for round in 0..6 {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        let other = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        let x = a.upload(&d);
        let o = other.upload(&d);
        let id = x.storage().buffer_id();
        // One op reading X, recorded; then X dropped and its buffer handed to a new upload.
        let (y, want) = match round % 3 {
            0 => (x.exp().unwrap(), a.map(f64::exp)),
            1 => (x.mul(&o).unwrap(), a.zip(&other, |p, q| p * q)),
            _ => (x.sum_all().unwrap(), Arr::new(&[], vec![a.sum_all()])),
        };
        drop(x);
        let fresh = Arr::rand(&mut rng, &[n], 5.0, 6.0);
        let z = fresh.upload(&d);
        if z.storage().buffer_id() == id {
            reused += 1;
        }
        let w = z.neg().unwrap(); // reads the new data from the same buffer
        checks.push((y, want, format!("round {round}: op on the dropped input")));
        checks.push((
            w,
            fresh.map(|v| -v),
            format!("round {round}: op on the new upload"),
        ));
    }
    let c = d.counters() - before;
    assert_eq!(
        c.submits, 0,
        "everything above sits in one open segment: {c:?}"
    );
    assert!(
        reused >= 3,
        "the pool reused the dropped buffer only {reused} of 6 times"
    );
    for (t, want, what) in &checks {
        check(t, want, TOL, what);
    }
}

#[test]
fn dropped_output_buffer_reused_by_a_fill_keeps_order() {
    let d = private_dev();
    let mut rng = rng("hazard fill");
    let a = Arr::rand(&mut rng, &[64, 33], -1.0, 1.0);
    let x = a.upload(&d);
    let mut outs = Vec::new();
    for k in 0..5 {
        // t is an intermediate whose buffer is freed as soon as u is recorded; the fill below
        // takes it while the segment still has to run u's read of it.
        let t = x.mul_scalar(k as f32 + 1.0).unwrap();
        let u = t.t().unwrap().contiguous().unwrap();
        drop(t);
        let f = Tensor::full(&d, &[64, 33], -7.0).unwrap();
        outs.push((u, k, f));
    }
    for (u, k, f) in &outs {
        check(
            u,
            &a.map(|v| v * (*k as f64 + 1.0)).t(),
            TOL,
            &format!("round {k}"),
        );
        check(f, &Arr::full(&[64, 33], -7.0), 0.0, &format!("fill {k}"));
    }
}

#[test]
fn auto_flush_at_the_bound_keeps_results() {
    let d = private_dev();
    d.set_flush_bound(7);
    let a = Arr::rand(&mut rng("flush bound"), &[257], -1.0, 1.0);
    let x = a.upload(&d);
    d.sync().unwrap();
    let before = d.counters();
    let mut y = x.clone();
    for _ in 0..50 {
        y = y.add_scalar(0.25).unwrap();
    }
    let c = d.counters() - before;
    assert_eq!(c.submits, 7, "50 dispatches at a bound of 7: {c:?}");
    check(&y, &a.map(|v| v + 12.5), TOL, "after automatic flushes");
}

#[test]
fn an_early_submit_fires_once_and_keeps_results() {
    let d = private_dev();
    let a = Arr::rand(&mut rng("early submit"), &[257], -1.0, 1.0);
    let x = a.upload(&d);
    // Compiled first: an early submit waits for no compile (src/graph/runtime.rs's tests).
    x.add_scalar(0.0).unwrap();
    d.sync().unwrap();
    let before = d.counters();
    d.submit_early(5);
    let mut y = x.clone();
    for i in 0..20 {
        y = y.add_scalar(0.5).unwrap();
        let c = d.counters() - before;
        let want = if i < 4 { 0 } else { 1 };
        assert_eq!(c.submits, want, "after {} dispatches: {c:?}", i + 1);
    }
    check(&y, &a.map(|v| v + 10.0), TOL, "across the early submit");
    assert_eq!((d.counters() - before).submits, 2, "the rest in one flush");
    // Armed, then flushed before reaching its count: gone, not carried to the next Segment.
    d.submit_early(3);
    y = y.add_scalar(1.0).unwrap();
    d.flush();
    let mid = d.counters();
    for _ in 0..6 {
        y = y.add_scalar(1.0).unwrap();
    }
    assert_eq!((d.counters() - mid).submits, 0);
    check(
        &y,
        &a.map(|v| v + 17.0),
        TOL,
        "after a disarmed early submit",
    );
}

#[test]
fn device_is_usable_from_several_threads() {
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let d = dev();
                let mut rng = rng(&format!("thread {t}"));
                for _ in 0..5 {
                    let a = Arr::rand(&mut rng, &[33, 65], -1.0, 1.0);
                    let b = Arr::rand(&mut rng, &[65, 17], -1.0, 1.0);
                    let c = a.upload(d).matmul(&b.upload(d)).unwrap().tanh().unwrap();
                    check(
                        &c,
                        &a.matmul(&b).map(f64::tanh),
                        TOL,
                        &format!("thread {t}"),
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

// ------------------------------------------------------------------------------------------
// Rank 8 views, grids past 65,535 workgroups, broadcast matmul operands.

/// [2, 3, 2, 3, 2, 3, 2, 2] with its dims reversed: no two dims merge, so kernels index 8 dims.
fn rank8_reversed(d: &Device, rng: &mut StdRng) -> (Tensor, Arr) {
    let shape = [2, 3, 2, 3, 2, 3, 2, 2];
    let dims = [7, 6, 5, 4, 3, 2, 1, 0];
    let a = Arr::rand(rng, &shape, -1.0, 1.0);
    (a.upload(d).permute(&dims).unwrap(), a.permute(&dims))
}

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
fn reductions_on_rank_8_views() {
    let d = dev();
    let (x, a) = rank8_reversed(d, &mut rng("rank 8 reduce"));
    for dim in [0usize, 3, 7] {
        poison(d, a.numel() / a.shape[dim]);
        let got = x.sum(dim as isize, true).unwrap();
        check(
            &got,
            &a.sum(dim, true),
            TOL,
            &format!("sum(dim {dim}) on rank 8"),
        );
    }
    check_full_reductions(d, &SUM_MAX_MIN_ALL, "rank 8", &x, &a);
}

#[test]
fn reductions_and_softmax_over_more_than_65535_rows() {
    // One workgroup per output row: 66_001 rows need a 2-D grid of workgroups.
    let d = dev();
    let a = Arr::rand(&mut rng("many rows"), &[66_001, 3], -4.0, 4.0);
    let x = a.upload(d);
    poison(d, 66_001);
    check(
        &x.sum(1, false).unwrap(),
        &a.sum(1, false),
        TOL,
        "sum over 66001 rows",
    );
    poison(d, a.numel());
    check(
        &x.softmax().unwrap(),
        &a.softmax(false),
        TOL,
        "softmax of 66001 rows",
    );
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

#[test]
fn matmul_with_broadcast_rows_and_columns() {
    let d = dev();
    let mut rng = rng("matmul stride 0");
    // A's rows all the same (m stride 0); B's columns all the same (n stride 0).
    let arow = Arr::rand(&mut rng, &[1, 21], -1.0, 1.0);
    let bcol = Arr::rand(&mut rng, &[21, 1], -1.0, 1.0);
    let x = arow.upload(d).broadcast_to(&[19, 21]).unwrap();
    let y = bcol.upload(d).broadcast_to(&[21, 23]).unwrap();
    poison(d, 19 * 23);
    let want = arow
        .broadcast_to(&[19, 21])
        .matmul(&bcol.broadcast_to(&[21, 23]));
    check(&x.matmul(&y).unwrap(), &want, TOL, "broadcast operands");
}

// ------------------------------------------------------------------------------------------
// The harness itself.

#[test]
#[should_panic(expected = "non-finite")]
fn harness_nan_never_passes() {
    assert_close(&[1.0, f32::NAN], &[1.0, 2.0], 1.0, "NaN output");
}

#[test]
#[should_panic(expected = "non-finite")]
fn harness_nan_does_not_match_nan() {
    assert_close(&[f32::NAN], &[f64::NAN], 1.0, "NaN want");
}

#[test]
#[should_panic(expected = "worst [2]")]
fn harness_reports_the_worst_element() {
    assert_close(
        &[1.0, 2.0, 3.5, 4.0],
        &[1.0, 2.0, 3.0, 4.001],
        TOL,
        "off by 0.5",
    );
}

#[test]
fn harness_metric_is_relative_above_one_absolute_below() {
    assert_close(
        &[1000.05, 0.00005, f32::INFINITY],
        &[1000.0, 0.0, f64::INFINITY],
        TOL,
        "ok",
    );
}

#[test]
fn poison_reaches_the_next_output() {
    let d = private_dev();
    let x = Tensor::from_slice(&d, &[1.0; 1031], &[1031]).unwrap();
    let junk: Vec<Tensor> = (0..3)
        .map(|_| Tensor::full(&d, &[1031], f32::NAN).unwrap())
        .collect();
    assert!(junk[0].to_vec().unwrap().iter().all(|v| v.is_nan()));
    let ids: Vec<u64> = junk.iter().map(|t| t.storage().buffer_id()).collect();
    drop(junk);
    let y = x.exp().unwrap();
    assert!(
        ids.contains(&y.storage().buffer_id()),
        "the output took a poisoned buffer"
    );
}

#[test]
fn ops_across_devices_are_device_mismatch() {
    let a = Tensor::zeros(dev(), &[3]).unwrap();
    let b = Tensor::zeros(tree_dev(), &[3]).unwrap();
    assert!(matches!(
        a.add(&b).unwrap_err(),
        Error::DeviceMismatch { .. }
    ));
    let m = Tensor::zeros(tree_dev(), &[3, 3]).unwrap();
    let e = a.reshape(&[1, 3]).unwrap().matmul(&m).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
}

#[test]
fn trim_then_reuse_gives_correct_results() {
    let d = private_dev();
    let a = Arr::rand(&mut rng("trim"), &[257, 3], -1.0, 1.0);
    for round in 0..3 {
        let x = a.upload(&d);
        check(
            &x.t().unwrap().exp().unwrap(),
            &a.t().map(f64::exp),
            TOL,
            &format!("round {round}"),
        );
        drop(x);
        d.trim(); // destroys the cached buffers; their bind groups must go too
    }
}

/// A tile search over a step's products: plain, bias and GELU products each get a measured
/// configuration (K ranges where a plain or bias product may split K; a GELU product does
/// not), and the step gives the same gradients on the tuned configurations.
#[test]
fn tile_search_covers_plain_bias_and_gelu_products() {
    use wgrad::ops::Activation;
    let d = tiled_dev();
    let mut rng = rng("tile search");
    // h = rows: the bias product's K is long enough to split, as the dW products' are.
    let (rows, c, h) = (512, 40, 512);
    let x = Arr::rand(&mut rng, &[rows, c], -1.0, 1.0).upload(&d);
    let w1 = Arr::rand(&mut rng, &[c, h], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    let b1 = Arr::rand(&mut rng, &[h], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    // Small enough that z = y W2 + b2 over h = 512 stays near 1: the gradients (sums over 512
    // rows) then differ between configurations by rounding well under TOL.
    let w2 = Arr::rand(&mut rng, &[h, c], -0.1, 0.1)
        .upload(&d)
        .requires_grad();
    let b2 = Arr::rand(&mut rng, &[c], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    let step = || -> wgrad::Result<Vec<Vec<f32>>> {
        for p in [&w1, &b1, &w2, &b2] {
            p.zero_grad();
        }
        let y = x.linear(&w1, Some(&b1), Activation::Gelu)?;
        let z = y.linear(&w2, Some(&b2), Activation::None)?;
        z.square()?.sum_all()?.backward()?;
        [&w1, &b1, &w2, &b2]
            .iter()
            .map(|p| p.grad().expect("reached by backward").to_vec())
            .collect()
    };
    let before = step().unwrap();
    let searches = wgrad::tune::search_step(&d, 1, || step().map(drop)).unwrap();
    let keys: Vec<_> = searches.iter().map(|s| s.key).collect();
    assert!(keys.iter().any(|k| k.gelu && k.bias), "{keys:?}");
    assert!(
        keys.iter()
            .any(|k| k.bias && !k.gelu && k.k as usize == rows),
        "{keys:?}"
    );
    assert!(
        keys.iter().any(|k| !k.bias && k.k as usize == rows),
        "{keys:?}"
    );
    let tuned = d.tile_rows();
    for s in &searches {
        let best = s.best();
        assert!(
            tuned
                .iter()
                .any(|(k, t, split, _)| *k == s.key && *t == best.tile && *split == best.split),
            "{}: the winner is in the table",
            s.key.describe()
        );
        // Splits are measured for plain and bias products (K = 512: one range, and those of
        // ranges at least SEARCH_MIN_K long).
        let splits: Vec<_> = s.measured.iter().filter_map(|m| m.split).collect();
        let ranges: Vec<u32> = wgrad::tune::SPLITS
            .into_iter()
            .filter(|&n| n == 1 || rows / n as usize >= wgrad::tune::SEARCH_MIN_K)
            .collect();
        assert_eq!(ranges, [1, 2, 3, 4]);
        if s.key.gelu {
            assert!(splits.is_empty(), "{}", s.key.describe());
        } else if s.key.k as usize == rows {
            // Each of those numbers of ranges, for each of the fastest whole-K tiles.
            let mut whole: Vec<_> = s.measured.iter().filter(|m| m.split.is_none()).collect();
            whole.sort_by(|a, b| a.ms.total_cmp(&b.ms));
            let tries = wgrad::tune::SPLIT_TILES.min(whole.len());
            assert_eq!(splits, ranges.repeat(tries), "{}", s.key.describe());
            let split_tiles: Vec<_> = s
                .measured
                .iter()
                .filter(|m| m.split.is_some())
                .map(|m| m.tile)
                .collect();
            for w in &whole[..tries] {
                assert_eq!(
                    split_tiles.iter().filter(|&&t| t == w.tile).count(),
                    ranges.len(),
                    "{}: {} is among the fastest whole, so it is tried split",
                    s.key.describe(),
                    w.tile.name()
                );
            }
        }
    }
    same_gradients(&step().unwrap(), &before, "the tuned configurations");
}

/// A search's winners checked inside the step (`tune::in_step`): each product tries its
/// candidates (the search's winner first, each distinct, within `NEAR` of it), each timed in
/// the step; the one with the least GPU-busy time is in the table, and the step's gradients
/// are the same on it.
#[test]
fn in_step_check_keeps_the_candidate_the_step_ran_fastest_on() {
    use wgrad::ops::Activation;
    use wgrad::tune::in_step;
    let d = tiled_dev();
    assert!(
        d.gpu().has(wgrad::wgpu::Features::TIMESTAMP_QUERY),
        "the test adapter times the GPU (lavapipe does)"
    );
    let mut rng = rng("in-step check");
    let (rows, c, h) = (512, 40, 512);
    let x = Arr::rand(&mut rng, &[rows, c], -1.0, 1.0).upload(&d);
    let w1 = Arr::rand(&mut rng, &[c, h], -0.5, 0.5)
        .upload(&d)
        .requires_grad();
    let w2 = Arr::rand(&mut rng, &[h, c], -0.1, 0.1)
        .upload(&d)
        .requires_grad();
    let step = || -> wgrad::Result<Vec<Vec<f32>>> {
        for p in [&w1, &w2] {
            p.zero_grad();
        }
        let y = x.linear(&w1, None, Activation::None)?;
        let z = y.linear(&w2, None, Activation::None)?;
        z.square()?.sum_all()?.backward()?;
        [&w1, &w2]
            .iter()
            .map(|p| p.grad().expect("reached by backward").to_vec())
            .collect()
    };
    let before = step().unwrap();
    let searches = wgrad::tune::search_step(&d, 1, || step().map(drop)).unwrap();
    let refined = in_step::refine_step(&d, &searches, || step().map(drop))
        .unwrap()
        .expect("an adapter with timestamps checks in the step");
    assert_eq!(refined.len(), searches.len());
    let table = d.tile_rows();
    for s in &searches {
        let what = s.key.describe();
        // refine_step goes largest first: each search's own result.
        let r = refined
            .iter()
            .find(|r| r.key == s.key)
            .expect("every product checked");
        let cands = in_step::candidates(s);
        assert!(!cands.is_empty() && cands.len() <= in_step::MOST, "{what}");
        let best = s.best();
        assert!(
            cands[0].tile == best.tile && cands[0].split == best.split,
            "{what}: winner first"
        );
        for (i, m) in cands.iter().enumerate() {
            assert!(
                m.ms <= best.ms * in_step::NEAR,
                "{what}: {} too slow alone",
                m.name()
            );
            assert!(
                !cands[..i]
                    .iter()
                    .any(|o| o.tile == m.tile && o.split == m.split),
                "{what}: {} tried twice",
                m.name()
            );
        }
        let tried: Vec<_> = r.tried.iter().map(|(m, _)| (m.tile, m.split)).collect();
        let want: Vec<_> = cands.iter().map(|m| (m.tile, m.split)).collect();
        assert_eq!(tried, want, "{what}: the candidates, in order");
        let least = r
            .tried
            .iter()
            .map(|(_, ms)| *ms)
            .fold(f64::INFINITY, f64::min);
        assert!(least.is_finite() && least > 0.0, "{what}: {least}");
        let (_, kept_ms) = r.busy_ms();
        assert_eq!(kept_ms, least, "{what}: the kept one ran the step fastest");
        assert!(
            table.iter().any(|(k, t, split, _)| *k == s.key
                && *t == r.chosen.tile
                && *split == r.chosen.split),
            "{what}: the kept one is in the table"
        );
    }
    same_gradients(&step().unwrap(), &before, "the kept configurations");
}

/// Each gradient of `after` within TOL of `before`'s (a step on other configurations).
#[track_caller]
fn same_gradients(after: &[Vec<f32>], before: &[Vec<f32>], on: &str) {
    for (i, (a, b)) in after.iter().zip(before).enumerate() {
        let want: Vec<f64> = b.iter().map(|&v| v as f64).collect();
        assert_close(a, &want, TOL, &format!("gradient {i} on {on}"));
    }
}

/// A linear's forward (bias and GELU epilogue), a second one's with a residual, their dX, and
/// their dW with the bias gradient as column sums, at sizes no tile divides; two backwards,
/// the second's gradients added into the first's. The outputs and gradients of a step on `d`
/// (parameters from a fixed seed), and the products' keys.
struct LinearProducts {
    params: Vec<Tensor>,
}

impl LinearProducts {
    const SHAPE: (usize, usize, usize, usize) = (131, 45, 77, 36);

    fn new(d: &Device) -> LinearProducts {
        let mut rng = rng("searched tiles");
        let (rows, c, h, o) = Self::SHAPE;
        let mut param =
            |shape: &[usize], r: f32| Arr::rand(&mut rng, shape, -r, r).upload(d).requires_grad();
        let params = vec![
            param(&[rows, c], 1.0),
            param(&[c, h], 0.5),
            param(&[h], 0.5),
            param(&[h, o], 0.3),
            param(&[o], 0.5),
            param(&[rows, o], 1.0),
        ];
        LinearProducts { params }
    }

    fn backward(&self) -> wgrad::Result<Vec<Vec<f32>>> {
        use wgrad::ops::Activation;
        let [x, w, b, w2, b2, res] = &self.params[..] else {
            unreachable!()
        };
        let y = x.linear(w, Some(b), Activation::Gelu)?;
        let z = y.linear_residual(w2, b2, res)?;
        z.square()?.sum_all()?.backward()?;
        let mut out = vec![y.to_vec()?, z.to_vec()?];
        for p in &self.params {
            out.push(p.grad().expect("reached by backward").to_vec()?);
        }
        Ok(out)
    }

    fn step(&self) -> wgrad::Result<Vec<Vec<f32>>> {
        for p in &self.params {
            p.zero_grad();
        }
        let mut out = self.backward()?;
        out.extend(self.backward()?);
        Ok(out)
    }

    /// A step's outputs, and the keys of its products.
    fn logged_step(&self, d: &Device) -> (Vec<Vec<f32>>, Vec<wgrad::kernels::tuning::ProductKey>) {
        d.log_products(true);
        let out = self.step().unwrap();
        let keys = d.take_product_log();
        d.log_products(false);
        (out, keys)
    }

    /// Each tile for every product in turn, whole and (where a product may split K) in 2
    /// ranges of K: a step's outputs against `want` within `tol`.
    fn check_tiles(
        &self,
        d: &Device,
        keys: &[wgrad::kernels::tuning::ProductKey],
        tiles: &[wgrad::kernels::tuning::TileChoice],
        want: &[Vec<f32>],
        tol: f64,
    ) {
        for &t in tiles {
            for split in [None, Some(2)] {
                for key in keys {
                    let split = split.filter(|_| !key.gelu && key.batch == 1);
                    d.set_tile(*key, t, split, 1.0);
                }
                let got = self.step().unwrap();
                let worst = got
                    .iter()
                    .zip(want)
                    .flat_map(|(g, w)| g.iter().zip(w))
                    .map(|(&g, &w)| (g as f64 - w as f64).abs() / (w as f64).abs().max(1.0))
                    .fold(0.0, f64::max);
                println!("tile {t:?} split {split:?}: worst error {worst:.3e}");
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
                    let what = format!("tile {t:?} split {split:?}: output {i}");
                    assert_close(g, &w, tol, &what);
                }
            }
        }
    }
}

/// Every tile a search may choose for the tiled kernel (interleaved and vector-run register
/// blocks), and blocks the accumulators hold only rounded up to vectors (3x3, 2x3), give a
/// linear's products (`LinearProducts`), against the heuristic's tiles (which the tests above
/// check against f64).
#[test]
fn every_searched_tile_gives_a_linears_products() {
    use wgrad::kernels::matmul::Tile;
    use wgrad::kernels::tuning::{tiled_search_tiles, TileChoice};
    let d = tiled_dev();
    let lin = LinearProducts::new(&d);
    let (want, keys) = lin.logged_step(&d);
    assert!(keys.iter().any(|k| k.residual), "{keys:?}");
    assert!(keys.iter().any(|k| k.gelu), "{keys:?}");
    let mut tiles = tiled_search_tiles();
    assert!(tiles.iter().any(|t| t.vec) && tiles.iter().any(|t| !t.vec));
    tiles.extend(["48x48x16/3x3", "32x48x16/2x3"].map(|n| Tile::parse(n).unwrap()));
    let limit = d.gpu().limits.max_compute_workgroup_storage_size;
    for t in &tiles {
        assert!(
            t.workgroup_bytes() <= limit,
            "tile {} needs {} bytes of workgroup memory, the adapter has {limit}: it would not run",
            t.name(),
            t.workgroup_bytes()
        );
    }
    let tiles: Vec<_> = tiles.into_iter().map(TileChoice::Tiled).collect();
    lin.check_tiles(&d, &keys, &tiles, &want, TOL);
}

const X3_TOL: f64 = 1e-4;

/// Every tile a search may choose for an X3 product (f32 operands as three f16 products on
/// cooperative matrices), whole and in 2 ranges of K, gives a linear's products
/// (`LinearProducts`) within `X3_TOL` of the tiled f32 kernel's (on a Device that keeps them
/// there). Without cooperative matrices there is no X3 tile, and the heuristic's tiles are the
/// tiled kernel's.
#[test]
fn every_x3_tile_gives_a_linears_products_to_f32_precision() {
    let tiled = tiled_dev();
    let (want, _) = LinearProducts::new(&tiled).logged_step(&tiled);
    let d = private_dev();
    let lin = LinearProducts::new(&d);
    let (got, keys) = lin.logged_step(&d);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        assert_close(g, &w, X3_TOL, &format!("heuristic tiles: output {i}"));
    }
    // The tiles an X3 product can run here (none without cooperative matrices).
    let tiles = coop_search_tiles(&d, true);
    lin.check_tiles(&d, &keys, &tiles, &want, X3_TOL);
}

/// An (rows, cols) operand: contiguous, or (`narrow`) a view 4 elements into rows of a multiple
/// of 4 longer than it, the rest of each row NaN: a kernel that reads past the view's end (as
/// whole vectors do) and fails to mask it gives NaN.
fn padded_operand(
    d: &Device,
    rng: &mut StdRng,
    rows: usize,
    cols: usize,
    narrow: bool,
) -> (Tensor, Arr) {
    let logical = Arr::rand(rng, &[rows, cols], -1.0, 1.0);
    if !narrow {
        return (logical.upload(d), logical);
    }
    let width = cols.next_multiple_of(4) + 8;
    let stored = Arr::build(&[rows, width], |i| match i[1].checked_sub(4) {
        Some(c) if c < cols => logical.at(&[i[0], c]),
        _ => f64::NAN,
    });
    let view = stored.upload(d).narrow(1, 4, cols).unwrap();
    (view, logical)
}

/// The tiled kernel's vector reads (`matmul.wgsl`'s A_V4, B_V4) on every vector tile the engine
/// or a search chooses: A read along k or (transposed) m, B along n or (transposed) k; rows of
/// a multiple of 4 and views narrower than their rows (the last vector partly outside, NaN
/// there: a kernel that does not mask what lies past K gives NaN); whole K and ranges of it (3
/// asked; 2 where BK is 32); a batch of 3 over a broadcast B; and a linear's backward, whose
/// weight gradient takes A's row of ones beside a vector of x^T's (the bias gradient). Against
/// f64; every product's dispatch says it read both operands as vectors, a split product's that
/// its partials were summed (in its own dispatch or a second), the weight gradient's that it
/// ran with the row of ones.
#[test]
fn vector_reads_match_f64_on_every_layout() {
    use wgrad::kernels::tuning::{tiled_search_tiles, TileChoice};
    use wgrad::ops::Activation;
    let d = tiled_dev();
    assert_eq!(
        d.set_gpu_timing(true),
        Some(wgrad::graph::TimingMode::PerDispatch),
        "the test reads each dispatch's variant from timestamps inside passes"
    );
    let mut rng = rng("vector reads");
    let mut tiles: Vec<_> = tiled_search_tiles().into_iter().filter(|t| t.vec).collect();
    tiles.sort_by_key(|t| t.name());
    tiles.dedup();
    assert!(tiles.len() >= 4, "{tiles:?}");
    // Runs `product` once to learn its keys, then on `tile` (split where a key allows), and
    // checks that each matmul dispatch read A and B in vectors, that a split ran where asked
    // and (`ones`) that a product took A's row of ones.
    let on_tile = |tile, split: Option<u32>, ones: bool, product: &dyn Fn() -> Vec<Tensor>| {
        d.log_products(true);
        drop(product());
        let keys = d.take_product_log();
        d.log_products(false);
        for key in keys {
            let split = split.filter(|_| !key.gelu && key.batch == 1);
            d.set_tile(key, TileChoice::Tiled(tile), split, 1.0);
        }
        d.take_gpu_intervals().unwrap();
        let out = product();
        for t in &out {
            t.to_vec().unwrap();
        }
        let intervals = d.take_gpu_intervals().unwrap();
        // A split product sums its ranges in its own dispatch (`matmul_split`) or in a
        // second (`matmul_split_sum*`).
        let (sums, products): (Vec<_>, Vec<_>) = intervals
            .iter()
            .filter(|i| i.label.starts_with("matmul"))
            .partition(|i| i.label.starts_with("matmul_split_sum"));
        assert!(!products.is_empty());
        let split_ran = !sums.is_empty() || products.iter().any(|i| i.label == "matmul_split");
        assert_eq!(
            split_ran,
            split.is_some(),
            "tile {}: {intervals:?}",
            tile.name()
        );
        for i in &products {
            let flags = i.variant.split(',').collect::<Vec<_>>();
            assert!(
                flags.contains(&"A_V4=true") && flags.contains(&"B_V4=true"),
                "tile {}: {} {}",
                tile.name(),
                i.label,
                i.variant
            );
        }
        if ones {
            assert!(
                products.iter().any(|i| i.variant.contains("ONES=true")),
                "tile {}: {products:?}",
                tile.name()
            );
        }
        out
    };
    for &tile in &tiles {
        for split in [None, Some(3)] {
            for (ta, tb, narrow) in (0..8).map(|i| (i & 1 != 0, i & 2 != 0, i & 4 != 0)) {
                let (m, k, n) = if narrow { (70, 45, 38) } else { (68, 44, 36) };
                let (x, a) = match ta {
                    false => padded_operand(&d, &mut rng, m, k, narrow),
                    true => {
                        let (x, a) = padded_operand(&d, &mut rng, k, m, narrow);
                        (x.t().unwrap(), a.t())
                    }
                };
                let (y, b) = match tb {
                    false => padded_operand(&d, &mut rng, k, n, narrow),
                    true => {
                        let (y, b) = padded_operand(&d, &mut rng, n, k, narrow);
                        (y.t().unwrap(), b.t())
                    }
                };
                let c = on_tile(tile, split, false, &|| vec![x.matmul(&y).unwrap()]);
                let what = format!(
                    "tile {} split {split:?}: {m}x{k}x{n}, transposed {ta} {tb}, narrow {narrow}",
                    tile.name()
                );
                check(&c[0], &a.matmul(&b), TOL, &what);
            }
            // A batch of 3 (68, 44) matrices times one (44, 36) (B's batch stride 0); a
            // batch does not split.
            if split.is_none() {
                let a = Arr::rand(&mut rng, &[3, 68, 44], -1.0, 1.0);
                let b = Arr::rand(&mut rng, &[44, 36], -1.0, 1.0);
                let (x, y) = (a.upload(&d), b.upload(&d));
                let c = on_tile(tile, None, false, &|| vec![x.matmul(&y).unwrap()]);
                check(
                    &c[0],
                    &a.matmul(&b),
                    TOL,
                    &format!("tile {}: batch of 3", tile.name()),
                );
            }
            // dW = x^T dz with the bias gradient as its row of ones: x^T read along m, the
            // ones starting a vector (44 features) or inside one (45).
            for narrow in [false, true] {
                let (rows, c_in, c_out) = if narrow { (70, 45, 36) } else { (68, 44, 36) };
                let (x, xa) = padded_operand(&d, &mut rng, rows, c_in, narrow);
                let wa = Arr::rand(&mut rng, &[c_in, c_out], -0.5, 0.5);
                let ba = Arr::rand(&mut rng, &[c_out], -0.5, 0.5);
                let (w, b) = (wa.upload(&d).requires_grad(), ba.upload(&d).requires_grad());
                let grads = on_tile(tile, split, true, &|| {
                    w.zero_grad();
                    b.zero_grad();
                    let y = x.linear(&w, Some(&b), Activation::None).unwrap();
                    y.square().unwrap().sum_all().unwrap().backward().unwrap();
                    vec![y, w.grad().unwrap(), b.grad().unwrap()]
                });
                let y = linear(&xa, &wa, Some(&ba));
                let dz = y.map(|v| 2.0 * v);
                let what = format!(
                    "tile {} split {split:?}: linear {rows}x{c_in}x{c_out}, narrow {narrow}",
                    tile.name()
                );
                check(&grads[0], &y, TOL, &format!("{what}: y"));
                check(&grads[1], &xa.t().matmul(&dz), TOL, &format!("{what}: dW"));
                check(&grads[2], &dz.sum(0, false), TOL, &format!("{what}: db"));
            }
        }
    }
}

/// The LM head's product into 64-aligned rows (a training step's logits) and the same product
/// into rows as long as N tune apart (the kernels read and store the two differently: vectors
/// or gathered elements), the search runs each on operands laid out as its key says, and both
/// give x W on the tuned configurations.
#[test]
fn padded_and_unpadded_rows_tune_apart() {
    use wgrad::kernels::tuning::ProductKey;
    use wgrad::ops::Activation;
    let d = private_dev();
    let mut rng = rng("aligned keys");
    let (rows, k, n) = (64, 32, 97);
    let x = Arr::rand(&mut rng, &[rows, k], -1.0, 1.0);
    // W as the tied embedding's transposed view: (N, K) rows of K.
    let wt = Arr::rand(&mut rng, &[n, k], -0.5, 0.5);
    let want = x.matmul(&wt.t());
    let (xd, wd) = (x.upload(&d), wt.upload(&d).t().unwrap());
    let run = || -> wgrad::Result<(Tensor, Tensor)> {
        Ok((
            xd.linear_padded(&wd, 64)?,
            xd.linear(&wd, None, Activation::None)?,
        ))
    };
    let searches = wgrad::tune::search_step(&d, 1, || run().map(drop)).unwrap();
    let keys: Vec<_> = searches.iter().map(|s| s.key).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys[0].aligned && !keys[1].aligned, "{keys:?}");
    assert_eq!(
        ProductKey {
            aligned: true,
            ..keys[1]
        },
        keys[0]
    );
    let (padded, plain) = run().unwrap();
    assert_eq!(padded.strides(), [128, 1]);
    check(&padded, &want, TOL, "padded rows, tuned");
    check(&plain, &want, TOL, "rows of N, tuned");
}
