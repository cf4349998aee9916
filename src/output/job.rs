//! A job's record in its output directory, so that the parts of a job run
//! on many machines, and a run that died, agree on what they are making.
//!
//! The first run of any part writes `.rechunkfs-job.json`: what the job
//! makes (input, shapes, format, and every setting that changes a block's
//! bytes: dtype and byte order, `--values`, `--compress`, `--shard`,
//! `--dataset`; the cuts into parts), the identity of every input file
//! ([`FileIdentity`], as the view journals them), the size of each kind of
//! block file, and the array metadata that `finish` writes last; and, for
//! the parts after the first, the input as scanned and the cuts' bridged
//! dimensions, so that they neither scan nor search again. It is created
//! by a hard link from a synced temporary: of runs
//! starting at once exactly one link succeeds (on NFS, Lustre and GPFS
//! too, which do not all offer `flock`), and the others read it and
//! refuse a mismatch. A block's final name means complete and exact
//! (written under a temporary name of its run, synced, renamed), so what
//! is done is what the directory holds, read one directory at a time
//! ([`walk_output`]): never a stat per name the job could write.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::array::axes::AxisOrder;
use crate::array::geometry::{Axis, IndexBox, Partition, Region};
use crate::engine::workers::map_on_threads;
use crate::error::{Error, Result};
use crate::format::BlockFormat;
use crate::input::{FileIdentity, InputArray, InputBlock, ScanRecord};
use crate::output::filetree::{Dir, FileTree, Node};
use crate::output::inputs::InputFiles;

/// The job record's name in OUT: hidden, so that no reader takes the
/// directory for anything but its blocks.
pub const JOB_NAME: &str = ".rechunkfs-job.json";

/// What a job makes: two runs whose specs differ must not share an OUT.
/// (`--mem` is not part of it: a part rerun with more memory plans
/// differently but writes the same bytes.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub input: PathBuf,
    pub dataset: String,
    pub format: BlockFormat,
    /// numpy's descriptor (`<u2`).
    pub dtype: String,
    pub axis_order: AxisOrder,
    /// Shapes in C order.
    pub array: Vec<u64>,
    pub input_block: Vec<u64>,
    pub output_block: Vec<u64>,
    pub parts: u64,
    /// Per dimension, the bounds of the parts (C order).
    pub cuts: Vec<Vec<u64>>,
    /// `--compress` (`zstd:3`), if blocks are compressed.
    pub compress: Option<String>,
    /// `--shard`: each block a shard of chunks of this shape (C order).
    pub shard_chunks: Option<Vec<u64>>,
    /// `--values`: `stored` or `scaled`.
    pub values: String,
}

impl JobSpec {
    /// The whole output grid.
    pub fn output(&self) -> Partition {
        Partition::regular(&self.array, &self.output_block)
    }

    /// The grid of parts.
    pub fn part_grid(&self) -> Partition {
        Partition::new(
            self.cuts
                .iter()
                .map(|bounds| Axis::from_bounds(bounds.clone()))
                .collect(),
        )
    }

    /// The output blocks' files.
    pub fn tree(&self) -> FileTree {
        FileTree::for_output(self.format, self.output(), self.axis_order)
    }

    /// Part `k`'s output blocks, as ranges of grid indices per dimension.
    pub fn part_blocks(&self, k: u64) -> Vec<std::ops::Range<usize>> {
        let grid = self.part_grid();
        let region = grid.block(&grid.unravel(k));
        self.output().overlapping(&region)
    }
}

/// An input file as it was when the job began ([`FileIdentity::ABSENT`]:
/// an absent chunk, which reads as the fill value).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputIdentity {
    pub path: PathBuf,
    pub identity: FileIdentity,
}

