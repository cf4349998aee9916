//! `rechunk`: the executor writing real block files into a directory.
//!
//! A block is written under a hidden temporary name of its run (its
//! part, host and process: [`job::run_tag`]) and renamed to its final
//! name (`{i}_{j}_{k}.{ext}`, or a Zarr chunk key like `i.j.k` or
//! `c/i/j/k`, as [`FileTree`] says) only when complete and on disk, so an
//! interrupted run never leaves a torn block that looks finished, and a
//! run that fails keeps every block it finished: running it again writes
//! only the rest ([`PartOutput::done`]).
//! Durability is batched: one `syncfs` covers many completed blocks before
//! their renames, instead of an `fsync` per block. A Zarr array's metadata
//! is written last, atomically, once every chunk is in place: until then
//! the directory is no Zarr array a reader could take for complete.
//!
//! Raw blocks carry no header, so a `rechunkfs.json` beside them says their
//! shape, dtype and axis order ([`metadata_json`]), written last like Zarr
//! metadata.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::array::axes::AxisOrder;
use crate::array::geometry::Partition;
use crate::array::names::parse_grid_index;
use crate::array::space::Space;
use crate::engine::{reopen, BlockSink, Executor, OpenOutput, OutputFiles, OutputTarget, RunStats};
use crate::error::{Error, Result};
use crate::format::encode::{self, BlockEncode, Encoding};
use crate::format::{self, BlockFormat, BlockTemplate, Dataset};
use crate::input::InputArray;
use crate::output::filetree::FileTree;
use crate::output::inputs::InputFiles;
use crate::output::job;
use crate::plan::Plan;
use crate::sys::pagecache;
use crate::DType;

/// Output blocks kept open while partially written (baseline plans write
/// many blocks piecewise; the rest are reopened on demand).
const OPEN_OUTPUTS: usize = 128;

/// Completed bytes that trigger a durability batch (sync, then renames).
pub const COMMIT_BATCH_BYTES: u64 = 256 << 20;

/// How output blocks are written: their format, values, encoding and
/// place in the world. `rechunk`'s directory sink writes by it, and a
/// view's layout holds one ([`crate::view::ViewLayout`]), so both shape
/// their files and metadata alike.
#[derive(Clone, Debug)]
pub struct OutputSpec {
    pub format: BlockFormat,
    /// HDF5 dataset path in each output block.
    pub dataset: String,
    pub dtype: DType,
    /// Where the whole array lies in the world (NIfTI headers record it).
    pub space: Space,
    /// The order block file names are written in (the input's; see [`crate::array::axes`]).
    pub axis_order: AxisOrder,
    /// Compression and sharding (none: blocks written in place).
    pub encoding: Encoding,
    /// Completed bytes that trigger a durability batch
    /// ([`COMMIT_BATCH_BYTES`]; tests of interrupted runs commit blocks
    /// one by one in a small array).
    pub commit_batch_bytes: u64,
}

impl OutputSpec {
    /// The template of a block of `shape` at the array's origin; checks
    /// that the format can hold such a block.
    pub fn template(&self, shape: &[u64]) -> Result<BlockTemplate> {
        self.template_aligned(shape, 1)
    }

    /// [`template`](Self::template) with the data at a multiple of
    /// `alignment` bytes into the file (a view's, for page-aligned reads).
    pub fn template_aligned(&self, shape: &[u64], alignment: u64) -> Result<BlockTemplate> {
        format::template_in_space(
            self.format,
            shape,
            self.dtype,
            &self.dataset,
            alignment,
            &self.space,
        )
    }

    /// The format's own files describing an array of `shape` in blocks of
    /// `block_shape` (a Zarr array's metadata; none for block files).
    pub fn format_metadata(
        &self,
        shape: &[u64],
        block_shape: &[u64],
    ) -> Vec<(&'static str, Vec<u8>)> {
        format::array_metadata_files(self.format, shape, block_shape, self.dtype, &self.encoding)
    }

