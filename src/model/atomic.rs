//! Writes nobody sees half-done. Each file is written under a temporary name in its final
//! directory (a rename never crosses file systems there), flushed to disk, then renamed onto
//! its name: a reader, or a crash, sees the old file or the new one, never part of one.
//!
//! A directory of several files (a checkpoint: config, weights, tokenizer, training state) is
//! one unit. `StagedFiles` writes every new file under a temporary name first; `commit` then
//! writes a journal (`.wgrad-commit.json`: which temporary becomes which file, which old files
//! go) under a temporary name and renames it into place. That rename is the commit point:
//!
//! | stopped (kill, power, full disk) | the directory holds |
//! | --- | --- |
//! | before the journal's rename | the previous files, untouched, and stray temporaries |
//! | after it | the new files, once `recover` (the next writer, or a resume) finishes the journal |
//!
//! A failed write removes its temporaries; a killed process leaves them, and the next writer
//! holding the directory's lock removes them (`remove_stale_temporaries`: under the lock no
//! other wgrad writes there, and the names are wgrad's own).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The journal of a multi-file commit in progress.
pub(crate) const JOURNAL: &str = ".wgrad-commit.json";
/// What every temporary's name carries: `.{name}.wgrad-tmp-{pid}-{n}`.
const TMP_TAG: &str = ".wgrad-tmp-";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What `commit` does, written down before it starts: names relative to the directory.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct Journal {
    /// (temporary, final name), renamed in this order.
    renames: Vec<(String, String)>,
    /// Old files the new ones would contradict (another model's shards or tokenizer).
    removals: Vec<String>,
}

/// Files staged in one directory, renamed onto their names by `commit` as one unit; dropped
/// uncommitted, the temporaries are removed.
pub(crate) struct StagedFiles {
    dir: PathBuf,
    staged: Vec<(PathBuf, PathBuf)>, // (temporary, final)
    removals: Vec<PathBuf>,
}

impl StagedFiles {
    /// Stages into `dir`, creating it (and its parents) when missing.
    pub fn new(dir: &Path) -> Result<StagedFiles> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        Ok(StagedFiles {
            dir: dir.to_path_buf(),
            staged: Vec::new(),
            removals: Vec::new(),
        })
    }

    /// The directory the files go into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The final names staged so far.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.staged
            .iter()
            .filter_map(|(_, dest)| dest.file_name().and_then(|n| n.to_str()))
    }

    /// A fresh temporary path for the file `name`, registered for `commit`. Whoever writes it
    /// must flush it to disk (`write_with` and `copy` do; see `sync_file`).
    pub fn temporary_path(&mut self, name: &str) -> PathBuf {
        let tmp = temporary_name(&self.dir, name);
        self.staged.push((tmp.clone(), self.dir.join(name)));
        tmp
    }

    /// Stages the file `name` with what `write` writes.
    pub fn write_with(
        &mut self,
        name: &str,
        write: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>,
    ) -> Result<()> {
        let tmp = self.temporary_path(name);
        file_op(&tmp)?;
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        file_op(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, &file);
        write(&mut w)
            .and_then(|()| w.flush())
            .map_err(io_err(&tmp))?;
        drop(w);
        file_op(&tmp)?;
        file.sync_all().map_err(io_err(&tmp))
    }

    /// Stages `bytes` as the file `name`.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        self.write_with(name, |w| w.write_all(bytes))
    }

    /// Removes the file `name` (when it exists) in the same commit as the new files.
    pub fn remove_on_commit(&mut self, name: &str) {
        self.removals.push(self.dir.join(name));
    }

    /// Puts every staged file in place and removes the files to go, as one unit: a single
    /// file is renamed onto its name; several go through the journal (see the module's doc).
    pub fn commit(mut self) -> Result<()> {
        if self.staged.len() == 1 && self.removals.is_empty() {
            let (tmp, dest) = self.staged.pop().expect("one file");
            return rename(&tmp, &dest)
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(&tmp);
                })
                .and_then(|()| sync_dir(&self.dir));
        }
        let relative = |p: &Path| {
            p.file_name()
                .and_then(|n| n.to_str())
                .expect("staged names are UTF-8")
                .to_string()
        };
        let journal = Journal {
            renames: (self.staged.iter())
                .map(|(tmp, dest)| (relative(tmp), relative(dest)))
                .collect(),
            removals: self.removals.iter().map(|p| relative(p)).collect(),
        };
        let text = serde_json::to_string_pretty(&journal).expect("a journal serializes");
        let mut journal_file = StagedFiles::new(&self.dir)?;
        journal_file.write(JOURNAL, text.as_bytes())?;
        let (tmp, dest) = journal_file.staged.pop().expect("the journal");
        rename(&tmp, &dest).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        // Committed: from here on the temporaries belong to the journal, not to Drop.
        self.staged.clear();
        sync_dir(&self.dir)?;
        apply(&self.dir, &journal)
    }
}

