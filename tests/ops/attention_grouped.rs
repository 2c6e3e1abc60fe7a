//! Grouped-query causal self-attention with rotary position embedding
//! (`causal_self_attention_at` on a packed (B, T, (H + 2 Hkv) D) projection) against an f64
//! CPU reference of the output and of the packed gradient (`common::reference::
//! grouped_attention`, reading the same rotary table), against finite differences, and the
//! unfused reference (`rope_reference`, `causal_attention_grouped_reference`, which also runs
//! head dims over the kernels'). Also the table against f64 trigonometry, the errors, and the
//! H = Hkv, no-rotation case against `causal_self_attention`.
//!
//! Sizes are odd on purpose: T not a multiple of any block, H = 9, D = 20 (not a multiple of 4).

use crate::common::reference::{grouped_attention, RopeTable};
use crate::common::*;
use wgrad::autograd::gradcheck::{self, Input};
use wgrad::ops::Rope;
use wgrad::{Error, Result, Tensor};

/// Forward within 1e-4 of the f64 reference (relative, `assert_close`), gradients within 1e-3.
const GRAD_TOL: f64 = 1e-3;

/// O and the packed input's gradient of sum(O * w) from the fused op (or, `reference`, from
/// the unfused ops).
fn run(
    x: &Arr,
    w: &Arr,
    (h, hkv): (usize, usize),
    rope: Option<(&Rope, usize)>,
    reference: bool,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let d = dev();
    let x = x.upload(d).requires_grad();
    let o = if reference {
        let s = x.shape().to_vec();
        let hd = s[2] / (h + 2 * hkv);
        let part = |first: usize, n: usize| -> Result<Tensor> {
            x.narrow(2, first * hd, n * hd)?
                .reshape(&[s[0], s[1], n, hd])?
                .permute(&[0, 2, 1, 3])
        };
        let (mut q, mut k, v) = (part(0, h)?, part(h, hkv)?, part(h + hkv, hkv)?);
        if let Some((r, start)) = rope {
            q = q.rope_reference(r, start)?;
            k = k.rope_reference(r, start)?;
        }
        q.causal_attention_grouped_reference(&k, &v)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[s[0], s[1], h * hd])?
    } else {
        let (r, start) = match rope {
            Some((r, s)) => (Some(r), s),
            None => (None, 0),
        };
        x.causal_self_attention_at(h, hkv, r, start)?
    };
    o.mul(&w.upload(d))?.sum_all()?.backward()?;
    Ok((
        o.to_vec()?,
        x.grad().expect("reached by backward").to_vec()?,
    ))
}

/// The f64 reference of `run`.
fn want(
    x: &Arr,
    w: &Arr,
    (h, hkv): (usize, usize),
    rope: Option<(&Rope, usize)>,
) -> Result<(Arr, Arr)> {
    let table = match rope {
        Some((r, _)) => as_f64(&r.table().to_vec()?),
        None => Vec::new(),
    };
    let hd = x.shape[2] / (h + 2 * hkv);
    let t = RopeTable {
        rows: &table,
        d: hd,
    };
    Ok(grouped_attention(
        x,
        h,
        hkv,
        rope.map(|(_, start)| (&t, start)),
        w,
    ))
}

/// Every (H, Hkv) and head dim, with T 37 or 130, and rotations in turn: none, theta 1e4 and
/// 1e5 from position 0, and from positions 7 and 100.
#[test]
fn grouped_rope_attention_matches_f64_reference() -> Result<()> {
    let d = dev();
    let ropes = [
        None,
        Some((1e4, 0)),
        Some((1e5, 0)),
        Some((1e4, 7)),
        Some((1e5, 100)),
    ];
    let mut case = 0;
    let mut worst = [0.0f64; 2];
    for (h, hkv) in [(4, 4), (4, 2), (9, 3), (4, 1)] {
        for hd in [16, 20, 32, 64, 128] {
            let t = [37, 130][case % 2];
            let spec = ropes[case % ropes.len()];
            case += 1;
            let tag = format!("H {h} Hkv {hkv} D {hd} T {t} rope {spec:?}");
            let mut r = rng(&tag);
            let x = Arr::rand(&mut r, &[2, t, (h + 2 * hkv) * hd], -2.0, 2.0);
            let w = Arr::rand(&mut r, &[2, t, h * hd], -1.0, 1.0);
            let table = match spec {
                Some((theta, start)) => Some((Rope::new(d, theta, hd, start + t + 3)?, start)),
                None => None,
            };
            let rope = table.as_ref().map(|(r, s)| (r, *s));
            poison(d, 2 * t * h * hd);
            let (o, g) = run(&x, &w, (h, hkv), rope, false)?;
            let (o_want, g_want) = want(&x, &w, (h, hkv), rope)?;
            assert_close(&o, &o_want.data, TOL, &format!("O, {tag}"));
            assert_close(&g, &g_want.data, GRAD_TOL, &format!("d(qkv), {tag}"));
            worst[0] = worst[0].max(rel(&o, &o_want.data));
            worst[1] = worst[1].max(rel(&g, &g_want.data));
        }
    }
    eprintln!(
        "against f64: worst error of O {:.1e}, of d(qkv) {:.1e}",
        worst[0], worst[1]
    );
    Ok(())
}

/// The worst |got - want| / max(|want|, 1), for the log.
fn rel(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs() / w.abs().max(1.0))
        .fold(0.0, f64::max)
}