    /// The encoder of the blocks of `output` (None: written in place);
    /// refuses what the format cannot encode.
    pub fn encoder(&self, output: &Partition) -> Result<Option<Arc<dyn BlockEncode>>> {
        let block_shape: Vec<u64> = (0..output.ndim())
            .map(|d| output.axis(d).extent(0))
            .collect();
        encode::encoder(
            self.format,
            &self.encoding,
            &output.array_shape(),
            &block_shape,
            self.dtype,
            &self.dataset,
        )
    }
}

/// Checks `out` can receive blocks: created if missing; if it holds a
/// job's record ([`job::JOB_NAME`]), accepted as it is (the record then
/// says whether the run belongs to that job); if it holds other files,
/// refused unless `overwrite`, in which case old block files, Zarr chunks
/// and array metadata, an old `rechunkfs.json` and job record (and
/// leftover partial files) are removed and nothing else is touched. Says
/// whether it created `out`.
pub fn prepare_output_dir(out: &Path, overwrite: bool) -> Result<bool> {
    prepare_output_for(out, overwrite, &InputFiles::default())
}

/// [`prepare_output_dir`] for a run reading `inputs`: refused, before
/// anything is removed, if an input file lies in `out` or would be
/// removed under another name ([`InputFiles`]).
pub fn prepare_output_for(out: &Path, overwrite: bool, inputs: &InputFiles) -> Result<bool> {
    inputs.refuse_inside(out)?;
    match fs::metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fs::create_dir_all(out)
                .map(|()| true)
                .map_err(|e| Error::io(out, "creating the output directory", e));
        }
        Err(e) => return Err(Error::io(out, "checking the output directory", e)),
        Ok(meta) if !meta.is_dir() => {
            return Err(Error::BadOutput {
                path: out.to_path_buf(),
                problem: "exists and is not a directory".into(),
            })
        }
        Ok(_) => {}
    }
    let entries: Vec<PathBuf> = fs::read_dir(out)
        .map_err(|e| Error::io(out, "listing", e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        // Another part of the job recording it at this moment.
        .filter(|path| !is_job_record_temporary(path))
        .collect();
    if entries.is_empty() {
        return Ok(false);
    }
    let holds_job = entries
        .iter()
        .any(|path| path.file_name().is_some_and(|n| n == job::JOB_NAME));
    if holds_job && !overwrite {
        // A job's OUT: its record says whether this run belongs to it.
        return Ok(false);
    }
    if !overwrite {
        return Err(not_empty(out, &entries));
    }
    let mut old = OldFiles::default();
    for path in entries {
        match kind_of(&path) {
            Entry::Partial | Entry::Block | Entry::Metadata if path.is_file() => {
                old.files.push(path)
            }
            Entry::ChunkTree if path.is_dir() => old.add_chunk_tree(&path)?,
            _ => {}
        }
    }
    // All checked before one is removed.
    for path in &old.files {
        inputs.refuse_removing(path)?;
    }
    old.remove()?;
    Ok(false)
}

/// What `--overwrite` removes: old files, then the chunk directories left
/// empty, deepest first.
#[derive(Default)]
struct OldFiles {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl OldFiles {
    /// A Zarr v3 chunk tree (`c/i/j/k`): numbered files and directories and
    /// partial files, then each directory left empty. Anything else in it
    /// is left alone, with the directories holding it.
    fn add_chunk_tree(&mut self, dir: &Path) -> Result<()> {
        for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, "listing", e))? {
            let path = entry.map_err(|e| Error::io(dir, "listing", e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let numbered = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
            let partial = name.starts_with('.') && name.ends_with(".partial");
            if path.is_dir() && numbered {
                self.add_chunk_tree(&path)?;
            } else if path.is_file() && (numbered || partial) {
                self.files.push(path);
            }
        }
        self.dirs.push(dir.to_path_buf());
        Ok(())
    }

    fn remove(self) -> Result<()> {
        for path in self.files {
            fs::remove_file(&path).map_err(|e| Error::io(&path, "removing an old block", e))?;
        }
        // Not empty: something that is no chunk lives there; keep it.
        for dir in self.dirs {
            let _ = fs::remove_dir(dir);
        }
        Ok(())
    }
}

/// Whether `path` is a job record being written ([`job::record_job`]).
fn is_job_record_temporary(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(job::JOB_NAME) && n.ends_with(".partial"))
}

/// What an entry of an output directory is, by its name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// A hidden `.{name}.partial` file: a block or metadata file not finished.
    Partial,
    /// A block file or Zarr v2 chunk.
    Block,
    /// `rechunkfs.json` or Zarr metadata.
    Metadata,
    /// A Zarr v3 chunk tree (`c/`).
    ChunkTree,
    Other,
}

