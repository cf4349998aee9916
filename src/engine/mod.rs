//! The executor: runs a [`Plan`] over an [`InputArray`], reading read blocks
//! in the plan's order (`Plan::order`) and writing each write block as soon as it is complete, into
//! whatever [`BlockSink`] provides the output files (real files for
//! `rechunk`, the staging area for the view).
//!
//! Memory: a read block is read, step by step (`Plan::steps`: slabs of it
//! along the first dimension), into one buffer per write block each step
//! touches (its *pieces*); a piece stays until its part of the write block
//! is written, which gathers from the pieces. `pieces` moves the
//! bytes between files and pieces, one I/O call per contiguous run of a
//! file. The calling thread reads while a writer thread writes the slab of the
//! completed write block that the previous step finished, so the disk and
//! the cores work at once, even when the whole array is one read block (a
//! split or a merge); the bytes held are exactly what the planner
//! simulates: the step being read, the slab in flight, and the waiting
//! pieces. The work on blocks (opening and checking input files, reading
//! and decoding input blocks, copying them into pieces, gathering, encoding and writing output blocks) runs
//! on the run's [`workers`]; the reader and the writer keep the plan's
//! order and log the calls in it. Encoded output blocks (compressed, sharded) are gathered
//! whole and encoded on the workers, and written in one call each; the
//! planner hands them over whole, and reserves what the encoders hold
//! from the first slab on: a slab's pieces come back once its blocks are
//! gathered, and the workers go on encoding across slabs.
//!
//! Every data I/O goes through [`seekio`], whose counts must equal the
//! plan's predictions; both threads log their calls and the reader counts
//! them in the plan's order (a read block's reads, then its write block's
//! writes, once all are written), so tests can hold the executor to that.
//! Steps are cut only where that count cannot change.

pub mod downsample;
mod extract;
mod inputs;
mod pieces;
mod pool;
pub mod seekio;
mod sink;
mod stats;
pub mod workers;
mod writer;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};

use crossbeam_channel::Sender;

use parking_lot::Mutex;

use crate::array::geometry::Region;
use crate::error::{Error, Result};
use crate::input::InputArray;
use crate::plan::Plan;
use inputs::InputReader;
use pieces::PieceGrid;
use pool::BufferPool;
use seekio::{SeekCounter, SeekLog};
use workers::Workers;
use writer::{PendingWrites, WriteJob, WriteReport, Writer};

pub use extract::{read_region, region_read_bytes};
pub use inputs::InputWitness;
pub use sink::{
    reopen, BlockSink, OpenOutput, OutputFiles, OutputTarget, ReduceToCells, RegionCells,
};
pub use stats::RunStats;

/// Runs `plan` over `input` into `sink`. `progress` is called after every
/// read block, and within a read block cut in steps after each of its
/// slabs is written; `cancel` stops the run between steps.
pub struct Executor<'a> {
    plan: &'a Plan,
    elem: u64,
    reader: InputReader<'a>,
    pending: PendingWrites,
    counter: SeekCounter,
    /// The I/O of the read blocks not yet counted, in the plan's order.
    uncounted: VecDeque<ReadBlockIo>,
    /// Rank of the read block being read.
    current_read: u64,
    /// Bytes of the slab handed to the writer whose pieces are not back yet.
    in_flight: Option<u64>,
    held: u64,
    /// Bytes the encoders may hold: 0 until the first slab is handed
    /// over, then the planner's allowance for them
    /// ([`Problem::encoders_bytes`](crate::plan::Problem::encoders_bytes);
    /// 0 when blocks are written in place).
    writing: u64,
    stats: RunStats,
    cancel: Option<&'a AtomicBool>,
    pool: BufferPool,
    /// Read blocks before this rank are not read ([`Executor::starting_at`]).
    first_read: u64,
}

