//! Decoding and encoding compressed and sharded Zarr chunks: blosc, zstd,
//! gzip, zlib and crc32c, and v3's `sharding_indexed` with any of these
//! inside. `zarrs`, the reference codec stack in Rust, reads the codec
//! chain from the metadata and encodes.
//!
//! Such a chunk can only be read whole: its file is one encoded value. The
//! engine reads it in one call and hands the bytes to [`BlockDecoder`],
//! which gives back the full (padded) chunk's raw C-order bytes in the
//! array's byte order as stored, exactly what an uncompressed chunk of the
//! same array holds: the `bytes` codec's output, never swapped. Decoding
//! walks the chain itself, each stream bounded by the bytes its chunk can
//! hold and each shard index entry checked against the shard's length,
//! because a chunk file is untrusted and zarrs's decoders inflate whole
//! (or trust a declared size) before checking. [`BlockEncoder`] is the way back, for
//! output chunks: raw bytes, swapped into native order where needed, then
//! encoded by the chain the output's own metadata names.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use zarrs::array::codec::{ArrayToBytesCodecTraits, BytesToBytesCodecTraits, CodecOptions};
use zarrs::array::{
    Array, ArrayBytes, ArrayMetadata, BytesRepresentation, ChunkRepresentation, CodecChain,
};
use zarrs::metadata::v3::MetadataV3;
use zarrs::storage::store::MemoryStore;

use super::decode::{
    gzip_limited, most_at_ratio, reserved, zeroed, zlib_limited, zstd_limited, BlockDecode,
    Overrun, BLOSC_RATIO, DEFLATE_RATIO, ZSTD_RATIO,
};
use super::encoding::BlockEncode;
use crate::array::dtype::{DType, Endian};
use crate::array::geometry::IndexBox;
use crate::error::{Error, Result};

/// How to decode one chunk of an array: its codec chain, walked here
/// with every stream bounded by the bytes its chunk can hold. zarrs builds
/// and checks the chain from the metadata; its decoders, which inflate a
/// stream whole before any size is checked, decode only blosc (after its
/// header's size is checked) and crc32c (whose output is shorter).
pub struct BlockDecoder {
    chain: Chain,
    /// The full chunk's shape and one element's bytes and fill value.
    chunks: Vec<u64>,
    elem: usize,
    fill: Vec<u8>,
    /// The codecs, named for messages and comparisons.
    names: String,
    decoded_len: u64,
}

