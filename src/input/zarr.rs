//! A Zarr array (v2 or v3) as an input: one input block per chunk (per
//! shard, for a sharded array), found by the chunk key its metadata names;
//! edge chunks are padded on disk. Compressed or sharded chunks are
//! encoded blocks, read whole and decoded.

use std::fs;
use std::path::{Path, PathBuf};

use super::array::InputArray;
use super::block::InputBlock;
use crate::array::geometry::{self, FileShape, IndexBox, Partition};
use crate::error::{Error, Result};
use crate::format::zarr::ZarrArrayMeta;
use crate::format::{self, Storage};

/// The most chunks an input array may have: each is an entry in memory
/// (its path and storage, some 150 bytes) and a stat at the scan, so 2^24
/// chunks already cost gigabytes and minutes.
const MAX_CHUNKS: u64 = 1 << 24;

/// The Zarr array in `dir` (described by `meta`) as an input: one block per
/// chunk, edge chunks padded on disk. Every chunk file must hold exactly
/// one uncompressed chunk, or be an encoded one; an absent chunk is the
/// fill value (read without I/O).
///
/// A sharded array's input block is a whole shard, not an inner chunk: a
/// shard read in one call is one seek where its inner chunks would be one
/// each, and no shard index need be read to plan.
pub fn scan_array(dir: &Path, meta: ZarrArrayMeta) -> Result<InputArray> {
    let block_shape: Vec<u64> = meta
        .chunks
        .iter()
        .zip(&meta.shape)
        .map(|(&c, &n)| c.min(n))
        .collect();
    if meta.shape.len() > geometry::MAX_DIMS {
        return Err(Error::bad_input(
            &meta.path,
            format!(
                "the array has {} dimensions; rechunkfs handles 1 to {}",
                meta.shape.len(),
                geometry::MAX_DIMS
            ),
        ));
    }
    let count = chunk_count(&meta, &block_shape)?;
    let chunk_bytes = geometry::volume(&meta.chunks) * meta.dtype.size as u64;
    let grid = Partition::regular(&meta.shape, &block_shape);
    let mut blocks = Vec::new();
    blocks.try_reserve_exact(count).map_err(|_| {
        Error::bad_input(
            &meta.path,
            format!("the array has {count} chunks, more than this machine's memory can list"),
        )
    })?;
    for index in IndexBox::grid(&grid.grid_shape()) {
        let path = dir.join(meta.key.path(&index));
        blocks.push(chunk_block(path, &meta, chunk_bytes)?);
    }
    Ok(InputArray {
        source: dir.to_path_buf(),
        format: meta.format,
        dataset: String::new(),
        dtype: meta.dtype,
        shape: meta.shape,
        block_shape,
        files: if meta.decoder.is_some() {
            FileShape::Encoded {
                padded_to: Some(meta.chunks),
            }
        } else {
            FileShape::Padded(meta.chunks)
        },
        blocks,
    })
}

/// The number of chunks of the array, refused past [`MAX_CHUNKS`] before
/// anything is allocated for them: a sparse array's metadata can claim
/// any shape.
fn chunk_count(meta: &ZarrArrayMeta, block_shape: &[u64]) -> Result<usize> {
    let grid: Vec<u64> = meta
        .shape
        .iter()
        .zip(block_shape)
        .map(|(&n, &c)| n.div_ceil(c))
        .collect();
    grid.iter()
        .try_fold(1u64, |count, &side| count.checked_mul(side))
        .filter(|&count| count <= MAX_CHUNKS)
        .and_then(|count| usize::try_from(count).ok())
        .ok_or_else(|| {
            Error::bad_input(
                &meta.path,
                format!(
                    "the array is a grid of {} chunks, more than the {MAX_CHUNKS} rechunkfs \
                     lists (one entry, and one look for its file, each); rewrite it with larger \
                     chunks first",
                    geometry::show_shape(&grid)
                ),
            )
        })
}

/// The input block of the chunk whose file is at `path`: absent, exactly
/// `chunk_bytes` long, or encoded in few enough bytes to hold a chunk.
fn chunk_block(path: PathBuf, meta: &ZarrArrayMeta, chunk_bytes: u64) -> Result<InputBlock> {
    let file = match fs::metadata(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(InputBlock {
                path,
                storage: Storage::Absent {
                    fill: meta.fill.clone(),
                },
                check: None,
            });
        }
        Err(e) => return Err(Error::io(&path, "stat", e)),
    };
    if !file.is_file() {
        return Err(Error::bad_input(
            &path,
            "is where a chunk of the array belongs, but is not a file",
        ));
    }
    if let Some(decoder) = &meta.decoder {
        format::decode::check_holds(decoder.as_ref(), &path, file.len())?;
        return Ok(InputBlock {
            path,
            storage: Storage::Encoded {
                decoder: decoder.clone(),
                offset: 0,
                len: file.len(),
            },
            check: None,
        });
    }
    if file.len() != chunk_bytes {
        return Err(Error::BadBlockFile {
            path: path.clone(),
            format: meta.format.name(),
            problem: format!(
                "an uncompressed chunk of {} {} is {chunk_bytes} bytes, but this file has {}; \
                 {} says the array is not compressed, so the chunk is damaged or belongs to \
                 another array",
                format::shape_text(&meta.chunks),
                meta.dtype.numpy_descr(),
                file.len(),
                meta.path.display()
            ),
        });
    }
    Ok(InputBlock {
        path,
        storage: Storage::Contiguous { data_offset: 0 },
        check: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::InputArray;

    /// Metadata that claims a vast sparse array: refused at once, with
    /// the grid said, instead of aborting on the allocation for its
    /// billions of chunks (found by tests/fuzz_headers.rs).
    #[test]
    fn a_grid_of_billions_of_chunks_is_refused_before_anything_is_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let metadata = serde_json::json!({
            "zarr_format": 2, "shape": [4294967296u64, 5, 4], "chunks": [4, 3, 4],
            "dtype": "<u2", "compressor": null, "fill_value": 0, "order": "C", "filters": null,
        });
        fs::write(dir.path().join(".zarray"), metadata.to_string()).unwrap();
        let started = std::time::Instant::now();
        let error = InputArray::scan(dir.path(), None).unwrap_err().to_string();
        assert!(
            error.contains("a grid of 1073741824×2×1 chunks, more than the 16777216"),
            "{error}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