fn kind_of(path: &Path) -> Entry {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let is_block = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(parse_grid_index)
        .is_some()
        && path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(BlockFormat::from_extension)
            .is_some();
    if name.starts_with('.') && name.ends_with(".partial") {
        Entry::Partial
    } else if is_block || is_zarr_chunk_name(name) {
        Entry::Block
    } else if name == METADATA_NAME
        || name == job::JOB_NAME
        || name == format::zarr::ZARRAY
        || name == format::zarr::ZARR_JSON
    {
        // The metadata of an earlier run would describe blocks no longer there.
        Entry::Metadata
    } else if name == "c" {
        Entry::ChunkTree
    } else {
        Entry::Other
    }
}

/// The refusal of a non-empty `out` holding `entries`, saying whether a
/// killed run left partial files there.
fn not_empty(out: &Path, entries: &[PathBuf]) -> Error {
    let partial = entries
        .iter()
        .filter(|path| kind_of(path) == Entry::Partial)
        .count();
    let left = if partial > 0 {
        format!(
            "; {partial} of them hidden .partial files, left by a run that was killed before it \
             could remove them: the blocks beside them are complete, and --overwrite removes all"
        )
    } else {
        String::new()
    };
    Error::BadOutput {
        path: out.to_path_buf(),
        problem: format!(
            "is not empty ({} entries{left}); choose an empty or new directory, or pass \
             --overwrite to replace the block files in it",
            entries.len()
        ),
    }
}

/// A Zarr v2 chunk name (`3.0.12`, `5`): whole numbers joined by dots.
fn is_zarr_chunk_name(name: &str) -> bool {
    name.split('.')
        .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

/// How many blocks a loop over output blocks handles between two looks at
/// its cancel flag.
pub const CANCEL_EVERY: u64 = 4096;

/// Which output blocks a run writes: its plan's (a part's, numbered in
/// the part), placed in the whole output grid.
#[derive(Clone, Debug)]
pub struct PartOutput {
    /// The part's number, which its temporaries' names carry.
    pub part: u64,
    /// The plan's output grid.
    pub blocks: Partition,
    /// Per dimension, the index of the plan's first output block in the
    /// whole output grid.
    pub first: Vec<usize>,
    /// The plan's blocks complete on disk already: left as they are.
    pub done: HashSet<u64>,
}

impl PartOutput {
    /// Part `part` of a job, whose plan is `plan` ([`crate::plan::parts`]),
    /// nothing written yet.
    pub fn of_plan(plan: &Plan, part: u64) -> PartOutput {
        let problem = &plan.problem;
        PartOutput {
            part,
            blocks: plan.output.clone(),
            first: (0..problem.ndim())
                .map(|d| (problem.origin[d] / problem.output_block[d]) as usize)
                .collect(),
            done: HashSet::new(),
        }
    }

    /// Every block of the grid `blocks`, written by one run (a pyramid's level).
    pub fn whole(blocks: &Partition) -> PartOutput {
        PartOutput {
            part: 0,
            blocks: blocks.clone(),
            first: vec![0; blocks.ndim()],
            done: HashSet::new(),
        }
    }

    /// The whole output grid's rank of the plan's block `rank`.
    pub fn whole_rank(&self, whole: &Partition, rank: u64) -> u64 {
        let index: Vec<usize> = self
            .blocks
            .unravel(rank)
            .iter()
            .zip(&self.first)
            .map(|(i, first)| i + first)
            .collect();
        whole.linear(&index)
    }

    /// The first read block of `plan` that feeds a block not done: a
    /// resumed run starts there (in the plan's order; earlier ones feed only done
    /// blocks). None when every block is done. `cancel`, set, stops the
    /// search ([`Error::Cancelled`]).
    pub fn first_read_needed(
        &self,
        plan: &Plan,
        cancel: Option<&AtomicBool>,
    ) -> Result<Option<u64>> {
        let mut first = None;
        for rank in 0..self.blocks.count() {
            if rank % CANCEL_EVERY == 0 && cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(Error::Cancelled);
            }
            if self.done.contains(&rank) {
                continue;
            }
            let read = plan.first_read_of(&self.blocks.block(&self.blocks.unravel(rank)));
            first = Some(first.map_or(read, |first: u64| first.min(read)));
        }
        Ok(first)
    }
}