/// `.rechunkfs-job.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    pub spec: JobSpec,
    pub inputs: Vec<InputIdentity>,
    /// Each kind of block file: its array's shape and its length in bytes.
    /// Empty when block files have no fixed length (encoded outputs): a
    /// final name alone then says a block is complete.
    pub block_sizes: Vec<(Vec<u64>, u64)>,
    /// The files describing the whole array (name, text), which `finish`
    /// writes once every block is in place.
    pub metadata_files: Vec<(String, String)>,
    /// Per dimension, whether the parts read the input blocks they clip
    /// there bridged: with the cuts, the parts as `plan::parts::cut` chose
    /// them, so that no part searches for them again.
    #[serde(default)]
    pub bridged: Vec<bool>,
    /// The input as the first run scanned it, its blocks' files those of
    /// `inputs`: the parts after it read this instead of the input's
    /// headers (`None` for an input no record holds, which each part scans).
    #[serde(default)]
    pub input_scan: Option<ScanRecord>,
}

impl JobRecord {
    /// The record as its file holds it: compact, each input file under
    /// the input named by its path from there, since every part reads
    /// the whole file before it starts.
    fn as_written(&self) -> JobRecord {
        let mut record = self.clone();
        for input in &mut record.inputs {
            if let Ok(name) = input.path.strip_prefix(&self.spec.input) {
                if !name.as_os_str().is_empty() {
                    input.path = name.to_path_buf();
                }
            }
        }
        record
    }

    /// The record read from its file ([`JobRecord::as_written`]): every
    /// input file's path whole again (a path the file holds whole stays).
    fn into_read(mut self) -> JobRecord {
        for input in &mut self.inputs {
            if input.path.is_relative() {
                input.path = self.spec.input.join(&input.path);
            }
        }
        self
    }

    /// The input this record holds, if it holds one, and its place in the
    /// world. Nothing here says the files are as recorded: the run checks
    /// those it reads with [`JobRecord::check_inputs_read`] before it
    /// reads any.
    pub fn input(&self, out: &Path) -> Result<Option<(InputArray, crate::array::space::Space)>> {
        let Some(scan) = &self.input_scan else {
            return Ok(None);
        };
        let paths = self.inputs.iter().map(|i| i.path.clone()).collect();
        InputArray::from_record(scan, paths, &out.join(JOB_NAME)).map(Some)
    }

    /// Refuses the input taken from this record if any file a run of
    /// `region` of the array (`None`: the whole array) reads has an
    /// identity other than the one recorded (one stat each, naming the
    /// files): a changed file may hold another geometry than the record's,
    /// and the blocks of other parts were made from it as it was. Files
    /// outside `region` are not looked at: a part never opens them.
    pub fn check_inputs_read(
        &self,
        out: &Path,
        input: &InputArray,
        region: Option<&Region>,
    ) -> Result<()> {
        if self.inputs.len() != input.blocks.len() {
            return check_inputs(out, &self.inputs, &input_identity(input)?);
        }
        let ranks = read_blocks(input, region);
        let recorded: Vec<InputIdentity> = ranks
            .iter()
            .filter_map(|&rank| self.inputs.get(rank).cloned())
            .collect();
        let blocks: Vec<&InputBlock> = ranks
            .iter()
            .filter_map(|&rank| input.blocks.get(rank))
            .collect();
        check_inputs(out, &recorded, &identities_now(&blocks)?)
    }
}

/// The ranks (C order) of `input`'s blocks that overlap `region` of the
/// array (every block for `None`, or for a region of another array).
pub fn read_blocks(input: &InputArray, region: Option<&Region>) -> Vec<usize> {
    let all = || (0..input.blocks.len()).collect();
    let Some(region) = region else {
        return all();
    };
    let inside = region.ndim() == input.shape.len()
        && (0..region.ndim()).all(|d| region.end(d) <= input.shape[d]);
    if !inside {
        return all();
    }
    let grid = Partition::regular(&input.shape, &input.block_shape);
    if grid.count() != input.blocks.len() as u64 {
        return all();
    }
    IndexBox::new(grid.overlapping(region))
        .map(|index| grid.linear(&index) as usize)
        .collect()
}

