//! The runtime under the ops: laziness (one submit for a thousand ops, automatic and early
//! flushes), pool and bind-group reuse, the hazards of dropped inputs and outputs whose
//! buffers are reused, the device from several threads and across devices, trimming.

use crate::common::*;
use rand::rngs::StdRng;
use wgrad::{Device, Error, Tensor};

// ------------------------------------------------------------------------------------------
// Laziness, pool reuse, hazards (each on a private device: the shared one sees other threads).

#[test]
fn thousand_chained_ops_cost_one_submit() {
    let d = private_dev();
    let x = Tensor::from_slice(&d, &[1.0, 2.0, 3.0], &[3]).unwrap();
    d.sync().unwrap();
    let before = d.counters();
    let mut y = x.clone();
    for i in 0..1000 {
        y = if i % 2 == 0 {
            y.add_scalar(1.0)
        } else {
            y.mul_scalar(0.5)
        }
        .unwrap();
    }
    let mid = d.counters() - before;
    assert_eq!(mid.submits, 0, "recording submitted work: {mid:?}");
    let got = y.to_vec().unwrap();
    let c = d.counters() - before;
    assert_eq!(c.submits, 1, "1000 ops and one read-back: {c:?}");
    assert_eq!(c.dispatches, 1000, "{c:?}");
    assert_eq!(c.read_backs, 1, "{c:?}");
    // y <- (y + 1) / 2 converges to 1.
    let want: Vec<f64> = [1.0, 2.0, 3.0]
        .iter()
        .map(|&v: &f64| (0..500).fold(v, |y, _| (y + 1.0) * 0.5))
        .collect();
    assert_close(&got, &want, 1e-6, "chained ops");
}

/// A small step: upload, matmul, bias, gelu, softmax, reductions, gather; read one value.
fn workload(d: &Device, rng: &mut StdRng) -> f32 {
    let x = Tensor::from_slice(d, &rand_vec(rng, 37 * 29, -1.0, 1.0), &[37, 29]).unwrap();
    let w = Tensor::from_slice(d, &rand_vec(rng, 29 * 19, -1.0, 1.0), &[29, 19]).unwrap();
    let b = Tensor::from_slice(d, &rand_vec(rng, 19, -1.0, 1.0), &[19]).unwrap();
    let idx = Tensor::from_u32(d, &[3, 1, 4, 1, 5], &[5]).unwrap();
    let h = x.matmul(&w).unwrap().add(&b).unwrap().gelu().unwrap();
    let p = h.log_softmax().unwrap().index_select(0, &idx).unwrap();
    let s = p.sum(1, false).unwrap().mean_all().unwrap();
    let t = h.t().unwrap().contiguous().unwrap().max_all().unwrap();
    s.add(&t).unwrap().item().unwrap()
}

#[test]
fn repeated_workload_creates_no_buffers_after_the_first() {
    let d = private_dev();
    let mut rng = rng("workload");
    workload(&d, &mut rng);
    let first = d.pool_stats();
    for rep in 1..4 {
        workload(&d, &mut rng);
        let s = d.pool_stats();
        assert_eq!(
            s.buffers_created, first.buffers_created,
            "repetition {rep} created buffers ({first:?} -> {s:?})"
        );
    }
    let s = d.pool_stats();
    assert!(s.reuses > first.reuses && s.hit_rate() > 0.5, "{s:?}");
}

/// segment.rs: "pooled buffers come back in the same combinations every step, so a
/// steady-state step creates none" (bind groups). The third and later repetitions of the same
/// workload must create no bind group and no arena or read-back buffer.
#[test]
fn repeated_workload_creates_no_bind_groups_after_the_second() {
    let d = private_dev();
    let mut rng = rng("workload bind groups");
    workload(&d, &mut rng);
    workload(&d, &mut rng);
    let others = d.other_buffers_created();
    let per_rep: Vec<u64> = (0..4)
        .map(|_| {
            let before = d.counters();
            workload(&d, &mut rng);
            (d.counters() - before).bind_groups_created
        })
        .collect();
    assert_eq!(
        d.other_buffers_created(),
        others,
        "arena or read-back buffers created"
    );
    assert!(
        per_rep.iter().all(|&n| n == 0),
        "repetitions 3..=6 of a 10-dispatch workload created {per_rep:?} bind groups \
         ({} cached)",
        d.bind_groups_cached()
    );
}

#[test]
fn dropped_input_reused_by_an_upload_keeps_its_original_data_for_earlier_ops() {
    let d = private_dev();
    let mut rng = rng("hazard");
    let n = 1031;
    d.sync().unwrap();
    let before = d.counters();
    let mut reused = 0;
    let mut checks: Vec<(Tensor, Arr, String)> = Vec::new();
    for round in 0..6 {
        let a = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        let other = Arr::rand(&mut rng, &[n], -1.0, 1.0);
        let x = a.upload(&d);
        let o = other.upload(&d);
        let id = x.storage().buffer_id();
        // One op reading X, recorded; then X dropped and its buffer handed to a new upload.
        let (y, want) = match round % 3 {
            0 => (x.exp().unwrap(), a.map(f64::exp)),
            1 => (x.mul(&o).unwrap(), a.zip(&other, |p, q| p * q)),
            _ => (x.sum_all().unwrap(), Arr::new(&[], vec![a.sum_all()])),
        };
        drop(x);
        let fresh = Arr::rand(&mut rng, &[n], 5.0, 6.0);
        let z = fresh.upload(&d);
        if z.storage().buffer_id() == id {
            reused += 1;
        }
        let w = z.neg().unwrap(); // reads the new data from the same buffer
        checks.push((y, want, format!("round {round}: op on the dropped input")));
        checks.push((
            w,
            fresh.map(|v| -v),
            format!("round {round}: op on the new upload"),
        ));
    }
    let c = d.counters() - before;
    assert_eq!(
        c.submits, 0,
        "everything above sits in one open segment: {c:?}"
    );
    assert!(
        reused >= 3,
        "the pool reused the dropped buffer only {reused} of 6 times"
    );
    for (t, want, what) in &checks {
        check(t, want, TOL, what);
    }
}