/// A [`BlockSink`] that writes block files into a directory.
pub struct DirectorySink {
    dir: PathBuf,
    tree: FileTree,
    spec: OutputSpec,
    part: PartOutput,
    /// What makes this run's temporary names its own ([`job::run_tag`]).
    tag: String,
    /// Directories of nested chunk paths made so far.
    made_dirs: HashSet<PathBuf>,
    /// Every block whose file this run created, to remove its temporary
    /// if it fails.
    made_blocks: Vec<u64>,
    /// The files describing the whole array this run began to write.
    made_files: Vec<PathBuf>,
    templates: HashMap<Vec<u64>, BlockTemplate>,
    /// How blocks are encoded whole (None: written in place into templates).
    encoder: Option<Arc<dyn BlockEncode>>,
    files: OutputFiles,
    /// Completed blocks waiting for the durability batch: (temporary, final).
    completed: Vec<(PathBuf, PathBuf)>,
    completed_bytes: u64,
    /// Whether outputs' pages are dropped once synced (arrays the page
    /// cache cannot hold: [`crate::sys::cgroup::page_cache_cannot_hold`]).
    drop_outputs: bool,
}

impl DirectorySink {
    /// A sink writing `part` of the output grid `output` into `dir`.
    pub fn new(
        dir: &Path,
        output: Partition,
        spec: OutputSpec,
        part: PartOutput,
    ) -> Result<DirectorySink> {
        let array_bytes =
            crate::array::geometry::volume(&part.blocks.array_shape()) * spec.dtype.size as u64;
        let encoder = spec.encoder(&output)?;
        Ok(DirectorySink {
            encoder,
            drop_outputs: crate::sys::cgroup::page_cache_cannot_hold(array_bytes),
            dir: dir.to_path_buf(),
            tree: FileTree::for_output(spec.format, output, spec.axis_order),
            spec,
            tag: job::run_tag(part.part),
            part,
            made_dirs: HashSet::new(),
            made_blocks: Vec::new(),
            made_files: Vec::new(),
            templates: HashMap::new(),
            files: OutputFiles::new(OPEN_OUTPUTS),
            completed: Vec::new(),
            completed_bytes: 0,
        })
    }

    /// Writes the files that describe the whole array (a Zarr array's
    /// metadata, `rechunkfs.json` for raw blocks; nothing for block files
    /// with headers), each atomically, then syncs the directory.
    fn write_array_metadata(&mut self, input_block: &[u64], source: &Path) -> Result<()> {
        let spec = &self.spec;
        let shape = self.tree.grid().array_shape();
        let files = array_metadata(
            input_block,
            source,
            &shape,
            &self.tree.block_shape(),
            spec,
            self.tree.grid(),
        )?;
        if files.is_empty() {
            return Ok(());
        }
        for (name, bytes) in files {
            let path = self.dir.join(name);
            self.made_files.push(path.clone());
            write_atomically(&path, &bytes, &self.tag)?;
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(&self.dir, "syncing the directory", e))
    }

    /// (temporary, final) paths of the plan's block `rank`: the temporary
    /// one is a hidden name of this run in the same directory, so the
    /// rename is atomic.
    fn paths(&self, rank: u64) -> (PathBuf, PathBuf) {
        let whole = self.part.whole_rank(self.tree.grid(), rank);
        let done = self.dir.join(self.tree.path(whole));
        (temporary_name(&done, &self.tag), done)
    }

