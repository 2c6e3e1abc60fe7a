//! Leaves that are views: a leaf made from a strided view of another tensor, and parameters
//! inside a flat `nn::Parameters` chunk, whose gradients must land at their own elements.

use crate::common::*;
use crate::{all_pass, draw, fd_grad, Dom, GRAD_TOL, R};
use wgrad::Tensor;

/// A leaf made from a strided view of another tensor (`a.narrow(..).requires_grad()`,
/// `a.t().requires_grad()`): its gradient has the leaf's logical shape, and views of the leaf
/// must map into it by logical position.
fn check_strided_leaf(
    tag: &str,
    base_shape: &[usize],
    leaf_of: impl Fn(&Tensor) -> R,
    leaf_ref: impl Fn(&Arr) -> Arr,
    gpu: impl Fn(&Tensor) -> R,
    cpu: impl Fn(&Arr) -> Arr,
) -> Result<(), String> {
    let d = dev();
    let mut r = rng(tag);
    let base = draw(&mut r, base_shape, Dom::Sym(1.0));
    let x = leaf_ref(&base);
    let w = draw(&mut r, &cpu(&x).shape, Dom::Sym(1.5));
    let want = fd_grad(&x, &|a| cpu(a).zip(&w, |p, q| p * q).sum_all());
    poison(d, x.numel());
    let leaf = leaf_of(&base.upload(d)).unwrap().requires_grad();
    gpu(&leaf)
        .and_then(|y| y.mul(&w.upload(d)))
        .and_then(|y| y.sum_all())
        .and_then(|l| l.backward())
        .map_err(|e| format!("`{tag}`: {e}"))?;
    let g = leaf.grad().ok_or_else(|| format!("`{tag}`: no gradient"))?;
    if g.shape() != &x.shape[..] {
        return Err(format!(
            "`{tag}`: gradient of shape {:?}, want {:?}",
            g.shape(),
            x.shape
        ));
    }
    let got = g.to_vec().unwrap();
    let err = |i: usize| (got[i] as f64 - want[i]).abs() / want[i].abs().max(1.0);
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| err(i).is_nan() || err(i) > GRAD_TOL)
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    let round = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(format!(
        "`{tag}`: {} of {} gradient elements off (error over {GRAD_TOL:e});\n    got  [{}]\n    want [{}]",
        bad.len(),
        got.len(),
        round(&got.iter().map(|&v| v as f64).collect::<Vec<_>>()),
        round(&want),
    ))
}

#[test]
fn grad_of_a_leaf_that_is_a_column_slice() {
    let leaf = |t: &Tensor| t.narrow(1, 1, 3);
    let leaf_ref = |a: &Arr| a.narrow(1, 1, 3);
    all_pass(vec![
        check_strided_leaf(
            "[4, 5].narrow(1, 1, 3) leaf, exp",
            &[4, 5],
            leaf,
            leaf_ref,
            |x| x.exp(),
            |a| a.map(f64::exp),
        ),
        check_strided_leaf(
            "[4, 5].narrow(1, 1, 3) leaf, t()",
            &[4, 5],
            leaf,
            leaf_ref,
            |x| x.t(),
            |a| a.t(),
        ),
        check_strided_leaf(
            "[4, 5].narrow(1, 1, 3) leaf, narrow(0, 1, 2)",
            &[4, 5],
            leaf,
            leaf_ref,
            |x| x.narrow(0, 1, 2),
            |a| a.narrow(0, 1, 2),
        ),
    ]);
}

#[test]
fn grad_of_a_leaf_that_is_a_transposed_view() {
    let leaf = |t: &Tensor| t.t();
    let leaf_ref = |a: &Arr| a.t();
    all_pass(vec![
        check_strided_leaf(
            "[5, 3].t() leaf, exp",
            &[5, 3],
            leaf,
            leaf_ref,
            |x| x.exp(),
            |a| a.map(f64::exp),
        ),
        check_strided_leaf(
            "[5, 3].t() leaf, narrow(1, 1, 3)",
            &[5, 3],
            leaf,
            leaf_ref,
            |x| x.narrow(1, 1, 3),
            |a| a.narrow(1, 1, 3),
        ),
        check_strided_leaf(
            "[5, 3].t() leaf, t()",
            &[5, 3],
            leaf,
            leaf_ref,
            |x| x.t(),
            |a| a.t(),
        ),
    ]);
}

