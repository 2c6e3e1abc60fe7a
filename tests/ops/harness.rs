//! The test harness itself: `assert_close`'s metric and reports, and `poison`.

use crate::common::*;
use wgrad::Tensor;

// ------------------------------------------------------------------------------------------
// The harness itself.

#[test]
#[should_panic(expected = "non-finite")]
fn harness_nan_never_passes() {
    assert_close(&[1.0, f32::NAN], &[1.0, 2.0], 1.0, "NaN output");
}

#[test]
#[should_panic(expected = "non-finite")]
fn harness_nan_does_not_match_nan() {
    assert_close(&[f32::NAN], &[f64::NAN], 1.0, "NaN want");
}

#[test]
#[should_panic(expected = "worst [2]")]
fn harness_reports_the_worst_element() {
    assert_close(
        &[1.0, 2.0, 3.5, 4.0],
        &[1.0, 2.0, 3.0, 4.001],
        TOL,
        "off by 0.5",
    );
}

#[test]
fn harness_metric_is_relative_above_one_absolute_below() {
    assert_close(
        &[1000.05, 0.00005, f32::INFINITY],
        &[1000.0, 0.0, f64::INFINITY],
        TOL,
        "ok",
    );
}

#[test]
fn poison_reaches_the_next_output() {
    let d = private_dev();
    let x = Tensor::from_slice(&d, &[1.0; 1031], &[1031]).unwrap();
    let junk: Vec<Tensor> = (0..3)
        .map(|_| Tensor::full(&d, &[1031], f32::NAN).unwrap())
        .collect();
    assert!(junk[0].to_vec().unwrap().iter().all(|v| v.is_nan()));
    let ids: Vec<u64> = junk.iter().map(|t| t.storage().buffer_id()).collect();
    drop(junk);
    let y = x.exp().unwrap();
    assert!(
        ids.contains(&y.storage().buffer_id()),
        "the output took a poisoned buffer"
    );
}
