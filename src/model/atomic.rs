//! Writes nobody sees half-done. Each file is written under a temporary name in its final
//! directory (a rename never crosses file systems there), flushed to disk, then renamed onto
//! its name: a reader, or a crash, sees the old file or the new one, never part of one. A
//! directory of several files stages them all first and renames them only once every write has
//! succeeded; a failed write removes its temporaries and leaves the old files untouched.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Files staged in one directory, renamed onto their names by `commit`; dropped uncommitted,
/// the temporaries are removed.
pub(crate) struct StagedFiles {
    dir: PathBuf,
    staged: Vec<(PathBuf, PathBuf)>, // (temporary, final)
}

impl StagedFiles {
    /// Stages into `dir`, creating it (and its parents) when missing.
    pub fn new(dir: &Path) -> Result<StagedFiles> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        Ok(StagedFiles {
            dir: dir.to_path_buf(),
            staged: Vec::new(),
        })
    }

    /// A fresh temporary path for the file `name`, registered for `commit`. Whoever writes it
    /// must flush it to disk (`write_with` and `copy` do; see `sync_file`).
    pub fn temporary_path(&mut self, name: &str) -> PathBuf {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".{name}.wgrad-tmp-{}-{n}", std::process::id()));
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
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        let mut w = BufWriter::with_capacity(1 << 20, &file);
        write(&mut w)
            .and_then(|()| w.flush())
            .map_err(io_err(&tmp))?;
        drop(w);
        file.sync_all().map_err(io_err(&tmp))
    }

    /// Stages a copy of `src` as the file `name`.
    pub fn copy(&mut self, name: &str, src: &Path) -> Result<()> {
        let mut from = File::open(src).map_err(io_err(src))?;
        self.write_with(name, |w| std::io::copy(&mut from, w).map(|_| ()))
    }

    /// Renames every staged file onto its name, then flushes the directory entry.
    pub fn commit(mut self) -> Result<()> {
        while !self.staged.is_empty() {
            // Taken one at a time: on failure, Drop removes the temporaries not yet renamed.
            let (tmp, dest) = self.staged.remove(0);
            if let Err(source) = std::fs::rename(&tmp, &dest) {
                let _ = std::fs::remove_file(&tmp);
                return Err(Error::Io {
                    path: dest.display().to_string(),
                    source,
                });
            }
        }
        sync_dir(&self.dir);
        Ok(())
    }
}

impl Drop for StagedFiles {
    fn drop(&mut self) {
        for (tmp, _) in &self.staged {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Flushes a file written by someone else (a library writing to a path) to disk.
pub(crate) fn sync_file(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path))
}

/// Makes renames in `dir` durable where the platform can (Unix); best effort elsewhere.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
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
    staged.write_with(name, |w| w.write_all(bytes))?;
    staged.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::ScratchDir;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("listing")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_replaces_and_a_failed_stage_leaves_the_old_files() {
        let scratch = ScratchDir::new("atomic");
        let dir = scratch.path();
        write_file(&dir.join("a.txt"), b"old a").expect("first write");

        let mut staged = StagedFiles::new(dir).expect("staging");
        staged
            .write_with("a.txt", |w| w.write_all(b"new a"))
            .expect("stage a");
        let failed = staged.write_with("b.txt", |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(failed.unwrap_err().to_string().contains("disk full"));
        drop(staged);
        assert_eq!(names(dir), ["a.txt"], "temporaries removed");
        assert_eq!(std::fs::read(dir.join("a.txt")).expect("read"), b"old a");

        let mut staged = StagedFiles::new(dir).expect("staging");
        staged
            .write_with("a.txt", |w| w.write_all(b"new a"))
            .expect("stage a");
        staged
            .write_with("b.txt", |w| w.write_all(b"new b"))
            .expect("stage b");
        staged.commit().expect("commit");
        assert_eq!(names(dir), ["a.txt", "b.txt"]);
        assert_eq!(std::fs::read(dir.join("a.txt")).expect("read"), b"new a");
    }
}