    /// Removes the temporaries that earlier runs of this part left (killed
    /// before they could), in the directories blocks go to (each read once:
    /// [`job::walk_output`]). `cancel`, set, stops it.
    pub fn remove_stale_temporaries(&self, cancel: Option<&AtomicBool>) -> Result<()> {
        job::walk_output(&self.dir, &self.tree, cancel, |rank, entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if rank.is_some() || !job::is_stale_temporary(&name, self.part.part) {
                return Ok(());
            }
            let path = entry.path();
            match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io(&path, "removing a stale temporary", e))
                }
                _ => Ok(()),
            }
        })
    }

    /// Makes the directory a nested chunk path needs, once.
    fn make_parent(&mut self, path: &Path) -> Result<()> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        if parent != self.dir && !self.made_dirs.contains(parent) {
            fs::create_dir_all(parent)
                .map_err(|e| Error::io(parent, "creating a chunk directory", e))?;
            self.made_dirs.insert(parent.to_path_buf());
        }
        Ok(())
    }

    fn template(&mut self, shape: &[u64]) -> Result<&BlockTemplate> {
        if !self.templates.contains_key(shape) {
            let template = self.spec.template(shape)?;
            self.templates.insert(shape.to_vec(), template);
        }
        self.templates
            .get(shape)
            .ok_or_else(|| Error::Internal("template cache lost an entry".into()))
    }

    /// The final path of block `rank` (committed) and where its data start.
    pub fn committed_block(&mut self, rank: u64) -> Result<(PathBuf, u64)> {
        let file_shape = self.tree.file_shape(rank);
        let data_offset = self.template(&file_shape)?.data_offset;
        Ok((self.paths(rank).1, data_offset))
    }

    /// Removes every file and directory this run created, finished or not
    /// (a pyramid whose building failed: its levels go together).
    pub fn discard(&mut self) {
        let blocks = std::mem::take(&mut self.made_blocks);
        let mut paths = Vec::with_capacity(2 * blocks.len());
        for rank in blocks {
            self.files.close(rank);
            let (partial, done) = self.paths(rank);
            paths.extend([partial, done]);
        }
        for path in std::mem::take(&mut self.made_files) {
            paths.extend([temporary_name(&path, &self.tag), path]);
        }
        for path in paths {
            if let Err(e) = fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("{}: could not remove it: {e}", path.display());
                }
            }
        }
        let mut dirs: Vec<PathBuf> = self.made_dirs.drain().collect();
        // Deepest first, with the levels above them that are empty then
        // (create_dir_all made those too); one holding anything else stays.
        dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
        for dir in dirs {
            let mut level = dir.as_path();
            while level.starts_with(&self.dir) && level != self.dir && fs::remove_dir(level).is_ok()
            {
                match level.parent() {
                    Some(parent) => level = parent,
                    None => break,
                }
            }
        }
        self.completed.clear();
        self.completed_bytes = 0;
    }

    /// After a failure: every block this run completed is made durable
    /// and given its final name (as far as the failure allows), and the
    /// temporaries of the rest are removed. Finished blocks are never
    /// removed, so a rerun writes only what is missing.
    fn abandon(&mut self) {
        if let Err(e) = self.commit() {
            log::warn!("keeping the blocks completed before the failure: {e}");
        }
        let blocks = std::mem::take(&mut self.made_blocks);
        let mut paths = Vec::with_capacity(blocks.len());
        for rank in blocks {
            self.files.close(rank);
            paths.push(self.paths(rank).0);
        }
        for path in std::mem::take(&mut self.made_files) {
            paths.push(temporary_name(&path, &self.tag));
        }
        for (partial, _) in self.completed.drain(..) {
            paths.push(partial);
        }
        for path in paths {
            if let Err(e) = fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("{}: could not remove it: {e}", path.display());
                }
            }
        }
        self.completed_bytes = 0;
    }

    /// Makes every completed block durable, then gives it its final name.
    pub fn commit(&mut self) -> Result<()> {
        if self.completed.is_empty() {
            return Ok(());
        }
        let dir = File::open(&self.dir).map_err(|e| Error::io(&self.dir, "opening", e))?;
        // One syncfs flushes every completed block's data at once; only
        // then may their names say they are complete.
        pagecache::sync_filesystem(&dir, &self.dir)?;
        let mut parents = BTreeSet::new();
        for (partial, done) in self.completed.drain(..) {
            if self.drop_outputs {
                // Synced, and nothing here reads it again.
                pagecache::drop_cached_pages_of(&partial);
            }
            rename_into_place(&partial, &done)?;
            if let Some(parent) = done.parent() {
                parents.insert(parent.to_path_buf());
            }
        }
        for parent in parents {
            File::open(&parent)
                .and_then(|d| d.sync_all())
                .map_err(|e| Error::io(&parent, "syncing the directory", e))?;
        }
        dir.sync_all()
            .map_err(|e| Error::io(&self.dir, "syncing the directory", e))?;
        self.completed_bytes = 0;
        Ok(())
    }
}

