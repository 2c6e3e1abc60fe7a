//! Grouped-query attention with rotary embedding under autocast (on adapters with cooperative
//! matrices the f16 kernels of attention_coop.wgsl, rotating q and k in f32 before rounding
//! them to f16, and dQ, dK back as they write them; elsewhere the f32 kernels) against the
//! unfused f32 reference (`rope_reference`, `causal_attention_grouped_reference`): O and the
//! packed qkv gradient, for f32 inputs, and for an f16 packed projection made by a linear
//! under autocast (whose gradient the kernels may write f16).
//!
//! Tolerance: as tests/attention_amp.rs, 2e-2 relative (f16 operands).

mod common;

use common::*;
use wgrad::ops::{autocast, Activation, Rope};
use wgrad::{DType, Result, Tensor};

const HALF_TOL: f64 = 2e-2;

/// The unfused f32 reference of `causal_self_attention_at` on packed `qkv`.
fn reference(
    qkv: &Tensor,
    (h, hkv, hd): (usize, usize, usize),
    rope: Option<(&Rope, usize)>,
) -> Result<Tensor> {
    let s = qkv.shape().to_vec();
    let part = |first: usize, n: usize| -> Result<Tensor> {
        qkv.narrow(2, first * hd, n * hd)?
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
        .reshape(&[s[0], s[1], h * hd])
}

/// (H, Hkv, D, T) and rotation (theta, start): the head dims the cooperative-matrix kernels
/// rotate (D = 32, 64, 128), odd T, groups of 1 to 4.
/// (H, Hkv, D, T), and the rotation's (theta, start).
type Case = ((usize, usize, usize, usize), Option<(f64, usize)>);

const CASES: [Case; 6] = [
    ((4, 4, 64, 37), Some((1e4, 0))),
    ((4, 2, 64, 130), Some((1e5, 9))),
    ((9, 3, 32, 65), Some((1e4, 100))),
    ((4, 1, 128, 70), Some((1e4, 3))),
    ((4, 2, 64, 33), None),
    ((6, 2, 40, 29), Some((1e4, 1))), // D over no fragment pair: the f32 kernels
];

#[test]
fn autocast_grouped_rope_attention_matches_the_f32_reference() -> Result<()> {
    let d = dev();
    let coop = wgrad::kernels::matmul_coop::Coop::available(d.gpu()).is_some();
    eprintln!("cooperative matrices: {coop}");
    for ((h, hkv, hd, t), spec) in CASES {
        let tag = format!("H {h} Hkv {hkv} D {hd} T {t} rope {spec:?}");
        let mut r = rng(&tag);
        let b = 2;
        let x = Arr::rand(&mut r, &[b, t, (h + 2 * hkv) * hd], -1.0, 1.0).upload(d);
        let w = Arr::rand(&mut r, &[b, t, h * hd], -1.0, 1.0).upload(d);
        let table = match spec {
            Some((theta, start)) => Some((Rope::new(d, theta, hd, start + t)?, start)),
            None => None,
        };
        let rope = table.as_ref().map(|(r, s)| (r, *s));
        let run = |fused: bool| -> Result<(Vec<f32>, Vec<f32>)> {
            let x = x.detach().requires_grad();
            let o = if fused {
                autocast(true, || {
                    x.causal_self_attention_at(h, hkv, rope.map(|r| r.0), rope.map_or(0, |r| r.1))
                })?
            } else {
                reference(&x, (h, hkv, hd), rope)?
            };
            o.mul(&w)?.sum_all()?.backward()?;
            Ok((o.to_vec()?, x.grad().expect("reached").to_vec()?))
        };
        let (o, g) = run(true)?;
        let (o_ref, g_ref) = run(false)?;
        assert_close(&o, &as_f64(&o_ref), HALF_TOL, &format!("O, {tag}"));
        assert_close(&g, &as_f64(&g_ref), HALF_TOL, &format!("d(qkv), {tag}"));
    }
    Ok(())
}

/// The packed projection made f16 by a linear under autocast, as a Llama block would (the
/// kernels read it f16 and may write its gradient f16, the linear's only input), then the
/// output projection; gradients of x and both weights against the f32 chain.
#[test]
fn autocast_grouped_rope_between_linears_with_f16_qkv_matches_the_reference() -> Result<()> {
    let d = dev();
    for ((h, hkv, hd, t), spec) in CASES {
        let tag = format!("H {h} Hkv {hkv} D {hd} T {t} rope {spec:?}");
        let mut r = rng(&format!("linears {tag}"));
        let (b, c) = (2, h * hd);
        let packed = (h + 2 * hkv) * hd;
        let x0 = Arr::rand(&mut r, &[b, t, c], -1.0, 1.0).upload(d);
        // Weights of GPT-2's test scale at C = 192 (0.2), shrunk as 1 / sqrt(C): dx's f16
        // rounding error grows with the width it sums over.
        let a = 0.2 * (192.0 / c as f32).sqrt();
        let w10 = Arr::rand(&mut r, &[c, packed], -a, a).upload(d);
        let w20 = Arr::rand(&mut r, &[c, c], -a, a).upload(d);
        let g = Arr::rand(&mut r, &[b, t, c], -1.0, 1.0).upload(d);
        let table = match spec {
            Some((theta, start)) => Some((Rope::new(d, theta, hd, start + t)?, start)),
            None => None,
        };
        let rope = table.as_ref().map(|(r, s)| (r, *s));
        let chain = |fused: bool| -> Result<Vec<Vec<f32>>> {
            let leaves = [&x0, &w10, &w20].map(|t| t.detach().requires_grad());
            let [x, w1, w2] = &leaves;
            let y = if fused {
                autocast(true, || -> Result<Tensor> {
                    let qkv = x.linear_as(w1, None, Activation::None, DType::F16)?;
                    let (r, start) = (rope.map(|r| r.0), rope.map_or(0, |r| r.1));
                    let o = qkv.causal_self_attention_at(h, hkv, r, start)?;
                    o.linear(w2, None, Activation::None)
                })?
            } else {
                let qkv = x.linear(w1, None, Activation::None)?;
                reference(&qkv, (h, hkv, hd), rope)?.linear(w2, None, Activation::None)?
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
        for (i, name) in ["y", "dx", "dW1", "dW2"].iter().enumerate() {
            assert_close(
                &got[i],
                &as_f64(&want[i]),
                HALF_TOL,
                &format!("{name}, {tag}"),
            );
        }
    }
    Ok(())
}
