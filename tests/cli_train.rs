//! `wgrad train` through the library it calls (`wgrad::session`): a run cut short, saved and
//! resumed gives the losses of the run done in one go; checkpoints are Hugging Face model
//! directories plus a training state; bad input is a clear error that overwrites nothing.
//!
//! The model is a small GPT-2 with GPT-2's vocabulary (the data is GPT-2 tokens): one layer,
//! 32 dims, written as a model directory by the test. The data is a slice of the bundled
//! corpus in a scratch directory.

mod common;

use std::path::{Path, PathBuf};

use common::{dev_with, private_dev, Scratch};
use wgrad::model::{
    load_pretrained, read_train_state, save_pretrained, HfConfig, Tokenizer, STATE_FILE,
    WEIGHTS_FILE,
};
use wgrad::nn::{Decoder, ModelConfig};
use wgrad::session::{
    Event, ModelSource, OptionFlags, RunControl, Schedule, TrainOptions, TrainSession,
};
use wgrad::{Device, Error, Result};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn small_config() -> ModelConfig {
    ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.02,
        ..ModelConfig::gpt2(50257, 32, 32, 1, 2)
    }
}

/// A model directory with fresh weights, GPT-2's tokenizer and `config`.
fn model_dir(dev: &Device, dir: &Path, config: ModelConfig) -> Result<()> {
    let model = Decoder::new(dev, config.clone(), 11)?;
    let tokenizer = Tokenizer::from_dir(&repo("models/gpt2-tokenizer"))?;
    save_pretrained(dir, &HfConfig::new(config), &model.params, Some(&tokenizer))
}

/// The first `bytes` of the bundled corpus (cut at a line end) as the file `dir/name`.
fn corpus_slice(dir: &Path, name: &str, bytes: usize) -> PathBuf {
    let text = std::fs::read_to_string(repo("data/austen-persuasion.txt")).expect("the corpus");
    let end = text[..bytes].rfind('\n').expect("a line end");
    let path = dir.join(name);
    std::fs::write(&path, &text[..end + 1]).expect("writing the slice");
    path
}

fn options(model: &Path, data: &Path, steps: usize) -> TrainOptions {
    options_amp(model, data, steps, false)
}

fn options_amp(model: &Path, data: &Path, steps: usize, amp: bool) -> TrainOptions {
    TrainOptions {
        model: ModelSource::Dir(model.to_path_buf()),
        data: data.to_path_buf(),
        batch: 2,
        seq: 16,
        steps,
        lr: 3e-3,
        warmup: 2,
        schedule: Schedule::Cosine,
        weight_decay: 0.1,
        grad_clip: 1.0,
        grad_accum: 2,
        seed: 5,
        amp,
    }
}

/// Every step's loss reported by a run, and whether an event came for each step.
fn collect(events: &mut Vec<(usize, f32, Option<f32>)>) -> impl FnMut(&Event) + '_ {
    move |e| {
        if let Event::Step(r) = e {
            assert!(r.ms > 0.0 && r.tokens_per_s > 0.0, "{r:?}");
            events.push((r.step, r.loss, r.eval_loss));
        }
    }
}

#[test]
fn a_resumed_run_repeats_the_uninterrupted_losses() -> Result<()> {
    resumed_run_repeats_the_uninterrupted_losses(false)
}

/// Mixed precision too: the loss-scale state and the applied-step count (the bias
/// corrections) travel in the checkpoint, and the f16 weight copies are remade from the loaded
/// f32 weights.
#[test]
fn a_resumed_mixed_precision_run_repeats_the_uninterrupted_losses() -> Result<()> {
    resumed_run_repeats_the_uninterrupted_losses(true)
}

