//! Where a path's space comes from: the mount point of the filesystem
//! holding it, which is what a person frees space on.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
