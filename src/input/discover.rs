//! Finding the block files of an input: a file's name is all that says
//! which format it is and where it sits in the grid, so a name that cannot
//! say it is refused here, before any file is opened. A name's extension
//! may be double: `.nii.gz` is gzipped NIfTI.

use std::fs;
use std::path::{Path, PathBuf};

use super::array::InputArray;
use super::block::InputBlock;
use crate::array::geometry::FileShape;
use crate::array::names::parse_grid_index;
use crate::error::{Error, Result};
use crate::format::{self, BlockFormat, Storage};
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
    if format.traits().whole_file {
        return super::tiff::scan_file(path);
    }
    let info = format::probe(path, format, format.input_dataset(&dataset))?;
    let blocks = vec![InputBlock {
        path: path.to_path_buf(),
        storage: info.storage,
        check: None,
    }];
    Ok(InputArray {
        source: path.to_path_buf(),
        format,
        dtype: info.dtype,
        shape: info.shape.clone(),
        block_shape: info.shape,
        files: files_of(&blocks)?,
        blocks,
        dataset,
    })
}

/// How the files of `blocks` hold their blocks: exactly, in place, or
/// each one encoded value decoding to exactly its block (gzipped NIfTI).
/// Refuses a mix: the whole input is read one way or the other.
pub(super) fn files_of(blocks: &[InputBlock]) -> Result<FileShape> {
    let encoded = |block: &InputBlock| matches!(block.storage, Storage::Encoded { .. });
    let Some(first) = blocks.first() else {
        return Ok(FileShape::Exact);
    };
    if let Some(odd) = blocks.iter().find(|block| encoded(block) != encoded(first)) {
        let (gzipped, plain) = if encoded(first) {
            (first, odd)
        } else {
            (odd, first)
        };
        return Err(Error::bad_input(
            &odd.path,
            format!(
                "{} is compressed but {} is not: the blocks of one array are all gzipped or \
                 none are; compress or decompress the odd ones (gzip, gunzip)",
                gzipped.path.display(),
                plain.path.display()
            ),
        ));
    }
    Ok(if encoded(first) {
        FileShape::Encoded { padded_to: None }
    } else {
        FileShape::Exact
    })
}

fn format_of(path: &Path) -> Result<BlockFormat> {
    let (_, ext) = split_extension(path);
    BlockFormat::from_extension(ext).ok_or_else(|| {
        Error::bad_input(
            path,
            format!(
                "unknown block file extension '.{ext}'; rechunkfs reads .h5/.hdf5 (HDF5), .npy, \
                 .nii or .nii.gz (NIfTI-1 or -2), .mnc (MINC2) and .tif/.tiff (TIFF) files"
            ),
        )
    })
}

/// A block file's name split at its extension, `("2_1_3", "h5")`: the
/// last one, or both of a double extension a compressed format has
/// (`.nii.gz`, which is NIfTI).
fn split_extension(path: &Path) -> (&str, &str) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let lower = name.to_ascii_lowercase();
    if lower.ends_with(".nii.gz") && name.len() > ".nii.gz".len() {
        let stem = &name[..name.len() - ".nii.gz".len()];
        return (stem, "nii");
    }
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => (stem, ext),
        _ => (name, ""),
    }
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
        let Some(format) = BlockFormat::from_extension(split_extension(&path).1) else {
            log::warn!(
                target: super::array::LOG_TARGET,
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
    let (stem, _) = split_extension(path);
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

    #[test]
    fn double_extensions_of_compressed_nifti() {
        for (name, expected) in [
            ("2_1_3.nii.gz", ("2_1_3", "nii")),
            ("2_1_3.NII.GZ", ("2_1_3", "nii")),
            ("0_0.h5", ("0_0", "h5")),
            ("notes.txt.gz", ("notes.txt", "gz")),
            (".nii.gz", (".nii", "gz")),
            ("README", ("README", "")),
        ] {
            assert_eq!(split_extension(Path::new(name)), expected, "{name}");
        }
    }
}
