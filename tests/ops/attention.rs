//! Fused causal attention (`Tensor::causal_attention`) against a CPU f64 reference, against the
//! unfused reference built from ops (`causal_attention_reference`), and against finite
//! differences; its gradient targets (new, overwritten, accumulated, views of one fused qkv
//! gradient, one tensor used as q, k and v); its errors; its dispatch counts; and the tiles'
//! workgroup memory.
//!
//! Shapes: q, k, v, O are (B, H, T, D); sizes are odd on purpose (T not a multiple of any
//! block, D not a multiple of 4, D below its padded head dim).

use crate::common::reference::causal_attention;
use crate::common::*;
use wgrad::autograd::gradcheck::{self, Input};
use wgrad::kernels::attention::{head_dim_bucket, spec, tile, Pass, HEAD_DIMS};
use wgrad::{Error, Result, Tensor};

fn qkv(tag: &str, shape: &[usize]) -> [Arr; 3] {
    let mut r = rng(tag);
    // Scores up to about +-8 after scaling: the softmax is far from uniform.
    [0, 1, 2].map(|_| Arr::rand(&mut r, shape, -2.0, 2.0))
}

#[test]
fn forward_matches_f64_reference_at_odd_sizes() -> Result<()> {
    let d = dev();
    let mut max_err: f64 = 0.0;
    for (b, h) in [(1, 1), (2, 3)] {
        for t in [1, 7, 33, 65, 130] {
            for hd in [8, 20, 64] {
                let shape = [b, h, t, hd];
                let [q, k, v] = qkv(&format!("fwd{shape:?}"), &shape);
                poison(d, q.numel());
                let o = q.upload(d).causal_attention(&k.upload(d), &v.upload(d))?;
                let want = causal_attention(&q, &k, &v);
                max_err = max_err.max(worst(&o.to_vec()?, &want.data));
                check(&o, &want, TOL, &format!("O {shape:?}"));
            }
        }
    }
    // The largest head dim, and one padded up to it.
    for shape in [[1, 2, 65, 128], [2, 1, 33, 97]] {
        let [q, k, v] = qkv(&format!("fwd{shape:?}"), &shape);
        poison(d, q.numel());
        let o = q.upload(d).causal_attention(&k.upload(d), &v.upload(d))?;
        let want = causal_attention(&q, &k, &v);
        max_err = max_err.max(worst(&o.to_vec()?, &want.data));
        check(&o, &want, TOL, &format!("O {shape:?}"));
    }
    eprintln!("forward against f64: worst error {max_err:.1e}");
    Ok(())
}

#[test]
fn strided_inputs_are_read_in_place_or_copied() -> Result<()> {
    let d = dev();
    let (b, t, h, hd) = (2, 33, 3, 20);
    let c = h * hd;
    let mut r = rng("strided");
    // A fused qkv projection (B, T, 3C), split into heads: (B, H, T, D) views.
    let x = Arr::rand(&mut r, &[b, t, 3 * c], -2.0, 2.0);
    let xt = x.upload(d);
    let heads = |i: usize| -> Result<Tensor> {
        xt.reshape(&[b, t, 3, h, hd])?
            .narrow(2, i, 1)?
            .squeeze(2)?
            .permute(&[0, 2, 1, 3])
    };
    let part = |i: usize| {
        x.reshape(&[b, t, 3, h, hd])
            .narrow(2, i, 1)
            .reshape(&[b, t, h, hd])
            .permute(&[0, 2, 1, 3])
    };
    let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
    assert!(!q.is_contiguous());
    let o = q.causal_attention(&k, &v)?;
    check(
        &o,
        &causal_attention(&part(0), &part(1), &part(2)),
        TOL,
        "O of qkv views",
    );

    // k given as (B, H, D, T) transposed: D is not unit stride, so it is copied first.
    let kt = part(1).transpose(2, 3);
    let o = part(0)
        .upload(d)
        .causal_attention(&kt.upload(d).transpose(2, 3)?, &part(2).upload(d))?;
    check(
        &o,
        &causal_attention(&part(0), &part(1), &part(2)),
        TOL,
        "O with k transposed",
    );
    Ok(())
}

/// The worst |got - want| / max(|want|, 1) (the metric of `assert_close`), for the log.
fn worst(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs() / w.abs().max(1.0))
        .fold(0.0, f64::max)
}

