//! Concatenation: values against the host's, each part's gradient its slice of the output's,
//! strided parts, f16, and the shapes and types refused.

use crate::common::*;
use wgrad::{DType, Tensor};

/// cat along `dim` of host arrays (row-major), as the reference.
fn cat_host(parts: &[(Vec<f32>, Vec<usize>)], dim: usize) -> Vec<f32> {
    let outer: usize = parts[0].1[..dim].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for (v, shape) in parts {
            let inner: usize = shape[dim..].iter().product();
            out.extend_from_slice(&v[o * inner..(o + 1) * inner]);
        }
    }
    out
}

#[test]
fn cat_joins_parts_and_hands_each_its_slice_of_the_gradient() {
    let d = dev();
    let mut r = rng("cat");
    for dim in 0..3 {
        let shapes: Vec<Vec<usize>> = [2, 3, 1]
            .iter()
            .map(|&n| {
                let mut s = vec![2, 3, 4];
                s[dim] = n;
                s
            })
            .collect();
        let host: Vec<(Vec<f32>, Vec<usize>)> = shapes
            .iter()
            .map(|s| (rand_vec(&mut r, s.iter().product(), -1.0, 1.0), s.clone()))
            .collect();
        let parts: Vec<Tensor> = host
            .iter()
            .map(|(v, s)| Tensor::from_slice(d, v, s).unwrap().requires_grad())
            .collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let y = Tensor::cat(&refs, dim).unwrap();
        let mut want_shape = vec![2, 3, 4];
        want_shape[dim] = 6;
        assert_eq!(y.shape(), want_shape.as_slice());
        assert_eq!(y.to_vec().unwrap(), cat_host(&host, dim), "dim {dim}");
        // d(sum(y * w)) / d part = its slice of w.
        let w_host = rand_vec(&mut r, want_shape.iter().product(), -1.0, 1.0);
        let w = Tensor::from_slice(d, &w_host, &want_shape).unwrap();
        y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        let mut start = 0;
        for (p, (_, s)) in parts.iter().zip(&host) {
            let want = w
                .narrow(dim as isize, start, s[dim])
                .unwrap()
                .to_vec()
                .unwrap();
            assert_eq!(
                p.grad().expect("a gradient").to_vec().unwrap(),
                want,
                "dim {dim}"
            );
            start += s[dim];
        }
    }
}

#[test]
fn cat_of_strided_f16_views_keeps_their_type() {
    let d = dev();
    let x = Tensor::rand_normal(d, &[2, 5, 6, 4], 0.0, 1.0, 7)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    // Heads 0..2 and 4..6 of a packed tensor, as Qwen3's q_norm/k_norm path joins them.
    let a = x.narrow(2, 0, 2).unwrap();
    let b = x.narrow(2, 4, 2).unwrap();
    let y = Tensor::cat(&[&a, &b], 2).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.shape(), &[2, 5, 4, 4]);
    let got = y.to_dtype(DType::F32).unwrap().to_vec().unwrap();
    let want = Tensor::cat(
        &[
            &a.to_dtype(DType::F32).unwrap(),
            &b.to_dtype(DType::F32).unwrap(),
        ],
        2,
    )
    .unwrap()
    .to_vec()
    .unwrap();
    assert_eq!(got, want);
}

#[test]
fn cat_refuses_mismatched_shapes_types_and_dims() {
    let d = dev();
    let a = Tensor::zeros(d, &[2, 3]).unwrap();
    let b = Tensor::zeros(d, &[3, 3]).unwrap();
    let h = a.to_dtype(DType::F16).unwrap();
    for (parts, dim, needle) in [
        (vec![&a, &b], 1, "along dim 1"),
        (vec![&a, &h], 0, "F32"),
        (vec![&a, &a], 2, "dim 2"),
        (vec![], 0, "no tensors"),
    ] {
        let err = Tensor::cat(&parts, dim).unwrap_err().to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let ok = Tensor::cat(&[&a, &b], 0).unwrap();
    assert_eq!(ok.shape(), &[5, 3]);
}
