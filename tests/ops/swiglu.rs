//! The fused SwiGLU (Llama's, Qwen's MLP): forward against a CPU f64 reference at odd sizes
//! with poisoned outputs, from f32 and f16 x into f32 and f16 y; the gradient of x against f64
//! from f32 and f16 output gradients; values and gradients against the unfused composition
//! (narrow, sigmoid, mul); finite differences; accumulation; large gates (no inf or NaN);
//! x as a strided view; errors.

use crate::common::reference::{swiglu, swiglu_backward};
use crate::common::*;
use rand::rngs::StdRng;
use wgrad::autograd::gradcheck::{self, Input};
use wgrad::{DType, Error, Result, Tensor};

/// Half an f16 ulp relative: the rounding of an f16 store.
const F16_ROUNDING: f64 = 1.0 / 2048.0;

/// Gradients against f64: the bound the brief sets.
const GRAD_TOL: f64 = 1e-3;

/// x (rows, 2F): gates across silu's bend, ups of either sign.
fn input(rng: &mut StdRng, shape: &[usize]) -> Arr {
    Arr::rand(rng, shape, -4.0, 4.0)
}

fn round_f16(a: &Arr) -> Arr {
    a.map(|v| half::f16::from_f64(v).to_f64())
}

/// Shapes (..., 2F): F odd, a model's (1536 SmolLM2-135M's intermediate size, 8960 Qwen2's
/// half-width is too big for lavapipe's patience: 1536 stands for them); 1, 7, 130 rows.
fn shapes() -> Vec<Vec<usize>> {
    let mut v = Vec::new();
    for f in [1, 37, 576, 1536] {
        v.extend([vec![1, 2 * f], vec![7, 2 * f], vec![2, 65, 2 * f]]);
    }
    v
}

#[test]
fn forward_matches_f64_reference_in_f32_and_f16() -> Result<()> {
    let d = dev();
    let mut rng = rng("swiglu_forward");
    for shape in shapes() {
        let x = input(&mut rng, &shape);
        for x_dtype in [DType::F32, DType::F16] {
            let x_seen = if x_dtype == DType::F16 {
                round_f16(&x)
            } else {
                x.clone()
            };
            let want = swiglu(&x_seen);
            for y_dtype in [DType::F32, DType::F16] {
                let what = format!("swiglu {shape:?} x {x_dtype:?} y {y_dtype:?}");
                poison(d, x.numel());
                let xt = Tensor::from_slice_as(d, &x.f32s(), &shape, x_dtype)?;
                let y = xt.swiglu_as(y_dtype)?;
                assert_eq!(y.dtype(), y_dtype, "{what}");
                let tol = if y_dtype == DType::F16 {
                    F16_ROUNDING + TOL
                } else {
                    TOL
                };
                check(&y, &want, tol, &what);
            }
        }
    }
    Ok(())
}

/// y and dx of one backward from `seed` (stored as `seed_dtype`) through `f` on x (uploaded
/// as `x_dtype`).
fn grads(
    f: impl Fn(&Tensor) -> Result<Tensor>,
    (x, x_dtype): (&Arr, DType),
    (seed, seed_dtype): (&Arr, DType),
) -> Result<[Vec<f32>; 2]> {
    let d = dev();
    let px = Tensor::from_slice_as(d, &x.f32s(), &x.shape, x_dtype)?.requires_grad();
    let y = f(&px)?;
    y.backward_with(&Tensor::from_slice_as(
        d,
        &seed.f32s(),
        &seed.shape,
        seed_dtype,
    )?)?;
    Ok([
        y.to_vec()?,
        px.grad().expect("reached by backward").to_vec()?,
    ])
}

/// The output shape of x (..., 2F): (..., F).
fn half_shape(shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    *s.last_mut().expect("rank >= 1") /= 2;
    s
}

#[test]
fn gradient_matches_f64_reference_from_f32_and_f16_inputs_and_seeds() -> Result<()> {
    let mut rng = rng("swiglu_grads");
    for shape in shapes() {
        let x = input(&mut rng, &shape);
        let seed = Arr::rand(&mut rng, &half_shape(&shape), -1.0, 1.0);
        for (x_dtype, seed_dtype) in [
            (DType::F32, DType::F32),
            (DType::F16, DType::F32),
            (DType::F32, DType::F16),
        ] {
            let what = format!("dx {shape:?} x {x_dtype:?} dy {seed_dtype:?}");
            let rounded = |a: &Arr, t: DType| {
                if t == DType::F16 {
                    round_f16(a)
                } else {
                    a.clone()
                }
            };
            let want = swiglu_backward(&rounded(&x, x_dtype), &rounded(&seed, seed_dtype));
            let [_, dx] = grads(|x| x.swiglu(), (&x, x_dtype), (&seed, seed_dtype))?;
            assert_close(&dx, &want.data, GRAD_TOL, &what);
        }
    }
    Ok(())
}

#[test]
fn fused_matches_unfused_values_and_gradient() -> Result<()> {
    let mut rng = rng("swiglu_vs_unfused");
    for shape in [vec![1, 2], vec![7, 74], vec![3, 11, 1152], vec![130, 3072]] {
        let x = input(&mut rng, &shape);
        let seed = Arr::rand(&mut rng, &half_shape(&shape), -1.0, 1.0);
        for x_dtype in [DType::F32, DType::F16] {
            let fused = grads(|x| x.swiglu(), (&x, x_dtype), (&seed, DType::F32))?;
            let unfused = grads(|x| x.swiglu_unfused(), (&x, x_dtype), (&seed, DType::F32))?;
            for (i, name) in ["y", "dx"].iter().enumerate() {
                let want = as_f64(&unfused[i]);
                assert_close(
                    &fused[i],
                    &want,
                    TOL,
                    &format!("{name} {shape:?} x {x_dtype:?}"),
                );
            }
        }
    }
    Ok(())
}