#[test]
fn fused_matches_unfused_reference_forward_and_gradients() -> Result<()> {
    let d = dev();
    // Backward at every padded head dim (D 8, 20, 30: 32; 64; 97: 128), D not a multiple of
    // 4 (30, 97), T past one block of every pass.
    let shapes = [
        [1, 1, 1, 8],
        [2, 3, 7, 20],
        [1, 2, 65, 64],
        [2, 3, 130, 64],
        [1, 2, 130, 30],
        [1, 2, 70, 97],
    ];
    for shape in shapes {
        let [q, k, v] = qkv(&format!("vs_ref{shape:?}"), &shape);
        let w = Arr::rand(&mut rng(&format!("w{shape:?}")), &shape, -1.0, 1.0).upload(d);
        let leaves = |_| [&q, &k, &v].map(|a| a.upload(d).requires_grad());
        let fused = loss_grads(&leaves(0), &w, |p| p[0].causal_attention(&p[1], &p[2]))?;
        let unfused = loss_grads(&leaves(1), &w, |p| {
            p[0].causal_attention_reference(&p[1], &p[2])
        })?;
        let what = |n: &str| format!("{n} fused vs unfused {shape:?}");
        let want = as_f64(&unfused.0);
        let mut errors = vec![worst(&fused.0, &want)];
        assert_close(&fused.0, &want, FUSED_VS_UNFUSED, &what("O"));
        for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
            let want = as_f64(&unfused.1[i]);
            errors.push(worst(&fused.1[i], &want));
            assert_close(&fused.1[i], &want, FUSED_VS_UNFUSED, &what(name));
        }
        let errors: Vec<String> = errors.iter().map(|e| format!("{e:.1e}")).collect();
        eprintln!("{shape:?}: worst error of O, dq, dk, dv against unfused: {errors:?}");
    }
    Ok(())
}

