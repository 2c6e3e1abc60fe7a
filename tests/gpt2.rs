//! The GPT-2 model built from the fused kernels: the same loss and gradients as its unfused
//! reference composition, dispatch counts of a block that do not grow with the input, and a
//! small model that learns a fixed batch.

mod common;

use common::{assert_close, dev_with, private_dev};
use wgrad::memory::Reuse;
use wgrad::nn::{Decoder, Kernels, ModelConfig};
use wgrad::optim::{AdamW, AdamWConfig, LrSchedule};
use wgrad::train::Trainer;
use wgrad::{Device, Result, Tensor};

fn config(n_layer: usize) -> ModelConfig {
    ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.2, // large weights: a loss far from ln(vocab), so the check proves something
        ..ModelConfig::gpt2(97, 32, 32, n_layer, 4)
    }
}

fn batch(dev: &Device, b: usize, t: usize, vocab: u32) -> Result<(Tensor, Tensor)> {
    common::next_token_batch(dev, b, t, vocab)
}

#[test]
fn fused_model_matches_its_unfused_reference() -> Result<()> {
    let dev = private_dev();
    let mut model = Decoder::new(&dev, config(2), 7)?;
    let (x, y) = batch(&dev, 2, 13, 97)?;
    let mut runs = Vec::new();
    for kernels in [Kernels::Fused, Kernels::Reference] {
        model.kernels = kernels;
        model.params.zero_grad();
        let loss = model.loss(&x, &y)?;
        loss.backward()?;
        let mut grads = Vec::new();
        for (name, p) in model.params.iter() {
            grads.push((
                name.to_string(),
                p.grad()
                    .expect("every parameter gets a gradient")
                    .to_vec()?,
            ));
        }
        runs.push((loss.item()?, grads));
    }
    let (fused, reference) = (&runs[0], &runs[1]);
    assert!(
        (fused.0 - (97f32).ln()).abs() > 0.5,
        "loss {} is too close to ln(vocab)",
        fused.0
    );
    assert_close(&[fused.0], &[reference.0 as f64], 1e-5, "loss");
    for ((name, g), (_, r)) in fused.1.iter().zip(&reference.1) {
        let want: Vec<f64> = r.iter().map(|&v| v as f64).collect();
        assert_close(g, &want, 1e-4, name);
    }
    Ok(())
}

/// Dispatches of one block's forward and backward at (B, T).
fn block_dispatches(b: usize, t: usize) -> Result<(u64, u64)> {
    let dev = private_dev();
    let model = Decoder::new(&dev, config(1), 3)?;
    let x = Tensor::rand_normal(&dev, &[b, t, 32], 0.0, 1.0, 5)?.requires_grad();
    dev.sync()?;
    let c0 = dev.counters();
    let out = model.block(0, &x)?;
    let c1 = dev.counters();
    out.backward_with(&Tensor::ones(&dev, &[b, t, 32])?)?;
    let c2 = dev.counters();
    // The seed fill is recorded in the forward phase; count it out.
    Ok(((c1 - c0).forward_dispatches, (c2 - c1).backward_dispatches))
}

#[test]
fn block_dispatch_counts_do_not_grow_with_the_input() -> Result<()> {
    let small = block_dispatches(1, 5)?;
    let large = block_dispatches(3, 31)?;
    assert_eq!(
        small, large,
        "(forward, backward) dispatches of one GPT-2 block"
    );
    println!(
        "one GPT-2 block: {} forward dispatches, {} backward dispatches",
        small.0, small.1
    );
    Ok(())
}

#[test]
fn a_small_gpt2_learns_a_fixed_batch() -> Result<()> {
    let dev = private_dev();
    let model = Decoder::new(
        &dev,
        ModelConfig {
            initializer_range: 0.02,
            ..config(2)
        },
        11,
    )?;
    let mut opt = AdamW::new(
        &model.params,
        AdamWConfig {
            max_grad_norm: Some(1.0),
            ..Default::default()
        },
    )?;
    let (x, y) = batch(&dev, 4, 16, 97)?;
    let mut losses = Vec::new();
    let mut submits = Vec::new();
    for _ in 0..30 {
        let c0 = dev.counters();
        let loss = model.loss(&x, &y)?;
        loss.backward()?;
        opt.step(&model.params, 3e-3)?;
        losses.push(loss.item()?);
        submits.push((dev.counters() - c0).submits);
    }
    assert!(losses[29] < 0.5 * losses[0], "{losses:?}");
    assert!(
        submits.iter().all(|&s| s <= 3),
        "submits per step {submits:?}"
    );
    Ok(())
}

/// A trainer of a 2-layer model (seed 5), constant learning rate 1e-3.
fn two_layer_trainer(dev: &Device) -> Result<Trainer> {
    let model = Decoder::new(dev, config(2), 5)?;
    Trainer::new(
        model,
        AdamWConfig::default(),
        1e-3,
        LrSchedule::Constant { warmup: 0 },
    )
}

