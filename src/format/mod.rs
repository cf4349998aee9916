//! Block-file formats: learning what an input block holds, and laying out an
//! output block before its data exist.
//!
//! Every format rechunkfs reads or serves is "header bytes, then the raw
//! C-order array", or (for chunked and compressed HDF5 inputs) something only
//! libhdf5 can decode. [`probe`] tells the two apart once per input block so the
//! materialiser can `pread` contiguous data directly and hand only the rest to
//! libhdf5. [`template`] computes an output block's bytes apart from its data:
//! they depend only on format, shape and dtype, so one template per distinct
//! block shape serves every file, and a view can report exact sizes and serve
//! headers before any data are written.
//!
//! NIfTI headers also say where a block lies in the world (its affine), so
//! their bytes depend on the block's origin as well: [`place`] rewrites a
//! shape's template for one block. MINC2 is read (it is HDF5 underneath) but
//! not written; raw blocks are data only. Compressed and sharded output
//! blocks are encoded whole instead ([`encode`]), the way [`decode`] reads
//! encoded input blocks.

// `hdf5`, `minc`, `tiff` and `zarr` are named by later stages (the HDF5
// reader, MINC2's value scaling, TIFF pages, Zarr's metadata files); the
// other formats are reached through this module.
pub mod decode;
pub mod encode;
pub mod hdf5;
mod hdf5_deflate;
pub mod minc;
mod nifti;
mod npy;
pub mod ome;
pub mod precomputed;
pub mod tiff;
pub mod zarr;
pub mod zarr_codecs;

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::str::FromStr;

use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry::MAX_DIMS;
use crate::array::names::ChunkKey;
use crate::array::space::Space;
use crate::error::{Error, Result};
use crate::sys::files::create_fresh;

/// The on-disk formats of block files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockFormat {
    Hdf5,
    Npy,
    /// NIfTI single files: read as `.nii` or `.nii.gz`, NIfTI-1 or -2;
    /// written as NIfTI-1 `.nii` (see [`BlockFormat::for_output_blocks`]).
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
    /// The format a file extension (without the dot) promises, if any.
    pub fn from_extension(ext: &str) -> Option<BlockFormat> {
        if ext.eq_ignore_ascii_case("h5") || ext.eq_ignore_ascii_case("hdf5") {
            Some(BlockFormat::Hdf5)
        } else if ext.eq_ignore_ascii_case("npy") {
            Some(BlockFormat::Npy)
        } else if ext.eq_ignore_ascii_case("nii") {
            Some(BlockFormat::Nifti)
        } else if ext.eq_ignore_ascii_case("mnc") {
            Some(BlockFormat::Minc2)
        } else if ext.eq_ignore_ascii_case("raw") {
            Some(BlockFormat::Raw)
        } else if ext.eq_ignore_ascii_case("tif") || ext.eq_ignore_ascii_case("tiff") {
            Some(BlockFormat::Tiff)
        } else {
            None
        }
    }

    /// The extension written on output files, without the dot.
    pub fn extension(&self) -> &'static str {
        match self {
            BlockFormat::Hdf5 => "h5",
            BlockFormat::Npy => "npy",
            BlockFormat::Nifti | BlockFormat::Nifti2 => "nii",
            BlockFormat::Minc2 => "mnc",
            BlockFormat::Raw => "raw",
            BlockFormat::Tiff => "tif",
            // A Zarr array is a directory, not files with an extension;
            // these only tell staging copies of its chunks apart.
            BlockFormat::Zarr => "zarr",
            BlockFormat::Zarr3 => "zarr3",
            BlockFormat::Precomputed => "precomputed",
        }
    }

    /// The format's name as people write it, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            BlockFormat::Hdf5 => "HDF5",
            BlockFormat::Npy => "npy",
            BlockFormat::Zarr => "Zarr v2",
            BlockFormat::Zarr3 => "Zarr v3",
            BlockFormat::Nifti => "NIfTI",
            BlockFormat::Nifti2 => "NIfTI-2",
            BlockFormat::Minc2 => "MINC2",
            BlockFormat::Raw => "raw",
            BlockFormat::Precomputed => "Neuroglancer precomputed",
            BlockFormat::Tiff => tiff::NAME,
        }
    }

    /// The output format when none is asked for: the input's, except that
    /// MINC2 and TIFF, which rechunkfs reads but does not write, become
    /// plain HDF5.
    pub fn default_output(&self) -> BlockFormat {
        match self {
            BlockFormat::Minc2 | BlockFormat::Tiff => BlockFormat::Hdf5,
            other => *other,
        }
    }

    /// The dataset holding the array in an HDF5-based input, whatever
    /// `--dataset` says: MINC2 keeps its image at a fixed path.
    pub fn input_dataset<'a>(&self, requested: &'a str) -> &'a str {
        match self {
            BlockFormat::Minc2 => minc::IMAGE,
            _ => requested,
        }
    }

    /// How the format names its block files: `{i}_{j}_{k}.{ext}`, or
    /// Zarr's chunk keys.
    pub fn chunk_key(self) -> ChunkKey {
        match self {
            BlockFormat::Zarr => ChunkKey::zarr_v2(),
            BlockFormat::Zarr3 => ChunkKey::zarr_v3(),
            other => ChunkKey::block_files(other.extension()),
        }
    }

    /// The order people use for arrays read from this format (see
    /// [`crate::array::axes`]): NIfTI's (x, y, z), or C order.
    pub fn axis_order(self) -> AxisOrder {
        match self {
            BlockFormat::Nifti | BlockFormat::Nifti2 => AxisOrder::Nifti,
            _ => AxisOrder::C,
        }
    }

    /// Whether the format stores edge blocks padded to the full block
    /// shape (Zarr chunks are always whole).
    pub fn pads_edge_blocks(&self) -> bool {
        matches!(self, BlockFormat::Zarr | BlockFormat::Zarr3)
    }

    /// The format output blocks of `block_shape` (internal C order, the
    /// largest of the output) are written in: NIfTI-2 for NIfTI blocks
    /// with a side past NIfTI-1's 32,767, the format asked for otherwise.
    pub fn for_output_blocks(self, block_shape: &[u64]) -> BlockFormat {
        match (self, nifti::Version::needed_for(block_shape)) {
            (BlockFormat::Nifti, nifti::Version::Two) => BlockFormat::Nifti2,
            _ => self,
        }
    }
}

