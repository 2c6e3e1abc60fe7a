//! wgrad's GPT-2 against Hugging Face transformers on the same weights and batch
//! (tests/fixtures/gpt2-small, made by tests/fixtures/make_gpt2_fixtures.py on an H200 with
//! torch 2.11 and transformers 5.17, reference computed in float64): logits, loss, every
//! parameter's gradient by its Hugging Face name, and every parameter after 3 AdamW steps.
//! Each check runs twice: on the default device, and with a binding cap (96 KiB) under the
//! 128 KiB embedding, which the model then holds as 2 row shards.

mod common;

use std::path::Path;

use common::golden::{assert_after_adamw, shifted, Expected};
use common::{assert_close, dev_with, private_dev};
use wgrad::model::load_pretrained;
use wgrad::nn::Decoder;
use wgrad::{Result, Tensor};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt2-small");

/// The fixture's model on the default device (`split` false: wte whole), or on one whose
/// bindings hold 96 KiB: wte (512 x 64 f32, 128 KiB) in 2 row shards, every other tensor whole.
fn model(split: bool) -> Result<Decoder> {
    let dev = if split {
        dev_with(|o| o.adapter.max_storage_binding = Some(96 << 10))
    } else {
        private_dev()
    };
    let (cfg, params) = load_pretrained(&dev, Path::new(DIR))?;
    let shards = params.shards("wte.weight").map(|s| s.len());
    assert_eq!(shards, Some(if split { 2 } else { 1 }), "wte's shards");
    Decoder::from_params(cfg.model, params)
}

#[test]
fn logits_and_loss_match_transformers() -> Result<()> {
    logits_and_loss(false)
}

#[test]
fn logits_and_loss_match_transformers_with_a_split_embedding() -> Result<()> {
    logits_and_loss(true)
}

fn logits_and_loss(split: bool) -> Result<()> {
    let exp = Expected::load(Path::new(DIR));
    let model = model(split)?;
    let ids = exp.ids();
    let x = Tensor::from_u32(model.params.device(), &ids, &[2, ids.len() / 2])?;
    let logits = model.forward(&x)?.to_vec()?;
    assert_close(&logits, &exp.f32s("logits"), 1e-4, "logits");
    let (x, y) = shifted(model.params.device(), &ids)?;
    let loss = model.loss(&x, &y)?.item()?;
    let want = exp.f32s("loss")[0];
    assert!(
        (want - (512f64).ln()).abs() > 0.5,
        "the fixture's loss {want} is too close to ln(V)"
    );
    assert_close(&[loss], &[want], 1e-4, "loss");
    Ok(())
}

#[test]
fn every_gradient_matches_transformers() -> Result<()> {
    every_gradient(false)
}

#[test]
fn every_gradient_matches_transformers_with_a_split_embedding() -> Result<()> {
    every_gradient(true)
}

fn every_gradient(split: bool) -> Result<()> {
    let exp = Expected::load(Path::new(DIR));
    let model = model(split)?;
    let (x, y) = shifted(model.params.device(), &exp.ids())?;
    model.loss(&x, &y)?.backward()?;
    for spec in model.params.specs() {
        let name = &spec.name;
        let got = model
            .params
            .read_grad(name)?
            .unwrap_or_else(|| panic!("{name} has no gradient"));
        assert_close(
            &got,
            &exp.f32s(&format!("grad.{name}")),
            1e-3,
            &format!("grad of {name}"),
        );
    }
    Ok(())
}

#[test]
fn parameters_after_three_adamw_steps_match_torch() -> Result<()> {
    three_adamw_steps(false)
}

#[test]
fn parameters_after_three_adamw_steps_match_torch_with_a_split_embedding() -> Result<()> {
    three_adamw_steps(true)
}

fn three_adamw_steps(split: bool) -> Result<()> {
    let exp = Expected::load(Path::new(DIR));
    let model = model(split)?;
    let (x, y) = shifted(model.params.device(), &exp.ids())?;
    let losses = common::golden::three_adamw_steps(&model, &x, &y)?;
    assert_close(
        &losses,
        &exp.f32s("adamw.losses"),
        1e-4,
        "losses before each step and after the last",
    );
    for spec in model.params.specs() {
        let name = &spec.name;
        // Rounding noise here: the key bias's analytically zero gradient (|g| ~ 1e-17 in the
        // float64 reference).
        assert_after_adamw(
            &model.params.read(name)?,
            &exp.f32s(&format!("adamw3.{name}")),
            &exp.f32s(&format!("grad.{name}")),
            1e-9,
            name,
        );
    }
    Ok(())
}
