//! Tensor creation: empty and one-element tensors through every kind of op, and the random
//! fills (range, moments, determinism per seed).

use crate::common::*;
use wgrad::Tensor;

// ------------------------------------------------------------------------------------------
// Empty and one-element tensors.

#[test]
fn empty_tensors_through_elementwise_ops() {
    let d = dev();
    for shape in [&[0usize][..], &[3, 0], &[0, 4, 5]] {
        let x = Tensor::from_slice(d, &[], shape).unwrap();
        assert_eq!(x.shape(), shape);
        assert_eq!(x.to_vec().unwrap(), Vec::<f32>::new());
        let y = x.exp().unwrap().add(&x).unwrap();
        assert_eq!(y.shape(), shape);
        assert!(y.to_vec().unwrap().is_empty());
        assert!(Tensor::zeros(d, shape)
            .unwrap()
            .to_vec()
            .unwrap()
            .is_empty());
    }
    // [3, 0] + [0] broadcasts to [3, 0]; [3, 0] + [3, 1] too.
    let a = Tensor::zeros(d, &[3, 0]).unwrap();
    let b = Tensor::zeros(d, &[0]).unwrap();
    assert_eq!(a.add(&b).unwrap().shape(), &[3, 0]);
    let c = Tensor::ones(d, &[3, 1]).unwrap();
    assert_eq!(a.mul(&c).unwrap().shape(), &[3, 0]);
    let w = Tensor::where_cond(&a, &c, &b).unwrap();
    assert_eq!(w.shape(), &[3, 0]);
    assert!(w.to_vec().unwrap().is_empty());
}

#[test]
fn empty_tensors_through_reductions_softmax_matmul_gather() {
    let d = dev();
    let x = Tensor::zeros(d, &[3, 0]).unwrap();
    // Summing an empty axis gives zeros; reducing the other axis gives an empty tensor.
    poison(d, 3);
    let s = x.sum(1, false).unwrap();
    check(&s, &Arr::full(&[3], 0.0), 0.0, "sum over an empty axis");
    assert_eq!(x.sum(0, false).unwrap().shape(), &[0]);
    assert_eq!(x.sum(0, true).unwrap().shape(), &[1, 0]);
    poison(d, 1);
    let total = x.sum_all().unwrap();
    assert_eq!(total.shape(), &[] as &[usize]);
    assert_eq!(total.item().unwrap(), 0.0, "sum_all of an empty tensor");
    // Softmax of rows of length 0, and of zero rows.
    assert_eq!(x.softmax().unwrap().shape(), &[3, 0]);
    assert!(x.log_softmax().unwrap().to_vec().unwrap().is_empty());
    let rows0 = Tensor::zeros(d, &[0, 5]).unwrap();
    assert_eq!(rows0.softmax().unwrap().shape(), &[0, 5]);
    // Matmul with M = 0 and N = 0.
    let a = Tensor::zeros(d, &[0, 4]).unwrap();
    let b = Tensor::ones(d, &[4, 5]).unwrap();
    assert_eq!(a.matmul(&b).unwrap().shape(), &[0, 5]);
    let b0 = Tensor::ones(d, &[4, 0]).unwrap();
    assert_eq!(b.t().unwrap().matmul(&b0).unwrap().shape(), &[5, 0]);
    // index_select with no indices, and from an empty axis (every index out of range).
    let src = Tensor::ones(d, &[4, 5]).unwrap();
    let none = Tensor::from_u32(d, &[], &[0]).unwrap();
    assert_eq!(src.index_select(0, &none).unwrap().shape(), &[0, 5]);
    let idx = Tensor::from_u32(d, &[0, 2], &[2]).unwrap();
    poison(d, 6);
    let picked = x.index_select(1, &idx).unwrap();
    check(
        &picked,
        &Arr::full(&[3, 2], 0.0),
        0.0,
        "gather from an empty axis of [3, 0]",
    );
    let picked = x.t().unwrap().index_select(1, &idx).unwrap();
    assert_eq!(picked.shape(), &[0, 2]);
}