impl Drop for StagedFiles {
    fn drop(&mut self) {
        if stopped() {
            return; // a test's simulated kill: nothing more happens on disk
        }
        for (tmp, _) in &self.staged {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// `dir/.{name}.wgrad-tmp-{pid}-{n}`, unique within the process.
fn temporary_name(dir: &Path, name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{name}{TMP_TAG}{}-{n}", std::process::id()))
}

/// Carries out a written journal: renames whose temporary is still there, removals, then the
/// journal itself. Safe to repeat: a step already done is skipped.
fn apply(dir: &Path, journal: &Journal) -> Result<()> {
    for (tmp, dest) in &journal.renames {
        let tmp = dir.join(tmp);
        if tmp.exists() {
            rename(&tmp, &dir.join(dest))?;
        }
    }
    for name in &journal.removals {
        let path = dir.join(name);
        file_op(&path)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&path)(e)),
            _ => {}
        }
    }
    sync_dir(dir)?;
    let path = dir.join(JOURNAL);
    file_op(&path)?;
    std::fs::remove_file(&path).map_err(io_err(&path))?;
    sync_dir(dir)
}

/// Finishes a commit a stopped process left in `dir` (the caller holds the directory's lock).
/// Returns whether there was one.
pub(crate) fn recover(dir: &Path) -> Result<bool> {
    let path = dir.join(JOURNAL);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(&path)(e)),
    };
    // The journal is renamed into place only once complete: unreadable, it was not ours.
    let journal: Journal = serde_json::from_str(&text).map_err(|e| Error::ModelFile {
        path: path.display().to_string(),
        reason: format!(
            "not a wgrad commit journal ({e}); remove it if no wgrad wrote this directory"
        ),
    })?;
    let own = |name: &str| {
        !name.is_empty() && !name.contains(['/', '\\', ':']) && name != "." && name != ".."
    };
    if !journal.renames.iter().all(|(a, b)| own(a) && own(b))
        || !journal.removals.iter().all(|n| own(n))
    {
        return Err(Error::ModelFile {
            path: path.display().to_string(),
            reason: "names a file outside its directory; not a wgrad commit journal".into(),
        });
    }
    apply(dir, &journal)?;
    Ok(true)
}

/// Whether `name` is one of wgrad's temporaries.
pub(crate) fn is_temporary(name: &str) -> bool {
    let Some((_, tail)) = name.split_once(TMP_TAG) else {
        return false;
    };
    let mut parts = tail.split('-');
    name.starts_with('.')
        && matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None)
            if !a.is_empty() && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit()))
}

/// Removes wgrad's temporaries from `dir`, which the caller holds the lock of (after
/// `recover`: a journal's temporaries are its files). Returns the bytes freed.
pub(crate) fn remove_stale_temporaries(dir: &Path) -> Result<u64> {
    let mut freed = 0;
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        if name.to_str().is_some_and(is_temporary) {
            let path = entry.path();
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&path).map_err(io_err(&path))?;
            freed += bytes;
        }
    }
    Ok(freed)
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    file_op(to)?;
    std::fs::rename(from, to).map_err(io_err(to))
}

/// Flushes a file written by someone else (a library writing to a path) to disk.
pub(crate) fn sync_file(path: &Path) -> Result<()> {
    file_op(path)?;
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path))
}

/// Makes renames in `dir` durable where the platform can (Unix); best effort elsewhere.
fn sync_dir(dir: &Path) -> Result<()> {
    file_op(dir)?;
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes one file atomically.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::InvalidArgument {
            op: "write_file",
            reason: format!("{} has no UTF-8 file name", path.display()),
        })?;
    let mut staged = StagedFiles::new(dir)?;
    staged.write(name, bytes)?;
    staged.commit()
}

/// Every file operation of a save passes through here first. Outside tests it does nothing;
/// a test stops the save at any one of them (`stop_at`) as a kill would.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn file_op(_path: &Path) -> Result<()> {
    Ok(())
}

#[cfg(not(test))]
#[inline(always)]
fn stopped() -> bool {
    false
}

#[cfg(test)]
pub(crate) use kill::{file_op, stop_at, stopped};

#[cfg(test)]
mod kill {
    //! A kill at the n-th file operation, for tests (per thread): that operation and every later
    //! one fail and nothing is cleaned up, as if the process had died there.
    use std::cell::Cell;
    use std::path::Path;

    use crate::error::{Error, Result};

    thread_local! {
        static AT: Cell<Option<usize>> = const { Cell::new(None) };
        static DONE: Cell<usize> = const { Cell::new(0) };
    }