/// Every input file's identity now, and the input files kept from harm
/// ([`InputFiles::of`]), from one stat of each path.
pub fn input_identity_and_files(input: &InputArray) -> Result<(Vec<InputIdentity>, InputFiles)> {
    let (files, identities) = InputFiles::of_with_identities(input)?;
    let identities = input
        .blocks
        .iter()
        .zip(identities)
        .map(|(block, identity)| InputIdentity {
            path: block.path.clone(),
            identity,
        })
        .collect();
    Ok((identities, files))
}

/// Every input file's identity, now.
pub fn input_identity(input: &InputArray) -> Result<Vec<InputIdentity>> {
    let blocks: Vec<&InputBlock> = input.blocks.iter().collect();
    identities_now(&blocks)
}

/// The identities of the files of `blocks` now, stat'ed on every thread
/// the run may use.
fn identities_now(blocks: &[&InputBlock]) -> Result<Vec<InputIdentity>> {
    map_on_threads(blocks, |block| {
        Ok(InputIdentity {
            path: block.path.clone(),
            identity: FileIdentity::now(&block.path)?,
        })
    })
    .into_iter()
    .collect()
}

/// What makes a run's temporary names its own: its part, host and process.
pub fn run_tag(part: u64) -> String {
    format!("p{part}-{}-{}", host_name(), std::process::id())
}

/// This machine's name (the kernel's), as a temporary name may hold it.
fn host_name() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.is_empty() {
        "host".into()
    } else {
        name
    }
}

/// Whether the temporary `name` is part `part`'s and stale: made by a run
/// of that part that is no longer running (on this host, its process has
/// gone; another host's run of the same part is taken to be over, as a
/// job array runs each part once at a time).
pub fn is_stale_temporary(name: &str, part: u64) -> bool {
    let Some(rest) = name.strip_suffix(".partial") else {
        return false;
    };
    let Some(tag) = rest.rsplit('.').next() else {
        return false;
    };
    let mut fields = tag.splitn(3, '-');
    let (Some(p), Some(host), Some(pid)) = (fields.next(), fields.next(), fields.next()) else {
        return false;
    };
    if p != format!("p{part}") {
        return false;
    }
    let Ok(pid) = pid.parse::<i32>() else {
        return false;
    };
    if host != host_name() {
        return true;
    }
    pid != std::process::id() as i32 && !Path::new(&format!("/proc/{pid}")).exists()
}

/// The record in `out`, if there is one.
pub fn read_job(out: &Path) -> Result<Option<JobRecord>> {
    let path = out.join(JOB_NAME);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, "reading the job record", e)),
    };
    serde_json::from_slice(&bytes)
        .map(|record: JobRecord| Some(record.into_read()))
        .map_err(|e| Error::BadOutput {
            path: path.clone(),
            problem: format!(
                "is not a job record rechunkfs can read ({e}); remove OUT's files or choose \
                 another OUT"
            ),
        })
}

/// Records `record` in `out` unless a run of the job did first; then
/// checks the two agree: the same job, from the same input files. `found`
/// is the record this run read from `out` already, if it did: it is not
/// read and parsed again.
pub fn record_job(
    out: &Path,
    record: &JobRecord,
    tag: &str,
    found: Option<&JobRecord>,
) -> Result<()> {
    if let Some(found) = found {
        return check_same_job(out, found, record);
    }
    let path = out.join(JOB_NAME);
    if !path.exists() {
        let temporary = out.join(format!("{JOB_NAME}.{tag}.partial"));
        let mut bytes = serde_json::to_vec(&record.as_written())
            .map_err(|e| Error::Internal(format!("encoding the job record: {e}")))?;
        bytes.push(b'\n');
        let mut file = crate::sys::files::create_fresh(&temporary)
            .map_err(|e| Error::io(&temporary, "creating", e))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(&temporary, "writing", e))?;
        let linked = fs::hard_link(&temporary, &path);
        let _ = fs::remove_file(&temporary);
        match linked {
            Ok(()) => {
                return File::open(out)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| Error::io(out, "syncing the directory", e));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(&path, "recording the job", e)),
        }
    }
    let found = read_job(out)?.ok_or_else(|| Error::BadOutput {
        path: path.clone(),
        problem: "vanished while it was being read".into(),
    })?;
    check_same_job(out, &found, record)
}

