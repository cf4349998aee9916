//! Decoding and encoding compressed and sharded Zarr chunks with `zarrs`,
//! the reference codec stack in Rust: blosc, zstd, gzip, zlib and crc32c,
//! and v3's `sharding_indexed` with any of these inside.
//!
//! Such a chunk can only be read whole: its file is one encoded value. The
//! engine reads it in one call and hands the bytes to [`BlockDecoder`],
//! which gives back the full (padded) chunk's raw C-order bytes in the
//! array's byte order as stored, exactly what an uncompressed chunk of the
//! same array holds. `zarrs` decodes to native-endian elements, so the
//! bytes of an array stored big-endian are swapped back: rechunkfs moves
//! bytes and never changes them. [`BlockEncoder`] is the way back, for
//! output chunks: raw bytes, swapped into native order where needed, then
//! encoded by the chain the output's own metadata names.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use zarrs::array::codec::{ArrayToBytesCodecTraits, CodecOptions};
use zarrs::array::{Array, ArrayBytes, ArrayMetadata, ChunkRepresentation, CodecChain, RawBytes};
use zarrs::storage::store::MemoryStore;

use super::decode::BlockDecode;
use super::encode::BlockEncode;
use crate::array::dtype::{DType, Endian};
use crate::error::{Error, Result};

/// How to decode one chunk of an array: its codec chain and the full
/// chunk's representation (shape, data type, fill value).
pub struct BlockDecoder {
    chain: Arc<CodecChain>,
    representation: ChunkRepresentation,
    /// Element size to swap back to big-endian, when zarrs's native
    /// little-endian output is not the stored order.
    swap: Option<usize>,
    /// The codecs, named for messages and comparisons.
    names: String,
    decoded_len: u64,
}

impl BlockDecoder {
    /// The decoder of the array whose metadata file `path` holds `bytes`
    /// (`.zarray` or `zarr.json`), for chunks of shape `chunks` holding
    /// `dtype`; `names` lists the codecs, for messages.
    pub fn new(
        path: &Path,
        bytes: &[u8],
        chunks: &[u64],
        dtype: DType,
        names: String,
    ) -> Result<BlockDecoder> {
        let refuse = |why: String| Error::bad_input(path, format!("its codecs ({names}): {why}"));
        let metadata: ArrayMetadata =
            serde_json::from_slice(bytes).map_err(|e| refuse(e.to_string()))?;
        let array = Array::new_with_metadata(Arc::new(MemoryStore::new()), "/", metadata)
            .map_err(|e| refuse(e.to_string()))?;
        let origin = vec![0; chunks.len()];
        let representation = array
            .chunk_array_representation(&origin)
            .map_err(|e| refuse(e.to_string()))?;
        if representation.shape_u64() != chunks {
            return Err(refuse(format!(
                "zarrs reads chunks of shape {:?}, not the {chunks:?} the metadata says",
                representation.shape_u64()
            )));
        }
        Ok(BlockDecoder {
            chain: array.codecs(),
            representation,
            swap: (dtype.size > 1 && dtype.endian != native_endian()).then_some(dtype.size),
            decoded_len: chunks.iter().product::<u64>() * dtype.size as u64,
            names,
        })
    }

    /// The codecs, as the metadata names them.
    pub fn names(&self) -> &str {
        &self.names
    }
}

impl BlockDecode for BlockDecoder {
    /// Bytes of one decoded chunk (the full chunk shape, padding included).
    fn decoded_len(&self) -> u64 {
        self.decoded_len
    }

    fn describe(&self) -> String {
        format!("Zarr codecs {}", self.names)
    }

    fn decode(&self, path: &Path, encoded: &[u8]) -> Result<Vec<u8>> {
        let damaged = |why: String| Error::BadBlockFile {
            path: path.to_path_buf(),
            format: "Zarr",
            problem: format!("cannot be decoded with its codecs ({}): {why}", self.names),
        };
        // One thread: the reader decodes while the writer thread writes,
        // which is the two cores the engine plans for; and zarrs's parallel
        // paths use rayon's global pool, whose threads do not survive the
        // fork that puts a view's daemon in the background.
        let mut options = CodecOptions::default();
        options.set_concurrent_target(1);
        let decoded = self
            .chain
            .decode(RawBytes::from(encoded), &self.representation, &options)
            .and_then(|bytes| bytes.into_fixed())
            .map_err(|e| damaged(e.to_string()))?;
        let mut decoded = decoded.into_owned();
        if decoded.len() as u64 != self.decoded_len {
            return Err(damaged(format!(
                "it decodes to {} bytes, not {}",
                decoded.len(),
                self.decoded_len
            )));
        }
        if let Some(size) = self.swap {
            for element in decoded.chunks_exact_mut(size) {
                element.reverse();
            }
        }
        Ok(decoded)
    }
}

