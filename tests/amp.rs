//! Mixed precision end to end (on lavapipe: the tiled f16 matmul; on a GPU with cooperative
//! matrices, the tensor-core kernel): the tiny preset's loss tracks f32 over 50 steps, the f16
//! weight copies follow the optimizer, no cast kernel runs in a step, and dynamic loss scaling
//! skips an overflowing step (nothing moves, the scale halves) and grows the scale after clean
//! steps, all without a host read-back inside the step.

mod common;

use common::{private_dev, relative};
use wgrad::nn::{Decoder, ModelConfig};
use wgrad::optim::{AdamWConfig, LossScaleConfig, LrSchedule};
use wgrad::session::{Event, RunControl, TrainOptions, TrainSession};
use wgrad::train::Trainer;
use wgrad::{Device, Result, Tensor};

fn losses(dev: &Device, amp: bool, steps: usize) -> Result<Vec<f32>> {
    let options = TrainOptions {
        steps,
        amp,
        ..Default::default()
    };
    let mut session = TrainSession::new(dev, options)?;
    let mut out = Vec::new();
    session.run(&RunControl::default(), |e| {
        if let Event::Step(r) = e {
            out.push(r.loss);
        }
    })?;
    Ok(out)
}

/// The out-of-the-box run (tiny preset, bundled corpus, lr 2e-3) with and without --amp.
/// Bound: every step's loss within 1% of f32's (f16 operands carry 11 bits; the gap measured
/// on lavapipe is 0.14%, printed by the test).
#[test]
fn tiny_preset_loss_with_amp_tracks_f32_over_50_steps() -> Result<()> {
    let dev = private_dev();
    let f32_losses = losses(&dev, false, 50)?;
    let amp_losses = losses(&dev, true, 50)?;
    assert_eq!(f32_losses.len(), 50);
    assert_eq!(amp_losses.len(), 50);
    let mut worst = 0f32;
    for (i, (a, f)) in amp_losses.iter().zip(&f32_losses).enumerate() {
        assert!(a.is_finite(), "step {}: amp loss {a}", i + 1);
        let rel = (a - f).abs() / f;
        worst = worst.max(rel);
        assert!(
            rel < 0.01,
            "step {}: amp loss {a} vs f32 {f} (relative gap {rel:.4})",
            i + 1
        );
    }
    println!(
        "amp vs f32 over 50 steps: worst relative gap {worst:.5}; losses {:.4} -> {:.4} (amp), \
         {:.4} -> {:.4} (f32)",
        amp_losses[0], amp_losses[49], f32_losses[0], f32_losses[49]
    );
    assert!(
        amp_losses[49] < amp_losses[0] - 1.0,
        "the amp loss falls: {amp_losses:?}"
    );
    Ok(())
}

fn config() -> ModelConfig {
    ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.02,
        ..ModelConfig::gpt2(97, 32, 32, 2, 4)
    }
}

fn batch(dev: &Device) -> Result<(Tensor, Tensor)> {
    let ids: Vec<u32> = (0..2 * 17).map(|i| (i * 7919 + 13) % 97).collect();
    let x: Vec<u32> = (0..2)
        .flat_map(|r| ids[r * 17..r * 17 + 16].to_vec())
        .collect();
    let y: Vec<u32> = (0..2)
        .flat_map(|r| ids[r * 17 + 1..(r + 1) * 17].to_vec())
        .collect();
    Ok((
        Tensor::from_u32(dev, &x, &[2, 16])?,
        Tensor::from_u32(dev, &y, &[2, 16])?,
    ))
}

