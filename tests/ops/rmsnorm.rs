//! The fused RMSNorm (Llama's, Qwen's): forward against a CPU f64 reference at odd sizes with
//! poisoned outputs, from f32 and f16 x into f32 and f16 y; dx and dweight against f64 (dweight
//! summed over up to 4100 rows), from f32 and f16 output gradients; values and gradients
//! against the unfused composition of existing ops; finite differences; accumulation into
//! existing gradients; the workgroup-memory reduction path; x as a strided (B, T, H, D) view
//! of a packed qkv tensor (Qwen3's q_norm), read in place; dispatch counts; errors.

use crate::common::reference::{rms_norm, rms_norm_backward};
use crate::common::*;
use rand::rngs::StdRng;
use wgrad::autograd::gradcheck::{self, Input};
use wgrad::{DType, Device, Error, Result, Tensor};

const EPS: f32 = 1e-6;

/// Half an f16 ulp relative: the rounding of an f16 store.
const F16_ROUNDING: f64 = 1.0 / 2048.0;

/// Gradients against f64 (relative, or absolute below 1): dweight sums up to 4100 rows.
const GRAD_TOL: f64 = 1e-3;

/// x (shape) around 0 and far from it, weight (C).
fn inputs(rng: &mut StdRng, shape: &[usize]) -> (Arr, Arr) {
    let cols = *shape.last().expect("rank >= 1");
    let x = Arr::rand(rng, shape, -2.0, 3.0);
    let weight = Arr::rand(rng, &[cols], 0.5, 1.5);
    (x, weight)
}

/// `a` rounded to f16 and back: what an f16 upload of it holds.
fn round_f16(a: &Arr) -> Arr {
    a.map(|v| half::f16::from_f64(v).to_f64())
}

/// The shapes the tests sweep: C odd, a model's (576 SmolLM2, 1536 Qwen2), and past the
/// 4 x 256 columns a lane keeps in registers; 1, 7, 130 rows.
fn shapes() -> Vec<Vec<usize>> {
    let mut v = Vec::new();
    for cols in [1, 37, 576, 1030, 1536] {
        v.extend([vec![1, cols], vec![7, cols], vec![2, 65, cols]]);
    }
    v
}