#[test]
fn gradients_accumulate_overwrite_and_reach_qkv_views() -> Result<()> {
    let d = dev();
    let (b, t, h, hd) = (2, 33, 3, 20);
    let mut r = rng("targets");
    let x = Arr::rand(&mut r, &[b, t, 3 * h * hd], -2.0, 2.0);
    let w = Arr::rand(&mut r, &[b, h, t, hd], -1.0, 1.0).upload(d);
    // One (B, T, 3C) leaf split into q, k, v views: the three gradients land in one buffer.
    let run = |x: &Tensor, fused: bool| -> Result<()> {
        let split = x.reshape(&[b, t, 3, h, hd])?;
        let [q, k, v] = [0, 1, 2].map(|i| {
            split
                .narrow(2, i, 1)
                .and_then(|s| s.squeeze(2))
                .and_then(|s| s.permute(&[0, 2, 1, 3]))
        });
        let (q, k, v) = (q?, k?, v?);
        let o = if fused {
            q.causal_attention(&k, &v)?
        } else {
            q.causal_attention_reference(&k, &v)?
        };
        o.mul(&w)?.sum_all()?.backward()
    };
    let xf = x.upload(d).requires_grad();
    let xr = x.upload(d).requires_grad();
    run(&xr, false)?;
    let want = as_f64(&xr.grad().expect("reference gradient").to_vec()?);
    let twice: Vec<f64> = want.iter().map(|g| 2.0 * g).collect();

    run(&xf, true)?;
    let grad = |x: &Tensor| x.grad().expect("fused gradient").to_vec();
    assert_close(&grad(&xf)?, &want, FUSED_VS_UNFUSED, "dqkv, first backward");
    run(&xf, true)?; // accumulates
    assert_close(&grad(&xf)?, &twice, FUSED_VS_UNFUSED, "dqkv, accumulated");
    xf.zero_grad();
    run(&xf, true)?; // overwrites
    assert_close(&grad(&xf)?, &want, FUSED_VS_UNFUSED, "dqkv after zero_grad");

    // Separate leaves: new, accumulated, then overwritten gradient buffers.
    let shape = [2, 3, 33, 20];
    let [q, k, v] = qkv("targets_leaves", &shape);
    let w = Arr::rand(&mut r, &shape, -1.0, 1.0).upload(d);
    let reference = [&q, &k, &v].map(|a| a.upload(d).requires_grad());
    let (_, want) = loss_grads(&reference, &w, |p| {
        p[0].causal_attention_reference(&p[1], &p[2])
    })?;
    let leaves = [&q, &k, &v].map(|a| a.upload(d).requires_grad());
    let fused = |p: &[Tensor]| p[0].causal_attention(&p[1], &p[2]);
    for (step, factor) in [(0, 1.0), (1, 2.0), (2, 1.0)] {
        if step == 2 {
            leaves.iter().for_each(|l| l.zero_grad());
        }
        let (_, got) = loss_grads(&leaves, &w, fused)?;
        for i in 0..3 {
            let want: Vec<f64> = want[i].iter().map(|&g| factor * g as f64).collect();
            assert_close(
                &got[i],
                &want,
                FUSED_VS_UNFUSED,
                &format!("leaf {i} step {step}"),
            );
        }
    }

    // One tensor as k and v, and one as q, k and v: contributions to one gradient buffer from
    // one kernel (new, accumulated, overwritten after zero_grad).
    type Use = fn(&Tensor, &Tensor, fn(&Tensor, &Tensor, &Tensor) -> R) -> R;
    type R = Result<Tensor>;
    let uses: [(&str, Use); 2] = [
        ("k = v", |x, y, f| f(y, x, x)),
        ("q = k = v", |x, _, f| f(x, x, x)),
    ];
    for (what, usage) in uses {
        let y = k.upload(d);
        let reference = q.upload(d).requires_grad();
        let (_, want) = loss_grads(&[reference], &w, |p| {
            usage(&p[0], &y, |q, k, v| q.causal_attention_reference(k, v))
        })?;
        let x = q.upload(d).requires_grad();
        for (step, factor) in [(0, 1.0), (1, 2.0), (2, 1.0)] {
            if step == 2 {
                x.zero_grad();
            }
            let (_, got) = loss_grads(std::slice::from_ref(&x), &w, |p| {
                usage(&p[0], &y, |q, k, v| q.causal_attention(k, v))
            })?;
            let want: Vec<f64> = want[0].iter().map(|&g| factor * g as f64).collect();
            assert_close(
                &got[0],
                &want,
                FUSED_VS_UNFUSED,
                &format!("{what} step {step}"),
            );
        }
    }
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let d = dev();
    for shape in [[1, 2, 5, 3], [2, 1, 9, 6]] {
        let mut r = rng(&format!("gradcheck{shape:?}"));
        let n: usize = shape.iter().product();
        let inputs: Vec<Input> = (0..3)
            .map(|_| Input {
                data: rand_vec(&mut r, n, -1.5, 1.5),
                shape: shape.to_vec(),
            })
            .collect();
        let w = Arr::rand(&mut r, &shape, -1.0, 1.0);
        let wt = w.upload(d);
        let report = gradcheck::check(
            d,
            &inputs,
            |p| p[0].causal_attention(&p[1], &p[2])?.mul(&wt)?.sum_all(),
            |x| {
                let [q, k, v] = [0, 1, 2].map(|i| Arr::new(&shape, x[i].clone()));
                let o = causal_attention(&q, &k, &v);
                o.data.iter().zip(&w.data).map(|(a, b)| a * b).sum()
            },
            1e-3,
            1e-4,
        )?;
        eprintln!("gradcheck {shape:?}: {report:?}");
    }
    Ok(())
}

#[test]
fn bad_shapes_are_errors_naming_the_op() {
    let d = dev();
    let t = |shape: &[usize]| Tensor::zeros(d, shape).expect("zeros");
    let q = t(&[1, 2, 5, 8]);
    let cases = [
        ("k shape", t(&[1, 2, 6, 8]), t(&[1, 2, 5, 8]), q.clone()),
        ("v shape", t(&[1, 2, 5, 8]), t(&[1, 2, 5, 4]), q.clone()),
        ("rank 3", t(&[2, 5, 8]), t(&[2, 5, 8]), t(&[2, 5, 8])),
        (
            "head dim",
            t(&[1, 1, 3, 129]),
            t(&[1, 1, 3, 129]),
            t(&[1, 1, 3, 129]),
        ),
    ];
    for (what, k, v, q) in cases {
        match q.causal_attention(&k, &v) {
            Err(e @ Error::ShapeMismatch { .. }) => {
                assert!(
                    e.to_string().starts_with("causal_attention:"),
                    "{what}: {e}"
                )
            }
            other => panic!("{what}: expected a shape error, got {other:?}"),
        }
    }
    let e = t(&[2, 5, 8])
        .causal_attention_reference(&t(&[2, 5, 8]), &t(&[2, 5, 8]))
        .expect_err("rank 3");
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
}