impl FromStr for BlockFormat {
    type Err = Error;

    fn from_str(text: &str) -> Result<BlockFormat> {
        let zarr = match text.trim().to_ascii_lowercase().as_str() {
            "zarr" | "zarr2" => Some(BlockFormat::Zarr),
            "zarr3" => Some(BlockFormat::Zarr3),
            "nii2" | "nifti2" => Some(BlockFormat::Nifti2),
            "precomputed" => Some(BlockFormat::Precomputed),
            _ => None,
        };
        zarr.or_else(|| BlockFormat::from_extension(text.trim()))
            .ok_or_else(|| {
                Error::BadArgument(format!(
                    "'{text}' is not a block format rechunkfs knows; use h5 (or hdf5), npy, nii \
                     (NIfTI-1), nii2 (NIfTI-2), raw, zarr (Zarr v2), zarr3 (Zarr v3) or \
                     precomputed (Neuroglancer); mnc and tif are read, not written"
                ))
            })
    }
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
        decoder: std::sync::Arc<dyn decode::BlockDecode>,
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

/// Open `path` as `format` and learn its shape, dtype and storage; `dataset`
/// is the HDF5 dataset path (ignored for npy).
///
/// Refusals name the file and the problem: not a file of that format,
/// dataset missing, Fortran order, a dtype rechunkfs cannot carry, no or too
/// many dimensions, an empty dimension, or fewer bytes than the data need.
pub fn probe(path: &Path, format: BlockFormat, dataset: &str) -> Result<BlockInfo> {
    match format {
        BlockFormat::Npy => npy::probe(path),
        BlockFormat::Hdf5 => self::hdf5::probe(path, dataset),
        BlockFormat::Nifti | BlockFormat::Nifti2 => nifti::probe(path),
        BlockFormat::Minc2 => minc::probe(path),
        BlockFormat::Raw => Err(Error::bad_input(
            path,
            "raw blocks hold data only, with no header saying their shape and dtype, so \
             rechunkfs cannot read them as input; convert them to .npy first",
        )),
        BlockFormat::Zarr | BlockFormat::Zarr3 => Err(Error::bad_input(
            path,
            "a Zarr chunk has no header to probe: open the array's directory instead",
        )),
        BlockFormat::Precomputed => Err(Error::bad_input(
            path,
            "rechunkfs writes Neuroglancer precomputed volumes but does not read them",
        )),
        BlockFormat::Tiff => Err(Error::bad_input(
            path,
            "a TIFF file is read page by page as a whole array, not as one block of a grid",
        )),
    }
}

/// What `path` (probed as `info`) says of its world space: NIfTI and MINC2
/// headers carry one, other formats none (`None`).
pub fn probe_space(path: &Path, format: BlockFormat, info: &BlockInfo) -> Result<Option<Space>> {
    match format {
        BlockFormat::Nifti | BlockFormat::Nifti2 => Ok(Some(nifti::read_header(path)?.space)),
        BlockFormat::Minc2 => minc::probe_space(path, info.shape.len(), info.dtype).map(Some),
        BlockFormat::Hdf5
        | BlockFormat::Npy
        | BlockFormat::Raw
        | BlockFormat::Tiff
        | BlockFormat::Zarr
        | BlockFormat::Zarr3
        | BlockFormat::Precomputed => Ok(None),
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

/// Build the template for `format`/`shape`/`dtype`; `dataset` names the HDF5
/// dataset to create (e.g. "/data" or "data"; ignored for npy).
pub fn template(
    format: BlockFormat,
    shape: &[u64],
    dtype: DType,
    dataset: &str,
) -> Result<BlockTemplate> {
    template_aligned(format, shape, dtype, dataset, 1)
}

/// The files `format` keeps beside its blocks to describe the whole array
/// of `shape` in blocks of `block_shape` encoded as `encoding`, as `(name,
/// bytes)`: a Zarr array's `.zarray` or `zarr.json`; none for block-file
/// formats, whose every file describes itself.
pub fn array_metadata_files(
    format: BlockFormat,
    shape: &[u64],
    block_shape: &[u64],
    dtype: DType,
    encoding: &encode::Encoding,
) -> Vec<(&'static str, Vec<u8>)> {
    match format {
        BlockFormat::Zarr | BlockFormat::Zarr3 => {
            zarr::array_metadata(format, shape, block_shape, dtype, encoding)
        }
        _ => Vec::new(),
    }
}

/// Page size the view aligns block data to: the kernel reads a FUSE file
/// in pages, so with the data starting on a page of its own, a read of the
/// header never asks for data bytes, and is answered while the block is
/// still pending.
pub const VIEW_DATA_ALIGNMENT: u64 = 4096;

/// As [`template`], with the data starting at a multiple of `alignment`
/// bytes when the data are at least that long (1: as compact as the format allows).
pub fn template_aligned(
    format: BlockFormat,
    shape: &[u64],
    dtype: DType,
    dataset: &str,
    alignment: u64,
) -> Result<BlockTemplate> {
    template_in_space(
        format,
        shape,
        dtype,
        dataset,
        alignment,
        &Space::identity(shape.len()),
    )
}

/// As [`template_aligned`], for blocks of an array placed in the world by
/// `space` (which only NIfTI headers record). The template is that of a
/// block at the array's origin; [`place`] moves it to another block.
pub fn template_in_space(
    format: BlockFormat,
    shape: &[u64],
    dtype: DType,
    dataset: &str,
    alignment: u64,
    space: &Space,
) -> Result<BlockTemplate> {
    let data_len = shape_problem(shape, dtype).map_err(|problem| {
        Error::BadArgument(format!(
            "cannot lay out a {} block: {problem}",
            format.name()
        ))
    })?;
    match format {
        BlockFormat::Npy => {
            let prefix = npy::encode_header_aligned(shape, dtype, alignment as usize);
            Ok(BlockTemplate {
                data_offset: prefix.len() as u64,
                prefix,
                data_len,
                suffix: Vec::new(),
            })
        }
        BlockFormat::Hdf5 => self::hdf5::template(shape, dtype, dataset, data_len, alignment),
        BlockFormat::Nifti => nifti::template(
            nifti::Version::One,
            shape,
            dtype,
            space,
            data_len,
            alignment,
        ),
        BlockFormat::Nifti2 => nifti::template(
            nifti::Version::Two,
            shape,
            dtype,
            space,
            data_len,
            alignment,
        ),
        // Raw blocks, Zarr and precomputed chunks are pure data; their
        // metadata file (rechunkfs.json, .zarray, zarr.json or info) says
        // shape and dtype.
        BlockFormat::Raw | BlockFormat::Zarr | BlockFormat::Zarr3 | BlockFormat::Precomputed => {
            Ok(BlockTemplate {
                prefix: Vec::new(),
                data_offset: 0,
                data_len,
                suffix: Vec::new(),
            })
        }
        BlockFormat::Minc2 => Err(Error::BadArgument(
            "rechunkfs reads MINC2 but does not write it; choose --format nii (NIfTI-1, with \
             the MINC2 affine), h5, npy or raw"
                .into(),
        )),
        BlockFormat::Tiff => Err(Error::BadArgument(
            "rechunkfs reads TIFF but does not write it; choose --format h5, npy, nii, raw, \
             zarr or zarr3"
                .into(),
        )),
    }
}

/// `template` (made by [`template_in_space`] for this block's shape) as the
/// block whose first voxel is at `origin` (internal C order) needs it: the
/// same bytes for formats whose header says nothing of where a block lies,
/// and for NIfTI a header whose affine is translated to that voxel.
pub fn place<'a>(
    template: &'a BlockTemplate,
    format: BlockFormat,
    shape: &[u64],
    dtype: DType,
    space: &Space,
    origin: &[u64],
) -> Cow<'a, BlockTemplate> {
    let version = match format {
        BlockFormat::Nifti => nifti::Version::One,
        BlockFormat::Nifti2 => nifti::Version::Two,
        _ => return Cow::Borrowed(template),
    };
    if origin.iter().all(|&o| o == 0) {
        return Cow::Borrowed(template);
    }
    let header = nifti::encode_header(version, shape, dtype, space, origin, template.data_offset);
    let mut placed = template.clone();
    placed.prefix[..header.len()].copy_from_slice(&header);
    Cow::Owned(placed)
}

/// Checks against the reference readers (numpy, h5py) the files are for.
#[cfg(test)]
pub(crate) mod test_python {
    use std::ffi::{OsStr, OsString};
    use std::io::Write;
    use std::process::Command;

