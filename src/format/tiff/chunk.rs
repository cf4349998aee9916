//! One compressed (or predicted) strip or tile of a TIFF page, decoded
//! into its raw C-order bytes: decompressed to the stream's end, so that
//! a damaged stream is an error wherever the compression can tell (zlib's
//! and zstd's checksums, LZW's codes, every stream's length), then its
//! predictor undone by the `tiff` crate inside a small BigTIFF made around
//! the bytes. A tile is encoded exactly as a strip of the tile's width and
//! length, so both are decoded alike.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use tiff::decoder::{Decoder, Limits};

use crate::array::dtype::{DType, Endian, Kind};
use crate::error::{Error, Result};
use crate::format::decode::{
    most_at_ratio, reserved, zlib_limited, zstd_limited, BlockDecode, Overrun, DEFLATE_RATIO,
    LZW_RATIO, PACKBITS_RATIO, ZSTD_RATIO,
};

/// The format's name in messages.
pub const NAME: &str = "TIFF";

/// Compression schemes decoded (TIFF's `Compression` tag), by number.
pub(super) const NONE: u16 = 1;
const SUPPORTED_COMPRESSION: [(u16, &str); 6] = [
    (NONE, "uncompressed"),
    (5, "LZW"),
    (8, "Adobe deflate"),
    (32946, "deflate"),
    (32773, "PackBits"),
    (50000, "zstd"),
];

/// The name of compression scheme `code`, if it is one rechunkfs decodes.
pub(super) fn compression_name(code: u16) -> Option<&'static str> {
    SUPPORTED_COMPRESSION
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, name)| *name)
}

/// A refusal of the TIFF file at `path`.
pub(super) fn bad(path: &Path, problem: impl Into<String>) -> Error {
    Error::BadBlockFile {
        path: path.to_path_buf(),
        format: NAME,
        problem: problem.into(),
    }
}

/// Decodes one strip or tile of a page into its raw C-order bytes (rows ×
/// width × samples), padded with zeros to a full chunk's rows, in the
/// file's byte order.
#[derive(Clone, Debug)]
pub struct ChunkDecode {
    pub(super) page: usize,
    pub(super) chunk: usize,
    pub(super) tile: bool,
    pub(super) byte_order: Endian,
    pub(super) compression: u16,
    pub(super) predictor: u16,
    pub(super) dtype: DType,
    pub(super) samples: u64,
    /// Pixels per row of the chunk (a strip's width is the page's).
    pub(super) width: u64,
    /// Rows encoded (a bottom strip may hold fewer than `padded_rows`).
    pub(super) rows: u64,
    pub(super) padded_rows: u64,
}

impl ChunkDecode {
    fn row_bytes(&self) -> u64 {
        self.width * self.samples * self.dtype.size as u64
    }

    /// The chunk's bytes decompressed into `out` (room for `cap` bytes):
    /// a stream that holds more is an error, except uncompressed and LZW
    /// strips, cut at `cap` as libtiff reads them.
    fn decompress(
        &self,
        encoded: &[u8],
        cap: usize,
        mut out: Vec<u8>,
    ) -> std::result::Result<Vec<u8>, String> {
        let bounded = |result: std::result::Result<Vec<u8>, Overrun>| {
            result.map_err(|e| match e {
                Overrun::Damaged(why) => why,
                Overrun::Longer { limit } => {
                    format!("hold more than the {limit} bytes of a whole chunk")
                }
                declared => format!("its stream {declared}"),
            })
        };
        match self.compression {
            1 => {
                out.extend_from_slice(&encoded[..encoded.len().min(cap)]);
                Ok(out)
            }
            5 => lzw(encoded, cap, out),
            8 | 32946 => bounded(zlib_limited(encoded, cap as u64, out)),
            32773 => packbits(encoded, cap, out),
            50000 => bounded(zstd_limited(encoded, cap as u64, out)),
            other => Err(format!("compression {other} is not decoded")),
        }
    }

