//! Input discovery: find the block files of an array (a directory of
//! `{i}_{j}_{k}.h5` files, a Zarr array, TIFF pages, or one file), check
//! that they form a complete, consistent grid, and describe the whole array.
//!
//! The scan never guesses: a missing or duplicated index, a block whose
//! shape disagrees with its position, mixed dtypes, a truncated file or a
//! name that does not parse is refused with the file and the problem named.
//!
//! When every header is read ([`HeaderChecks::AtScan`]) is a choice. On a
//! cold cache the scan of W1's 8,000 HDF5 blocks spends 0.3 s waiting for
//! their headers, one disk read each, and then the run reads each file
//! again for its data. With [`HeaderChecks::BeforeUse`] the scan probes two
//! blocks of each kind (interior, or last along some dimensions) and fixes
//! the grid from them; every other block is checked when its file is first
//! read, against the header of a probed block of its kind, and the header
//! comes in with its data. A block whose header differs is probed then, and
//! one that does not fit stops the run with the same message a full scan
//! gives.
//!
//! Block file names and the shapes in messages are in the user-facing axis
//! order of the input's format ([`AxisOrder`]); everything stored here is
//! in internal C order.

mod discover;
mod grid;
mod probe;
mod record;
mod tiff;
mod values;
mod zarr;

pub use record::ScanRecord;
pub use values::Values;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry::{self, FileShape, Partition};
use crate::array::space::Space;
use crate::error::{Error, Result};
use crate::format::{self, BlockFormat, Storage};

/// The target of this stage's log lines, whichever file writes them: a
/// filter such as `RUST_LOG=rechunkfs::input=error` names the stage.
const LOG_TARGET: &str = module_path!();

/// The HDF5 dataset read when none is named.
pub const DEFAULT_DATASET: &str = "/data";

/// When the scan reads the headers of block files (see the module's notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderChecks {
    /// Every header, before the scan returns.
    AtScan,
    /// A few at the scan; each of the others just before its data is read
    /// ([`InputArray::confirmed_storage`]).
    BeforeUse,
}

/// One input block file.
#[derive(Clone, Debug)]
pub struct InputBlock {
    pub path: PathBuf,
    pub storage: Storage,
    /// Set when the scan did not read this block's header: its `storage`
    /// is that of a probed block of the same shape, and holds only if the
    /// file starts with the same header bytes.
    pub check: Option<Arc<HeaderCheck>>,
}

/// The header a block not probed at scan time is expected to have: that
/// of a probed block of the same shape. Files of equal length with equal
/// bytes before their data have the same layout (the probe parses
/// identical bytes identically), and nothing follows their data.
#[derive(Debug)]
pub struct HeaderCheck {
    /// The probed block.
    pub like: PathBuf,
    pub len: u64,
    /// Its bytes before the data.
    pub header: Vec<u8>,
}

impl InputBlock {
    /// The file's identity ([`FileIdentity`]) now; an absent Zarr chunk's
    /// is all zeros, so one written later shows as a change. Not taken by the
    /// scan: a view records them as it reads each file (8,000 cold stats
    /// up front took 0.07 s).
    pub fn identity(&self) -> Result<FileIdentity> {
        match self.storage {
            Storage::Absent { .. } => Ok(FileIdentity::ABSENT),
            _ => FileIdentity::of(&self.path),
        }
    }
}

/// What tells one version of a file from another: its size, its
/// modification and change times, and its inode. Size and mtime alone miss
/// a rewrite whose owner restores them (`touch -r`); the change time is
/// set by the kernel on every write and cannot be set back by a user, and
/// a file replaced by another (written beside it, renamed over it) has
/// another inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FileIdentity {
    pub size: u64,
    /// Nanoseconds since the epoch (negative before it).
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    pub inode: u64,
}

impl FileIdentity {
    /// What a file that does not exist has (an absent Zarr chunk).
    pub const ABSENT: FileIdentity = FileIdentity {
        size: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        inode: 0,
    };

    pub fn of(path: &Path) -> Result<FileIdentity> {
        let meta = fs::metadata(path).map_err(|e| Error::io(path, "stat", e))?;
        Ok(FileIdentity::of_metadata(&meta))
    }

    /// The identity of `path` now, [`ABSENT`](Self::ABSENT) if it does not exist.
    pub fn now(path: &Path) -> Result<FileIdentity> {
        match fs::metadata(path) {
            Ok(meta) => Ok(FileIdentity::of_metadata(&meta)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileIdentity::ABSENT),
            Err(e) => Err(Error::io(path, "stat", e)),
        }
    }