/// Pipelines compile on worker threads: a cold step (every variant new) records on while they
/// compile, waits for them where it flushes, and gives the same losses, bit for bit, as a
/// device that compiles each variant where it is recorded; warm steps submit three times.
#[test]
fn a_cold_step_compiles_on_workers_with_the_same_result() -> Result<()> {
    let run = |threads: usize| -> Result<(Vec<f32>, Vec<u64>, wgrad::kernels::PipelineStats)> {
        let dev = dev_with(|o| o.execution.compile_threads = Some(threads));
        let (x, y) = batch(&dev, 2, 16, 97)?;
        let mut t = two_layer_trainer(&dev)?;
        let (mut losses, mut submits) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let c0 = dev.counters();
            losses.push(t.step(&[(x.clone(), y.clone())])?.item()?);
            submits.push((dev.counters() - c0).submits);
        }
        Ok((losses, submits, dev.pipeline_stats()))
    };
    let (inline, inline_submits, inline_stats) = run(0)?;
    let (workers, submits, stats) = run(3)?;
    assert_eq!(workers, inline, "losses of three steps");
    assert_eq!(inline_stats.compile_threads, 0);
    assert_eq!(stats.compile_threads, 3);
    assert_eq!(stats.pipelines_compiled, inline_stats.pipelines_compiled);
    assert!(stats.compile_ms > 0.0, "{stats:?}");
    // Compiled where recorded, every step submits early; with workers a cold step skips the
    // early submits that would wait for a compile (how many depends on the compiles' speed;
    // src/graph/runtime.rs tests it with a held worker), warm ones are 3.
    assert_eq!(inline_submits, [3, 3, 3]);
    assert!((1..=3).contains(&submits[0]), "{submits:?}");
    assert_eq!(submits[1..], [3, 3]);
    Ok(())
}

/// A training step submits three times: its first dispatches as soon as they are recorded (the
/// GPU starts on them while the CPU records the rest of the forward), the rest of the forward
/// before the backward is recorded, and the rest; the loss is the same as one submit gives.
#[test]
fn a_training_step_submits_its_first_layers_early() -> Result<()> {
    let dev = private_dev();
    let (x, y) = batch(&dev, 2, 16, 97)?;
    let mut t = two_layer_trainer(&dev)?;
    t.step(&[(x.clone(), y.clone())])?.item()?;
    dev.sync()?;
    let c0 = dev.counters();
    let loss = t.step(&[(x.clone(), y.clone())])?;
    let recorded = dev.counters() - c0;
    assert_eq!(recorded.submits, 2, "before the read-back: {recorded:?}");
    let second = loss.item()?;
    assert_eq!((dev.counters() - c0).submits, 3);

    // The same two steps recorded by hand (one submit each, at the read-back).
    let model = Decoder::new(&dev, config(2), 5)?;
    let mut opt = AdamW::new(&model.params, AdamWConfig::default())?;
    let mut want = 0.0;
    for _ in 0..2 {
        let c = dev.counters();
        let loss = model.loss(&x, &y)?;
        loss.backward()?;
        opt.step(&model.params, 1e-3)?;
        want = loss.item()?;
        assert_eq!((dev.counters() - c).submits, 1);
    }
    assert_eq!(second, want, "the loss of the second step");
    Ok(())
}

/// A trainer's steps repeat, so the pool keeps the buffers a Segment gives back for the next
/// Segment (`memory::Reuse::REPEATING`) and makes new ones meanwhile: the dispatches that write
/// them go without a barrier (fewer per step than with every buffer reused at once), no buffer
/// is made after the first steps, and the losses are the same, bit for bit.
#[test]
fn training_steps_write_new_buffers_beside_earlier_work() -> Result<()> {
    let run = |reuse: Option<Reuse>| -> Result<(Vec<f32>, Vec<u64>, Vec<u64>)> {
        let dev = private_dev();
        let (x, y) = batch(&dev, 2, 16, 97)?;
        let mut t = two_layer_trainer(&dev)?;
        if let Some(reuse) = reuse {
            dev.set_pool_reuse(reuse);
        }
        let (mut losses, mut barriers, mut created) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..4 {
            let (c0, b0) = (dev.counters(), dev.pool_stats().buffers_created);
            losses.push(t.step(&[(x.clone(), y.clone())])?.item()?);
            barriers.push((dev.counters() - c0).barriers);
            created.push(dev.pool_stats().buffers_created - b0);
        }
        Ok((losses, barriers, created))
    };
    let (any, any_barriers, any_created) = run(Some(Reuse::Any))?;
    let (losses, barriers, created) = run(Some(Reuse::AcrossSegments {
        budget: Some(1 << 30),
    }))?;
    assert_eq!(losses, any, "losses of four steps");
    assert!(
        barriers[3] < any_barriers[3],
        "barriers a step: {barriers:?} against {any_barriers:?}"
    );
    assert_eq!(any_created[1..], [0, 0, 0], "{any_created:?}");
    assert_eq!(created[2..], [0, 0], "{created:?}");
    assert!(
        created[0] > any_created[0],
        "{created:?} against {any_created:?}"
    );
    Ok(())
}
