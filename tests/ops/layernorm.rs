//! The fused LayerNorm: forward against a CPU f64 reference at odd sizes with poisoned
//! outputs, in f32 and f16; values and every gradient against the unfused composition of
//! existing ops, from f32 and f16 output gradients, for each subset of inputs wanting one, and
//! added into existing gradients; backward against finite differences; errors; gradient
//! accumulation into a shared gamma and into a reused x; gradient targets at an offset; the
//! workgroup-memory reduction path; its dispatch counts; and dgamma and dbeta summed in the
//! backward's own dispatch against f64, run after run.

use crate::common::reference::{layer_norm, layer_norm_backward};
use crate::common::*;
use rand::rngs::StdRng;
use wgrad::autograd::gradcheck::{self, Input};
use wgrad::{DType, Device, Error, Result, Tensor};

const EPS: f32 = 1e-5;

/// x (shape), gamma, beta (C): x around 3 (a mean far from 0 tests the two-pass variance).
fn inputs(rng: &mut StdRng, shape: &[usize]) -> (Arr, Arr, Arr) {
    let cols = *shape.last().expect("rank >= 1");
    let x = Arr::rand(rng, shape, 2.0, 4.0);
    let gamma = Arr::rand(rng, &[cols], 0.5, 1.5);
    let beta = Arr::rand(rng, &[cols], -0.5, 0.5);
    (x, gamma, beta)
}

#[test]
fn forward_matches_f64_reference_at_odd_sizes() -> Result<()> {
    let d = dev();
    let mut rng = rng("layernorm_forward");
    // 1030 and 2100: columns past the 4 x 256 a lane keeps in registers.
    for cols in [1, 7, 255, 768, 1000, 1030, 2100] {
        for shape in [vec![1, cols], vec![5, cols], vec![3, 11, cols]] {
            let (x, gamma, beta) = inputs(&mut rng, &shape);
            let want = layer_norm(&x, &gamma, &beta, EPS as f64);
            poison(d, x.numel());
            let y = x
                .upload(d)
                .layer_norm(&gamma.upload(d), &beta.upload(d), EPS)?;
            check(&y, &want, TOL, &format!("layer_norm {shape:?}"));
        }
    }
    Ok(())
}

#[test]
fn forward_without_subgroups() -> Result<()> {
    let d = tree_dev();
    let mut rng = rng("layernorm_tree");
    for shape in [[5, 7], [33, 1000]] {
        let (x, gamma, beta) = inputs(&mut rng, &shape);
        let want = layer_norm(&x, &gamma, &beta, EPS as f64);
        poison(d, x.numel());
        let y = x
            .upload(d)
            .layer_norm(&gamma.upload(d), &beta.upload(d), EPS)?;
        check(&y, &want, TOL, &format!("layer_norm (tree) {shape:?}"));
    }
    Ok(())
}

/// loss = sum(f(x, gamma, beta) * w) and the gradients of x, gamma, beta.
fn grads(
    f: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    x: &Arr,
    gamma: &Arr,
    beta: &Arr,
    w: &Arr,
) -> Result<Vec<Vec<f32>>> {
    grads_on(dev(), f, x, gamma, beta, w)
}

/// `grads` on device `d`.
fn grads_on(
    d: &Device,
    f: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    x: &Arr,
    gamma: &Arr,
    beta: &Arr,
    w: &Arr,
) -> Result<Vec<Vec<f32>>> {
    let params = [x, gamma, beta].map(|a| a.upload(d).requires_grad());
    let y = f(&params[0], &params[1], &params[2])?;
    let loss = y.mul(&w.upload(d))?.sum_all()?;
    loss.backward()?;
    let mut out = vec![y.to_vec()?];
    for p in &params {
        out.push(p.grad().expect("reached by backward").to_vec()?);
    }
    Ok(out)
}

/// `got` (y, dx, dgamma, dbeta from `grads`) against the unfused composition's on the same
/// inputs (x, gamma, beta, w).
fn assert_matches_unfused(
    got: &[Vec<f32>],
    [x, gamma, beta, w]: [&Arr; 4],
    label: &str,
) -> Result<()> {
    let unfused = grads(|x, g, b| x.layer_norm_unfused(g, b, EPS), x, gamma, beta, w)?;
    for (i, name) in ["y", "dx", "dgamma", "dbeta"].iter().enumerate() {
        let want: Vec<f64> = unfused[i].iter().map(|&v| v as f64).collect();
        assert_close(&got[i], &want, TOL, &format!("{name} {label}"));
    }
    Ok(())
}

