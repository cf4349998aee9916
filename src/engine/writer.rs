//! The write side: pieces wait here until their write block is complete,
//! then go, a slab at a time, to a writer thread that has them gathered
//! into the output files while the reader goes on with the next step: the
//! writer makes the files and completes the blocks in the plan's order,
//! the workers gather and write a block each. A padded (Zarr) edge chunk
//! is written as if its file held just its block, the padding between its
//! rows filled in the same calls.
//!
//! Encoded output blocks (the sink's [`BlockSink::encoder`]) are each
//! gathered whole and encoded by one of the run's workers, one block per
//! task, then written by the writer in one call each, in the plan's order
//! (the planner cuts no slab through one). A slab's pieces go back to the
//! reader as soon as its last block is gathered, so the workers encode on
//! across slabs; the blocks handed out and not yet written are at most the
//! planner's [`Problem::encoder_slots`], which its peak counts.
//!
//! [`Problem::encoder_slots`]: crate::plan::Problem::encoder_slots

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::IoSlice;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Select};
use parking_lot::Mutex;

use super::pieces::{InFile, PackingBuffer, PieceGrid, RowLayout, Segment};
use super::seekio::{self, FileKey, SeekLog};
use super::sink::{BlockSink, OpenOutput, OutputTarget, ReduceToCells, RegionCells};
use super::workers::Workers;
use crate::array::geometry::{show_shape, volume, IndexBox, Region};
use crate::error::{Error, Result};
use crate::format::encode::BlockEncode;
use crate::plan::pyramid::WRITE_BATCH_BLOCKS;
use crate::plan::Plan;
use crate::sys::pagecache;

/// Output segments at least this long are handed to the disk as soon as
/// they are written ([`pagecache::start_writeback_of`]): a slab of a block
/// much larger than a step. Shorter ones wait for their block to complete
/// (a whole block is one call then, not one per segment).
const WRITEBACK_MIN_BYTES: u64 = 1 << 20;

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

/// The pieces of the write blocks not yet handed to the writer, by rank.
#[derive(Default)]
pub(super) struct PendingWrites {
    blocks: HashMap<u64, PendingWrite>,
}

