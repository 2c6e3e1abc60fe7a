//! Views: reshape (a view of contiguous tensors, a copy of transposed ones), narrow, permute,
//! transpose, broadcast, unsqueeze and squeeze, with their strides and storage.

use crate::common::*;

// ------------------------------------------------------------------------------------------
// Views.

#[test]
fn reshape_of_contiguous_is_a_view() {
    let d = dev();
    let a = Arr::rand(&mut rng("reshape"), &[4, 6], -1.0, 1.0);
    let x = a.upload(d);
    for shape in [&[2usize, 12][..], &[24], &[2, 3, 4], &[1, 24, 1]] {
        let r = x.reshape(shape).unwrap();
        assert!(r.same_storage(&x), "reshape {shape:?} of contiguous copied");
        assert!(r.is_contiguous());
        check(&r, &a.reshape(shape), 0.0, &format!("reshape {shape:?}"));
    }
    // A contiguous narrowed view (offset) reshapes without a copy too.
    let n = x.narrow(0, 1, 2).unwrap();
    let r = n.reshape(&[3, 4]).unwrap();
    assert!(r.same_storage(&x));
    check(
        &r,
        &a.narrow(0, 1, 2).reshape(&[3, 4]),
        0.0,
        "reshape of narrowed rows",
    );
}

#[test]
fn reshape_of_transposed_copies() {
    let d = dev();
    let a = Arr::rand(&mut rng("reshape t"), &[4, 6], -1.0, 1.0);
    let x = a.upload(d);
    let t = x.t().unwrap();
    assert!(!t.is_contiguous());
    assert!(t.same_storage(&x));
    poison(d, 24);
    let r = t.reshape(&[24]).unwrap();
    assert!(
        !r.same_storage(&x),
        "reshape of a transposed view must copy"
    );
    assert!(r.is_contiguous());
    check(&r, &a.t().reshape(&[24]), 0.0, "reshape of transposed");
    let r = t.reshape(&[2, 3, 4]).unwrap();
    check(
        &r,
        &a.t().reshape(&[2, 3, 4]),
        0.0,
        "reshape of transposed to 3-D",
    );
}

#[test]
fn narrow_then_contiguous() {
    let d = dev();
    let a = Arr::rand(&mut rng("narrow"), &[6, 9], -1.0, 1.0);
    let x = a.upload(d);
    let n = x.narrow(1, 2, 5).unwrap();
    assert_eq!(n.shape(), &[6, 5]);
    assert_eq!(n.strides(), &[9, 1]);
    assert!(!n.is_contiguous());
    poison(d, 30);
    let c = n.contiguous().unwrap();
    assert!(c.is_contiguous() && !c.same_storage(&x));
    check(&c, &a.narrow(1, 2, 5), 0.0, "narrow(1, 2, 5).contiguous()");
    let n2 = x.narrow(-2, 4, 2).unwrap().narrow(1, 8, 1).unwrap();
    check(
        &n2,
        &a.narrow(0, 4, 2).narrow(1, 8, 1),
        0.0,
        "narrow of narrow",
    );
    // contiguous() of a contiguous tensor is the tensor itself.
    assert!(x.contiguous().unwrap().same_storage(&x));
}

#[test]
fn permute_transpose_and_strides() {
    let d = dev();
    let a = Arr::rand(&mut rng("permute"), &[2, 3, 4], -1.0, 1.0);
    let x = a.upload(d);
    assert_eq!(x.strides(), &[12, 4, 1]);
    let p = x.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    assert_eq!(p.strides(), &[1, 12, 4]);
    assert!(p.same_storage(&x));
    check(&p, &a.permute(&[2, 0, 1]), 0.0, "permute(2, 0, 1)");
    poison(d, 24);
    check(
        &p.contiguous().unwrap(),
        &a.permute(&[2, 0, 1]),
        0.0,
        "permute then contiguous",
    );
    let t = x.transpose(0, -1).unwrap();
    assert_eq!(t.shape(), &[4, 3, 2]);
    check(&t, &a.transpose(0, 2), 0.0, "transpose(0, -1)");
    check(&x.t().unwrap(), &a.t(), 0.0, "t()");
    check(&x.t().unwrap().t().unwrap(), &a, 0.0, "t().t()");
}

#[test]
fn broadcast_unsqueeze_squeeze() {
    let d = dev();
    let a = Arr::rand(&mut rng("broadcast view"), &[3, 1], -1.0, 1.0);
    let x = a.upload(d);
    let b = x.broadcast_to(&[2, 3, 4]).unwrap();
    assert_eq!(b.shape(), &[2, 3, 4]);
    assert_eq!(b.strides(), &[0, 1, 0]);
    check(
        &b,
        &a.broadcast_to(&[2, 3, 4]),
        0.0,
        "broadcast_to [2, 3, 4]",
    );
    let u = x.unsqueeze(0).unwrap();
    assert_eq!(u.shape(), &[1, 3, 1]);
    let u = x.unsqueeze(-1).unwrap();
    assert_eq!(u.shape(), &[3, 1, 1]);
    let s = x.squeeze(1).unwrap();
    assert_eq!(s.shape(), &[3]);
    assert!(s.same_storage(&x));
    check(&s, &a.reshape(&[3]), 0.0, "squeeze(1)");
}