fn resumed_run_repeats_the_uninterrupted_losses(amp: bool) -> Result<()> {
    let dev = private_dev();
    let scratch = Scratch::new(if amp { "resume-amp" } else { "resume" });
    let model = scratch.path().join("init");
    model_dir(&dev, &model, small_config())?;
    let data = corpus_slice(scratch.path(), "slice.txt", 20_000);
    let (n, m) = (3, 3);

    // Uninterrupted: n + m steps, evaluating at n.
    let mut whole = Vec::new();
    let control = RunControl {
        eval_every: n,
        ..Default::default()
    };
    let mut session = TrainSession::new(&dev, options_amp(&model, &data, n + m, amp))?;
    let summary = session.run(&control, collect(&mut whole))?;
    assert_eq!(
        whole.iter().map(|e| e.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert!(whole[2].2.is_some() && whole[5].2.is_some() && whole[0].2.is_none());
    assert_eq!(summary.final_loss, whole[5].1);
    assert_eq!(summary.tokens, 6 * 2 * 16 * 2);
    assert!(
        whole[5].1 < whole[0].1,
        "the loss falls: {whole:?} (first {}, last {})",
        whole[0].1,
        whole[5].1
    );

    // Cut short at n (the schedule still ends at n + m), saved, resumed in a new session.
    let ckpt = scratch.path().join("ckpt");
    let mut first = Vec::new();
    let mut cut = TrainSession::new(&dev, options_amp(&model, &data, n + m, amp))?;
    let control = RunControl {
        eval_every: n,
        out: Some(ckpt.clone()),
        ..Default::default()
    };
    let s = cut.run_until(n, &control, collect(&mut first))?;
    assert_eq!(s.saved.as_deref(), Some(ckpt.as_path()));
    drop(cut);
    let mut resumed = TrainSession::resume(&dev, &ckpt, &OptionFlags::default())?;
    assert_eq!(resumed.step(), n);
    let mut second = Vec::new();
    resumed.run(&control, collect(&mut second))?;
    let both: Vec<_> = first.into_iter().chain(second).collect();
    assert_eq!(both, whole, "bitwise the same losses and held-out losses");

    // The checkpoint moved on to step n + m and still loads as a model directory.
    assert_eq!(read_train_state(&ckpt)?.state.step, (n + m) as u64);
    let (config, params) = load_pretrained(&dev, &ckpt)?;
    assert_eq!(config.model, small_config());
    let trained = resumed
        .trainer
        .model
        .params
        .get("h.0.mlp.c_fc.weight")
        .unwrap();
    assert_eq!(
        params.get("h.0.mlp.c_fc.weight").unwrap().to_vec()?,
        trained.to_vec()?
    );
    Ok(())
}

/// A checkpoint records the precision it trained in, and a resume under another refuses,
/// naming what differs and the variable that sets it: its losses would not continue the same.
/// Outside mixed precision the f16 choices change nothing, and do not count.
#[test]
fn a_resume_under_another_precision_is_refused() -> Result<()> {
    use wgrad::config::{F32Matmul, Float};
    let dev = private_dev();
    let scratch = Scratch::new("resume-precision");
    let model = scratch.path().join("init");
    model_dir(&dev, &model, small_config())?;
    let data = corpus_slice(scratch.path(), "slice.txt", 20_000);
    for amp in [true, false] {
        let ckpt = scratch.path().join(if amp { "amp" } else { "f32" });
        let control = RunControl {
            out: Some(ckpt.clone()),
            ..Default::default()
        };
        TrainSession::new(&dev, options_amp(&model, &data, 3, amp))?.run_until(
            1,
            &control,
            |_| {},
        )?;
        let logits_f32 = dev_with(|o| o.precision.logits = Float::F32);
        let resumed = TrainSession::resume(&logits_f32, &ckpt, &OptionFlags::default());
        if amp {
            let err = resumed.err().expect("refused").to_string();
            assert!(
                err.contains("logits") && err.contains("WGRAD_LOGITS"),
                "{err}"
            );
        } else {
            assert!(resumed.is_ok(), "f32 logits change nothing outside --amp");
        }
        let tiled = dev_with(|o| o.precision.f32_matmul = F32Matmul::Tiled);
        let err = TrainSession::resume(&tiled, &ckpt, &OptionFlags::default())
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("WGRAD_F32_MATMUL"), "{err}");
        // The precision it trained in resumes.
        TrainSession::resume(&dev, &ckpt, &OptionFlags::default())?;
    }
    Ok(())
}

#[test]
fn a_checkpoint_is_a_model_directory_and_a_state_that_belongs_to_it() -> Result<()> {
    let dev = private_dev();
    let scratch = Scratch::new("checkpoint");
    let model = scratch.path().join("init");
    model_dir(&dev, &model, small_config())?;
    let data = corpus_slice(scratch.path(), "slice.txt", 8_000);
    let ckpt = scratch.path().join("ckpt");
    let mut session = TrainSession::new(&dev, options(&model, &data, 2))?;
    let control = RunControl {
        save_every: 1,
        out: Some(ckpt.clone()),
        ..Default::default()
    };
    let mut saves = Vec::new();
    session.run(&control, |e| {
        if let Event::Saved { step, .. } = e {
            saves.push(*step)
        }
    })?;
    assert_eq!(saves, [1, 2]);
    let mut names: Vec<String> = std::fs::read_dir(&ckpt)
        .expect("listing")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "config.json",
            "merges.txt",
            WEIGHTS_FILE,
            "vocab.json",
            STATE_FILE
        ],
        "no temporaries left"
    );
    let state = read_train_state(&ckpt)?.state;
    assert_eq!(state.step, 2);
    assert_eq!(
        state.position.index,
        2 * 2 * 2,
        "2 steps of 2 micro-batches of 2 rows"
    );
    assert_eq!(state.hyper_parameters["options"]["lr"], 3e-3f32 as f64);

    // Weights from another save: the state no longer belongs to them.
    let other = scratch.path().join("other");
    model_dir(&dev, &other, small_config())?;
    std::fs::copy(other.join(WEIGHTS_FILE), ckpt.join(WEIGHTS_FILE)).expect("copying");
    let err = TrainSession::resume(&dev, &ckpt, &OptionFlags::default())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("was not saved with the model.safetensors"),
        "{err}"
    );
    Ok(())
}

