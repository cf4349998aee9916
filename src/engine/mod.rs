//! The executor: runs a [`Plan`] over an [`InputArray`], reading read blocks
//! in C order and writing each write block as soon as it is complete, into
//! whatever [`BlockSink`] provides the output files (real files for
//! `rechunk`, the staging area for the view).
//!
//! Memory: a read block is read, step by step (`Plan::steps`: slabs of it
//! along the first dimension), into one buffer per write block each step
//! touches (its *pieces*); a piece stays until its part of the write block
//! is written, which gathers from the pieces. [`crate::engine::pieces`] moves the
//! bytes between files and pieces, one I/O call per contiguous run of a
//! file. The calling thread reads while a writer thread writes the slab of the
//! completed write block that the previous step finished, so the disk and
//! both cores work at once, even when the whole array is one read block (a
//! split or a merge); the bytes held are exactly what the planner
//! simulates: the step being read, the slab in flight, and the waiting
//! pieces.
//!
//! Every data I/O goes through [`seekio`], whose counts must equal the
//! plan's predictions; both threads log their calls and the reader counts
//! them in the plan's order (a read block's reads, then its write block's
//! writes), so tests can hold the executor to that. Steps are cut only
//! where that count cannot change.

pub mod pieces;
mod pool;
pub mod seekio;
mod sink;

use std::collections::HashMap;
use std::fs::File;
use std::io::IoSliceMut;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use lru::LruCache;
use serde::Serialize;

use crate::array::geometry::{IndexBox, Partition, Region};
use crate::engine::pieces::{PackingBuffer, PieceGrid, RowLayout};
use crate::error::{Error, Result};
use crate::format::hdf5::Hdf5BlockReader;
use crate::format::Storage;
use crate::input::{HeaderCheck, InputArray, InputBlock};
use crate::plan::Plan;
use crate::sys::pagecache;
use pool::BufferPool;
use seekio::{FileKey, SeekCounter, SeekLog};
pub use sink::{reopen, BlockSink, OpenOutput, OutputFiles, OutputTarget};

/// Told of each input file just before its bytes are first read (a view's
/// staging area records the file's size and mtime, so that a remount can
/// tell whether an input it read has changed since).
pub trait InputWitness: Sync {
    /// Input block `rank` is about to be read; `meta` is a stat of its file
    /// when the reader has it open (libhdf5 opens its own, and absent chunks
    /// have none).
    fn reading(
        &self,
        rank: u64,
        block: &InputBlock,
        meta: Option<&std::fs::Metadata>,
    ) -> Result<()>;
}

/// Tells `witness`, if there is one, that input block `rank` is about to be read.
fn tell_witness(
    witness: Option<&dyn InputWitness>,
    rank: u64,
    block: &InputBlock,
    meta: Option<&std::fs::Metadata>,
) -> Result<()> {
    witness.map_or(Ok(()), |witness| witness.reading(rank, block, meta))
}

/// Reads absent chunk `rank` (of `block`) into the pieces `buffers`: there
/// is nothing to read, so the segments a present chunk would cost are
/// counted in `counter` and the fill value is laid into the pieces. Its
/// absence is what `witness` is told of: a chunk written later is a
/// change. Returns the bytes filled.
fn fill_absent(
    witness: Option<&dyn InputWitness>,
    rank: u64,
    block: &InputBlock,
    fill: &[u8],
    layout: &RowLayout,
    buffers: &mut [Vec<u8>],
    counter: &mut SeekCounter,
) -> Result<u64> {
    tell_witness(witness, rank, block, None)?;
    let mut filled = 0;
    layout.for_each_segment(|segment| {
        counter.read(FileKey::Input(rank), segment.offset, segment.len);
        filled += segment.len;
        layout.fill_segment(segment, buffers, fill)
    })?;
    Ok(filled)
}

/// What a run did: counted, not estimated.
///
/// Reads that libhdf5 makes, and reads of absent Zarr chunks (which make
/// no I/O at all: they are the fill value), are counted as the segments
/// and bytes a contiguous file would cost, so counts stay comparable with
/// the plan; `fill_bytes` says how many bytes came from fill values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RunStats {
    pub read_seeks: u64,
    pub write_seeks: u64,
    pub bytes_read: u64,
    /// Bytes of absent chunks produced from the fill value, without I/O
    /// (included in `bytes_read`).
    pub fill_bytes: u64,
    pub bytes_written: u64,
    /// Input bytes the kernel was asked to read ahead (headers to check
    /// included; a file evicted from the open-file cache and reopened is
    /// asked for again). Advice is no I/O of ours, but a careless window
    /// reads the disk over and over: this bounds it in tests.
    pub advised_bytes: u64,
    /// Most array bytes held in memory at once.
    pub peak_held_bytes: u64,
    /// Array bytes held now (between read blocks: the waiting pieces).
    pub held_bytes: u64,
    pub read_blocks_done: u64,
    pub read_blocks_total: u64,
    pub output_blocks_done: u64,
    pub output_blocks_total: u64,
}