#[test]
fn an_empty_sequence_gives_empty_output_and_gradients() -> Result<()> {
    let d = dev();
    let shape = [2, 3, 0, 8];
    let leaves = [0, 1, 2].map(|_| Tensor::from_slice(d, &[], &shape).map(|t| t.requires_grad()));
    let [q, k, v] = leaves;
    let (q, k, v) = (q?, k?, v?);
    let o = q.causal_attention(&k, &v)?;
    assert_eq!(o.shape(), &shape);
    o.sum_all()?.backward()?;
    for x in [&q, &k, &v] {
        assert_eq!(x.grad().expect("reached by backward").shape(), &shape);
    }
    Ok(())
}

#[test]
fn dispatch_counts_of_fused_and_unfused() -> Result<()> {
    let d = private_dev();
    let [b, h, t, hd] = [2, 3, 65, 64];
    let shape = [b, h, t, hd];
    let mut r = rng("counts");
    let seed = Arr::rand(&mut r, &shape, -1.0, 1.0).upload(&d);
    let leaves = [0, 1, 2].map(|_| {
        Arr::rand(&mut r, &shape, -2.0, 2.0)
            .upload(&d)
            .requires_grad()
    });
    // A fused (B, T, 3C) projection output split into head views, as in a GPT-2 block.
    let qkv = Arr::rand(&mut r, &[b, t, 3 * h * hd], -2.0, 2.0)
        .upload(&d)
        .requires_grad();
    let views = |x: &Tensor| -> Result<Vec<Tensor>> {
        let split = x.reshape(&[b, t, 3, h, hd])?;
        (0..3)
            .map(|i| split.narrow(2, i, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3]))
            .collect()
    };
    let count = |ins: &[Tensor], fused: bool| -> Result<(u64, u64)> {
        d.sync()?;
        let c0 = d.counters();
        let o = if fused {
            ins[0].causal_attention(&ins[1], &ins[2])?
        } else {
            ins[0].causal_attention_reference(&ins[1], &ins[2])?
        };
        o.backward_with(&seed)?;
        d.sync()?;
        let c = d.counters() - c0;
        Ok((c.forward_dispatches, c.backward_dispatches))
    };
    let first = count(&leaves, true)?;
    let steady = count(&leaves, true)?; // gradients accumulate into the leaves' buffers
    let reference = count(&leaves, false)?;
    let views_first = count(&views(&qkv)?, true)?;
    let views_steady = count(&views(&qkv)?, true)?;
    eprintln!(
        "dispatches (forward, backward) at {shape:?}: fused first {first:?}, fused after \
         {steady:?}, unfused {reference:?}; fused over qkv views first {views_first:?}, after \
         {views_steady:?}"
    );
    assert_eq!(first, (1, 2), "fused, new gradients");
    assert_eq!(steady, (1, 2), "fused, accumulated gradients");
    // No copies of the views; the first backward zero-fills the whole qkv gradient (the
    // engine does that for a gradient reached through views that do not cover it).
    assert_eq!(views_first, (1, 3), "fused over qkv views, new gradient");
    assert_eq!(
        views_steady,
        (1, 2),
        "fused over qkv views, accumulated gradient"
    );
    Ok(())
}

