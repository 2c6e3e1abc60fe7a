//! linear (matmul with bias and GELU epilogues) against its unfused composition and finite
//! differences; dispatch counts of the fused path; under autocast, its f16 input copy and the
//! GELU linear's f16 pre-activation and gradients against f64. Products split into ranges of K:
//! `linear_split`.

use crate::common::reference::{gelu, gelu_grad, linear};
use crate::common::{assert_close, dev, poison, private_dev, rand_vec, rng, Arr};
use wgrad::autograd::gradcheck::{check, Input};
use wgrad::ops::Activation;
use wgrad::{Result, Tensor};

/// Whether to run in f32 only, or under autocast too (where the adapter has shader-f16).
pub(crate) fn halves(d: &wgrad::Device) -> &'static [bool] {
    if d.gpu().has(wgrad::wgpu::Features::SHADER_F16) {
        &[false, true]
    } else {
        &[false]
    }
}

/// `v` as f64, rounded to f16 first under autocast (as the products' operands are).
pub(crate) fn round(v: &[f32], half: bool) -> Vec<f64> {
    v.iter()
        .map(|&x| match half {
            true => half::f16::from_f32(x).to_f32() as f64,
            false => x as f64,
        })
        .collect()
}

pub(crate) fn grads(params: &[Tensor]) -> Result<Vec<Vec<f32>>> {
    params
        .iter()
        .map(|p| p.grad().expect("reached").to_vec())
        .collect()
}

/// Fused and unfused forward values and gradients of x, W, b, with g a random seed.
fn compare(rows: usize, k: usize, n: usize, act: Activation, lead: &[usize]) -> Result<()> {
    let d = dev();
    let mut r = rng(&format!("linear {rows} {k} {n} {act:?}"));
    let mut x_shape = lead.to_vec();
    x_shape.extend([rows, k]);
    let numel_x: usize = x_shape.iter().product();
    let xs = rand_vec(&mut r, numel_x, -1.0, 1.0);
    let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
    let bs = rand_vec(&mut r, n, -0.5, 0.5);
    let mut y_shape = x_shape.clone();
    *y_shape.last_mut().unwrap() = n;
    let seed = rand_vec(&mut r, numel_x / k * n, -1.0, 1.0);
    let mut results = Vec::new();
    for fused in [true, false] {
        let x = Tensor::from_slice(d, &xs, &x_shape)?.requires_grad();
        let w = Tensor::from_slice(d, &ws, &[k, n])?.requires_grad();
        let b = Tensor::from_slice(d, &bs, &[n])?.requires_grad();
        poison(d, numel_x / k * n);
        let y = if fused {
            x.linear(&w, Some(&b), act)?
        } else {
            x.linear_reference(&w, Some(&b), act)?
        };
        assert_eq!(y.shape(), y_shape.as_slice());
        y.backward_with(&Tensor::from_slice(d, &seed, &y_shape)?)?;
        let mut v = vec![y.to_vec()?];
        v.extend(grads(&[x, w, b])?);
        results.push(v);
    }
    for (i, what) in ["y", "dx", "dW", "db"].iter().enumerate() {
        let want: Vec<f64> = results[1][i].iter().map(|&v| v as f64).collect();
        assert_close(
            &results[0][i],
            &want,
            1e-4,
            &format!("{what} ({rows}x{k}x{n} {act:?})"),
        );
    }
    Ok(())
}

/// The `absmax` dispatch an f32 product (not `half`) runs before it where the Device puts f32
/// products on cooperative matrices (X3): 1, else 0.
pub(crate) fn absmax_dispatches(d: &wgrad::Device, half: bool) -> u64 {
    (!half && d.f32_on_tensor_cores()) as u64
}

#[test]
fn fused_linear_matches_the_unfused_composition() -> Result<()> {
    for (rows, k, n) in [(1, 1, 1), (7, 5, 3), (33, 64, 130), (65, 17, 257)] {
        compare(rows, k, n, Activation::None, &[])?;
        compare(rows, k, n, Activation::Gelu, &[])?;
    }
    compare(9, 12, 20, Activation::Gelu, &[2, 3])
}