#[test]
fn fused_matches_unfused_values_and_gradients() -> Result<()> {
    let mut rng = rng("layernorm_vs_unfused");
    for shape in [
        vec![1, 1],
        vec![5, 7],
        vec![33, 255],
        vec![3, 11, 768],
        vec![5, 1000],
        // Chunks for dgamma and dbeta: 281 of 2 rows (not a whole number of the sum's 16
        // groups of 4), and 1024 (the most) of 8 rows.
        vec![562, 37],
        vec![2, 4096, 24],
    ] {
        let (x, gamma, beta) = inputs(&mut rng, &shape);
        let w = Arr::rand(&mut rng, &shape, -1.0, 1.0);
        let fused = grads(|x, g, b| x.layer_norm(g, b, EPS), &x, &gamma, &beta, &w)?;
        assert_matches_unfused(&fused, [&x, &gamma, &beta, &w], &format!("{shape:?}"))?;
    }
    Ok(())
}

#[test]
fn backward_without_subgroups() -> Result<()> {
    let mut rng = rng("layernorm_tree_backward");
    for shape in [vec![5, 7], vec![70, 1030]] {
        let (x, gamma, beta) = inputs(&mut rng, &shape);
        let w = Arr::rand(&mut rng, &shape, -1.0, 1.0);
        let ln = |x: &Tensor, g: &Tensor, b: &Tensor| x.layer_norm(g, b, EPS);
        let tree = grads_on(tree_dev(), ln, &x, &gamma, &beta, &w)?;
        assert_matches_unfused(&tree, [&x, &gamma, &beta, &w], &format!("(tree) {shape:?}"))?;
    }
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let d = dev();
    let mut rng = rng("layernorm_gradcheck");
    let (rows, cols) = (3, 5);
    let (x, gamma, beta) = inputs(&mut rng, &[rows, cols]);
    let x = x.map(|v| v - 3.0); // centred, so xhat is not dominated by one element
    let w = Arr::rand(&mut rng, &[rows, cols], -1.0, 1.0);
    let w_gpu = w.upload(d);
    let input = |a: &Arr| Input {
        data: a.f32s(),
        shape: a.shape.clone(),
    };
    let report = gradcheck::check(
        d,
        &[input(&x), input(&gamma), input(&beta)],
        |p| p[0].layer_norm(&p[1], &p[2], EPS)?.mul(&w_gpu)?.sum_all(),
        |p| {
            let arr = |v: &Vec<f64>, shape: &[usize]| Arr::new(shape, v.clone());
            let (x, gamma, beta) = (
                arr(&p[0], &[rows, cols]),
                arr(&p[1], &[cols]),
                arr(&p[2], &[cols]),
            );
            let y = layer_norm(&x, &gamma, &beta, EPS as f64);
            y.data.iter().zip(&w.data).map(|(a, b)| a * b).sum()
        },
        1e-5,
        TOL,
    )?;
    assert!(report.error < TOL, "{report:?}");
    Ok(())
}

#[test]
fn wrong_gamma_or_beta_shape_is_an_error() -> Result<()> {
    let d = dev();
    let x = Tensor::zeros(d, &[4, 7])?;
    let good = Tensor::ones(d, &[7])?;
    for bad in [
        Tensor::ones(d, &[6])?,
        Tensor::ones(d, &[1, 7])?,
        Tensor::ones(d, &[])?,
    ] {
        for (g, b) in [(&bad, &good), (&good, &bad)] {
            match x.layer_norm(g, b, EPS) {
                Err(Error::ShapeMismatch { op, expected, got }) => {
                    assert_eq!(op, "layer_norm");
                    assert!(expected.contains("[7]"), "{expected}");
                    assert_eq!(got, bad.shape());
                }
                other => panic!("expected a ShapeMismatch, got {other:?}"),
            }
        }
    }
    assert!(matches!(
        Tensor::zeros(d, &[])?.layer_norm(&good, &good, EPS),
        Err(Error::ShapeMismatch {
            op: "layer_norm",
            ..
        })
    ));
    assert!(matches!(
        x.layer_norm(&good, &good, -1.0),
        Err(Error::InvalidArgument {
            op: "layer_norm",
            ..
        })
    ));
    Ok(())
}