impl BlockDecoder {
    /// The decoder of the array whose metadata file `path` holds `bytes`
    /// (`.zarray` or `zarr.json`), for chunks of shape `chunks` holding
    /// `dtype`, `fill` one element of its fill value; `names` lists the
    /// codecs, for messages.
    pub fn new(
        path: &Path,
        bytes: &[u8],
        chunks: &[u64],
        dtype: DType,
        fill: &[u8],
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
        let chain = Chain::of(&array.codecs(), chunks).map_err(refuse)?;
        Ok(BlockDecoder {
            chain,
            chunks: chunks.to_vec(),
            elem: dtype.size,
            fill: fill.to_vec(),
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
        let chunk = Chunk {
            path,
            elem: self.elem,
            fill: &self.fill,
            damaged: &damaged,
        };
        self.chain.decode(&chunk, encoded, &self.chunks)
    }

    fn most_decoded(&self, encoded_len: u64) -> Option<u64> {
        self.chain.most_decoded(encoded_len)
    }
}

/// What decoding one chunk file needs besides its bytes: the file (for
/// messages and allocation failures), its elements, and how to say it is
/// damaged.
struct Chunk<'a> {
    path: &'a Path,
    elem: usize,
    fill: &'a [u8],
    damaged: &'a dyn Fn(String) -> Error,
}

/// A codec chain: the array-to-bytes codec, then bytes-to-bytes codecs in
/// the order they encode.
struct Chain {
    inner: Inner,
    steps: Vec<Step>,
}

/// A chain's array-to-bytes codec.
enum Inner {
    /// `bytes`: the elements as stored; big-endian or not (only the shard
    /// index's byte order is read here: elements are moved as stored).
    Bytes {
        big: bool,
    },
    Shard(Box<Shard>),
}

/// A bytes-to-bytes codec.
enum Step {
    Zstd,
    Gzip,
    Zlib,
    /// Checked and stripped by zarrs: its output is shorter than its input.
    Crc32c(Arc<dyn BytesToBytesCodecTraits>),
    /// Decoded by zarrs, once its header's size is checked.
    Blosc(Arc<dyn BytesToBytesCodecTraits>),
}

/// `sharding_indexed`: a shard of `grid` inner chunks of `chunk`, each
/// encoded by `chunks`, found through an index encoded by `index`.
struct Shard {
    chunk: Vec<u64>,
    grid: Vec<u64>,
    chunks: Chain,
    index: Chain,
    index_at_start: bool,
}

/// Bytes an encoding may add to what it encodes (stored deflate blocks,
/// a zstd frame's headers, blosc's): generous, as it only bounds the
/// buffer an inner stream decodes into.
fn grown(len: u64) -> u64 {
    len.saturating_add(len / 64).saturating_add(1 << 10)
}

impl Chain {
    /// The chain zarrs built, for chunks of `shape`.
    fn of(chain: &CodecChain, shape: &[u64]) -> std::result::Result<Chain, String> {
        if let Some(codec) = chain.array_to_array_codecs().first() {
            return Err(format!("{} is not decoded", codec.identifier()));
        }
        let a2b = chain.array_to_bytes_codec();
        let configuration = a2b
            .configuration()
            .map(|c| serde_json::to_value(c).unwrap_or_default())
            .unwrap_or_default();
        let inner = match a2b.identifier() {
            "bytes" => Inner::Bytes {
                big: configuration["endian"].as_str() == Some("big"),
            },
            "sharding_indexed" => Inner::Shard(Box::new(Shard::of(&configuration, shape)?)),
            other => return Err(format!("{other} is not decoded")),
        };
        let steps = chain
            .bytes_to_bytes_codecs()
            .iter()
            .map(|codec| match codec.identifier() {
                "zstd" => Ok(Step::Zstd),
                "gzip" => Ok(Step::Gzip),
                "zlib" => Ok(Step::Zlib),
                "crc32c" => Ok(Step::Crc32c(codec.codec().clone())),
                "blosc" => Ok(Step::Blosc(codec.codec().clone())),
                other => Err(format!("{other} is not decoded")),
            })
            .collect::<std::result::Result<_, _>>()?;
        Ok(Chain { inner, steps })
    }

    /// The most bytes a chunk of `shape` can encode to: what bounds each
    /// stream decoded inside the chain.
    fn most_encoded(&self, shape: &[u64], elem: usize) -> u64 {
        let inner = match &self.inner {
            Inner::Bytes { .. } => shape.iter().product::<u64>().saturating_mul(elem as u64),
            Inner::Shard(shard) => shard.most_encoded(elem),
        };
        self.steps.iter().fold(inner, |len, step| match step {
            Step::Crc32c(_) => len.saturating_add(4),
            _ => grown(len),
        })
    }

    /// The most decoded bytes `encoded_len` bytes can hold; `None` for a
    /// shard, whose absent inner chunks take no bytes.
    fn most_decoded(&self, encoded_len: u64) -> Option<u64> {
        if let Inner::Shard(_) = self.inner {
            return None;
        }
        Some(
            self.steps
                .iter()
                .rev()
                .fold(encoded_len, |len, step| match step {
                    Step::Zstd => most_at_ratio(len, ZSTD_RATIO),
                    Step::Gzip | Step::Zlib => most_at_ratio(len, DEFLATE_RATIO),
                    Step::Blosc(_) => most_at_ratio(len, BLOSC_RATIO),
                    Step::Crc32c(_) => len.saturating_sub(4),
                }),
        )
    }