/// Refuses `wanted` in an OUT holding `found`: another job, or this one
/// from input files that changed since it began.
fn check_same_job(out: &Path, found: &JobRecord, wanted: &JobRecord) -> Result<()> {
    let mut differences = spec_differences(&found.spec, &wanted.spec);
    if differences.is_empty() && found.block_sizes != wanted.block_sizes {
        differences.push("the block files' sizes".into());
    }
    if differences.is_empty() && found.metadata_files != wanted.metadata_files {
        differences.push("the array's metadata".into());
    }
    if !differences.is_empty() {
        return Err(Error::BadOutput {
            path: out.to_path_buf(),
            problem: format!(
                "holds blocks of another job: {} differ ({}); run every part with the same IN, \
                 --shape, --format, --dataset, --values, --compress, --shard and --part K/N, \
                 or choose another OUT",
                differences.len(),
                differences.join("; ")
            ),
        });
    }
    check_inputs(out, &found.inputs, &wanted.inputs)
}

/// Refuses input files whose identity `now` is not the one `recorded`,
/// naming them.
fn check_inputs(out: &Path, recorded: &[InputIdentity], now: &[InputIdentity]) -> Result<()> {
    let changed: Vec<String> = recorded
        .iter()
        .zip(now)
        .filter(|(was, is)| was != is)
        .map(|(was, is)| describe_change(was, is))
        .collect();
    if !changed.is_empty() || recorded.len() != now.len() {
        return Err(Error::BadOutput {
            path: out.to_path_buf(),
            problem: format!(
                "holds blocks made from an input that has changed since ({} file(s): {}); its \
                 blocks may not match the input now. Start over in an empty OUT (or with \
                 --overwrite, one part)",
                changed.len(),
                changed
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        });
    }
    Ok(())
}

fn describe_change(was: &InputIdentity, is: &InputIdentity) -> String {
    let path = if was.path == is.path {
        is.path.display().to_string()
    } else {
        format!("{} (was {})", is.path.display(), was.path.display())
    };
    format!("{path}: {}", is.identity.changes_from(&was.identity))
}

/// The settings in which two specs differ, for a person: each named as
/// the option that sets it, with its value in OUT's record and in this run.
fn spec_differences(found: &JobSpec, wanted: &JobSpec) -> Vec<String> {
    let (a, b) = (
        serde_json::to_value(found).unwrap_or_default(),
        serde_json::to_value(wanted).unwrap_or_default(),
    );
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return vec!["the job".into()];
    };
    a.iter()
        .filter(|(key, value)| b.get(*key) != Some(value))
        .map(|(key, value)| {
            let show = |value: &serde_json::Value| match value {
                serde_json::Value::Null => "none".to_string(),
                value => value.to_string(),
            };
            format!(
                "{}: {} in OUT's record, {} in this run",
                setting_name(key),
                show(value),
                show(&b.get(key).cloned().unwrap_or_default())
            )
        })
        .collect()
}

/// The option (or what) that sets the [`JobSpec`] field `key`.
fn setting_name(key: &str) -> &str {
    match key {
        "input" => "IN",
        "dataset" => "--dataset",
        "format" => "--format",
        "dtype" => "the dtype and byte order",
        "axis_order" => "the axis order",
        "array" => "the array's shape",
        "input_block" => "the input's block shape",
        "output_block" => "--shape (or --shard)",
        "parts" => "the N of --part K/N",
        "cuts" => "the cuts into parts",
        "compress" => "--compress",
        "shard_chunks" => "--shard's chunks",
        "values" => "--values",
        other => other,
    }
}

/// The expected length of each output block's file, by rank.
fn expected_len(record: &JobRecord, tree: &FileTree, rank: u64) -> Option<u64> {
    let shape = tree.file_shape(rank);
    record
        .block_sizes
        .iter()
        .find(|(s, _)| *s == shape)
        .map(|(_, len)| *len)
}

