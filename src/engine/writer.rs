//! The write side: pieces wait here until their write block is complete,
//! then go, a slab at a time, to a writer thread that gathers them into
//! the output files while the reader goes on with the next step. A padded
//! (Zarr) edge chunk is written as if its file held just its block, the
//! padding between its rows filled in the same calls. Encoded
//! output blocks (the sink's [`BlockSink::encoder`]) are gathered whole
//! in memory instead, each in one slab (the planner cuts no slab through
//! one), encoded, and written in one call.

use std::collections::HashMap;
use std::io::IoSlice;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use parking_lot::Mutex;

use super::pieces::{InFile, PackingBuffer, PieceGrid, RowLayout, Segment};
use super::seekio::{self, FileKey, SeekLog};
use super::sink::{BlockSink, OutputTarget};
use super::workers::on_workers;
use crate::array::geometry::{show_shape, volume, IndexBox, Region};
use crate::error::{Error, Result};
use crate::format::encode::BlockEncode;
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

/// What the writer thread reports for one job.
pub(super) struct WriteReport {
    pub(super) read_block: u64,
    pub(super) writes: SeekLog,
    pub(super) blocks_completed: u64,
    /// Bytes of the encoded blocks the job wrote, before encoding.
    pub(super) encoded_from: u64,
    /// The job's pieces, written, back for reuse ([`BufferPool`]).
    ///
    /// [`BufferPool`]: super::pool::BufferPool
    pub(super) pieces: Vec<Vec<u8>>,
}