    /// The raw bytes of a chunk of `shape` encoded as `encoded`.
    fn decode(&self, chunk: &Chunk, encoded: &[u8], shape: &[u64]) -> Result<Vec<u8>> {
        // limits[i]: the most bytes steps[i] may decode to.
        let mut limits = vec![match &self.inner {
            Inner::Bytes { .. } => shape.iter().product::<u64>() * chunk.elem as u64,
            Inner::Shard(shard) => shard.most_encoded(chunk.elem),
        }];
        for step in &self.steps {
            let last = limits[limits.len() - 1];
            limits.push(match step {
                Step::Crc32c(_) => last.saturating_add(4),
                _ => grown(last),
            });
        }
        let mut bytes = Cow::Borrowed(encoded);
        for (step, &limit) in self.steps.iter().zip(&limits).rev() {
            bytes = Cow::Owned(step.decode(chunk, &bytes, limit)?);
        }
        match &self.inner {
            Inner::Bytes { .. } => {
                let expected = limits[0];
                if bytes.len() as u64 != expected {
                    return Err((chunk.damaged)(format!(
                        "it decodes to {} bytes, not {expected}",
                        bytes.len()
                    )));
                }
                Ok(bytes.into_owned())
            }
            Inner::Shard(shard) => shard.decode(chunk, &bytes, shape),
        }
    }
}

impl Step {
    /// `input` decoded, refused past `limit` bytes.
    fn decode(&self, chunk: &Chunk, input: &[u8], limit: u64) -> Result<Vec<u8>> {
        let out = || reserved(chunk.path, limit);
        let failed = |name: &str, why: Overrun| (chunk.damaged)(format!("its {name} stream {why}"));
        let mut options = CodecOptions::default();
        options.set_concurrent_target(1);
        let zarrs = |codec: &Arc<dyn BytesToBytesCodecTraits>, name: &str| {
            codec
                .decode(
                    Cow::Borrowed(input),
                    &BytesRepresentation::BoundedSize(limit),
                    &options,
                )
                .map(Cow::into_owned)
                .map_err(|e| (chunk.damaged)(format!("its {name} data do not decode ({e})")))
        };
        match self {
            Step::Zstd => zstd_limited(input, limit, out()?).map_err(|e| failed("zstd", e)),
            Step::Gzip => gzip_limited(input, limit, out()?).map_err(|e| failed("gzip", e)),
            Step::Zlib => zlib_limited(input, limit, out()?).map_err(|e| failed("zlib", e)),
            Step::Crc32c(codec) => zarrs(codec, "crc32c"),
            Step::Blosc(codec) => {
                // Blosc's header: version, versionlz, flags, typesize, then
                // the decoded size as a little-endian u32.
                let declared = input
                    .get(4..8)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
                    .ok_or_else(|| (chunk.damaged)("its blosc header is cut short".into()))?;
                if declared > limit {
                    return Err((chunk.damaged)(format!(
                        "its blosc header declares {declared} bytes, more than the {limit} \
                         its chunk can hold"
                    )));
                }
                zarrs(codec, "blosc")
            }
        }
    }
}

impl Shard {
    /// The sharding codec whose configuration is `configuration`, for
    /// shards of `shape`.
    fn of(configuration: &serde_json::Value, shape: &[u64]) -> std::result::Result<Shard, String> {
        let chain_of = |key: &str| -> std::result::Result<CodecChain, String> {
            let codecs: Vec<MetadataV3> = serde_json::from_value(configuration[key].clone())
                .map_err(|e| format!("sharding_indexed's {key}: {e}"))?;
            CodecChain::from_metadata(&codecs).map_err(|e| e.to_string())
        };
        let chunk: Vec<u64> = serde_json::from_value(configuration["chunk_shape"].clone())
            .map_err(|e| format!("sharding_indexed's chunk_shape: {e}"))?;
        if chunk.len() != shape.len()
            || chunk.iter().zip(shape).any(|(&c, &s)| c == 0 || s % c != 0)
        {
            return Err(format!(
                "sharding_indexed's inner chunks {chunk:?} do not tile its shards {shape:?}"
            ));
        }
        let grid: Vec<u64> = shape.iter().zip(&chunk).map(|(s, c)| s / c).collect();
        let chunks = Chain::of(&chain_of("codecs")?, &chunk)?;
        let count = grid.iter().product::<u64>();
        let index = Chain::of(&chain_of("index_codecs")?, &[count, 2])?;
        if !matches!(index.inner, Inner::Bytes { .. })
            || index.steps.iter().any(|s| !matches!(s, Step::Crc32c(_)))
        {
            return Err("sharding_indexed's index codecs are not bytes and crc32c".into());
        }
        Ok(Shard {
            chunk,
            grid,
            chunks,
            index,
            index_at_start: configuration["index_location"].as_str() == Some("start"),
        })
    }

    /// Inner chunks in a shard.
    fn count(&self) -> u64 {
        self.grid.iter().product()
    }

    /// Bytes of the encoded index: an offset and a length per inner chunk,
    /// then 4 per checksum.
    fn index_len(&self) -> u64 {
        self.index.most_encoded(&[self.count(), 2], 8)
    }

