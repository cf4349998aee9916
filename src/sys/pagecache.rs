//! Page-cache advice and write-back: reading ahead, dropping pages once
//! used, starting write-back early, and one `syncfs` for many files.
//!
//! All of it is advice to the kernel except [`sync_filesystem`]: the data
//! path never depends on it, so failures of the advice calls are ignored.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use nix::fcntl::PosixFadviseAdvice;

use crate::error::{Error, Result};

/// Drops `file`'s clean pages from the page cache. rechunkfs reads each
/// input byte once and never reads its output back, so once an input is
/// fully read or an output synced its pages only crowd the cache: one grown
/// to gigabytes slowed everything on the test VM (W2 uncapped: 47-50 s;
/// 23 s with inputs and outputs dropped, as small as inside a 256 MiB
/// cgroup), and it would evict the user's own data. Advice only.
pub fn drop_cached_pages(file: &File) {
    advise(file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

/// Drops the clean pages of `len` bytes of `file` at `offset`: those of
/// one block in a file that holds others.
pub fn drop_cached_range(file: &File, offset: u64, len: u64) {
    advise(file, offset, len, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

/// Asks the kernel to start reading `len` bytes of `file` at `offset` into
/// the page cache, so a later read finds them there. Advice only: no data
/// is copied and nothing is counted as a seek.
pub fn read_ahead(file: &File, offset: u64, len: u64) {
    advise(file, offset, len, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
}

/// Starts writing to disk the pages of `file` that lie wholly inside the
/// `len` bytes just written at `offset`, without waiting. A long write
/// (a slab of a block much larger than a step) then reaches the disk while
/// the next step is read, instead of all at the block's end. Partly
/// covered edge pages are left: their other bytes may come later, and
/// writing such a page now would write it twice. Advice only: errors
/// surface at the sync.
pub fn start_writeback_of(file: &File, offset: u64, len: u64) {
    if let Some((start, len)) = whole_pages(offset, len) {
        sync_file_range_write(file, start, len);
    }
}

/// Starts writing all of a completed file's dirty pages to disk without
/// waiting, so the disk works while the next blocks are computed and the
/// batch's sync has little left to do. Advice only: errors surface at the
/// sync.
pub fn start_writeback(file: &File) {
    // Length 0: to the end of the file.
    sync_file_range_write(file, 0, 0);
}

fn sync_file_range_write(file: &File, offset: u64, len: u64) {
    // SAFETY: a valid open descriptor; the call only schedules writeback.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as i64,
            len as i64,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// The page cache's pages lying wholly inside `len` bytes at `offset`, as
/// (first byte, length); `None` when no page is covered.
fn whole_pages(offset: u64, len: u64) -> Option<(u64, u64)> {
    const PAGE: u64 = 4096;
    let start = offset.div_ceil(PAGE) * PAGE;
    let end = (offset + len) / PAGE * PAGE;
    (end > start).then(|| (start, end - start))
}

/// posix_fadvise, whose failure only means the advice was not taken.
fn advise(file: &File, offset: u64, len: u64, advice: PosixFadviseAdvice) {
    let _ = nix::fcntl::posix_fadvise(file.as_fd().as_raw_fd(), offset as i64, len as i64, advice);
}

/// [`drop_cached_pages`] for a file by path; one that cannot be opened
/// has nothing to drop that matters here.
pub fn drop_cached_pages_of(path: &Path) {
    if let Ok(file) = File::open(path) {
        drop_cached_pages(&file);
    }
}

/// Flushes every dirty page of the filesystem holding `file` to disk (one
/// `syncfs`: cheaper than an fsync per file when many files are done).
pub fn sync_filesystem(file: &File, path: &Path) -> Result<()> {
    // SAFETY: a valid open descriptor; syncfs only flushes.
    if unsafe { libc::syncfs(file.as_raw_fd()) } != 0 {
        return Err(Error::io(path, "syncing", std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pages_a_write_covers_whole_are_handed_to_the_disk() {
        assert_eq!(whole_pages(0, 8192), Some((0, 8192)));
        // An HDF5 block's data after its 2 KiB header: the first page also
        // holds the header, the last continues past the write.
        assert_eq!(whole_pages(2048, 3 * 4096), Some((4096, 2 * 4096)));
        assert_eq!(whole_pages(4095, 4097), Some((4096, 4096)));
        assert_eq!(whole_pages(4095, 4096), None);
        assert_eq!(whole_pages(100, 200), None);
        assert_eq!(whole_pages(0, 0), None);
    }
}