/// Whether output block `rank`'s file, whose entry in OUT is `meta` (not
/// followed: a symlink is no block of ours), is complete: a regular file,
/// of its exact length when block files have one.
fn block_is_done(record: &JobRecord, tree: &FileTree, rank: u64, meta: &fs::Metadata) -> bool {
    let exact =
        record.block_sizes.is_empty() || expected_len(record, tree, rank) == Some(meta.len());
    meta.is_file() && exact
}

/// Gives `each` every entry of `out` in the directories of `tree` that
/// exist, with the block it names if it names one. Each directory is read
/// once, and nothing else is asked of the filesystem: a new OUT costs one
/// read, whatever the number of blocks. Directories are not followed
/// through symlinks; one that cannot be read holds nothing. `cancel`, set,
/// stops the walk with [`Error::Cancelled`].
pub fn walk_output(
    out: &Path,
    tree: &FileTree,
    cancel: Option<&AtomicBool>,
    mut each: impl FnMut(Option<u64>, &fs::DirEntry) -> Result<()>,
) -> Result<()> {
    let mut pending = vec![(Dir::Root, out.to_path_buf())];
    while let Some((dir, path)) = pending.pop() {
        let Ok(entries) = fs::read_dir(&path) else {
            continue;
        };
        for entry in entries {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(Error::Cancelled);
            }
            let Ok(entry) = entry else {
                continue;
            };
            let name = entry.file_name();
            match name.to_str().and_then(|name| tree.lookup(dir, name)) {
                Some(Node::Dir(sub)) => {
                    if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                        pending.push((sub, entry.path()));
                    }
                }
                Some(Node::Block(rank)) => each(Some(rank), &entry)?,
                None => each(None, &entry)?,
            }
        }
    }
    Ok(())
}

/// Which blocks of the job `record` are complete in `out` (by rank in the
/// whole output grid): one read of each directory, one stat of each block
/// file found ([`walk_output`]).
pub fn done_blocks(
    out: &Path,
    record: &JobRecord,
    cancel: Option<&AtomicBool>,
) -> Result<DoneBlocks> {
    done_blocks_of(out, record, cancel, |_| true)
}

/// [`done_blocks`] among the blocks whose rank `wanted` accepts: the
/// others found are not stat'ed.
pub fn done_blocks_of(
    out: &Path,
    record: &JobRecord,
    cancel: Option<&AtomicBool>,
    wanted: impl Fn(u64) -> bool,
) -> Result<DoneBlocks> {
    let tree = record.spec.tree();
    let mut done = DoneBlocks {
        done: Vec::new(),
        count: 0,
    };
    walk_output(out, &tree, cancel, |rank, entry| {
        let Some(rank) = rank.filter(|&rank| wanted(rank)) else {
            return Ok(());
        };
        if entry
            .metadata()
            .is_ok_and(|meta| block_is_done(record, &tree, rank, &meta))
        {
            if done.done.is_empty() {
                done.done = vec![false; tree.block_count() as usize];
            }
            done.done[rank as usize] = true;
            done.count += 1;
        }
        Ok(())
    })?;
    Ok(done)
}

/// The complete blocks of a job's OUT ([`done_blocks`]).
#[derive(Clone, Debug, Default)]
pub struct DoneBlocks {
    /// By rank; empty when none is.
    done: Vec<bool>,
    count: u64,
}

impl DoneBlocks {
    pub fn contains(&self, rank: u64) -> bool {
        self.done.get(rank as usize).copied().unwrap_or(false)
    }

