//! Where a run's checkpoints go (`--out`), checked before the first step and held for the run.
//!
//! `OutDir::open` refuses, before any training:
//! - a path that is a file, a link to nothing, or not writable;
//! - the `--model` directory (the weights a fine-tune starts from), unless `overwrite`;
//! - a directory with anything in it that is not a checkpoint of this run (another run's
//!   checkpoint, another model, unrelated files), unless `overwrite`;
//! - a directory another wgrad process is writing (`.wgrad-lock`, held until the run ends and
//!   then removed on Unix; the system releases the lock of a process that dies, so a killed
//!   run leaves an unlocked file the next run takes).
//!
//! Holding the lock, and once the directory is accepted, it finishes a save a stopped process committed (`atomic::recover`) and
//! removes the temporaries stopped saves left (`atomic::remove_stale_temporaries`).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::atomic::{is_temporary, recover, remove_stale_temporaries, JOURNAL};
use crate::model::{saved_metadata, STATE_FILE};

/// The lock file every writer of a checkpoint directory holds.
pub const LOCK_FILE: &str = ".wgrad-lock";

/// What decides whether a run may write a directory.
#[derive(Clone, Debug, Default)]
pub struct OutPolicy<'a> {
    /// The run's identity, saved with its checkpoints (`run_id` in the hyper-parameters).
    pub run_id: &'a str,
    /// The directory the run's weights came from (`--model`).
    pub model_dir: Option<&'a Path>,
    /// The checkpoint the run resumed (`--resume`): its own directory.
    pub resumed_from: Option<&'a Path>,
    /// Replace whatever the directory holds (`--overwrite`).
    pub overwrite: bool,
}

/// The run identity saved in the checkpoint in `dir`, if any.
pub fn saved_run_id(dir: &Path) -> Option<String> {
    let meta = saved_metadata(dir).ok()?;
    let hyper: serde_json::Value = serde_json::from_str(meta.get("hyper_parameters")?).ok()?;
    hyper.get("run_id")?.as_str().map(str::to_string)
}

/// A checkpoint directory this process may write: checked, locked, recovered.
#[derive(Debug)]
pub struct OutDir {
    path: PathBuf,
    /// Held until dropped.
    lock: Option<File>,
}

impl Drop for OutDir {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            unlock_dir(&self.path, lock);
        }
    }
}

fn refuse(path: &Path, reason: String) -> Error {
    refuse_as("--out", path, reason)
}