/// A graph where x, gamma and beta each also feed another op, so each gets two contributions:
/// loss = sum(LN(x) * w) + sum(gamma^2) + sum(beta * gamma) + 0.1 sum(x^2).
fn shared_graph(
    ln: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
) -> Result<Tensor> {
    let main = ln(x, gamma, beta)?.mul(w)?.sum_all()?;
    let extra = gamma
        .square()?
        .sum_all()?
        .add(&beta.mul(gamma)?.sum_all()?)?
        .add(&x.square()?.sum_all()?.mul_scalar(0.1)?)?;
    main.add(&extra)
}

#[test]
fn shared_gamma_and_repeated_backward_accumulate() -> Result<()> {
    let d = dev();
    let mut rng = rng("layernorm_accumulate");
    let shape = [6, 33];
    let (x, gamma, beta) = inputs(&mut rng, &shape);
    let w = Arr::rand(&mut rng, &shape, -1.0, 1.0).upload(d);
    let fused: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor> =
        &|x, g, b| x.layer_norm(g, b, EPS);
    let unfused: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor> =
        &|x, g, b| x.layer_norm_unfused(g, b, EPS);
    let mut results = Vec::new();
    for ln in [fused, unfused] {
        let params = [&x, &gamma, &beta].map(|a| a.upload(d).requires_grad());
        let [px, pg, pb] = &params;
        // Twice without zero_grad: the second backward adds into every gradient buffer
        // (the kernels' accumulate variants).
        let mut per_pass = Vec::new();
        for _ in 0..2 {
            shared_graph(ln, px, pg, pb, &w)?.backward()?;
            let g: Vec<Vec<f32>> = params
                .iter()
                .map(|p| p.grad().expect("reached by backward").to_vec())
                .collect::<Result<_>>()?;
            per_pass.push(g);
        }
        results.push(per_pass);
    }
    let (fused, unfused) = (&results[0], &results[1]);
    for pass in 0..2 {
        for (i, name) in ["dx", "dgamma", "dbeta"].iter().enumerate() {
            let want: Vec<f64> = unfused[pass][i].iter().map(|&v| v as f64).collect();
            assert_close(&fused[pass][i], &want, TOL, &format!("{name} pass {pass}"));
            let twice: Vec<f64> = fused[0][i].iter().map(|&v| 2.0 * v as f64).collect();
            if pass == 1 {
                assert_close(&fused[1][i], &twice, TOL, &format!("{name} accumulated"));
            }
        }
    }
    Ok(())
}

#[test]
fn gamma_and_beta_as_rows_of_one_parameter() -> Result<()> {
    // Their gradients land at offsets 0 and C of the parameter's gradient buffer.
    let d = dev();
    let mut rng = rng("layernorm_views");
    let (rows, cols) = (5, 19);
    let (x, gamma, beta) = inputs(&mut rng, &[rows, cols]);
    let mut both = gamma.data.clone();
    both.extend(&beta.data);
    let both = Arr::new(&[2, cols], both);
    let w = Arr::rand(&mut rng, &[rows, cols], -1.0, 1.0).upload(d);
    let mut grads = Vec::new();
    for fused in [true, false] {
        let p = both.upload(d).requires_grad();
        let g = p.narrow(0, 0, 1)?.squeeze(0)?;
        let b = p.narrow(0, 1, 1)?.squeeze(0)?;
        let xt = x.upload(d);
        let y = if fused {
            xt.layer_norm(&g, &b, EPS)?
        } else {
            xt.layer_norm_unfused(&g, &b, EPS)?
        };
        y.mul(&w)?.sum_all()?.backward()?;
        grads.push(p.grad().expect("reached by backward").to_vec()?);
    }
    let want: Vec<f64> = grads[1].iter().map(|&v| v as f64).collect();
    assert_close(&grads[0], &want, TOL, "d(gamma, beta)");
    Ok(())
}

