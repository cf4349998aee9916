//! The types every format shares: which format a block file is
//! ([`BlockFormat`]), what probing one learns ([`BlockInfo`], [`Storage`]),
//! an output block's bytes apart from its data ([`BlockTemplate`]), and the
//! checks and messages on shapes all formats make. The bottom of `format/`:
//! it names no format's file, so each format's file can use it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::decode::BlockDecode;
use crate::array::dtype::DType;
use crate::array::geometry::MAX_DIMS;
use crate::error::{Error, Result};
use crate::sys::files::create_fresh;

/// The on-disk formats of block files.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum BlockFormat {
    /// The output format when nothing says one: every reader has it.
    #[default]
    Hdf5,
    Npy,
    /// NIfTI single files: read as `.nii` or `.nii.gz`, NIfTI-1 or -2;
    /// written as NIfTI-1 `.nii` (NIfTI-2 where a block needs it).
    #[serde(rename = "nii")]
    Nifti,
    /// NIfTI-2 single files (`.nii`), written only (inputs are [`Nifti`](Self::Nifti)).
    #[serde(rename = "nii2")]
    Nifti2,
    /// MINC2 (`.mnc`, HDF5 underneath), read only.
    #[serde(rename = "mnc")]
    Minc2,
    /// Data only (`.raw`), written only; a metadata file describes them.
    Raw,
    /// TIFF and BigTIFF (`.tif`, `.tiff`): a stack of slices or a
    /// multi-page file, read only.
    Tiff,
    /// A Zarr v2 array: `.zarray` and uncompressed chunks named `i.j.k`.
    Zarr,
    /// A Zarr v3 array: `zarr.json` and uncompressed chunks named `c/i/j/k`.
    Zarr3,
    /// Neuroglancer precomputed, unsharded raw: an `info` file and chunks
    /// named by their voxel ranges, `x0-x1_y0-y1_z0-z1`; written only.
    Precomputed,
}

impl BlockFormat {
    /// Every format, in the order `--format`'s names and extensions are
    /// looked up.
    pub const ALL: [BlockFormat; 10] = [
        BlockFormat::Hdf5,
        BlockFormat::Npy,
        BlockFormat::Nifti,
        BlockFormat::Nifti2,
        BlockFormat::Minc2,
        BlockFormat::Raw,
        BlockFormat::Tiff,
        BlockFormat::Zarr,
        BlockFormat::Zarr3,
        BlockFormat::Precomputed,
    ];
}

/// Where a block's array bytes are, as learned by probing the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Raw C-order bytes of the whole block at this byte offset: read them with pread.
    Contiguous { data_offset: u64 },
    /// Chunked, compressed, or not yet allocated HDF5 storage: read through libhdf5.
    Hdf5Dataset { dataset: String },
    /// No file at all: a Zarr chunk never written holds the fill value
    /// everywhere. `fill` is one element's bytes, in the array's byte order.
    Absent { fill: Vec<u8> },
    /// The `len` bytes at `offset` are one encoded value, such as a
    /// compressed or sharded Zarr chunk or a gzipped NIfTI image (a whole
    /// file, at 0) or a compressed TIFF strip: they can only be read whole,
    /// in one call, and decoded into the block (padded, for Zarr and TIFF)
    /// by `decoder`.
    Encoded {
        decoder: Arc<dyn BlockDecode>,
        offset: u64,
        len: u64,
    },
}

/// What probing one block file learns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub storage: Storage,
}

impl BlockInfo {
    /// Bytes of array data the block holds.
    pub fn data_len(&self) -> u64 {
        // probe has already refused shapes whose byte count overflows.
        self.shape.iter().product::<u64>() * self.dtype.size as u64
    }
}

