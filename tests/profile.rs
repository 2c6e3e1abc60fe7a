//! The profiler over a small training step: GPU time per kernel, CPU phases from spans,
//! counters, and a Chrome trace with both tracks.

use wgrad::nn::{ParamSpec, Parameters};
use wgrad::ops::Activation;
use wgrad::optim::{AdamW, AdamWConfig};
use wgrad::profile::{chrome_trace, Profiler};
use wgrad::{Device, Result, Tensor};

#[test]
fn profile_of_a_training_step() -> Result<()> {
    let dev = Device::new()?;
    let specs = [
        ParamSpec {
            name: "w1".into(),
            shape: vec![16, 32],
            decay: true,
        },
        ParamSpec {
            name: "b1".into(),
            shape: vec![32],
            decay: false,
        },
        ParamSpec {
            name: "w2".into(),
            shape: vec![32, 10],
            decay: true,
        },
    ];
    let params = Parameters::new(&dev, &specs)?;
    for (i, (_, p)) in params.iter().enumerate() {
        p.fill_normal_(0.0, 0.2, i as u64)?;
    }
    let mut opt = AdamW::new(&params, AdamWConfig::default())?;
    let x = Tensor::rand_uniform(&dev, &[8, 16], -1.0, 1.0, 9)?;
    let targets: Vec<u32> = (0..8).map(|i| i % 10).collect();
    let targets = Tensor::from_u32(&dev, &targets, &[8])?;
    let p = |n: &str| params.get(n).expect("declared above").clone();

    let mut prof = Profiler::new(&dev);
    for _ in 0..5 {
        prof.step(|| {
            let loss = {
                let _span = tracing::info_span!("forward").entered();
                let h = x.linear(&p("w1"), Some(&p("b1")), Activation::Gelu)?;
                h.matmul(&p("w2"))?.cross_entropy(&targets, None)?
            };
            {
                let _span = tracing::info_span!("backward").entered();
                loss.backward()?;
            }
            {
                let _span = tracing::info_span!("optimizer").entered();
                opt.step(&params, 1e-2)?;
            }
            loss.item()
        })?;
    }
    let r = prof.report(2);
    assert!(r.submits_per_step <= 3.0, "{}", r.to_text());
    assert_eq!(r.buffers_created_per_step, 0.0, "{}", r.to_text());
    // (f32 products on cooperative matrices where the Device puts them there: X3.)
    let gelu = if dev.f32_on_tensor_cores() {
        "matmul_coop_bias_gelu"
    } else {
        "matmul_bias_gelu"
    };
    assert!(r.kernels.iter().any(|k| k.name == gelu), "{}", r.to_text());
    assert!(
        r.kernels.iter().any(|k| k.name == "adamw"),
        "{}",
        r.to_text()
    );
    let total: f64 = r.kernels.iter().map(|k| k.count).sum();
    assert_eq!(total, r.dispatches_per_step, "every dispatch is timed");
    for phase in [
        "forward",
        "backward",
        "optimizer",
        "encode+submit",
        "waiting on the GPU",
    ] {
        assert!(
            r.phases.iter().any(|p| p.phase == phase),
            "phase {phase} missing: {}",
            r.to_text()
        );
    }
    let json = serde_json::to_value(&r).expect("serializes");
    for key in [
        "step_ms",
        "step0_ms",
        "step0_compile_ms",
        "step0_compile_wait_ms",
        "gpu_idle_between_ms",
        "submits_per_step",
        "dispatches_per_step",
        "buffers_created_per_step",
        "pool_hit_rate",
        "kernels",
    ] {
        assert!(json.get(key).is_some(), "key {key}");
    }
    let trace = chrome_trace(&prof.steps);
    let events = trace["traceEvents"].as_array().expect("an event list");
    assert!(
        events.iter().any(|e| e["tid"] == 2 && e["name"] == "adamw"),
        "GPU track"
    );
    assert!(
        events
            .iter()
            .any(|e| e["tid"] == 1 && e["name"] == "backward"),
        "CPU track"
    );
    Ok(())
}