impl BlockSink for DirectorySink {
    fn target(&mut self, rank: u64) -> Result<OutputTarget<'_>> {
        if !self.files.is_open(rank) {
            let (partial, _) = self.paths(rank);
            let whole = self.part.whole_rank(self.tree.grid(), rank);
            let region = self.tree.grid().block(&self.tree.grid().unravel(whole));
            let file_shape = self.tree.file_shape(whole);
            let opened = if self.files.was_created(rank) {
                let data_offset = match self.encoder {
                    Some(_) => 0,
                    None => self.template(&file_shape)?.data_offset,
                };
                let file = reopen(&partial)?;
                OpenOutput {
                    file: Arc::new(file),
                    path: partial,
                    data_offset,
                    file_shape,
                }
            } else if self.encoder.is_some() {
                // Encoded blocks are written whole, into an empty file.
                self.make_parent(&partial)?;
                let file = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&partial)
                    .map_err(|e| Error::io(&partial, "create", e))?;
                self.made_blocks.push(rank);
                OpenOutput {
                    file: Arc::new(file),
                    path: partial,
                    data_offset: 0,
                    file_shape,
                }
            } else {
                self.make_parent(&partial)?;
                // The template sets the file's full length: a padded edge
                // chunk's padding is a hole of zeros, Zarr's fill value.
                // NIfTI headers also say where the block lies: placed.
                let (format, dtype) = (self.spec.format, self.spec.dtype);
                let space = self.spec.space.clone();
                let template = self.template(&file_shape)?;
                let placed =
                    format::place(template, format, &file_shape, dtype, &space, &region.origin);
                let data_offset = placed.data_offset;
                let file = placed.create_file(&partial)?;
                self.made_blocks.push(rank);
                OpenOutput {
                    file: Arc::new(file),
                    path: partial,
                    data_offset,
                    file_shape,
                }
            };
            self.files.insert(rank, opened);
        }
        self.files.target(rank)
    }

    fn encoder(&self) -> Option<Arc<dyn BlockEncode>> {
        self.encoder.clone()
    }

    fn wants(&mut self, rank: u64) -> bool {
        !self.part.done.contains(&rank)
    }

    fn complete(&mut self, rank: u64) -> Result<()> {
        let (partial, done) = self.paths(rank);
        let mut encoded_len = None;
        if let Some(open) = self.files.close(rank) {
            pagecache::start_writeback(&open.file);
            if self.encoder.is_some() {
                encoded_len = open.file.metadata().map(|m| m.len()).ok();
            }
        }
        let whole = self.part.whole_rank(self.tree.grid(), rank);
        let file_shape = self.tree.file_shape(whole);
        self.completed_bytes += match encoded_len {
            Some(len) => len,
            None => self.template(&file_shape)?.file_len(),
        };
        self.completed.push((partial, done));
        if self.completed_bytes >= self.spec.commit_batch_bytes {
            self.commit()?;
        }
        Ok(())
    }
}