/// The problem with a block shape, if any, and otherwise the block's data
/// length in bytes. Shared by probing (where the problem is the input's) and
/// template building (where it is the caller's).
pub(crate) fn shape_problem(shape: &[u64], dtype: DType) -> std::result::Result<u64, String> {
    if shape.is_empty() {
        return Err("it holds a 0-dimensional (scalar) array, not a block of an array".into());
    }
    if shape.len() > MAX_DIMS {
        return Err(format!(
            "it has {} dimensions; rechunkfs handles at most {MAX_DIMS}",
            shape.len()
        ));
    }
    if shape.contains(&0) {
        return Err(format!(
            "its shape {} has an empty dimension, so it holds no data",
            shape_text(shape)
        ));
    }
    shape
        .iter()
        .try_fold(dtype.size as u64, |bytes, &extent| {
            bytes.checked_mul(extent)
        })
        .ok_or_else(|| {
            format!(
                "its shape {} of {dtype} needs more than 2^64 bytes",
                shape_text(shape)
            )
        })
}

/// Opens a block file whose header is read from its start (npy, NIfTI):
/// the file, its length and its first `up_to` bytes (fewer if shorter).
/// An empty file is refused as not being `format`.
pub(crate) fn read_head(
    path: &Path,
    format: &'static str,
    up_to: u64,
) -> Result<(File, u64, Vec<u8>)> {
    let file = crate::sys::files::open_regular(path)?;
    let file_len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    if file_len == 0 {
        return Err(Error::BadBlockFile {
            path: path.to_path_buf(),
            format,
            problem: "the file is empty".into(),
        });
    }
    let mut head = vec![0u8; file_len.min(up_to) as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(path, "read header of", e))?;
    Ok((file, file_len, head))
}

/// A shape as people read it in messages: `(770, 605, 700)`.
pub(crate) fn shape_text(shape: &[u64]) -> String {
    let extents: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("({})", extents.join(", "))
}

/// The bytes of a block file of a given shape and dtype, apart from its data:
/// every file of one format, shape and dtype is byte-identical outside the
/// data region, so one template serves them all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTemplate {
    /// Bytes `[0, data_offset)`.
    pub prefix: Vec<u8>,
    pub data_offset: u64,
    /// `prod(shape) * dtype.size`.
    pub data_len: u64,
    /// Bytes after the data region (usually empty).
    pub suffix: Vec<u8>,
}

impl BlockTemplate {
    pub fn file_len(&self) -> u64 {
        self.data_offset + self.data_len + self.suffix.len() as u64
    }

    /// Create `path` anew with this template ([`create_fresh`]: whatever
    /// was there is replaced, a link never followed): prefix and suffix
    /// written, length set to [`file_len`](Self::file_len), the data region
    /// left as a hole for positioned writes. Returns the file open read+write.
    pub fn create_file(&self, path: &Path) -> Result<File> {
        let file = create_fresh(path).map_err(|e| Error::io(path, "create", e))?;
        if let Err(error) = self.write_into(&file, path) {
            // A full disk fails the header's write: the file is ours,
            // made a moment ago, and would otherwise be left behind.
            let _ = std::fs::remove_file(path);
            return Err(error);
        }
        Ok(file)
    }

    /// Lays this template out in `file` (at `path`), new or truncated:
    /// what [`create_file`](Self::create_file) does once the file is open.
    pub fn write_into(&self, file: &File, path: &Path) -> Result<()> {
        // Setting the length first leaves the data region a hole whatever
        // the writes below do, and costs no data blocks on disk.
        file.set_len(self.file_len())
            .map_err(|e| Error::io(path, "set length of", e))?;
        file.write_all_at(&self.prefix, 0)
            .map_err(|e| Error::io(path, "write header to", e))?;
        if !self.suffix.is_empty() {
            file.write_all_at(&self.suffix, self.data_offset + self.data_len)
                .map_err(|e| Error::io(path, "write trailer to", e))?;
        }
        Ok(())
    }
}

/// Page size the view aligns block data to: the kernel reads a FUSE file
/// in pages, so with the data starting on a page of its own, a read of the
/// header never asks for data bytes, and is answered while the block is
/// still pending.
pub const VIEW_DATA_ALIGNMENT: u64 = 4096;
