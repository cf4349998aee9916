//! Output blocks encoded whole: compressed Zarr chunks (v2 and v3), Zarr v3
//! shards, and HDF5 files whose dataset has the deflate filter.
//!
//! Such a block's file is one encoded value, so it cannot be filled in
//! place: the block is gathered whole in memory, handed to a
//! [`BlockEncode`], and the encoded bytes are written in one call. Each
//! format supplies its encoder, built from the codecs rechunkfs writes in
//! the array's metadata, by the same libraries readers decode them with
//! (`zarrs`, libhdf5): what is written is what the metadata says.
//!
//! An uncompressed shard is the one encoded block whose size is known
//! before its data exist ([`ShardLayout`]): its inner chunks, every one
//! written, lie at fixed offsets, so its index is fixed too. A view can
//! serve it like any block file: a template (the index as a trailer) and
//! data.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use super::{BlockFormat, BlockTemplate};
use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry::{show_shape, IndexBox};
use crate::error::{Error, Result};

/// How to encode the blocks of one output array.
pub trait BlockEncode: Send + Sync + fmt::Debug {
    /// The file bytes of the block whose raw C-order bytes (the array's
    /// byte order as stored, padded to the file's shape where the format
    /// pads) are `raw`, of shape `shape`; `path` names the file for
    /// messages.
    fn encode(&self, path: &Path, shape: &[u64], raw: Vec<u8>) -> Result<Vec<u8>>;

    /// The encoding as people name it, for messages.
    fn describe(&self) -> String;
}

/// A compressor and its level, as `--compress` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compressor {
    /// Zstandard, levels 1 to 22; each frame with a content checksum
    /// (XXH64) unless `checksum` is off, so that damage is caught on read.
    Zstd { level: i32, checksum: bool },
    /// gzip (deflate), levels 1 to 9.
    Gzip { level: u32 },
    /// Blosc with one of its compressors, levels 0 to 9, byte-shuffled.
    Blosc { cname: String, level: u32 },
}

/// The `--compress zstd` option that leaves checksums out.
const NO_CHECKSUM: &str = "nochecksum";

/// Blosc's compressors that every build of it has.
const BLOSC_NAMES: [&str; 5] = ["lz4", "lz4hc", "blosclz", "zstd", "zlib"];

impl Compressor {
    /// `zstd:3`, as `--compress` takes it.
    pub fn name(&self) -> String {
        match self {
            Compressor::Zstd {
                level,
                checksum: true,
            } => format!("zstd:{level}"),
            Compressor::Zstd { level, .. } => format!("zstd:{level}:{NO_CHECKSUM}"),
            Compressor::Gzip { level } => format!("gzip:{level}"),
            Compressor::Blosc { cname, level } => format!("blosc:{cname}:{level}"),
        }
    }

    /// The Zarr v2 `compressor` object (numcodecs' configuration).
    pub fn zarr_v2(&self) -> serde_json::Value {
        match self {
            // No "checksum" key: TensorStore refuses it in v2 metadata. The
            // frames carry the checksum flag themselves, and every reader
            // checks it (see `encoder`).
            Compressor::Zstd { level, .. } => serde_json::json!({ "id": "zstd", "level": level }),
            Compressor::Gzip { level } => serde_json::json!({ "id": "gzip", "level": level }),
            Compressor::Blosc { cname, level } => serde_json::json!({
                "id": "blosc", "cname": cname, "clevel": level, "shuffle": 1, "blocksize": 0
            }),
        }
    }

    /// The Zarr v3 bytes-to-bytes codec, for elements of `typesize` bytes.
    pub fn zarr_v3(&self, typesize: usize) -> serde_json::Value {
        match self {
            Compressor::Zstd { level, checksum } => serde_json::json!({
                "name": "zstd", "configuration": { "level": level, "checksum": checksum }
            }),
            Compressor::Gzip { level } => {
                serde_json::json!({ "name": "gzip", "configuration": { "level": level } })
            }
            Compressor::Blosc { cname, level } => serde_json::json!({
                "name": "blosc",
                "configuration": {
                    "cname": cname, "clevel": level, "shuffle": "shuffle",
                    "typesize": typesize, "blocksize": 0
                }
            }),
        }
    }
}

