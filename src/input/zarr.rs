//! A Zarr array (v2 or v3) as an input: one input block per chunk (per
//! shard, for a sharded array), found by the chunk key its metadata names;
//! edge chunks are padded on disk. Compressed or sharded chunks are
//! encoded blocks, read whole and decoded.

use std::fs;
use std::path::{Path, PathBuf};

use super::{InputArray, InputBlock};
use crate::array::geometry::{self, FileShape, IndexBox, Partition};
use crate::error::{Error, Result};
use crate::format::zarr::ZarrArrayMeta;
use crate::format::{self, Storage};

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
    let chunk_bytes = geometry::volume(&meta.chunks) * meta.dtype.size as u64;
    let grid = Partition::regular(&meta.shape, &block_shape);
    let mut blocks = Vec::with_capacity(grid.count() as usize);
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
            FileShape::Encoded(meta.chunks)
        } else {
            FileShape::Padded(meta.chunks)
        },
        blocks,
    })
}

/// The input block of the chunk whose file is at `path`: absent, or
/// exactly `chunk_bytes` long.
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
        return Ok(InputBlock {
            path,
            storage: Storage::Encoded {
                decoder: decoder.clone(),
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
