//! Fused causal attention under autocast (the mixed-precision path: on adapters with
//! cooperative matrices its products run in f16 with f32 accumulation, softmax and statistics
//! in f32; elsewhere the f32 kernels run) against the unfused f32 reference: O and the
//! gradients of q, k, v, with q, k, v head-split views of one fused (B, T, 3C) tensor as GPT-2
//! makes them, odd T, padded head dims, and inputs that cannot take the four-wide reads.
//!
//! Tolerance: |got - want| / max(|want|, 1) under 2e-2 (f16 operands: the rounding of q, k, v
//! and of P and dS to f16 costs about 1e-3 here).

mod common;

use common::*;
use wgrad::ops::autocast;
use wgrad::{Result, Tensor};

const HALF_TOL: f64 = 2e-2;

/// q, k, v: (B, H, T, D) head views of a fused (B, T, 3 H D) projection output, as GPT-2 splits it.
fn heads(x: &Tensor, [b, h, t, d]: [usize; 4]) -> Result<(Tensor, Tensor, Tensor)> {
    let split = x.reshape(&[b, t, 3, h, d])?;
    let part = |i| -> Result<Tensor> {
        split
            .narrow(2, i, 1)?
            .reshape(&[b, t, h, d])?
            .transpose(1, 2)
    };
    Ok((part(0)?, part(1)?, part(2)?))
}

/// O and the gradients of sum(O * w) with respect to the fused (B, T, 3, H, D) input, by
/// `fused` (under autocast) or by the unfused f32 reference.
fn run(
    x: &Tensor,
    w: &Tensor,
    [b, h, t, d]: [usize; 4],
    fused: bool,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let x = x.detach().requires_grad();
    let (q, k, v) = heads(&x, [b, h, t, d])?;
    let o = if fused {
        autocast(true, || q.causal_attention(&k, &v))?
    } else {
        q.causal_attention_reference(&k, &v)?
    };
    o.mul(w)?.sum_all()?.backward()?;
    Ok((
        o.to_vec()?,
        x.grad().expect("reached by backward").to_vec()?,
    ))
}

#[test]
fn autocast_attention_matches_the_f32_reference() -> Result<()> {
    let d = dev();
    for shape in [
        [1, 1, 1, 64],
        [2, 3, 37, 64],
        [1, 2, 130, 64],
        [2, 2, 65, 32],
        [1, 1, 100, 128],
        [1, 2, 33, 40],
        [1, 2, 29, 6],
    ] {
        let [b, h, t, hd] = shape;
        let mut r = rng(&format!("amp attention {shape:?}"));
        let x = Arr::rand(&mut r, &[b, t, 3 * h * hd], -1.0, 1.0).upload(d);
        let w = Arr::rand(&mut r, &[b, h, t, hd], -1.0, 1.0).upload(d);
        let (o, g) = run(&x, &w, shape, true)?;
        let (o_ref, g_ref) = run(&x, &w, shape, false)?;
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        assert_close(&o, &f64s(&o_ref), HALF_TOL, &format!("O {shape:?}"));
        assert_close(&g, &f64s(&g_ref), HALF_TOL, &format!("d(qkv) {shape:?}"));
    }
    Ok(())
}

/// Scores that grow along the keys, s(i, j) about 8 slope j / T, so from block to block of 16
/// keys a row's max rises by about 128 slope / T: by more than the forward's RESCALE (8) at
/// slopes 12 (T = 130) and 20 (T = 200), so every block moves it and O's rows are rescaled; by
/// about 3 at slope 3 (a stale max, P above 1, moving every third block); a slope of -6 never
/// moves it after the first block. O, and the gradients, which read the forward's lse, against
/// the reference.
#[test]
fn autocast_attention_with_scores_that_grow_along_the_keys() -> Result<()> {
    let d = dev();
    for (shape, slope) in [
        ([1, 2, 130, 64], 12.0),
        ([1, 2, 130, 64], 3.0),
        ([2, 1, 100, 64], -6.0),
        ([1, 1, 200, 32], 20.0),
    ] {
        let [b, h, t, hd] = shape;
        let mut r = rng(&format!("amp attention growing {shape:?} {slope}"));
        // x is (B, T, 3, H, D): q = 1 + u, k = u + slope (8 / sqrt(D)) t / T, v = u, u in
        // [-0.5, 0.5], so s(i, j) = q . k / sqrt(D) is about 8 slope j / T (plus noise).
        let mut x = Arr::rand(&mut r, &[b, t, 3 * h * hd], -0.5, 0.5);
        let scale = 8.0 / (hd as f64).sqrt();
        for (i, e) in x.data.iter_mut().enumerate() {
            let ti = (i / (3 * h * hd)) % t;
            match (i / (h * hd)) % 3 {
                0 => *e += 1.0,
                1 => *e += slope * scale * ti as f64 / t as f64,
                _ => {}
            }
        }
        let x = x.upload(d);
        let w = Arr::rand(&mut r, &[b, h, t, hd], -1.0, 1.0).upload(d);
        let (o, g) = run(&x, &w, shape, true)?;
        let (o_ref, g_ref) = run(&x, &w, shape, false)?;
        let what = format!("{shape:?}, slope {slope}");
        assert_close(&o, &as_f64(&o_ref), HALF_TOL, &format!("O {what}"));
        assert_close(&g, &as_f64(&g_ref), HALF_TOL, &format!("d(qkv) {what}"));
    }
    Ok(())
}