impl fmt::Debug for BlockDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BlockDecoder({}; {} bytes)",
            self.names, self.decoded_len
        )
    }
}

/// Decoders compare by what they decode: the same codecs into chunks of
/// the same size (storage comparisons in tests and header checks).
impl PartialEq for BlockDecoder {
    fn eq(&self, other: &BlockDecoder) -> bool {
        self.names == other.names
            && self.decoded_len == other.decoded_len
            && self.swap == other.swap
    }
}

impl Eq for BlockDecoder {}

/// How to encode one chunk (or shard) of an output array: the codec chain
/// its metadata names, as zarrs builds it, and the full chunk's
/// representation.
pub struct BlockEncoder {
    chain: Arc<CodecChain>,
    representation: ChunkRepresentation,
    /// Element size to swap from the stored big-endian order into the
    /// native order zarrs encodes from.
    swap: Option<usize>,
    names: String,
}

impl BlockEncoder {
    /// The encoder of the array whose metadata (`path`, for messages)
    /// holds `bytes`, in chunks of `chunks` holding `dtype`.
    pub fn new(path: &Path, bytes: &[u8], chunks: &[u64], dtype: DType) -> Result<BlockEncoder> {
        let refuse = |why: String| {
            Error::BadArgument(format!(
                "cannot encode Zarr chunks as {}: {why}",
                path.display()
            ))
        };
        let metadata: ArrayMetadata =
            serde_json::from_slice(bytes).map_err(|e| refuse(e.to_string()))?;
        let array = Array::new_with_metadata(Arc::new(MemoryStore::new()), "/", metadata)
            .map_err(|e| refuse(e.to_string()))?;
        let representation = array
            .chunk_array_representation(&vec![0; chunks.len()])
            .map_err(|e| refuse(e.to_string()))?;
        let names = array
            .codecs()
            .create_metadatas()
            .iter()
            .map(|codec| codec.name().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        Ok(BlockEncoder {
            chain: array.codecs(),
            representation,
            swap: (dtype.size > 1 && dtype.endian != native_endian()).then_some(dtype.size),
            names,
        })
    }
}

fn native_endian() -> Endian {
    if cfg!(target_endian = "big") {
        Endian::Big
    } else {
        Endian::Little
    }
}

impl BlockEncode for BlockEncoder {
    fn encode(&self, path: &Path, shape: &[u64], mut raw: Vec<u8>) -> Result<Vec<u8>> {
        let failed = |why: String| Error::BadOutput {
            path: path.to_path_buf(),
            problem: format!("cannot be encoded with Zarr codecs {}: {why}", self.names),
        };
        if shape != self.representation.shape_u64() {
            return Err(failed(format!(
                "its block of {shape:?} is not a whole chunk of {:?}",
                self.representation.shape_u64()
            )));
        }
        if let Some(size) = self.swap {
            for element in raw.chunks_exact_mut(size) {
                element.reverse();
            }
        }
        // One thread, as for decoding (see BlockDecoder::decode).
        let mut options = CodecOptions::default();
        options.set_concurrent_target(1);
        let encoded = self
            .chain
            .encode(ArrayBytes::from(raw), &self.representation, &options)
            .map_err(|e| failed(e.to_string()))?;
        Ok(encoded.into_owned())
    }

    fn describe(&self) -> String {
        format!("Zarr codecs {}", self.names)
    }
}

impl fmt::Debug for BlockEncoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockEncoder({})", self.names)
    }
}

/// A shard's index as zarr-python writes it: `entries` (per inner chunk of
/// a chunk grid of `grid`, its offset and length as little-endian u64s)
/// encoded with the index codecs `bytes` (little-endian) then `crc32c`.
pub fn shard_index(grid: &[u64], entries: Vec<u8>) -> Result<Vec<u8>> {
    let mut shape = grid.to_vec();
    shape.push(2);
    let metadata = serde_json::json!({
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": "uint64",
        "chunk_grid": { "name": "regular", "configuration": { "chunk_shape": shape } },
        "chunk_key_encoding": { "name": "default" },
        "fill_value": 0,
        "codecs": [
            { "name": "bytes", "configuration": { "endian": "little" } },
            { "name": "crc32c" }
        ],
    });
    let bytes = serde_json::to_vec(&metadata).map_err(|e| Error::BadArgument(e.to_string()))?;
    let u64_le = DType::new(crate::array::dtype::Kind::Unsigned, 8, Endian::Little)?;
    BlockEncoder::new(Path::new("shard index"), &bytes, &shape, u64_le)?.encode(
        Path::new("shard index"),
        &shape,
        entries,
    )
}
