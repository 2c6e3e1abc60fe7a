//! Memory and submits of repeated training steps: after the first step nothing is created, the
//! peak stays flat, and the graph (with every saved tensor) is released by backward; a
//! residual's gradient takes the branch's contribution in place.

mod common;

use common::Arr;
use wgrad::{no_grad, Device, Result, Tensor};

/// One step of a small MLP with a shared weight (used twice: its gradient accumulates).
fn step(x: &Tensor, y: &Tensor, params: &[&Tensor]) -> Result<f32> {
    let [w1, b1, w2] = [params[0], params[1], params[2]];
    let h = x.matmul(w1)?.add(b1)?.gelu()?; // (N, H)
    let h2 = h.matmul(w2)?.tanh()?.matmul(&w2.t()?)?; // (N, H): w2 read twice
    let loss = h2.sub(y)?.square()?.mean_all()?;
    for p in params {
        p.zero_grad();
    }
    loss.backward()?;
    no_grad(|| -> Result<()> {
        for p in params {
            p.add_scaled_(&p.grad().expect("reached by backward"), -0.05)?;
        }
        Ok(())
    })?;
    loss.item()
}

#[test]
fn repeated_steps_create_no_buffers_and_keep_peak_flat() -> Result<()> {
    let dev = Device::new()?;
    let x = Tensor::rand_uniform(&dev, &[33, 7], -1.0, 1.0, 1)?;
    let y = Tensor::rand_uniform(&dev, &[33, 17], -1.0, 1.0, 2)?;
    let w1 = Tensor::rand_normal(&dev, &[7, 17], 0.0, 0.3, 3)?.requires_grad();
    let b1 = Tensor::zeros(&dev, &[17])?.requires_grad();
    let w2 = Tensor::rand_normal(&dev, &[17, 5], 0.0, 0.3, 4)?.requires_grad();
    let params = [&w1, &b1, &w2];

    let mut losses = Vec::new();
    let mut peaks = Vec::new();
    let mut created = Vec::new();
    let mut submits = Vec::new();
    let mut dispatches = Vec::new();
    for _ in 0..10 {
        dev.reset_pool_counters();
        let c0 = dev.counters();
        losses.push(step(&x, &y, &params)?);
        let c = dev.counters() - c0;
        let s = dev.pool_stats();
        peaks.push(s.peak_bytes_live);
        created.push(s.buffers_created);
        submits.push(c.submits);
        dispatches.push((c.forward_dispatches, c.backward_dispatches));
    }
    assert!(created[0] > 0, "the first step allocates");
    assert!(
        created[1..].iter().all(|&n| n == 0),
        "buffers created per step: {created:?}"
    );
    assert!(
        peaks[2..].iter().all(|&p| p == peaks[1]),
        "peak bytes per step: {peaks:?}"
    );
    assert!(
        submits.iter().all(|&s| s <= 3),
        "submits per step: {submits:?}"
    );
    assert!(
        dispatches.iter().all(|d| *d == dispatches[0]),
        "dispatches per step: {dispatches:?}"
    );
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[9] < losses[0], "the loss falls: {losses:?}");
    Ok(())
}

#[test]
fn backward_releases_the_graph_and_its_saved_tensors() -> Result<()> {
    let dev = Device::new()?;
    let w = Tensor::rand_normal(&dev, &[64, 64], 0.0, 0.1, 5)?.requires_grad();
    let x = Tensor::rand_uniform(&dev, &[32, 64], -1.0, 1.0, 6)?;
    dev.sync()?;
    let live_before = dev.pool_stats().bytes_live;
    let loss = x.matmul(&w)?.exp()?.matmul(&w)?.sigmoid()?.sum_all()?;
    let live_forward = dev.pool_stats().bytes_live;
    assert!(
        live_forward > live_before,
        "the graph holds its activations"
    );
    loss.backward()?;
    // What is left: the loss itself and w's gradient; every activation went back to the pool.
    let grad_bytes = wgrad::memory::size_class(64 * 64 * 4);
    let loss_bytes = wgrad::memory::size_class(4);
    assert_eq!(
        dev.pool_stats().bytes_live,
        live_before + grad_bytes + loss_bytes
    );
    drop(loss);
    assert_eq!(dev.pool_stats().bytes_live, live_before + grad_bytes);
    Ok(())
}

/// loss = sum(r * (a + tanh(a W))), a = tanh(x): the residual passes its gradient g to `a`
/// without a copy, and once tanh's backward (the last other reader of g) is recorded, the
/// matmul's dA is added into g in place: the backward costs what `tanh(a W)` alone costs (no
/// sum dispatch, and one buffer fewer), and x's gradient is right.
#[test]
fn a_residual_gradient_takes_the_branch_in_place() -> Result<()> {
    let dev = Device::new()?;
    let (n, c) = (19, 13);
    let x = Tensor::rand_uniform(&dev, &[n, c], -1.0, 1.0, 7)?.requires_grad();
    let w = Tensor::rand_uniform(&dev, &[c, c], -0.5, 0.5, 8)?;
    let r = Tensor::rand_uniform(&dev, &[n, c], -1.0, 1.0, 9)?;
    let backward_cost = |residual: bool| -> Result<(u64, u64)> {
        let a = x.tanh()?;
        let branch = a.matmul(&w)?.tanh()?;
        let out = if residual { a.add(&branch)? } else { branch };
        let loss = out.mul(&r)?.sum_all()?;
        x.zero_grad();
        dev.sync()?;
        let c0 = dev.counters();
        let p0 = dev.pool_stats();
        loss.backward()?;
        let c = dev.counters() - c0;
        Ok((
            c.backward_dispatches,
            dev.pool_stats().requests - p0.requests,
        ))
    };
    backward_cost(true)?; // x's gradient buffer exists from here on
    let (plain, plain_buffers) = backward_cost(false)?;
    let (with_residual, residual_buffers) = backward_cost(true)?;
    assert_eq!(
        with_residual, plain,
        "backward dispatches with and without the residual"
    );
    // The branch's dA needs no buffer of its own: it lands in the residual's.
    assert_eq!(
        residual_buffers + 1,
        plain_buffers,
        "buffers requested by backward"
    );

    // dx = (r + (r * (1 - t^2)) W^T) * (1 - a^2), t = tanh(a W).
    let (xs, ws, rs) = (x.to_vec()?, w.to_vec()?, r.to_vec()?);
    let got = x.grad().expect("reached by backward").to_vec()?;
    let (xa, wa, ra) = (
        Arr::from_f32(&[n, c], &xs),
        Arr::from_f32(&[c, c], &ws),
        Arr::from_f32(&[n, c], &rs),
    );
    let a = xa.map(f64::tanh);
    let t = a.matmul(&wa).map(f64::tanh);
    let branch = ra.zip(&t, |r, t| r * (1.0 - t * t)).matmul(&wa.t());
    let da = ra.zip(&branch, |r, b| r + b);
    let want = da.zip(&a, |d, a| d * (1.0 - a * a));
    for i in 0..n {
        for k in 0..c {
            let want = want.at(&[i, k]);
            let err = (got[i * c + k] as f64 - want).abs() / want.abs().max(1.0);
            assert!(err < 1e-5, "dx[{i}, {k}]: {} vs {want}", got[i * c + k]);
        }
    }
    Ok(())
}
