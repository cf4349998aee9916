//! The whole array an input is ([`InputArray`]): its shape, dtype, block
//! grid and files, who may read them, and where it lies in the world. The
//! scanners of this stage build it; `mod.rs` picks the scanner.

use std::fs;
use std::path::PathBuf;

use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry::{self, FileShape, Partition};
use crate::array::space::Space;
use crate::error::{Error, Result};
use crate::format::{self, BlockFormat, Storage};

use super::block::InputBlock;

/// The target of this stage's log lines, whichever file writes them: a
/// filter such as `RUST_LOG=rechunkfs::input=error` names the stage.
pub(super) const LOG_TARGET: &str = concat!(env!("CARGO_CRATE_NAME"), "::input");

/// Who may read the input files, all of them: the read bits they all
/// have, and their owner and group when they all share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputAccess {
    /// The intersection of the files' permission bits.
    pub mode: u32,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// A whole array stored as a grid of block files.
#[derive(Clone, Debug)]
pub struct InputArray {
    /// The directory (or single file) it was scanned from.
    pub source: PathBuf,
    pub format: BlockFormat,
    /// HDF5 dataset path inside each block file.
    pub dataset: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Shape of every block but the edge ones (which may be smaller).
    pub block_shape: Vec<u64>,
    /// How block files are shaped around their blocks (Zarr pads edge chunks).
    pub files: FileShape,
    /// Blocks in C order of their grid index.
    pub blocks: Vec<InputBlock>,
}

impl InputArray {
    /// The access of the input files (see [`InputAccess`]): one stat of
    /// each (of the file a symlink names), absent Zarr chunks left out.
    pub fn access(&self) -> Result<InputAccess> {
        use std::os::unix::fs::MetadataExt;
        let mut access = InputAccess {
            mode: 0o7777,
            uid: None,
            gid: None,
        };
        let mut first = true;
        for block in &self.blocks {
            if matches!(block.storage, Storage::Absent { .. }) {
                continue;
            }
            let meta = fs::metadata(&block.path).map_err(|e| Error::io(&block.path, "stat", e))?;
            access.mode &= meta.mode();
            if first {
                (access.uid, access.gid) = (Some(meta.uid()), Some(meta.gid()));
                first = false;
            }
            access.uid = access.uid.filter(|&uid| uid == meta.uid());
            access.gid = access.gid.filter(|&gid| gid == meta.gid());
        }
        Ok(access)
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The input blocks as a partition of the array.
    pub fn grid(&self) -> Partition {
        Partition::regular(&self.shape, &self.block_shape)
    }

    pub fn nbytes(&self) -> u64 {
        geometry::volume(&self.shape) * self.dtype.size as u64
    }

    /// The order of shapes and block indices people use for this input
    /// (see [`crate::array::axes`]): the input's format decides it for the whole run.
    pub fn axis_order(&self) -> AxisOrder {
        self.format.axis_order()
    }

    /// Where the array lies in the world, for NIfTI outputs: from the headers
    /// of NIfTI and MINC2 inputs (block 0's affine is the whole array's),
    /// identity for the others. MINC2 scaling is one global range only if
    /// every block has the same one; otherwise NIfTI output is refused.
    pub fn space(&self) -> Result<Space> {
        let Some(first) = self.blocks.first() else {
            return Ok(Space::identity(self.ndim()));
        };
        let probe = |block: &InputBlock, shape: Vec<u64>| -> Result<Option<Space>> {
            let info = format::BlockInfo {
                shape,
                dtype: self.dtype,
                storage: block.storage.clone(),
            };
            format::probe_space(&block.path, self.format, &info)
        };
        let Some(mut space) = probe(first, self.block_shape.clone())? else {
            return Ok(Space::identity(self.ndim()));
        };
        let grid = self.grid();
        for (rank, block) in self.blocks.iter().enumerate().skip(1) {
            let region = grid.block(&grid.unravel(rank as u64));
            let Some(other) = probe(block, region.shape)? else {
                continue;
            };
            if space.nifti_refusal.is_none() {
                if let Some(refusal) = other.nifti_refusal {
                    space.nifti_refusal = Some(refusal);
                } else if other.scaling != space.scaling {
                    space.nifti_refusal = Some(format!(
                        "{} scales its values by (slope, intercept) {:?} but {} by {:?}; a set \
                         of NIfTI blocks made from them would need one scaling",
                        block.path.display(),
                        other.scaling,
                        first.path.display(),
                        space.scaling
                    ));
                }
            }
            // Each block's own affine should put it where its position in
            // the grid says; if not, the blocks' affines disagree, and the
            // first block's is the one carried.
            let expected = space.block_affine(&region.origin);
            let disagrees = expected
                .iter()
                .flatten()
                .zip(other.affine.iter().flatten())
                .any(|(a, b)| (a - b).abs() > 1e-3 * a.abs().max(1.0));
            if disagrees {
                log::warn!(
                    "{}: its affine {:?} does not place it at its grid position (expected {:?}); \
                     using the affine of {}",
                    block.path.display(),
                    other.affine,
                    expected,
                    first.path.display()
                );
            }
        }
        Ok(space)
    }
}
