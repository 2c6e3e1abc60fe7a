//! The `wgrad` binary away from its checkout: copied into a fresh temporary directory and run
//! from another one, it finds its presets, tokenizer and default corpus (compiled in,
//! `wgrad::assets`) and writes nothing but what it is asked to. The copy stands for
//! `cargo install --path .`, which installs this same binary into another place
//! (`~/.cargo/bin`).
//!
//! The copy cannot show that nothing is read from the checkout (the checkout is still there),
//! so a second test reads the sources: outside tests, only src/assets.rs names the files under
//! models/ and data/, and nothing uses the build directory's path (`CARGO_MANIFEST_DIR`).
//!
//! Kept cheap for lavapipe: one step of the tiny preset at 1 x 8 tokens, one resumed step, an
//! evaluation of a two-line text and two generated tokens; the larger presets are looked up
//! only as far as the check of `--seq` against their positions, before any allocation.

use std::path::{Path, PathBuf};
use std::process::Command;

use wgrad::model::read_train_state;

/// A fresh temporary directory outside the checkout, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "wgrad-installed-binary-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        assert!(
            !dir.starts_with(env!("CARGO_MANIFEST_DIR")),
            "{} is inside the checkout",
            dir.display()
        );
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn an_installed_binary_runs_from_any_directory() {
    let (bin, work) = (Scratch::new("bin"), Scratch::new("work"));
    let wgrad_path = bin.0.join("wgrad");
    std::fs::copy(env!("CARGO_BIN_EXE_wgrad"), &wgrad_path).expect("copying the binary");
    let run = |args: &[&str]| {
        let o = Command::new(&wgrad_path)
            .args(args)
            .current_dir(&work.0)
            .output()
            .expect("running the copied wgrad");
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        (o.status.success(), stdout, stderr)
    };
    let wgrad = |args: &[&str]| {
        let (ok, stdout, stderr) = run(args);
        assert!(ok, "wgrad {args:?}:\n{stdout}\n{stderr}");
        (stdout, stderr)
    };

    // A preset on the default corpus; the checkpoint holds the tokenizer's files.
    let (_, stderr) = wgrad(&[
        "train", "--preset", "tiny", "--steps", "1", "--batch", "1", "--seq", "8", "--out", "D",
    ]);
    assert!(
        stderr.contains("data      builtin:austen-persuasion.txt: "),
        "{stderr}"
    );
    let d = work.0.join("D");
    for f in [
        "config.json",
        "model.safetensors",
        "vocab.json",
        "merges.txt",
        "wgrad_state.safetensors",
    ] {
        assert!(d.join(f).is_file(), "{f} in {:?}", listing(&d));
    }
    let repo_tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gpt2-tokenizer");
    for f in ["vocab.json", "merges.txt"] {
        let saved = std::fs::read(d.join(f)).expect("the saved file");
        assert!(
            saved == std::fs::read(repo_tokenizer.join(f)).expect("the asset"),
            "{f}"
        );
    }
    let options = &read_train_state(&d)
        .expect("the state")
        .state
        .hyper_parameters["options"];
    assert_eq!(
        options["data"], "builtin:austen-persuasion.txt",
        "{options}"
    );
    assert_eq!(options["model"]["preset"], "tiny", "{options}");
    // Nothing beside the checkpoint (no token cache), nothing beside the binary.
    assert_eq!(listing(&work.0), ["D"]);
    assert_eq!(listing(&bin.0), ["wgrad"]);

    // The checkpoint resumes with its built-in corpus, found by the name it recorded.
    let (_, stderr) = wgrad(&["train", "--resume", "D", "--steps", "2"]);
    assert!(
        stderr.contains("D (resumed at step 1)") && stderr.contains("step 2: saved D"),
        "{stderr}"
    );

    // The larger presets' configs are there: --seq is checked against their 1024 positions.
    for preset in ["distilgpt2", "gpt2"] {
        let (ok, _, stderr) = run(&["train", "--preset", preset, "--seq", "1025"]);
        assert!(
            !ok && stderr.contains("the model has 1024 positions"),
            "{preset}: {stderr}"
        );
    }

    let text = work.0.join("text.txt");
    std::fs::write(
        &text,
        "It is a truth universally acknowledged, that a single man in possession\nof a good \
         fortune, must be in want of a wife.\n",
    )
    .expect("writing the text");
    let (stdout, _) = wgrad(&["eval", "--model", "D", "--text", "text.txt", "--seq", "8"]);
    assert!(stdout.starts_with("loss "), "{stdout}");

    let (_, stderr) = wgrad(&["generate", "--model", "D", "--max-tokens", "2"]);
    assert!(stderr.contains("2 new tokens"), "{stderr}");
    assert_eq!(listing(&bin.0), ["wgrad"]);
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("listing src/") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` without its test-only items: each `#[cfg(test)]`, the attributes after it and the
/// item they qualify (one line, or a block up to the closing brace at the attribute's indent).
fn without_test_items(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            code.push_str(line);
            code.push('\n');
            continue;
        }
        let indent = &line[..line.len() - line.trim_start().len()];
        let closing = format!("{indent}}}");
        for item in lines.by_ref() {
            let item = item.trim_end();
            if item.trim_start().starts_with("#[") {
                continue;
            }
            if item.ends_with('{') {
                for inner in lines.by_ref() {
                    if inner.trim_end() == closing {
                        break;
                    }
                }
            }
            break;
        }
    }
    code
}

#[test]
fn the_test_items_are_told_from_the_code() {
    let text = "use a;\n#[cfg(test)]\nmod tests;\nfn b() {}\n#[cfg(test)]\n#[path = \"x.rs\"]\nmod t;\n\
                #[cfg(test)]\npub(crate) mod support {\n    fn c() {}\n}\nfn d() {}\n    #[cfg(test)]\n    fn e() {\n    }\n";
    assert_eq!(without_test_items(text), "use a;\nfn b() {}\nfn d() {}\n");
}

#[test]
fn only_src_assets_finds_the_built_in_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 50,
        "{} files under {}",
        files.len(),
        src.display()
    );
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("reading a source file");
            (f, text)
        })
        .collect();
    // Files that are test modules as a whole (`#[cfg(test)] #[path = "x_tests.rs"] mod tests;`).
    let test_files: Vec<String> = texts
        .iter()
        .flat_map(|(_, t)| t.split("#[cfg(test)]\n#[path = \"").skip(1))
        .filter_map(|rest| rest.split('"').next().map(str::to_string))
        .collect();
    let mut found = Vec::new();
    for (path, text) in &texts {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if test_files.contains(&name) {
            continue;
        }
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue; // a test module's own file (`#[cfg(test)] mod tests;`)
        }
        let code = without_test_items(text);
        let rel = path.strip_prefix(&src).unwrap().display().to_string();
        if code.contains("CARGO_MANIFEST_DIR") {
            found.push(format!("{rel}: CARGO_MANIFEST_DIR"));
        }
        let names_assets = ["include_str!(\"", "include_bytes!(\""]
            .iter()
            .flat_map(|m| code.split(m).skip(1))
            .filter_map(|arg| arg.split('"').next())
            .any(|a| a.contains("models/") || a.contains("data/"));
        if names_assets && rel != "assets.rs" {
            found.push(format!("{rel}: includes a file of models/ or data/"));
        }
    }
    assert!(
        found.is_empty(),
        "only src/assets.rs finds the built-in files: {found:?}"
    );
}