/// Rechunks `input` into block files in `out` (prepared by
/// [`prepare_output_dir`]) following `plan`, then writes the files that
/// describe the whole array (Zarr metadata; `rechunkfs.json` for raw
/// blocks), last.
///
/// A run that fails, or is cancelled through `cancel` (checked between
/// steps), keeps the blocks it finished and removes its temporaries
/// ([`rechunk_part`]).
pub fn rechunk(
    input: &InputArray,
    plan: &Plan,
    out: &Path,
    spec: OutputSpec,
    cancel: Option<&AtomicBool>,
    progress: impl FnMut(&RunStats),
) -> Result<RunStats> {
    let part = PartOutput::of_plan(plan, 0);
    let mut sink = DirectorySink::new(out, plan.output.clone(), spec, part)?;
    let stats = run_into(&mut sink, input, plan, cancel, progress)?;
    let metadata = sink.write_array_metadata(&input.block_shape, &input.source);
    if metadata.is_err() {
        sink.abandon();
    }
    metadata.map(|()| stats)
}

/// As [`rechunk`], then `then` (given the finished sink, to read its
/// blocks back: a pyramid's levels). A failure anywhere removes every
/// file the run wrote, as a pyramid's levels stand or fall together.
pub fn rechunk_then<T>(
    input: &InputArray,
    plan: &Plan,
    out: &Path,
    spec: OutputSpec,
    cancel: Option<&AtomicBool>,
    progress: impl FnMut(&RunStats),
    then: impl FnOnce(&mut DirectorySink) -> Result<T>,
) -> Result<(RunStats, T)> {
    let part = PartOutput::of_plan(plan, 0);
    let mut sink = DirectorySink::new(out, plan.output.clone(), spec, part)?;
    let done = run_into(&mut sink, input, plan, cancel, progress).and_then(|stats| {
        sink.write_array_metadata(&input.block_shape, &input.source)?;
        Ok((stats, then(&mut sink)?))
    });
    if done.is_err() {
        sink.discard();
    }
    done
}

/// Rechunks `input` following `plan` (a part of a job, or all of it) into
/// the blocks `part` places in the output grid `output`, in `out`; the
/// blocks `part` says are done are left alone, and the run starts at the
/// first read block that feeds one that is not. Nothing describing the
/// whole array is written ([`job::finish`] does, once every part is done).
///
/// A run that fails, or is cancelled through `cancel` (checked between
/// steps), keeps every block it finished and removes its temporaries; a
/// run killed outright leaves its temporaries, which the next run of the
/// part removes ([`DirectorySink::remove_stale_temporaries`]).
pub fn rechunk_part(
    input: &InputArray,
    plan: &Plan,
    (out, output): (&Path, Partition),
    spec: OutputSpec,
    part: PartOutput,
    cancel: Option<&AtomicBool>,
    progress: impl FnMut(&RunStats),
) -> Result<RunStats> {
    let mut sink = DirectorySink::new(out, output, spec, part)?;
    sink.remove_stale_temporaries(cancel)?;
    run_into(&mut sink, input, plan, cancel, progress)
}

/// Runs `plan` into `sink` (from the first read block its part still
/// needs) and commits; on failure, [`DirectorySink::abandon`].
fn run_into(
    sink: &mut DirectorySink,
    input: &InputArray,
    plan: &Plan,
    cancel: Option<&AtomicBool>,
    progress: impl FnMut(&RunStats),
) -> Result<RunStats> {
    let first_read = if sink.part.done.is_empty() {
        0
    } else {
        match sink.part.first_read_needed(plan, cancel)? {
            Some(first) => first,
            None => return Ok(RunStats::default()),
        }
    };
    let mut executor = Executor::new(plan, input).starting_at(first_read);
    if let Some(cancel) = cancel {
        executor = executor.with_cancel(cancel);
    }
    let running = std::time::Instant::now();
    let stats = executor.run(sink, progress).and_then(|stats| {
        log::debug!("ran the plan in {:.3} s", running.elapsed().as_secs_f64());
        let committing = std::time::Instant::now();
        sink.commit()?;
        log::debug!("committed in {:.3} s", committing.elapsed().as_secs_f64());
        Ok(stats)
    });
    if stats.is_err() {
        sink.abandon();
    }
    stats
}

/// Writes the files that describe a whole array (see [`rechunk`]) for a
/// sink filled by other means than a plan (a pyramid level), from input
/// blocks of `input_block` in `source`.
pub fn finish_array(sink: &mut DirectorySink, input_block: &[u64], source: &Path) -> Result<()> {
    sink.commit()?;
    sink.write_array_metadata(input_block, source)
}

