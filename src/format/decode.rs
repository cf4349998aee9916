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
//!
//! An encoded file is a claim its bytes may not back. Two rules keep work
//! and memory to what a file holds: at the scan, a file whose encoded
//! length cannot hold the block its header claims, even at its codec's
//! greatest ratio, is refused ([`check_holds`]); and every stream is
//! inflated into a buffer of the block's size, allocated fallibly, the
//! stream refused the moment it yields one byte more ([`read_limited`],
//! [`zstd_limited`], ...): a lying size never sizes an allocation.

use std::fmt;
use std::fs::File;
use std::io::Read;
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
        let mut encoded = zeroed(path, len)?;
        read_whole(file, path, offset, &mut encoded)?;
        self.decode(path, &encoded)
    }

    /// The `len` encoded bytes at `offset` in the file `path`, open as
    /// `file`, read whole in one call, for [`decode`](Self::decode) to
    /// decode (on any thread); `None` for a format whose library reads the
    /// file itself, which [`read_decoded`](Self::read_decoded) then does.
    fn read_encoded(
        &self,
        path: &Path,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>> {
        let mut encoded = zeroed(path, len)?;
        read_whole(file, path, offset, &mut encoded)?;
        Ok(Some(encoded))
    }

    /// The most decoded bytes `encoded_len` encoded bytes can hold, at the
    /// greatest ratio of the codecs; `None` when no bound follows from
    /// the length alone.
    fn most_decoded(&self, encoded_len: u64) -> Option<u64> {
        let _ = encoded_len;
        None
    }

    /// The decoded bytes a file must really hold: [`decoded_len`](Self::decoded_len)
    /// unless part of it is padding the decoder adds.
    fn claimed_len(&self) -> u64 {
        self.decoded_len()
    }

    /// Bytes of one decoded block (padding included where the format pads).
    fn decoded_len(&self) -> u64;

    /// The encoding as people name it, for messages and comparisons:
    /// two decoders with the same description and length decode alike.
    fn describe(&self) -> String;
}

/// Refuses, at the scan, the encoded file `path` of `encoded_len` bytes
/// when they cannot hold what `decoder` claims it decodes to: a header
/// lying about the block's size, or a file cut short.
pub fn check_holds(decoder: &dyn BlockDecode, path: &Path, encoded_len: u64) -> Result<()> {
    let claimed = decoder.claimed_len();
    match decoder.most_decoded(encoded_len) {
        Some(most) if most < claimed => Err(Error::bad_input(
            path,
            format!(
                "it claims {claimed} decoded bytes ({}), but its {encoded_len} encoded bytes \
                 can hold at most {most}, even at the codec's greatest ratio: its header or \
                 metadata overstates the block, or the file was cut short; it is refused rather \
                 than decoded",
                decoder.describe()
            ),
        )),
        _ => Ok(()),
    }
}

/// Greatest ratios of decoded to encoded bytes (a stream's headers only
/// lower them). Deflate's longest match, 258 bytes, costs at least two
/// bits: 1032:1. A zstd block of at most 128 KiB costs at least 4 bytes
/// (an RLE block): 32768:1. An LZW code of at least 9 bits yields at most
/// 4096 bytes. A PackBits run of two bytes yields 128. Blosc holds one of
/// these streams per block.
pub(in crate::format) const DEFLATE_RATIO: u64 = 1032;
pub(in crate::format) const ZSTD_RATIO: u64 = 32768;
pub(in crate::format) const LZW_RATIO: u64 = 4096;
pub(in crate::format) const PACKBITS_RATIO: u64 = 64;
pub(in crate::format) const BLOSC_RATIO: u64 = ZSTD_RATIO;

/// The most bytes `encoded_len` bytes of a stream of `ratio` decode to.
pub(in crate::format) fn most_at_ratio(encoded_len: u64, ratio: u64) -> u64 {
    encoded_len.saturating_mul(ratio)
}

/// `len` zero bytes, or an error naming `path` when memory refuses them:
/// a size from a file never aborts the process.
pub(in crate::format) fn zeroed(path: &Path, len: u64) -> Result<Vec<u8>> {
    let mut buffer = reserved(path, len)?;
    // `reserved` has checked that `len` fits in a usize.
    buffer.resize(len as usize, 0);
    Ok(buffer)
}

/// An empty buffer with room for exactly `len` bytes, allocated fallibly.
pub(in crate::format) fn reserved(path: &Path, len: u64) -> Result<Vec<u8>> {
    let mut buffer = Vec::new();
    usize::try_from(len)
        .ok()
        .and_then(|len| buffer.try_reserve_exact(len).ok())
        .ok_or_else(|| {
            Error::bad_input(
                path,
                format!(
                    "its block needs {len} bytes of memory at once (a block is decoded \
                     whole), which this machine does not grant; run where more memory is free"
                ),
            )
        })?;
    Ok(buffer)
}

/// Why a bounded stream was refused; displayed as what follows "its
/// zstd stream".
#[derive(Debug)]
pub(in crate::format) enum Overrun {
    /// The stream does not decode (the codec's own message).
    Damaged(String),
    /// It decodes to more than `limit` bytes.
    Longer { limit: u64 },
    /// Its header declares more than `limit` bytes.
    Declared { declared: u64, limit: u64 },
}