fn refuse_as(op: &'static str, path: &Path, reason: String) -> Error {
    Error::InvalidArgument {
        op,
        reason: format!("{}: {reason}", path.display()),
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

impl OutDir {
    /// Checks, creates (when missing) and locks `path` for a run under `policy`.
    pub fn open(path: &Path, policy: &OutPolicy<'_>) -> Result<OutDir> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                let target = std::fs::metadata(path).map_err(|e| {
                    refuse(path, format!("a link to nothing ({e}); give a directory"))
                })?;
                if !target.is_dir() {
                    let what = if meta.is_symlink() {
                        "a link to a file"
                    } else {
                        "a file"
                    };
                    return Err(refuse(
                        path,
                        format!("{what}, not a directory; checkpoints are directories"),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path)
                    .map_err(|e| refuse(path, format!("cannot create the directory: {e}")))?;
            }
            Err(e) => return Err(refuse(path, e.to_string())),
        }
        if !policy.overwrite && policy.model_dir.is_some_and(|m| same_dir(m, path)) {
            return Err(refuse(
                path,
                "this is the --model directory the run starts from: saving here would replace \
                 those weights. Give --out another directory, or add --overwrite to replace them"
                    .into(),
            ));
        }
        let lock = lock_dir(path, "--out")?;
        let out = OutDir {
            path: path.to_path_buf(),
            lock: Some(lock),
        };
        // Read-only until accepted: a refused directory is left as it was.
        if !policy.overwrite {
            out.check_contents(policy)?;
        }
        recover(path)?;
        remove_stale_temporaries(path)?;
        probe_writable(path)?;
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An error unless the directory is empty, the resumed checkpoint, or a checkpoint this
    /// run wrote.
    fn check_contents(&self, policy: &OutPolicy<'_>) -> Result<()> {
        let path = &self.path;
        let mut names: Vec<String> = std::fs::read_dir(path)
            .map_err(|source| Error::Io {
                path: path.display().to_string(),
                source,
            })?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != LOCK_FILE && n != JOURNAL && !is_temporary(n))
            .collect();
        if names.is_empty() || policy.resumed_from.is_some_and(|r| same_dir(r, path)) {
            return Ok(());
        }
        names.sort();
        let fix = "give --out a new or empty directory, or add --overwrite to replace what is \
                   there";
        if names.iter().any(|n| n == STATE_FILE) {
            if saved_run_id(path).as_deref() == Some(policy.run_id) {
                return Ok(());
            }
            let meta = saved_metadata(path).unwrap_or_default();
            let step = meta.get("step").map_or("?", String::as_str);
            return Err(refuse(
                path,
                format!(
                    "holds the checkpoint of another run (step {step}): continue that run with \
                     `wgrad train --resume {}`, or {fix}",
                    path.display()
                ),
            ));
        }
        let shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
        let more = if names.len() > 4 { ", ..." } else { "" };
        Err(refuse(
            path,
            format!(
                "not empty and not a checkpoint of this run ({}{more}); saving would replace or \
                 mix with those files: {fix}",
                shown.join(", ")
            ),
        ))
    }
}

/// Finishes a save a stopped process committed in `dir` (a checkpoint about to be resumed):
/// nothing to do, and nothing written, unless it left a journal.
pub(crate) fn finish_stopped_save(dir: &Path) -> Result<()> {
    if !dir.join(JOURNAL).exists() {
        return Ok(());
    }
    let lock = lock_dir(dir, "--resume")?;
    recover(dir)?;
    unlock_dir(dir, lock);
    Ok(())
}

/// Takes `dir`'s lock: `dir/.wgrad-lock`, created when missing, locked exclusively. An error
/// when another process holds it.
fn lock_dir(dir: &Path, op: &'static str) -> Result<File> {
    let lock_path = dir.join(LOCK_FILE);
    loop {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| refuse_as(op, dir, format!("not writable ({e})")))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(refuse_as(
                    op,
                    dir,
                    format!(
                        "another wgrad process is writing this directory (it holds \
                         {LOCK_FILE}); wait for it to finish{}",
                        if op == "--out" {
                            " or give another --out"
                        } else {
                            ""
                        }
                    ),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(refuse_as(op, dir, format!("cannot lock {LOCK_FILE}: {e}")))
            }
        }
        // The holder before us removes the file as it lets go (`unlock_dir`): a lock taken on
        // a file no longer at the path locks nothing; take the new one.
        if still_at(&lock, &lock_path) {
            return Ok(lock);
        }
    }
}

#[cfg(unix)]
fn still_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_at(_file: &File, _path: &Path) -> bool {
    true
}

/// Lets go of `dir`'s lock, removing the lock file where a later locker can tell (Unix) so
/// that a saved directory holds the model's files only.
fn unlock_dir(dir: &Path, lock: File) {
    #[cfg(unix)]
    let _ = std::fs::remove_file(dir.join(LOCK_FILE));
    #[cfg(not(unix))]
    let _ = dir;
    drop(lock);
}

/// Writes and removes a temporary file: an error now rather than at the first save.
fn probe_writable(dir: &Path) -> Result<()> {
    let probe = dir.join(format!(".probe.wgrad-tmp-{}-0", std::process::id()));
    std::fs::write(&probe, b"wgrad")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| refuse(dir, format!("not writable ({e})")))
}
