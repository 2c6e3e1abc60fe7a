//! `wgrad train --out` as a user meets it: the directory is checked before the first step
//! (a file, a link to nothing, someone else's files, the --model directory, a directory
//! another run is writing), --overwrite makes the saved directory one consistent model, a
//! SIGTERM ends the run with a checkpoint it resumes from, and a killed save's leftovers are
//! removed by the next run. (Kills at each file operation of a save: src/session/tests.rs.)

mod common;

use common::{file_names, Scratch};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use wgrad::model::{read_train_state, STATE_FILE, WEIGHTS_FILE};
use wgrad::session::{OutDir, OutPolicy};

/// A few kB of the bundled corpus, so that runs tokenize quickly.
fn corpus(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/austen-persuasion.txt"),
    )
    .expect("the corpus");
    let end = text[..6_000].rfind('\n').expect("a line end");
    let path = dir.join("slice.txt");
    std::fs::write(&path, &text[..end + 1]).expect("writing");
    path
}

fn wgrad(args: &[&str], data: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgrad"));
    cmd.args(["train", "--batch", "1", "--seq", "8", "--data"])
        .arg(data)
        .args(args);
    cmd
}

fn run(args: &[&str], data: &Path) -> Output {
    wgrad(args, data).output().expect("running wgrad")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Refused before anything trains, with the reason, and nothing in the way touched.
fn assert_refused(out: &Output, says: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for s in says {
        assert!(err.contains(s), "expected {s:?} in: {err}");
    }
    assert!(
        !err.contains("panicked") && !err.contains("trained steps"),
        "{err}"
    );
}

#[test]
fn out_is_checked_before_the_first_step() {
    let scratch = Scratch::new("checks");
    let dir = scratch.0.as_path();
    let data = corpus(dir);
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();

    std::fs::write(dir.join("a-file"), "x").unwrap();
    assert_refused(
        &run(&["--out", &p("a-file")], &data),
        &["a file, not a directory"],
    );
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling")).unwrap();
        assert_refused(
            &run(&["--out", &p("dangling")], &data),
            &["a link to nothing"],
        );
    }
    std::fs::create_dir(dir.join("notes")).unwrap();
    std::fs::write(dir.join("notes/plan.txt"), "mine").unwrap();
    assert_refused(
        &run(&["--out", &p("notes")], &data),
        &[
            "not empty and not a checkpoint of this run (plan.txt)",
            "--overwrite",
        ],
    );
    assert_eq!(file_names(&dir.join("notes")), ["plan.txt"]);

    // A checkpoint: another run may not write over it; its own run (resumed) may.
    let ckpt = p("ckpt");
    let out = run(&["--steps", "1", "--out", &ckpt], &data);
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::read(dir.join("ckpt").join(WEIGHTS_FILE)).unwrap();
    assert_refused(
        &run(&["--steps", "1", "--out", &ckpt], &data),
        &["the checkpoint of another run (step 1)", "--resume"],
    );
    assert_eq!(
        std::fs::read(dir.join("ckpt").join(WEIGHTS_FILE)).unwrap(),
        before
    );
    // Fine-tuning from it into itself would replace the weights it starts from.
    assert_refused(
        &run(&["--steps", "1", "--model", &ckpt, "--out", &ckpt], &data),
        &["the --model directory"],
    );

    // Another process holds the directory.
    let held = OutDir::open(
        &dir.join("ckpt"),
        &OutPolicy {
            overwrite: true,
            ..Default::default()
        },
    )
    .expect("locking");
    assert_refused(
        &run(&["--resume", &ckpt, "--steps", "2"], &data),
        &["another wgrad process is writing this directory"],
    );
    drop(held);
    let out = run(&["--resume", &ckpt, "--steps", "2"], &data);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read_train_state(&dir.join("ckpt")).unwrap().state.step, 2);
    #[cfg(unix)]
    assert_eq!(
        file_names(&dir.join("ckpt")),
        [
            "config.json",
            "merges.txt",
            WEIGHTS_FILE,
            "vocab.json",
            STATE_FILE
        ],
        "the lock file goes with the run"
    );
}

#[test]
fn overwrite_leaves_one_consistent_model_and_the_users_other_files() {
    let scratch = Scratch::new("overwrite");
    let dir = scratch.0.as_path();
    let data = corpus(dir);
    let other = dir.join("other-model");
    std::fs::create_dir(&other).unwrap();
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "README.md",
    ] {
        std::fs::write(other.join(name), "another model's").unwrap();
    }
    let out = run(
        &[
            "--steps",
            "1",
            "--overwrite",
            "--out",
            other.to_str().unwrap(),
        ],
        &data,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        file_names(&other),
        [
            "README.md",
            "config.json",
            "merges.txt",
            WEIGHTS_FILE,
            "vocab.json",
            STATE_FILE
        ],
        "another model's tokenizer and shards would shadow the saved ones"
    );

    // Saved over the directory it came from: the same tokenizer keeps its settings.
    std::fs::write(other.join("tokenizer_config.json"), "{}").unwrap();
    let own = other.to_str().unwrap();
    let out = run(
        &["--steps", "1", "--model", own, "--out", own, "--overwrite"],
        &data,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(other.join("tokenizer_config.json").exists());
}

/// Sends `signal` to process `pid`.
#[cfg(unix)]
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a child's pid; no memory is shared.
    let sent = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

#[cfg(unix)]
#[test]
fn sigterm_stops_after_the_step_with_a_checkpoint_and_stale_temporaries_go() {
    let scratch = Scratch::new("sigterm");
    let dir = scratch.0.as_path();
    let data = corpus(dir);
    let ckpt = dir.join("ckpt");
    let mut child = wgrad(
        &[
            "--steps",
            "100000",
            "--json",
            "--out",
            ckpt.to_str().unwrap(),
        ],
        &data,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("starting wgrad");
    // Should the signal go unheeded, the run is ended (and the test fails) rather than left to
    // train for hours.
    let waited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = (child.id(), waited.clone());
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(300));
        if !watchdog.1.load(std::sync::atomic::Ordering::SeqCst) {
            signal(watchdog.0, libc::SIGKILL);
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a step").expect("a line");
    assert!(first.contains("\"step\":1"), "{first}");
    signal(child.id(), libc::SIGTERM);
    let last_step = lines
        .map_while(|l| l.ok())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter_map(|v| v["step"].as_u64())
        .last()
        .unwrap_or(1);
    let out = child.wait_with_output().expect("waiting");
    waited.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(
        err.contains("stopped by SIGTERM") && err.contains("--resume"),
        "{err}"
    );
    assert_eq!(read_train_state(&ckpt).unwrap().state.step, last_step);

    // What a killed save leaves: temporaries; the next run removes them.
    let stale = ckpt.join(".model.safetensors.wgrad-tmp-4194000-3");
    std::fs::write(&stale, "half a file").unwrap();
    let steps = (last_step + 1).to_string();
    let out = run(
        &["--resume", ckpt.to_str().unwrap(), "--steps", &steps],
        &data,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stale.exists());
    assert_eq!(read_train_state(&ckpt).unwrap().state.step, last_step + 1);
}
