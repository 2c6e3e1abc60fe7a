//! The fused cross-entropy: loss and dlogits against a CPU f64 reference at odd sizes and at
//! GPT-2's V = 50257, with poisoned outputs; logits far from 0 and a maximum found late in the
//! row (the online rescaling); values and gradients against the unfused composition;
//! finite differences; ignore_index; errors; gradient accumulation and an upstream gradient
//! other than 1; and its dispatch counts.

use crate::common::reference::cross_entropy;
use crate::common::*;
use rand::rngs::StdRng;
use rand::Rng;
use wgrad::autograd::gradcheck::{self, Input};
use wgrad::ops::{autocast, Activation};
use wgrad::{DType, Device, Error, Result, Tensor};

fn rand_targets(rng: &mut StdRng, n: usize, v: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..v as u32)).collect()
}

/// dlogits compared after scaling by V * n_valid, where the softmax terms are of order 1
/// (unscaled they are ~1/V, and any absolute tolerance would pass them).
#[track_caller]
fn check_grad(got: &[f32], want: &[f64], v: usize, n_valid: usize, what: &str) {
    let s = (v * n_valid.max(1)) as f64;
    let got: Vec<f32> = got.iter().map(|&g| (g as f64 * s) as f32).collect();
    let want: Vec<f64> = want.iter().map(|w| w * s).collect();
    assert_close(&got, &want, TOL, what);
}

/// Loss and dlogits of the fused op on the shared device (outputs poisoned first).
fn run(x: &Arr, targets: &[u32], ignore: Option<u32>) -> Result<(f32, Vec<f32>)> {
    run_on(dev(), x, targets, ignore)
}

fn run_on(d: &Device, x: &Arr, targets: &[u32], ignore: Option<u32>) -> Result<(f32, Vec<f32>)> {
    let v = *x.shape.last().expect("rank >= 1");
    let lead = &x.shape[..x.rank() - 1];
    let logits = x.upload(d).requires_grad();
    let t = Tensor::from_u32(d, targets, lead)?;
    poison(d, targets.len()); // the per-row losses and lse
    poison(d, 1);
    let loss = logits.cross_entropy(&t, ignore)?;
    poison(d, x.numel()); // dlogits
    loss.backward()?;
    let grad = logits.grad().expect("reached by backward").to_vec()?;
    assert_eq!(loss.shape(), &[] as &[usize]);
    assert_eq!(grad.len(), targets.len() * v);
    Ok((loss.item()?, grad))
}

#[test]
fn matches_f64_reference_at_odd_sizes() -> Result<()> {
    let mut rng = rng("ce_forward");
    for v in [1, 7, 255, 768, 1000] {
        for shape in [vec![1, v], vec![5, v], vec![3, 11, v]] {
            let x = Arr::rand(&mut rng, &shape, -4.0, 4.0);
            let n = x.numel() / v;
            let targets = rand_targets(&mut rng, n, v);
            let (want_loss, want_grad) = cross_entropy(&x, &targets, None);
            let (loss, grad) = run(&x, &targets, None)?;
            assert_close(&[loss], &[want_loss], TOL, &format!("loss {shape:?}"));
            check_grad(&grad, &want_grad.data, v, n, &format!("dlogits {shape:?}"));
        }
    }
    Ok(())
}

#[test]
fn without_subgroups() -> Result<()> {
    let mut rng = rng("ce_tree");
    for (n, v) in [(5, 7), (4, 1000)] {
        let x = Arr::rand(&mut rng, &[n, v], -4.0, 4.0);
        let targets = rand_targets(&mut rng, n, v);
        let (want_loss, want_grad) = cross_entropy(&x, &targets, None);
        let (loss, grad) = run_on(tree_dev(), &x, &targets, None)?;
        assert_close(
            &[loss],
            &[want_loss],
            TOL,
            &format!("loss (tree) ({n}, {v})"),
        );
        check_grad(
            &grad,
            &want_grad.data,
            v,
            n,
            &format!("dlogits (tree) ({n}, {v})"),
        );
    }
    Ok(())
}

#[test]
fn gpt2_vocabulary_50257() -> Result<()> {
    let mut rng = rng("ce_50257");
    let v = 50257;
    let x = Arr::rand(&mut rng, &[3, v], -8.0, 8.0);
    let targets = vec![0, 50256, 31337];
    let (want_loss, want_grad) = cross_entropy(&x, &targets, None);
    let (loss, grad) = run(&x, &targets, None)?;
    assert_close(&[loss], &[want_loss], TOL, "loss V=50257");
    check_grad(&grad, &want_grad.data, v, 3, "dlogits V=50257");
    Ok(())
}

