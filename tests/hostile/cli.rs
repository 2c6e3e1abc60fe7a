//! The binary on the flags and files that used to panic, abort, hang or pass silently: each
//! an exit code of 1 (or 2, clap's) with the reason on stderr, and no panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Scratch;

/// `wgrad args` (killed after a minute: a hang fails), its exit code and stderr.
fn wgrad(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgrad"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running wgrad");
    let started = Instant::now();
    while child.try_wait().expect("waiting").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("wgrad {args:?} still runs after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("its output");
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A model directory: the golden fixture's config and weights, the GPT-2 tokenizer.
fn model_dir(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).expect("creating");
    let fixture = repo("tests/fixtures/gpt2-small");
    std::fs::copy(
        fixture.join("model.safetensors"),
        model.join("model.safetensors"),
    )
    .expect("copying the weights");
    std::fs::copy(fixture.join("config.json"), model.join("config.json")).expect("copying");
    for f in ["vocab.json", "merges.txt"] {
        std::fs::copy(repo("models/gpt2-tokenizer").join(f), model.join(f)).expect("copying");
    }
    model
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
}

#[test]
fn the_binary_refuses_hostile_flags_and_files_without_panicking() {
    let scratch = Scratch::new("cli");
    let dir = &scratch.0;
    let model = model_dir(dir);
    let m = model.to_str().expect("UTF-8");
    // Single letters and newlines: token ids under the fixture's vocabulary of 512.
    let text = dir.join("a.txt");
    std::fs::write(&text, "a\n".repeat(100)).expect("writing");
    let t = text.to_str().expect("UTF-8");
    let fifo = dir.join("fifo.txt");
    mkfifo(&fifo);
    let f = fifo.to_str().expect("UTF-8");

    let huge = "18446744073709551615";
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["profile", "--batch", "0"], 1, "--batch"),
        (vec!["profile", "--seq", "0"], 1, "--seq"),
        (vec!["profile", "--steps", "0"], 1, "--steps"),
        (
            vec![
                "bench", "step", "--preset", "tiny", "--seq", "16", "--batch", "0",
            ],
            1,
            "--batch",
        ),
        (
            vec!["bench", "step", "--preset", "tiny", "--seq", "0"],
            1,
            "--seq",
        ),
        (
            vec!["train", "--grad-accum", "1000000000"],
            1,
            "--grad-accum",
        ),
        (vec!["train", "--batch", huge], 1, "--batch"),
        (
            vec!["train", "--weight-decay", "-0.1"],
            1,
            "--weight-decay: -0.1",
        ),
        (vec!["train", "--lr", "-1"], 1, "--lr: -1"),
        (
            vec!["generate", "--model", m, "--max-tokens", huge],
            1,
            "exceed",
        ),
        (
            vec!["generate", "--model", m, "--temperature", "-1"],
            1,
            "temperature -1",
        ),
        (vec!["bench", "matmul", "--reps", "0"], 2, "--reps"),
        (vec!["eval", "--model", m, "--text", f], 1, "FIFO"),
    ];
    let mut failures = Vec::new();
    let mut check = |args: &[&str], code: i32, needle: &str| {
        let (got, stderr) = wgrad(args);
        if got != code || !stderr.contains(needle) || stderr.contains("panicked") {
            failures.push(format!(
                "wgrad {args:?}: exit {got}, wanted {code} and `{needle}`:\n{stderr}"
            ));
        }
    };
    for (args, code, needle) in &cases {
        check(args, *code, needle);
    }
    // A FIFO, then a directory, as model.safetensors; a config with a type error.
    let weights = model.join("model.safetensors");
    let kept = dir.join("kept.safetensors");
    std::fs::rename(&weights, &kept).expect("moving the weights aside");
    mkfifo(&weights);
    check(
        &["eval", "--model", m, "--text", t],
        1,
        "model.safetensors: is a named pipe",
    );
    std::fs::remove_file(&weights).expect("removing the FIFO");
    std::fs::create_dir(&weights).expect("a directory");
    check(
        &["eval", "--model", m, "--text", t],
        1,
        "model.safetensors: is a directory",
    );
    std::fs::remove_dir(&weights).expect("removing the directory");
    std::fs::rename(&kept, &weights).expect("the weights back");
    let config = model.join("config.json");
    let good = std::fs::read_to_string(&config).expect("reading");
    std::fs::write(&config, good.replace("\"n_layer\": 2", "\"n_layer\": -1")).expect("writing");
    check(
        &["eval", "--model", m, "--text", t],
        1,
        "config.json: field `n_layer` is the number -1",
    );
    std::fs::write(&config, &good).expect("writing");

    // The token cache cannot be written (a directory where its file goes): the documented
    // warning, and the run goes on.
    let (code, stderr) = wgrad(&["eval", "--model", m, "--text", t, "--seq", "16"]);
    assert_eq!(code, 0, "{stderr}");
    let cache = std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| e.expect("an entry").path())
        .find(|p| p.to_string_lossy().contains(".wgrad-tokens-"))
        .expect("the token cache beside the text");
    std::fs::remove_file(&cache).expect("removing the cache");
    std::fs::create_dir(&cache).expect("a directory in its place");
    check(
        &["eval", "--model", m, "--text", t, "--seq", "16"],
        0,
        "warning: not caching the token ids",
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