    /// What differs from `earlier` to this identity, for a person:
    /// "size 4096 -> 8192 bytes, modified", "replaced by another file".
    pub fn changes_from(&self, earlier: &FileIdentity) -> String {
        if *earlier == FileIdentity::ABSENT {
            return "created".into();
        }
        if *self == FileIdentity::ABSENT {
            return "removed".into();
        }
        let mut changes = Vec::new();
        if self.inode != earlier.inode {
            changes.push(format!(
                "replaced by another file (inode {} -> {})",
                earlier.inode, self.inode
            ));
        }
        if self.size != earlier.size {
            changes.push(format!("size {} -> {} bytes", earlier.size, self.size));
        }
        if self.mtime_ns != earlier.mtime_ns {
            changes.push("modified (its mtime changed)".into());
        } else if self.ctime_ns != earlier.ctime_ns {
            // The kernel sets ctime on every write; a restored mtime
            // (`touch -r`) cannot undo it.
            changes.push("written or its attributes changed (its ctime changed)".into());
        }
        if changes.is_empty() {
            return "unchanged".into();
        }
        changes.join(", ")
    }

    /// The identity a stat of the file found.
    pub fn of_metadata(meta: &fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        let ns = |seconds: i64, nanos: i64| seconds as i128 * 1_000_000_000 + nanos as i128;
        FileIdentity {
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
        }
    }
}

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

    /// Scans `path` (a directory of block files, a Zarr array, a stack of
    /// TIFF slices or a glob naming them, or one file), reading every
    /// header; `dataset` names the HDF5 dataset (default `/data`).
    pub fn scan(path: &Path, dataset: Option<&str>) -> Result<InputArray> {
        InputArray::scan_with(path, dataset, HeaderChecks::AtScan)
    }

    /// [`scan`](Self::scan), reading the headers `checks` says now.
    pub fn scan_with(
        path: &Path,
        dataset: Option<&str>,
        checks: HeaderChecks,
    ) -> Result<InputArray> {
        let dataset = dataset.unwrap_or(DEFAULT_DATASET).to_string();
        let meta = match fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tiff::is_pattern(path) => {
                return tiff::scan_pattern(path);
            }
            meta => meta.map_err(|e| Error::io(path, "reading the input", e))?,
        };
        if meta.is_file() {
            return discover::scan_single_file(path, dataset);
        }
        if !meta.is_dir() {
            return Err(crate::sys::files::not_regular(path, meta.file_type()));
        }
        if let Some(zarr) = format::zarr::read_metadata(path)? {
            return zarr::scan_array(path, zarr);
        }
        if let Some(slices) = tiff::stack_in(path)? {
            return tiff::scan_stack(path, slices);
        }
        let named = discover::list_block_files(path)?;
        grid::assemble_grid(path, named, dataset, checks)
    }

    /// The storage of block `rank`, whose file is open as `file`: as the
    /// scan found it, or for a block whose header the scan did not read
    /// (see [`HeaderChecks`]), once the file is checked to start with the
    /// header expected. A file that differs is probed now: if it still
    /// holds a block of the right shape and dtype its own storage is used;
    /// if not, the error is the one a full scan gives.
    pub fn confirmed_storage(
        &self,
        rank: usize,
        file: &fs::File,
        meta: Option<&fs::Metadata>,
    ) -> Result<Storage> {
        let block = &self.blocks[rank];
        let Some(check) = &block.check else {
            return Ok(block.storage.clone());
        };
        let len = match meta {
            Some(meta) => meta.len(),
            None => file
                .metadata()
                .map_err(|e| Error::io(&block.path, "stat", e))?
                .len(),
        };
        if check.passes(file, len) {
            return Ok(block.storage.clone());
        }
        let info = format::probe(
            &block.path,
            self.format,
            self.format.input_dataset(&self.dataset),
        )?;
        let grid = self.grid();
        let expected = grid.block(&grid.unravel(rank as u64)).shape;
        if info.shape == expected && info.dtype == self.dtype {
            return Ok(info.storage);
        }
        // A full scan names the odd block the way it always does (it may
        // be one the grid was fixed from).
        match InputArray::scan(&self.source, Some(&self.dataset)) {
            Err(error) => Err(error),
            Ok(_) => {
                let order = self.axis_order();
                Err(Error::bad_input(
                    &block.path,
                    format!(
                        "changed while being read: it now holds a {} {} block where {} {} was \
                         scanned",
                        geometry::show_shape(&order.to_user(&info.shape)),
                        info.dtype,
                        geometry::show_shape(&order.to_user(&expected)),
                        self.dtype
                    ),
                ))
            }
        }
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
