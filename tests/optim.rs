//! AdamW (fused, flat chunks, GPU-side gradient clipping) against a CPU f64 AdamW written from
//! PyTorch's formulas.

mod common;

use common::reference::CpuAdamW;
use common::{assert_close, private_dev, rand_vec, rng};
use wgrad::nn::{ParamSpec, Parameters};
use wgrad::optim::{AdamW, AdamWConfig};
use wgrad::{Result, Tensor};

fn run(clip: Option<f32>) -> Result<()> {
    let dev = private_dev();
    let mut r = rng("adamw");
    let specs = vec![
        ParamSpec {
            name: "b".into(),
            shape: vec![7],
            decay: false,
        },
        ParamSpec {
            name: "w".into(),
            shape: vec![5, 7],
            decay: true,
        },
        ParamSpec {
            name: "w2".into(),
            shape: vec![3],
            decay: true,
        },
    ];
    let params = Parameters::new(&dev, &specs)?;
    let mut init = Vec::new();
    let mut coef = Vec::new();
    let mut decay = Vec::new();
    for s in &specs {
        let n: usize = s.shape.iter().product();
        let values = rand_vec(&mut r, n, -1.0, 1.0);
        params.get(&s.name).unwrap().copy_from_slice(&values)?;
        init.extend(values.iter().map(|&v| v as f64));
        coef.push(rand_vec(&mut r, n, -2.0, 2.0));
        decay.extend(std::iter::repeat_n(s.decay, n));
    }
    let config = AdamWConfig {
        betas: (0.9, 0.95),
        eps: 1e-8,
        weight_decay: 0.1,
        max_grad_norm: clip,
    };
    let mut opt = AdamW::new(&params, config)?;
    let mut cpu = CpuAdamW {
        m: vec![0.0; init.len()],
        v: vec![0.0; init.len()],
        t: 0,
    };
    let mut p_ref = init.clone();
    let lr = 0.05;
    for step in 0..3 {
        // loss = sum_k sum(p_k * step_scale * c_k): gradient step_scale * c_k.
        let scale = 1.0 + step as f32;
        let mut loss = Tensor::zeros(&dev, &[])?;
        for (s, c) in specs.iter().zip(&coef) {
            let ct = Tensor::from_slice(&dev, c, &s.shape)?.mul_scalar(scale)?;
            loss = loss.add(&params.get(&s.name).unwrap().mul(&ct)?.sum_all()?)?;
        }
        loss.backward()?;
        opt.step(&params, lr as f32)?;
        let mut g: Vec<f64> = coef.iter().flatten().map(|&c| (c * scale) as f64).collect();
        if let Some(max) = clip {
            let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
            let k = (max as f64 / (norm + 1e-6)).min(1.0);
            g.iter_mut().for_each(|x| *x *= k);
        }
        cpu.step(&mut p_ref, &g, &decay, lr, &config);
    }
    let mut got = Vec::new();
    for s in &specs {
        got.extend(params.get(&s.name).unwrap().to_vec()?);
    }
    assert_close(
        &got,
        &p_ref,
        1e-5,
        &format!("parameters after 3 AdamW steps (clip {clip:?})"),
    );
    Ok(())
}

#[test]
fn adamw_matches_pytorch_formulas() -> Result<()> {
    run(None)
}

#[test]
fn adamw_with_gradient_clipping_on_the_gpu() -> Result<()> {
    run(Some(0.5))
}

#[test]
fn an_optimizer_step_is_one_dispatch_per_chunk_plus_the_norm() -> Result<()> {
    let dev = private_dev();
    let specs: Vec<ParamSpec> = (0..20)
        .map(|i| ParamSpec {
            name: format!("p{i}"),
            shape: vec![3 + i, 5],
            decay: i % 3 != 0,
        })
        .collect();
    let params = Parameters::new(&dev, &specs)?;
    let mut opt = AdamW::new(
        &params,
        AdamWConfig {
            max_grad_norm: Some(1.0),
            ..Default::default()
        },
    )?;
    let mut loss = Tensor::zeros(&dev, &[])?;
    for (_, p) in params.iter() {
        loss = loss.add(&p.square()?.sum_all()?)?;
    }
    loss.backward()?;
    dev.sync()?;
    let c0 = dev.counters();
    opt.step(&params, 1e-3)?;
    let c = dev.counters() - c0;
    // One chunk: norm stage 1 + stage 2 + one AdamW dispatch, for 20 parameters.
    assert_eq!(c.optimizer_dispatches, 3);
    assert_eq!(c.submits, 0, "the step records; nothing is read back");
    Ok(())
}

#[test]
fn adamw_refuses_a_parameter_set_it_was_not_built_for() -> Result<()> {
    let dev = private_dev();
    let a = Parameters::new(
        &dev,
        &[ParamSpec {
            name: "w".into(),
            shape: vec![4, 4],
            decay: true,
        }],
    )?;
    let b = Parameters::new(
        &dev,
        &[ParamSpec {
            name: "w".into(),
            shape: vec![5, 4],
            decay: true,
        }],
    )?;
    let mut opt = AdamW::new(&a, AdamWConfig::default())?;
    let err = opt.step(&b, 1e-3).unwrap_err().to_string();
    assert!(
        err.contains("AdamW") && err.contains("[16]") && err.contains("[20]"),
        "{err}"
    );
    Ok(())
}