    /// `rows` (the chunk's rows, in the file's byte order, predicted)
    /// with the predictor undone, in the file's byte order.
    fn unpredict(&self, rows: &[u8]) -> tiff::TiffResult<Vec<u8>> {
        let container = self.container(rows.len() as u64);
        let reader = Joined {
            head: &container,
            tail: rows,
            at: 0,
        };
        let mut decoder = Decoder::new(reader)?.with_limits(Limits::unlimited());
        let mut out = vec![0u8; rows.len()];
        decoder.read_chunk_bytes(0, &mut out)?;
        // The crate hands samples over in this machine's order.
        let native = if cfg!(target_endian = "big") {
            Endian::Big
        } else {
            Endian::Little
        };
        if self.byte_order != native && self.dtype.size > 1 {
            for sample in out.chunks_exact_mut(self.dtype.size) {
                sample.reverse();
            }
        }
        Ok(out)
    }

    /// A BigTIFF holding only the header of an uncompressed `rows` ×
    /// `width` image of one strip, `strip_len` bytes at the end of the
    /// header: what the crate needs to undo the chunk's predictor.
    fn container(&self, strip_len: u64) -> Vec<u8> {
        let samples = self.samples as usize;
        let bits = self.dtype.size as u64 * 8;
        let format = match self.dtype.kind {
            Kind::Unsigned => 1,
            Kind::Signed => 2,
            Kind::Float => 3,
        };
        // (tag, whether SHORT (else LONG8), values), in tag order.
        let mut entries: Vec<(u16, bool, Vec<u64>)> = vec![
            (256, false, vec![self.width]),
            (257, false, vec![self.rows]),
            (258, true, vec![bits; samples]),
            (259, true, vec![1]),
            (262, true, vec![1]),
            (273, false, vec![0]),
            (277, true, vec![self.samples]),
            (278, false, vec![self.rows]),
            (279, false, vec![strip_len]),
            (284, true, vec![1]),
            (317, true, vec![self.predictor.into()]),
            (339, true, vec![format; samples]),
        ];
        let order = self.byte_order;
        let values: Vec<Vec<u8>> = entries.iter().map(|e| encode(order, e.1, &e.2)).collect();
        // Values longer than 8 bytes follow the directory; the strip, them.
        let directory_end = 16 + 8 + entries.len() as u64 * 20 + 8;
        let long: u64 = values
            .iter()
            .filter(|v| v.len() > 8)
            .map(|v| v.len() as u64)
            .sum();
        entries[5].2 = vec![directory_end + long];
        let values: Vec<Vec<u8>> = entries.iter().map(|e| encode(order, e.1, &e.2)).collect();
        let mut out = if order == Endian::Big {
            b"MM".to_vec()
        } else {
            b"II".to_vec()
        };
        out.extend(encode(order, true, &[43, 8, 0]));
        out.extend(encode(order, false, &[16, entries.len() as u64]));
        let mut extra = Vec::new();
        for ((tag, short, list), value) in entries.iter().zip(values) {
            out.extend(encode(
                order,
                true,
                &[(*tag).into(), if *short { 3 } else { 16 }],
            ));
            out.extend(encode(order, false, &[list.len() as u64]));
            if value.len() > 8 {
                out.extend(encode(order, false, &[directory_end + extra.len() as u64]));
                extra.extend(value);
            } else {
                let mut field = value;
                field.resize(8, 0);
                out.extend(field);
            }
        }
        out.extend(encode(order, false, &[0]));
        out.extend(extra);
        out
    }
}