#[test]
fn dispatch_counts() -> Result<()> {
    let mut rng = rng("layernorm_dispatches");
    let shape = [33, 768];
    let (x, gamma, beta) = inputs(&mut rng, &shape);
    {
        let d = private_dev();
        let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0).upload(&d);
        let mut counts = Vec::new();
        for fused in [true, false] {
            let [px, pg, pb] = [&x, &gamma, &beta].map(|a| a.upload(&d).requires_grad());
            let c0 = d.counters();
            let y = if fused {
                px.layer_norm(&pg, &pb, EPS)?
            } else {
                px.layer_norm_unfused(&pg, &pb, EPS)?
            };
            let c1 = d.counters();
            y.backward_with(&seed)?;
            let c2 = d.counters();
            counts.push(((c1 - c0).forward_dispatches, (c2 - c1).backward_dispatches));
        }
        println!(
            "layer_norm dispatches (forward, backward): fused {:?}, unfused {:?}",
            counts[0], counts[1]
        );
        // Forward: one kernel. Backward: dx with the chunks' partial dgamma and dbeta, and
        // both sums in a second dispatch.
        assert_eq!(counts[0], (1, 2));
    }
    Ok(())
}

#[test]
fn dispatch_counts_with_an_f16_output_and_some_gradients() -> Result<()> {
    let mut rng = rng("layernorm_dispatches_f16");
    let shape = [33, 768];
    let (x, gamma, beta) = inputs(&mut rng, &shape);
    let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0);
    {
        let d = private_dev();
        let seed = Tensor::from_slice_as(&d, &seed.f32s(), &shape, DType::F16)?;
        let sums = 1;
        // (x, gamma, beta wanting a gradient) -> backward dispatches: dx alone is one; the
        // parameters take the partials (with dx where wanted) and their sums for one or both,
        // in a second dispatch.
        for (want, backward) in [
            ([true, true, true], 1 + sums),
            ([true, false, false], 1),
            ([false, true, true], 1 + sums),
            ([false, true, false], 1 + sums),
            ([true, false, true], 1 + sums),
        ] {
            let [px, pg, pb] = [&x, &gamma, &beta]
                .iter()
                .zip(want)
                .map(|(a, w)| {
                    let t = a.upload(&d);
                    if w {
                        t.requires_grad()
                    } else {
                        t
                    }
                })
                .collect::<Vec<_>>()
                .try_into()
                .expect("three inputs");
            let c0 = d.counters();
            let y = px.layer_norm_as(&pg, &pb, EPS, DType::F16)?;
            let c1 = d.counters();
            y.backward_with(&seed)?;
            let c2 = d.counters();
            assert_eq!(y.dtype(), DType::F16);
            assert_eq!(
                ((c1 - c0).forward_dispatches, (c2 - c1).backward_dispatches),
                (1, backward),
                "{want:?}, sums in a second dispatch: {}",
                sums == 1
            );
        }
    }
    Ok(())
}

/// Half an f16 ulp relative: the rounding of an f16 store.
const F16_ROUNDING: f64 = 1.0 / 2048.0;

#[test]
fn f16_output_matches_f64_reference_within_its_rounding() -> Result<()> {
    let d = dev();
    let mut rng = rng("layernorm_forward_f16");
    // 1030: columns past the 4 x 256 a backward lane keeps in registers.
    for cols in [1, 7, 255, 768, 1000, 1030] {
        for shape in [vec![1, cols], vec![3, 11, cols]] {
            let (x, gamma, beta) = inputs(&mut rng, &shape);
            let want = layer_norm(&x, &gamma, &beta, EPS as f64).data;
            let y =
                x.upload(d)
                    .layer_norm_as(&gamma.upload(d), &beta.upload(d), EPS, DType::F16)?;
            assert_eq!(y.dtype(), DType::F16);
            assert_close(
                &y.to_vec()?,
                &want,
                F16_ROUNDING + TOL,
                &format!("layer_norm_as f16 {shape:?}"),
            );
        }
    }
    Ok(())
}