/// The writer thread's state: output blocks' remaining volumes, the write
/// log, and the buffer small row parts are packed through.
pub(super) struct Writer<'a> {
    plan: &'a Plan,
    elem: u64,
    remaining: HashMap<u64, u64>,
    packing: PackingBuffer,
    encoder: Option<Arc<dyn BlockEncode>>,
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
            packing: PackingBuffer::new(),
            encoder: None,
            cancel,
        }
    }

    /// The writer thread: writes each job from `jobs` into `sink` and
    /// sends its report, until the jobs end or nobody listens.
    pub(super) fn serve(
        mut self,
        jobs: Receiver<WriteJob>,
        reports: Sender<Result<WriteReport>>,
        sink: &Mutex<&mut (dyn BlockSink + Send)>,
    ) {
        self.encoder = sink.lock().encoder();
        for job in jobs {
            let report = self.write(job, &mut **sink.lock());
            if reports.send(report).is_err() {
                return;
            }
        }
    }

    /// Writes a slab of a completed write block to its output blocks,
    /// gathering from its pieces, which go back with the report.
    fn write(&mut self, job: WriteJob, sink: &mut dyn BlockSink) -> Result<WriteReport> {
        let plan = self.plan;
        let write_box = &job.write_box;
        let grid = PieceGrid::new(&plan.steps, write_box);
        // Where the write block this slab belongs to ends along the first
        // dimension: slabs before it are followed by the rest.
        let firsts = plan.write.axis(0);
        let write_end = firsts.end(firsts.locate(write_box.origin[0]));
        let mut writes = SeekLog::default();
        let mut blocks_completed = 0;
        let mut encoded_from = 0;
        let mut batch = Vec::new();
        for output_index in IndexBox::new(plan.output.overlapping(write_box)) {
            if self.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(Error::Cancelled);
            }
            let block = plan.output.block(&output_index);
            let Some(region) = block.intersect(write_box) else {
                continue;
            };
            let rank = plan.output.linear(&output_index);
            if !sink.wants(rank) {
                continue;
            }
            if let Some(encoder) = self.encoder.clone() {
                batch.push((rank, block, region));
                if batch.len() == plan.problem.workers.max(1) {
                    let batch_report =
                        self.write_encoded(sink, &*encoder, &batch, &grid, &job.pieces)?;
                    writes.extend(batch_report.0);
                    encoded_from += batch_report.1;
                    blocks_completed += batch.len() as u64;
                    batch.clear();
                }
                continue;
            }
            // Writing the region again after a full disk rewrites the
            // same bytes in place; only the attempt that succeeds counts.
            let region_writes = loop {
                match self.write_region(
                    sink,
                    rank,
                    (&block, write_end),
                    &region,
                    &grid,
                    &job.pieces,
                ) {
                    Err(error) if error.is_no_space() => sink.no_space(error)?,
                    result => break result?,
                }
            };
            writes.extend(region_writes);
            if sink.takes_written() {
                let data = gather(&region, &region, self.elem, &grid, &job.pieces)?;
                sink.written(rank, &region, &data)?;
            }
            if self.completes(rank, &block, &region) {
                sink.complete(rank)?;
                blocks_completed += 1;
            }
        }
        if let (Some(encoder), false) = (self.encoder.clone(), batch.is_empty()) {
            let (batch_writes, raw_len) =
                self.write_encoded(sink, &*encoder, &batch, &grid, &job.pieces)?;
            writes.extend(batch_writes);
            encoded_from += raw_len;
            blocks_completed += batch.len() as u64;
        }
        Ok(WriteReport {
            read_block: job.read_block,
            writes,
            blocks_completed,
            encoded_from,
            pieces: job.pieces,
        })
    }

    /// Gathers the output blocks of `batch` (rank, block, and the region
    /// of it the slab holds, which must be all of it: the plan hands
    /// encoded blocks over whole) from `pieces` into their files' arrays
    /// and encodes them, one per worker thread at once, then writes each
    /// encoding in one call, in the batch's (the plan's) order, completing
    /// each; returns the calls and the bytes encoded.
    fn write_encoded(
        &mut self,
        sink: &mut dyn BlockSink,
        encoder: &dyn BlockEncode,
        batch: &[(u64, Region, Region)],
        grid: &PieceGrid,
        pieces: &[Vec<u8>],
    ) -> Result<(SeekLog, u64)> {
        let mut files = Vec::with_capacity(batch.len());
        for (rank, block, region) in batch {
            let target = sink.target(*rank)?;
            check_file_holds(&target, block)?;
            let path = PathBuf::from(target.path);
            if region != block {
                return Err(Error::Internal(format!(
                    "plan error: encoded output block {} handed to the writer in parts",
                    path.display()
                )));
            }
            files.push((path, target.file_shape.to_vec()));
        }
        let elem = self.elem;
        let encode = |((_, block, _), (path, file_shape)): (
            &(u64, Region, Region),
            &(PathBuf, Vec<u64>),
        )| {
            let file_box = Region::new(block.origin.clone(), file_shape.clone());
            let raw = gather(block, &file_box, elem, grid, pieces)?;
            let raw_len = raw.len() as u64;
            Ok((encoder.encode(path, file_shape, raw)?, raw_len))
        };
        let encoded: Vec<Result<(Vec<u8>, u64)>> = on_workers(batch.iter().zip(&files), encode);
        let mut writes = SeekLog::default();
        let mut raw_total = 0;
        for ((rank, _, _), result) in batch.iter().zip(encoded) {
            let (encoded, raw_len) = result?;
            // Writing again after a full disk rewrites the same bytes in place.
            loop {
                let written = {
                    let target = sink.target(*rank)?;
                    seekio::write_all_at(target.file, target.path, &mut [IoSlice::new(&encoded)], 0)
                };
                match written {
                    Err(error) if error.is_no_space() => sink.no_space(error)?,
                    result => break result?,
                }
            }
            writes.write(FileKey::Output(*rank), 0, encoded.len() as u64);
            raw_total += raw_len;
            sink.complete(*rank)?;
        }
        Ok((writes, raw_total))
    }

    /// Writes `region` of output block `rank` (`block`, in a write block
    /// ending at `write_end` along the first dimension) from `pieces`;
    /// returns the calls made.
    fn write_region(
        &mut self,
        sink: &mut dyn BlockSink,
        rank: u64,
        (block, write_end): (&Region, u64),
        region: &Region,
        grid: &PieceGrid,
        pieces: &[Vec<u8>],
    ) -> Result<SeekLog> {
        let target = sink.target(rank)?;
        check_file_holds(&target, block)?;
        let file_box = Region::new(block.origin.clone(), target.file_shape.to_vec());
        // A padded edge chunk is written as if its file held just its
        // block: each run of rows in one call, the padding between them
        // filled with zeros (the fill value), as the planner counts.
        let place = InFile::of(region, &file_box)
            .bridging(Region::new(vec![0; block.ndim()], block.shape.clone()));
        let layout = RowLayout::in_file(region, &place, self.elem, grid);
        let tail = padding_after_slab(region, (block, write_end), target.file_shape) * self.elem;
        let mut writes = SeekLog::default();
        write_segments(
            &target,
            FileKey::Output(rank),
            (&layout, tail),
            pieces,
            &mut self.packing,
            &mut writes,
        )?;
        Ok(writes)
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
    let layout = RowLayout::new(region, file_box, elem, grid);
    layout.for_each_segment(|segment| {
        let base = segment.offset as usize;
        layout.for_each_part(segment.rows.clone(), |part| {
            let at = base + part.at;
            raw[at..at + part.len]
                .copy_from_slice(&pieces[part.piece][part.offset..part.offset + part.len]);
            Ok(())
        })
    })?;
    Ok(raw)
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
