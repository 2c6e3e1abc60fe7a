//! A 2-layer MLP fitting a toy regression with wgrad's own ops and autograd, plain SGD.
//!
//! Shapes: x (N, 2) inputs in [-1, 1); y (N, 1) = sin(3 x0) * x1 + 0.5 x0^2; hidden H = 64.
//! Each step records forward, backward and the update into one Segment; reading the loss is
//! the step's only submit. Prints the loss, the dispatches recorded by forward and backward,
//! submits and buffers created per step.
//!
//! Run: `cargo run --release --example mlp`

use wgrad::{no_grad, Device, Phase, Result, Tensor};

const N: usize = 256;
const H: usize = 64;
const STEPS: usize = 300;
const LR: f32 = 0.1;

fn main() -> Result<()> {
    let dev = Device::new()?;
    println!("adapter: {}", dev.report().adapter);

    // The data, made on the host (a fixed pseudo-random grid).
    let xs: Vec<f32> = (0..N * 2)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let ys: Vec<f32> = (0..N)
        .map(|i| (3.0 * xs[2 * i]).sin() * xs[2 * i + 1] + 0.5 * xs[2 * i] * xs[2 * i])
        .collect();
    let x = Tensor::from_slice(&dev, &xs, &[N, 2])?; // (N, 2)
    let y = Tensor::from_slice(&dev, &ys, &[N, 1])?; // (N, 1)

    // Parameters (Kaiming-style scales).
    let w1 = Tensor::rand_normal(&dev, &[2, H], 0.0, 1.0, 1)?.requires_grad(); // (2, H)
    let b1 = Tensor::zeros(&dev, &[H])?.requires_grad(); // (H)
    let w2 =
        Tensor::rand_normal(&dev, &[H, 1], 0.0, (1.0f32 / H as f32).sqrt(), 2)?.requires_grad(); // (H, 1)
    let b2 = Tensor::zeros(&dev, &[1])?.requires_grad(); // (1)
    let params = [&w1, &b1, &w2, &b2];

    let mut first_loss = None;
    let mut last_loss = 0.0;
    for step in 0..STEPS {
        let before = dev.counters();
        let pool_before = dev.pool_stats().buffers_created;

        dev.set_phase(Phase::Forward);
        let h = x.matmul(&w1)?.add(&b1)?.tanh()?; // (N, H)
        let pred = h.matmul(&w2)?.add(&b2)?; // (N, 1)
        let loss = pred.sub(&y)?.square()?.mean_all()?; // ()

        for p in params {
            p.zero_grad();
        }
        loss.backward()?;

        dev.set_phase(Phase::Optimizer);
        no_grad(|| -> Result<()> {
            for p in params {
                let g = p.grad().expect("every parameter is reached by backward");
                p.add_scaled_(&g, -LR)?;
            }
            Ok(())
        })?;
        dev.set_phase(Phase::Forward);

        let value = loss.item()?; // the step's one submit
        let c = dev.counters() - before;
        let created = dev.pool_stats().buffers_created - pool_before;
        first_loss.get_or_insert(value);
        last_loss = value;
        if step % 50 == 0 || step == STEPS - 1 {
            println!(
                "step {step:>4}  loss {value:>10.6}  dispatches: forward {} backward {} optimizer {}  submits {}  buffers created {created}",
                c.forward_dispatches, c.backward_dispatches, c.optimizer_dispatches, c.submits
            );
        }
    }
    let first = first_loss.expect("at least one step ran");
    println!(
        "loss {first:.6} -> {last_loss:.6} ({:.1}x lower)",
        first / last_loss
    );
    Ok(())
}
