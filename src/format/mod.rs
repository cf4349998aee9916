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
//!
//! What each format is lives in its own file as one row of a table
//! ([`FormatTraits`]), registered in [`BlockFormat::traits`]; this file
//! only dispatches to the rows. The types every format shares are
//! [`block`]'s, the bottom file every format's file imports. Adding a
//! format: its file with its row, its variant in [`BlockFormat`] (and
//! [`BlockFormat::ALL`]), and its line in [`BlockFormat::traits`].

// `hdf5`, `minc`, `tiff` and `zarr` are named by later stages (the HDF5
// reader, MINC2's value scaling, TIFF pages, Zarr's metadata files); the
// other formats are reached through this module.
pub mod block;
pub mod decode;
pub mod encode;
pub mod encoding;
pub mod hdf5;
mod hdf5_deflate;
pub mod minc;
mod nifti;
mod npy;
pub mod ome;
pub mod precomputed;
mod raw;
pub mod tiff;
pub mod traits;
pub mod zarr;
pub mod zarr_codecs;

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;

pub(crate) use block::{shape_problem, shape_text};
pub use block::{BlockFormat, BlockInfo, BlockTemplate, Storage, VIEW_DATA_ALIGNMENT};
pub use encoding::Compression;
pub use traits::{BlockNames, Dataset, FormatTraits, PyramidKind};

use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::names::ChunkKey;
use crate::array::space::Space;
use crate::error::{Error, Result};

impl BlockFormat {
    /// This format's row of the table: the one place a format is registered.
    pub fn traits(self) -> &'static FormatTraits {
        match self {
            BlockFormat::Hdf5 => &hdf5::TRAITS,
            BlockFormat::Npy => &npy::TRAITS,
            BlockFormat::Nifti => &nifti::TRAITS,
            BlockFormat::Nifti2 => &nifti::TRAITS_2,
            BlockFormat::Minc2 => &minc::TRAITS,
            BlockFormat::Raw => &raw::TRAITS,
            BlockFormat::Tiff => &tiff::TRAITS,
            BlockFormat::Zarr => &zarr::TRAITS,
            BlockFormat::Zarr3 => &zarr::TRAITS_3,
            BlockFormat::Precomputed => &precomputed::TRAITS,
        }
    }

    /// The format a file extension (without the dot) promises, if any.
    pub fn from_extension(ext: &str) -> Option<BlockFormat> {
        BlockFormat::ALL.into_iter().find(|format| {
            format
                .traits()
                .input_extensions
                .iter()
                .any(|known| ext.eq_ignore_ascii_case(known))
        })
    }

    /// The extension written on output files, without the dot.
    pub fn extension(&self) -> &'static str {
        self.traits().extension
    }

    /// The format's name as people write it, for messages.
    pub fn name(&self) -> &'static str {
        self.traits().name
    }

    /// The output format when none is asked for: the input's, except that
    /// formats rechunkfs reads but does not write (MINC2, TIFF) become the
    /// default, HDF5.
    pub fn default_output(&self) -> BlockFormat {
        if self.traits().writes() {
            *self
        } else {
            BlockFormat::default()
        }
    }

    /// The dataset holding the array in an HDF5-based input, whatever
    /// `--dataset` says: MINC2 keeps its image at a fixed path.
    pub fn input_dataset<'a>(&self, requested: &'a str) -> &'a str {
        match self.traits().dataset {
            Dataset::Fixed(path) => path,
            Dataset::None | Dataset::Named => requested,
        }
    }

    /// How the format names its block files: `{i}_{j}_{k}.{ext}`, or
    /// Zarr's chunk keys.
    pub fn chunk_key(self) -> ChunkKey {
        match self.traits().names {
            BlockNames::ZarrV2 => ChunkKey::zarr_v2(),
            BlockNames::ZarrV3 => ChunkKey::zarr_v3(),
            BlockNames::Indices | BlockNames::VoxelRanges => {
                ChunkKey::block_files(self.extension())
            }
        }
    }

    /// The order people use for arrays read from this format (see
    /// [`crate::array::axes`]): NIfTI's (x, y, z), or C order.
    pub fn axis_order(self) -> AxisOrder {
        self.traits().axis_order
    }

    /// Whether the format stores edge blocks padded to the full block
    /// shape (Zarr chunks are always whole).
    pub fn pads_edge_blocks(&self) -> bool {
        self.traits().pads_edge_blocks
    }

    /// The format output blocks of `block_shape` (internal C order, the
    /// largest of the output) are written in: NIfTI-2 for NIfTI blocks
    /// with a side past NIfTI-1's 32,767, the format asked for otherwise.
    pub fn for_output_blocks(self, block_shape: &[u64]) -> BlockFormat {
        self.traits()
            .wider
            .and_then(|wider| wider(block_shape))
            .unwrap_or(self)
    }

    /// Whether the format's output is a pyramid even of one level (a
    /// precomputed volume is a scale of its `info`).
    pub fn always_a_pyramid(self) -> bool {
        self.traits().pyramid == PyramidKind::Precomputed
    }

    /// Whether the format writes files describing a pyramid's levels and
    /// axes for viewers (OME-Zarr's group, precomputed's `info`).
    pub fn describes_pyramids(self) -> bool {
        self.traits().pyramid != PyramidKind::Plain
    }

    /// Whether each level of a pyramid of `levels` levels has a directory
    /// of its own (otherwise level 0 is OUT itself).
    pub fn levels_in_own_dirs(self, levels: usize) -> bool {
        match self.traits().pyramid {
            PyramidKind::Precomputed => true,
            PyramidKind::OmeZarr { .. } => levels > 1,
            PyramidKind::Plain => false,
        }
    }

    /// Refuses a pyramid this format's pyramid metadata cannot describe,
    /// over an array of `shape` and `dtype` in blocks of `block` (internal order).
    pub fn check_pyramid(self, shape: &[u64], block: &[u64], dtype: DType) -> Result<()> {
        match self.traits().pyramid {
            PyramidKind::Precomputed => precomputed::check(shape, block, dtype),
            PyramidKind::OmeZarr { .. } => ome::check_axes(shape.len()),
            PyramidKind::Plain => Ok(()),
        }
    }
}

