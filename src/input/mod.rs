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
//! order of the input's format ([`AxisOrder`](crate::array::axes::AxisOrder)); everything stored here is
//! in internal C order.

mod array;
mod block;
mod discover;
mod grid;
mod probe;
mod record;
mod tiff;
mod values;
mod zarr;

pub use array::{InputAccess, InputArray};
pub use block::{FileIdentity, HeaderCheck, HeaderChecks, InputBlock};
pub use record::ScanRecord;
pub use values::Values;

use std::fs;
use std::path::Path;

use crate::array::geometry;
use crate::error::{Error, Result};
use crate::format::{self, Storage};

/// The HDF5 dataset read when none is named.
pub const DEFAULT_DATASET: &str = "/data";

impl InputArray {
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
}
