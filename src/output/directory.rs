//! `rechunk`: the executor writing real block files into a directory.
//!
//! A block is written under a hidden temporary name and renamed to its
//! final name (`{i}_{j}_{k}.{ext}`, or a Zarr chunk key like `i.j.k` or
//! `c/i/j/k`, as [`FileTree`] says) only when complete and on disk, so an
//! interrupted run never leaves a torn block that looks finished.
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
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::array::axes::AxisOrder;
use crate::array::geometry::Partition;
use crate::array::names::parse_grid_index;
use crate::array::space::Space;
use crate::engine::{reopen, BlockSink, Executor, OpenOutput, OutputFiles, OutputTarget, RunStats};
use crate::error::{Error, Result};
use crate::format::encode::{self, BlockEncode, Encoding};
use crate::format::{self, BlockFormat, BlockTemplate};
use crate::input::InputArray;
use crate::output::filetree::FileTree;
use crate::plan::Plan;
use crate::sys::pagecache;
use crate::DType;

/// Output blocks kept open while partially written (baseline plans write
/// many blocks piecewise; the rest are reopened on demand).
const OPEN_OUTPUTS: usize = 128;

/// Completed bytes that trigger a durability batch (sync, then renames).
const COMMIT_BATCH_BYTES: u64 = 256 << 20;

/// The durability batch: [`COMMIT_BATCH_BYTES`], or
/// `RECHUNKFS_COMMIT_BATCH_BYTES`, which lets tests of interrupted runs
/// see blocks committed one by one in a small array.
fn commit_batch_bytes() -> u64 {
    std::env::var("RECHUNKFS_COMMIT_BATCH_BYTES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(COMMIT_BATCH_BYTES)
}

/// How output blocks are encoded.
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
}

