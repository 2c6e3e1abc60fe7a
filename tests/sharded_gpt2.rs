//! GPT-2 with its token embedding split into row shards, as on an adapter whose storage
//! bindings are smaller than the embedding (lavapipe's 128 MiB against DistilGPT-2's 154 MB
//! wte), forced on any adapter by a lowered binding cap (`AdapterChoice::max_storage_binding`,
//! `WGRAD_MAX_BINDING`). Against the same model, same seed, unsplit: logits, loss and every
//! gradient within 1e-5, the same losses over AdamW steps, the same generated logits; a save
//! holds one `wte.weight` (V, C) and loads back bitwise, split or not; a run cut short and
//! resumed repeats the uninterrupted losses bitwise.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_close, dev_with, private_dev, Scratch};
use safetensors::SafeTensors;
use wgrad::model::{
    load_pretrained, save_pretrained, Generator, HfConfig, Tokenizer, WEIGHTS_FILE,
};
use wgrad::nn::{Decoder, ModelConfig, ParamSpec, Parameters};
use wgrad::optim::{AdamW, AdamWConfig};
use wgrad::session::{
    Event, ModelSource, OptionFlags, RunControl, Schedule, TrainOptions, TrainSession,
};
use wgrad::{Device, Error, Result, Tensor};

/// A binding cap that splits the tiny preset's wte (50257 x 128 f32, 25.7 MB) into 3 shards
/// and still holds (2, 16, 50257) f32 logits (6.4 MB).
const TINY_CAP: u64 = 10 << 20;

fn capped_dev(cap: u64) -> Device {
    dev_with(|o| o.adapter.max_storage_binding = Some(cap))
}

fn tiny() -> ModelConfig {
    wgrad::assets::Preset::named("tiny")
        .and_then(|p| p.config())
        .expect("the tiny preset")
        .model
}

fn shard_count(model: &Decoder) -> usize {
    model.params.shards("wte.weight").expect("wte").len()
}

/// The tiny preset on a capped device (3 shards) and on the default one (1 shard), same seed.
fn split_and_whole(seed: u64) -> Result<(Decoder, Decoder)> {
    let split = Decoder::new(&capped_dev(TINY_CAP), tiny(), seed)?;
    let whole = Decoder::new(&private_dev(), tiny(), seed)?;
    assert_eq!(shard_count(&split), 3, "wte split under a 10 MiB cap");
    let limit = whole
        .params
        .device()
        .gpu()
        .limits
        .max_storage_buffer_binding_size;
    if limit >= 50257 * 128 * 4 {
        assert_eq!(
            shard_count(&whole),
            1,
            "wte whole under a {limit}-byte limit"
        );
        assert!(whole.params.get("wte.weight").is_some());
    }
    Ok((split, whole))
}