impl FromStr for Compressor {
    type Err = Error;

    /// `zstd[:level][:nochecksum]` (default 3, with checksums),
    /// `gzip[:level]` (default 5), `blosc[:cname[:level]]` (default lz4, 5).
    fn from_str(text: &str) -> Result<Compressor> {
        let refuse = |why: String| {
            Error::BadArgument(format!(
                "--compress {text}: {why}; use zstd[:LEVEL][:{NO_CHECKSUM}] (1-22), gzip[:LEVEL] \
                 (1-9) or \
                 blosc[:CNAME[:LEVEL]] (CNAME one of {}, LEVEL 0-9)",
                BLOSC_NAMES.join(", ")
            ))
        };
        let mut parts: Vec<&str> = text.trim().split(':').collect();
        let checksum = !(parts.len() > 1
            && parts[0].eq_ignore_ascii_case("zstd")
            && parts[parts.len() - 1].eq_ignore_ascii_case(NO_CHECKSUM));
        if !checksum {
            parts.pop();
        }
        let level = |part: Option<&&str>, default: i64, range: std::ops::RangeInclusive<i64>| {
            let level = match part {
                None => default,
                Some(digits) => digits
                    .parse::<i64>()
                    .map_err(|_| refuse(format!("'{digits}' is not a whole number")))?,
            };
            if range.contains(&level) {
                Ok(level)
            } else {
                Err(refuse(format!("level {level} is out of range")))
            }
        };
        let compressor = match (parts[0].to_ascii_lowercase().as_str(), parts.len()) {
            ("zstd", 1 | 2) => Compressor::Zstd {
                level: level(parts.get(1), 3, 1..=22)? as i32,
                checksum,
            },
            ("gzip", 1 | 2) => Compressor::Gzip {
                level: level(parts.get(1), 5, 1..=9)? as u32,
            },
            ("blosc", 1..=3) => {
                let cname = parts.get(1).map_or("lz4", |c| c).to_ascii_lowercase();
                if !BLOSC_NAMES.contains(&cname.as_str()) {
                    return Err(refuse(format!("'{cname}' is not a Blosc compressor")));
                }
                Compressor::Blosc {
                    cname,
                    level: level(parts.get(2), 5, 0..=9)? as u32,
                }
            }
            _ => return Err(refuse("not a compressor rechunkfs writes".into())),
        };
        Ok(compressor)
    }
}

/// How the blocks of an output array are encoded: compressed, sharded
/// (Zarr v3 only: each output block a shard of chunks of
/// `shard_chunks`), both, or neither (written in place).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoding {
    pub compressor: Option<Compressor>,
    /// The inner chunk shape of each shard (internal C order).
    pub shard_chunks: Option<Vec<u64>>,
}

impl Encoding {
    /// Whether blocks are encoded whole (otherwise written in place).
    pub fn is_encoded(&self) -> bool {
        self.compressor.is_some() || self.shard_chunks.is_some()
    }

    /// Refuses what `format` cannot hold, naming what can.
    pub fn check(&self, format: BlockFormat) -> Result<()> {
        if self.shard_chunks.is_some() && format != BlockFormat::Zarr3 {
            return Err(Error::BadArgument(format!(
                "--shard makes Zarr v3 shards, but the output format is {}; add --format zarr3",
                format.name()
            )));
        }
        match (&self.compressor, format) {
            (None, _) | (Some(_), BlockFormat::Zarr | BlockFormat::Zarr3) => Ok(()),
            (Some(Compressor::Gzip { .. }), BlockFormat::Hdf5) => Ok(()),
            (Some(other), BlockFormat::Hdf5) => Err(Error::BadArgument(format!(
                "--compress {}: HDF5 output is compressed with gzip (deflate) only, which every \
                 HDF5 reader has; use --compress gzip[:LEVEL], or --format zarr/zarr3",
                other.name()
            ))),
            (Some(other), format) => Err(Error::BadArgument(format!(
                "--compress {}: {} output is written uncompressed (its readers expect raw \
                 data after the header); compress --format zarr, zarr3 (any codec) or h5 (gzip)",
                other.name(),
                format.name()
            ))),
        }
    }
}

