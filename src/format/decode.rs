//! Block files that are one encoded value: read whole, in one call, then
//! decoded into the block's raw C-order bytes.
//!
//! Compressed and sharded Zarr chunks, gzipped NIfTI and compressed TIFF
//! are all this one case to the planner and the engine: a read of such a
//! file costs one seek for all its bytes, and the decoded block is held in
//! memory while it is copied from. Each format supplies a [`BlockDecode`].
//! A format only its library reads (a scaled MINC2 image, through libhdf5)
//! reads the file itself ([`BlockDecode::read_decoded`]): still one read of
//! the whole block, the decoded block held.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, Result};

/// How to decode the files of one input array.
pub trait BlockDecode: Send + Sync + fmt::Debug {
    /// The raw bytes of the block whose encoded file `path` holds `encoded`:
    /// exactly [`decoded_len`](Self::decoded_len) bytes, in the array's byte
    /// order as stored. Damaged input is an error naming `path`, never a
    /// short or wrong block.
    fn decode(&self, path: &Path, encoded: &[u8]) -> Result<Vec<u8>>;

    /// The decoded block whose `len` encoded bytes are at `offset` in the
    /// file `path`, open as `file`: by default those bytes read whole, in
    /// one call, then [`decode`](Self::decode)d.
    fn read_decoded(&self, path: &Path, file: &File, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut encoded = vec![0u8; len as usize];
        read_whole(file, path, offset, &mut encoded)?;
        self.decode(path, &encoded)
    }

    /// Bytes of one decoded block (padding included where the format pads).
    fn decoded_len(&self) -> u64;

    /// The encoding as people name it, for messages and comparisons:
    /// two decoders with the same description and length decode alike.
    fn describe(&self) -> String;
}

/// Fills `buffer` from `offset` in `file`; a file shorter than that is
/// refused as truncated or changed.
fn read_whole(file: &File, path: &Path, offset: u64, buffer: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], offset + done as u64) {
            Ok(0) => {
                return Err(Error::bad_input(
                    path,
                    format!(
                        "ended at byte {done}, before the block's data did: the file is \
                         truncated or changed since the scan"
                    ),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(path, "reading", e)),
        }
    }
    Ok(())
}

impl PartialEq for dyn BlockDecode {
    fn eq(&self, other: &dyn BlockDecode) -> bool {
        self.describe() == other.describe() && self.decoded_len() == other.decoded_len()
    }
}

impl Eq for dyn BlockDecode {}