/// Every rotation setting on one grouped shape, and the unfused reference (f32 ops) on the
/// same inputs; a head dim over the kernels' (160) runs through the unfused ops.
#[test]
fn unfused_reference_and_large_head_dims_match_f64() -> Result<()> {
    let d = dev();
    for (hd, t) in [(32, 37), (160, 21)] {
        for spec in [None, Some((1e4, 0)), Some((1e5, 5))] {
            let (h, hkv) = (4, 2);
            let tag = format!("D {hd} T {t} rope {spec:?}");
            let mut r = rng(&tag);
            let x = Arr::rand(&mut r, &[2, t, (h + 2 * hkv) * hd], -2.0, 2.0);
            let w = Arr::rand(&mut r, &[2, t, h * hd], -1.0, 1.0);
            let table = match spec {
                Some((theta, start)) => Some((Rope::new(d, theta, hd, start + t)?, start)),
                None => None,
            };
            let rope = table.as_ref().map(|(r, s)| (r, *s));
            let (o_want, g_want) = want(&x, &w, (h, hkv), rope)?;
            for reference in [false, true] {
                let (o, g) = run(&x, &w, (h, hkv), rope, reference)?;
                let tag = format!("{tag}, unfused {reference}");
                assert_close(&o, &o_want.data, TOL, &format!("O, {tag}"));
                assert_close(&g, &g_want.data, GRAD_TOL, &format!("d(qkv), {tag}"));
            }
        }
    }
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let d = dev();
    let (h, hkv, hd, t) = (4, 2, 6, 7);
    let rope = Rope::new(d, 1e4, hd, 20)?;
    let table = as_f64(&rope.table().to_vec()?);
    let mut r = rng("grouped gradcheck");
    let shape = [1, t, (h + 2 * hkv) * hd];
    let n: usize = shape.iter().product();
    let inputs = [Input {
        data: rand_vec(&mut r, n, -1.5, 1.5),
        shape: shape.to_vec(),
    }];
    let w = Arr::rand(&mut r, &[1, t, h * hd], -1.0, 1.0);
    let wt = w.upload(d);
    let report = gradcheck::check(
        d,
        &inputs,
        |p| {
            p[0].causal_self_attention_at(h, hkv, Some(&rope), 3)?
                .mul(&wt)?
                .sum_all()
        },
        |x| {
            let rows = RopeTable {
                rows: &table,
                d: hd,
            };
            let (o, _) = grouped_attention(
                &Arr::new(&shape, x[0].clone()),
                h,
                hkv,
                Some((&rows, 3)),
                &w,
            );
            o.data.iter().zip(&w.data).map(|(a, b)| a * b).sum()
        },
        1e-3,
        1e-4,
    )?;
    eprintln!("gradcheck: {report:?}");
    Ok(())
}

/// The table against f64 trigonometry of pos / theta^(2i / D) (the f32 inv_freq and angle
/// cost about pos x 1e-7), and rotate_half's layout: cosines then sines.
#[test]
fn rope_table_is_cos_then_sin_of_the_angles() -> Result<()> {
    let d = dev();
    let (hd, n) = (64, 300);
    let rope = Rope::new(d, 1e4, hd, n)?;
    assert_eq!(rope.table().shape(), [n, hd]);
    let got = rope.table().to_vec()?;
    for pos in 0..n {
        for i in 0..hd / 2 {
            let angle = pos as f64 / 1e4f64.powf((2 * i) as f64 / hd as f64);
            let tol = 1e-6 + 2e-7 * pos as f64;
            let (c, s) = (got[pos * hd + i] as f64, got[pos * hd + hd / 2 + i] as f64);
            assert!((c - angle.cos()).abs() < tol, "cos at {pos}, {i}: {c}");
            assert!((s - angle.sin()).abs() < tol, "sin at {pos}, {i}: {s}");
        }
    }
    Ok(())
}

/// H = Hkv without rotation is `causal_self_attention`, bit for bit.
#[test]
fn ungrouped_unrotated_is_causal_self_attention() -> Result<()> {
    let d = dev();
    let (h, hd, t) = (3, 20, 37);
    let x = Arr::rand(&mut rng("ungrouped"), &[2, t, 3 * h * hd], -2.0, 2.0);
    let w = Arr::rand(&mut rng("ungrouped w"), &[2, t, h * hd], -1.0, 1.0);
    let mut results = Vec::new();
    for grouped in [false, true] {
        let x = x.upload(d).requires_grad();
        let o = if grouped {
            x.causal_self_attention_grouped(h, h, None)?
        } else {
            x.causal_self_attention(h)?
        };
        o.mul(&w.upload(d))?.sum_all()?.backward()?;
        results.push((o.to_vec()?, x.grad().expect("reached").to_vec()?));
    }
    assert_eq!(results[0], results[1]);
    Ok(())
}

#[test]
fn bad_heads_and_tables_are_errors() -> Result<()> {
    let d = dev();
    match Rope::new(d, 1e4, 7, 16) {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("odd head dim: {:?}", other.map(|_| ())),
    }
    let x = Tensor::zeros(d, &[1, 5, 8 * 8])?;
    // 4 query heads do not share 3 kv heads; 8 x 8 is not (4 + 2 x 3) heads of D.
    assert!(matches!(
        x.causal_self_attention_grouped(4, 3, None),
        Err(Error::ShapeMismatch { .. })
    ));
    let rope = Rope::new(d, 1e4, 16, 6)?;
    // D = 8 against a table of D = 16; then positions 2..7 past a table of 6.
    let e = x
        .causal_self_attention_grouped(4, 2, Some(&rope))
        .expect_err("head dim");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let x = Tensor::zeros(d, &[1, 5, 6 * 16])?;
    let e = x
        .causal_self_attention_at(4, 1, Some(&rope), 2)
        .expect_err("positions");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    x.causal_self_attention_at(4, 1, Some(&rope), 1)?;
    Ok(())
}