#[test]
fn linear_gradients_match_finite_differences() -> Result<()> {
    let mut r = rng("linear gradcheck");
    let (rows, k, n) = (4, 3, 5);
    let w_out = rand_vec(&mut r, rows * n, -1.0, 1.0);
    let inputs = [
        Input {
            data: rand_vec(&mut r, rows * k, -1.0, 1.0),
            shape: vec![rows, k],
        },
        Input {
            data: rand_vec(&mut r, k * n, -1.0, 1.0),
            shape: vec![k, n],
        },
        Input {
            data: rand_vec(&mut r, n, -1.0, 1.0),
            shape: vec![n],
        },
    ];
    let gpu = |p: &[Tensor]| -> Result<Tensor> {
        let weights = Tensor::from_slice(dev(), &w_out, &[rows, n])?;
        p[0].linear(&p[1], Some(&p[2]), Activation::Gelu)?
            .mul(&weights)?
            .sum_all()
    };
    let cpu = |v: &[Vec<f64>]| -> f64 {
        let (x, w, b) = (
            Arr::new(&[rows, k], v[0].clone()),
            Arr::new(&[k, n], v[1].clone()),
            Arr::new(&[n], v[2].clone()),
        );
        linear(&x, &w, Some(&b))
            .map(gelu)
            .zip(&Arr::from_f32(&[rows, n], &w_out), |y, w| y * w)
            .sum_all()
    };
    check(dev(), &inputs, gpu, cpu, 1e-3, 1e-3)?;
    Ok(())
}

#[test]
fn fused_linear_is_one_forward_dispatch() -> Result<()> {
    let d = private_dev();
    let x = Tensor::rand_uniform(&d, &[16, 8], -1.0, 1.0, 1)?.requires_grad();
    let w = Tensor::rand_uniform(&d, &[8, 12], -1.0, 1.0, 2)?.requires_grad();
    let b = Tensor::zeros(&d, &[12])?.requires_grad();
    d.sync()?;
    let c0 = d.counters();
    let y = x.linear(&w, Some(&b), Activation::Gelu)?;
    // (An X3 product, f32 on cooperative matrices, reads its operands' magnitudes from an
    // `absmax` dispatch before it.)
    assert_eq!(
        (d.counters() - c0).forward_dispatches,
        1 + absmax_dispatches(&d, false),
        "bias and GELU run inside the matmul"
    );
    let c1 = d.counters();
    y.backward_with(&Tensor::ones(&d, &[16, 12])?)?;
    // gelu' (1), dW with db in its product (1), dx (1); the seed is a fill counted in forward.
    assert_eq!(
        (d.counters() - c1).backward_dispatches,
        3 + 2 * absmax_dispatches(&d, false)
    );
    Ok(())
}