impl<'a> Executor<'a> {
    pub fn new(plan: &'a Plan, input: &'a InputArray) -> Executor<'a> {
        Executor {
            plan,
            elem: input.dtype.size as u64,
            reader: InputReader::new(plan, input),
            pending: PendingWrites::default(),
            counter: SeekCounter::default(),
            uncounted: VecDeque::new(),
            current_read: 0,
            in_flight: None,
            held: 0,
            writing: 0,
            stats: RunStats {
                read_blocks_total: plan.read.count(),
                output_blocks_total: plan.output.count(),
                ..RunStats::default()
            },
            cancel: None,
            pool: BufferPool::default(),
            first_read: 0,
        }
    }

    /// Starts at read block `first_read` (rank in the plan's order): a resumed run
    /// whose earlier read blocks feed only output blocks already written,
    /// which the sink does not want ([`BlockSink::wants`]). Their pieces
    /// are filed empty, so write blocks they share with later read blocks
    /// still complete; the sink skips the parts those pieces would fill.
    pub fn starting_at(mut self, first_read: u64) -> Self {
        self.first_read = first_read;
        self.reader.start_at(first_read);
        self
    }

    pub fn with_cancel(mut self, cancel: &'a AtomicBool) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Tells `witness` of each input file before it is first read.
    pub fn with_witness(mut self, witness: &'a dyn InputWitness) -> Self {
        self.reader.witness = Some(witness);
        self
    }

    /// Runs the whole plan. Steps of read blocks are read on this thread
    /// while the slab of a write block that the previous step completed is
    /// written on another, so the disk and the cores work at once; at
    /// most one slab is in flight, its pieces still held (the planner counts
    /// them).
    pub fn run(
        mut self,
        sink: &mut (dyn BlockSink + Send),
        mut progress: impl FnMut(&RunStats),
    ) -> Result<RunStats> {
        let writer = Writer::new(self.plan, self.elem, self.cancel);
        let workers = Workers::new(self.plan.problem.workers)?;
        let sink = Mutex::new(sink);
        std::thread::scope(|scope| {
            let (jobs, job_queue) = crossbeam_channel::bounded::<WriteJob>(1);
            let (reports_tx, reports) = std::sync::mpsc::channel::<Result<WriteReport>>();
            let (sink, workers) = (&sink, &workers);
            let writer = std::thread::Builder::new()
                .name("writer".into())
                .spawn_scoped(scope, move || {
                    writer.serve(job_queue, reports_tx, sink, workers)
                })
                .map_err(|e| Error::os("thread spawn", "starting the writer", e))?;
            let result = self.read_and_hand_over((&jobs, &reports), sink, &mut progress, workers);
            drop(jobs);
            if writer.join().is_err() {
                return Err(Error::Internal("the writer thread panicked".into()));
            }
            result
        })
    }

    /// The reader's side of [`run`](Self::run): every read block in the
    /// plan's order ([`read_block`](Self::read_block)), its I/O counted in the
    /// plan's order after it.
    fn read_and_hand_over(
        &mut self,
        (jobs, reports): (&Sender<WriteJob>, &Receiver<Result<WriteReport>>),
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
        progress: &mut impl FnMut(&RunStats),
        workers: &Workers,
    ) -> Result<RunStats> {
        for read_index in self.plan.read_blocks_in_order() {
            self.stop_if_cancelled(reports)?;
            self.read_block(&read_index, (jobs, reports), progress, workers)?;
            self.end_read_block(sink)?;
            progress(&self.stats);
        }
        self.finish_write(reports)?;
        // Encoded blocks handed over are still being written.
        while !self.uncounted.is_empty() {
            self.receive(reports)?;
        }
        self.refresh_stats();
        debug_assert!(self.pending.is_empty() && self.held == 0);
        Ok(self.stats)
    }

    /// Reads the read block at `read_index` in its steps (`Plan::steps`);
    /// after each step, the slab of the read block's completed write block
    /// that the step finishes goes to the writer, which writes it while the
    /// next step is read.
    fn read_block(
        &mut self,
        read_index: &[usize],
        (jobs, reports): (&Sender<WriteJob>, &Receiver<Result<WriteReport>>),
        progress: &mut impl FnMut(&RunStats),
        workers: &Workers,
    ) -> Result<()> {
        let plan = self.plan;
        let step_axis = plan.steps.axis(0);
        self.current_read = plan.read_rank(read_index);
        self.uncounted
            .push_back(ReadBlockIo::new(self.current_read));
        let read_box = plan.read.block(read_index);
        let completed = plan.completed_write_block(read_index);
        let steps = step_axis.overlapping(read_box.origin[0], read_box.end(0));
        for step in steps.clone() {
            // A read block can be the whole array (a split): its steps are
            // where a cancelled run stops promptly.
            self.stop_if_cancelled(reports)?;
            let mut step_index = read_index.to_vec();
            step_index[0] = step;
            let working = workers.working();
            let read_result = self.read_step(&step_index, workers);
            // One slab in flight at a time: wait for the last one, helping
            // to write it on the CPU this thread has, then asleep.
            let helped = self.help_write(reports, workers);
            drop(working);
            helped?;
            self.finish_write(reports)?;
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
            self.hand_over(job, jobs, reports)?;
        }
        Ok(())
    }

    /// After a read block: its I/O counted in the plan's order, and the
    /// sink's own work between read blocks done.
    fn end_read_block(&mut self, sink: &Mutex<&mut (dyn BlockSink + Send)>) -> Result<()> {
        if let Some(io) = self.uncounted.back_mut() {
            io.reads = Some(std::mem::take(&mut self.reader.reads));
        }
        self.count_in_order();
        self.stats.read_blocks_done += 1;
        self.refresh_stats();
        // The sink's own work between read blocks (blocks extracted on
        // demand) takes its lock, so it never runs inside a write job;
        // the held bytes it is told include the slab in flight, the
        // buffers kept for reuse and the encoders' reserve, the memory its
        // work must fit beside.
        let mut told = self.stats;
        told.held_bytes += self.pool.kept_bytes() + self.writing;
        sink.lock().between_steps(&told)
    }

    /// [`Error::Cancelled`] once `cancel` is set, after the slab in flight
    /// (if any) is written: the writer then holds nothing of this run when
    /// the caller removes what it wrote.
    fn stop_if_cancelled(&mut self, reports: &Receiver<Result<WriteReport>>) -> Result<()> {
        if !self.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Ok(());
        }
        if self.in_flight.is_some() {
            while matches!(self.receive(reports), Ok(false)) {}
        }
        Err(Error::Cancelled)
    }

    /// Hands `job` to the writer, as the one slab in flight.
    fn hand_over(
        &mut self,
        job: WriteJob,
        jobs: &Sender<WriteJob>,
        reports: &Receiver<Result<WriteReport>>,
    ) -> Result<()> {
        self.in_flight = Some(job.bytes);
        if let Some(io) = self.uncounted.back_mut() {
            io.slabs_handed += 1;
        }
        self.writing = self.plan.problem.encoders_bytes();
        self.note_peak(self.held + self.writing);
        if jobs.send(job).is_err() {
            // The writer stopped: its report says why.
            self.finish_write(reports)?;
            return Err(Error::Internal("the writer thread stopped".into()));
        }
        Ok(())
    }

    /// Waits for the pieces of the slab in flight, if any, and frees
    /// them; the writes reported meanwhile are filed.
    fn finish_write(&mut self, reports: &Receiver<Result<WriteReport>>) -> Result<()> {
        if self.in_flight.is_none() {
            return Ok(());
        }
        while !self.receive(reports)? {}
        Ok(())
    }

    /// Takes the writer's reports, and items of its batch while it has one
    /// running, until the slab in flight is written or there is nothing
    /// to help with.
    fn help_write(
        &mut self,
        reports: &Receiver<Result<WriteReport>>,
        workers: &Workers,
    ) -> Result<()> {
        while self.in_flight.is_some() {
            match reports.try_recv() {
                Ok(report) => {
                    self.file_report(report?);
                }
                Err(TryRecvError::Empty) if workers.help() => {}
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Takes one report from the writer: the pieces of the slab in flight
    /// back (true), or the writes of a slab (false).
    fn receive(&mut self, reports: &Receiver<Result<WriteReport>>) -> Result<bool> {
        let report = reports
            .recv()
            .map_err(|_| Error::Internal("the writer thread stopped without reporting".into()))??;
        Ok(self.file_report(report))
    }

    /// Files a report of the writer: the pieces of the slab in flight back
    /// (true), or the writes of a slab, filed under its read block to be
    /// counted in the plan's order (false).
    fn file_report(&mut self, report: WriteReport) -> bool {
        match report {
            WriteReport::Released(pieces) => {
                self.held -= self.in_flight.take().unwrap_or(0);
                let peak = self.plan.prediction.peak_bytes;
                for piece in pieces {
                    self.pool.give(piece, self.held, peak);
                }
                true
            }
            WriteReport::Written {
                read_block,
                writes,
                blocks_completed,
                encoded_from,
            } => {
                self.stats.output_blocks_done += blocks_completed;
                self.stats.encoded_from_bytes += encoded_from;
                if let Some(io) = self
                    .uncounted
                    .iter_mut()
                    .find(|io| io.read_block == read_block)
                {
                    io.writes.extend(writes);
                    io.slabs_written += 1;
                }
                self.count_in_order();
                false
            }
        }
    }

    /// Counts the I/O of the read blocks in the plan's order as far as it
    /// is known: each one's reads once it is read, then its write block's
    /// writes once every slab of it is written.
    fn count_in_order(&mut self) {
        while let Some(io) = self.uncounted.front_mut() {
            let Some(reads) = &mut io.reads else {
                return;
            };
            reads.replay_into(&mut self.counter);
            if io.slabs_written < io.slabs_handed {
                return;
            }
            io.writes.replay_into(&mut self.counter);
            self.uncounted.pop_front();
        }
    }

    fn refresh_stats(&mut self) {
        self.stats.held_bytes = self.held;
        self.stats.read_seeks = self.counter.read_seeks;
        self.stats.write_seeks = self.counter.write_seeks;
        self.stats.bytes_read = self.counter.bytes_read;
        self.stats.fill_bytes = self.reader.fill_bytes;
        self.stats.advised_bytes = self.reader.advised_bytes;
        // Writes wait to be counted in the plan's order, but progress need
        // not: a stepped read block's slabs show as they are written.
        self.stats.bytes_written = self.counter.bytes_written
            + self
                .uncounted
                .iter()
                .map(|io| io.writes.written_bytes())
                .sum::<u64>();
    }

    fn hold(&mut self, bytes: u64) {
        self.held += bytes;
        self.note_peak(self.held);
    }

    fn note_peak(&mut self, bytes: u64) {
        self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(bytes);
    }

    /// Reads step `step_index` (of `Plan::steps`) into its pieces, one per
    /// write block it overlaps, and files them under their write blocks.
    fn read_step(&mut self, step_index: &[usize], workers: &Workers) -> Result<()> {
        let plan = self.plan;
        let step_box = plan.steps.block(step_index);
        let grid = PieceGrid::new(&plan.write, &step_box);
        if self.current_read < self.first_read {
            let skipped = (0..grid.count()).map(|_| Vec::new()).collect();
            self.pending.file_step(plan, &grid, step_index, skipped);
            return Ok(());
        }
        let lens: Vec<usize> = grid.volumes().map(|v| (v * self.elem) as usize).collect();
        let peak = plan.prediction.peak_bytes;
        let mut buffers = self.pool.take_step(&lens, self.held, peak);
        self.hold(step_box.volume() * self.elem);
        self.reader
            .read_step(&step_box, &grid, &mut buffers, (&mut self.counter, workers))?;
        // A decoded input block was held beside the step while it was
        // read, and the encoders may hold their blocks.
        let decoded = std::mem::take(&mut self.reader.decoded_peak);
        self.note_peak(self.held + decoded + self.writing);
        self.pending.file_step(plan, &grid, step_index, buffers);
        Ok(())
    }

    /// Takes the pieces of `slab`, a slab of the completed write block
    /// `write_index`, out of the pending store, for the writer.
    fn take_write_job(&mut self, write_index: &[usize], slab: &Region) -> Result<WriteJob> {
        let pieces = self.pending.take_slab(self.plan, write_index, slab)?;
        Ok(WriteJob {
            write_box: slab.clone(),
            read_block: self.current_read,
            // The slab's volume, but for pieces of skipped read blocks.
            bytes: pieces.iter().map(|piece| piece.len() as u64).sum(),
            pieces,
        })
    }
}

/// A read block's I/O, kept until it can be counted in the plan's order.
struct ReadBlockIo {
    read_block: u64,
    /// Its reads, once it is read (counted: emptied).
    reads: Option<SeekLog>,
    /// The writes of its write block's slabs written so far.
    writes: SeekLog,
    slabs_handed: u64,
    slabs_written: u64,
}

impl ReadBlockIo {
    fn new(read_block: u64) -> ReadBlockIo {
        ReadBlockIo {
            read_block,
            reads: None,
            writes: SeekLog::default(),
            slabs_handed: 0,
            slabs_written: 0,
        }
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