/// (B, T) inputs and next-token targets spread over the whole vocabulary (every shard).
fn batch(dev: &Device, b: usize, t: usize) -> Result<(Tensor, Tensor)> {
    let ids: Vec<u32> = (0..b * (t + 1))
        .map(|i| ((i as u64 * 7919 * 13 + 101) % 50257) as u32)
        .collect();
    let rows = |shift: usize| -> Vec<u32> {
        (0..b)
            .flat_map(|r| ids[r * (t + 1) + shift..r * (t + 1) + shift + t].to_vec())
            .collect()
    };
    Ok((
        Tensor::from_u32(dev, &rows(0), &[b, t])?,
        Tensor::from_u32(dev, &rows(1), &[b, t])?,
    ))
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn a_split_embedding_gives_the_unsplit_logits_loss_and_gradients() -> Result<()> {
    let (split, whole) = split_and_whole(3)?;
    for spec in whole.params.specs() {
        assert_eq!(
            split.params.read(&spec.name)?,
            whole.params.read(&spec.name)?,
            "{} initialized alike",
            spec.name
        );
    }
    let mut runs = Vec::new();
    for model in [&split, &whole] {
        let (x, y) = batch(model.params.device(), 2, 16)?;
        let logits = model.forward(&x)?;
        assert_eq!(logits.shape(), [2, 16, 50257]);
        let loss = model.loss(&x, &y)?;
        loss.backward()?;
        let mut grads = Vec::new();
        for spec in model.params.specs() {
            let g = model.params.read_grad(&spec.name)?;
            grads.push((
                spec.name.clone(),
                g.expect("every parameter gets a gradient"),
            ));
        }
        runs.push((logits.to_vec()?, loss.item()?, grads));
    }
    let (s, w) = (&runs[0], &runs[1]);
    assert_close(&s.0, &f64s(&w.0), 1e-5, "logits");
    assert_close(&[s.1], &[w.1 as f64], 1e-5, "loss");
    assert_eq!(s.2.len(), w.2.len());
    for ((name, gs), (_, gw)) in s.2.iter().zip(&w.2) {
        assert!(
            gw.iter().any(|&v| v != 0.0),
            "{name}: a gradient that is not all zero"
        );
        assert_close(gs, &f64s(gw), 1e-5, &format!("grad of {name}"));
    }
    Ok(())
}

#[test]
fn a_split_embedding_trains_as_the_unsplit_one() -> Result<()> {
    let (split, whole) = split_and_whole(4)?;
    let config = AdamWConfig {
        max_grad_norm: Some(1.0),
        ..Default::default()
    };
    let mut losses = Vec::new();
    for model in [&split, &whole] {
        let dev = model.params.device();
        let (x, y) = batch(dev, 2, 16)?;
        let mut opt = AdamW::new(&model.params, config)?;
        let mut run = Vec::new();
        for _ in 0..4 {
            let c0 = dev.counters();
            let loss = model.loss(&x, &y)?;
            loss.backward()?;
            opt.step(&model.params, 3e-3)?;
            run.push(loss.item()?);
            let c = dev.counters() - c0;
            assert!(c.submits <= 3, "{} submits in a step", c.submits);
        }
        losses.push(run);
    }
    assert!(
        losses[1][3] < losses[1][0],
        "the loss falls: {:?}",
        losses[1]
    );
    assert_close(&losses[0], &f64s(&losses[1]), 1e-5, "losses of 4 steps");
    Ok(())
}

#[test]
fn mixed_precision_over_a_split_embedding_matches_the_unsplit_one() -> Result<()> {
    let (mut split, mut whole) = split_and_whole(7)?;
    if !whole
        .params
        .device()
        .gpu()
        .has(wgrad::wgpu::Features::SHADER_F16)
    {
        eprintln!("skipped: the adapter has no shader-f16");
        return Ok(());
    }
    let mut runs = Vec::new();
    for model in [&mut split, &mut whole] {
        model.set_amp(true)?;
        // Every shard has its f16 copy: the head reads them.
        for shard in model.params.shards("wte.weight").expect("wte") {
            assert!(model.params.half(shard.name).is_some(), "{}", shard.name);
        }
        let (x, y) = batch(model.params.device(), 2, 16)?;
        let loss = model.loss(&x, &y)?;
        loss.backward()?;
        let wte = model
            .params
            .read_grad("wte.weight")?
            .expect("wte's gradient");
        let c_fc = model
            .params
            .read_grad("h.1.mlp.c_fc.weight")?
            .expect("a gradient");
        runs.push((loss.item()?, wte, c_fc));
    }
    let (s, w) = (&runs[0], &runs[1]);
    assert_close(&[s.0], &[w.0 as f64], 1e-5, "loss");
    // The split head sums dx over the shards in another order: its last bits differ, and where
    // a value then rounds to f16 (the next products' operands) that can become an f16 ulp
    // (2^-11 relative). Measured on lavapipe, 2026-11-22: 3.7e-5 at worst (gradients ~1e-2).
    assert_close(&s.1, &f64s(&w.1), 1e-4, "grad of wte.weight");
    assert_close(&s.2, &f64s(&w.2), 1e-4, "grad of h.1.mlp.c_fc.weight");
    Ok(())
}

#[test]
fn a_split_model_generates_the_unsplit_logits() -> Result<()> {
    let (split, whole) = split_and_whole(5)?;
    let mut runs = Vec::new();
    for model in [&split, &whole] {
        let mut g = Generator::new(model, 1)?;
        let prompt = g.feed(&[464, 50256, 1000, 30000])?.to_vec()?;
        let next = g.feed(&[45000])?.to_vec()?;
        runs.push((prompt, next));
    }
    assert_close(&runs[0].0, &f64s(&runs[1].0), 1e-5, "prompt logits");
    assert_close(&runs[0].1, &f64s(&runs[1].1), 1e-5, "next-token logits");
    Ok(())
}

#[test]
fn a_split_embedding_saves_one_tensor_and_loads_back_split_or_whole() -> Result<()> {
    let scratch = Scratch::new("save");
    let split = Decoder::new(&capped_dev(TINY_CAP), tiny(), 6)?;
    assert_eq!(shard_count(&split), 3);
    save_pretrained(scratch.path(), &HfConfig::new(tiny()), &split.params, None)?;

    let bytes = std::fs::read(scratch.path().join(WEIGHTS_FILE)).expect("the weights file");
    let st = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let wte: Vec<_> = st
        .names()
        .into_iter()
        .filter(|n| n.contains("wte"))
        .collect();
    assert_eq!(wte, ["wte.weight"], "one embedding tensor, no shards");
    assert_eq!(st.tensor("wte.weight").expect("wte").shape(), [50257, 128]);
    assert_eq!(st.len(), tiny().param_specs().len());

    for dev in [capped_dev(TINY_CAP), private_dev()] {
        let (config, params) = load_pretrained(&dev, scratch.path())?;
        assert_eq!(config.model, tiny());
        let n = params.shards("wte.weight").expect("wte").len();
        for spec in split.params.specs() {
            assert_eq!(
                params.read(&spec.name)?,
                split.params.read(&spec.name)?,
                "{} loaded into {n} shard(s)",
                spec.name
            );
        }
    }
    Ok(())
}

#[test]
fn parameters_over_the_cap_are_split_by_rows_or_refused() -> Result<()> {
    // 1 KiB bindings: 256 f32 per shard; a (10, 70) parameter makes 4 shards of 3, 3, 3, 1
    // rows (3 shards of 4 rows, 280 elements, would not fit).
    let dev = capped_dev(1024);
    let spec = |name: &str, shape: &[usize]| ParamSpec {
        name: name.into(),
        shape: shape.to_vec(),
        decay: true,
    };
    let params = Parameters::new(&dev, &[spec("b", &[8]), spec("w", &[10, 70])])?;
    let shards = params.shards("w").expect("w");
    let layout: Vec<(String, usize, Vec<usize>)> = shards
        .iter()
        .map(|s| (s.name.to_string(), s.first_row, s.tensor.shape().to_vec()))
        .collect();
    assert_eq!(
        layout,
        [
            ("w.shard0".to_string(), 0, vec![3, 70]),
            ("w.shard1".to_string(), 3, vec![3, 70]),
            ("w.shard2".to_string(), 6, vec![3, 70]),
            ("w.shard3".to_string(), 9, vec![1, 70]),
        ]
    );
    assert!(params.get("w").is_none() && params.get("w.shard2").is_some());
    assert_eq!(
        params.specs().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["b", "w"]
    );
    let values: Vec<f32> = (0..700).map(|i| i as f32 * 0.5).collect();
    params.write("w", &values)?;
    assert_eq!(params.read("w")?, values);
    assert_eq!(shards[1].tensor.to_vec()?, values[210..420]);
    assert!(
        params.write("w", &values[1..]).is_err(),
        "a short write is refused"
    );

    // A vector over the cap, or one row over it, cannot be split: errors name the limit.
    for (shape, what) in [(&[300][..], "parameter `v`"), (&[2, 300][..], "one row of")] {
        match Parameters::new(&dev, &[spec("v", shape)]) {
            Err(e @ Error::BindingTooLarge { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(what) && msg.contains("1024"), "{msg}");
            }
            Err(e) => panic!("want BindingTooLarge for {shape:?}, got {e}"),
            Ok(_) => panic!("want BindingTooLarge for {shape:?}, got parameters"),
        }
    }
    Ok(())
}

/// A 1-layer, 64-dim GPT-2 over GPT-2's vocabulary (the data is GPT-2 tokens): wte is 12.9 MB.
fn small_config() -> ModelConfig {
    ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.02,
        ..ModelConfig::gpt2(50257, 32, 64, 1, 2)
    }
}