#[test]
fn large_logits_and_a_late_maximum() -> Result<()> {
    let mut rng = rng("ce_stability");
    let v = 1000;
    let mut rows = vec![
        Arr::rand(&mut rng, &[v], -100.0, 100.0).data,
        vec![42.0; v], // all equal: the sum is exactly V terms of 1
    ];
    // Ascending: every lane's running max grows at each step (rescaling each time).
    let mut ascending = Arr::rand(&mut rng, &[v], -80.0, 80.0).data;
    ascending.sort_by(f64::total_cmp);
    rows.push(ascending);
    let x = Arr::new(&[3, v], rows.concat());
    let targets = vec![17, 500, 999];
    let (want_loss, want_grad) = cross_entropy(&x, &targets, None);
    let (loss, grad) = run(&x, &targets, None)?;
    assert_close(&[loss], &[want_loss], TOL, "loss, large logits");
    check_grad(&grad, &want_grad.data, v, 3, "dlogits, large logits");
    Ok(())
}

#[test]
fn fused_matches_unfused_values_and_gradients() -> Result<()> {
    let d = dev();
    let mut rng = rng("ce_vs_unfused");
    let ignore = Some(3);
    for shape in [vec![5, 7], vec![33, 1000], vec![3, 11, 255]] {
        let v = *shape.last().expect("rank >= 1");
        let x = Arr::rand(&mut rng, &shape, -4.0, 4.0);
        let mut targets = rand_targets(&mut rng, x.numel() / v, v);
        targets[0] = 3; // at least one ignored row
        let n_valid = targets.iter().filter(|&&t| Some(t) != ignore).count();
        let mut results = Vec::new();
        for fused in [true, false] {
            let logits = x.upload(d).requires_grad();
            let t = Tensor::from_u32(d, &targets, &shape[..shape.len() - 1])?;
            let loss = if fused {
                logits.cross_entropy(&t, ignore)?
            } else {
                logits.cross_entropy_unfused(&t, ignore)?
            };
            loss.backward()?;
            let grad = logits.grad().expect("reached by backward").to_vec()?;
            results.push((loss.item()?, grad));
        }
        let (fused, unfused) = (&results[0], &results[1]);
        assert_close(
            &[fused.0],
            &[unfused.0 as f64],
            TOL,
            &format!("loss {shape:?}"),
        );
        let want: Vec<f64> = unfused.1.iter().map(|&g| g as f64).collect();
        check_grad(&fused.1, &want, v, n_valid, &format!("dlogits {shape:?}"));
    }
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let d = dev();
    let mut rng = rng("ce_gradcheck");
    let (n, v) = (4, 7);
    let x = Arr::rand(&mut rng, &[n, v], -2.0, 2.0);
    let targets = vec![3, 0, 5, 6];
    let ignore = Some(5); // row 2 is ignored
    let t = Tensor::from_u32(d, &targets, &[n])?;
    let report = gradcheck::check(
        d,
        &[Input {
            data: x.f32s(),
            shape: x.shape.clone(),
        }],
        |p| p[0].cross_entropy(&t, ignore),
        |p| cross_entropy(&Arr::new(&[n, v], p[0].clone()), &targets, ignore).0,
        1e-5,
        TOL,
    )?;
    assert!(report.error < TOL, "{report:?}");
    Ok(())
}

#[test]
fn ignored_rows_count_for_nothing() -> Result<()> {
    let mut rng = rng("ce_ignore");
    let (n, v) = (6, 9);
    let x = Arr::rand(&mut rng, &[n, v], -3.0, 3.0);
    // An ignore_index inside [0, V) and one past it (that value would otherwise be an error).
    for (ignore, targets) in [
        (Some(2), vec![2, 0, 8, 2, 5, 1]),
        (Some(1000), vec![1000, 4, 1000, 7, 0, 3]),
    ] {
        let (want_loss, want_grad) = cross_entropy(&x, &targets, ignore);
        let (loss, grad) = run(&x, &targets, ignore)?;
        let n_valid = targets.iter().filter(|&&t| Some(t) != ignore).count();
        assert_close(&[loss], &[want_loss], TOL, "loss with ignored rows");
        check_grad(
            &grad,
            &want_grad.data,
            v,
            n_valid,
            "dlogits with ignored rows",
        );
        for (r, &t) in targets.iter().enumerate() {
            if Some(t) == ignore {
                assert!(
                    grad[r * v..(r + 1) * v].iter().all(|&g| g == 0.0),
                    "row {r}"
                );
            }
        }
    }
    // Every row ignored: NaN (0 / 0, as PyTorch), and no gradient anywhere.
    let (loss, grad) = run(&x, &[7; 6], Some(7))?;
    assert!(loss.is_nan(), "loss {loss}");
    assert!(grad.iter().all(|&g| g == 0.0));
    Ok(())
}

