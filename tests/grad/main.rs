//! Gradient checks of every op's backward rule: the gradients `backward` records on the GPU
//! (f32) against central finite differences of a CPU f64 reference (`common::reference`, on
//! `common::Arr`), through `wgrad::autograd::gradcheck::check`. Each checked scalar is
//! `sum(f(inputs) * w)` with a fixed random weight `w` of f's output shape, so every output
//! element carries a distinct upstream gradient. Inputs are kept inside each op's domain and
//! at least 0.1 from its kinks (relu, abs, max/min, clamp), and extrema of max/min reductions
//! are unique.
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
//!
//! One test binary, a module per op family (elementwise, reductions, softmax, matmul, gather,
//! views), then leaves that are views, accumulation and persistence, no_grad and detach, and
//! the errors of backward.

#[path = "../common/mod.rs"]
mod common;

mod accumulate;
mod elementwise;
mod errors;
mod gather;
mod leaves;
mod matmul;
mod no_grad;
mod reduce;
mod softmax;
mod views;

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

/// Indices of an embedding lookup: repeated (0, 3), and rows 2 and 4 never picked.
const EMBED_IDX: [u32; 6] = [0, 3, 3, 5, 0, 1];