impl PendingWrites {
    /// Files the pieces of step `step_index`, one per write block of
    /// `grid` (C order), under their write blocks.
    pub(super) fn file_step(
        &mut self,
        plan: &Plan,
        grid: &PieceGrid,
        step_index: &[usize],
        buffers: Vec<Vec<u8>>,
    ) {
        for (local, buffer) in buffers.into_iter().enumerate() {
            let write_index = grid.cut_index(local);
            let write_rank = plan.write.linear(&write_index);
            let pending = self.blocks.entry(write_rank).or_insert_with(|| {
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
    }

    /// Takes the pieces of `slab`, a slab of the completed write block
    /// `write_index`, one per step overlapping it (C order over those steps).
    pub(super) fn take_slab(
        &mut self,
        plan: &Plan,
        write_index: &[usize],
        slab: &Region,
    ) -> Result<Vec<Vec<u8>>> {
        let write_rank = plan.write.linear(write_index);
        let pending = self.blocks.get_mut(&write_rank).ok_or_else(|| {
            Error::Internal(format!(
                "plan error: write block {write_index:?} completed with no data"
            ))
        })?;
        let pieces: Vec<Vec<u8>> = IndexBox::new(plan.steps.overlapping(slab))
            .map(|step_index| {
                let slot = pending.slot(&step_index);
                pending.pieces[slot].take().ok_or_else(|| {
                    Error::Internal(format!(
                        "plan error: write block {write_index:?} written before step {step_index:?} was read"
                    ))
                })
            })
            .collect::<Result<_>>()?;
        if pending.pieces.iter().all(Option::is_none) {
            self.blocks.remove(&write_rank);
        }
        Ok(pieces)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// A slab of a completed write block (all of it, or the part before a
/// step's end) handed to the writer thread: its pieces, one per step
/// overlapping it, C order over those steps.
pub(super) struct WriteJob {
    pub(super) write_box: Region,
    /// Rank of the read block that completes the write block.
    pub(super) read_block: u64,
    pub(super) pieces: Vec<Vec<u8>>,
    pub(super) bytes: u64,
}

/// What the writer thread reports of a job: its pieces back, once
/// nothing more is gathered from them, and its writes, once every block
/// of it is written (for an encoded output possibly after later jobs'
/// pieces are back).
pub(super) enum WriteReport {
    /// The job's pieces, back for reuse ([`BufferPool`]).
    ///
    /// [`BufferPool`]: super::pool::BufferPool
    Released(Vec<Vec<u8>>),
    /// Every block of the job written.
    Written {
        read_block: u64,
        writes: SeekLog,
        blocks_completed: u64,
        /// Bytes of the encoded blocks the job wrote, before encoding.
        encoded_from: u64,
    },
}

/// A job's pieces, shared by the workers gathering its blocks: whoever
/// lets go of them last (the worker that gathers the job's last block, as
/// a rule) sends them back to the reader, which can then hand over its
/// next slab while the blocks are still being encoded.
struct SlabPieces {
    grid: PieceGrid,
    pieces: Vec<Vec<u8>>,
    back: Sender<Result<WriteReport>>,
}

impl Drop for SlabPieces {
    fn drop(&mut self) {
        let pieces = std::mem::take(&mut self.pieces);
        // Nobody listens once the run has stopped.
        let _ = self.back.send(Ok(WriteReport::Released(pieces)));
    }
}

/// One output block to gather from a slab's pieces and encode, on a
/// worker; numbered in the plan's order (`seq`), in which the
/// writer writes them.
struct EncodeTask {
    seq: u64,
    block: Region,
    path: PathBuf,
    file_shape: Vec<u64>,
    slab: Arc<SlabPieces>,
}

/// A worker's answer for task `seq`: the encoding and the bytes
/// it was made from.
struct Encoded {
    seq: u64,
    result: Result<(Vec<u8>, u64)>,
}

/// The writes of one job of encoded blocks, until all are written.
struct JobWrites {
    read_block: u64,
    /// Blocks handed to the encoders and not yet written.
    remaining: u64,
    /// Whether all its blocks are handed out.
    handed_out: bool,
    writes: SeekLog,
    blocks_completed: u64,
    encoded_from: u64,
}

/// The writer's side of the encoders: tasks out, encodings back, written
/// in order.
struct EncodePipeline {
    encoder: Arc<dyn BlockEncode>,
    /// Where the workers send each block's encoding.
    done: crossbeam_channel::Sender<Encoded>,
    results: Receiver<Encoded>,
    /// Blocks handed out and not yet written, at most
    /// ([`Problem::encoder_slots`](crate::plan::Problem::encoder_slots)).
    width: u64,
    next_seq: u64,
    next_write: u64,
    /// Task number -> output rank, for the tasks not yet written.
    ranks: VecDeque<u64>,
    /// Encodings back before their turn.
    ready: BTreeMap<u64, Result<(Vec<u8>, u64)>>,
    jobs: VecDeque<JobWrites>,
}

/// The writer thread's state: the plan, and output blocks' remaining
/// volumes.
pub(super) struct Writer<'a> {
    plan: &'a Plan,
    elem: u64,
    remaining: HashMap<u64, u64>,
    /// Set: stop before the next output block ([`Error::Cancelled`]); a
    /// slab can hold millions of small blocks.
    cancel: Option<&'a AtomicBool>,
}

impl<'a> Writer<'a> {
    pub(super) fn new(plan: &'a Plan, elem: u64, cancel: Option<&'a AtomicBool>) -> Writer<'a> {
        Writer {
            plan,
            elem,
            remaining: HashMap::new(),
            cancel,
        }
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// The writer thread: writes each job from `jobs` into `sink` and
    /// sends its reports, until the jobs end (and, for encoded outputs,
    /// the blocks handed to the encoders are written) or an error is
    /// reported.
    pub(super) fn serve(
        self,
        jobs: Receiver<WriteJob>,
        reports: Sender<Result<WriteReport>>,
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
        workers: &Workers,
    ) {
        let encoder = sink.lock().encoder();
        match encoder {
            Some(encoder) => self.serve_encoded((&jobs, &reports), sink, encoder, workers),
            None => self.serve_in_place((&jobs, &reports), sink, workers),
        }
    }

    /// [`serve`](Self::serve) for blocks written in place: each job
    /// written whole, then reported.
    fn serve_in_place(
        mut self,
        (jobs, reports): (&Receiver<WriteJob>, &Sender<Result<WriteReport>>),
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
        workers: &Workers,
    ) {
        for job in jobs {
            let read_block = job.read_block;
            let working = workers.working();
            let result = self.write(&job, &mut **sink.lock(), workers);
            let sent = match result {
                Ok((writes, blocks_completed)) => reports
                    .send(Ok(WriteReport::Written {
                        read_block,
                        writes,
                        blocks_completed,
                        encoded_from: 0,
                    }))
                    .and_then(|()| reports.send(Ok(WriteReport::Released(job.pieces)))),
                Err(error) => reports.send(Err(error)),
            };
            if sent.is_err() {
                return;
            }
            // The next slab comes when the reader's step is read: help
            // with that, on the CPU this thread has, instead of sleeping.
            while jobs.is_empty() && workers.help() {}
            drop(working);
        }
    }

    /// [`serve`](Self::serve) for encoded blocks: the run's workers
    /// gather and encode the blocks of every job, one block per task,
    /// while this thread hands them out and writes their encodings in
    /// order as they come back. Stops at the first error, which it reports;
    /// once the jobs end it writes what is still being encoded, unless the
    /// run was cancelled.
    fn serve_encoded(
        mut self,
        (jobs, reports): (&Receiver<WriteJob>, &Sender<Result<WriteReport>>),
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
        encoder: Arc<dyn BlockEncode>,
        workers: &Workers,
    ) {
        let (done, results) = crossbeam_channel::unbounded::<Encoded>();
        let mut pipeline = EncodePipeline {
            encoder,
            done,
            results,
            width: self.plan.problem.encoder_slots().blocks().max(1),
            next_seq: 0,
            next_write: 0,
            ranks: VecDeque::new(),
            ready: BTreeMap::new(),
            jobs: VecDeque::new(),
        };
        if let Err(error) = self.pipe_jobs((jobs, reports), sink, &mut pipeline, workers) {
            let _ = reports.send(Err(error));
        }
    }

    /// The encoded writer's loop: hands out each job's blocks as it comes,
    /// and writes encodings as they come back, whichever is first.
    fn pipe_jobs(
        &mut self,
        (jobs, reports): (&Receiver<WriteJob>, &Sender<Result<WriteReport>>),
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
        pipeline: &mut EncodePipeline,
        workers: &Workers,
    ) -> Result<()> {
        loop {
            let mut select = Select::new();
            let job_ready = select.recv(jobs);
            select.recv(&pipeline.results);
            let ready = select.select();
            if ready.index() == job_ready {
                match ready.recv(jobs) {
                    Ok(job) => self.hand_out(job, (reports, sink), pipeline, workers)?,
                    Err(_) => break,
                }
            } else {
                let encoded = ready
                    .recv(&pipeline.results)
                    .map_err(|_| encoders_stopped())?;
                pipeline.ready.insert(encoded.seq, encoded.result);
                self.write_ready(reports, sink, pipeline)?;
            }
        }
        // The jobs ended: what is being encoded is written, unless the run
        // was cancelled (its outputs are about to be removed).
        while !pipeline.ranks.is_empty() && !self.cancelled() {
            self.write_next(reports, sink, pipeline)?;
        }
        Ok(())
    }

    /// Hands the output blocks of `job` (each whole in it: the plan hands
    /// encoded blocks over whole) to the workers in the plan's order,
    /// writing earlier ones first whenever every slot holds one; the
    /// job's pieces go back once every block is gathered from them
    /// ([`SlabPieces`]).
    fn hand_out(
        &mut self,
        job: WriteJob,
        (reports, sink): (
            &Sender<Result<WriteReport>>,
            &Mutex<&mut (dyn BlockSink + Send)>,
        ),
        pipeline: &mut EncodePipeline,
        workers: &Workers,
    ) -> Result<()> {
        let plan = self.plan;
        let write_box = job.write_box;
        let slab = Arc::new(SlabPieces {
            grid: PieceGrid::new(&plan.steps, &write_box),
            pieces: job.pieces,
            back: reports.clone(),
        });
        pipeline.jobs.push_back(JobWrites {
            read_block: job.read_block,
            remaining: 0,
            handed_out: false,
            writes: SeekLog::default(),
            blocks_completed: 0,
            encoded_from: 0,
        });
        for output_index in IndexBox::new(plan.output.overlapping(&write_box)) {
            if self.cancelled() {
                return Err(Error::Cancelled);
            }
            let block = plan.output.block(&output_index);
            let Some(region) = block.intersect(&write_box) else {
                continue;
            };
            let rank = plan.output.linear(&output_index);
            let (path, file_shape) = {
                let mut sink = sink.lock();
                if !sink.wants(rank) {
                    continue;
                }
                let file = block_file(&mut **sink, rank, &block)?;
                (file.path, file.file_shape)
            };
            if region != block {
                return Err(Error::Internal(format!(
                    "plan error: encoded output block {} handed to the writer in parts",
                    path.display()
                )));
            }
            while pipeline.ranks.len() as u64 >= pipeline.width {
                self.write_next(reports, sink, pipeline)?;
            }
            let task = EncodeTask {
                seq: pipeline.next_seq,
                block,
                path,
                file_shape,
                slab: Arc::clone(&slab),
            };
            let (done, encoder, elem) = (
                pipeline.done.clone(),
                Arc::clone(&pipeline.encoder),
                self.elem,
            );
            workers.spawn(move || encode_task(task, &done, &*encoder, elem));
            pipeline.next_seq += 1;
            pipeline.ranks.push_back(rank);
            if let Some(writes) = pipeline.jobs.back_mut() {
                writes.remaining += 1;
            }
        }
        drop(slab);
        if let Some(writes) = pipeline.jobs.back_mut() {
            writes.handed_out = true;
        }
        self.report_written(reports, pipeline)
    }

    /// Writes the next block in order, waiting for its encoding.
    fn write_next(
        &mut self,
        reports: &Sender<Result<WriteReport>>,
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
        pipeline: &mut EncodePipeline,
    ) -> Result<()> {
        while !pipeline.ready.contains_key(&pipeline.next_write) {
            let encoded = pipeline.results.recv().map_err(|_| encoders_stopped())?;
            pipeline.ready.insert(encoded.seq, encoded.result);
        }
        self.write_ready(reports, sink, pipeline)
    }

    /// Writes the encodings back whose turn it is, each in one call,
    /// completing its block, and reports the jobs thereby written.
    fn write_ready(
        &mut self,
        reports: &Sender<Result<WriteReport>>,
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
        pipeline: &mut EncodePipeline,
    ) -> Result<()> {
        while let Some(result) = pipeline.ready.remove(&pipeline.next_write) {
            let rank = pipeline.ranks.pop_front().ok_or_else(encoders_stopped)?;
            pipeline.next_write += 1;
            let (encoded, raw_len) = result?;
            let mut sink = sink.lock();
            // Writing again after a full disk rewrites the same bytes in place.
            loop {
                let written = {
                    let target = sink.target(rank)?;
                    seekio::write_all_at(target.file, target.path, &mut [IoSlice::new(&encoded)], 0)
                };
                match written {
                    Err(error) if error.is_no_space() => sink.no_space(error)?,
                    result => break result?,
                }
            }
            sink.complete(rank)?;
            // Blocks are written in the order jobs handed them out: this
            // one is the first job's with any left.
            let Some(job) = pipeline.jobs.iter_mut().find(|job| job.remaining > 0) else {
                return Err(encoders_stopped());
            };
            job.writes
                .write(FileKey::Output(rank), 0, encoded.len() as u64);
            job.remaining -= 1;
            job.blocks_completed += 1;
            job.encoded_from += raw_len;
        }
        self.report_written(reports, pipeline)
    }

    /// Reports the jobs, oldest first, whose pieces are back and whose
    /// blocks are all written.
    fn report_written(
        &self,
        reports: &Sender<Result<WriteReport>>,
        pipeline: &mut EncodePipeline,
    ) -> Result<()> {
        while pipeline
            .jobs
            .front()
            .is_some_and(|job| job.handed_out && job.remaining == 0)
        {
            let Some(job) = pipeline.jobs.pop_front() else {
                break;
            };
            reports
                .send(Ok(WriteReport::Written {
                    read_block: job.read_block,
                    writes: job.writes,
                    blocks_completed: job.blocks_completed,
                    encoded_from: job.encoded_from,
                }))
                .map_err(|_| reader_gone())?;
        }
        Ok(())
    }

    /// Writes a slab of a completed write block to its output blocks,
    /// gathering from its pieces; returns the calls made and the blocks
    /// completed. The blocks go a batch at a time: their files are made
    /// here in the plan's order, then the workers gather and write a block
    /// each (the storage sees a queue as deep as the workers) and make the
    /// cells the sink takes of it, then here, in order again, each block's
    /// calls are logged, a block whose disk was full is written again once
    /// there is room, the blocks are completed and the batch's cells handed
    /// to the sink. The count is the plan's for any number of workers.
    fn write(
        &mut self,
        job: &WriteJob,
        sink: &mut dyn BlockSink,
        workers: &Workers,
    ) -> Result<(SeekLog, u64)> {
        let plan = self.plan;
        let write_box = &job.write_box;
        let grid = PieceGrid::new(&plan.steps, write_box);
        // Where the write block this slab belongs to ends along the first
        // dimension: slabs before it are followed by the rest.
        let firsts = plan.write.axis(0);
        let write_end = firsts.end(firsts.locate(write_box.origin[0]));
        let mut writes = SeekLog::default();
        let mut blocks_completed = 0;
        let cell_maker = sink.takes_cells();
        let wanted: Vec<(u64, Region, Region)> = IndexBox::new(plan.output.overlapping(write_box))
            .filter_map(|output_index| {
                let block = plan.output.block(&output_index);
                let region = block.intersect(write_box)?;
                Some((plan.output.linear(&output_index), block, region))
            })
            .filter(|(rank, _, _)| sink.wants(*rank))
            .collect();
        for batch in wanted.chunks(WRITE_BATCH_BLOCKS) {
            if self.cancelled() {
                return Err(Error::Cancelled);
            }
            let files = batch
                .iter()
                .map(|(rank, block, _)| block_file(sink, *rank, block))
                .collect::<Result<Vec<OpenOutput>>>()?;
            let regions: Vec<RegionWrite> = batch
                .iter()
                .zip(&files)
                .map(|((rank, block, region), file)| RegionWrite {
                    rank: *rank,
                    block,
                    write_end,
                    region,
                    file,
                })
                .collect();
            let (elem, cancel) = (self.elem, self.cancel);
            let pieces = (&grid, &job.pieces[..]);
            let written = workers.map(&regions, |to| {
                if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                    return Err(Error::Cancelled);
                }
                let writes =
                    PackingBuffer::of_this_thread(|packing| to.write(elem, pieces, packing))?;
                let cells = to.cells(cell_maker.as_deref(), elem, pieces)?;
                Ok((writes, cells))
            });
            let mut batch_cells = Vec::new();
            for (to, result) in regions.iter().zip(written) {
                let (rank, block, region) = (to.rank, to.block, to.region);
                let (region_writes, cells) = match result {
                    Err(error) if error.is_no_space() => {
                        let writes = self.write_again(sink, error, to, pieces)?;
                        (writes, to.cells(cell_maker.as_deref(), elem, pieces)?)
                    }
                    result => result?,
                };
                writes.extend(region_writes);
                batch_cells.extend(cells);
                if self.completes(rank, block, region) {
                    sink.complete(rank)?;
                    blocks_completed += 1;
                }
            }
            if cell_maker.is_some() {
                sink.written(batch_cells)?;
            }
        }
        Ok((writes, blocks_completed))
    }

    /// Writes `to` again, after its write found the disk full (`error`):
    /// once the sink says it is worth trying, and again as often as the
    /// disk is still full. Rewriting the same bytes in place, only the
    /// attempt that succeeds counts.
    fn write_again(
        &mut self,
        sink: &mut dyn BlockSink,
        mut error: Error,
        to: &RegionWrite,
        pieces: (&PieceGrid, &[Vec<u8>]),
    ) -> Result<SeekLog> {
        loop {
            sink.no_space(error)?;
            let written =
                PackingBuffer::of_this_thread(|packing| to.write(self.elem, pieces, packing));
            match written {
                Err(again) if again.is_no_space() => error = again,
                result => return result,
            }
        }
    }

    /// Whether writing `region` of output block `rank` (`block`) completes it.
    fn completes(&mut self, rank: u64, block: &Region, region: &Region) -> bool {
        let remaining = self.remaining.entry(rank).or_insert(block.volume());
        *remaining -= region.volume();
        if *remaining == 0 {
            self.remaining.remove(&rank);
            return true;
        }
        false
    }
}

/// `region` of output block `rank` (`block`, in a write block ending at
/// `write_end` along the first dimension), to be written into its `file`.
struct RegionWrite<'a> {
    rank: u64,
    block: &'a Region,
    write_end: u64,
    region: &'a Region,
    file: &'a OpenOutput,
}

impl RegionWrite<'_> {
    /// Writes the region from `pieces` (cut by their grid); returns the
    /// calls made.
    fn write(
        &self,
        elem: u64,
        (grid, pieces): (&PieceGrid, &[Vec<u8>]),
        packing: &mut PackingBuffer,
    ) -> Result<SeekLog> {
        let (block, region, file) = (self.block, self.region, self.file);
        let file_box = Region::new(block.origin.clone(), file.file_shape.clone());
        // A padded edge chunk is written as if its file held just its
        // block: each run of rows in one call, the padding between them
        // filled with zeros (the fill value), as the planner counts.
        let place = InFile::of(region, &file_box)
            .bridging(Region::new(vec![0; block.ndim()], block.shape.clone()));
        let layout = RowLayout::in_file(region, &place, elem, grid);
        let tail = padding_after_slab(region, (block, self.write_end), &file.file_shape) * elem;
        let target = OutputTarget {
            file: &file.file,
            path: &file.path,
            data_offset: file.data_offset,
            file_shape: &file.file_shape,
        };
        let mut writes = SeekLog::default();
        write_segments(
            &target,
            FileKey::Output(self.rank),
            (&layout, tail),
            pieces,
            packing,
            &mut writes,
        )?;
        Ok(writes)
    }

    /// The cells `maker` makes of the region, gathered from `pieces` (cut
    /// by their grid); None without a maker.
    fn cells(
        &self,
        maker: Option<&dyn ReduceToCells>,
        elem: u64,
        (grid, pieces): (&PieceGrid, &[Vec<u8>]),
    ) -> Result<Option<RegionCells>> {
        let Some(maker) = maker else {
            return Ok(None);
        };
        maker
            .cells(self.region, &mut |part, into| {
                gather_into(part, part, elem, (grid, pieces), into)
            })
            .map(Some)
    }
}

/// A worker's task: gathers `task`'s block, lets go of its slab and says
/// so, then encodes the block and sends the encoding to `done`. A panic
/// is answered as the block's error, so that the writer, waiting for that
/// block, is never left waiting.
fn encode_task(
    task: EncodeTask,
    done: &crossbeam_channel::Sender<Encoded>,
    encoder: &dyn BlockEncode,
    elem: u64,
) {
    let EncodeTask {
        seq,
        block,
        path,
        file_shape,
        slab,
    } = task;
    let raw = unpanicked(&path, || {
        let file_box = Region::new(block.origin.clone(), file_shape.clone());
        gather(&block, &file_box, elem, &slab.grid, &slab.pieces)
    });
    drop(slab);
    let result = raw.and_then(|raw| {
        let raw_len = raw.len() as u64;
        let encoded = unpanicked(&path, || encoder.encode(&path, &file_shape, raw))?;
        Ok((encoded, raw_len))
    });
    // Nobody listens once the run has stopped.
    let _ = done.send(Encoded { seq, result });
}

/// `work`'s result, or a panic in it as an error about output `path`.
fn unpanicked<T>(path: &Path, work: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
        Err(Error::Internal(format!(
            "gathering or encoding {} panicked",
            path.display()
        )))
    })
}

