//! Every op against a CPU f64 reference (`common::reference`) on seeded random inputs: odd
//! sizes (not multiples of 4 or of a workgroup), the vec4 and the strided paths, views,
//! broadcasting, empty and one-element tensors, error cases; plus laziness (submits), pool
//! reuse, and the buffer-reuse hazard of dropped inputs. Outputs are poisoned with NaN before
//! each op (see `common::poison`), so an element a kernel leaves unwritten fails the
//! comparison.
//!
//! One test binary, a module per op family: elementwise ops (unary, scalar, binary,
//! comparisons, where), reductions, softmax, matmul, gather (index_select), views, tensor
//! creation (empty and one-element tensors, random draws), errors, the runtime (laziness, pool
//! reuse, hazards, threads), the harness itself, the matmul tile search; and the fused ops:
//! linear (and its products split into ranges of K), LayerNorm, cross-entropy, causal
//! attention. Each family's module says what it checks.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod attention_grouped;
mod cat;
mod create;
mod cross_entropy;
mod elementwise;
mod errors;
mod gather;
mod harness;
mod layernorm;
mod linear;
mod linear_split;
mod matmul;
mod reduce;
mod rmsnorm;
mod runtime;
mod softmax;
mod swiglu;
mod tuning;
mod views;

use common::*;
use rand::rngs::StdRng;
use rand::Rng;
use wgrad::{Device, Tensor};

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

// ------------------------------------------------------------------------------------------
// Rank 8 views.

/// [2, 3, 2, 3, 2, 3, 2, 2] with its dims reversed: no two dims merge, so kernels index 8 dims.
fn rank8_reversed(d: &Device, rng: &mut StdRng) -> (Tensor, Arr) {
    let shape = [2, 3, 2, 3, 2, 3, 2, 2];
    let dims = [7, 6, 5, 4, 3, 2, 1, 0];
    let a = Arr::rand(rng, &shape, -1.0, 1.0);
    (a.upload(d).permute(&dims).unwrap(), a.permute(&dims))
}