#[test]
fn one_element_tensors() {
    let d = dev();
    let s = Tensor::from_slice(d, &[-2.5], &[]).unwrap();
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.numel(), 1);
    assert_eq!(s.item().unwrap(), -2.5);
    assert_eq!(s.abs().unwrap().item().unwrap(), 2.5);
    let one = Tensor::from_slice(d, &[4.0], &[1, 1, 1]).unwrap();
    poison(d, 1);
    let p = s.mul(&one).unwrap();
    assert_eq!(p.shape(), &[1, 1, 1]);
    assert_eq!(p.item().unwrap(), -10.0);
    assert_eq!(one.sum_all().unwrap().item().unwrap(), 4.0);
    assert_eq!(one.mean(1, false).unwrap().shape(), &[1, 1]);
    assert_eq!(one.max(-1, true).unwrap().item().unwrap(), 4.0);
    assert_eq!(one.min_all().unwrap().item().unwrap(), 4.0);
    let v = Tensor::from_slice(d, &[7.0], &[1]).unwrap();
    assert_eq!(v.softmax().unwrap().item().unwrap(), 1.0);
    assert_eq!(v.log_softmax().unwrap().item().unwrap(), 0.0);
    let m = Tensor::from_slice(d, &[3.0], &[1, 1]).unwrap();
    assert_eq!(
        m.matmul(&one.squeeze(0).unwrap()).unwrap().item().unwrap(),
        12.0
    );
    let idx = Tensor::from_u32(d, &[0], &[1]).unwrap();
    assert_eq!(v.index_select(0, &idx).unwrap().item().unwrap(), 7.0);
}

// ------------------------------------------------------------------------------------------
// Random.

fn moments(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn rand_uniform_in_range_with_expected_moments() {
    let d = dev();
    let (lo, hi) = (-2.0f32, 3.0f32);
    let n = 100_003;
    poison(d, n);
    let v = Tensor::rand_uniform(d, &[n], lo, hi, 7)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(v.len(), n);
    assert!(
        v.iter().all(|&x| x >= lo && x < hi),
        "a draw outside [{lo}, {hi}) (or NaN: an element left unwritten)"
    );
    let (mean, std) = moments(&v);
    let width = (hi - lo) as f64;
    assert!((mean - 0.5).abs() < 0.02, "uniform mean {mean}, want 0.5");
    assert!(
        (std - width / 12f64.sqrt()).abs() < 0.02,
        "uniform std {std}"
    );
}

#[test]
fn rand_normal_with_expected_moments() {
    let d = dev();
    let n = 100_003;
    for (m, s) in [(0.0f32, 1.0f32), (1.5, 2.0), (-3.0, 0.02)] {
        poison(d, n);
        let v = Tensor::rand_normal(d, &[n], m, s, 11)
            .unwrap()
            .to_vec()
            .unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "a non-finite normal draw");
        let (mean, std) = moments(&v);
        let scale = (s as f64).max(1.0);
        assert!(
            (mean - m as f64).abs() < 0.02 * scale,
            "normal({m}, {s}) mean {mean}"
        );
        assert!(
            (std - s as f64).abs() < 0.02 * s as f64,
            "normal({m}, {s}) std {std}"
        );
    }
}

#[test]
fn random_is_deterministic_per_seed() {
    let d = dev();
    let a = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 42)
        .unwrap()
        .to_vec()
        .unwrap();
    let b = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 42)
        .unwrap()
        .to_vec()
        .unwrap();
    let c = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 43)
        .unwrap()
        .to_vec()
        .unwrap();
    let hi = Tensor::rand_uniform(d, &[1031], 0.0, 1.0, 42 | (1 << 40))
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(a, b, "same seed, same draws");
    let same = a.iter().zip(&c).filter(|(x, y)| x == y).count();
    assert!(same < 10, "seeds 42 and 43 agree on {same} of 1031 draws");
    let same = a.iter().zip(&hi).filter(|(x, y)| x == y).count();
    assert!(
        same < 10,
        "the high seed word is ignored: {same} of 1031 draws agree"
    );
    // Element i is a function of (seed, i): a prefix of a longer draw, whatever the shape.
    let long = Tensor::rand_uniform(d, &[7, 300], 0.0, 1.0, 42)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(&long[..1031], &a[..]);
    let na = Tensor::rand_normal(d, &[257], 0.0, 1.0, 5)
        .unwrap()
        .to_vec()
        .unwrap();
    let nb = Tensor::rand_normal(d, &[257], 0.0, 1.0, 5)
        .unwrap()
        .to_vec()
        .unwrap();
    let nc = Tensor::rand_normal(d, &[257], 0.0, 1.0, 6)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(na, nb);
    assert_ne!(na, nc);
}
