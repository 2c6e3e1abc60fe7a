//! The one check every file wgrad reads goes through first: it must be a regular file (or a
//! link to one). A FIFO would block the read forever, a directory fails with an OS error that
//! names neither ("No such device", "Is a directory"), and a device file reads without end;
//! each is refused here with the path and what it is, before anything opens it.

use std::path::Path;

use crate::error::{Error, Result};

/// What a non-regular file is, in words.
fn kind(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_block_device() || file_type.is_char_device() {
            return "a device file";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// An error when `path` exists and is not a regular file (links are followed). A missing path
/// passes: the read that follows reports it, in its own words.
pub(crate) fn refuse_non_regular(path: &Path, what: &str) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if meta.is_file() {
        return Ok(());
    }
    Err(Error::ModelFile {
        path: path.display().to_string(),
        reason: format!(
            "is {}, not a regular file; give {what} as a regular file",
            kind(&meta.file_type())
        ),
    })
}

/// The bytes of the regular file `path` (`what` says what it is for in an error).
pub(crate) fn read_regular(path: &Path, what: &str) -> Result<Vec<u8>> {
    refuse_non_regular(path, what)?;
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::ScratchDir;

    #[test]
    fn directories_and_fifos_are_refused_by_name_and_files_read() {
        let scratch = ScratchDir::new("input-file");
        let dir = scratch.path();
        let err = read_regular(dir, "config.json").expect_err("a directory");
        let text = err.to_string();
        assert!(
            text.contains("a directory") && text.contains("config.json"),
            "{text}"
        );
        assert!(text.starts_with(&dir.display().to_string()), "{text}");
        let file = dir.join("f.txt");
        std::fs::write(&file, b"text").expect("writing");
        assert_eq!(read_regular(&file, "--data").expect("a file"), b"text");
        let missing = dir.join("missing");
        assert!(
            refuse_non_regular(&missing, "x").is_ok(),
            "left to the read"
        );
        assert!(matches!(read_regular(&missing, "x"), Err(Error::Io { .. })));
        #[cfg(target_os = "linux")]
        {
            let fifo = dir.join("fifo");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            assert!(made.is_ok_and(|s| s.success()), "mkfifo (coreutils)");
            let err = read_regular(&fifo, "--data").expect_err("a FIFO, without blocking");
            assert!(err.to_string().contains("FIFO"), "{err}");
        }
    }
}