/// The bytes of every file in `dir`, by name.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("reading"),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn bad_input_is_a_clear_error_and_overwrites_nothing() -> Result<()> {
    let dev = private_dev();
    let scratch = Scratch::new("errors");
    let dir = scratch.path();
    let model = dir.join("init");
    model_dir(&dev, &model, small_config())?;
    let data = corpus_slice(dir, "slice.txt", 4_000);
    // A checkpoint every bad run below is pointed at: it must come out unchanged.
    let ckpt = dir.join("ckpt");
    let mut session = TrainSession::new(&dev, options(&model, &data, 1))?;
    session.run(
        &RunControl {
            out: Some(ckpt.clone()),
            ..Default::default()
        },
        |_| {},
    )?;
    drop(session);
    let before = snapshot(&ckpt);
    // --overwrite: past the directory's own check, to each input's.
    let control = RunControl {
        eval_every: 1,
        save_every: 1,
        out: Some(ckpt.clone()),
        overwrite: true,
        ..Default::default()
    };
    let attempt = |options: TrainOptions| -> String {
        let result = TrainSession::new(&dev, options).and_then(|mut s| s.run(&control, |_| {}));
        match result {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    };

    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").expect("writing");
    let err = attempt(TrainOptions {
        data: empty,
        ..options(&model, &data, 3)
    });
    assert!(err.contains("empty.txt") && err.contains("empty"), "{err}");

    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait\n").expect("writing");
    let err = attempt(TrainOptions {
        data: latin1,
        ..options(&model, &data, 3)
    });
    assert!(err.contains("not UTF-8") && err.contains("0xe9"), "{err}");

    let short = dir.join("short.txt");
    std::fs::write(&short, "Anne Elliot walked to Kellynch.\n").expect("writing");
    let err = attempt(TrainOptions {
        data: short,
        ..options(&model, &data, 3)
    });
    assert!(
        err.contains("shorter than one sequence of 17 tokens"),
        "{err}"
    );

    // The training part is long enough, the held-out tail (evaluated here) is not.
    let err = attempt(TrainOptions {
        seq: 32,
        data: corpus_slice(dir, "small.txt", 800),
        ..options(&model, &data, 3)
    });
    assert!(err.contains("held-out part holds"), "{err}");

    let err = attempt(TrainOptions {
        seq: 33,
        ..options(&model, &data, 3)
    });
    assert!(
        err.contains("--seq") && err.contains("32 positions"),
        "{err}"
    );

    let err = attempt(TrainOptions {
        model: ModelSource::Preset("gpt5".into()),
        ..options(&model, &data, 3)
    });
    assert!(
        err.contains("unknown preset `gpt5`") && err.contains("tiny, distilgpt2, gpt2"),
        "{err}"
    );

    // A model directory whose config says 2 layers over weights of 1.
    let misshaped = dir.join("misshaped");
    model_dir(&dev, &misshaped, small_config())?;
    let text = std::fs::read_to_string(misshaped.join("config.json")).expect("reading");
    let text = text.replace("\"n_layer\": 1", "\"n_layer\": 2");
    std::fs::write(misshaped.join("config.json"), text).expect("writing");
    let err = attempt(options(&misshaped, &data, 3));
    assert!(
        err.contains("do not match config.json") && err.contains("missing tensor `h.1."),
        "{err}"
    );
    let mut wide = small_config();
    wide.n_embd = 64;
    std::fs::write(misshaped.join("config.json"), HfConfig::new(wide).to_json()).expect("writing");
    let err = attempt(options(&misshaped, &data, 3));
    assert!(err.contains("config.json gives shape [50257, 64]"), "{err}");

    let resume = |dir: &Path, flags: &OptionFlags| {
        TrainSession::resume(&dev, dir, flags)
            .and_then(|mut s| s.run(&control, |_| {}))
            .map(|_| ())
            .unwrap_err()
    };
    let err = resume(&model, &OptionFlags::default());
    assert!(matches!(err, Error::ModelFile { .. }), "{err:?}");
    assert!(err.to_string().contains("no training state"), "{err}");
    let err = resume(
        &ckpt,
        &OptionFlags {
            lr: Some(1e-2),
            steps: Some(3),
            ..Default::default()
        },
    )
    .to_string();
    assert!(
        err.contains("--lr 0.01 (the checkpoint's is 0.003)"),
        "{err}"
    );
    let err = resume(&ckpt, &OptionFlags::default()).to_string();
    assert!(err.contains("the checkpoint is at step 1"), "{err}");
    let err = resume(
        &ckpt,
        &OptionFlags {
            steps: Some(3),
            data: Some(corpus_slice(dir, "other.txt", 5_000)),
            ..Default::default()
        },
    )
    .to_string();
    assert!(err.contains("not the tokens the checkpoint"), "{err}");

    assert!(
        before == snapshot(&ckpt),
        "the checkpoint was left as it was"
    );
    Ok(())
}