impl BlockDecode for ChunkDecode {
    fn decode(&self, path: &Path, encoded: &[u8]) -> Result<Vec<u8>> {
        let needed = (self.rows * self.row_bytes()) as usize;
        let full = self.decoded_len() as usize;
        let damaged = |problem: String| {
            bad(
                path,
                format!(
                    "page {}, {} {}: its {} data {problem}; the file is damaged or truncated",
                    self.page,
                    if self.tile { "tile" } else { "strip" },
                    self.chunk,
                    compression_name(self.compression).unwrap_or("compressed"),
                ),
            )
        };
        let mut rows = self
            .decompress(encoded, full, reserved(path, full as u64)?)
            .map_err(|e| damaged(format!("do not decode ({e})")))?;
        if rows.len() < needed {
            return Err(damaged(format!(
                "decode to {} bytes where its pixels need {needed}",
                rows.len()
            )));
        }
        rows.truncate(needed);
        if self.predictor != 1 {
            rows = self
                .unpredict(&rows)
                .map_err(|e| damaged(format!("do not decode ({e})")))?;
        }
        rows.resize(full, 0);
        Ok(rows)
    }

    fn decoded_len(&self) -> u64 {
        self.padded_rows * self.row_bytes()
    }

    /// The rows encoded (a bottom strip's padding is added, not decoded).
    fn claimed_len(&self) -> u64 {
        self.rows * self.row_bytes()
    }

    fn most_decoded(&self, encoded_len: u64) -> Option<u64> {
        let ratio = match self.compression {
            5 => LZW_RATIO,
            8 | 32946 => DEFLATE_RATIO,
            32773 => PACKBITS_RATIO,
            50000 => ZSTD_RATIO,
            _ => 1,
        };
        Some(most_at_ratio(encoded_len, ratio))
    }

    fn describe(&self) -> String {
        let predictor = match self.predictor {
            2 => ", horizontal predictor",
            3 => ", floating-point predictor",
            _ => "",
        };
        format!(
            "TIFF {}{predictor}, {} rows of {}×{} {} (page {}, {} {})",
            compression_name(self.compression).unwrap_or("compressed"),
            self.rows,
            self.width,
            self.samples,
            self.dtype,
            self.page,
            if self.tile { "tile" } else { "strip" },
            self.chunk
        )
    }
}

/// `values` as SHORTs (`short`) or LONG8s in byte order `order`.
fn encode(order: Endian, short: bool, values: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &value in values {
        match (short, order) {
            (true, Endian::Big) => out.extend((value as u16).to_be_bytes()),
            (true, Endian::Little) => out.extend((value as u16).to_le_bytes()),
            (false, Endian::Big) => out.extend(value.to_be_bytes()),
            (false, Endian::Little) => out.extend(value.to_le_bytes()),
        }
    }
    out
}

/// TIFF's LZW (most significant bit first, code size switched one code
/// early, as libtiff writes it), into `out` up to `cap` bytes or the end code.
fn lzw(encoded: &[u8], cap: usize, mut out: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    let mut decoder =
        weezl::decode::Configuration::with_tiff_size_switch(weezl::BitOrder::Msb, 8).build();
    out.resize(cap, 0);
    let (mut input, mut filled) = (encoded, 0);
    loop {
        let step = decoder.decode_bytes(input, &mut out[filled..]);
        input = &input[step.consumed_in..];
        filled += step.consumed_out;
        match step.status {
            Err(e) => return Err(e.to_string()),
            Ok(weezl::LzwStatus::Done | weezl::LzwStatus::NoProgress) => break,
            Ok(weezl::LzwStatus::Ok) if filled == cap || input.is_empty() => break,
            Ok(weezl::LzwStatus::Ok) if step.consumed_in == 0 && step.consumed_out == 0 => break,
            Ok(weezl::LzwStatus::Ok) => {}
        }
    }
    out.truncate(filled);
    Ok(out)
}