/// Parameters from `nn::Parameters` are views into one flat chunk, their gradients views into
/// the chunk's gradient buffer (at the parameter's offset): a view of a parameter (a tied
/// embedding's `w.t()`, a slice) must route its gradient to that parameter's own region.
#[test]
fn grad_of_views_of_parameters_in_a_flat_chunk() {
    use wgrad::nn::{ParamSpec, Parameters};
    let d = dev();
    let spec = |name: &str, shape: &[usize]| ParamSpec {
        name: name.into(),
        shape: shape.to_vec(),
        decay: true,
    };
    let params = Parameters::new(d, &[spec("a", &[4]), spec("w", &[6, 4])]).unwrap();
    let (a, w) = (params.get("a").unwrap(), params.get("w").unwrap());
    let mut r = rng("flat chunk views");
    let av = draw(&mut r, &[4], Dom::Sym(1.0));
    let wv = draw(&mut r, &[6, 4], Dom::Sym(1.0));
    a.copy_from_slice(&av.f32s()).unwrap();
    w.copy_from_slice(&wv.f32s()).unwrap();
    let c = draw(&mut r, &[4], Dom::Sym(1.5));
    let x = draw(&mut r, &[3, 4], Dom::Sym(1.5));
    let gw = draw(&mut r, &[3, 6], Dom::Sym(1.5));
    let h = draw(&mut r, &[3, 4], Dom::Sym(1.5));
    let up = |v: &Arr| v.upload(d);
    let mut results: Vec<Result<(), String>> = Vec::new();
    let mut compare = |what: &str, t: &Tensor, want: &Arr| {
        let got = t.grad().expect("a gradient").to_vec().unwrap();
        let bad = got.iter().zip(&want.data).any(|(&g, &w)| {
            let e = (g as f64 - w).abs() / w.abs().max(1.0);
            e.is_nan() || e > GRAD_TOL
        });
        if bad {
            let show = |v: &mut dyn Iterator<Item = f64>| {
                v.map(|x| format!("{x:.4}")).collect::<Vec<_>>().join(", ")
            };
            results.push(Err(format!(
                "{what}:\n    got  [{}]\n    want [{}]",
                show(&mut got.iter().map(|&v| v as f64)),
                show(&mut want.data.iter().copied())
            )));
        }
    };

    // sum(a * c) + sum((x @ w.t()) * gw) + sum(w.narrow(0, 2, 3) * h)
    let loss = a
        .mul(&up(&c))
        .unwrap()
        .sum_all()
        .unwrap()
        .add(
            &up(&x)
                .matmul(&w.t().unwrap())
                .unwrap()
                .mul(&up(&gw))
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap()
        .add(
            &w.narrow(0, 2, 3)
                .unwrap()
                .mul(&up(&h))
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap();
    loss.backward().unwrap();
    let want_w = gw.t().matmul(&x).zip(
        &Arr::build(&[6, 4], |i| {
            if (2..5).contains(&i[0]) {
                h.at(&[i[0] - 2, i[1]])
            } else {
                0.0
            }
        }),
        |p, q| p + q,
    );
    compare("a (after backward through views of w)", a, &c);
    compare("w (through w.t() and w.narrow)", w, &want_w);

    // Only views of w, after zero_grad: the slice-only contribution lands in w's region.
    params.zero_grad();
    w.narrow(0, 2, 3)
        .unwrap()
        .mul(&up(&h))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let want_slice = Arr::build(&[6, 4], |i| {
        if (2..5).contains(&i[0]) {
            h.at(&[i[0] - 2, i[1]])
        } else {
            0.0
        }
    });
    compare("w (slice only, after zero_grad)", w, &want_slice);
    assert!(
        a.grad().is_none(),
        "a got a gradient from a loss over w alone"
    );
    all_pass(results);
}
