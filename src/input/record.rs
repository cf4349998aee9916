//! A scanned input written down, so that the parts of a job, each a
//! process of its own, take the input from the job's record instead of
//! listing its directory and reading its headers again.
//!
//! Only what a scan learns from a directory of block files with plain
//! storage is written: the grid, the dtype, where each block's data lies,
//! the headers the blocks not probed must start with ([`HeaderCheck`]), and
//! the array's place in the world. An input whose blocks are encoded, padded
//! Zarr chunks, TIFF pages, or MINC2 images (whose value scaling is read
//! from every header) has no record: its parts scan it. A record says
//! nothing about whether the files are still as they were: the job
//! compares every file's identity (one stat each) before a part reads
//! anything, and the reader checks each header again as it opens a file.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::array::InputArray;
use super::block::{HeaderCheck, InputBlock};
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::geometry::{self, FileShape, MAX_DIMS};
use crate::array::space::Space;
use crate::error::{Error, Result};
use crate::format::{BlockFormat, Storage};

/// An [`InputArray`] as a job's record holds it; the block files' paths
/// are the record's list of input identities, in the same order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScanRecord {
    pub source: PathBuf,
    pub format: BlockFormat,
    pub dataset: String,
    pub kind: Kind,
    pub size: usize,
    pub endian: Endian,
    /// C order.
    pub shape: Vec<u64>,
    pub block_shape: Vec<u64>,
    pub space: Space,
    /// The headers blocks not probed must start with.
    pub checks: Vec<RecordedCheck>,
    /// Each block, in C order of its grid index.
    pub blocks: Vec<RecordedBlock>,
}

/// A [`HeaderCheck`]: the probed file it stands for, that file's length,
/// and its bytes before the data, in hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedCheck {
    pub like: PathBuf,
    pub len: u64,
    pub header: String,
}

/// One block: where its data is (a byte offset, or `None` for an HDF5
/// dataset read through libhdf5), and the header check it must pass, by
/// index into [`ScanRecord::checks`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedBlock(pub Option<u64>, pub Option<usize>);

impl InputArray {
    /// This input as a job's record holds it, with `space` (its
    /// [`InputArray::space`]); `None` for an input a record cannot hold
    /// (see the module's notes).
    pub fn record(&self, space: &Space) -> Option<ScanRecord> {
        if self.format.traits().stored_scaling || self.files != FileShape::Exact {
            return None;
        }
        let mut checks: Vec<RecordedCheck> = Vec::new();
        let mut seen: Vec<*const HeaderCheck> = Vec::new();
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let at = match &block.storage {
                Storage::Contiguous { data_offset } => Some(*data_offset),
                Storage::Hdf5Dataset { dataset } if *dataset == self.hdf5_dataset() => None,
                _ => return None,
            };
            let check = block.check.as_ref().map(|check| {
                let key = Arc::as_ptr(check);
                seen.iter().position(|&p| p == key).unwrap_or_else(|| {
                    seen.push(key);
                    checks.push(RecordedCheck {
                        like: check.like.clone(),
                        len: check.len,
                        header: hex(&check.header),
                    });
                    checks.len() - 1
                })
            });
            blocks.push(RecordedBlock(at, check));
        }
        Some(ScanRecord {
            source: self.source.clone(),
            format: self.format,
            dataset: self.dataset.clone(),
            kind: self.dtype.kind,
            size: self.dtype.size,
            endian: self.dtype.endian,
            shape: self.shape.clone(),
            block_shape: self.block_shape.clone(),
            space: space.clone(),
            checks,
            blocks,
        })
    }

    /// The input `record` describes, its blocks' files at `paths`, and its
    /// place in the world; a record that does not describe a whole grid of
    /// blocks is refused as [`Error::BadOutput`] of `job` (the record's file).
    pub fn from_record(
        record: &ScanRecord,
        paths: Vec<PathBuf>,
        job: &std::path::Path,
    ) -> Result<(InputArray, Space)> {
        let bad = |problem: String| Error::BadOutput {
            path: job.to_path_buf(),
            problem: format!(
                "holds an input record rechunkfs cannot use ({problem}); remove OUT's files and \
                 start the job over"
            ),
        };
        let ndim = record.shape.len();
        if ndim == 0 || ndim > MAX_DIMS || record.block_shape.len() != ndim {
            return Err(bad(format!("{ndim} dimensions")));
        }
        if record.block_shape.contains(&0) || record.shape.contains(&0) {
            return Err(bad("an empty dimension".into()));
        }
        let dtype = DType::new(record.kind, record.size, record.endian)?;
        let grid = geometry::Partition::regular(&record.shape, &record.block_shape);
        let volume = record
            .shape
            .iter()
            .try_fold(dtype.size as u64, |n, &s| n.checked_mul(s));
        if volume.is_none() || grid.count() != record.blocks.len() as u64 {
            return Err(bad(format!(
                "{} blocks for a grid of {}",
                record.blocks.len(),
                grid.count()
            )));
        }
        if paths.len() != record.blocks.len() {
            return Err(bad(format!(
                "{} blocks but {} files",
                record.blocks.len(),
                paths.len()
            )));
        }
        let checks = record
            .checks
            .iter()
            .map(|check| {
                Ok(Arc::new(HeaderCheck {
                    like: check.like.clone(),
                    len: check.len,
                    header: unhex(&check.header)
                        .ok_or_else(|| bad("a header that is not hex".into()))?,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut input = InputArray {
            source: record.source.clone(),
            format: record.format,
            dataset: record.dataset.clone(),
            dtype,
            shape: record.shape.clone(),
            block_shape: record.block_shape.clone(),
            files: FileShape::Exact,
            blocks: Vec::with_capacity(paths.len()),
        };
        let hdf5 = input.hdf5_dataset();
        for (RecordedBlock(at, check), path) in record.blocks.iter().zip(paths) {
            let storage = match at {
                Some(data_offset) => Storage::Contiguous {
                    data_offset: *data_offset,
                },
                None => Storage::Hdf5Dataset {
                    dataset: hdf5.clone(),
                },
            };
            let check = match check {
                Some(i) => Some(
                    checks
                        .get(*i)
                        .cloned()
                        .ok_or_else(|| bad(format!("header check {i} of {}", checks.len())))?,
                ),
                None => None,
            };
            input.blocks.push(InputBlock {
                path,
                storage,
                check,
            });
        }
        Ok((input, record.space.clone()))
    }

    /// The dataset libhdf5 reads in each block file.
    fn hdf5_dataset(&self) -> String {
        self.format.input_dataset(&self.dataset).to_string()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&bytes)), Some(bytes));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("é1"), None);
    }
}
