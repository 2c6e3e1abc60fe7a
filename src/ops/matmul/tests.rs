//! The launcher on a device: products into narrowed views, X3's operand maxima.

use super::launch::record_absmax;
use super::*;

fn layout(t: &Tensor, batch: usize, bs: usize) -> matmul::OperandLayout {
    let r = t.rank();
    matmul::OperandLayout {
        dtype: t.dtype(),
        offset: t.layout().offset,
        batch_stride: bs,
        batch,
        rows: t.shape()[r - 2],
        row_stride: t.strides()[r - 2],
        cols: t.shape()[r - 1],
        col_stride: t.strides()[r - 1],
        bound_elements: t.storage().bound_bytes() as usize / 4,
    }
}

/// A product written into, then added into, a view of the first 61 columns of rows 64 wide,
/// f16 and f32: C's rows start on vectors of 4 and N is not a multiple of 4, so on
/// cooperative matrices the epilogue stores 4 columns at once and each row's ragged end
/// element by element. The view holds the product (f64 of the f16 operands) and the columns
/// past it keep what they held.
#[test]
fn products_into_narrowed_rows_leave_the_columns_past_them() {
    let dev = Device::new().expect("a device (lavapipe without a GPU)");
    let (m, k, n, w) = (150, 40, 61, 64);
    let half = |v: f32| half::f16::from_f32(v).to_f64();
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.02)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.02)
        .collect();
    let x = Tensor::from_slice_as(&dev, &a, &[m, k], DType::F16).expect("upload");
    let y = Tensor::from_slice_as(&dev, &b, &[k, n], DType::F16).expect("upload");
    let want = |i: usize, j: usize| {
        (0..k)
            .map(|l| half(a[i * k + l]) * half(b[l * n + j]))
            .sum::<f64>()
    };
    for dtype in [DType::F16, DType::F32] {
        let full = Tensor::from_slice_as(&dev, &vec![7.0; m * w], &[m, w], dtype).expect("upload");
        let view = full.narrow(1, 0, n).expect("view");
        for acc in [false, true] {
            let out = if acc {
                Out::Acc(&view)
            } else {
                Out::Write(&view)
            };
            autocast(true, || {
                x.matmul_epilogue_into(&y, Epilogue::None, out, dtype)
            })
            .expect("product");
            let got = full
                .to_dtype(DType::F32)
                .and_then(|t| t.to_vec())
                .expect("read back");
            for i in 0..m {
                for j in 0..w {
                    let g = got[i * w + j] as f64;
                    let (e, tol) = match j < n {
                        // written, then added to what was written
                        true if acc => (2.0 * want(i, j), 4e-3),
                        true => (want(i, j), 2e-3),
                        false => (7.0, 0.0),
                    };
                    assert!(
                        (g - e).abs() <= tol * e.abs().max(1.0),
                        "{dtype:?} {}: ({i}, {j}) {g} against {e}",
                        if acc { "added" } else { "written" }
                    );
                }
            }
        }
    }
}

/// The largest of the partial maxima is the bits of the largest finite |x| of each view
/// (not of the elements around it, even those sharing its vectors of 4; infinities and
/// NaN left out).
#[test]
fn absmax_partials_hold_each_views_largest_magnitude() {
    use crate::kernels::absmax::PARTS;
    let dev = Device::new().expect("a device (lavapipe without a GPU)");
    let parts = PARTS as usize;
    let max_of = |bits: &[u32]| *bits.iter().max().expect("partials");
    // A narrowed view of a (300, 70) matrix: its largest element outside the view.
    let mut data: Vec<f32> = (0..300 * 70)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
        .collect();
    data[0] = 1e6; // row 0, outside the rows kept
    data[2 * 70 + 1] = 1e6; // beside the view's element (1, 0) in one vector of 4
    data[5 * 70 + 3] = -7.5; // the view's largest magnitude, negative
    data[299 * 70 + 69] = -1e6; // the last row, outside too
    let full = Tensor::from_slice(&dev, &data, &[300, 70]).expect("upload");
    let a = full
        .narrow(0, 1, 250)
        .and_then(|v| v.narrow(1, 2, 60))
        .expect("view");
    // B: a transposed view (columns unit-stride along K), read along its rows.
    let bdata: Vec<f32> = (0..40 * 33).map(|i| (i as f32).sin() * 1e-6).collect();
    let b_src = Tensor::from_slice(&dev, &bdata, &[40, 33]).expect("upload");
    let b = b_src.t().expect("transpose");
    let want_b = bdata.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scales =
        record_absmax(&dev, (&a, &layout(&a, 1, 0)), (&b, &layout(&b, 1, 0))).expect("absmax");
    let bits = scales.to_vec_u32().expect("read back");
    assert_eq!(bits.len(), 2 * parts);
    assert_eq!(f32::from_bits(max_of(&bits[..parts])), 7.5);
    assert_eq!(f32::from_bits(max_of(&bits[parts..])), want_b);
    // A NaN and an infinity left out; a batch of 3 views, 2000 rows apart.
    let mut big = vec![0.25f32; 3 * 2000 * 8];
    big[2 * 2000 * 8 + 1999 * 8 + 7] = f32::NAN;
    big[2000 * 8 + 5] = f32::NEG_INFINITY;
    big[2 * 2000 * 8 + 3] = 5.0;
    big[4] = -3.0;
    let t = Tensor::from_slice(&dev, &big, &[3, 2000, 8]).expect("upload");
    let l = layout(&t, 3, 2000 * 8);
    let scales = record_absmax(&dev, (&t, &l), (&t, &l)).expect("absmax");
    let bits = scales.to_vec_u32().expect("read back");
    assert_eq!(f32::from_bits(max_of(&bits[..parts])), 5.0);
    // Only the first batch: 3.
    let l1 = matmul::OperandLayout { batch: 1, ..l };
    let scales = record_absmax(&dev, (&t, &l1), (&t, &l1)).expect("absmax");
    let bits = scales.to_vec_u32().expect("read back");
    assert_eq!(f32::from_bits(max_of(&bits[parts..])), 3.0);
    // Rows of 50 padded to 52, read in vectors: the padding (1e9) masked; the largest in
    // the last vector of a row, and (B) in the last row.
    let mut padded: Vec<f32> = (0..600 * 52).map(|i| (i % 7) as f32 * 0.1).collect();
    for r in 0..600 {
        padded[r * 52 + 50] = 1e9;
        padded[r * 52 + 51] = -1e9;
    }
    padded[17 * 52 + 49] = -4.5;
    padded[599 * 52 + 48] = 6.25;
    let t = Tensor::from_slice(&dev, &padded, &[600, 52]).expect("upload");
    let head = t
        .narrow(0, 0, 599)
        .and_then(|v| v.narrow(1, 0, 50))
        .expect("view");
    let all = t.narrow(1, 0, 50).expect("view");
    let (lh, la) = (layout(&head, 1, 0), layout(&all, 1, 0));
    assert_eq!(crate::kernels::absmax::OperandView::of(&lh).vec, 1);
    let scales = record_absmax(&dev, (&head, &lh), (&all, &la)).expect("absmax");
    let bits = scales.to_vec_u32().expect("read back");
    assert_eq!(f32::from_bits(max_of(&bits[..parts])), 4.5);
    assert_eq!(f32::from_bits(max_of(&bits[parts..])), 6.25);
}