impl RunStats {
    pub fn seeks(&self) -> u64 {
        self.read_seeks + self.write_seeks
    }
}

/// Input bytes the kernel is asked to read ahead of the executor, at most.
const PREFETCH_BYTES: u64 = 32 << 20;

/// Output segments at least this long are handed to the disk as soon as
/// they are written ([`pagecache::start_writeback_of`]): a slab of a block
/// much larger than a step. Shorter ones wait for their block to complete
/// (a whole block is one call then, not one per segment).
const WRITEBACK_MIN_BYTES: u64 = 1 << 20;

/// What the process needs beside the array bytes it holds (code, libhdf5,
/// packing buffer, allocator slack: 20-50 MiB measured on W1 and W2).
const PROCESS_BYTES: u64 = 48 << 20;

/// The read-ahead window for `plan`. Inside a memory cgroup the page cache
/// counts against the same limit as the array bytes held, and pages read
/// ahead into a full cgroup are reclaimed before they are used, then read
/// again: the window is then a quarter of what the limit leaves beside the
/// plan's peak and the process itself. The input file about to be read is
/// always advised, whatever the window.
fn read_ahead_bytes(plan: &Plan, cgroup_limit: Option<u64>) -> u64 {
    match cgroup_limit {
        None => PREFETCH_BYTES,
        Some(limit) => {
            let spare = limit.saturating_sub(plan.prediction.peak_bytes + PROCESS_BYTES);
            (spare / 4).min(PREFETCH_BYTES)
        }
    }
}

/// An input block's file, as the executor keeps it open.
enum InputHandle {
    /// Opened to be read ahead; its header not yet checked.
    Opened(File),
    /// Raw C-order bytes at `data_offset`.
    Contiguous { file: File, data_offset: u64 },
    /// Read through libhdf5.
    Hdf5(Hdf5BlockReader),
}

impl InputHandle {
    /// Readies input block `rank` for reading (in `opened` if the file is
    /// open already), checking its header if the scan did not
    /// ([`InputArray::confirmed_storage`]).
    fn open(
        input: &InputArray,
        rank: u64,
        opened: Option<File>,
        witness: Option<&dyn InputWitness>,
    ) -> Result<InputHandle> {
        let block = &input.blocks[rank as usize];
        let hdf5 = |dataset: &str| {
            Ok(InputHandle::Hdf5(Hdf5BlockReader::open(
                &block.path,
                dataset,
            )?))
        };
        if let (None, Storage::Hdf5Dataset { dataset }) = (&block.check, &block.storage) {
            // Nothing to check, and libhdf5 opens the file itself.
            tell_witness(witness, rank, block, None)?;
            return hdf5(dataset);
        }
        let file = match opened {
            Some(file) => file,
            None => File::open(&block.path).map_err(|e| Error::io(&block.path, "opening", e))?,
        };
        // One stat serves the witness (size and mtime) and the header check
        // (the length); with neither, none is made.
        let meta = match (witness, &block.check) {
            (None, None) => None,
            _ => Some(
                file.metadata()
                    .map_err(|e| Error::io(&block.path, "stat", e))?,
            ),
        };
        tell_witness(witness, rank, block, meta.as_ref())?;
        match input.confirmed_storage(rank as usize, &file, meta.as_ref())? {
            Storage::Contiguous { data_offset } => {
                Ok(InputHandle::Contiguous { file, data_offset })
            }
            Storage::Hdf5Dataset { dataset } => hdf5(&dataset),
            Storage::Absent { .. } => Err(Error::bad_input(
                &block.path,
                "an absent chunk has no file to read",
            )),
        }
    }

    /// The open file, where the bytes are read with pread.
    fn file(&self) -> Option<&File> {
        match self {
            InputHandle::Opened(file) | InputHandle::Contiguous { file, .. } => Some(file),
            InputHandle::Hdf5(_) => None,
        }
    }
}

/// Asks the kernel for `len` bytes at `start` of an input file and, if its
/// header is still to be checked, for the header too: with the data when
/// they follow it (one request, not two), on its own before a later part
/// of a large block (not the bytes between: W2 under a cap read its 10 MB
/// blocks from the start for every part and took 2.5x as long).
/// Returns the bytes asked for.
fn read_ahead_input(file: &File, check: Option<&HeaderCheck>, start: u64, len: u64) -> u64 {
    match check {
        Some(check) if start <= check.header.len() as u64 => {
            pagecache::read_ahead(file, 0, start + len);
            start + len
        }
        Some(check) => {
            let header = check.header.len() as u64;
            pagecache::read_ahead(file, 0, header);
            pagecache::read_ahead(file, start, len);
            header + len
        }
        None => {
            pagecache::read_ahead(file, start, len);
            len
        }
    }
}

