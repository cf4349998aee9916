//! Whether a view can be mounted here: the mount point and FUSE itself are
//! checked in the calling process, before anything is started, so the
//! person sees what is wrong at once.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fuse::bad_view;

/// Mount points listed in /proc/self/mountinfo (octal escapes decoded).
fn mount_points() -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| {
            let mut decoded = Vec::new();
            let bytes = field.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i] == b'\\' && i + 3 < bytes.len() {
                    if let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                        decoded.push(value);
                        i += 4;
                        continue;
                    }
                }
                decoded.push(bytes[i]);
                i += 1;
            }
            PathBuf::from(std::ffi::OsStr::from_bytes(&decoded))
        })
        .collect()
}

/// The absolute form of `path` without resolving it (a dead FUSE mount
/// cannot be resolved: stat fails with ENOTCONN).
pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

pub fn is_mounted(view: &Path) -> bool {
    let wanted = absolute(view);
    let canonical = view.canonicalize().ok();
    mount_points()
        .iter()
        .any(|m| *m == wanted || Some(m) == canonical.as_ref())
}

/// The mount point must exist, be an empty directory, and not be mounted.
pub fn check_mount_point(view: &Path) -> Result<()> {
    let meta = match fs::metadata(view) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad_view(
                view,
                "does not exist; create an empty directory to mount the view on (mkdir -p it)",
            ))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(bad_view(
                view,
                format!(
                    "is a view whose daemon has died; run `rechunkfs umount {}` first, then mount again \
                     (completed blocks are kept)",
                    view.display()
                ),
            ))
        }
        Err(e) => return Err(Error::io(view, "checking the mount point", e)),
    };
    if !meta.is_dir() {
        return Err(bad_view(
            view,
            "is not a directory; the view is mounted on an empty directory",
        ));
    }
    if is_mounted(view) {
        return Err(bad_view(
            view,
            format!(
                "is already a mount point; unmount it first (rechunkfs umount {})",
                view.display()
            ),
        ));
    }
    let mut entries = fs::read_dir(view).map_err(|e| Error::io(view, "listing", e))?;
    if entries.next().is_some() {
        return Err(bad_view(
            view,
            "is not empty; mount the view on an empty directory so nothing in it is hidden",
        ));
    }
    Ok(())
}

/// FUSE must be usable: /dev/fuse present and, unless root, fusermount3.
pub fn check_fuse() -> Result<()> {
    let fuse = Path::new("/dev/fuse");
    if !fuse.exists() {
        return Err(bad_view(
            fuse,
            "is missing: this system has no FUSE support (load the fuse kernel module: modprobe fuse; \
             in a container, pass the device in)",
        ));
    }
    if let Err(e) = fs::OpenOptions::new().read(true).write(true).open(fuse) {
        return Err(Error::io(fuse, "opening (needed to mount a view)", e));
    }
    if !nix::unistd::geteuid().is_root() && which("fusermount3").is_none() {
        return Err(bad_view(
            Path::new("fusermount3"),
            "is not installed, and mounting without root needs it: install the fuse3 package \
             (apt-get install fuse3)",
        ));
    }
    Ok(())
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}