#[test]
fn forward_keeps_o_and_lse_not_the_probabilities() -> Result<()> {
    let d = private_dev();
    let [b, h, t, hd] = [1, 12, 128, 64];
    let [q, k, v] = qkv("saved", &[b, h, t, hd]);
    let leaves = [&q, &k, &v].map(|a| a.upload(&d).requires_grad());
    // Bytes that stay live from the forward until backward (the graph holds them).
    let held = |f: &dyn Fn(&[Tensor]) -> Result<Tensor>| -> Result<u64> {
        d.sync()?;
        let before = d.pool_stats().bytes_live;
        let o = f(&leaves)?;
        d.sync()?;
        let after = d.pool_stats().bytes_live;
        drop(o);
        Ok(after - before)
    };
    let fused = held(&|p| p[0].causal_attention(&p[1], &p[2]))?;
    let unfused = held(&|p| p[0].causal_attention_reference(&p[1], &p[2]))?;
    let f32s = |n: usize| 4 * n as u64;
    let (o_bytes, lse_bytes) = (f32s(b * h * t * hd), f32s(b * h * t));
    let probs = f32s(b * h * t * t);
    eprintln!(
        "bytes held from forward to backward at {:?}: fused {fused} (O {o_bytes} + lse \
         {lse_bytes}), unfused {unfused} (one T x T tensor per head: {probs})",
        [b, h, t, hd]
    );
    assert_eq!(
        fused,
        o_bytes + lse_bytes,
        "fused keeps O and lse (q, k, v are the inputs)"
    );
    assert!(
        unfused >= o_bytes + probs,
        "unfused keeps at least O and P: {unfused}"
    );
    Ok(())
}

#[test]
fn tiles_fit_32_kib_of_workgroup_memory() {
    for pass in [Pass::Forward, Pass::Dq, Pass::Dkv] {
        for dmax in HEAD_DIMS {
            let t = tile(pass, dmax);
            let bytes = t.workgroup_bytes(pass);
            let (declared, used) =
                workgroup_bytes_in_wgsl(pass.kernel(), &spec(pass, t, false, false));
            assert_eq!(
                bytes, declared,
                "{pass:?} {t:?}: Tile::workgroup_bytes vs the WGSL"
            );
            assert!(used <= declared);
            assert!(declared <= 32 << 10, "{pass:?} {t:?}: {declared} bytes");
            assert_eq!(t.lanes(), 128, "{pass:?} {t:?}");
            // Register blocks: [query][key] (BR x BC) tiles split evenly over the lane grid,
            // whose subgroups of 32 are 4 x 8 (`score_lane`); [query][d] tiles by vectors of 4
            // d's over COLL lanes; for dK and dV, [key][d] (BC x DMAX) by runs of 4 keys and
            // one vector of 4 d's a lane.
            assert_eq!(t.br % t.rowl, 0, "{pass:?} {t:?}: query rows per lane");
            assert_eq!(t.bc % t.coll, 0, "{pass:?} {t:?}: key columns per lane");
            assert_eq!(t.coll % 8, 0, "{pass:?} {t:?}: subgroups of 4 x 8 lanes");
            assert_eq!(t.bc % 4, 0, "{pass:?} {t:?}: keys in vectors of 4");
            if pass == Pass::Dkv {
                // Runs of 4 keys by vectors of 4 d's split evenly over the lanes, or (DKV_QS)
                // 2-8 lanes sharing one, each with a share of the queries.
                let pairs = t.bc / 4 * (dmax / 4);
                assert!(
                    t.lanes().is_multiple_of(pairs) || pairs.is_multiple_of(t.lanes()),
                    "{pass:?} {t:?}: (run of 4 keys, vector of 4 d's) pairs and lanes"
                );
                assert!(t.runs(pass), "{pass:?} {t:?}");
            } else {
                assert_eq!(
                    (dmax / 4) % t.coll,
                    0,
                    "{pass:?} {t:?}: vectors of head-dim columns per lane"
                );
            }
            eprintln!("{pass:?} DMAX={dmax}: {t:?}, {declared} bytes of workgroup memory");
        }
    }
    assert_eq!(head_dim_bucket(1), Some(32));
    assert_eq!(head_dim_bucket(33), Some(64));
    assert_eq!(head_dim_bucket(128), Some(128));
    assert_eq!(head_dim_bucket(129), None);
}

