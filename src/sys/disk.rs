//! The space on a filesystem: how much is left, to say how short of it a
//! run fell, and the mount point holding a path, which is what a person
//! frees space on.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes an unprivileged writer may still use on the filesystem holding
/// `path`, or `None` if the filesystem does not say.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    (stat.blocks_available() as u64).checked_mul(stat.fragment_size() as u64)
}

/// The mount point of the filesystem holding `path` (the highest directory
/// above it on the same device); `path` itself if it cannot be resolved.
pub fn filesystem_of(path: &Path) -> PathBuf {
    let Ok(mut at) = path.canonicalize() else {
        return path.to_path_buf();
    };
    let Ok(device) = at.metadata().map(|m| m.dev()) else {
        return at;
    };
    while let Some(parent) = at.parent() {
        if parent.metadata().map(|m| m.dev()).ok() != Some(device) {
            break;
        }
        at = parent.to_path_buf();
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_filesystem_and_proc_are_found() {
        assert_eq!(filesystem_of(Path::new("/proc/self")), Path::new("/proc"));
        let root = filesystem_of(Path::new("/"));
        assert_eq!(root, Path::new("/"));
    }
}
