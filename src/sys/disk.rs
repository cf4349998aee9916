//! The space left on a filesystem, to say how short of it a run fell.

use std::path::Path;

/// Bytes an unprivileged writer may still use on the filesystem holding
/// `path`, or `None` if the filesystem does not say.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    (stat.blocks_available() as u64).checked_mul(stat.fragment_size() as u64)
}

/// Whether `error` is the filesystem running out of space (or of the
/// user's quota).
pub fn is_out_of_space(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}