/// The encoder of `format`'s blocks under `encoding` (None: written in
/// place), for an array of `shape` in blocks of `block_shape` holding
/// `dtype`; `dataset` is the HDF5 dataset path.
pub fn encoder(
    format: BlockFormat,
    encoding: &Encoding,
    shape: &[u64],
    block_shape: &[u64],
    dtype: DType,
    dataset: &str,
) -> Result<Option<Arc<dyn BlockEncode>>> {
    if !encoding.is_encoded() {
        return Ok(None);
    }
    encoding.check(format)?;
    if let (None, Some(inner)) = (&encoding.compressor, &encoding.shard_chunks) {
        return Ok(Some(Arc::new(ShardLayout::new(block_shape, inner, dtype)?)));
    }
    let encoder: Arc<dyn BlockEncode> = match (format, &encoding.compressor) {
        (BlockFormat::Hdf5, Some(Compressor::Gzip { level })) => {
            super::hdf5::DeflateEncoder::check_block(block_shape, dtype)?;
            Arc::new(super::hdf5::DeflateEncoder::new(dtype, dataset, *level)?)
        }
        (BlockFormat::Zarr | BlockFormat::Zarr3, _) => {
            let metadata = super::zarr::array_metadata(format, shape, block_shape, dtype, encoding);
            let (name, bytes) = metadata
                .first()
                .ok_or_else(|| Error::Internal("no Zarr metadata to encode with".into()))?;
            let bytes = match (format, &encoding.compressor) {
                (BlockFormat::Zarr, Some(Compressor::Zstd { checksum: true, .. })) => {
                    with_zstd_checksum(bytes)?
                }
                _ => bytes.clone(),
            };
            Arc::new(super::zarr_codecs::BlockEncoder::new(
                Path::new(name),
                &bytes,
                block_shape,
                dtype,
            )?)
        }
        _ => {
            return Err(Error::Internal(format!(
                "{} blocks are not encoded",
                format.name()
            )))
        }
    };
    Ok(Some(encoder))
}

/// Zarr v2 metadata `bytes` whose zstd compressor also writes checksums:
/// what v2 chunks are encoded with, though the `.zarray` written cannot
/// say so (TensorStore refuses the key); a frame's header says it carries
/// one, and zstd checks it whoever decodes.
fn with_zstd_checksum(bytes: &[u8]) -> Result<Vec<u8>> {
    let failed = |e: serde_json::Error| Error::Internal(format!("Zarr v2 metadata: {e}"));
    let mut value: serde_json::Value = serde_json::from_slice(bytes).map_err(failed)?;
    value["compressor"]["checksum"] = serde_json::Value::Bool(true);
    serde_json::to_vec(&value).map_err(failed)
}

/// The inner chunk shape of shards of `shards` holding chunks of `chunks`
/// in an array of `array` (all internal order; sides past the array mean
/// the array's side): each shard side must be a whole number of chunk
/// sides. `order` is the user's, for the refusal.
pub fn shard_chunks(
    array: &[u64],
    shards: &[u64],
    chunks: &[u64],
    order: AxisOrder,
) -> Result<Vec<u64>> {
    let clip =
        |sides: &[u64]| -> Vec<u64> { sides.iter().zip(array).map(|(&s, &a)| s.min(a)).collect() };
    let (shards, chunks) = (clip(shards), clip(chunks));
    if shards
        .iter()
        .zip(&chunks)
        .any(|(s, c)| *c == 0 || s % c != 0)
    {
        return Err(Error::BadArgument(format!(
            "--shard {} is not a whole number of chunks of --shape {} on every side (both \
             clipped to the array {}); Zarr shards hold whole chunks, so choose each shard side \
             a multiple of the chunk side",
            show_shape(&order.to_user(&shards)),
            show_shape(&order.to_user(&chunks)),
            show_shape(&order.to_user(array)),
        )));
    }
    Ok(chunks)
}

