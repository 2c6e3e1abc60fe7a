//! Errors of the ops: shapes that do not broadcast or multiply, element counts, dims out of
//! range, dtypes, bad view arguments.

use crate::common::*;
use wgrad::{Error, Tensor};

// ------------------------------------------------------------------------------------------
// Errors.

#[test]
fn add_of_unbroadcastable_shapes_is_broadcast_mismatch() {
    let d = dev();
    let a = Tensor::zeros(d, &[2, 3]).unwrap();
    let b = Tensor::zeros(d, &[4]).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(
        matches!(&e, Error::BroadcastMismatch { lhs, rhs, .. } if lhs == &[2, 3] && rhs == &[4]),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("[2, 3]") && e.to_string().contains("[4]"),
        "{e}"
    );
    let e = Tensor::where_cond(&a, &b, &a).unwrap_err();
    assert!(matches!(e, Error::BroadcastMismatch { .. }), "{e:?}");
    let e = a.broadcast_to(&[3, 3]).unwrap_err();
    assert!(matches!(e, Error::BroadcastMismatch { .. }), "{e:?}");
    let e = a.broadcast_to(&[3]).unwrap_err();
    assert!(matches!(e, Error::BroadcastMismatch { .. }), "{e:?}");
}

#[test]
fn matmul_inner_dim_mismatch_is_shape_mismatch() {
    let d = dev();
    let a = Tensor::zeros(d, &[3, 4]).unwrap();
    let b = Tensor::zeros(d, &[5, 6]).unwrap();
    let e = a.matmul(&b).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { op: "matmul", .. }),
        "{e:?}"
    );
    let v = Tensor::zeros(d, &[4]).unwrap();
    let e = a.matmul(&v).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { .. }),
        "rank-1 operand: {e:?}"
    );
    let a3 = Tensor::zeros(d, &[2, 3, 4]).unwrap();
    let b3 = Tensor::zeros(d, &[3, 4, 5]).unwrap();
    let e = a3.matmul(&b3).unwrap_err();
    assert!(
        matches!(e, Error::BroadcastMismatch { .. }),
        "batch 2 vs 3: {e:?}"
    );
}

#[test]
fn from_slice_with_wrong_length_is_element_count() {
    let d = dev();
    let e = Tensor::from_slice(d, &[1.0; 5], &[2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ElementCount {
                expected: 6,
                got: 5,
                ..
            }
        ),
        "{e:?}"
    );
    let e = Tensor::from_u32(d, &[1; 7], &[2, 3]).unwrap_err();
    assert!(matches!(e, Error::ElementCount { .. }), "{e:?}");
}

#[test]
fn transpose_out_of_range_is_dim_out_of_range() {
    let d = dev();
    let a = Tensor::zeros(d, &[2, 3]).unwrap();
    let e = a.transpose(5, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DimOutOfRange {
                dim: 5,
                rank: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(matches!(
        a.transpose(0, -3).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.sum(2, false).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.mean(-3, true).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.narrow(2, 0, 1).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    assert!(matches!(
        a.unsqueeze(4).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
    let i = Tensor::from_u32(d, &[0], &[1]).unwrap();
    assert!(matches!(
        a.index_select(2, &i).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
}

#[test]
fn item_of_two_elements_errors() {
    let d = dev();
    let a = Tensor::zeros(d, &[2]).unwrap();
    let e = a.item().unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { op: "item", .. }),
        "{e:?}"
    );
    let empty = Tensor::zeros(d, &[0]).unwrap();
    assert!(empty.item().is_err());
}

#[test]
fn index_select_with_f32_indices_is_dtype_mismatch() {
    let d = dev();
    let a = Tensor::zeros(d, &[4, 3]).unwrap();
    let idx = Tensor::from_slice(d, &[0.0, 1.0], &[2]).unwrap();
    let e = a.index_select(0, &idx).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e:?}");
    let u = Tensor::from_u32(d, &[0, 1, 2, 3], &[2, 2]).unwrap();
    let e = a.index_select(0, &u).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { .. }),
        "2-D indices: {e:?}"
    );
    let e = u
        .index_select(0, &Tensor::from_u32(d, &[0], &[1]).unwrap())
        .unwrap_err();
    assert!(
        matches!(e, Error::DTypeMismatch { .. }),
        "u32 source: {e:?}"
    );
    // Reading back with the wrong dtype, and ops on u32 tensors.
    assert!(matches!(
        u.to_vec().unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
    assert!(matches!(
        a.to_vec_u32().unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
    assert!(matches!(u.exp().unwrap_err(), Error::DTypeMismatch { .. }));
    assert!(matches!(
        u.sum_all().unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
    assert_eq!(u.to_vec_u32().unwrap(), vec![0, 1, 2, 3]);
}

#[test]
fn bad_view_arguments_are_clear_errors() {
    let d = dev();
    let a = Tensor::zeros(d, &[2, 3]).unwrap();
    assert!(matches!(
        a.reshape(&[4, 2]).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    assert!(matches!(
        a.permute(&[0, 0]).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        a.permute(&[0]).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        a.narrow(1, 2, 2).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        a.squeeze(0).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    let s = Tensor::zeros(d, &[]).unwrap();
    assert!(matches!(
        s.softmax().unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    assert!(matches!(
        s.sum(0, false).unwrap_err(),
        Error::DimOutOfRange { .. }
    ));
}
