//! Where the executor writes: a sink hands out output block files and is
//! told when each is complete, so the same executor fills real files for
//! `rechunk` and the staging area for the view. A sink whose blocks are
//! encoded (compressed or sharded) names its encoder: the writer then
//! gathers each block whole and writes its encoding in one call.

use std::collections::HashSet;
use std::fs::File;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use lru::LruCache;

use super::stats::RunStats;
use crate::array::geometry::Region;
use crate::error::{Error, Result};
use crate::format::encode::BlockEncode;
use crate::format::ome::WindowOf;

/// An output block file open for positioned writes of its data.
pub struct OutputTarget<'a> {
    pub file: &'a Arc<File>,
    pub path: &'a Path,
    /// Byte offset of the block's data (after its header).
    pub data_offset: u64,
    /// Shape of the C-order array the file's data region holds: the
    /// block's shape, or larger when the format pads edge blocks (Zarr).
    /// The padding is never written: creating the file at its full length
    /// leaves it a hole that reads as zeros.
    pub file_shape: &'a [u64],
}

impl OutputTarget<'_> {
    /// The same file, to be written by another thread.
    pub fn shared(&self) -> OpenOutput {
        OpenOutput {
            file: Arc::clone(self.file),
            path: self.path.to_path_buf(),
            data_offset: self.data_offset,
            file_shape: self.file_shape.to_vec(),
        }
    }
}

/// Where output blocks are written.
pub trait BlockSink {
    /// The file of output block `rank` (C-order rank in the output grid),
    /// created on first use. With an [`encoder`](Self::encoder) the file
    /// is created empty, for the encoded bytes.
    fn target(&mut self, rank: u64) -> Result<OutputTarget<'_>>;
    /// How output blocks are encoded whole (None: written in place, a
    /// region at a time, at the target's data offset).
    fn encoder(&self) -> Option<Arc<dyn BlockEncode>> {
        None
    }
    /// Every byte of output block `rank` has been written.
    fn complete(&mut self, rank: u64) -> Result<()>;
    /// Whether output block `rank` still needs writing (a resumed view
    /// already has some): unwanted blocks are skipped, not counted.
    fn wants(&mut self, _rank: u64) -> bool {
        true
    }
    /// How the workers that write each region of a block reduce it to the
    /// cells the sink takes ([`written`](Self::written)), if it takes any:
    /// a pyramid builds its next level from them.
    fn takes_cells(&self) -> Option<Arc<dyn ReduceToCells>> {
        None
    }
    /// A batch of regions has just been written, in the plan's order: their
    /// cells, as [`takes_cells`](Self::takes_cells) made them.
    fn written(&mut self, _batch: Vec<RegionCells>) -> Result<()> {
        Ok(())
    }
    /// Called between read blocks, with `stats.held_bytes` the array bytes
    /// the executor holds at that moment (the view extracts blocks out of
    /// order here, within what `--mem` leaves).
    fn between_steps(&mut self, _stats: &RunStats) -> Result<()> {
        Ok(())
    }
    /// Writing an output block failed for want of space (`error` is an
    /// ENOSPC or EDQUOT, [`Error::is_no_space`]). Returns once the write is
    /// worth trying again (the view waits for space), or an error to stop
    /// the run: the default, for a run into files someone waits for.
    fn no_space(&mut self, error: Error) -> Result<()> {
        Err(error)
    }
}

/// How the workers that write a region reduce it to what a sink takes of
/// it ([`BlockSink::takes_cells`]): a pyramid's next level's cells.
pub trait ReduceToCells: Send + Sync {
    /// The cells of `region`, its voxels gathered by `gather(part, into)`:
    /// `part` of it, C order.
    fn cells(
        &self,
        region: &Region,
        gather: &mut dyn FnMut(&Region, &mut [u8]) -> Result<()>,
    ) -> Result<RegionCells>;
}

/// A region of an output array as a worker reduced it.
pub struct RegionCells {
    pub region: Region,
    /// Its cells, C order.
    pub cells: Vec<u8>,
    /// The range of its values.
    pub window: WindowOf,
}

/// An output block's file, open for positioned writes of its data.
#[derive(Clone)]
pub struct OpenOutput {
    /// Shared with the workers that write into it.
    pub file: Arc<File>,
    pub path: PathBuf,
    /// Byte offset of the block's data (after its header).
    pub data_offset: u64,
    /// Shape of the array the file holds (a padded Zarr edge chunk's is
    /// larger than its block).
    pub file_shape: Vec<u64>,
}

/// The output files a sink has open between a block's first write and its
/// completion. Blocks written piece by piece (a baseline plan) can be many
/// more than the open-file limit allows, so the least recently used are
/// closed and reopened when written again.
pub struct OutputFiles {
    open: LruCache<u64, OpenOutput>,
    created: HashSet<u64>,
}

impl OutputFiles {
    pub fn new(capacity: usize) -> OutputFiles {
        OutputFiles {
            open: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
            created: HashSet::new(),
        }
    }

    /// Whether block `rank`'s file is open now.
    pub fn is_open(&self, rank: u64) -> bool {
        self.open.contains(&rank)
    }

    /// Whether block `rank`'s file was created in this run (and so must be
    /// reopened, not created again, if it is not open).
    pub fn was_created(&self, rank: u64) -> bool {
        self.created.contains(&rank)
    }

    pub fn insert(&mut self, rank: u64, output: OpenOutput) {
        self.created.insert(rank);
        self.open.put(rank, output);
    }

    /// The target for block `rank`, which must be open.
    pub fn target(&mut self, rank: u64) -> Result<OutputTarget<'_>> {
        let open = self
            .open
            .get(&rank)
            .ok_or_else(|| Error::Internal("open-file cache lost an entry".into()))?;
        Ok(OutputTarget {
            file: &open.file,
            path: &open.path,
            data_offset: open.data_offset,
            file_shape: &open.file_shape,
        })
    }

    /// Forgets block `rank` (completed, or rewritten whole elsewhere),
    /// handing back its file if it was open.
    pub fn close(&mut self, rank: u64) -> Option<OpenOutput> {
        self.created.remove(&rank);
        self.open.pop(&rank)
    }
}

/// Opens an existing output file again for writing.
pub fn reopen(path: &Path) -> Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, "reopening", e))
}
