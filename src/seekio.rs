//! The one I/O layer all array data goes through: positioned, vectored
//! reads and writes (`preadv`/`pwritev`: one call gathers or scatters many
//! memory pieces for one file segment; [`crate::pieces`] decides which, or
//! packs small rows through a buffer), and the seek counting.
//!
//! The convention is keep.md's: a seek is an I/O call that does not start
//! exactly where the previous call ended in the same file, like a disk head
//! that has to move. File headers are not array data and are written
//! outside this layer, so they neither count nor move the head.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use nix::fcntl::PosixFadviseAdvice;

use crate::error::{Error, Result};

/// Which file an I/O call touches, for seek counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKey {
    Input(u64),
    Output(u64),
}

/// Counts seeks for reads and writes: the head is where the last call ended.
#[derive(Clone, Debug, Default)]
pub struct SeekCounter {
    head: Option<(FileKey, u64)>,
    pub read_seeks: u64,
    pub write_seeks: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl SeekCounter {
    /// Records a read of `len` bytes at `offset` of `file`.
    pub fn read(&mut self, file: FileKey, offset: u64, len: u64) {
        if self.moves(file, offset, len) {
            self.read_seeks += 1;
        }
        self.bytes_read += len;
    }

    /// Records a write of `len` bytes at `offset` of `file`.
    pub fn write(&mut self, file: FileKey, offset: u64, len: u64) {
        if self.moves(file, offset, len) {
            self.write_seeks += 1;
        }
        self.bytes_written += len;
    }

    fn moves(&mut self, file: FileKey, offset: u64, len: u64) -> bool {
        let moved = self.head != Some((file, offset));
        self.head = Some((file, offset + len));
        moved
    }

    pub fn seeks(&self) -> u64 {
        self.read_seeks + self.write_seeks
    }
}

/// I/O calls as one thread made them, kept to be counted later: the
/// executor reads on one thread while another writes, and seeks are
/// counted as if one thread had made every call in the plan's order
/// (read block k's reads, then write block k's writes, then read block
/// k+1's reads), which is the order the planner predicts.
#[derive(Clone, Debug, Default)]
pub struct SeekLog {
    calls: Vec<(bool, FileKey, u64, u64)>,
}

impl SeekLog {
    pub fn read(&mut self, file: FileKey, offset: u64, len: u64) {
        self.calls.push((false, file, offset, len));
    }

    pub fn write(&mut self, file: FileKey, offset: u64, len: u64) {
        self.calls.push((true, file, offset, len));
    }

    /// Bytes the logged write calls wrote.
    pub fn written_bytes(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(write, ..)| *write)
            .map(|&(.., len)| len)
            .sum()
    }

    /// Appends `later`'s calls, as made after these.
    pub fn extend(&mut self, later: SeekLog) {
        self.calls.extend(later.calls);
    }

    /// Counts the logged calls, in the order they were made, and forgets them.
    pub fn replay_into(&mut self, counter: &mut SeekCounter) {
        for (write, file, offset, len) in self.calls.drain(..) {
            if write {
                counter.write(file, offset, len);
            } else {
                counter.read(file, offset, len);
            }
        }
    }
}

/// Most iovecs one call may carry (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

/// Reads exactly the bytes the buffers ask for, starting at `offset`:
/// several calls when there are more than IOV_MAX buffers or the kernel
/// returns less, each continuing where the last ended (so one seek).
pub fn read_exact_at(
    file: &File,
    path: &Path,
    mut buffers: &mut [IoSliceMut<'_>],
    mut offset: u64,
) -> Result<()> {
    while !buffers.is_empty() {
        let batch = buffers.len().min(IOV_MAX);
        let n = nix::sys::uio::preadv(file.as_fd(), &mut buffers[..batch], offset as i64)
            .map_err(|e| Error::io(path, "reading", e.into()))?;
        if n == 0 {
            return Err(Error::bad_input(
                path,
                format!("ended at byte {offset}, before the block's data did: the file is truncated or changed since the scan"),
            ));
        }
        offset += n as u64;
        IoSliceMut::advance_slices(&mut buffers, n);
    }
    Ok(())
}

/// Drops `file`'s clean pages from the page cache. rechunkfs reads each
/// input byte once and never reads its output back, so once an input is
/// fully read or an output synced its pages only crowd the cache: one grown
/// to gigabytes slowed everything on the test VM (W2 uncapped: 47-50 s;
/// 23 s with inputs and outputs dropped, as small as inside a 256 MiB
/// cgroup), and it would evict the user's own data. Advice only.
pub fn drop_cached_pages(file: &File) {
    advise(file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
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

/// Writes all of `buffers` at `offset`, in as many continuing calls as needed.
pub fn write_all_at(
    file: &File,
    path: &Path,
    mut buffers: &mut [IoSlice<'_>],
    mut offset: u64,
) -> Result<()> {
    while !buffers.is_empty() {
        let batch = buffers.len().min(IOV_MAX);
        let n = nix::sys::uio::pwritev(file.as_fd(), &buffers[..batch], offset as i64)
            .map_err(|e| Error::io(path, "writing", e.into()))?;
        if n == 0 {
            return Err(Error::io(
                path,
                "writing",
                std::io::Error::new(std::io::ErrorKind::WriteZero, "wrote nothing"),
            ));
        }
        offset += n as u64;
        IoSlice::advance_slices(&mut buffers, n);
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

    #[test]
    fn head_model() {
        let mut counter = SeekCounter::default();
        let (a, b) = (FileKey::Input(0), FileKey::Input(1));
        counter.read(a, 0, 10);
        counter.read(a, 10, 10); // continues
        counter.read(b, 20, 5); // other file
        counter.read(a, 20, 5); // head moved away and back
        counter.write(FileKey::Output(0), 0, 4);
        assert_eq!(counter.read_seeks, 3);
        assert_eq!(counter.write_seeks, 1);
        assert_eq!(counter.bytes_read, 30);
    }

    #[test]
    fn vectored_round_trip_beyond_iov_max() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut slices: Vec<IoSlice> = data.chunks(1).map(IoSlice::new).collect();
        write_all_at(&file, &path, &mut slices, 7).unwrap();
        let mut back = vec![0u8; 3000];
        let mut targets: Vec<IoSliceMut> = back.chunks_mut(2).map(IoSliceMut::new).collect();
        read_exact_at(&file, &path, &mut targets, 7).unwrap();
        assert_eq!(back, data);
        let mut past_end = [0u8; 4];
        let err =
            read_exact_at(&file, &path, &mut [IoSliceMut::new(&mut past_end)], 3005).unwrap_err();
        assert!(err.to_string().contains("truncated"));
    }
}