    /// How many are complete.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// A part's progress, from the files in OUT.
#[derive(Clone, Debug, Serialize)]
pub struct PartProgress {
    pub part: u64,
    pub blocks_done: u64,
    pub blocks: u64,
}

/// Every part's progress (a directory that cannot be read holds no block).
pub fn progress(out: &Path, record: &JobRecord) -> Vec<PartProgress> {
    let done = done_blocks(out, record, None).unwrap_or_default();
    let output = record.spec.output();
    (0..record.spec.parts)
        .map(|part| {
            let ranges = record.spec.part_blocks(part);
            let mut progress = PartProgress {
                part,
                blocks_done: 0,
                blocks: 0,
            };
            for index in IndexBox::new(ranges) {
                progress.blocks += 1;
                progress.blocks_done += done.contains(output.linear(&index)) as u64;
            }
            progress
        })
        .collect()
}

/// What `finish` found and wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Finished {
    pub blocks: u64,
    pub metadata_files: Vec<String>,
}

/// Checks that every block of the job in `out` is there, complete, and
/// writes the files describing the whole array, each atomically, last;
/// then removes the job's record: a finished OUT holds the array alone.
pub fn finish(out: &Path) -> Result<Finished> {
    let record = read_job(out)?.ok_or_else(|| Error::BadOutput {
        path: out.to_path_buf(),
        problem: format!(
            "holds no {JOB_NAME}: its job was finished already, or it is no directory \
             `rechunkfs rechunk` wrote"
        ),
    })?;
    let unfinished: Vec<PartProgress> = progress(out, &record)
        .into_iter()
        .filter(|p| p.blocks_done < p.blocks)
        .collect();
    if !unfinished.is_empty() {
        let missing: u64 = unfinished.iter().map(|p| p.blocks - p.blocks_done).sum();
        let parts: Vec<String> = unfinished.iter().map(|p| p.part.to_string()).collect();
        return Err(Error::BadOutput {
            path: out.to_path_buf(),
            problem: format!(
                "{missing} block(s) are missing or incomplete, in part(s) {} of {}; run those \
                 parts again (`rechunk ... --part K/{}` with the same arguments), then finish",
                parts.join(","),
                record.spec.parts,
                record.spec.parts
            ),
        });
    }
    let mut written = Vec::new();
    for (name, text) in &record.metadata_files {
        write_atomically(&out.join(name), text.as_bytes())?;
        written.push(name.clone());
    }
    File::open(out)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(out, "syncing the directory", e))?;
    let record_path = out.join(JOB_NAME);
    fs::remove_file(&record_path).map_err(|e| Error::io(&record_path, "removing", e))?;
    Ok(Finished {
        blocks: record.spec.output().count(),
        metadata_files: written,
    })
}

/// Writes `bytes` to `path` atomically: a temporary of this process,
/// synced, renamed into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let leaf = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{leaf}.{}.partial", run_tag(0)));
    let mut file = crate::sys::files::create_fresh(&temporary)
        .map_err(|e| Error::io(&temporary, "creating", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&temporary, "writing", e))?;
    fs::rename(&temporary, path).map_err(|e| Error::io(path, "renaming into place", e))
}

/// Each kind of block file of `tree` (by the array shape it holds), with
/// `len_of` its length: the per-dimension extents are few (a regular one
/// and an edge one), so this is at most 2^N shapes, whatever the grid.
pub fn block_sizes(
    tree: &FileTree,
    mut len_of: impl FnMut(&[u64]) -> Result<u64>,
) -> Result<Vec<(Vec<u64>, u64)>> {
    let grid = tree.grid();
    let choices: Vec<Vec<usize>> = (0..grid.ndim())
        .map(|d| {
            let last = grid.axis(d).count() - 1;
            if last == 0 {
                vec![0]
            } else {
                vec![0, last]
            }
        })
        .collect();
    let mut sizes = BTreeMap::new();
    for pick in IndexBox::grid(&choices.iter().map(Vec::len).collect::<Vec<_>>()) {
        let index: Vec<usize> = pick
            .iter()
            .enumerate()
            .map(|(d, &c)| choices[d][c])
            .collect();
        let block: Region = grid.block(&index);
        let shape = tree.files().file_box(&block).shape;
        if let std::collections::btree_map::Entry::Vacant(entry) = sizes.entry(shape) {
            let len = len_of(entry.key())?;
            entry.insert(len);
        }
    }
    Ok(sizes.into_iter().collect())
}