/// The layout of an uncompressed Zarr v3 shard: its inner chunks, every
/// one written, in C order of the chunk grid, each the raw C-order bytes
/// of a full chunk; then the index zarr-python writes (per chunk its
/// offset and length, little-endian u64s, then a CRC32C of them), which,
/// the chunks lying at fixed offsets, is the same for every shard.
/// Chunks past the array's end are written too (as the fill value): the
/// shard's size is then exact before its data exist, which a view needs.
#[derive(Debug)]
pub struct ShardLayout {
    shard: Vec<u64>,
    inner: Vec<u64>,
    elem: usize,
    /// The index and its checksum: the shard's last bytes.
    index: Vec<u8>,
}

impl ShardLayout {
    /// Shards of `shard` (a whole number of `inner` chunks on every side)
    /// holding `dtype`.
    pub fn new(shard: &[u64], inner: &[u64], dtype: DType) -> Result<ShardLayout> {
        let grid: Vec<u64> = shard.iter().zip(inner).map(|(s, c)| s / c).collect();
        let chunk_bytes = inner.iter().product::<u64>() * dtype.size as u64;
        let chunks: u64 = grid.iter().product();
        let mut entries = Vec::with_capacity(chunks as usize * 16);
        for k in 0..chunks {
            entries.extend_from_slice(&(k * chunk_bytes).to_le_bytes());
            entries.extend_from_slice(&chunk_bytes.to_le_bytes());
        }
        Ok(ShardLayout {
            shard: shard.to_vec(),
            inner: inner.to_vec(),
            elem: dtype.size,
            index: super::zarr_codecs::shard_index(&grid, entries)?,
        })
    }

    /// The shard file's template: no header, the chunks as its data, the
    /// index as its trailer.
    pub fn template(&self) -> BlockTemplate {
        BlockTemplate {
            prefix: Vec::new(),
            data_offset: 0,
            data_len: self.shard.iter().product::<u64>() * self.elem as u64,
            suffix: self.index.clone(),
        }
    }
}

impl BlockEncode for ShardLayout {
    fn encode(&self, path: &Path, shape: &[u64], raw: Vec<u8>) -> Result<Vec<u8>> {
        let template = self.template();
        if shape != self.shard || raw.len() as u64 != template.data_len {
            return Err(Error::BadOutput {
                path: path.to_path_buf(),
                problem: format!(
                    "a block of {} is no shard of {}",
                    show_shape(shape),
                    show_shape(&self.shard)
                ),
            });
        }
        let mut file = Vec::with_capacity(template.file_len() as usize);
        let row = self.inner[self.inner.len() - 1] as usize * self.elem;
        let strides: Vec<usize> = (0..self.shard.len())
            .map(|d| self.shard[d + 1..].iter().product::<u64>() as usize * self.elem)
            .collect();
        let grid: Vec<usize> = self
            .shard
            .iter()
            .zip(&self.inner)
            .map(|(s, c)| (s / c) as usize)
            .collect();
        let mut rows: Vec<usize> = self.inner.iter().map(|&c| c as usize).collect();
        let last = rows.len() - 1;
        rows[last] = 1;
        for chunk in IndexBox::grid(&grid) {
            for within in IndexBox::grid(&rows) {
                let at: usize = (0..chunk.len())
                    .map(|d| (chunk[d] * self.inner[d] as usize + within[d]) * strides[d])
                    .sum();
                file.extend_from_slice(&raw[at..at + row]);
            }
        }
        file.extend_from_slice(&self.index);
        Ok(file)
    }