#[test]
fn forward_matches_f64_reference_in_f32_and_f16() -> Result<()> {
    let d = dev();
    let mut rng = rng("rmsnorm_forward");
    for shape in shapes() {
        let (x, weight) = inputs(&mut rng, &shape);
        for x_dtype in [DType::F32, DType::F16] {
            let x_seen = if x_dtype == DType::F16 {
                round_f16(&x)
            } else {
                x.clone()
            };
            let want = rms_norm(&x_seen, &weight, EPS as f64);
            for y_dtype in [DType::F32, DType::F16] {
                let what = format!("rms_norm {shape:?} x {x_dtype:?} y {y_dtype:?}");
                poison(d, x.numel());
                let xt = Tensor::from_slice_as(d, &x.f32s(), &shape, x_dtype)?;
                let y = xt.rms_norm_as(&weight.upload(d), EPS, y_dtype)?;
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

#[test]
fn forward_without_subgroups() -> Result<()> {
    let d = tree_dev();
    let mut rng = rng("rmsnorm_tree");
    for shape in [[5, 7], [33, 1030]] {
        let (x, weight) = inputs(&mut rng, &shape);
        let want = rms_norm(&x, &weight, EPS as f64);
        poison(d, x.numel());
        let y = x.upload(d).rms_norm(&weight.upload(d), EPS)?;
        check(&y, &want, TOL, &format!("rms_norm (tree) {shape:?}"));
    }
    Ok(())
}

/// y, dx, dweight of one backward from `seed` (stored as `seed_dtype`) through `f` on x
/// (uploaded as `x_dtype`) and weight, on device `d`.
fn grads_on(
    d: &Device,
    f: impl Fn(&Tensor, &Tensor) -> Result<Tensor>,
    (x, x_dtype): (&Arr, DType),
    weight: &Arr,
    (seed, seed_dtype): (&Arr, DType),
) -> Result<[Vec<f32>; 3]> {
    let px = Tensor::from_slice_as(d, &x.f32s(), &x.shape, x_dtype)?.requires_grad();
    let pw = weight.upload(d).requires_grad();
    let y = f(&px, &pw)?;
    y.backward_with(&Tensor::from_slice_as(
        d,
        &seed.f32s(),
        &seed.shape,
        seed_dtype,
    )?)?;
    let grad = |p: &Tensor| p.grad().expect("reached by backward").to_vec();
    Ok([y.to_vec()?, grad(&px)?, grad(&pw)?])
}

#[test]
fn gradients_match_f64_reference_from_f32_and_f16_inputs_and_seeds() -> Result<()> {
    let mut rng = rng("rmsnorm_grads");
    let mut cases = shapes();
    // 4100 rows: 1024 chunks (the most) of 5 rows, summed into dweight by stage 2.
    cases.push(vec![4100, 37]);
    for shape in cases {
        let (x, weight) = inputs(&mut rng, &shape);
        let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0);
        for (x_dtype, seed_dtype) in [
            (DType::F32, DType::F32),
            (DType::F16, DType::F32),
            (DType::F32, DType::F16),
        ] {
            let what = format!("{shape:?} x {x_dtype:?} dy {seed_dtype:?}");
            let rounded = |a: &Arr, t: DType| {
                if t == DType::F16 {
                    round_f16(a)
                } else {
                    a.clone()
                }
            };
            let (x_seen, seed_seen) = (rounded(&x, x_dtype), rounded(&seed, seed_dtype));
            let [_, dx, dw] = grads_on(
                dev(),
                |x, w| x.rms_norm(w, EPS),
                (&x, x_dtype),
                &weight,
                (&seed, seed_dtype),
            )?;
            let [want_dx, want_dw] = rms_norm_backward(&x_seen, &weight, &seed_seen, EPS as f64);
            assert_close(&dx, &want_dx.data, GRAD_TOL, &format!("dx {what}"));
            // dweight: up to 4100 rows' terms, summed in chunks and then over the chunks.
            assert_close(&dw, &want_dw.data, GRAD_TOL, &format!("dweight {what}"));
        }
    }
    Ok(())
}

#[test]
fn fused_matches_unfused_values_and_gradients() -> Result<()> {
    let mut rng = rng("rmsnorm_vs_unfused");
    for shape in [vec![1, 1], vec![7, 37], vec![3, 11, 576], vec![130, 1536]] {
        let (x, weight) = inputs(&mut rng, &shape);
        let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0);
        for x_dtype in [DType::F32, DType::F16] {
            let run = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
                grads_on(dev(), f, (&x, x_dtype), &weight, (&seed, DType::F32))
            };
            let fused = run(&|x, w| x.rms_norm(w, EPS))?;
            let unfused = run(&|x, w| x.rms_norm_unfused(w, EPS))?;
            for (i, name) in ["y", "dx", "dweight"].iter().enumerate() {
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
fn backward_without_subgroups() -> Result<()> {
    let mut rng = rng("rmsnorm_tree_backward");
    let shape = [70, 1030];
    let (x, weight) = inputs(&mut rng, &shape);
    let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0);
    let [_, dx, dw] = grads_on(
        tree_dev(),
        |x, w| x.rms_norm(w, EPS),
        (&x, DType::F32),
        &weight,
        (&seed, DType::F32),
    )?;
    let [want_dx, want_dw] = rms_norm_backward(&x, &weight, &seed, EPS as f64);
    assert_close(&dx, &want_dx.data, TOL, "dx (tree)");
    assert_close(&dw, &want_dw.data, TOL, "dweight (tree)");
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let d = dev();
    let mut rng = rng("rmsnorm_gradcheck");
    let (rows, cols) = (3, 5);
    let (x, weight) = inputs(&mut rng, &[rows, cols]);
    let w = Arr::rand(&mut rng, &[rows, cols], -1.0, 1.0);
    let w_gpu = w.upload(d);
    let input = |a: &Arr| Input {
        data: a.f32s(),
        shape: a.shape.clone(),
    };
    let report = gradcheck::check(
        d,
        &[input(&x), input(&weight)],
        |p| p[0].rms_norm(&p[1], EPS)?.mul(&w_gpu)?.sum_all(),
        |p| {
            let x = Arr::new(&[rows, cols], p[0].clone());
            let weight = Arr::new(&[cols], p[1].clone());
            let y = rms_norm(&x, &weight, EPS as f64);
            y.data.iter().zip(&w.data).map(|(a, b)| a * b).sum()
        },
        1e-5,
        TOL,
    )?;
    assert!(report.error < TOL, "{report:?}");
    Ok(())
}

#[test]
fn repeated_backward_accumulates_into_dx_and_dweight() -> Result<()> {
    let d = dev();
    let mut rng = rng("rmsnorm_accumulate");
    let shape = [130, 37];
    let (x, weight) = inputs(&mut rng, &shape);
    let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0).upload(d);
    let (px, pw) = (
        x.upload(d).requires_grad(),
        weight.upload(d).requires_grad(),
    );
    let mut passes = Vec::new();
    // Twice without zero_grad: the second backward adds into both gradient buffers (the
    // kernels' accumulate variants, and stage 2's add mode).
    for _ in 0..2 {
        px.rms_norm(&pw, EPS)?.backward_with(&seed)?;
        let g = |p: &Tensor| p.grad().expect("reached by backward").to_vec();
        passes.push([g(&px)?, g(&pw)?]);
    }
    for (i, name) in ["dx", "dweight"].iter().enumerate() {
        let twice: Vec<f64> = passes[0][i].iter().map(|&v| 2.0 * v as f64).collect();
        assert_close(&passes[1][i], &twice, TOL, &format!("{name} accumulated"));
    }
    Ok(())
}

/// q of a packed (B, T, 3, H, D) qkv tensor as a (B, T, H, D) view (the narrow Qwen3's
/// q_norm reads): rows of D with unit stride, leading dims (B T, H) after merging, or three
/// unmergeable ones where T is narrowed too; and a rank-5 view whose four leading dims do not
/// merge into three (made contiguous first). Values and both gradients against the unfused
/// op on the same view, the gradient landing in q's slice of qkv's and nowhere else.
#[test]
fn strided_head_views_are_normalized_in_place() -> Result<()> {
    let mut rng = rng("rmsnorm_views");
    let (b, t, h, dh) = (2, 5, 3, 37);
    type View<'a> = &'a dyn Fn(&Tensor) -> Result<Tensor>;
    let cases: [(&str, [usize; 5], View, u64); 3] = [
        (
            "(B, T, H, D) of qkv",
            [b, t, 3, h, dh],
            &|p: &Tensor| p.narrow(2, 0, 1)?.squeeze(2),
            1,
        ),
        (
            "T narrowed too",
            [b, t + 2, 3, h, dh],
            &|p: &Tensor| p.narrow(1, 1, t)?.narrow(2, 1, 1)?.squeeze(2),
            1,
        ),
        // (B, T, 3, H, D) narrowed on B, T, the 3 and H: four leading dims that do not merge.
        (
            "rank 5",
            [b + 1, t + 1, 3, h + 1, dh],
            &|p: &Tensor| {
                p.narrow(0, 1, b)?
                    .narrow(1, 0, t)?
                    .narrow(2, 0, 2)?
                    .narrow(3, 1, h)
            },
            2,
        ),
    ];
    for (what, packed_shape, view, forward_dispatches) in cases {
        let packed = Arr::rand(&mut rng, &packed_shape, -2.0, 2.0);
        let weight = Arr::rand(&mut rng, &[dh], 0.5, 1.5);
        let mut results = Vec::new();
        for fused in [true, false] {
            let d = private_dev();
            let pq = packed.upload(&d).requires_grad();
            let pw = weight.upload(&d).requires_grad();
            let x = view(&pq)?;
            let seed = Arr::rand(&mut rng.clone(), x.shape(), -1.0, 1.0).upload(&d);
            let c0 = d.counters();
            let y = if fused {
                x.rms_norm(&pw, EPS)?
            } else {
                x.rms_norm_unfused(&pw, EPS)?
            };
            if fused {
                let n = (d.counters() - c0).forward_dispatches;
                assert_eq!(n, forward_dispatches, "{what}: forward dispatches");
            }
            y.backward_with(&seed)?;
            let g = |p: &Tensor| p.grad().expect("reached by backward").to_vec();
            results.push([y.to_vec()?, g(&pq)?, g(&pw)?]);
        }
        for (i, name) in ["y", "d(qkv)", "dweight"].iter().enumerate() {
            let want = as_f64(&results[1][i]);
            assert_close(&results[0][i], &want, TOL, &format!("{name} {what}"));
        }
    }
    Ok(())
}

#[test]
fn dispatch_counts() -> Result<()> {
    let mut rng = rng("rmsnorm_dispatches");
    let shape = [33, 576];
    let (x, weight) = inputs(&mut rng, &shape);
    let d = private_dev();
    let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0).upload(&d);
    // (x, weight wanting a gradient) -> backward dispatches: dx alone is one; dweight takes
    // the partials (with dx where wanted) and their sum in a second dispatch.
    for (want, backward) in [([true, true], 2), ([true, false], 1), ([false, true], 2)] {
        let t = |a: &Arr, w: bool| {
            if w {
                a.upload(&d).requires_grad()
            } else {
                a.upload(&d)
            }
        };
        let (px, pw) = (t(&x, want[0]), t(&weight, want[1]));
        let c0 = d.counters();
        let y = px.rms_norm_as(&pw, EPS, DType::F16)?;
        let c1 = d.counters();
        y.backward_with(&seed)?;
        let c2 = d.counters();
        let counts = ((c1 - c0).forward_dispatches, (c2 - c1).backward_dispatches);
        assert_eq!(counts, (1, backward), "{want:?}");
    }
    Ok(())
}

#[test]
fn wrong_weight_shape_dtype_or_eps_is_an_error() -> Result<()> {
    let d = dev();
    let x = Tensor::zeros(d, &[4, 7])?;
    for bad in [
        Tensor::ones(d, &[6])?,
        Tensor::ones(d, &[1, 7])?,
        Tensor::ones(d, &[])?,
    ] {
        match x.rms_norm(&bad, EPS) {
            Err(Error::ShapeMismatch { op, expected, got }) => {
                assert_eq!(op, "rms_norm");
                assert!(expected.contains("[7]"), "{expected}");
                assert_eq!(got, bad.shape());
            }
            other => panic!("expected a ShapeMismatch, got {other:?}"),
        }
    }
    let good = Tensor::ones(d, &[7])?;
    assert!(matches!(
        Tensor::zeros(d, &[])?.rms_norm(&good, EPS),
        Err(Error::ShapeMismatch { op: "rms_norm", .. })
    ));
    assert!(matches!(
        x.rms_norm(&good, f32::NAN),
        Err(Error::InvalidArgument { op: "rms_norm", .. })
    ));
    assert!(matches!(
        x.rms_norm_as(&good, EPS, DType::U32),
        Err(Error::DTypeMismatch { op: "rms_norm", .. })
    ));
    Ok(())
}