/// After `passes` backward passes from `seed` (stored as `seed_dtype`): the gradients of x,
/// gamma, beta where `want` asks for them, through the fused LayerNorm storing y as `y_dtype`
/// (`Some`) or the unfused one (`None`, from the seed in f32: the same values).
fn seeded_grads(
    fused: Option<DType>,
    (x, gamma, beta): (&Arr, &Arr, &Arr),
    want: [bool; 3],
    seed: &Arr,
    seed_dtype: DType,
    passes: usize,
) -> Result<Vec<Option<Vec<f32>>>> {
    let d = dev();
    let params: Vec<Tensor> = [x, gamma, beta]
        .iter()
        .zip(want)
        .map(|(a, w)| {
            let t = a.upload(d);
            if w {
                t.requires_grad()
            } else {
                t
            }
        })
        .collect();
    for _ in 0..passes {
        let (y, seed) = match fused {
            Some(y_dtype) => (
                params[0].layer_norm_as(&params[1], &params[2], EPS, y_dtype)?,
                Tensor::from_slice_as(d, &seed.f32s(), &seed.shape, seed_dtype)?,
            ),
            None => (
                params[0].layer_norm_unfused(&params[1], &params[2], EPS)?,
                seed.upload(d),
            ),
        };
        y.backward_with(&seed)?;
    }
    params
        .iter()
        .map(|p| p.grad().map(|g| g.to_vec()).transpose())
        .collect()
}