/// PackBits runs into `out`, which holds at most `cap` bytes: a run past
/// them, or one cut off by the end of the data, is an error, never cut
/// silently.
fn packbits(encoded: &[u8], cap: usize, mut out: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    let mut at = 0;
    while at < encoded.len() {
        let header = encoded[at] as i8;
        at += 1;
        let (len, literal) = match header {
            0..=127 => (header as usize + 1, true),
            -127..=-1 => ((1 - header as isize) as usize, false),
            -128 => continue,
        };
        if out.len() + len > cap {
            return Err(format!(
                "a run at byte {} of the data ends past the {cap} bytes of a whole chunk",
                at - 1
            ));
        }
        let source = if literal { len } else { 1 };
        let Some(bytes) = encoded.get(at..at + source) else {
            return Err(format!(
                "a run at byte {} is cut off by the end of the data",
                at - 1
            ));
        };
        if literal {
            out.extend_from_slice(bytes);
        } else {
            out.resize(out.len() + len, bytes[0]);
        }
        at += source;
    }
    Ok(out)
}

/// Two byte slices read as one seekable stream.
struct Joined<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    at: u64,
}

impl Read for Joined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let head = self.head.len() as u64;
        let source = if self.at < head {
            &self.head[self.at as usize..]
        } else {
            let from = (self.at - head).min(self.tail.len() as u64) as usize;
            &self.tail[from..]
        };
        let n = source.len().min(buf.len());
        buf[..n].copy_from_slice(&source[..n]);
        self.at += n as u64;
        Ok(n)
    }
}

impl Seek for Joined<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let end = (self.head.len() + self.tail.len()) as i128;
        let at = match to {
            SeekFrom::Start(at) => at as i128,
            SeekFrom::End(delta) => end + delta as i128,
            SeekFrom::Current(delta) => self.at as i128 + delta as i128,
        };
        if at < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start",
            ));
        }
        self.at = at as u64;
        Ok(self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apple's example stream (Technical Note TN1023).
    #[test]
    fn packbits_unpacks_runs_and_literals() {
        let packed = [
            0xFE, 0xAA, 0x02, 0x80, 0x00, 0x2A, 0xFD, 0xAA, 0x03, 0x80, 0x00, 0x2A, 0x22, 0xF7,
            0xAA,
        ];
        let unpacked = [
            0xAA, 0xAA, 0xAA, 0x80, 0x00, 0x2A, 0xAA, 0xAA, 0xAA, 0xAA, 0x80, 0x00, 0x2A, 0x22,
            0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA,
        ];
        let unpack = |bytes: &[u8], cap| packbits(bytes, cap, Vec::new());
        assert_eq!(unpack(&packed, 100).unwrap(), unpacked);
        assert_eq!(unpack(&packed, 24).unwrap(), unpacked);
        // Runs past the chunk, or cut off, are refused.
        let long = unpack(&packed, 23).unwrap_err();
        assert!(
            long.contains("byte 13") && long.contains("past the 23"),
            "{long}"
        );
        assert!(unpack(&[0xFE], 100).unwrap_err().contains("cut off"));
        assert!(unpack(&[0x02, 0xAA], 100).unwrap_err().contains("cut off"));
    }

    /// A predicted big-endian u16 strip: the crate undoes the differences,
    /// and the samples come back in the file's order.
    #[test]
    fn a_predicted_strip_comes_back_in_the_files_order() {
        let decoder = ChunkDecode {
            page: 0,
            chunk: 0,
            tile: false,
            byte_order: Endian::Big,
            compression: 1,
            predictor: 2,
            dtype: DType::new(Kind::Unsigned, 2, Endian::Big).unwrap(),
            samples: 1,
            width: 3,
            rows: 1,
            padded_rows: 2,
        };
        // 1000, +5, -3 as big-endian differences.
        let encoded = [0x03, 0xE8, 0x00, 0x05, 0xFF, 0xFD];
        let decoded = decoder.decode(Path::new("t.tif"), &encoded).unwrap();
        assert_eq!(
            decoded,
            [0x03, 0xE8, 0x03, 0xED, 0x03, 0xEA, 0, 0, 0, 0, 0, 0]
        );
        let error = decoder
            .decode(Path::new("t.tif"), &encoded[..4])
            .unwrap_err();
        assert!(
            error.to_string().contains("t.tif") && error.to_string().contains("need 6"),
            "{error}"
        );
    }
}