#[test]
fn bad_targets_are_errors() -> Result<()> {
    let d = dev();
    let logits = Tensor::zeros(d, &[4, 9])?;
    let out_of_range = Tensor::from_u32(d, &[0, 8, 9, 1], &[4])?;
    match logits.cross_entropy(&out_of_range, None) {
        Err(Error::InvalidArgument { op, reason }) => {
            assert_eq!(op, "cross_entropy");
            for part in ["target 9", "position 2", "V = 9"] {
                assert!(reason.contains(part), "{reason}");
            }
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // Ignoring 9 makes the same targets valid.
    logits.cross_entropy(&out_of_range, Some(9))?;
    assert!(matches!(
        logits.cross_entropy(&Tensor::from_u32(d, &[0, 1, 2], &[3])?, None),
        Err(Error::ShapeMismatch {
            op: "cross_entropy",
            ..
        })
    ));
    assert!(matches!(
        logits.cross_entropy(&Tensor::zeros(d, &[4])?, None),
        Err(Error::DTypeMismatch {
            op: "cross_entropy",
            ..
        })
    ));
    // Logits are f32 or f16.
    let int_logits = Tensor::from_u32(d, &[0; 12], &[3, 4])?;
    match int_logits.cross_entropy(&Tensor::from_u32(d, &[0, 1, 2], &[3])?, None) {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("f32 or f16"), "{reason}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // A slice has no host copy of its own to check the targets against (a reshape of a whole
    // index tensor keeps it).
    let view = Tensor::from_u32(d, &[0, 1, 2, 3, 0], &[5])?.narrow(0, 0, 4)?;
    match logits.cross_entropy(&view, None) {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("from_u32"), "{reason}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    Ok(())
}

#[test]
fn logits_used_elsewhere_and_repeated_backward_accumulate() -> Result<()> {
    // loss = 3 CE(x) + 0.01 sum(x^2): dlogits is added to another contribution, and the
    // upstream gradient of the CE is 3 (read from its buffer by the kernel).
    let d = dev();
    let mut rng = rng("ce_accumulate");
    let (n, v) = (5, 33);
    let x = Arr::rand(&mut rng, &[n, v], -3.0, 3.0);
    let targets = rand_targets(&mut rng, n, v);
    let t = Tensor::from_u32(d, &targets, &[n])?;
    let mut results = Vec::new();
    for fused in [true, false] {
        let logits = x.upload(d).requires_grad();
        let mut passes = Vec::new();
        for _ in 0..2 {
            let ce = if fused {
                logits.cross_entropy(&t, None)?
            } else {
                logits.cross_entropy_unfused(&t, None)?
            };
            let loss = ce
                .mul_scalar(3.0)?
                .add(&logits.square()?.sum_all()?.mul_scalar(0.01)?)?;
            loss.backward()?; // no zero_grad: the second pass adds in
            passes.push(logits.grad().expect("reached by backward").to_vec()?);
        }
        results.push(passes);
    }
    let (fused, unfused) = (&results[0], &results[1]);
    for (pass, (got, want)) in fused.iter().zip(unfused).enumerate() {
        let want: Vec<f64> = want.iter().map(|&g| g as f64).collect();
        check_grad(got, &want, v, n, &format!("pass {pass}"));
    }
    let twice: Vec<f64> = fused[0].iter().map(|&g| 2.0 * g as f64).collect();
    check_grad(&fused[1], &twice, v, n, "accumulated");
    Ok(())
}

#[test]
fn dispatch_counts() -> Result<()> {
    let d = private_dev();
    let mut rng = rng("ce_dispatches");
    let seed = Tensor::ones(&d, &[])?;
    // (rows, V): up to 2048 rows the mean is one reduction dispatch, past that two.
    for (n, v, fused_forward) in [(33, 1000, 2), (2049, 8, 3)] {
        let x = Arr::rand(&mut rng, &[n, v], -4.0, 4.0);
        let t = Tensor::from_u32(&d, &rand_targets(&mut rng, n, v), &[n])?;
        let mut counts = Vec::new();
        for fused in [true, false] {
            let logits = x.upload(&d).requires_grad();
            let c0 = d.counters();
            let loss = if fused {
                logits.cross_entropy(&t, None)?
            } else {
                logits.cross_entropy_unfused(&t, None)?
            };
            let c1 = d.counters();
            loss.backward_with(&seed)?;
            let c2 = d.counters();
            counts.push(((c1 - c0).forward_dispatches, (c2 - c1).backward_dispatches));
        }
        println!(
            "cross_entropy ({n}, {v}) dispatches (forward, backward): fused {:?}, unfused {:?}",
            counts[0], counts[1]
        );
        assert_eq!(counts[0], (fused_forward, 1));
    }
    Ok(())
}

#[test]
fn zero_rows_give_nan_and_an_empty_gradient() -> Result<()> {
    let d = dev();
    let logits = Tensor::zeros(d, &[0, 5])?.requires_grad();
    let loss = logits.cross_entropy(&Tensor::from_u32(d, &[], &[0])?, None)?;
    assert!(loss.item()?.is_nan());
    loss.backward()?;
    assert_eq!(logits.grad().expect("reached by backward").shape(), &[0, 5]);
    Ok(())
}

#[test]
fn padded_rows_are_read_in_place_and_their_padding_gets_no_gradient() -> Result<()> {
    let d = private_dev();
    let mut rng = rng("ce_padded_rows");
    // (rows, V, row stride): rows on 4-element boundaries (vectors; the last one of a row
    // reaches into the padding) and not (the scalar kernel).
    for (n, v, vp) in [(5, 7, 8), (4, 1000, 1003), (6, 255, 260), (3, 50257, 50304)] {
        let full = Arr::rand(&mut rng, &[n, vp], -4.0, 4.0);
        let x = full.narrow(1, 0, v);
        let targets = rand_targets(&mut rng, n, v);
        let (want_loss, want_grad) = cross_entropy(&x, &targets, None);
        let t = Tensor::from_u32(&d, &targets, &[n])?;
        let leaf = full.upload(&d).requires_grad();
        let logits = leaf.narrow(1, 0, v)?;
        for pass in 1..=2 {
            let c0 = d.counters();
            let loss = logits.cross_entropy(&t, None)?;
            let c1 = d.counters();
            // The loss and the mean: no copy of the rows.
            assert_eq!((c1 - c0).forward_dispatches, 2, "({n}, {v}, {vp})");
            assert_close(&[loss.item()?], &[want_loss], TOL, "loss, padded rows");
            loss.backward()?; // the second pass adds into the first one's gradient
            let grad = leaf.grad().expect("reached by backward").to_vec()?;
            let inside: Vec<f32> = grad.chunks(vp).flat_map(|r| r[..v].to_vec()).collect();
            let padding: Vec<f32> = grad.chunks(vp).flat_map(|r| r[v..].to_vec()).collect();
            let want: Vec<f64> = want_grad.data.iter().map(|g| g * pass as f64).collect();
            check_grad(
                &inside,
                &want,
                v,
                n,
                &format!("dlogits ({n}, {v}, {vp}) pass {pass}"),
            );
            assert!(
                padding.iter().all(|&g| g == 0.0),
                "({n}, {v}, {vp}) pass {pass}: gradient in the padding"
            );
        }
    }
    Ok(())
}

#[test]
fn f16_logits_match_f64_on_their_rounded_values() -> Result<()> {
    // f16 logits (the --amp LM head's) are widened to f32 as they load: loss and dlogits match
    // the f64 reference of the rounded values, in vectors of 4 (rows on 4-element boundaries,
    // the last vector reaching into the padding) and not, dlogits f32 and f16.
    let d = private_dev();
    let mut rng = rng("ce_f16_logits");
    for (n, v, vp) in [
        (5, 7, 7),
        (4, 1000, 1000),
        (6, 255, 260),
        (3, 50257, 50304),
        (2, 9, 11),
    ] {
        let full = Arr::rand(&mut rng, &[n, vp], -8.0, 8.0);
        let rounded = Arr {
            shape: full.shape.clone(),
            data: full
                .data
                .iter()
                .map(|&x| half::f16::from_f64(x).to_f64())
                .collect(),
        };
        let x = rounded.narrow(1, 0, v);
        let targets = rand_targets(&mut rng, n, v);
        let (want_loss, want_grad) = cross_entropy(&x, &targets, None);
        let t = Tensor::from_u32(&d, &targets, &[n])?;
        for grad_dtype in [DType::F32, DType::F16] {
            let half = full.upload(&d).to_dtype(DType::F16)?.requires_grad();
            let logits = half.narrow(1, 0, v)?;
            poison(&d, 2 * n);
            let loss = logits.cross_entropy_grad_as(&t, None, grad_dtype)?;
            poison(&d, n * vp);
            loss.backward()?;
            let what = format!("({n}, {v}, {vp}) dlogits {grad_dtype:?}");
            assert_close(&[loss.item()?], &[want_loss], TOL, &format!("loss {what}"));
            let grad = half.grad().expect("reached by backward").to_vec()?;
            let inside: Vec<f32> = grad.chunks(vp).flat_map(|r| r[..v].to_vec()).collect();
            // dlogits scaled by V * n are of order 1; an f16 gradient is within its rounding.
            let s = (v * n) as f64;
            let got: Vec<f32> = inside.iter().map(|&g| (g as f64 * s) as f32).collect();
            let want: Vec<f64> = want_grad.data.iter().map(|w| w * s).collect();
            let tol = if grad_dtype == DType::F16 { 2e-3 } else { TOL };
            assert_close(&got, &want, tol, &what);
        }
    }
    Ok(())
}

#[test]
fn lm_head_in_padded_rows_with_f16_gradients_matches_the_plain_head() -> Result<()> {
    // The --amp training loss: logits in rows padded to 64 elements by the LM head (tied
    // weights: the weight is a transposed view), their gradient made in f16 by cross-entropy.
    // The backward products round that gradient to f16 anyway, so h's and wte's gradients
    // must match those of the plain head (contiguous f32 logits and gradient) closely, and
    // the f64 reference within f16 rounding.
    let d = dev();
    let mut rng = rng("ce_lm_head_padded");
    for (n, c, v) in [(37, 48, 1000), (9, 40, 203)] {
        let h = Arr::rand(&mut rng, &[n, c], -1.0, 1.0);
        let wte = Arr::rand(&mut rng, &[v, c], -1.0, 1.0);
        let targets = rand_targets(&mut rng, n, v);
        let t = Tensor::from_u32(d, &targets, &[n])?;
        let mut results = Vec::new();
        // Padded f32 logits, padded f16 logits (the --amp loss's), the plain head.
        for padded in [Some(DType::F32), Some(DType::F16), None] {
            let (hl, wl) = (h.upload(d).requires_grad(), wte.upload(d).requires_grad());
            let loss = autocast(true, || -> Result<Tensor> {
                let w = wl.t()?;
                if let Some(dtype) = padded {
                    let logits = hl.linear_padded_as(&w, 64, dtype)?;
                    assert_eq!(logits.strides(), &[v.next_multiple_of(64), 1]);
                    assert_eq!(logits.dtype(), dtype);
                    logits.cross_entropy_grad_as(&t, None, DType::F16)
                } else {
                    hl.linear(&w, None, Activation::None)?
                        .cross_entropy(&t, None)
                }
            })?;
            loss.backward()?;
            results.push((
                loss.item()?,
                hl.grad().expect("reached").to_vec()?,
                wl.grad().expect("reached").to_vec()?,
            ));
        }
        let rel = |a: &[f32], b: &[f32]| {
            let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
            let den: f32 = b.iter().map(|y| y * y).sum();
            (num / den).sqrt()
        };
        let plain = &results[2];
        // f16 logits: the loss within their rounding (about 4e-3 at these logits' size, one
        // in 2^11 of it), the gradients a little further off.
        for (got, loss_tol, grad_tol, kind) in [
            (&results[0], 1e-5, 1e-3, "f32"),
            (&results[1], 1e-3, 3e-3, "f16"),
        ] {
            assert_close(
                &[got.0],
                &[plain.0 as f64],
                loss_tol,
                &format!("{kind} loss"),
            );
            for (what, a, b) in [("dh", &got.1, &plain.1), ("dwte", &got.2, &plain.2)] {
                let e = rel(a, b);
                assert!(
                    e < grad_tol,
                    "({n}, {c}, {v}) {kind} logits {what}: relative error {e} against the plain head"
                );
            }
        }
        // The f64 reference: logits = h wte^T, dh = dlogits wte, dwte = dlogits^T h.
        let logits = h.matmul(&wte.t());
        let (loss, dl) = cross_entropy(&logits, &targets, None);
        let dh = dl.matmul(&wte).data;
        let dw = dl.t().matmul(&h).data;
        for (got, kind) in [(&results[0], "f32"), (&results[1], "f16")] {
            assert_close(
                &[got.0],
                &[loss],
                1e-2,
                &format!("{kind} logits: loss against f64"),
            );
            for (what, g, want) in [("dh", &got.1, &dh), ("dwte", &got.2, &dw)] {
                let wf: Vec<f32> = want.iter().map(|&x| x as f32).collect();
                let e = rel(g, &wf);
                assert!(
                    e < 2e-2,
                    "({n}, {c}, {v}) {kind} logits {what}: relative error {e} against f64"
                );
            }
        }
    }
    Ok(())
}
