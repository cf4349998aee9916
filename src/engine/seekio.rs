//! The one I/O layer all array data goes through: positioned, vectored
//! reads and writes (`preadv`/`pwritev`: one call gathers or scatters many
//! memory pieces for one file segment; `engine::pieces` decides which, or
//! packs small rows through a buffer), and the seek counting.
//!
//! The convention is keep.md's: a seek is an I/O call that does not start
//! exactly where the previous call ended in the same file, like a disk head
//! that has to move. File headers are not array data and are written
//! outside this layer, so they neither count nor move the head.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::AsFd;
use std::path::Path;

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
