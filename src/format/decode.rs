//! Block files that are one encoded value: read whole, in one call, then
//! decoded into the block's raw C-order bytes.
//!
//! Compressed and sharded Zarr chunks, gzipped NIfTI and compressed TIFF
//! are all this one case to the planner and the engine: a read of such a
//! file costs one seek for all its bytes, and the decoded block is held in
//! memory while it is copied from. Each format supplies a [`BlockDecode`].

use std::fmt;
use std::path::Path;

use crate::error::Result;

/// How to decode the files of one input array.
pub trait BlockDecode: Send + Sync + fmt::Debug {
    /// The raw bytes of the block whose encoded file `path` holds `encoded`:
    /// exactly [`decoded_len`](Self::decoded_len) bytes, in the array's byte
    /// order as stored. Damaged input is an error naming `path`, never a
    /// short or wrong block.
    fn decode(&self, path: &Path, encoded: &[u8]) -> Result<Vec<u8>>;

    /// Bytes of one decoded block (padding included where the format pads).
    fn decoded_len(&self) -> u64;

    /// The encoding as people name it, for messages and comparisons:
    /// two decoders with the same description and length decode alike.
    fn describe(&self) -> String;
}

impl PartialEq for dyn BlockDecode {
    fn eq(&self, other: &dyn BlockDecode) -> bool {
        self.describe() == other.describe() && self.decoded_len() == other.decoded_len()
    }
}

impl Eq for dyn BlockDecode {}