/// The pieces of one write block received so far, one per step
/// (`Plan::steps`) overlapping it, C order over those steps; taken out a
/// slab at a time as they are handed to the writer.
struct PendingWrite {
    step_ranges: Vec<Range<usize>>,
    pieces: Vec<Option<Vec<u8>>>,
}

impl PendingWrite {
    /// The slot of the piece from step `step_index`.
    fn slot(&self, step_index: &[usize]) -> usize {
        self.step_ranges
            .iter()
            .zip(step_index)
            .fold(0usize, |acc, (r, &k)| acc * r.len() + (k - r.start))
    }
}

/// Runs `plan` over `input` into `sink`. `progress` is called after every
/// read block, and within a read block cut in steps after each of its
/// slabs is written; `cancel` stops the run between read blocks.
pub struct Executor<'a> {
    plan: &'a Plan,
    input: &'a InputArray,
    elem: u64,
    inputs: LruCache<u64, InputHandle>,
    pending: HashMap<u64, PendingWrite>,
    counter: SeekCounter,
    /// This read block's reads, counted once the previous write block's
    /// writes are (see [`SeekLog`]).
    reads: SeekLog,
    /// Writes of the previous read block's write block, and of this one's,
    /// as the writer reports them (slabs of one write block can finish
    /// during the next read block's first step).
    writes_before: SeekLog,
    writes_now: SeekLog,
    /// Rank of the read block being read.
    current_read: u64,
    held: u64,
    stats: RunStats,
    cancel: Option<&'a AtomicBool>,
    witness: Option<&'a dyn InputWitness>,
    /// How many input bytes to ask the kernel for ahead of the reads.
    read_ahead: u64,
    ahead: ReadAheadCursor,
    /// Where small rows are read before being copied to their pieces.
    read_packing: PackingBuffer,
    /// Whether inputs' pages are dropped once read (arrays the page cache
    /// cannot hold: [`crate::sys::cgroup::page_cache_cannot_hold`]).
    drop_inputs: bool,
    /// Elements of partly read input blocks still to be read, by rank.
    unread: HashMap<u64, u64>,
    pool: BufferPool,
}

/// Where [`Executor::read_ahead`] has got to in the plan's reads.
#[derive(Default)]
struct ReadAheadCursor {
    /// The read block whose inputs are being advised.
    block: u64,
    /// Its inputs not yet advised, the next one last.
    inputs: Vec<Vec<usize>>,
    /// Bytes advised and not yet read.
    outstanding: u64,
}

/// A slab of a completed write block (all of it, or the part before a
/// step's end) handed to the writer thread: its pieces, one per step
/// overlapping it, C order over those steps.
struct WriteJob {
    write_box: Region,
    /// Rank of the read block that completes the write block.
    read_block: u64,
    pieces: Vec<Vec<u8>>,
    bytes: u64,
}

/// What the writer thread reports for one job.
struct WriteReport {
    read_block: u64,
    writes: SeekLog,
    blocks_completed: u64,
    /// The job's pieces, written, back for reuse ([`BufferPool`]).
    pieces: Vec<Vec<u8>>,
}

/// The writer thread's state: output blocks' remaining volumes, the write
/// log, and the buffer small row parts are packed through.
struct Writer<'a> {
    plan: &'a Plan,
    elem: u64,
    remaining: HashMap<u64, u64>,
    packing: PackingBuffer,
}