impl fmt::Display for Overrun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Overrun::Damaged(why) => write!(f, "does not decode ({why})"),
            Overrun::Longer { limit } => {
                write!(f, "decodes to more than the {limit} bytes expected")
            }
            Overrun::Declared { declared, limit } => {
                write!(
                    f,
                    "declares {declared} bytes, more than the {limit} expected"
                )
            }
        }
    }
}

/// `stream` read to its end (so trailing checksums are checked) into
/// `out`, an empty buffer with room for `limit` bytes: refused at byte
/// `limit + 1`, so `out` never grows.
pub(in crate::format) fn read_limited(
    mut stream: impl Read,
    limit: u64,
    mut out: Vec<u8>,
) -> std::result::Result<Vec<u8>, Overrun> {
    (&mut stream)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| Overrun::Damaged(e.to_string()))?;
    let mut beyond = [0u8; 1];
    loop {
        match stream.read(&mut beyond) {
            Ok(0) => return Ok(out),
            Ok(_) => return Err(Overrun::Longer { limit }),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Overrun::Damaged(e.to_string())),
        }
    }
}

/// A zlib stream (deflate with zlib's header and Adler-32) decoded into
/// `out` (room for `limit` bytes), as [`read_limited`].
pub(in crate::format) fn zlib_limited(
    encoded: &[u8],
    limit: u64,
    out: Vec<u8>,
) -> std::result::Result<Vec<u8>, Overrun> {
    read_limited(flate2::read::ZlibDecoder::new(encoded), limit, out)
}

/// A gzip stream (one member or several) decoded as [`read_limited`].
pub(in crate::format) fn gzip_limited(
    encoded: &[u8],
    limit: u64,
    out: Vec<u8>,
) -> std::result::Result<Vec<u8>, Overrun> {
    read_limited(flate2::read::MultiGzDecoder::new(encoded), limit, out)
}

/// Zstd frames decoded as [`read_limited`]. A frame declaring more than
/// `limit` bytes is refused before decoding, and the decoder's window is
/// capped near `limit`: the frame's claims size nothing.
pub(in crate::format) fn zstd_limited(
    encoded: &[u8],
    limit: u64,
    out: Vec<u8>,
) -> std::result::Result<Vec<u8>, Overrun> {
    if let Ok(Some(declared)) = zstd::zstd_safe::get_frame_content_size(encoded) {
        if declared > limit {
            return Err(Overrun::Declared { declared, limit });
        }
    }
    ZSTD_CONTEXT.with(|slot| match slot.try_borrow_mut() {
        Ok(mut slot) => {
            let context = slot.get_or_insert_with(zstd::zstd_safe::DCtx::create);
            zstd_limited_with(context, encoded, limit, out)
        }
        Err(_) => zstd_limited_with(&mut zstd::zstd_safe::DCtx::create(), encoded, limit, out),
    })
}

std::thread_local! {
    /// Each thread's zstd decoding context, reused from chunk to chunk:
    /// making one (and the fresh pages it fills) cost more than decoding a
    /// small chunk, 1.5% of a run over 35³ chunks of u16.
    static ZSTD_CONTEXT: std::cell::RefCell<Option<zstd::zstd_safe::DCtx<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// [`zstd_limited`] through `context`, whose session starts afresh.
fn zstd_limited_with(
    context: &mut zstd::zstd_safe::DCtx<'static>,
    encoded: &[u8],
    limit: u64,
    out: Vec<u8>,
) -> std::result::Result<Vec<u8>, Overrun> {
    let damaged = |e: std::io::Error| Overrun::Damaged(e.to_string());
    let mut decoder = zstd::stream::read::Decoder::with_context(encoded, context);
    // Encoders without a known size use windows of up to 8 MiB (2^23)
    // at the usual levels; a larger window than both is a claim.
    let window = (64 - limit.leading_zeros()).clamp(ZSTD_WINDOW_LOG, 31);
    decoder.window_log_max(window).map_err(damaged)?;
    read_limited(decoder, limit, out)
}

/// log2 of the zstd window always allowed (see [`zstd_limited`]).
const ZSTD_WINDOW_LOG: u32 = 23;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// One thread's zstd context decodes frame after frame, each as a fresh
    /// decoder would, whatever the frame before it left half done.
    #[test]
    fn a_reused_zstd_context_decodes_each_frame_afresh() {
        let first: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let second: Vec<u8> = (0..30_000u32).map(|i| (i % 13) as u8).collect();
        // Streamed frames declare no size: a long one is stopped midway.
        let streamed = |bytes: &[u8]| zstd::stream::encode_all(bytes, 3).unwrap();
        let decode = |encoded: &[u8], limit| zstd_limited(encoded, limit, Vec::new());
        assert_eq!(decode(&streamed(&first), 50_000).unwrap(), first);
        let long = decode(&streamed(&first), 40_000);
        assert!(
            matches!(long, Err(Overrun::Longer { limit: 40_000 })),
            "{long:?}"
        );
        assert_eq!(decode(&streamed(&second), 30_000).unwrap(), second);
        let cut = streamed(&first);
        let damaged = decode(&cut[..cut.len() / 2], 50_000);
        assert!(matches!(damaged, Err(Overrun::Damaged(_))), "{damaged:?}");
        let declared = zstd::bulk::compress(&second, 3).unwrap();
        assert_eq!(decode(&declared, 30_000).unwrap(), second);
        let refused = decode(&declared, 20_000);
        assert!(
            matches!(refused, Err(Overrun::Declared { .. })),
            "{refused:?}"
        );
        assert_eq!(decode(&streamed(&first), 50_000).unwrap(), first);
    }
}
