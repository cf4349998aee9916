//! How output blocks are encoded: the [`BlockEncode`] trait each encoder
//! implements, and the choices (`--compress`, `--shard`) that pick one
//! ([`Encoding`]). The encoders themselves are the formats' ([`super::encode`]
//! picks one); this file names none of them.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use super::block::BlockFormat;
use crate::array::axes::AxisOrder;
use crate::array::geometry::show_shape;
use crate::error::{Error, Result};

/// The compressors a format's blocks can be written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// None: readers expect raw data after the header.
    None,
    /// gzip (deflate) only, which every reader of the format has (HDF5).
    Gzip,
    /// Any of [`Compressor`]'s, named in the array's metadata (Zarr).
    Any,
}

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
        let traits = format.traits();
        if self.shard_chunks.is_some() && !traits.shards {
            return Err(Error::BadArgument(format!(
                "--shard makes Zarr v3 shards, but the output format is {}; add --format zarr3",
                format.name()
            )));
        }
        match (&self.compressor, traits.compression) {
            (None, _) | (Some(_), Compression::Any) => Ok(()),
            (Some(Compressor::Gzip { .. }), Compression::Gzip) => Ok(()),
            (Some(other), Compression::Gzip) => Err(Error::BadArgument(format!(
                "--compress {}: {name} output is compressed with gzip (deflate) only, which \
                 every {name} reader has; use --compress gzip[:LEVEL], or --format zarr/zarr3",
                other.name(),
                name = format.name()
            ))),
            (Some(other), Compression::None) => Err(Error::BadArgument(format!(
                "--compress {}: {} output is written uncompressed (its readers expect raw \
                 data after the header); compress --format zarr, zarr3 (any codec) or h5 (gzip)",
                other.name(),
                format.name()
            ))),
        }
    }
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
