//! Opening input files so that nothing but a regular file is ever read: a
//! FIFO named like a block would block an open, and a read, forever, and a
//! device or socket has no array in it.

use std::fs::{File, FileType, Metadata, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};

/// Opens `path` for reading without blocking (a FIFO's open waits for a
/// writer otherwise), then refuses it unless it is a regular file (a
/// symlink is followed). For a regular file the flag changes nothing.
pub fn open_regular(path: &Path) -> Result<File> {
    open_regular_with_metadata(path).map(|(file, _)| file)
}

/// [`open_regular`], with the stat it took of the open file: on a cluster
/// filesystem each stat is a round trip, so one serves every use.
pub fn open_regular_with_metadata(path: &Path) -> Result<(File, Metadata)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(path, "opening", e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        return Err(not_regular(path, kind));
    }
    Ok((file, meta))
}

/// Creates `path` anew for writing (and reading), with `O_EXCL |
/// O_NOFOLLOW`: whatever is there (a stale temporary of an earlier run, or
/// a link someone planted in a directory they can write) is unlinked,
/// never followed, and the file made again once; a link made in between
/// fails the call instead of being written through. Unlinking only what
/// is found spares a lookup per file in the usual case, where nothing is.
pub fn create_fresh(path: &Path) -> std::io::Result<File> {
    let create = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            create()
        }
        made => made,
    }
}

/// The refusal of `path`, which is `kind` and not a regular file.
pub fn not_regular(path: &Path, kind: FileType) -> Error {
    Error::bad_input(
        path,
        format!(
            "is {}, not a regular file: block files must be regular files (or symlinks to \
             them); move it out of the input",
            describe(kind)
        ),
    )
}

/// What a file that is not a regular one is, in words.
fn describe(kind: FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_symlink() {
        "a symlink to nothing"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_link_is_replaced_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = dir.path().join(".0_0_0.npy.p0-host-1.partial");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let mut file = create_fresh(&planted).unwrap();
        std::io::Write::write_all(&mut file, b"block").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(&planted).unwrap().is_file());
        assert_eq!(std::fs::read(&planted).unwrap(), b"block");
        // A stale file of an earlier run is replaced too.
        create_fresh(&planted).unwrap();
        assert_eq!(std::fs::read(&planted).unwrap(), b"");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("0_0_0.h5");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let error = open_regular(&fifo).unwrap_err().to_string();
        assert!(
            error.contains("is a FIFO (named pipe), not a regular file"),
            "{error}"
        );
        let error = open_regular(dir.path()).unwrap_err().to_string();
        assert!(error.contains("is a directory"), "{error}");
        let file = dir.path().join("1_0_0.h5");
        std::fs::write(&file, b"x").unwrap();
        let link = dir.path().join("2_0_0.h5");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(open_regular(&link).is_ok());
    }
}
