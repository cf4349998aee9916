//! Output blocks encoded whole: compressed Zarr chunks (v2 and v3), Zarr v3
//! shards, and HDF5 files whose dataset has the deflate filter. This file
//! picks each format's encoder ([`encoder`]); the trait they implement and
//! the choices that pick one are [`super::encoding`]'s, re-exported here.
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

use std::path::Path;
use std::sync::Arc;

use super::block::{BlockFormat, BlockTemplate};
pub use super::encoding::{shard_chunks, BlockEncode, Compression, Compressor, Encoding};
use crate::array::dtype::DType;
use crate::array::geometry::{show_shape, IndexBox};
use crate::error::{Error, Result};

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
    use crate::array::axes::AxisOrder;

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
}