/// The files describing the whole array (name, bytes) that `spec`'s format
/// needs: a Zarr array's metadata, `rechunkfs.json` for raw blocks; none
/// for block files with headers.
pub fn array_metadata(
    input_block: &[u64],
    source: &Path,
    shape: &[u64],
    block_shape: &[u64],
    spec: &OutputSpec,
    output: &Partition,
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files: Vec<(String, Vec<u8>)> = spec
        .format_metadata(shape, block_shape)
        .into_iter()
        .map(|(name, bytes)| (name.to_string(), bytes))
        .collect();
    if spec.format.traits().data_only {
        let metadata = metadata_json(spec, shape, input_block, output, source);
        files.push((METADATA_NAME.to_string(), metadata_bytes(&metadata)?));
    }
    Ok(files)
}

/// The name of the metadata file describing raw blocks (the view's has the same name).
pub const METADATA_NAME: &str = "rechunkfs.json";

/// What a reader of bytes needs to know about a grid of output blocks: the
/// array, its dtype, the block and grid shapes, the file naming and how a
/// block's bytes map to its shape, for blocks written as `spec` says, of an
/// array of `array` read from blocks of `input_block` in `source`. Shapes
/// are in the user's order.
pub fn metadata_json(
    spec: &OutputSpec,
    array: &[u64],
    input_block: &[u64],
    output: &Partition,
    source: &Path,
) -> serde_json::Value {
    let (dtype, format, order) = (spec.dtype, spec.format, spec.axis_order);
    let dataset = spec.dataset.as_str();
    let names: String = "{i}_{j}_{k}_{l}_{m}_{n}_{o}_{p}"
        .split('_')
        .take(output.ndim())
        .collect::<Vec<_>>()
        .join("_");
    let block_shape: Vec<u64> = output.axes().iter().map(|axis| axis.extent(0)).collect();
    serde_json::json!({
        "array_shape": order.to_user(array),
        "dtype": dtype.numpy_descr(),
        "input_block_shape": order.to_user(input_block),
        "block_shape": order.to_user(&block_shape),
        "grid_shape": order.to_user(&output.grid_shape()),
        "format": format,
        "dataset": if format.traits().dataset == Dataset::Named { Some(dataset) } else { None },
        "file_name_pattern": format!("{names}.{}", format.extension()),
        "axis_order": order,
        "axis_order_description": order.describe(),
        "numpy_order": order.numpy_order(),
        "data_offset": if format.traits().data_only { Some(0) } else { None },
        "source": source,
    })
}

/// The bytes of `rechunkfs.json` holding `metadata`.
fn metadata_bytes(metadata: &serde_json::Value) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(metadata)
        .map_err(|e| Error::Internal(format!("encoding {METADATA_NAME}: {e}")))?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The name under which the run tagged `tag` writes `path` before it is
/// complete: hidden, in the same directory, so that the rename into place
/// is atomic, and the run's own, so that two runs of one part (or of
/// different parts) never write one file.
fn temporary_name(path: &Path, tag: &str) -> PathBuf {
    let leaf = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{leaf}.{tag}.partial"))
}

/// Renames the complete block `partial` to `done`. Another run of the same
/// part may have made `done` meanwhile (the bytes are the same) or removed
/// `partial` as stale: either way a complete `done` is what is wanted.
fn rename_into_place(partial: &Path, done: &Path) -> Result<()> {
    match fs::rename(partial, done) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && done.is_file() => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::io(
            partial,
            "renaming to its final name (another run of this part removed it as stale: run \
             each part once at a time)",
            e,
        )),
        other => other.map_err(|e| Error::io(partial, "renaming to its final name", e)),
    }
}

/// Writes `bytes` to `path` atomically: to a temporary of the run tagged
/// `tag`, synced, renamed into place (the directory is synced by the caller).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], tag: &str) -> Result<()> {
    let partial = temporary_name(path, tag);
    let mut file = crate::sys::files::create_fresh(&partial)
        .map_err(|e| Error::io(&partial, "creating", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&partial, "writing", e))?;
    fs::rename(&partial, path).map_err(|e| Error::io(path, "renaming into place", e))
}
