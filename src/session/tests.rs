//! A save stopped at each of its file operations (the `atomic` module's test hook, as a kill
//! there would leave the directory) still leaves a checkpoint `--resume` takes: the previous
//! one, or the new one once the commit's journal is in place.

use std::path::Path;

use super::*;
use crate::model::atomic::{stop_at, stopped};
use crate::model::save_pretrained;
use crate::model::test_support::{
    device, file_names as names, gpt2_tokenizer_dir, repo_path, ScratchDir,
};
use crate::nn::ModelConfig;

/// A model directory of 1.6M parameters (GPT-2's vocabulary, 32 dimensions, one layer).
fn micro_model(dir: &Path) {
    let config = ModelConfig {
        layer_norm_epsilon: 1e-5,
        initializer_range: 0.02,
        ..ModelConfig::gpt2(50257, 16, 32, 1, 2)
    };
    let model = Decoder::new(device(), config.clone(), 1).expect("a model");
    let tokenizer = Tokenizer::from_dir(&gpt2_tokenizer_dir()).expect("the tokenizer");
    save_pretrained(dir, &HfConfig::new(config), &model.params, Some(&tokenizer)).expect("saving");
}

fn micro_options(model: &Path, data: &Path, steps: usize) -> TrainOptions {
    TrainOptions {
        model: ModelSource::Dir(model.to_path_buf()),
        data: data.to_path_buf(),
        batch: 1,
        seq: 8,
        steps,
        lr: 1e-3,
        warmup: 0,
        schedule: Schedule::Constant,
        weight_decay: 0.1,
        grad_clip: 1.0,
        grad_accum: 1,
        seed: 3,
        amp: false,
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating");
    for entry in std::fs::read_dir(from).expect("listing") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copying");
    }
}

#[test]
fn a_save_killed_at_any_file_operation_leaves_a_resumable_checkpoint() {
    let scratch = ScratchDir::new("kill-save");
    let text = std::fs::read_to_string(repo_path("data/austen-persuasion.txt")).expect("corpus");
    let end = text[..6_000].rfind('\n').expect("a line end");
    let data = scratch.path().join("slice.txt");
    std::fs::write(&data, &text[..end + 1]).expect("writing the slice");
    let model = scratch.path().join("model");
    micro_model(&model);

    // The previous checkpoint, at step 1; the session moves on to step 2 unsaved.
    let base = scratch.path().join("base");
    let mut session =
        TrainSession::new(device(), micro_options(&model, &data, 3)).expect("session");
    let control = RunControl {
        out: Some(base.clone()),
        ..Default::default()
    };
    session.run_until(1, &control, |_| {}).expect("step 1");
    session
        .run_until(2, &RunControl::default(), |_| {})
        .expect("step 2");
    let expected = names(&base);

    let mut committed = false;
    for at in 0.. {
        let dir = scratch.path().join(format!("k{at}"));
        copy_dir(&base, &dir);
        let out = session
            .open_out(&dir, false)
            .expect("the run's own checkpoint");
        stop_at(Some(at));
        let saved = session.save(&out);
        let finished = !stopped();
        stop_at(None);
        drop(out);

        let resumed = TrainSession::resume(device(), &dir, &OptionFlags::default())
            .unwrap_or_else(|e| panic!("killed at file operation {at}: not resumable: {e}"));
        let step = resumed.step();
        assert!(step == 1 || step == 2, "killed at {at}: step {step}");
        if committed || saved.is_ok() {
            assert_eq!(step, 2, "killed at {at}, after the commit");
        }
        committed |= step == 2;
        // The next writer removes what the killed save left.
        drop(resumed.open_out(&dir, false).expect("reopening"));
        assert_eq!(names(&dir), expected, "killed at {at}: files left");
        std::fs::remove_dir_all(&dir).expect("cleaning up");
        if finished {
            saved.expect("the save that was not stopped");
            assert!(at > 20, "every file operation counted ({at})");
            break;
        }
    }
    assert!(committed);
}