impl FromStr for BlockFormat {
    type Err = Error;

    fn from_str(text: &str) -> Result<BlockFormat> {
        let lower = text.trim().to_ascii_lowercase();
        BlockFormat::ALL
            .into_iter()
            .find(|format| format.traits().aliases.contains(&lower.as_str()))
            .or_else(|| BlockFormat::from_extension(text.trim()))
            .ok_or_else(|| {
                Error::BadArgument(format!(
                    "'{text}' is not a block format rechunkfs knows; use h5 (or hdf5), npy, nii \
                     (NIfTI-1), nii2 (NIfTI-2), raw, zarr (Zarr v2), zarr3 (Zarr v3) or \
                     precomputed (Neuroglancer); mnc and tif are read, not written"
                ))
            })
    }
}

/// Open `path` as `format` and learn its shape, dtype and storage; `dataset`
/// is the HDF5 dataset path (ignored for npy).
///
/// Refusals name the file and the problem: not a file of that format,
/// dataset missing, Fortran order, a dtype rechunkfs cannot carry, no or too
/// many dimensions, an empty dimension, or fewer bytes than the data need.
pub fn probe(path: &Path, format: BlockFormat, dataset: &str) -> Result<BlockInfo> {
    match format.traits().probe {
        Ok(probe) => probe(path, dataset),
        Err(why) => Err(Error::bad_input(path, why)),
    }
}

/// What `path` (probed as `info`) says of its world space: NIfTI and MINC2
/// headers carry one, other formats none (`None`).
pub fn probe_space(path: &Path, format: BlockFormat, info: &BlockInfo) -> Result<Option<Space>> {
    format
        .traits()
        .space
        .map(|space| space(path, info))
        .transpose()
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
    encoding: &encoding::Encoding,
) -> Vec<(&'static str, Vec<u8>)> {
    format
        .traits()
        .array_metadata
        .map(|metadata| metadata(shape, block_shape, dtype, encoding))
        .unwrap_or_default()
}

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
    match format.traits().template {
        Ok(template) => template(shape, dtype, dataset, data_len, alignment, space),
        Err(why) => Err(Error::BadArgument(why.into())),
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
    match format.traits().place {
        Some(place) if origin.iter().any(|&o| o != 0) => {
            Cow::Owned(place(template, shape, dtype, space, origin))
        }
        _ => Cow::Borrowed(template),
    }
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
    use std::os::unix::fs::FileExt;

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
    fn every_format_is_registered_once_with_its_names() {
        for (k, format) in BlockFormat::ALL.into_iter().enumerate() {
            assert!(!BlockFormat::ALL[..k].contains(&format), "{format:?} twice");
            let traits = format.traits();
            assert!(!traits.name.is_empty() && !traits.extension.is_empty());
            let text = serde_json::to_string(&format).unwrap();
            let named = traits
                .aliases
                .iter()
                .chain(traits.input_extensions)
                .all(|name| name.parse::<BlockFormat>().unwrap() == format);
            assert!(named, "{text}");
            assert_eq!(serde_json::from_str::<BlockFormat>(&text).unwrap(), format);
        }
        let written: Vec<_> = BlockFormat::ALL
            .into_iter()
            .filter(|f| f.traits().writes())
            .map(|f| f.default_output())
            .collect();
        assert!(written.iter().all(|f| f.traits().writes()));
        assert_eq!(BlockFormat::Minc2.default_output(), BlockFormat::Hdf5);
        assert_eq!(BlockFormat::Tiff.default_output(), BlockFormat::Hdf5);
        assert_eq!(BlockFormat::Minc2.input_dataset("x"), minc::IMAGE);
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
