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

use super::{bad, compression_name};
use crate::array::dtype::{DType, Endian, Kind};
use crate::error::Result;
use crate::format::decode::BlockDecode;

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

    /// The chunk's bytes decompressed, at most `cap` of them.
    fn decompress(&self, encoded: &[u8], cap: usize) -> std::result::Result<Vec<u8>, String> {
        match self.compression {
            1 => Ok(encoded[..encoded.len().min(cap)].to_vec()),
            5 => lzw(encoded, cap),
            8 | 32946 => zlib(encoded, cap),
            32773 => Ok(packbits(encoded, cap)),
            50000 => zstd::bulk::decompress(encoded, cap).map_err(|e| e.to_string()),
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
    /// `width` image of one strip, `encoded_len` bytes at the end of the
    /// header: what the crate needs to undo the chunk's predictor.
    fn container(&self, encoded_len: u64) -> Vec<u8> {
        let big = self.byte_order == Endian::Big;
        let mut out = Vec::new();
        let put16 = |out: &mut Vec<u8>, v: u16| {
            out.extend(if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            })
        };
        let put64 = |out: &mut Vec<u8>, v: u64| {
            out.extend(if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            })
        };
        out.extend(if big { b"MM" } else { b"II" });
        put16(&mut out, 43);
        put16(&mut out, 8);
        put16(&mut out, 0);
        put64(&mut out, 16);
        let bits = self.dtype.size as u16 * 8;
        let format = match self.dtype.kind {
            Kind::Unsigned => 1,
            Kind::Signed => 2,
            Kind::Float => 3,
        };
        let samples = self.samples as u16;
        // (tag, type: 3 SHORT / 16 LONG8, values), in tag order.
        let mut entries: Vec<(u16, u16, Vec<u64>)> = vec![
            (256, 16, vec![self.width]),
            (257, 16, vec![self.rows]),
            (258, 3, vec![bits.into(); samples.into()]),
            (259, 3, vec![1]),
            (262, 3, vec![1]),
            (273, 16, vec![0]),
            (277, 3, vec![samples.into()]),
            (278, 16, vec![self.rows]),
            (279, 16, vec![encoded_len]),
            (284, 3, vec![1]),
            (317, 3, vec![self.predictor.into()]),
            (339, 3, vec![format; samples.into()]),
        ];
        let ifd_len = 8 + entries.len() as u64 * 20 + 8;
        // Values longer than 8 bytes (per-sample SHORTs) follow the directory.
        let mut extra = Vec::new();
        let mut extra_at = 16 + ifd_len;
        let mut fields = Vec::new();
        for (_, kind, values) in &entries {
            let mut bytes = Vec::new();
            for &v in values {
                if *kind == 3 {
                    put16(&mut bytes, v as u16);
                } else {
                    put64(&mut bytes, v);
                }
            }
            if bytes.len() > 8 {
                let mut field = Vec::new();
                put64(&mut field, extra_at);
                extra_at += bytes.len() as u64;
                extra.extend(bytes);
                fields.push(field);
            } else {
                bytes.resize(8, 0);
                fields.push(bytes);
            }
        }
        let data_at = extra_at;
        entries[5].2 = vec![data_at];
        let mut strip_offset = Vec::new();
        put64(&mut strip_offset, data_at);
        fields[5] = strip_offset;
        put64(&mut out, entries.len() as u64);
        for ((tag, kind, values), field) in entries.iter().zip(&fields) {
            put16(&mut out, *tag);
            put16(&mut out, *kind);
            put64(&mut out, values.len() as u64);
            out.extend(field);
        }
        put64(&mut out, 0);
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
            .decompress(encoded, full)
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

/// TIFF's LZW (most significant bit first, code size switched one code
/// early, as libtiff writes it), up to `cap` bytes or the end code.
fn lzw(encoded: &[u8], cap: usize) -> std::result::Result<Vec<u8>, String> {
    let mut decoder =
        weezl::decode::Configuration::with_tiff_size_switch(weezl::BitOrder::Msb, 8).build();
    let mut out = vec![0u8; cap];
    let (mut input, mut filled) = (encoded, 0);
    loop {
        let step = decoder.decode_bytes(input, &mut out[filled..]);
        input = &input[step.consumed_in..];
        filled += step.consumed_out;
        match step.status {
            Err(e) => return Err(e.to_string()),
            Ok(weezl::LzwStatus::Done | weezl::LzwStatus::NoProgress) => break,
            Ok(weezl::LzwStatus::Ok) if filled == cap || input.is_empty() => break,
            Ok(weezl::LzwStatus::Ok) => {}
        }
    }
    out.truncate(filled);
    Ok(out)
}

/// A zlib stream read to its end, which checks its checksum; more than
/// `cap` bytes is an error.
fn zlib(encoded: &[u8], cap: usize) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(cap);
    flate2::read::ZlibDecoder::new(encoded)
        .take(cap as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    if out.len() > cap {
        return Err(format!("hold more than the {cap} bytes of a whole chunk"));
    }
    Ok(out)
}

/// PackBits runs, up to `cap` bytes.
fn packbits(encoded: &[u8], cap: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(cap);
    let mut at = 0;
    while at < encoded.len() && out.len() < cap {
        let header = encoded[at] as i8;
        at += 1;
        match header {
            0..=127 => {
                let end = (at + header as usize + 1).min(encoded.len());
                out.extend_from_slice(&encoded[at..end]);
                at = end;
            }
            -127..=-1 => {
                if let Some(&value) = encoded.get(at) {
                    out.resize(out.len() + (1 - header as isize) as usize, value);
                }
                at += 1;
            }
            -128 => {}
        }
    }
    out.truncate(cap);
    out
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