/// `causal_attention_merged` is `causal_attention` with the heads merged back, (B, T, H * D),
/// on q, k, v that are views of one fused (B, T, 3 * H * D) tensor (the model's layout): the
/// same output and gradients, with no copy of O forward nor of its gradient backward (two
/// dispatches fewer).
#[test]
fn merged_heads_are_the_permuted_output_without_its_copies() -> Result<()> {
    let d = private_dev();
    let (b, h, t, hd) = (2, 3, 37, 16);
    let c = h * hd;
    let mut r = rng("merged heads");
    let x = Arr::rand(&mut r, &[b, t, 3 * c], -2.0, 2.0);
    let w = Arr::rand(&mut r, &[b, t, c], -1.0, 1.0).upload(&d);
    let mut results = Vec::new();
    let mut dispatches = Vec::new();
    for merged in [true, false] {
        let qkv = x.upload(&d).requires_grad();
        let before = d.counters().dispatches;
        let heads = qkv.reshape(&[b, t, 3, h, hd])?;
        let part = |i: usize| heads.narrow(2, i, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3]);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let y = if merged {
            q.causal_attention_merged(&k, &v)?
        } else {
            q.causal_attention(&k, &v)?
                .permute(&[0, 2, 1, 3])?
                .reshape(&[b, t, c])?
        };
        assert_eq!(y.shape(), [b, t, c]);
        y.mul(&w)?.sum_all()?.backward()?;
        d.sync()?;
        dispatches.push(d.counters().dispatches - before);
        results.push([y.to_vec()?, qkv.grad().expect("reached").to_vec()?]);
    }
    for (i, what) in ["O", "the fused qkv gradient"].iter().enumerate() {
        let (merged, permuted) = (&results[0][i], &results[1][i]);
        let off = merged.iter().zip(permuted).filter(|(a, b)| a != b).count();
        assert_eq!(off, 0, "{what}: elements off, merged against permuted");
    }
    assert_eq!(
        dispatches[0] + 2,
        dispatches[1],
        "dispatches, merged then permuted: {dispatches:?}"
    );
    Ok(())
}

/// `causal_self_attention` on a fused (B, T, 3C) tensor is `causal_attention_merged` on its
/// head views, bit for bit (output and gradient), one dispatch fewer (the views' gradient
/// needs a zeroed buffer to add into; the fused input's is written whole by the kernels); also
/// when the fused tensor is itself a narrow view of a wider leaf (its heads are still views;
/// the views path reshapes it through a copy: a copy forward, a zeroed gradient and a copy
/// back, 3 dispatches) and when its gradient accumulates (the input used twice).
#[test]
fn self_attention_on_a_fused_qkv_is_the_merged_heads_without_a_fill() -> Result<()> {
    let d = private_dev();
    let (b, h, t, hd) = (2, 3, 37, 12);
    let c = h * hd;
    let mut r = rng("fused qkv");
    let x = Arr::rand(&mut r, &[b, t, 3 * c + 5], -2.0, 2.0);
    let w = Arr::rand(&mut r, &[b, t, c], -1.0, 1.0).upload(&d);
    for (wide, twice) in [(false, false), (true, false), (false, true)] {
        let mut results = Vec::new();
        let mut dispatches = Vec::new();
        for fused in [true, false] {
            let leaf = x.upload(&d).requires_grad();
            let before = d.counters().dispatches;
            let qkv = if wide {
                leaf.narrow(2, 2, 3 * c)?
            } else {
                leaf.narrow(2, 0, 3 * c)?.contiguous()?
            };
            let y = if fused {
                qkv.causal_self_attention(h)?
            } else {
                let heads = qkv.reshape(&[b, t, 3, h, hd])?;
                let part = |i: usize| heads.narrow(2, i, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3]);
                part(0)?.causal_attention_merged(&part(1)?, &part(2)?)?
            };
            let mut loss = y.mul(&w)?.sum_all()?;
            if twice {
                loss = loss.add(&qkv.square()?.sum_all()?)?;
            }
            loss.backward()?;
            d.sync()?;
            dispatches.push(d.counters().dispatches - before);
            results.push([y.to_vec()?, leaf.grad().expect("reached").to_vec()?]);
        }
        let tag = format!("wide {wide}, used twice {twice}");
        for (i, what) in ["O", "the input's gradient"].iter().enumerate() {
            let off = results[0][i]
                .iter()
                .zip(&results[1][i])
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(off, 0, "{tag}: {what}: elements off, fused against views");
        }
        let saved = if wide { 3 } else { 1 };
        assert_eq!(
            dispatches[0] + saved,
            dispatches[1],
            "{tag}: dispatches, fused then views: {dispatches:?}"
        );
    }
    let q = Tensor::zeros(&d, &[2, 5, 3 * 7])?;
    assert!(matches!(
        q.causal_self_attention(2),
        Err(Error::ShapeMismatch { .. })
    ));
    Ok(())
}