#[test]
fn linear_shape_errors_are_clear() -> Result<()> {
    let d = dev();
    let x = Tensor::zeros(d, &[4, 3])?;
    let w = Tensor::zeros(d, &[5, 2])?;
    let err = x
        .linear(&w, None, Activation::None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("linear") && err.contains("[5, 2]"), "{err}");
    let w = Tensor::zeros(d, &[3, 2])?;
    let b = Tensor::zeros(d, &[3])?;
    let err = x
        .linear(&w, Some(&b), Activation::None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bias") && err.contains("[2]"), "{err}");
    Ok(())
}

/// Under autocast a linear whose output has 3 K columns or more rounds its f32 input to f16
/// once, before the product, and keeps that copy for dW; the product would round it the same
/// way as it loads it. So the output and the gradients are those of the autocast matmul,
/// which reads the f32 input (to the last bits but for the order of the sums).
#[test]
fn a_wide_linear_casting_its_input_first_changes_no_number() -> Result<()> {
    use wgrad::ops::autocast;
    let d = &private_dev();
    let mut r = rng("wide linear cast");
    for (rows, k, n) in [(70, 24, 80), (33, 16, 48), (5, 40, 257)] {
        let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
        let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
        let seed = rand_vec(&mut r, rows * n, -1.0, 1.0);
        let mut results = Vec::new();
        let mut forward = Vec::new();
        for linear in [true, false] {
            let x = Tensor::from_slice(d, &xs, &[rows, k])?.requires_grad();
            let w = Tensor::from_slice(d, &ws, &[k, n])?.requires_grad();
            d.sync()?;
            let before = d.counters().dispatches;
            let y = autocast(true, || {
                if linear {
                    x.linear(&w, None, Activation::None)
                } else {
                    x.matmul(&w)
                }
            })?;
            d.sync()?;
            forward.push(d.counters().dispatches - before);
            y.backward_with(&Tensor::from_slice(d, &seed, &[rows, n])?)?;
            let mut v = vec![y.to_vec()?];
            v.extend(grads(&[x, w])?);
            results.push(v);
        }
        // The linear's forward is the cast and the product; the matmul's, the product.
        assert_eq!(
            forward,
            [2, 1],
            "forward dispatches, linear then matmul ({rows}x{k}x{n})"
        );
        for (i, what) in ["y", "dx", "dW"].iter().enumerate() {
            let want: Vec<f64> = results[1][i].iter().map(|&v| v as f64).collect();
            assert_close(
                &results[0][i],
                &want,
                1e-6,
                &format!("{what} ({rows}x{k}x{n}), cast first against rounded on load"),
            );
        }
    }
    Ok(())
}

/// Under autocast a GELU linear's pre-activation z and dz = g gelu'(z) are stored f16: its
/// products round dz to f16
/// as they load it (so dx and dW are those of the rounded dz, as before), and the bias gradient
/// sums its f16 values in f32. Against f64 at shapes whose db comes from the dW product (up to
/// 1,024 rows) or from a reduction (more); in f32 dz stays f32. Then a seed whose dz is not an
/// f16 value (z = 0: dz = g / 2 = 0.5 + 3 2^-14, which f16 rounds to 0.5) over 1,100 rows: db
/// is 550, not the unrounded 550.2. (Fails with `WGRAD_GELU_HALF=none`, z f32.)
#[test]
fn an_autocast_gelu_linear_stores_dz_in_f16() -> Result<()> {
    use wgrad::ops::autocast;
    let d = dev();
    let mut r = rng("gelu linear dz f16");
    let halves = halves(d);
    for (rows, k, n) in [(300, 24, 40), (1100, 16, 36), (65, 13, 20)] {
        let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
        let ws = rand_vec(&mut r, k * n, -0.5, 0.5);
        let bs = rand_vec(&mut r, n, -0.5, 0.5);
        let gs = rand_vec(&mut r, rows * n, -1.0, 1.0);
        for &half in halves {
            let x64 = Arr::new(&[rows, k], round(&xs, half));
            let w64 = Arr::new(&[k, n], round(&ws, half));
            // Under autocast z is stored f16 for the backward, and so is dz.
            let stored = |v: f64| round(&[v as f32], half)[0];
            let z = linear(&x64, &w64, Some(&Arr::from_f32(&[n], &bs))).map(stored);
            let dz = Arr::from_f32(&[rows, n], &gs)
                .zip(&z, |g, z| g * gelu_grad(z))
                .map(stored);
            let want_dx = dz.matmul(&w64.t()).data;
            let want_dw = x64.t().matmul(&dz).data;
            let want_db = dz.sum(0, false).data;
            let x = Tensor::from_slice(d, &xs, &[rows, k])?.requires_grad();
            let w = Tensor::from_slice(d, &ws, &[k, n])?.requires_grad();
            let b = Tensor::from_slice(d, &bs, &[n])?.requires_grad();
            let y = autocast(half, || x.linear(&w, Some(&b), Activation::Gelu))?;
            y.backward_with(&Tensor::from_slice(d, &gs, &[rows, n])?)?;
            let got = grads(&[x, w, b])?;
            let what = format!("{rows}x{k}x{n}{}", if half { ", autocast" } else { "" });
            let tol = if half { 2e-3 } else { 1e-4 };
            assert_close(&got[0], &want_dx, tol, &format!("dx, {what}"));
            assert_close(&got[1], &want_dw, tol, &format!("dW, {what}"));
            assert_close(&got[2], &want_db, tol, &format!("db, {what}"));
        }
    }
    if halves.contains(&true) {
        let (rows, k, n) = (1100, 8, 16);
        let x = Tensor::zeros(d, &[rows, k])?;
        let w = Tensor::from_slice(d, &rand_vec(&mut r, k * n, -0.5, 0.5), &[k, n])?;
        let b = Tensor::zeros(d, &[n])?.requires_grad();
        let g = 1.0 + 3.0 * 2f32.powi(-13);
        let y = autocast(true, || x.linear(&w, Some(&b), Activation::Gelu))?;
        y.backward_with(&Tensor::full(d, &[rows, n], g)?)?;
        let want = vec![0.5 * rows as f64; n];
        assert_close(
            &b.grad().expect("reached").to_vec()?,
            &want,
            1e-6,
            "db of f16 dz",
        );
    }
    Ok(())
}

/// An MLP under autocast, h = gelu(x W1 + b1) stored f16 (as GPT-2's is) and y = h W2 + b2:
/// GELU's pre-activation z is stored f16, and so is h's gradient dh = g W2^T (the second
/// linear's dX, made new through a view of h: x has a leading dim), which GELU's gradient reads
/// as f32. dx, dW1, db1, dW2 and db2 against f64 with z, h, dh and dz rounded to f16 where they
/// are stored, at rows whose db1 comes from the dW product and from a reduction. Fails with
/// `WGRAD_GELU_HALF=none` (z and dh f32: dW1 off by up to 4.5e-3 on lavapipe).
#[test]
fn an_autocast_mlp_stores_z_and_the_gelu_outputs_gradient_in_f16() -> Result<()> {
    use wgrad::ops::autocast;
    let d = dev();
    if !halves(d).contains(&true) {
        return Err(wgrad::Error::InvalidArgument {
            op: "test",
            reason: "the adapter has no shader-f16 (lavapipe has it)".into(),
        });
    }
    let mut r = rng("autocast mlp f16 z and dh");
    // n, the second dW's rows, a multiple of 8: its bias gradient then comes from the product
    // (the sums of the f16-rounded seed) on either kernel.
    for (rows, k, n, m) in [(300, 24, 40, 12), (1100, 16, 40, 20)] {
        let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
        let w1s = rand_vec(&mut r, k * n, -0.5, 0.5);
        let b1s = rand_vec(&mut r, n, -0.5, 0.5);
        let w2s = rand_vec(&mut r, n * m, -0.5, 0.5);
        let b2s = rand_vec(&mut r, m, -0.5, 0.5);
        let gs = rand_vec(&mut r, rows * m, -1.0, 1.0);
        let f16 = |v: f64| round(&[v as f32], true)[0];
        let x64 = Arr::new(&[rows, k], round(&xs, true));
        let w164 = Arr::new(&[k, n], round(&w1s, true));
        let w264 = Arr::new(&[n, m], round(&w2s, true));
        let g64 = Arr::new(&[rows, m], round(&gs, true));
        // Forward: z (f16 where stored), h = f16(gelu(z)) from the unrounded z.
        let v = linear(&x64, &w164, Some(&Arr::from_f32(&[n], &b1s)));
        let (z, h) = (v.map(f16), v.map(|v| f16(gelu(v))));
        let (dw2, db2) = (h.t().matmul(&g64).data, g64.sum(0, false).data);
        let dh = g64.matmul(&w264.t()).map(f16);
        let dz = dh.zip(&z, |dh, z| f16(dh * gelu_grad(z)));
        let (dx, dw1, db1) = (
            dz.matmul(&w164.t()).data,
            x64.t().matmul(&dz).data,
            dz.sum(0, false).data,
        );
        let x = Tensor::from_slice(d, &xs, &[2, rows / 2, k])?.requires_grad();
        let w1 = Tensor::from_slice(d, &w1s, &[k, n])?.requires_grad();
        let b1 = Tensor::from_slice(d, &b1s, &[n])?.requires_grad();
        let w2 = Tensor::from_slice(d, &w2s, &[n, m])?.requires_grad();
        let b2 = Tensor::from_slice(d, &b2s, &[m])?.requires_grad();
        let y = autocast(true, || -> Result<Tensor> {
            let h = x.linear_as(&w1, Some(&b1), Activation::Gelu, wgrad::DType::F16)?;
            h.linear(&w2, Some(&b2), Activation::None)
        })?;
        y.backward_with(&Tensor::from_slice(d, &gs, &[2, rows / 2, m])?)?;
        let got = grads(&[x, w1, b1, w2, b2])?;
        let what = format!("{rows}x{k}x{n}x{m}");
        for (i, (want, name)) in [
            (dx, "dx"),
            (dw1, "dW1"),
            (db1, "db1"),
            (dw2, "dW2"),
            (db2, "db2"),
        ]
        .iter()
        .enumerate()
        {
            assert_close(&got[i], want, 2e-3, &format!("{name}, {what}"));
        }
    }
    Ok(())
}

/// A GELU linear's output read by two linears under autocast: its gradient gets two
/// contributions, so it stays f32 (`BackwardCtx::sole_contribution`); z is still f16. dx, dW1
/// and db1 against f64 with dh = g W2^T + g W3^T unrounded and z, dz rounded to f16.
#[test]
fn an_autocast_gelu_output_read_twice_keeps_its_gradient_f32() -> Result<()> {
    use wgrad::ops::autocast;
    let d = dev();
    if !halves(d).contains(&true) {
        return Err(wgrad::Error::InvalidArgument {
            op: "test",
            reason: "the adapter has no shader-f16 (lavapipe has it)".into(),
        });
    }
    let mut r = rng("autocast gelu output read twice");
    let (rows, k, n, m) = (300, 24, 40, 12);
    let xs = rand_vec(&mut r, rows * k, -1.0, 1.0);
    let w1s = rand_vec(&mut r, k * n, -0.5, 0.5);
    let b1s = rand_vec(&mut r, n, -0.5, 0.5);
    let w2s = rand_vec(&mut r, n * m, -0.5, 0.5);
    let w3s = rand_vec(&mut r, n * m, -0.5, 0.5);
    let bs = rand_vec(&mut r, m, -0.5, 0.5);
    let gs = rand_vec(&mut r, rows * m, -1.0, 1.0);
    let f16 = |v: f64| round(&[v as f32], true)[0];
    let x64 = Arr::new(&[rows, k], round(&xs, true));
    let w164 = Arr::new(&[k, n], round(&w1s, true));
    let w264 = Arr::new(&[n, m], round(&w2s, true));
    let w364 = Arr::new(&[n, m], round(&w3s, true));
    let g64 = Arr::new(&[rows, m], round(&gs, true));
    let z = linear(&x64, &w164, Some(&Arr::from_f32(&[n], &b1s)));
    let dh = g64.matmul(&w264.zip(&w364, |p, q| p + q).t());
    let dz = dh.zip(&z, |dh, z| f16(dh * gelu_grad(f16(z))));
    let (dx, dw1, db1) = (
        dz.matmul(&w164.t()).data,
        x64.t().matmul(&dz).data,
        dz.sum(0, false).data,
    );
    let x = Tensor::from_slice(d, &xs, &[rows, k])?.requires_grad();
    let w1 = Tensor::from_slice(d, &w1s, &[k, n])?.requires_grad();
    let b1 = Tensor::from_slice(d, &b1s, &[n])?.requires_grad();
    let w2 = Tensor::from_slice(d, &w2s, &[n, m])?;
    let w3 = Tensor::from_slice(d, &w3s, &[n, m])?;
    let b = Tensor::from_slice(d, &bs, &[m])?;
    let y = autocast(true, || -> Result<Tensor> {
        let h = x.linear_as(&w1, Some(&b1), Activation::Gelu, wgrad::DType::F16)?;
        h.linear(&w2, Some(&b), Activation::None)?.add(&h.linear(
            &w3,
            Some(&b),
            Activation::None,
        )?)
    })?;
    y.backward_with(&Tensor::from_slice(d, &gs, &[rows, m])?)?;
    let got = grads(&[x, w1, b1])?;
    for (i, (want, name)) in [(dx, "dx"), (dw1, "dW1"), (db1, "db1")].iter().enumerate() {
        assert_close(&got[i], want, 2e-3, name);
    }
    Ok(())
}