    fn most_encoded(&self, elem: usize) -> u64 {
        let each = self.chunks.most_encoded(&self.chunk, elem);
        self.index_len()
            .saturating_add(self.count().saturating_mul(each))
    }

    /// The raw bytes of the shard of `shape` encoded as `shard`: each
    /// inner chunk its index lists decoded into its place, the others the
    /// fill value. An entry outside the shard's bytes is refused, naming
    /// the inner chunk, before anything reads there.
    fn decode(&self, chunk: &Chunk, shard: &[u8], shape: &[u64]) -> Result<Vec<u8>> {
        let len = shard.len() as u64;
        let index_len = self.index_len();
        if len < index_len {
            return Err((chunk.damaged)(format!(
                "the shard is {len} bytes, shorter than its index of {index_len}"
            )));
        }
        let (index, chunks_at) = if self.index_at_start {
            (&shard[..index_len as usize], index_len..len)
        } else {
            (&shard[(len - index_len) as usize..], 0..len - index_len)
        };
        let index_chunk = Chunk {
            elem: 8,
            fill: &[0xff; 8],
            ..*chunk
        };
        let entries = self.index.decode(&index_chunk, index, &[self.count(), 2])?;
        let big = matches!(self.index.inner, Inner::Bytes { big: true });
        let number = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&entries[at..at + 8]);
            if big {
                u64::from_be_bytes(word)
            } else {
                u64::from_le_bytes(word)
            }
        };
        let elem = chunk.elem;
        let mut out = zeroed(chunk.path, shape.iter().product::<u64>() * elem as u64)?;
        let grid: Vec<usize> = self.grid.iter().map(|&g| g as usize).collect();
        for (k, position) in IndexBox::grid(&grid).enumerate() {
            let (offset, nbytes) = (number(16 * k), number(16 * k + 8));
            if offset == u64::MAX && nbytes == u64::MAX {
                if chunk.fill.iter().any(|&b| b != 0) {
                    self.place(&mut out, shape, elem, &position, None, chunk.fill);
                }
                continue;
            }
            let end = offset
                .checked_add(nbytes)
                .filter(|&end| offset >= chunks_at.start && end <= chunks_at.end)
                .ok_or_else(|| {
                    (chunk.damaged)(format!(
                        "its shard index puts inner chunk {position:?} at byte {offset}, {nbytes} \
                         bytes long, outside the {} bytes of chunks the shard holds; the shard is \
                         damaged",
                        chunks_at.end - chunks_at.start
                    ))
                })?;
            let decoded =
                self.chunks
                    .decode(chunk, &shard[offset as usize..end as usize], &self.chunk)?;
            self.place(&mut out, shape, elem, &position, Some(&decoded), chunk.fill);
        }
        Ok(out)
    }

    /// Copies inner chunk `position`'s bytes (`decoded`, or the `fill`
    /// element everywhere) into its place in `out`, a shard of `shape`.
    fn place(
        &self,
        out: &mut [u8],
        shape: &[u64],
        elem: usize,
        position: &[usize],
        decoded: Option<&[u8]>,
        fill: &[u8],
    ) {
        let last = self.chunk.len() - 1;
        let row = self.chunk[last] as usize * elem;
        let strides: Vec<usize> = (0..shape.len())
            .map(|d| shape[d + 1..].iter().product::<u64>() as usize * elem)
            .collect();
        let mut rows: Vec<usize> = self.chunk.iter().map(|&c| c as usize).collect();
        rows[last] = 1;
        for (r, within) in IndexBox::grid(&rows).enumerate() {
            let at: usize = (0..shape.len())
                .map(|d| (position[d] * self.chunk[d] as usize + within[d]) * strides[d])
                .sum();
            let target = &mut out[at..at + row];
            match decoded {
                Some(decoded) => target.copy_from_slice(&decoded[r * row..(r + 1) * row]),
                None => target
                    .chunks_exact_mut(elem)
                    .for_each(|e| e.copy_from_slice(fill)),
            }
        }
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
            && self.fill == other.fill
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
    let bytes = serde_json::to_vec(&metadata).map_err(|e| Error::Internal(e.to_string()))?;
    let u64_le = DType::new(crate::array::dtype::Kind::Unsigned, 8, Endian::Little)?;
    BlockEncoder::new(Path::new("shard index"), &bytes, &shape, u64_le)?.encode(
        Path::new("shard index"),
        &shape,
        entries,
    )
}
