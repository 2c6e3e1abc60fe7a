//! GPU timestamps around every dispatch (lavapipe has them inside passes), and nothing when
//! timing is off.

use wgrad::graph::TimingMode;
use wgrad::{Device, Result, Tensor};

#[test]
fn every_dispatch_gets_an_interval_named_by_its_kernel() -> Result<()> {
    let dev = Device::new()?;
    let mode = dev.set_gpu_timing(true);
    assert_eq!(
        mode,
        Some(TimingMode::PerDispatch),
        "lavapipe writes timestamps inside passes"
    );
    let x = Tensor::rand_uniform(&dev, &[64, 64], -1.0, 1.0, 1)?;
    let y = x.matmul(&x)?.exp()?.sum_all()?;
    y.item()?;
    let c = dev.counters();
    let intervals = dev.take_gpu_intervals()?;
    assert_eq!(intervals.len() as u64, c.dispatches, "{intervals:?}");
    let labels: Vec<&str> = intervals.iter().map(|i| i.label).collect();
    // 4,096 elements: the sum runs in two stages. An f32 product on cooperative matrices (X3)
    // reads its operands' magnitudes from an `absmax` dispatch first.
    let product: &[&str] = if dev.f32_on_tensor_cores() {
        &["absmax", "matmul_coop"]
    } else {
        &["matmul"]
    };
    let want: Vec<&str> = [
        &["random"],
        product,
        &["unary", "reduce_partial", "reduce_dims"],
    ]
    .concat();
    assert_eq!(labels, want);
    for w in intervals.windows(2) {
        assert!(
            w[0].end_ns >= w[0].start_ns && w[1].start_ns >= w[0].start_ns,
            "{w:?}"
        );
    }
    assert!(
        intervals.iter().any(|i| i.end_ns > i.start_ns),
        "some kernel takes measurable time"
    );

    dev.set_gpu_timing(false);
    Tensor::ones(&dev, &[8])?.sum_all()?.item()?;
    assert!(
        dev.take_gpu_intervals()?.is_empty(),
        "timing off writes no timestamps"
    );
    Ok(())
}

#[test]
fn without_timestamps_inside_passes_each_pass_is_timed() -> Result<()> {
    let mut options = wgrad::Options::from_env()?;
    options.adapter.disable |= wgrad::wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
    let dev = Device::with_options(&options)?;
    assert_eq!(dev.set_gpu_timing(true), Some(TimingMode::PerPass));
    let x = Tensor::rand_uniform(&dev, &[32, 32], -1.0, 1.0, 1)?;
    x.matmul(&x)?.sum_all()?.item()?;
    let c = dev.counters();
    let intervals = dev.take_gpu_intervals()?;
    assert_eq!(
        intervals.len() as u64,
        c.compute_passes,
        "one interval per compute pass"
    );
    assert!(intervals
        .iter()
        .all(|i| i.label == "compute pass" && i.end_ns >= i.start_ns));
    Ok(())
}