/// The error for encodings lost while the writer waits for them.
fn encoders_stopped() -> Error {
    Error::Internal("the workers stopped encoding".into())
}

/// The error for a report nobody receives: the reader stopped.
fn reader_gone() -> Error {
    Error::Internal("the writer's reader stopped listening".into())
}

/// The C-order bytes of `file_box`'s array with `region` gathered from
/// `pieces` (cut by `grid`) and zeros (Zarr's fill value) elsewhere.
fn gather(
    region: &Region,
    file_box: &Region,
    elem: u64,
    grid: &PieceGrid,
    pieces: &[Vec<u8>],
) -> Result<Vec<u8>> {
    let mut raw = vec![0u8; (volume(&file_box.shape) * elem) as usize];
    gather_into(region, file_box, elem, (grid, pieces), &mut raw)?;
    Ok(raw)
}

/// Fills `raw`, the C-order bytes of `file_box`'s array, with `region`
/// gathered from `pieces` (cut by `grid`), leaving the rest as it is.
fn gather_into(
    region: &Region,
    file_box: &Region,
    elem: u64,
    (grid, pieces): (&PieceGrid, &[Vec<u8>]),
    raw: &mut [u8],
) -> Result<()> {
    let layout = RowLayout::new(region, file_box, elem, grid);
    layout.for_each_segment(|segment| {
        let at = segment.offset as usize;
        let into = raw
            .get_mut(at..at + segment.len as usize)
            .ok_or_else(|| Error::Internal("a gathered segment lies beyond its buffer".into()))?;
        layout.gather_segment(pieces, segment, into)
    })
}