impl<'a> Executor<'a> {
    pub fn new(plan: &'a Plan, input: &'a InputArray) -> Executor<'a> {
        Executor {
            plan,
            input,
            elem: input.dtype.size as u64,
            inputs: LruCache::new(
                NonZeroUsize::new(crate::sys::limits::input_files_kept_open())
                    .unwrap_or(NonZeroUsize::MIN),
            ),
            pending: HashMap::new(),
            counter: SeekCounter::default(),
            reads: SeekLog::default(),
            writes_before: SeekLog::default(),
            writes_now: SeekLog::default(),
            current_read: 0,
            held: 0,
            stats: RunStats {
                read_blocks_total: plan.read.count(),
                output_blocks_total: plan.output.count(),
                ..RunStats::default()
            },
            cancel: None,
            witness: None,
            read_ahead: read_ahead_bytes(plan, crate::sys::cgroup::memory_limit()),
            ahead: ReadAheadCursor::default(),
            read_packing: PackingBuffer::new(),
            drop_inputs: crate::sys::cgroup::page_cache_cannot_hold(input.nbytes()),
            unread: HashMap::new(),
            pool: BufferPool::default(),
        }
    }

    pub fn with_cancel(mut self, cancel: &'a AtomicBool) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Tells `witness` of each input file before it is first read.
    pub fn with_witness(mut self, witness: &'a dyn InputWitness) -> Self {
        self.witness = Some(witness);
        self
    }

    /// Runs the whole plan. Steps of read blocks are read on this thread
    /// while the slab of a write block that the previous step completed is
    /// written on another, so the disk and the two cores work at once; at
    /// most one slab is in flight, its pieces still held (the planner counts
    /// them).
    pub fn run(
        mut self,
        sink: &mut (dyn BlockSink + Send),
        mut progress: impl FnMut(&RunStats),
    ) -> Result<RunStats> {
        let plan = self.plan;
        let elem = self.elem;
        let sink = parking_lot::Mutex::new(sink);
        std::thread::scope(|scope| {
            let (jobs, job_queue) = std::sync::mpsc::sync_channel::<WriteJob>(1);
            let (reports_tx, reports) = std::sync::mpsc::channel::<Result<WriteReport>>();
            let sink = &sink;
            let writer = std::thread::Builder::new()
                .name("writer".into())
                .spawn_scoped(scope, move || {
                    let mut writer = Writer::new(plan, elem);
                    for job in job_queue {
                        let report = writer.write(job, &mut **sink.lock());
                        if reports_tx.send(report).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| Error::os("thread spawn", "starting the writer", e))?;
            let result = self.read_and_hand_over(&jobs, &reports, sink, &mut progress);
            drop(jobs);
            if writer.join().is_err() {
                return Err(Error::BadOutput {
                    path: "writer".into(),
                    problem: "the writer thread panicked".into(),
                });
            }
            result
        })
    }

    /// The reader's side of [`run`]: every read block in C order, each in
    /// its steps (`Plan::steps`); after each step, the slab of the read
    /// block's completed write block that the step finishes goes to the
    /// writer, which writes it while the next step is read.
    fn read_and_hand_over(
        &mut self,
        jobs: &std::sync::mpsc::SyncSender<WriteJob>,
        reports: &std::sync::mpsc::Receiver<Result<WriteReport>>,
        sink: &parking_lot::Mutex<&mut (dyn BlockSink + Send)>,
        progress: &mut impl FnMut(&RunStats),
    ) -> Result<RunStats> {
        let plan = self.plan;
        let step_axis = plan.steps.axis(0);
        let mut in_flight: Option<u64> = None;
        for read_index in IndexBox::grid(&plan.read.grid_shape()) {
            if self.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                if in_flight.is_some() {
                    let _ = reports.recv();
                }
                return Err(Error::Cancelled);
            }
            self.current_read = plan.read.linear(&read_index);
            let read_box = plan.read.block(&read_index);
            let completed = plan.completed_write_block(&read_index);
            let steps = step_axis.overlapping(read_box.origin[0], read_box.end(0));
            for step in steps.clone() {
                let mut step_index = read_index.clone();
                step_index[0] = step;
                let read_result = self.read_step(&step_index);
                // One slab in flight at a time: wait for the last one.
                if let Some(bytes) = in_flight.take() {
                    self.finish_write(reports, bytes)?;
                }
                read_result?;
                let Some(write_index) = &completed else {
                    continue;
                };
                // The first step's slab also takes the parts of the write
                // block that earlier read blocks hold.
                let from = if step == steps.start {
                    0
                } else {
                    step_axis.start(step)
                };
                let Some(slab) = slab_of(&plan.write.block(write_index), from, step_axis.end(step))
                else {
                    continue;
                };
                if step > steps.start {
                    // The previous slab's bytes are in: show them (the read
                    // block's own progress comes after its last step).
                    self.refresh_stats();
                    progress(&self.stats);
                }
                let job = self.take_write_job(write_index, &slab)?;
                in_flight = Some(job.bytes);
                if jobs.send(job).is_err() {
                    // The writer stopped: its report says why.
                    if let Some(bytes) = in_flight.take() {
                        self.finish_write(reports, bytes)?;
                    }
                    return Err(Error::BadOutput {
                        path: "writer".into(),
                        problem: "the writer thread stopped".into(),
                    });
                }
            }
            // The plan's order: the previous write block's writes (all done
            // by now: its last slab was waited for after the first step),
            // then this read block's reads.
            self.writes_before.replay_into(&mut self.counter);
            self.reads.replay_into(&mut self.counter);
            self.writes_before = std::mem::take(&mut self.writes_now);
            self.stats.read_blocks_done += 1;
            self.refresh_stats();
            // The sink's own work between read blocks (blocks extracted on
            // demand) takes its lock, so it never runs inside a write job;
            // the held bytes it is told include the slab in flight and the
            // buffers kept for reuse, the memory its work must fit beside.
            let mut told = self.stats;
            told.held_bytes += self.pool.kept_bytes();
            sink.lock().between_steps(&told)?;
            progress(&self.stats);
        }
        self.current_read = u64::MAX;
        if let Some(bytes) = in_flight.take() {
            self.finish_write(reports, bytes)?;
        }
        self.writes_before.replay_into(&mut self.counter);
        self.refresh_stats();
        debug_assert!(self.pending.is_empty() && self.held == 0);
        Ok(self.stats)
    }

    /// Waits for the slab in flight, files its writes under its read block
    /// (to be counted in the plan's order) and frees it.
    fn finish_write(
        &mut self,
        reports: &std::sync::mpsc::Receiver<Result<WriteReport>>,
        bytes: u64,
    ) -> Result<()> {
        let report = reports.recv().map_err(|_| Error::BadOutput {
            path: "writer".into(),
            problem: "the writer thread stopped without reporting".into(),
        })??;
        let log = if report.read_block == self.current_read {
            &mut self.writes_now
        } else {
            &mut self.writes_before
        };
        log.extend(report.writes);
        self.stats.output_blocks_done += report.blocks_completed;
        self.held -= bytes;
        let peak = self.plan.prediction.peak_bytes;
        for piece in report.pieces {
            self.pool.give(piece, self.held, peak);
        }
        Ok(())
    }

    /// The bytes of input `input_index` that read block `read_box` reads,
    /// as one span of its file (first to last byte), for contiguous inputs.
    fn input_span(&self, input_index: &[usize], read_box: &Region) -> Option<(u64, u64, u64)> {
        let plan = self.plan;
        let rank = plan.input.linear(input_index);
        let Storage::Contiguous { data_offset } = self.input.blocks[rank as usize].storage else {
            return None;
        };
        let block_box = plan.input.block(input_index);
        let region = block_box.intersect(read_box)?;
        let file_box = self.input.files.file_box(&block_box);
        let file_strides = crate::array::geometry::strides(&file_box.shape);
        let local = region.relative_to(&file_box);
        let first = crate::array::geometry::linear_offset(&local.origin, &file_strides);
        let last_coords: Vec<u64> = (0..local.ndim()).map(|d| local.end(d) - 1).collect();
        let last = crate::array::geometry::linear_offset(&last_coords, &file_strides);
        Some((
            rank,
            data_offset + first * self.elem,
            (last + 1 - first) * self.elem,
        ))
    }

    /// Keeps the kernel reading ahead of us: input files are advised
    /// (`POSIX_FADV_WILLNEED`) in the order they will be read until the
    /// bytes advised and not yet read reach the window, so the disk works
    /// while we copy and write. Called before every input read, it always
    /// covers that read. Advice only: no data is copied and nothing is
    /// counted as a seek. The files opened for it stay in the input cache
    /// for the read itself.
    fn read_ahead(&mut self) {
        let total = self.plan.read.count();
        while self.ahead.block < total
            && (self.ahead.outstanding == 0 || self.ahead.outstanding < self.read_ahead)
        {
            let read_box = self
                .plan
                .read
                .block(&self.plan.read.unravel(self.ahead.block));
            if self.ahead.inputs.is_empty() {
                self.ahead.inputs = IndexBox::new(self.plan.input.overlapping(&read_box)).collect();
                self.ahead.inputs.reverse();
            }
            let Some(input_index) = self.ahead.inputs.pop() else {
                self.ahead.block += 1;
                continue;
            };
            if self.ahead.inputs.is_empty() {
                self.ahead.block += 1;
            }
            let Some((rank, start, len)) = self.input_span(&input_index, &read_box) else {
                continue;
            };
            self.ahead.outstanding += len;
            let block = &self.input.blocks[rank as usize];
            if !self.inputs.contains(&rank) {
                // A file that cannot be opened is left for the read to report.
                let Ok(file) = File::open(&block.path) else {
                    continue;
                };
                self.inputs.put(rank, InputHandle::Opened(file));
            }
            self.stats.advised_bytes += match self.inputs.get(&rank) {
                Some(InputHandle::Opened(file)) => {
                    read_ahead_input(file, block.check.as_deref(), start, len)
                }
                Some(InputHandle::Contiguous { file, .. }) => {
                    read_ahead_input(file, None, start, len)
                }
                Some(InputHandle::Hdf5(_)) | None => 0,
            };
        }
    }

    fn refresh_stats(&mut self) {
        self.stats.held_bytes = self.held;
        self.stats.read_seeks = self.counter.read_seeks;
        self.stats.write_seeks = self.counter.write_seeks;
        self.stats.bytes_read = self.counter.bytes_read;
        // Writes wait to be counted in the plan's order, but progress need
        // not: a stepped read block's slabs show as they are written.
        self.stats.bytes_written = self.counter.bytes_written
            + self.writes_before.written_bytes()
            + self.writes_now.written_bytes();
    }

    fn hold(&mut self, bytes: u64) {
        self.held += bytes;
        self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(self.held);
    }

    /// Reads step `step_index` (of `Plan::steps`) into its pieces, one per
    /// write block it overlaps, and files them under their write blocks.
    fn read_step(&mut self, step_index: &[usize]) -> Result<()> {
        let plan = self.plan;
        let step_box = plan.steps.block(step_index);
        let grid = PieceGrid::new(&plan.write, &step_box);
        let lens: Vec<usize> = grid.volumes().map(|v| (v * self.elem) as usize).collect();
        let peak = plan.prediction.peak_bytes;
        let mut buffers = self.pool.take_step(&lens, self.held, peak);
        self.hold(step_box.volume() * self.elem);

        for input_index in IndexBox::new(plan.input.overlapping(&step_box)) {
            let block = plan.input.block(&input_index);
            let Some(region) = block.intersect(&step_box) else {
                continue;
            };
            let file_box = self.input.files.file_box(&block);
            let rank = plan.input.linear(&input_index);
            self.read_ahead();
            self.read_input(rank, &file_box, &region, &grid, &mut buffers)?;
            if let Some((_, _, len)) = self.input_span(&input_index, &step_box) {
                self.ahead.outstanding = self.ahead.outstanding.saturating_sub(len);
            }
            if self.drop_inputs {
                let unread = self.unread.entry(rank).or_insert(block.volume());
                *unread = unread.saturating_sub(region.volume());
                if *unread == 0 {
                    self.unread.remove(&rank);
                    self.finished_with_input(rank);
                }
            }
        }

        for (local, buffer) in buffers.into_iter().enumerate() {
            let write_index = grid.cut_index(local);
            let write_rank = plan.write.linear(&write_index);
            let pending = self.pending.entry(write_rank).or_insert_with(|| {
                let step_ranges = plan.steps.overlapping(&plan.write.block(&write_index));
                let count = step_ranges.iter().map(|r| r.len()).product();
                PendingWrite {
                    step_ranges,
                    pieces: (0..count).map(|_| None).collect(),
                }
            });
            let slot = pending.slot(step_index);
            pending.pieces[slot] = Some(buffer);
        }
        Ok(())
    }

    /// Every byte of input `rank` the plan needs has been read (each is
    /// read once): its file is closed and its pages dropped
    /// ([`pagecache::drop_cached_pages`]).
    fn finished_with_input(&mut self, rank: u64) {
        if let Some(file) = self.inputs.pop(&rank).as_ref().and_then(InputHandle::file) {
            pagecache::drop_cached_pages(file);
        }
    }

    fn read_input(
        &mut self,
        rank: u64,
        file_box: &Region,
        region: &Region,
        grid: &PieceGrid,
        buffers: &mut [Vec<u8>],
    ) -> Result<()> {
        let block = &self.input.blocks[rank as usize];
        if let Storage::Absent { fill } = &block.storage {
            let layout = RowLayout::new(region, file_box, self.elem, grid);
            self.stats.fill_bytes += fill_absent(
                self.witness,
                rank,
                block,
                fill,
                &layout,
                buffers,
                &mut self.counter,
            )?;
            return Ok(());
        }
        let handle = match self.inputs.pop(&rank) {
            Some(InputHandle::Opened(file)) => {
                InputHandle::open(self.input, rank, Some(file), self.witness)?
            }
            Some(handle) => handle,
            None => InputHandle::open(self.input, rank, None, self.witness)?,
        };
        self.inputs.put(rank, handle);
        let Some(handle) = self.inputs.get(&rank) else {
            return Err(Error::bad_input(
                &block.path,
                "input handle vanished from cache",
            ));
        };
        let key = FileKey::Input(rank);
        let layout = RowLayout::new(region, file_box, self.elem, grid);
        match handle {
            InputHandle::Contiguous { file, data_offset } => {
                let (reads, packing) = (&mut self.reads, &mut self.read_packing);
                layout.for_each_segment(|segment| {
                    layout.read_segment(
                        file,
                        &block.path,
                        *data_offset,
                        segment,
                        buffers,
                        packing,
                    )?;
                    reads.read(key, data_offset + segment.offset, segment.len);
                    Ok(())
                })
            }
            InputHandle::Hdf5(reader) => {
                // libhdf5 moves the bytes; count the same segments a
                // contiguous read would make, so plans stay comparable.
                let reads = &mut self.reads;
                layout.for_each_segment(|segment| {
                    reads.read(key, segment.offset, segment.len);
                    Ok(())
                })?;
                for (local, buffer) in buffers.iter_mut().enumerate() {
                    let piece = grid.piece_box(local);
                    if let Some(part) = piece.intersect(region) {
                        let in_file = part.relative_to(file_box);
                        let in_piece = part.relative_to(&piece);
                        reader.read_box(
                            &in_file.origin,
                            &part.shape,
                            buffer,
                            &piece.shape,
                            &in_piece.origin,
                        )?;
                    }
                }
                Ok(())
            }
            InputHandle::Opened(_) => Err(Error::bad_input(
                &block.path,
                "read before its header was checked",
            )),
        }
    }

    /// Takes the pieces of `slab`, a slab of the completed write block
    /// `write_index`, out of the pending store, for the writer.
    fn take_write_job(&mut self, write_index: &[usize], slab: &Region) -> Result<WriteJob> {
        let plan = self.plan;
        let write_rank = plan.write.linear(write_index);
        let pending = self.pending.get_mut(&write_rank).ok_or_else(|| {
            Error::BadArgument(format!(
                "plan error: write block {write_index:?} completed with no data"
            ))
        })?;
        let pieces: Vec<Vec<u8>> = IndexBox::new(plan.steps.overlapping(slab))
            .map(|step_index| {
                let slot = pending.slot(&step_index);
                pending.pieces[slot].take().ok_or_else(|| {
                    Error::BadArgument(format!(
                        "plan error: write block {write_index:?} written before step {step_index:?} was read"
                    ))
                })
            })
            .collect::<Result<_>>()?;
        if pending.pieces.iter().all(Option::is_none) {
            self.pending.remove(&write_rank);
        }
        Ok(WriteJob {
            write_box: slab.clone(),
            read_block: self.current_read,
            pieces,
            bytes: slab.volume() * self.elem,
        })
    }
}

/// The part of `write_box` whose first coordinate lies in `[from, to)`, if
/// any.
fn slab_of(write_box: &Region, from: u64, to: u64) -> Option<Region> {
    let start = write_box.origin[0].max(from);
    let end = write_box.end(0).min(to);
    (start < end).then(|| {
        let mut slab = write_box.clone();
        slab.origin[0] = start;
        slab.shape[0] = end - start;
        slab
    })
}

impl<'a> Writer<'a> {
    fn new(plan: &'a Plan, elem: u64) -> Writer<'a> {
        Writer {
            plan,
            elem,
            remaining: HashMap::new(),
            packing: PackingBuffer::new(),
        }
    }

    /// Writes a slab of a completed write block to its output blocks,
    /// gathering from its pieces, which go back with the report.
    fn write(&mut self, job: WriteJob, sink: &mut dyn BlockSink) -> Result<WriteReport> {
        let plan = self.plan;
        let write_box = &job.write_box;
        let grid = PieceGrid::new(&plan.steps, write_box);
        let pieces = &job.pieces;
        let mut writes = SeekLog::default();
        let mut blocks_completed = 0;
        for output_index in IndexBox::new(plan.output.overlapping(write_box)) {
            let block = plan.output.block(&output_index);
            let Some(region) = block.intersect(write_box) else {
                continue;
            };
            let rank = plan.output.linear(&output_index);
            if !sink.wants(rank) {
                continue;
            }
            let target = sink.target(rank)?;
            if target.file_shape.len() != block.ndim()
                || target
                    .file_shape
                    .iter()
                    .zip(&block.shape)
                    .any(|(f, b)| f < b)
            {
                return Err(Error::BadOutput {
                    path: target.path.to_path_buf(),
                    problem: format!(
                        "its file holds a {} array, too small for its block of {}",
                        crate::array::geometry::show_shape(target.file_shape),
                        crate::array::geometry::show_shape(&block.shape)
                    ),
                });
            }
            let file_box = Region::new(block.origin.clone(), target.file_shape.to_vec());
            let layout = RowLayout::new(&region, &file_box, self.elem, &grid);
            let key = FileKey::Output(rank);
            let packing = &mut self.packing;
            layout.for_each_segment(|segment| {
                layout.write_segment(
                    target.file,
                    target.path,
                    target.data_offset,
                    segment,
                    pieces,
                    packing,
                )?;
                let at = target.data_offset + segment.offset;
                if segment.len >= WRITEBACK_MIN_BYTES {
                    pagecache::start_writeback_of(target.file, at, segment.len);
                }
                writes.write(key, at, segment.len);
                Ok(())
            })?;
            let remaining = self.remaining.entry(rank).or_insert(block.volume());
            *remaining -= region.volume();
            if *remaining == 0 {
                self.remaining.remove(&rank);
                sink.complete(rank)?;
                blocks_completed += 1;
            }
        }
        Ok(WriteReport {
            read_block: job.read_block,
            writes,
            blocks_completed,
            pieces: job.pieces,
        })
    }
}

/// Reads `region` of the whole array into `dest`, a C-order buffer of the
/// region's shape, straight from the input blocks it overlaps: one read
/// per input block (the span of its part), counted in `counter`, each
/// input told to `witness` first. For extracting one output block ahead
/// of the plan.
pub fn read_region(
    input: &InputArray,
    region: &Region,
    dest: &mut Vec<u8>,
    counter: &mut SeekCounter,
    witness: Option<&dyn InputWitness>,
) -> Result<()> {
    let grid_of_inputs = input.grid();
    let elem = input.dtype.size as u64;
    // One piece: the region itself, as a cell of a partition cut at its bounds.
    let cut = Partition::new(
        (0..region.ndim())
            .map(|d| {
                crate::array::geometry::Axis::from_bounds(vec![
                    0,
                    region.origin[d],
                    region.end(d),
                    input.shape[d],
                ])
            })
            .collect(),
    );
    let grid = PieceGrid::new(&cut, region);
    let buffers = std::slice::from_mut(dest);
    for input_index in IndexBox::new(grid_of_inputs.overlapping(region)) {
        let block_box = grid_of_inputs.block(&input_index);
        let file_box = input.files.file_box(&block_box);
        let Some(part) = block_box.intersect(region) else {
            continue;
        };
        let rank = grid_of_inputs.linear(&input_index);
        let block = &input.blocks[rank as usize];
        let key = FileKey::Input(rank);
        let layout = RowLayout::new(&part, &file_box, elem, &grid);
        if let Storage::Absent { fill } = &block.storage {
            fill_absent(witness, rank, block, fill, &layout, buffers, counter)?;
            continue;
        }
        // One read of the span from the part's first byte to its last, then
        // rows copied out: an out-of-order extraction pays in seeks, and a
        // row-by-row read of a partial input block would make one per row.
        let (mut first, mut end) = (u64::MAX, 0);
        layout.for_each_segment(|segment| {
            first = first.min(segment.offset);
            end = end.max(segment.offset + segment.len);
            Ok(())
        })?;
        let opened = match (&block.check, &block.storage) {
            // A header still to be checked is asked for with the span, or
            // the check's small read would fetch it alone (the kernel reads
            // ahead 16 KiB after a first read of one page) and the span
            // would wait for a second trip to the disk.
            (Some(check), Storage::Contiguous { data_offset }) => {
                let file =
                    File::open(&block.path).map_err(|e| Error::io(&block.path, "opening", e))?;
                read_ahead_input(
                    &file,
                    Some(check.as_ref()),
                    data_offset + first,
                    end - first,
                );
                Some(file)
            }
            _ => None,
        };
        match InputHandle::open(input, rank, opened, witness)? {
            InputHandle::Contiguous { file, data_offset } => {
                let mut span = vec![0u8; (end - first) as usize];
                let at = data_offset + first;
                seekio::read_exact_at(&file, &block.path, &mut [IoSliceMut::new(&mut span)], at)?;
                counter.read(key, at, end - first);
                layout.for_each_segment(|segment| {
                    layout.copy_segment_from(&span, first, segment, buffers)
                })?;
            }
            InputHandle::Hdf5(reader) => {
                layout.for_each_segment(|segment| {
                    counter.read(key, segment.offset, segment.len);
                    Ok(())
                })?;
                let in_file = part.relative_to(&file_box);
                let in_region = part.relative_to(region);
                reader.read_box(
                    &in_file.origin,
                    &part.shape,
                    &mut buffers[0],
                    &region.shape,
                    &in_region.origin,
                )?;
            }
            InputHandle::Opened(_) => {
                return Err(Error::bad_input(
                    &block.path,
                    "read before its header was checked",
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Problem, Strategy};

    #[test]
    fn read_ahead_window_fits_what_the_cgroup_leaves() {
        // 100³ u16 in 10³ blocks -> 25³: keep(r̂) holds a little under 2 MB.
        let problem = Problem::new(vec![100; 3], vec![10; 3], vec![25; 3], 2).unwrap();
        let plan = crate::plan::plan(&problem, Strategy::Keep, None).unwrap();
        let peak = plan.prediction.peak_bytes;
        assert_eq!(read_ahead_bytes(&plan, None), PREFETCH_BYTES);
        assert_eq!(read_ahead_bytes(&plan, Some(1 << 40)), PREFETCH_BYTES);
        let limit = peak + PROCESS_BYTES + (40 << 20);
        assert_eq!(read_ahead_bytes(&plan, Some(limit)), 10 << 20);
        // A cap the process barely fits in leaves no window: only the file
        // about to be read is advised.
        assert_eq!(read_ahead_bytes(&plan, Some(peak + PROCESS_BYTES)), 0);
        assert_eq!(read_ahead_bytes(&plan, Some(1 << 20)), 0);
    }
}
