//! Finding the block files of an input: a file's name is all that says
//! which format it is and where it sits in the grid, so a name that cannot
//! say it is refused here, before any file is opened.

use std::fs;
use std::path::{Path, PathBuf};

use super::{InputArray, InputBlock};
use crate::array::geometry::FileShape;
use crate::array::names::parse_grid_index;
use crate::error::{Error, Result};
use crate::format::{self, BlockFormat};
use crate::sys::files;

/// A block file of a directory input, by the grid index its name gives
/// (internal C order).
#[derive(Clone, Debug)]
pub(super) struct NamedBlock {
    pub index: Vec<usize>,
    pub path: PathBuf,
    pub format: BlockFormat,
}

/// One block file as the whole array.
pub(super) fn scan_single_file(path: &Path, dataset: String) -> Result<InputArray> {
    let format = format_of(path)?;
    if format == BlockFormat::Tiff {
        return super::tiff::scan_file(path);
    }
    let info = format::probe(path, format, format.input_dataset(&dataset))?;
    Ok(InputArray {
        source: path.to_path_buf(),
        format,
        dtype: info.dtype,
        shape: info.shape.clone(),
        block_shape: info.shape,
        files: FileShape::Exact,
        blocks: vec![InputBlock {
            path: path.to_path_buf(),
            storage: info.storage,
            check: None,
        }],
        dataset,
    })
}

fn format_of(path: &Path) -> Result<BlockFormat> {
    refuse_compressed_nifti(path)?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    BlockFormat::from_extension(ext).ok_or_else(|| {
        Error::bad_input(
            path,
            format!(
                "unknown block file extension '.{ext}'; rechunkfs reads .h5/.hdf5 (HDF5), .npy, \
                 .nii (NIfTI-1), .mnc (MINC2) and .tif/.tiff (TIFF) files"
            ),
        )
    })
}

/// `.nii.gz` is the usual way NIfTI travels, but its voxels are not at a
/// fixed offset, so rechunkfs cannot read them in place: say so rather than
/// skip the file as one of an unknown type.
fn refuse_compressed_nifti(path: &Path) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.ends_with(".nii.gz") {
        return Err(Error::bad_input(
            path,
            "gzip-compressed NIfTI (.nii.gz) is not supported: its voxels cannot be read in \
             place; decompress it first (gunzip FILE.nii.gz, or gunzip -k to keep the original)",
        ));
    }
    Ok(())
}

/// Block files in `dir` with their grid index and format. Hidden files and
/// files of other types are skipped (with a log line); a block-file
/// extension on a name that is not a grid index is an error.
pub(super) fn list_block_files(dir: &Path) -> Result<Vec<NamedBlock>> {
    let mut named = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, "listing", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, "listing", e))?;
        let path = entry.path();
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with('.') {
            continue;
        }
        refuse_compressed_nifti(&path)?;
        let Some(format) = path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(BlockFormat::from_extension)
        else {
            log::warn!(
                target: super::LOG_TARGET,
                "{}: not a block file (unknown extension), ignored",
                path.display()
            );
            continue;
        };
        check_regular(&entry, &path)?;
        let index = grid_index_of(&path, format)?;
        named.push(NamedBlock {
            index,
            path,
            format,
        });
    }
    Ok(named)
}

/// Refuses a block-file name that is not a regular file (or a symlink to
/// one): a FIFO would block the run's first read of it forever. The
/// directory listing says what each entry is, so regular files cost no
/// extra call.
fn check_regular(entry: &fs::DirEntry, path: &Path) -> Result<()> {
    let listed = entry.file_type().map_err(|e| Error::io(path, "stat", e))?;
    let kind = if listed.is_symlink() {
        fs::metadata(path)
            .map_err(|e| Error::io(path, "following the symlink", e))?
            .file_type()
    } else {
        listed
    };
    if kind.is_file() {
        Ok(())
    } else {
        Err(files::not_regular(path, kind))
    }
}

/// The grid index a block file's name gives, in internal C order (names
/// are in the user's order).
fn grid_index_of(path: &Path, format: BlockFormat) -> Result<Vec<usize>> {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let index = parse_grid_index(stem).ok_or_else(|| {
        Error::bad_input(
            path,
            format!(
                "the name does not parse as a grid index: block files are named by their \
                 position, one whole number per dimension, like 0_0_0.{} or 2_1_3.{}",
                format.extension(),
                format.extension()
            ),
        )
    })?;
    Ok(format.axis_order().to_internal(&index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::names::grid_name;

    #[test]
    fn grid_names() {
        assert_eq!(parse_grid_index("3_0_12"), Some(vec![3, 0, 12]));
        assert_eq!(parse_grid_index("7"), Some(vec![7]));
        assert_eq!(parse_grid_index("3__1"), None);
        assert_eq!(parse_grid_index("a_1"), None);
        assert_eq!(parse_grid_index("-1_2"), None);
        assert_eq!(grid_name(&[3, 0, 12]), "3_0_12");
    }
}