/// Splits `small_config`'s wte in 2 and holds a step's (2, 16, 50257) f32 logits (6.4 MB).
const SMALL_CAP: u64 = 8 << 20;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn a_resumed_run_with_a_split_embedding_repeats_the_uninterrupted_losses() -> Result<()> {
    let dev = capped_dev(SMALL_CAP);
    let scratch = Scratch::new("resume");
    let model = scratch.path().join("init");
    let init = Decoder::new(&dev, small_config(), 11)?;
    assert_eq!(shard_count(&init), 2);
    let tokenizer = Tokenizer::from_dir(&repo("models/gpt2-tokenizer"))?;
    save_pretrained(
        &model,
        &HfConfig::new(small_config()),
        &init.params,
        Some(&tokenizer),
    )?;
    let text = std::fs::read_to_string(repo("data/austen-persuasion.txt")).expect("the corpus");
    let end = text[..20_000].rfind('\n').expect("a line end");
    let data = scratch.path().join("slice.txt");
    std::fs::write(&data, &text[..end + 1]).expect("writing the slice");
    let options = TrainOptions {
        model: ModelSource::Dir(model.clone()),
        data: data.clone(),
        batch: 2,
        seq: 16,
        steps: 4,
        lr: 3e-3,
        warmup: 1,
        schedule: Schedule::Cosine,
        weight_decay: 0.1,
        grad_clip: 1.0,
        grad_accum: 1,
        seed: 5,
        amp: false,
    };
    let control = RunControl {
        eval_every: 2,
        ..Default::default()
    };
    let mut whole = Vec::new();
    let mut session = TrainSession::new(&dev, options.clone())?;
    assert_eq!(shard_count(&session.trainer.model), 2);
    session.run(&control, |e| {
        if let Event::Step(r) = e {
            whole.push((r.step, r.loss, r.eval_loss));
        }
    })?;
    assert_eq!(whole.len(), 4);
    assert!(whole[1].2.is_some(), "held-out loss at step 2: {whole:?}");

    let ckpt = scratch.path().join("ckpt");
    let control = RunControl {
        out: Some(ckpt.clone()),
        ..control
    };
    let mut both = Vec::new();
    let mut cut = TrainSession::new(&dev, options)?;
    cut.run_until(2, &control, |e| {
        if let Event::Step(r) = e {
            both.push((r.step, r.loss, r.eval_loss));
        }
    })?;
    drop(cut);
    let mut resumed = TrainSession::resume(&dev, &ckpt, &OptionFlags::default())?;
    assert_eq!(resumed.step(), 2);
    assert_eq!(shard_count(&resumed.trainer.model), 2);
    resumed.run(&control, |e| {
        if let Event::Step(r) = e {
            both.push((r.step, r.loss, r.eval_loss));
        }
    })?;
    assert_eq!(both, whole, "bitwise the same losses and held-out losses");
    Ok(())
}

/// Logits over one storage binding: the loss runs the LM head and cross-entropy over chunks of
/// token rows (here 2 x 64 rows of 50257 logits, 25.7 MB, under the 10 MiB cap: 3 chunks of at
/// most 52 rows), the same loss and gradients as the whole logits.
#[test]
fn logits_over_the_binding_limit_give_the_loss_and_gradients_in_chunks() -> Result<()> {
    let (split, whole) = split_and_whole(5)?;
    let mut runs = Vec::new();
    for model in [&split, &whole] {
        let (x, y) = batch(model.params.device(), 2, 64)?;
        let loss = model.loss(&x, &y)?;
        loss.backward()?;
        let mut grads = Vec::new();
        for spec in model.params.specs() {
            grads.push(model.params.read_grad(&spec.name)?.expect("a gradient"));
        }
        runs.push((loss.item()?, grads));
    }
    let (s, w) = (&runs[0], &runs[1]);
    assert_close(&[s.0], &[w.0 as f64], 1e-5, "loss");
    for (i, (gs, gw)) in s.1.iter().zip(&w.1).enumerate() {
        assert_close(gs, &f64s(gw), 1e-5, &format!("gradient {i}"));
    }
    Ok(())
}