    /// The Python with the readers: `RECHUNKFS_PYTHON`, else the venv
    /// `scripts/setup` makes under target/.
    fn python() -> OsString {
        std::env::var_os("RECHUNKFS_PYTHON").unwrap_or_else(|| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/target/pyenv/bin/python").into()
        })
    }

    /// Whether the readers' Python can import `module`. Under
    /// `./scripts/test` (`RECHUNKFS_TEST_ALL=1`) a missing one fails the
    /// test, naming it; elsewhere the test says `skipped:` on one line.
    pub fn python_with(module: &str) -> bool {
        let python = python();
        let available = Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|output| output.status.success());
        if available {
            return true;
        }
        let what = format!("{} with {module}", python.to_string_lossy());
        if std::env::var_os("RECHUNKFS_TEST_ALL").is_some_and(|v| v == "1") {
            panic!("missing prerequisite: {what} (./scripts/test installs it)");
        }
        // Straight to stderr: the harness hides what a passing test prints.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: a check against {module}: needs {what} (./scripts/test installs it)"
        );
        false
    }

    /// Run `script` with `arguments`, failing the test with Python's stderr
    /// if it fails; returns its stdout.
    pub fn run_python(script: &str, arguments: &[impl AsRef<OsStr>]) -> Vec<u8> {
        let output = Command::new(python())
            .arg("-c")
            .arg(script)
            .args(arguments)
            .output()
            .expect("the readers' Python runs");
        assert!(
            output.status.success(),
            "python failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::dtype::{Endian, Kind};

    #[test]
    fn format_names_and_extensions() {
        for (text, format) in [
            ("h5", BlockFormat::Hdf5),
            ("HDF5", BlockFormat::Hdf5),
            ("H5", BlockFormat::Hdf5),
            ("npy", BlockFormat::Npy),
            ("NPY", BlockFormat::Npy),
        ] {
            assert_eq!(BlockFormat::from_extension(text), Some(format), "{text}");
            assert_eq!(text.parse::<BlockFormat>().unwrap(), format, "{text}");
        }
        assert_eq!(BlockFormat::from_extension("nii"), Some(BlockFormat::Nifti));
        assert_eq!(BlockFormat::from_extension("MNC"), Some(BlockFormat::Minc2));
        assert_eq!(BlockFormat::from_extension("raw"), Some(BlockFormat::Raw));
        assert_eq!(BlockFormat::from_extension("gz"), None);
        assert_eq!(
            serde_json::to_string(&BlockFormat::Nifti).unwrap(),
            "\"nii\""
        );
        assert_eq!("nii2".parse::<BlockFormat>().unwrap(), BlockFormat::Nifti2);
        assert_eq!(BlockFormat::Nifti2.extension(), "nii");
        assert_eq!(BlockFormat::from_extension("nii2"), None);
        let wide = [2, 40_000];
        assert_eq!(
            BlockFormat::Nifti.for_output_blocks(&wide),
            BlockFormat::Nifti2
        );
        assert_eq!(
            BlockFormat::Nifti.for_output_blocks(&[2, 30_000]),
            BlockFormat::Nifti
        );
        assert_eq!(
            BlockFormat::Hdf5.for_output_blocks(&wide),
            BlockFormat::Hdf5
        );
        assert_eq!(BlockFormat::from_extension("zarr"), None);
        assert_eq!("zarr".parse::<BlockFormat>().unwrap(), BlockFormat::Zarr);
        assert_eq!("Zarr2".parse::<BlockFormat>().unwrap(), BlockFormat::Zarr);
        assert_eq!("zarr3".parse::<BlockFormat>().unwrap(), BlockFormat::Zarr3);
        assert_eq!("TIFF".parse::<BlockFormat>().unwrap(), BlockFormat::Tiff);
        assert_eq!(BlockFormat::from_extension("tif"), Some(BlockFormat::Tiff));
        let err = "png".parse::<BlockFormat>().unwrap_err().to_string();
        assert!(
            err.contains("png") && err.contains("h5") && err.contains("zarr3"),
            "{err}"
        );
        assert_eq!(BlockFormat::Hdf5.extension(), "h5");
        assert_eq!(BlockFormat::Npy.extension(), "npy");
        assert_eq!(BlockFormat::Hdf5.name(), "HDF5");
        assert_eq!(
            serde_json::to_string(&BlockFormat::Hdf5).unwrap(),
            "\"hdf5\""
        );
        assert_eq!(
            serde_json::from_str::<BlockFormat>("\"npy\"").unwrap(),
            BlockFormat::Npy
        );
    }

    #[test]
    fn template_refuses_bad_shapes() {
        let u16le = DType::new(Kind::Unsigned, 2, Endian::Little).unwrap();
        for shape in [vec![], vec![1; 9], vec![4, 0, 4], vec![u64::MAX, 2]] {
            for format in [BlockFormat::Npy, BlockFormat::Hdf5] {
                let err = template(format, &shape, u16le, "data").unwrap_err();
                assert!(matches!(err, Error::BadArgument(_)), "{shape:?}: {err}");
            }
        }
    }

    #[test]
    fn create_file_leaves_data_region_to_be_filled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("block");
        let template = BlockTemplate {
            prefix: b"HEAD".to_vec(),
            data_offset: 4,
            data_len: 3,
            suffix: b"TAIL".to_vec(),
        };
        std::fs::write(&path, vec![b'x'; 100]).unwrap();
        let file = template.create_file(&path).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 11);
        file.write_all_at(b"abc", template.data_offset).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"HEADabcTAIL");
    }
}
