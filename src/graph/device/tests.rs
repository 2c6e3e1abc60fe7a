//! The Device's recording, scheduling and pool behaviour, on whatever adapter is found.

use super::*;
use crate::graph::Tensor;
use crate::kernels::{KernelDesc, Spec};

/// A device with the environment's options and `f` applied to them.
fn device_with(f: impl FnOnce(&mut Options)) -> Device {
    let mut options = Options::from_env().expect("the environment's options");
    f(&mut options);
    Device::with_options(&options).expect("a device (lavapipe without a GPU)")
}

/// A device whose one compile worker is held until the returned sender sends (or drops).
fn held_device() -> (Device, std::sync::mpsc::Sender<()>) {
    let dev = device_with(|o| o.execution.compile_threads = Some(1));
    let (release, held) = std::sync::mpsc::channel::<()>();
    dev.state().pipelines.run_on_workers(move || {
        let _ = held.recv();
    });
    (dev, release)
}

#[test]
fn the_slowest_compiles_come_longest_first_with_their_times() {
    let dev = device_with(|o| o.execution.compile_threads = Some(2));
    let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2]).expect("an upload");
    let y = x
        .matmul(&x)
        .expect("recorded")
        .add_scalar(1.0)
        .expect("recorded");
    y.to_vec().expect("read back");
    let all = dev.slowest_compiles(100);
    assert!(all.len() >= 2, "{all:?}");
    assert!(all.iter().all(|(_, _, ms)| *ms > 0.0), "{all:?}");
    assert!(all.windows(2).all(|w| w[0].2 >= w[1].2), "{all:?}");
    assert_eq!(dev.slowest_compiles(1), all[..1].to_vec());
}

#[test]
fn an_early_submit_waits_for_no_compile() {
    let (dev, release) = held_device();
    let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3]).expect("an upload");
    let c0 = dev.counters();
    dev.submit_early(2);
    let mut y = x.clone();
    for _ in 0..4 {
        y = y.add_scalar(0.5).expect("recorded");
    }
    dev.flush_if_compiled();
    assert_eq!((dev.counters() - c0).submits, 0, "nothing compiled yet");
    release.send(()).expect("the worker waits");
    assert_eq!(y.to_vec().expect("read back"), [3.0, 4.0, 5.0]);
    let c = dev.counters() - c0;
    assert_eq!(c.submits, 1, "{c:?}");
    assert!(
        c.compile_wait_ns > 0,
        "the read-back waited for the compile: {c:?}"
    );
    // Compiled now: the same work submits early, and waits for nothing.
    let c1 = dev.counters();
    dev.submit_early(2);
    for _ in 0..2 {
        y = y.add_scalar(0.5).expect("recorded");
    }
    let c = dev.counters() - c1;
    assert_eq!((c.submits, c.compile_wait_ns), (1, 0), "{c:?}");
}

#[test]
fn a_kernel_that_does_not_compile_is_reported_once() {
    static BROKEN: crate::kernels::Family = crate::kernels::Family {
        name: "test_broken",
        source: "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
                 @compute @workgroup_size(1) fn test_broken() { let x = undeclared; }",
        workgroup_reduce: false,
    };
    static KERNEL: KernelDesc = KernelDesc {
        name: "test_broken",
        family: &BROKEN,
        storage: &[],
        params_size: 16,
    };
    let (dev, release) = held_device();
    drop(release);
    dev.record(&KERNEL, &Spec::new(), &[0u32; 4], &[], [1, 1, 1]);
    let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.flush()));
    let msg = flushed.expect_err("the flush reports it");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("kernel test_broken") && msg.contains("did not compile"),
        "{msg}"
    );
    // The Segment that held it is gone: the next flush has nothing to encode.
    let c0 = dev.counters();
    dev.flush();
    assert_eq!((dev.counters() - c0).submits, 0);
}

fn pool_device(pool_budget: u64) -> Device {
    device_with(|o| {
        // 0: a free buffer reused at once; else across Segments within the budget.
        o.pool.reuse = Some(if pool_budget == 0 {
            crate::config::PoolReuse::Any
        } else {
            crate::config::PoolReuse::AcrossSegments
        });
        o.pool.budget = (pool_budget > 0).then_some(pool_budget);
    })
}

#[test]
fn dispatches_that_write_new_buffers_and_read_what_was_read_run_without_a_barrier() {
    let dev = pool_device(1 << 30);
    let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[4]).expect("an upload");
    let y = Tensor::from_slice(&dev, &[0.5, 0.5, 0.5, 0.5], &[4]).expect("an upload");
    dev.flush();
    let c0 = dev.counters();
    let a = x.add(&y).expect("recorded"); // first uses in this command buffer
    let b = x.mul(&y).expect("recorded"); // x, y read again; b new: beside a
    let c = a.add(&b).expect("recorded"); // reads what a and b wrote: waits
    let d = c.mul_scalar(2.0).expect("recorded"); // reads c: waits
    dev.flush();
    let k = dev.counters() - c0;
    assert_eq!((k.dispatches, k.barriers), (4, 2), "{k:?}");
    assert_eq!(d.to_vec().expect("read back"), [4.0, 7.0, 10.0, 13.0]);
}

#[test]
fn a_buffer_given_back_in_the_open_segment_is_reused_in_the_next() {
    // (budget, whether the open Segment's buffer is taken again at once)
    for (budget, at_once) in [(1u64 << 30, false), (0, true), (1, true)] {
        let dev = pool_device(budget);
        let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[4]).expect("an upload");
        let y = Tensor::from_slice(&dev, &[0.5, 0.5, 0.5, 0.5], &[4]).expect("an upload");
        dev.flush();
        let c0 = dev.counters();
        let a = x.add(&y).expect("recorded");
        let freed = a.storage().buffer_id();
        drop(a);
        let b = x.mul(&y).expect("recorded");
        dev.flush();
        let k = dev.counters() - c0;
        assert_eq!(b.storage().buffer_id() == freed, at_once, "budget {budget}");
        // b writing the buffer a wrote in the same command buffer waits for a.
        assert_eq!(k.barriers, at_once as u64, "budget {budget}: {k:?}");
        assert_eq!(b.to_vec().expect("read back"), [0.5, 1.0, 1.5, 2.0]);
        drop(b);
        // Given back before the open Segment: taken first.
        let e = x.sub(&y).expect("recorded");
        assert_eq!(e.storage().buffer_id(), freed, "budget {budget}");
        assert_eq!(e.to_vec().expect("read back"), [0.5, 1.5, 2.5, 3.5]);
    }
}