/// Two backward passes add their gradients into the same leaf: through the head views of
/// `causal_attention` (the second pass's gradients added into the first's), and through
/// `causal_self_attention` on the fused input (its second backward's kernel adds dQ, dK and dV
/// into the existing gradient through its views of it: rows of a whole tile straight from the
/// accumulators, the edge of T, and D under its bucket, through the scratch).
#[test]
fn autocast_attention_gradients_accumulate() -> Result<()> {
    let d = dev();
    for shape in [[1, 2, 130, 64], [1, 2, 33, 40]] {
        let [b, h, t, hd] = shape;
        let mut r = rng(&format!("amp attention accumulate {shape:?}"));
        let x0 = Arr::rand(&mut r, &[b, t, 3 * h * hd], -1.0, 1.0).upload(d);
        let w = Arr::rand(&mut r, &[b, h, t, hd], -1.0, 1.0).upload(d);
        let (_, g_ref) = run(&x0, &w, shape, false)?;
        let twice: Vec<f64> = g_ref.iter().map(|&x| 2.0 * x as f64).collect();
        for fused in [false, true] {
            let x = x0.detach().requires_grad();
            for _ in 0..2 {
                let o = if fused {
                    let o = autocast(true, || x.causal_self_attention(h))?;
                    o.reshape(&[b, t, h, hd])?.transpose(1, 2)?
                } else {
                    let (q, k, v) = heads(&x, shape)?;
                    autocast(true, || q.causal_attention(&k, &v))?
                };
                o.mul(&w)?.sum_all()?.backward()?;
            }
            let g = x.grad().expect("reached by backward").to_vec()?;
            let what = format!("2 x d(qkv) {shape:?}, fused qkv {fused}");
            assert_close(&g, &twice, HALF_TOL, &what);
        }
    }
    Ok(())
}

/// One tensor as two or three of q, k, v (its gradient the sum of theirs) under autocast
/// against the f32 reference: the backward's gradients, written side by side into one buffer,
/// reach one leaf more than once.
#[test]
fn autocast_attention_with_a_tensor_as_two_or_three_inputs() -> Result<()> {
    let d = dev();
    let shape = [1, 2, 65, 64];
    let mut r = rng("amp attention shared inputs");
    let a0 = Arr::rand(&mut r, &shape, -1.0, 1.0).upload(d);
    let b0 = Arr::rand(&mut r, &shape, -1.0, 1.0).upload(d);
    let w = Arr::rand(&mut r, &shape, -1.0, 1.0).upload(d);
    // (which inputs are a, the rest b): k = v, then q = k = v.
    for shared in [[false, true, true], [true, true, true]] {
        let grads = |fused: bool| -> Result<Vec<Vec<f32>>> {
            let (a, b) = (a0.detach().requires_grad(), b0.detach().requires_grad());
            let [q, k, v] = shared.map(|s| if s { a.clone() } else { b.clone() });
            let o = if fused {
                autocast(true, || q.causal_attention(&k, &v))?
            } else {
                q.causal_attention_reference(&k, &v)?
            };
            o.mul(&w)?.sum_all()?.backward()?;
            let mut out = vec![a.grad().expect("a is an input").to_vec()?];
            if let Some(g) = b.grad() {
                out.push(g.to_vec()?);
            }
            Ok(out)
        };
        let (got, want) = (grads(true)?, grads(false)?);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            let w: Vec<f64> = w.iter().map(|&x| x as f64).collect();
            assert_close(g, &w, HALF_TOL, &format!("inputs shared as {shared:?}"));
        }
    }
    Ok(())
}