#[test]
fn gradient_matches_finite_differences() -> Result<()> {
    let d = dev();
    let mut rng = rng("swiglu_gradcheck");
    let shape = [3, 10];
    let x = input(&mut rng, &shape);
    let w = Arr::rand(&mut rng, &half_shape(&shape), -1.0, 1.0);
    let w_gpu = w.upload(d);
    let report = gradcheck::check(
        d,
        &[Input {
            data: x.f32s(),
            shape: shape.to_vec(),
        }],
        |p| p[0].swiglu()?.mul(&w_gpu)?.sum_all(),
        |p| {
            let y = swiglu(&Arr::new(&shape, p[0].clone()));
            y.data.iter().zip(&w.data).map(|(a, b)| a * b).sum()
        },
        1e-4,
        TOL,
    )?;
    assert!(report.error < TOL, "{report:?}");
    Ok(())
}

/// Gates of +-100 (and +-30, 0): sigmoid saturates to exactly 1 and 0 with no inf or NaN in
/// y or dx; the fused op against f64.
#[test]
fn large_gates_stay_finite() -> Result<()> {
    let gates = [100.0, -100.0, 30.0, -30.0, 0.0, 88.5, -88.5];
    let f = gates.len();
    let mut data = gates.to_vec();
    data.extend((0..f).map(|j| 0.5 + j as f64 * 0.25));
    let x = Arr::new(&[1, 2 * f], data);
    let seed = Arr::new(&[1, f], (0..f).map(|j| 1.0 - j as f64 * 0.3).collect());
    for x_dtype in [DType::F32, DType::F16] {
        let [y, dx] = grads(|x| x.swiglu(), (&x, x_dtype), (&seed, DType::F32))?;
        assert_close(&y, &swiglu(&x).data, TOL, &format!("y {x_dtype:?}"));
        let want = swiglu_backward(&x, &seed);
        assert_close(&dx, &want.data, TOL, &format!("dx {x_dtype:?}"));
    }
    Ok(())
}

#[test]
fn repeated_backward_accumulates() -> Result<()> {
    let d = dev();
    let mut rng = rng("swiglu_accumulate");
    let shape = [130, 74];
    let x = input(&mut rng, &shape).upload(d).requires_grad();
    let seed = Arr::rand(&mut rng, &half_shape(&shape), -1.0, 1.0).upload(d);
    let mut passes = Vec::new();
    // Twice without zero_grad: the second backward adds into the gradient buffer.
    for _ in 0..2 {
        x.swiglu()?.backward_with(&seed)?;
        passes.push(x.grad().expect("reached by backward").to_vec()?);
    }
    let twice: Vec<f64> = passes[0].iter().map(|&v| 2.0 * v as f64).collect();
    assert_close(&passes[1], &twice, TOL, "dx accumulated");
    Ok(())
}

/// x as views of a wider parameter: rows a fixed stride apart (read in place, one forward
/// dispatch), and rows whose leading dims do not merge (made contiguous first). Values and the
/// gradient (landing in x's slice of the parameter's) against the unfused op.
#[test]
fn strided_views() -> Result<()> {
    let mut rng = rng("swiglu_views");
    type View<'a> = &'a dyn Fn(&Tensor) -> Result<Tensor>;
    let cases: [(&str, [usize; 3], View, u64); 2] = [
        (
            "rows of a wider tensor",
            [1, 9, 40],
            &|p: &Tensor| p.narrow(2, 3, 30),
            1,
        ),
        (
            "unmergeable leading dims",
            [3, 9, 40],
            &|p: &Tensor| p.narrow(1, 2, 5)?.narrow(2, 3, 30),
            2,
        ),
    ];
    for (what, shape, view, forward_dispatches) in cases {
        let packed = input(&mut rng, &shape);
        let mut results = Vec::new();
        for fused in [true, false] {
            let d = private_dev();
            let p = packed.upload(&d).requires_grad();
            let x = view(&p)?;
            let seed = Arr::rand(&mut rng.clone(), &half_shape(x.shape()), -1.0, 1.0).upload(&d);
            let c0 = d.counters();
            let y = if fused {
                x.swiglu()?
            } else {
                x.swiglu_unfused()?
            };
            if fused {
                let n = (d.counters() - c0).forward_dispatches;
                assert_eq!(n, forward_dispatches, "{what}: forward dispatches");
            }
            y.backward_with(&seed)?;
            results.push([
                y.to_vec()?,
                p.grad().expect("reached by backward").to_vec()?,
            ]);
        }
        for (i, name) in ["y", "dx"].iter().enumerate() {
            let want = as_f64(&results[1][i]);
            assert_close(&results[0][i], &want, TOL, &format!("{name} {what}"));
        }
    }
    Ok(())
}

#[test]
fn odd_last_dim_or_wrong_dtype_is_an_error() -> Result<()> {
    let d = dev();
    for shape in [vec![4, 7], vec![]] {
        assert!(matches!(
            Tensor::zeros(d, &shape)?.swiglu(),
            Err(Error::ShapeMismatch { op: "swiglu", .. })
        ));
    }
    assert!(matches!(
        Tensor::zeros(d, &[4, 8])?.swiglu_as(DType::U32),
        Err(Error::DTypeMismatch { op: "swiglu", .. })
    ));
    Ok(())
}