#[test]
fn dropped_output_buffer_reused_by_a_fill_keeps_order() {
    let d = private_dev();
    let mut rng = rng("hazard fill");
    let a = Arr::rand(&mut rng, &[64, 33], -1.0, 1.0);
    let x = a.upload(&d);
    let mut outs = Vec::new();
    for k in 0..5 {
        // t is an intermediate whose buffer is freed as soon as u is recorded; the fill below
        // takes it while the segment still has to run u's read of it.
        let t = x.mul_scalar(k as f32 + 1.0).unwrap();
        let u = t.t().unwrap().contiguous().unwrap();
        drop(t);
        let f = Tensor::full(&d, &[64, 33], -7.0).unwrap();
        outs.push((u, k, f));
    }
    for (u, k, f) in &outs {
        check(
            u,
            &a.map(|v| v * (*k as f64 + 1.0)).t(),
            TOL,
            &format!("round {k}"),
        );
        check(f, &Arr::full(&[64, 33], -7.0), 0.0, &format!("fill {k}"));
    }
}

#[test]
fn auto_flush_at_the_bound_keeps_results() {
    let d = private_dev();
    d.set_flush_bound(7);
    let a = Arr::rand(&mut rng("flush bound"), &[257], -1.0, 1.0);
    let x = a.upload(&d);
    d.sync().unwrap();
    let before = d.counters();
    let mut y = x.clone();
    for _ in 0..50 {
        y = y.add_scalar(0.25).unwrap();
    }
    let c = d.counters() - before;
    assert_eq!(c.submits, 7, "50 dispatches at a bound of 7: {c:?}");
    check(&y, &a.map(|v| v + 12.5), TOL, "after automatic flushes");
}

#[test]
fn an_early_submit_fires_once_and_keeps_results() {
    let d = private_dev();
    let a = Arr::rand(&mut rng("early submit"), &[257], -1.0, 1.0);
    let x = a.upload(&d);
    // Compiled first: an early submit waits for no compile (src/graph/runtime.rs's tests).
    x.add_scalar(0.0).unwrap();
    d.sync().unwrap();
    let before = d.counters();
    d.submit_early(5);
    let mut y = x.clone();
    for i in 0..20 {
        y = y.add_scalar(0.5).unwrap();
        let c = d.counters() - before;
        let want = if i < 4 { 0 } else { 1 };
        assert_eq!(c.submits, want, "after {} dispatches: {c:?}", i + 1);
    }
    check(&y, &a.map(|v| v + 10.0), TOL, "across the early submit");
    assert_eq!((d.counters() - before).submits, 2, "the rest in one flush");
    // Armed, then flushed before reaching its count: gone, not carried to the next Segment.
    d.submit_early(3);
    y = y.add_scalar(1.0).unwrap();
    d.flush();
    let mid = d.counters();
    for _ in 0..6 {
        y = y.add_scalar(1.0).unwrap();
    }
    assert_eq!((d.counters() - mid).submits, 0);
    check(
        &y,
        &a.map(|v| v + 17.0),
        TOL,
        "after a disarmed early submit",
    );
}

#[test]
fn device_is_usable_from_several_threads() {
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let d = dev();
                let mut rng = rng(&format!("thread {t}"));
                for _ in 0..5 {
                    let a = Arr::rand(&mut rng, &[33, 65], -1.0, 1.0);
                    let b = Arr::rand(&mut rng, &[65, 17], -1.0, 1.0);
                    let c = a.upload(d).matmul(&b.upload(d)).unwrap().tanh().unwrap();
                    check(
                        &c,
                        &a.matmul(&b).map(f64::tanh),
                        TOL,
                        &format!("thread {t}"),
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn ops_across_devices_are_device_mismatch() {
    let a = Tensor::zeros(dev(), &[3]).unwrap();
    let b = Tensor::zeros(tree_dev(), &[3]).unwrap();
    assert!(matches!(
        a.add(&b).unwrap_err(),
        Error::DeviceMismatch { .. }
    ));
    let m = Tensor::zeros(tree_dev(), &[3, 3]).unwrap();
    let e = a.reshape(&[1, 3]).unwrap().matmul(&m).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
}

#[test]
fn trim_then_reuse_gives_correct_results() {
    let d = private_dev();
    let a = Arr::rand(&mut rng("trim"), &[257, 3], -1.0, 1.0);
    for round in 0..3 {
        let x = a.upload(&d);
        check(
            &x.t().unwrap().exp().unwrap(),
            &a.t().map(f64::exp),
            TOL,
            &format!("round {round}"),
        );
        drop(x);
        d.trim(); // destroys the cached buffers; their bind groups must go too
    }
}