impl OutputSpec {
    /// The template of a block of `shape` at the array's origin; checks
    /// that the format can hold such a block.
    pub fn template(&self, shape: &[u64]) -> Result<BlockTemplate> {
        format::template_in_space(
            self.format,
            shape,
            self.dtype,
            &self.dataset,
            1,
            &self.space,
        )
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

/// Checks `out` can receive blocks: created if missing; if it holds files,
/// refused unless `overwrite`, in which case old block files, Zarr chunks
/// and array metadata, an old `rechunkfs.json` (and leftover partial files)
/// are removed and nothing else is touched. Says whether it created `out`.
///
/// A run killed outright (SIGKILL, a crash) leaves its hidden partial
/// files: the refusal then says so, and `--overwrite` removes them with
/// the blocks beside them.
pub fn prepare_output_dir(out: &Path, overwrite: bool) -> Result<bool> {
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
        .collect();
    if entries.is_empty() {
        return Ok(false);
    }
    if !overwrite {
        return Err(not_empty(out, &entries));
    }
    for path in entries {
        match kind_of(&path) {
            Entry::Partial | Entry::Block | Entry::Metadata if path.is_file() => {
                fs::remove_file(&path).map_err(|e| Error::io(&path, "removing an old block", e))?;
            }
            Entry::ChunkTree if path.is_dir() => remove_chunk_tree(&path)?,
            _ => {}
        }
    }
    Ok(false)
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

/// Removes a Zarr v3 chunk tree (`c/i/j/k`): numbered files and
/// directories and partial files, then each directory left empty.
/// Anything else in it is left alone, with the directories holding it.
fn remove_chunk_tree(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, "listing", e))? {
        let path = entry.map_err(|e| Error::io(dir, "listing", e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let numbered = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
        let partial = name.starts_with('.') && name.ends_with(".partial");
        if path.is_dir() && numbered {
            remove_chunk_tree(&path)?;
        } else if path.is_file() && (numbered || partial) {
            fs::remove_file(&path).map_err(|e| Error::io(&path, "removing an old chunk", e))?;
        }
    }
    // Not empty: something that is no chunk lives there; keep it.
    let _ = fs::remove_dir(dir);
    Ok(())
}

/// A [`BlockSink`] that writes block files into a directory.
pub struct DirectorySink {
    dir: PathBuf,
    tree: FileTree,
    spec: OutputSpec,
    /// Directories of nested chunk paths made so far.
    made_dirs: HashSet<PathBuf>,
    /// Every block whose file this run created, to remove them all if it fails.
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
    /// Completed bytes that trigger a durability batch.
    commit_batch_bytes: u64,
    /// Whether outputs' pages are dropped once synced (arrays the page
    /// cache cannot hold: [`crate::sys::cgroup::page_cache_cannot_hold`]).
    drop_outputs: bool,
}

impl DirectorySink {
    pub fn new(dir: &Path, output: Partition, spec: OutputSpec) -> Result<DirectorySink> {
        let array_bytes =
            crate::array::geometry::volume(&output.array_shape()) * spec.dtype.size as u64;
        let encoder = spec.encoder(&output)?;
        Ok(DirectorySink {
            encoder,
            drop_outputs: crate::sys::cgroup::page_cache_cannot_hold(array_bytes),
            dir: dir.to_path_buf(),
            tree: FileTree::for_output(spec.format, output, spec.axis_order),
            spec,
            made_dirs: HashSet::new(),
            made_blocks: Vec::new(),
            made_files: Vec::new(),
            templates: HashMap::new(),
            files: OutputFiles::new(OPEN_OUTPUTS),
            completed: Vec::new(),
            completed_bytes: 0,
            commit_batch_bytes: commit_batch_bytes(),
        })
    }

    /// Writes the files that describe the whole array (a Zarr array's
    /// metadata, `rechunkfs.json` for raw blocks; nothing for block files
    /// with headers), each atomically, then syncs the directory.
    fn write_array_metadata(&mut self, input_block: &[u64], source: &Path) -> Result<()> {
        let spec = &self.spec;
        let shape = self.tree.grid().array_shape();
        let mut files: Vec<(String, Vec<u8>)> = format::array_metadata_files(
            spec.format,
            &shape,
            &self.tree.block_shape(),
            spec.dtype,
            &spec.encoding,
        )
        .into_iter()
        .map(|(name, bytes)| (name.to_string(), bytes))
        .collect();
        if spec.format == BlockFormat::Raw {
            let metadata = metadata_json(
                &shape,
                spec.dtype,
                input_block,
                self.tree.grid(),
                spec.format,
                &spec.dataset,
                spec.axis_order,
                source,
            );
            files.push((METADATA_NAME.to_string(), metadata_bytes(&metadata)?));
        }
        if files.is_empty() {
            return Ok(());
        }
        for (name, bytes) in files {
            let path = self.dir.join(name);
            self.made_files.push(path.clone());
            write_atomically(&path, &bytes)?;
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(&self.dir, "syncing the directory", e))
    }

    /// (temporary, final) paths of block `rank`: the temporary one is a
    /// hidden name in the same directory, so the rename is atomic.
    fn paths(&self, rank: u64) -> (PathBuf, PathBuf) {
        let done = self.dir.join(self.tree.path(rank));
        (partial_name(&done), done)
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
            .ok_or_else(|| Error::BadArgument("template cache lost an entry".into()))
    }

    /// The final path of block `rank` (committed) and where its data start.
    pub fn committed_block(&mut self, rank: u64) -> Result<(PathBuf, u64)> {
        let file_shape = self.tree.file_shape(rank);
        let data_offset = self.template(&file_shape)?.data_offset;
        Ok((self.paths(rank).1, data_offset))
    }

    /// Removes every file and directory this run created, finished or not.
    pub fn discard(&mut self) {
        let blocks = std::mem::take(&mut self.made_blocks);
        let mut paths = Vec::with_capacity(2 * blocks.len());
        for rank in blocks {
            self.files.close(rank);
            let (partial, done) = self.paths(rank);
            paths.extend([partial, done]);
        }
        for path in std::mem::take(&mut self.made_files) {
            paths.extend([partial_name(&path), path]);
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
            fs::rename(&partial, &done)
                .map_err(|e| Error::io(&partial, "renaming to its final name", e))?;
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
            let region = self.tree.grid().block(&self.tree.grid().unravel(rank));
            let file_shape = self.tree.file_shape(rank);
            let opened = if self.files.was_created(rank) {
                let data_offset = match self.encoder {
                    Some(_) => 0,
                    None => self.template(&file_shape)?.data_offset,
                };
                let file = reopen(&partial)?;
                OpenOutput {
                    file,
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
                    file,
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
                    file,
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

    fn complete(&mut self, rank: u64) -> Result<()> {
        let (partial, done) = self.paths(rank);
        let mut encoded_len = None;
        if let Some(open) = self.files.close(rank) {
            pagecache::start_writeback(&open.file);
            if self.encoder.is_some() {
                encoded_len = open.file.metadata().map(|m| m.len()).ok();
            }
        }
        self.completed_bytes += match encoded_len {
            Some(len) => len,
            None => self.template(&self.tree.file_shape(rank))?.file_len(),
        };
        self.completed.push((partial, done));
        if self.completed_bytes >= self.commit_batch_bytes {
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
/// steps), removes every file it wrote, finished or not, before it returns:
/// OUT is left as [`prepare_output_dir`] left it, as a refusal at the
/// scan would leave it (input blocks' headers are checked as they are
/// read: see crate::input). A run killed outright leaves its hidden
/// partial files and the blocks it had committed, every one complete; see
/// [`prepare_output_dir`] for what a rerun does with them.
pub fn rechunk(
    input: &InputArray,
    plan: &Plan,
    out: &Path,
    spec: OutputSpec,
    cancel: Option<&AtomicBool>,
    progress: impl FnMut(&RunStats),
) -> Result<RunStats> {
    rechunk_then(input, plan, out, spec, cancel, progress, |_| Ok(())).map(|(stats, ())| stats)
}

/// As [`rechunk`], then `then` (given the finished sink, to read its
/// blocks back), whose failure removes what the run wrote too.
pub fn rechunk_then<T>(
    input: &InputArray,
    plan: &Plan,
    out: &Path,
    spec: OutputSpec,
    cancel: Option<&AtomicBool>,
    progress: impl FnMut(&RunStats),
    then: impl FnOnce(&mut DirectorySink) -> Result<T>,
) -> Result<(RunStats, T)> {
    let mut sink = DirectorySink::new(out, plan.output.clone(), spec)?;
    let mut executor = Executor::new(plan, input);
    if let Some(cancel) = cancel {
        executor = executor.with_cancel(cancel);
    }
    let running = std::time::Instant::now();
    let stats = executor.run(&mut sink, progress).and_then(|stats| {
        log::debug!("ran the plan in {:.3} s", running.elapsed().as_secs_f64());
        let committing = std::time::Instant::now();
        sink.commit()?;
        sink.write_array_metadata(&input.block_shape, &input.source)?;
        log::debug!("committed in {:.3} s", committing.elapsed().as_secs_f64());
        Ok(stats)
    });
    let done = stats.and_then(|stats| Ok((stats, then(&mut sink)?)));
    if done.is_err() {
        sink.discard();
    }
    done
}

/// Writes the files that describe a whole array (see [`rechunk`]) for a
/// sink filled by other means than a plan (a pyramid level), from input
/// blocks of `input_block` in `source`.
pub fn finish_array(sink: &mut DirectorySink, input_block: &[u64], source: &Path) -> Result<()> {
    sink.commit()?;
    sink.write_array_metadata(input_block, source)
}

/// The name of the metadata file describing raw blocks (the view's has the same name).
pub const METADATA_NAME: &str = "rechunkfs.json";

/// What a reader of bytes needs to know about a grid of output blocks: the
/// array, its dtype, the block and grid shapes, the file naming and how a
/// block's bytes map to its shape. Shapes are in `order` (the user's).
#[allow(clippy::too_many_arguments)]
pub fn metadata_json(
    array: &[u64],
    dtype: DType,
    input_block: &[u64],
    output: &Partition,
    format: BlockFormat,
    dataset: &str,
    order: AxisOrder,
    source: &Path,
) -> serde_json::Value {
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
        "dataset": if format == BlockFormat::Hdf5 { Some(dataset) } else { None },
        "file_name_pattern": format!("{names}.{}", format.extension()),
        "axis_order": order,
        "axis_order_description": order.describe(),
        "numpy_order": order.numpy_order(),
        "data_offset": if format == BlockFormat::Raw { Some(0) } else { None },
        "source": source,
    })
}

/// The bytes of `rechunkfs.json` holding `metadata`.
fn metadata_bytes(metadata: &serde_json::Value) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(metadata)
        .map_err(|e| Error::BadArgument(format!("encoding {METADATA_NAME}: {e}")))?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The name under which `path` is written before it is complete: hidden,
/// in the same directory, so that the rename into place is atomic.
fn partial_name(path: &Path) -> PathBuf {
    let leaf = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{leaf}.partial"))
}

/// Writes `bytes` to `path` atomically: to its partial name, synced,
/// renamed into place (the directory is synced by the caller).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let partial = partial_name(path);
    let mut file = File::create(&partial).map_err(|e| Error::io(&partial, "creating", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&partial, "writing", e))?;
    fs::rename(&partial, path).map_err(|e| Error::io(path, "renaming into place", e))
}
