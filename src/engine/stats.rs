//! What a run did, counted as it ran: the figures the executor reports
//! to its progress callback and its caller, and a sink sees between steps.

use serde::Serialize;

/// What a run did: counted, not estimated.
///
/// Reads that libhdf5 makes, and reads of absent Zarr chunks (which make
/// no I/O at all: they are the fill value), are counted as the segments
/// and bytes a contiguous file would cost, so counts stay comparable with
/// the plan; `fill_bytes` says how many bytes came from fill values. An
/// encoded (compressed or sharded) block is read whole: one seek, its
/// file's bytes; an absent one is one seek of no bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RunStats {
    pub read_seeks: u64,
    pub write_seeks: u64,
    pub bytes_read: u64,
    /// Bytes of absent chunks produced from the fill value, without I/O
    /// (included in `bytes_read`, except for encoded inputs).
    pub fill_bytes: u64,
    pub bytes_written: u64,
    /// Bytes of the encoded (compressed or sharded) output blocks, as
    /// gathered before encoding (padding included): `bytes_written` of
    /// them is the compression. 0 when blocks are written in place.
    pub encoded_from_bytes: u64,
    /// Input bytes the kernel was asked to read ahead (headers to check
    /// included; a file evicted from the open-file cache and reopened is
    /// asked for again). Advice is no I/O of ours, but a careless window
    /// reads the disk over and over: this bounds it in tests.
    pub advised_bytes: u64,
    /// Most array bytes held in memory at once.
    pub peak_held_bytes: u64,
    /// Array bytes held now (between read blocks: the waiting pieces).
    pub held_bytes: u64,
    pub read_blocks_done: u64,
    pub read_blocks_total: u64,
    pub output_blocks_done: u64,
    pub output_blocks_total: u64,
}

impl RunStats {
    pub fn seeks(&self) -> u64 {
        self.read_seeks + self.write_seeks
    }
}