/// `causal_self_attention` (the model's call: the fused (B, T, 3C) input, O merged to
/// (B, T, C), dQ, dK, dV written into one gradient) under autocast against the f32 reference.
#[test]
fn autocast_self_attention_on_a_fused_qkv_matches_the_reference() -> Result<()> {
    let d = dev();
    for shape in [[2, 3, 37, 64], [1, 2, 130, 64], [1, 2, 33, 40]] {
        let [b, h, t, hd] = shape;
        let mut r = rng(&format!("amp self attention {shape:?}"));
        let x0 = Arr::rand(&mut r, &[b, t, 3 * h * hd], -1.0, 1.0).upload(d);
        let w = Arr::rand(&mut r, &[b, h, t, hd], -1.0, 1.0).upload(d);
        let (o_ref, g_ref) = run(&x0, &w, shape, false)?;
        let x = x0.detach().requires_grad();
        let o = autocast(true, || x.causal_self_attention(h))?; // (B, T, C)
        let o = o.reshape(&[b, t, h, hd])?.transpose(1, 2)?; // (B, H, T, D), as the reference
        o.mul(&w)?.sum_all()?.backward()?;
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let o = o.contiguous()?.to_vec()?;
        assert_close(&o, &f64s(&o_ref), HALF_TOL, &format!("O {shape:?}"));
        let g = x.grad().expect("reached by backward").to_vec()?;
        assert_close(&g, &f64s(&g_ref), HALF_TOL, &format!("d(qkv) {shape:?}"));
    }
    Ok(())
}

/// The model's attention under autocast between two linears: the qkv projection stored f16
/// (`linear_as`), the attention reading it, its output (f16 where the cooperative-matrix
/// kernels ran, f32 after a cast elsewhere) read by the output projection, and backward through
/// both (on the cooperative-matrix kernels the projection's dX writes dO f16 and the attention
/// writes the qkv gradient f16, each the only contribution there). The gradients of x and of
/// both weights and the bias against the f32 chain with the unfused reference attention.
#[test]
fn autocast_attention_between_linears_with_f16_qkv_matches_the_reference() -> Result<()> {
    use wgrad::ops::Activation;
    use wgrad::DType;
    let d = dev();
    let coop = wgrad::kernels::matmul_coop::Coop::available(d.gpu()).is_some();
    for [b, h, t, hd] in [[2, 3, 37, 64], [1, 2, 130, 32]] {
        let c = h * hd;
        let shape = [b, h, t, hd];
        let mut r = rng(&format!("amp attention f16 qkv {shape:?}"));
        let x0 = Arr::rand(&mut r, &[b, t, c], -1.0, 1.0).upload(d);
        let w10 = Arr::rand(&mut r, &[c, 3 * c], -0.2, 0.2).upload(d);
        let b10 = Arr::rand(&mut r, &[3 * c], -0.5, 0.5).upload(d);
        let w20 = Arr::rand(&mut r, &[c, c], -0.2, 0.2).upload(d);
        let g = Arr::rand(&mut r, &[b, t, c], -1.0, 1.0).upload(d);
        let chain = |fused: bool| -> Result<Vec<Vec<f32>>> {
            let leaves = [&x0, &w10, &b10, &w20].map(|t| t.detach().requires_grad());
            let [x, w1, b1, w2] = &leaves;
            let y = if fused {
                autocast(true, || -> Result<Tensor> {
                    let qkv = x.linear_as(w1, Some(b1), Activation::None, DType::F16)?;
                    assert_eq!(qkv.dtype(), DType::F16);
                    let o = qkv.causal_self_attention(h)?;
                    let want = if coop { DType::F16 } else { DType::F32 };
                    assert_eq!(o.dtype(), want, "O's type (cooperative matrices: {coop})");
                    o.linear(w2, None, Activation::None)
                })?
            } else {
                let qkv = x.linear(w1, Some(b1), Activation::None)?;
                let (q, k, v) = heads(&qkv, shape)?;
                let o = q.causal_attention_reference(&k, &v)?;
                let o = o.transpose(1, 2)?.contiguous()?.reshape(&[b, t, c])?;
                o.linear(w2, None, Activation::None)?
            };
            y.backward_with(&g)?;
            let mut out = vec![y.to_vec()?];
            for l in &leaves {
                out.push(l.grad().expect("reached by backward").to_vec()?);
            }
            Ok(out)
        };
        let got = chain(true)?;
        let want = chain(false)?;
        for (i, name) in ["y", "dx", "dW1", "db1", "dW2"].iter().enumerate() {
            let want: Vec<f64> = want[i].iter().map(|&v| v as f64).collect();
            assert_close(&got[i], &want, HALF_TOL, &format!("{name} {shape:?}"));
        }
    }
    Ok(())
}