#[test]
fn gradients_from_f16_and_f32_output_gradients_match_unfused() -> Result<()> {
    let mut rng = rng("layernorm_seeded_grads");
    let all = [true, true, true];
    // (shape, inputs wanting a gradient, passes: 2 adds into existing gradients)
    let cases: Vec<(Vec<usize>, [bool; 3], usize)> = vec![
        (vec![1, 7], all, 1),
        (vec![5, 7], all, 2),
        (vec![1, 768], all, 1),
        (vec![33, 1030], all, 2),
        (vec![5000, 37], all, 1),
        (vec![5000, 37], all, 2),
        (vec![2, 9, 13], [true, false, false], 2),
        (vec![70, 13], [false, true, true], 2),
        (vec![70, 13], [false, true, false], 1),
        (vec![70, 13], [false, false, true], 2),
        (vec![70, 1030], [true, true, false], 2),
    ];
    for (shape, want, passes) in cases {
        let (x, gamma, beta) = inputs(&mut rng, &shape);
        // Values an f16 holds exactly, so that both seeds carry the same gradient.
        let seed = Arr::rand(&mut rng, &shape, -1.0, 1.0).map(|v| half::f16::from_f64(v).to_f64());
        let xs = (&x, &gamma, &beta);
        let reference = seeded_grads(None, xs, want, &seed, DType::F32, passes)?;
        for y_dtype in [DType::F32, DType::F16] {
            for seed_dtype in [DType::F32, DType::F16] {
                let got = seeded_grads(Some(y_dtype), xs, want, &seed, seed_dtype, passes)?;
                for (i, name) in ["dx", "dgamma", "dbeta"].iter().enumerate() {
                    let what = format!(
                        "{name} {shape:?} y {y_dtype:?} dy {seed_dtype:?} {passes} pass(es)"
                    );
                    match (&got[i], &reference[i]) {
                        (Some(g), Some(r)) => {
                            let r: Vec<f64> = r.iter().map(|&v| v as f64).collect();
                            assert_close(g, &r, TOL, &what);
                        }
                        (None, None) => assert!(!want[i], "{what}"),
                        _ => panic!("{what}: a gradient on one side only"),
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn zero_rows_give_zero_gamma_and_beta_gradients() -> Result<()> {
    let d = dev();
    let x = Tensor::zeros(d, &[0, 7])?.requires_grad();
    let gamma = Tensor::ones(d, &[7])?.requires_grad();
    let beta = Tensor::zeros(d, &[7])?.requires_grad();
    poison(d, 7);
    let y = x.layer_norm(&gamma, &beta, EPS)?;
    assert_eq!(y.shape(), &[0, 7]);
    y.sum_all()?.backward()?;
    for p in [&gamma, &beta] {
        let g = p.grad().expect("reached by backward").to_vec()?;
        assert_eq!(g, vec![0.0; 7]);
    }
    Ok(())
}

/// The backward's chunks over `rows` rows (`ops::layernorm`'s defaults: chunks of 2 rows or
/// more, 1024 at most).
fn chunks(rows: usize) -> usize {
    rows.div_ceil(2).clamp(1, 1024)
}

/// dgamma and dbeta, each written, added into, or not wanted, against f64 into NaN-poisoned
/// buffers, at shapes of one chunk, of chunks that do not divide the rows, of C past the 1024
/// columns a lane keeps in registers and past 2048, and of chunks past the rows; for each set
/// of inputs wanting a gradient, three backward passes in a row: written, added into, written
/// again after zero_grad, with the same bits as the first. (Summed in the backward's own
/// dispatch instead of a second, they measured slower: docs/decisions.md.)
#[test]
fn backward_sums_the_parameter_gradients_into_every_target_mode() -> Result<()> {
    let d = &private_dev();
    let mut rng = rng("layernorm_params_in_one_dispatch");
    // (rows, C): chunks of 2 rows (at most 1024 of them).
    for (rows, cols) in [
        (1, 7),     // 1 chunk
        (4, 300),   // 2 chunks
        (37, 1030), // 19 chunks (the last of 1 row)
        (70, 2100), // 35 chunks; 3 passes over C
        (513, 768), // 257 chunks
        (2500, 33), // 1024 chunks of 3 rows (190 past the rows)
    ] {
        let shape = [rows, cols];
        let (x, gamma, beta) = inputs(&mut rng, &shape);
        let dy = Arr::rand(&mut rng, &shape, -1.0, 1.0);
        let want = layer_norm_backward(&x, &gamma, &dy, EPS as f64);
        // (x, gamma, beta) wanting a gradient; `fresh_beta`: beta a new leaf every pass, so
        // that dbeta is written while dgamma is added into.
        for (wants, fresh_beta) in [
            ([true, true, true], false),
            ([false, true, true], false),
            ([true, true, false], false),
            ([false, false, true], false),
            ([false, true, true], true),
            ([true, false, false], false),
        ] {
            {
                let what = |e: &str| {
                    format!(
                        "{e} {shape:?}, wanting {wants:?}{}",
                        if fresh_beta {
                            " (beta new every pass)"
                        } else {
                            ""
                        }
                    )
                };
                let leaf = |a: &Arr, w: bool| {
                    let t = a.upload(d);
                    if w {
                        t.requires_grad()
                    } else {
                        t
                    }
                };
                let [px, pg, mut pb] =
                    [(&x, 0), (&gamma, 1), (&beta, 2)].map(|(a, i)| leaf(a, wants[i]));
                let seed = dy.upload(d);
                let mut first: Vec<Vec<f32>> = Vec::new();
                for pass in 1..=3 {
                    if pass == 3 {
                        for p in [&px, &pg, &pb] {
                            p.zero_grad();
                        }
                    }
                    if fresh_beta && pass > 1 {
                        pb = leaf(&beta, wants[2]);
                    }
                    let y = px.layer_norm(&pg, &pb, EPS)?;
                    // NaN in every buffer an output or the partials may take.
                    for n in [cols, rows * cols, 2 * chunks(rows) * cols] {
                        poison(d, n);
                    }
                    d.sync()?;
                    y.backward_with(&seed)?;
                    d.sync()?;
                    let mut got = Vec::new();
                    for (i, (p, name)) in [(&px, "dx"), (&pg, "dgamma"), (&pb, "dbeta")]
                        .into_iter()
                        .enumerate()
                    {
                        let Some(g) = p.grad() else {
                            assert!(!wants[i], "{}", what(&format!("no {name}")));
                            continue;
                        };
                        assert!(wants[i], "{}", what(&format!("a {name}")));
                        let g = g.to_vec()?;
                        // The second pass adds into the first's gradients (beta's, when new
                        // every pass, is written).
                        let scale = if pass == 2 && !(i == 2 && fresh_beta) {
                            2.0
                        } else {
                            1.0
                        };
                        let w: Vec<f64> = want[i].data.iter().map(|v| v * scale).collect();
                        assert_close(&g, &w, TOL, &what(&format!("{name}, pass {pass}")));
                        got.push(g);
                    }
                    match pass {
                        1 => first = got,
                        // The same sums in the same order: the same bits.
                        3 => assert!(
                            first == got,
                            "{}",
                            what("pass 3's bits differ from pass 1's")
                        ),
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(())
}