    /// Stops this thread's file operations from the `n`-th (0-based) on; None: no stop.
    pub(crate) fn stop_at(n: Option<usize>) {
        AT.set(n);
        DONE.set(0);
    }

    pub(crate) fn stopped() -> bool {
        AT.get().is_some_and(|at| DONE.get() >= at)
    }

    pub(crate) fn file_op(path: &Path) -> Result<()> {
        if stopped() {
            return Err(Error::Io {
                path: path.display().to_string(),
                source: std::io::Error::other("killed by the test"),
            });
        }
        DONE.set(DONE.get() + 1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{file_names as names, ScratchDir};

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).expect("reading")
    }

    #[test]
    fn commit_replaces_and_a_failed_stage_leaves_the_old_files() {
        let scratch = ScratchDir::new("atomic");
        let dir = scratch.path();
        write_file(&dir.join("a.txt"), b"old a").expect("first write");

        let mut staged = StagedFiles::new(dir).expect("staging");
        staged.write("a.txt", b"new a").expect("stage a");
        let failed = staged.write_with("b.txt", |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(failed.unwrap_err().to_string().contains("disk full"));
        drop(staged);
        assert_eq!(names(dir), ["a.txt"], "temporaries removed");
        assert_eq!(read(&dir.join("a.txt")), "old a");

        let mut staged = StagedFiles::new(dir).expect("staging");
        staged.write("a.txt", b"new a").expect("stage a");
        staged.write("b.txt", b"new b").expect("stage b");
        staged.commit().expect("commit");
        assert_eq!(names(dir), ["a.txt", "b.txt"]);
        assert_eq!(read(&dir.join("a.txt")), "new a");
    }

    /// Killed at each file operation of a three-file commit that also removes a file, the
    /// directory recovers to all old files or all new ones, with no temporary left.
    #[test]
    fn a_commit_killed_at_any_file_operation_recovers_whole() {
        let scratch = ScratchDir::new("atomic-kill");
        let mut saw_old = false;
        let mut saw_new = false;
        for at in 0.. {
            let dir = scratch.path().join(format!("k{at}"));
            std::fs::create_dir_all(&dir).expect("dir");
            for (name, text) in [("a", "old a"), ("b", "old b"), ("gone", "old")] {
                std::fs::write(dir.join(name), text).expect("old files");
            }
            stop_at(Some(at));
            let result = (|| {
                let mut staged = StagedFiles::new(&dir)?;
                for name in ["a", "b", "c"] {
                    staged.write(name, format!("new {name}").as_bytes())?;
                }
                staged.remove_on_commit("gone");
                staged.commit()
            })();
            let finished = !stopped();
            stop_at(None);
            recover(&dir).expect("recovering");
            remove_stale_temporaries(&dir).expect("cleaning");
            let files = names(&dir);
            if files == ["a", "b", "gone"] {
                assert!(result.is_err(), "kill at {at}");
                assert_eq!(
                    (read(&dir.join("a")), read(&dir.join("b"))),
                    ("old a".into(), "old b".into())
                );
                saw_old = true;
            } else {
                assert_eq!(files, ["a", "b", "c"], "kill at {at}");
                for name in ["a", "b", "c"] {
                    assert_eq!(read(&dir.join(name)), format!("new {name}"), "kill at {at}");
                }
                saw_new = true;
            }
            if finished {
                result.expect("the uninterrupted commit");
                assert!(at > 10, "the commit has its file operations counted ({at})");
                break;
            }
        }
        assert!(saw_old && saw_new);
    }

    #[test]
    fn temporaries_are_recognised_by_their_whole_name() {
        assert!(is_temporary(".model.safetensors.wgrad-tmp-123-4"));
        assert!(is_temporary(".wgrad-commit.json.wgrad-tmp-9-0"));
        for name in [
            "model.safetensors",
            ".x.wgrad-tmp-",
            ".x.wgrad-tmp-1",
            ".x.wgrad-tmp-a-1",
            "x.wgrad-tmp-1-2",
            ".x.wgrad-tmp-1-2-3",
        ] {
            assert!(!is_temporary(name), "{name}");
        }
    }

    #[test]
    fn a_journal_naming_files_elsewhere_is_refused() {
        let scratch = ScratchDir::new("atomic-journal");
        let dir = scratch.path();
        std::fs::write(
            dir.join(JOURNAL),
            r#"{"renames":[["x","../y"]],"removals":[]}"#,
        )
        .unwrap();
        assert!(recover(dir).unwrap_err().to_string().contains("outside"));
        std::fs::write(dir.join(JOURNAL), "{").unwrap();
        assert!(recover(dir)
            .unwrap_err()
            .to_string()
            .contains("not a wgrad commit journal"));
    }
}