/// The file of output block `rank` (`block`) from `sink`, made if it is
/// not yet, to be written by any thread; made again once there is room
/// when the disk was full ([`BlockSink::no_space`]).
fn block_file(sink: &mut dyn BlockSink, rank: u64, block: &Region) -> Result<OpenOutput> {
    loop {
        let made = sink.target(rank).and_then(|target| {
            check_file_holds(&target, block)?;
            Ok(target.shared())
        });
        match made {
            Err(error) if error.is_no_space() => sink.no_space(error)?,
            made => return made,
        }
    }
}

/// Refuses a target whose file's array is too small for its `block`.
fn check_file_holds(target: &OutputTarget, block: &Region) -> Result<()> {
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
                show_shape(target.file_shape),
                show_shape(&block.shape)
            ),
        });
    }
    Ok(())
}

/// Elements of padding between the end of `region`, a slab of output
/// block `block` along the first dimension that spans it in every other
/// one and stops before its end and before `write_end` (where its write
/// block ends: another slab of it follows), and the start of the block's
/// next plane in its file of `file_shape` (a padded edge chunk's):
/// written with the slab, so that the next slab's call continues it, as
/// the planner counts; the slabs then write what the block's one call
/// would, gaps included (`plan::Prediction::bytes_written`). 0 for any
/// other region.
fn padding_after_slab(
    region: &Region,
    (block, write_end): (&Region, u64),
    file_shape: &[u64],
) -> u64 {
    let n = block.ndim();
    let spans_rest =
        (1..n).all(|d| region.origin[d] == block.origin[d] && region.shape[d] == block.shape[d]);
    if !spans_rest || region.end(0) >= block.end(0).min(write_end) {
        return 0;
    }
    let strides = crate::array::geometry::strides(file_shape);
    let plane_end: u64 = (1..n)
        .map(|d| (block.shape[d] - 1) * strides[d])
        .sum::<u64>()
        + 1;
    strides[0] - plane_end
}

/// Writes `layout`'s segments into `target` (file `key`), each `tail`
/// bytes longer (padding after a slab, [`padding_after_slab`], whose
/// region is one segment), gathering from the `pieces`, logs each call in
/// `writes`, and hands long segments to the disk at once.
fn write_segments(
    target: &OutputTarget,
    key: FileKey,
    (layout, tail): (&RowLayout, u64),
    pieces: &[Vec<u8>],
    packing: &mut PackingBuffer,
    writes: &mut SeekLog,
) -> Result<()> {
    layout.for_each_segment(|segment| {
        let extended;
        let segment = if tail > 0 {
            extended = Segment {
                len: segment.len + tail,
                ..segment.clone()
            };
            &extended
        } else {
            segment
        };
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
    })
}