fn trainer(dev: &Device, amp: bool) -> Result<Trainer> {
    let mut model = Decoder::new(dev, config(), 3)?;
    model.set_amp(amp)?;
    let adamw = AdamWConfig {
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    Trainer::new(model, adamw, 1e-3, LrSchedule::Constant { warmup: 0 })
}

fn snapshot(t: &Trainer) -> Result<Vec<Vec<f32>>> {
    t.model.params.iter().map(|(_, p)| p.to_vec()).collect()
}

#[test]
fn f16_copies_follow_the_optimizer_and_no_cast_runs_in_a_step() -> Result<()> {
    let dev = private_dev();
    let b = batch(&dev)?;
    let mut plain = trainer(&dev, false)?;
    let mut amp = trainer(&dev, true)?;
    let mut counts = Vec::new();
    let mut kernels = Vec::new();
    let timed = dev.set_gpu_timing(true) == Some(wgrad::graph::TimingMode::PerDispatch);
    for t in [&mut plain, &mut amp] {
        t.step(std::slice::from_ref(&b))?.item()?;
        let _ = dev.take_gpu_intervals()?;
        let before = dev.counters().dispatches;
        t.step(std::slice::from_ref(&b))?.item()?;
        counts.push(dev.counters().dispatches - before);
        let labels: Vec<&str> = dev.take_gpu_intervals()?.iter().map(|i| i.label).collect();
        kernels.push(labels);
    }
    dev.set_gpu_timing(false);
    // The same kernels but the loss scale's update (the norm runs for clipping in both) and,
    // where the cooperative-matrix kernel stores a residual linear's tiles straight to C, the
    // residual's add (a second dispatch: `Epilogue::BiasResidual`; the f32 kernel adds it in
    // its epilogue). The linears whose output has 3 K columns or more read f16 inputs, but
    // each of those inputs is a LayerNorm's output (ln_1 before the attention's qkv, 3 x 32 of
    // 32; ln_2 before the MLP's first, 128 of 32; ln_f before the LM head), which the
    // LayerNorm kernel stores as f16 itself: no cast kernel.
    let count = |k: &[&str], name: &str| k.iter().filter(|&&l| l == name).count() as i64;
    let most = 2 * config().n_layer as u64;
    if timed {
        for k in ["cast", "convert"] {
            assert!(
                !kernels[1].contains(&k),
                "a {k} kernel in the amp step: {:?}",
                kernels[1]
            );
        }
        assert_eq!(count(&kernels[1], "loss_scale_update"), 1);
        // A residual copied into its product: a `unary` right after a bias product.
        let copies = kernels[1]
            .windows(2)
            .filter(|w| w[0] == "matmul_coop_bias" && w[1] == "unary")
            .count() as i64;
        assert!(copies <= most as i64, "{kernels:?}");
        // Besides those, the loss scale's seed of the gradients is a copy (`unary`) where the
        // f32 step fills them: nothing else differs in kind.
        let unary = count(&kernels[1], "unary") - count(&kernels[0], "unary");
        let fill = count(&kernels[0], "fill") - count(&kernels[1], "fill");
        assert_eq!(unary - copies, fill, "{kernels:?}");
        // Where the f32 step's products run on cooperative matrices (X3), each reads its
        // operands' magnitudes from an `absmax` dispatch before it; the amp step's none.
        let absmax = count(&kernels[0], "absmax");
        assert_eq!(count(&kernels[1], "absmax"), 0, "{kernels:?}");
        assert_eq!(
            counts[1] as i64,
            counts[0] as i64 - absmax + 1 + copies,
            "dispatches per step, f32 then amp: {counts:?}"
        );
    } else {
        assert!(
            (counts[0] + 1..=counts[0] + 1 + most).contains(&counts[1]),
            "dispatches per step, f32 then amp: {counts:?}"
        );
    }
    for (name, p) in amp.model.params.iter() {
        if let Some(h) = amp.model.params.half(name) {
            let want: Vec<f32> = p
                .to_vec()?
                .iter()
                .map(|&x| half::f16::from_f32(x).to_f32())
                .collect();
            assert_eq!(
                h.to_vec()?,
                want,
                "{name}: the f16 copy is the updated value rounded"
            );
        }
    }
    assert!(amp.model.params.half("h.0.mlp.c_fc.weight").is_some());
    assert!(
        amp.model.params.half("h.0.ln_1.weight").is_none(),
        "no copy of a LayerNorm weight"
    );
    Ok(())
}

#[test]
fn an_overflow_skips_the_step_and_halves_the_scale() -> Result<()> {
    let dev = private_dev();
    let b = batch(&dev)?;
    let mut t = trainer(&dev, true)?;
    // A scale no f16 gradient survives.
    t.opt.enable_loss_scaling(
        &t.model.params,
        LossScaleConfig {
            init_scale: 1e30,
            ..Default::default()
        },
    )?;
    let before = snapshot(&t)?;
    let loss = t.step(std::slice::from_ref(&b))?.item()?;
    assert!(loss.is_finite(), "the forward is unaffected: {loss}");
    assert_eq!(snapshot(&t)?, before, "a skipped step moves no parameter");
    let s = t.opt.loss_scale()?.expect("scaling is on");
    assert_eq!((s.scale, s.applied_steps, s.skipped_steps), (5e29, 0, 1));
    Ok(())
}

#[test]
fn clean_steps_grow_the_scale_and_count_for_the_bias_correction() -> Result<()> {
    let dev = private_dev();
    let b = batch(&dev)?;
    let mut t = trainer(&dev, true)?;
    t.opt.enable_loss_scaling(
        &t.model.params,
        LossScaleConfig {
            init_scale: 1024.0,
            growth_interval: 2,
            ..Default::default()
        },
    )?;
    let mut scales = Vec::new();
    for _ in 0..5 {
        let before = snapshot(&t)?;
        t.step(std::slice::from_ref(&b))?;
        assert_ne!(snapshot(&t)?, before, "a clean step updates the parameters");
        scales.push(t.opt.loss_scale()?.expect("scaling is on"));
    }
    let got: Vec<(f32, u64, u64)> = scales
        .iter()
        .map(|s| (s.scale, s.applied_steps, s.skipped_steps))
        .collect();
    assert_eq!(
        got,
        [
            (1024.0, 1, 0),
            (2048.0, 2, 0),
            (2048.0, 3, 0),
            (4096.0, 4, 0),
            (4096.0, 5, 0)
        ]
    );
    Ok(())
}

/// The loss and the gradients of one mixed-precision backward against f32's: the loss scale
/// divides out, and the f16 rounding of the matmul operands costs well under 1e-2.
#[test]
fn amp_gradients_match_f32_within_f16_rounding() -> Result<()> {
    let dev = private_dev();
    let (x, y) = batch(&dev)?;
    let mut model = Decoder::new(&dev, config(), 5)?;
    let mut runs = Vec::new();
    for amp in [false, true] {
        model.set_amp(amp)?;
        model.params.zero_grad();
        let loss = model.loss(&x, &y)?;
        loss.backward()?;
        let grads: Vec<(String, Vec<f32>)> = model
            .params
            .iter()
            .map(|(n, p)| Ok((n.to_string(), p.grad().expect("a gradient").to_vec()?)))
            .collect::<Result<_>>()?;
        runs.push((loss.item()?, grads));
    }
    let (l32, g32) = &runs[0];
    let (l16, g16) = &runs[1];
    assert!((l32 - l16).abs() < 1e-3 * l32, "loss {l16} vs {l32}");
    for ((name, a), (_, b)) in g16.iter().zip(g32) {
        let err = relative(a, b);
        assert!(err < 1e-2, "{name}: relative gradient error {err:.2e}");
    }
    Ok(())
}