    fn describe(&self) -> String {
        format!(
            "uncompressed Zarr v3 shards of {} in chunks of {}",
            show_shape(&self.shard),
            show_shape(&self.inner)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressors_parse_with_their_defaults_and_ranges() {
        let parse = |text: &str| text.parse::<Compressor>();
        let zstd = |level, checksum| Compressor::Zstd { level, checksum };
        assert_eq!(parse("zstd").unwrap(), zstd(3, true));
        assert_eq!(parse("ZSTD:19").unwrap(), zstd(19, true));
        assert_eq!(parse("zstd:nochecksum").unwrap(), zstd(3, false));
        assert_eq!(parse("zstd:7:NoChecksum").unwrap(), zstd(7, false));
        assert_eq!(
            parse("zstd:7:nochecksum").unwrap().name(),
            "zstd:7:nochecksum"
        );
        assert_eq!(parse("zstd:7").unwrap().name(), "zstd:7");
        assert_eq!(parse("gzip").unwrap(), Compressor::Gzip { level: 5 });
        assert_eq!(parse("gzip:9").unwrap(), Compressor::Gzip { level: 9 });
        assert_eq!(
            parse("blosc").unwrap(),
            Compressor::Blosc {
                cname: "lz4".into(),
                level: 5
            }
        );
        assert_eq!(
            parse("blosc:zstd:0").unwrap().name(),
            "blosc:zstd:0".to_string()
        );
        for bad in [
            "zstd:0",
            "zstd:23",
            "zstd:3:checksum",
            "zstd:3:nochecksum:nochecksum",
            "gzip:5:nochecksum",
            "gzip:x",
            "gzip:1:2",
            "blosc:snappy",
            "lzma",
            "",
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(
                error.contains("--compress") && error.contains("zstd"),
                "{bad}: {error}"
            );
        }
    }

    /// CRC-32C (Castagnoli, reflected), bit by bit: the check zarr-python
    /// writes after a shard's index, computed here without zarrs.
    fn crc32c(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= byte as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn uncompressed_shards_hold_their_chunks_in_order_then_a_fixed_index() {
        let byte: DType = "u1".parse().unwrap();
        // A 4×4 shard of 2×2 chunks holding 0..16 in C order.
        let layout = ShardLayout::new(&[4, 4], &[2, 2], byte).unwrap();
        let encoded = layout
            .encode(Path::new("s"), &[4, 4], (0..16).collect())
            .unwrap();
        let chunks = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15];
        assert_eq!(encoded[..16], chunks);
        let mut index = Vec::new();
        for k in 0..4u64 {
            index.extend_from_slice(&(4 * k).to_le_bytes());
            index.extend_from_slice(&4u64.to_le_bytes());
        }
        assert_eq!(encoded[16..16 + 64], index[..]);
        assert_eq!(encoded[80..], crc32c(&index).to_le_bytes());
        let template = layout.template();
        assert_eq!(template.file_len(), encoded.len() as u64);
        assert_eq!((template.data_offset, template.data_len), (0, 16));
        assert_eq!(template.suffix, encoded[16..]);
        assert!(layout.encode(Path::new("s"), &[4, 2], vec![0; 8]).is_err());
        // Shards of whole chunks only.
        let order = AxisOrder::C;
        assert_eq!(
            shard_chunks(&[10, 7], &[8, 7], &[4, 7], order).unwrap(),
            [4, 7]
        );
        assert_eq!(
            shard_chunks(&[10, 7], &[20, 9], &[5, 7], order).unwrap(),
            [5, 7]
        );
        let refused = shard_chunks(&[10, 7], &[8, 6], &[4, 4], order).unwrap_err();
        assert!(refused.to_string().contains("multiple"), "{refused}");
    }

    #[test]
    fn combinations_a_format_cannot_hold_are_refused() {
        let zstd = Encoding {
            compressor: Some(Compressor::Zstd {
                level: 3,
                checksum: true,
            }),
            shard_chunks: None,
        };
        let sharded = Encoding {
            compressor: None,
            shard_chunks: Some(vec![4, 4]),
        };
        assert!(zstd.check(BlockFormat::Zarr).is_ok());
        assert!(sharded.check(BlockFormat::Zarr3).is_ok());
        for (encoding, format, says) in [
            (&zstd, BlockFormat::Npy, "uncompressed"),
            (&zstd, BlockFormat::Nifti, "uncompressed"),
            (&zstd, BlockFormat::Raw, "uncompressed"),
            (&zstd, BlockFormat::Hdf5, "gzip"),
            (&sharded, BlockFormat::Zarr, "zarr3"),
            (&sharded, BlockFormat::Hdf5, "zarr3"),
        ] {
            let error = encoding.check(format).unwrap_err().to_string();
            assert!(error.contains(says), "{format:?}: {error}");
        }
    }
}
