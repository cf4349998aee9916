//! The executor's input side: block files kept open and checked before
//! their first read, the kernel kept reading ahead of the plan, absent
//! chunks filled, and each input told to a witness before it is read, so
//! that a view can tell later whether an input it read has changed.
//!
//! An input rewritten while it is read (`cp new old` keeps its inode) would
//! give blocks that mix its old and new bytes. Each file's identity
//! ([`FileIdentity`]: size, mtime, ctime, inode) is taken when it is first
//! opened, and the open file is stat'ed again after every read of it (and
//! a reopened one at its open): any difference stops the run with
//! [`Error::InputChanged`] before a block made from those bytes is handed
//! to the writer, so none is ever completed. A stat is no seek.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata};
use std::num::NonZeroUsize;
use std::path::Path;

use lru::LruCache;

use super::pieces::{ClaimedRegion, InFile, PieceGrid, RowLayout, SharedPieces};
use super::seekio::{FileKey, SeekCounter, SeekLog};
use super::workers::Workers;
use crate::array::geometry::{IndexBox, Partition, Region};
use crate::error::{Error, Result};
use crate::format::hdf5::Hdf5BlockReader;
use crate::format::Storage;
use crate::input::{FileIdentity, HeaderCheck, InputArray, InputBlock};
use crate::plan::Plan;
use crate::sys::files::open_regular_with_metadata;
use crate::sys::pagecache;

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
pub(super) fn fill_absent(
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

/// Input bytes the kernel is asked to read ahead of the executor, at most.
const PREFETCH_BYTES: u64 = 32 << 20;

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
pub(super) enum InputHandle {
    /// Opened to be read ahead, with its stat then; its header not yet
    /// checked.
    Opened(File, Metadata),
    /// Raw C-order bytes at `data_offset`.
    Contiguous { file: File, data_offset: u64 },
    /// Read through libhdf5.
    Hdf5(Hdf5BlockReader),
    /// Read whole and decoded ([`Storage::Encoded`]).
    Encoded(File),
}

impl InputHandle {
    /// Readies input block `rank` for reading (in `opened` if the file is
    /// open already), checking its header if the scan did not
    /// ([`InputArray::confirmed_storage`]). Returns the file's identity
    /// as it was opened, to check it against after the reads
    /// ([`InputHandle::identity_now`]).
    pub(super) fn open(
        input: &InputArray,
        rank: u64,
        opened: Option<(File, Metadata)>,
        witness: Option<&dyn InputWitness>,
    ) -> Result<(InputHandle, FileIdentity)> {
        let block = &input.blocks[rank as usize];
        let hdf5 = |dataset: &str| {
            Ok(InputHandle::Hdf5(Hdf5BlockReader::open(
                &block.path,
                dataset,
            )?))
        };
        if let (None, Storage::Hdf5Dataset { dataset }) = (&block.check, &block.storage) {
            // Nothing to check, and libhdf5 opens the file itself: its
            // path is stat'ed before.
            let meta =
                std::fs::metadata(&block.path).map_err(|e| Error::io(&block.path, "stat", e))?;
            tell_witness(witness, rank, block, Some(&meta))?;
            return Ok((hdf5(dataset)?, FileIdentity::of_metadata(&meta)));
        }
        // The stat taken at the open serves the identity, the witness and
        // the header check (the length).
        let (file, meta) = match opened {
            Some(opened) => opened,
            None => open_regular_with_metadata(&block.path)?,
        };
        let identity = FileIdentity::of_metadata(&meta);
        tell_witness(witness, rank, block, Some(&meta))?;
        let handle = match input.confirmed_storage(rank as usize, &file, Some(&meta))? {
            Storage::Contiguous { data_offset } => InputHandle::Contiguous { file, data_offset },
            Storage::Hdf5Dataset { dataset } => hdf5(&dataset)?,
            Storage::Encoded { .. } => InputHandle::Encoded(file),
            Storage::Absent { .. } => {
                return Err(Error::bad_input(
                    &block.path,
                    "an absent chunk has no file to read",
                ))
            }
        };
        Ok((handle, identity))
    }

    /// The identity of `block`'s file now: a stat of the open file, or of
    /// its path for one libhdf5 holds.
    pub(super) fn identity_now(&self, block: &InputBlock) -> Result<FileIdentity> {
        match self.file() {
            Some(file) => file
                .metadata()
                .map(|meta| FileIdentity::of_metadata(&meta))
                .map_err(|e| Error::io(&block.path, "stat", e)),
            None => FileIdentity::of(&block.path),
        }
    }

    /// The open file, where the bytes are read with pread.
    fn file(&self) -> Option<&File> {
        match self {
            InputHandle::Opened(file, _)
            | InputHandle::Contiguous { file, .. }
            | InputHandle::Encoded(file) => Some(file),
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
pub(super) fn read_ahead_input(
    file: &File,
    check: Option<&HeaderCheck>,
    start: u64,
    len: u64,
) -> u64 {
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

/// [`Error::InputChanged`] for `block` unless its identity `now` is
/// `then`, the one it had when first opened.
pub(super) fn unchanged(block: &InputBlock, then: &FileIdentity, now: &FileIdentity) -> Result<()> {
    if then == now {
        return Ok(());
    }
    Err(Error::InputChanged {
        path: block.path.clone(),
        change: now.changes_from(then),
    })
}

/// Where [`InputReader::read_ahead`] has got to in the plan's reads.
#[derive(Default)]
struct ReadAheadCursor {
    /// The read block whose inputs are being advised.
    block: u64,
    /// Its inputs not yet advised, the next one last.
    inputs: Vec<Vec<usize>>,
    /// Bytes advised and not yet read.
    outstanding: u64,
}

/// The executor's reading of input blocks into a step's pieces: the files
/// kept open, the kernel kept reading ahead of the plan's reads, and the
/// pages of inputs read to the end dropped when the page cache cannot hold
/// the array.
pub(super) struct InputReader<'a> {
    plan: &'a Plan,
    input: &'a InputArray,
    /// The input's own blocks (a part's plan clips them).
    grid: Partition,
    elem: u64,
    handles: LruCache<u64, InputHandle>,
    pub(super) witness: Option<&'a dyn InputWitness>,
    /// This read block's reads, counted once the previous write block's
    /// writes are (see [`SeekLog`]).
    pub(super) reads: SeekLog,
    /// How many input bytes to ask the kernel for ahead of the reads.
    read_ahead: u64,
    ahead: ReadAheadCursor,
    /// Whether inputs' pages are dropped once read (arrays the page cache
    /// cannot hold: [`crate::sys::cgroup::page_cache_cannot_hold`]).
    drop_inputs: bool,
    /// Elements of partly read input blocks still to be read, by rank.
    unread: HashMap<u64, u64>,
    /// The identity of each input file partly read, as first opened.
    identities: HashMap<u64, FileIdentity>,
    /// Input bytes the kernel was asked for (`RunStats::advised_bytes`).
    pub(super) advised_bytes: u64,
    /// Bytes of absent chunks filled (`RunStats::fill_bytes`).
    pub(super) fill_bytes: u64,
    /// The largest decoded input block held since last taken: held beside
    /// the step being read, so it counts in the peak.
    pub(super) decoded_peak: u64,
}

impl<'a> InputReader<'a> {
    pub(super) fn new(plan: &'a Plan, input: &'a InputArray) -> InputReader<'a> {
        InputReader {
            plan,
            input,
            grid: input.grid(),
            elem: input.dtype.size as u64,
            handles: LruCache::new(
                NonZeroUsize::new(crate::sys::limits::input_files_kept_open())
                    .unwrap_or(NonZeroUsize::MIN),
            ),
            witness: None,
            reads: SeekLog::default(),
            read_ahead: read_ahead_bytes(plan, crate::sys::cgroup::memory_limit()),
            ahead: ReadAheadCursor::default(),
            drop_inputs: crate::sys::cgroup::page_cache_cannot_hold(input.nbytes()),
            unread: HashMap::new(),
            identities: HashMap::new(),
            advised_bytes: 0,
            fill_bytes: 0,
            decoded_peak: 0,
        }
    }

    /// Reads the step `step_box` into its pieces `buffers` (the cells of
    /// `grid`), from every input block it overlaps. The step's files are
    /// opened and checked on the workers and kept open in C order; then the
    /// workers take its blocks one at a time, each reading its block (an
    /// encoded one whole, then decoding it) and copying it into the pieces
    /// ([`SharedPieces`]): the storage sees a queue as deep as the workers,
    /// and the step waits for them once. The calls are logged here in the
    /// plan's order, so their count is the plan's for any number of
    /// workers: in [`reads`](Self::reads); an absent chunk of an array read in place,
    /// which makes none, is counted in `counter` at once. At most one
    /// encoded block per worker is decoded and held at a time: counted in
    /// [`decoded_peak`](Self::decoded_peak) as the planner allows for them,
    /// each at the largest the step decodes (exact edge blocks are
    /// smaller).
    pub(super) fn read_step(
        &mut self,
        step_box: &Region,
        grid: &PieceGrid,
        buffers: &mut [Vec<u8>],
        (counter, workers): (&mut SeekCounter, &Workers),
    ) -> Result<()> {
        let plan = self.plan;
        let (cells, regions): (Vec<Vec<usize>>, Vec<Region>) =
            IndexBox::new(plan.input.overlapping(step_box))
                .filter_map(|cell| {
                    let region = plan.input.block(&cell).intersect(step_box)?;
                    Some((cell, region))
                })
                .unzip();
        // The files of the blocks being read stay open in the cache until
        // they are read: never more of them than it holds.
        let batch_len = self.handles.cap().get();
        let mut largest = 0u64;
        let encoded = self.input.files.is_encoded();
        for (batch, batch_regions) in cells.chunks(batch_len).zip(regions.chunks(batch_len)) {
            // Read-ahead opens files into the cache too: done first, so
            // that it never closes one of the batch's.
            self.read_ahead(workers);
            let located: Vec<(u64, InFile, &Region)> = batch
                .iter()
                .zip(batch_regions)
                .map(|(cell, region)| {
                    let (rank, place) = self.locate(cell, region);
                    (rank, place, region)
                })
                .collect();
            let ranks: Vec<u64> = located.iter().map(|(rank, ..)| *rank).collect();
            self.ready_blocks(&ranks, workers)?;
            let by_library = located
                .iter()
                .any(|(rank, ..)| matches!(self.handles.peek(rank), Some(InputHandle::Hdf5(_))));
            if by_library {
                // libhdf5 fills whole pieces, under its lock: one block at a time.
                for (rank, place, region) in &located {
                    self.read_input(*rank, place, region, grid, buffers, counter)?;
                }
            } else {
                let pieces = SharedPieces::new(grid, buffers, (&plan.input, batch), self.elem)?;
                let (input, handles) = (self.input, &self.handles);
                let read = workers.map(located.iter().enumerate(), |(k, (rank, place, _))| {
                    let block = &input.blocks[*rank as usize];
                    let target = pieces.claim(k)?;
                    read_block(block, (handles.peek(rank), encoded), place, target)
                });
                for decoded in read {
                    largest = largest.max(decoded?);
                }
                for (rank, place, region) in &located {
                    self.log_read(*rank, place, region, grid, counter)?;
                }
            }
            for (cell, (rank, _, region)) in batch.iter().zip(&located) {
                self.check_unchanged(*rank)?;
                self.done_with(cell, *rank, region, step_box);
            }
        }
        if encoded {
            let widest = cells.len().min(workers.count()) as u64;
            self.decoded_peak = self.decoded_peak.max(widest * largest);
        }
        Ok(())
    }

    /// After `region` of input `rank` (at `input_index`) is read for step
    /// `step_box`: the read-ahead window moves on, and an input read to its
    /// end is forgotten (its pages dropped where the page cache cannot
    /// hold the array).
    fn done_with(&mut self, input_index: &[usize], rank: u64, region: &Region, step_box: &Region) {
        if let Some((_, _, len)) = self.input_span(input_index, step_box) {
            self.ahead.outstanding = self.ahead.outstanding.saturating_sub(len);
        }
        let volume = self.plan.input.block(input_index).volume();
        let unread = self.unread.entry(rank).or_insert(volume);
        *unread = unread.saturating_sub(region.volume());
        if *unread == 0 {
            self.unread.remove(&rank);
            self.identities.remove(&rank);
            if self.drop_inputs {
                self.finished_with_input(rank);
            }
        }
    }

    /// Readies input blocks `ranks` for the workers to read: their files
    /// open and checked in the cache (an absent chunk has none). The files
    /// not yet checked are opened and checked on the workers, each an open
    /// and a stat (metadata round trips, on a cluster filesystem), then
    /// kept in the cache in order; the first error in order is returned.
    fn ready_blocks(&mut self, ranks: &[u64], workers: &Workers) -> Result<()> {
        let mut unready = Vec::new();
        for &rank in ranks {
            if let Storage::Absent { .. } = self.input.blocks[rank as usize].storage {
                continue;
            }
            match self.handles.get(&rank) {
                Some(InputHandle::Opened(..)) => match self.handles.pop(&rank) {
                    Some(InputHandle::Opened(file, meta)) => {
                        unready.push((rank, Some((file, meta))))
                    }
                    _ => unready.push((rank, None)),
                },
                Some(_) => {}
                None => unready.push((rank, None)),
            }
        }
        let (input, witness) = (self.input, self.witness);
        let opened = workers.map(unready, |(rank, file)| {
            (rank, InputHandle::open(input, rank, file, witness))
        });
        for (rank, result) in opened {
            let (handle, identity) = result?;
            note_identity(
                &mut self.identities,
                &input.blocks[rank as usize],
                rank,
                identity,
            )?;
            self.handles.put(rank, handle);
        }
        Ok(())
    }

    /// Logs the reads of `region` of input block `rank` (lying in its file
    /// as `place` says) that a worker made: an encoded block's bytes in one
    /// call; a block read in place, its segments; an absent chunk, told
    /// to the witness, an empty call (encoded arrays) or the segments its
    /// file would cost, counted in `counter` at once.
    fn log_read(
        &mut self,
        rank: u64,
        place: &InFile,
        region: &Region,
        grid: &PieceGrid,
        counter: &mut SeekCounter,
    ) -> Result<()> {
        let block = &self.input.blocks[rank as usize];
        let key = FileKey::Input(rank);
        let layout = || RowLayout::in_file(region, place, self.elem, grid);
        match &block.storage {
            Storage::Absent { .. } => {
                tell_witness(self.witness, rank, block, None)?;
                if self.input.files.is_encoded() {
                    self.fill_bytes += region.volume() * self.elem;
                    self.reads.read(key, 0, 0);
                    return Ok(());
                }
                let filled = &mut self.fill_bytes;
                layout().for_each_segment(|segment| {
                    counter.read(key, segment.offset, segment.len);
                    *filled += segment.len;
                    Ok(())
                })
            }
            Storage::Encoded { offset, len, .. } => {
                self.reads.read(key, *offset, *len);
                Ok(())
            }
            _ => {
                let Some(InputHandle::Contiguous { data_offset, .. }) = self.handles.peek(&rank)
                else {
                    return Err(unchecked(&block.path));
                };
                let reads = &mut self.reads;
                layout().for_each_segment(|segment| {
                    reads.read(key, data_offset + segment.offset, segment.len);
                    Ok(())
                })
            }
        }
    }

    /// After a read of input `rank`: its file must still be the one first
    /// opened ([`unchanged`]). An absent chunk was never opened.
    fn check_unchanged(&mut self, rank: u64) -> Result<()> {
        let Some(then) = self.identities.get(&rank) else {
            return Ok(());
        };
        let block = &self.input.blocks[rank as usize];
        let now = match self.handles.peek(&rank) {
            Some(handle) => handle.identity_now(block)?,
            None => FileIdentity::now(&block.path)?,
        };
        unchanged(block, then, &now)
    }

    /// Reads nothing before read block `first` (a resumed run): read-ahead starts there.
    pub(super) fn start_at(&mut self, first: u64) {
        self.ahead.block = first;
    }

    /// Input block `input_index` of the plan as the input's own block: its
    /// rank among the input's blocks, and where `region` (inside it, in
    /// the plan's coordinates) lies in its file. A part of a job
    /// ([`crate::plan::Problem::part`]) clips the input blocks at its
    /// edges; its coordinates start at its origin in the whole array.
    fn locate(&self, input_index: &[usize], region: &Region) -> (u64, InFile) {
        let problem = &self.plan.problem;
        let global: Vec<usize> = (0..input_index.len())
            .map(|d| input_index[d] + (problem.origin[d] / problem.input_block[d]) as usize)
            .collect();
        let block_box = self.grid.block(&global);
        let file_box = self.input.files.file_box(&block_box);
        let in_whole = Region::new(
            (0..region.ndim())
                .map(|d| region.origin[d] + problem.origin[d])
                .collect(),
            region.shape.clone(),
        );
        // A part of a job may read the blocks it clips bridged.
        let window = problem.read_window(&block_box, &file_box);
        let place = InFile::of(&in_whole, &file_box).bridging(window);
        (self.grid.linear(&global), place)
    }

    /// The bytes of input `input_index` that read block `read_box` reads,
    /// as one span of its file (first to last byte), for contiguous inputs.
    fn input_span(&self, input_index: &[usize], read_box: &Region) -> Option<(u64, u64, u64)> {
        let region = self.plan.input.block(input_index).intersect(read_box)?;
        let (rank, place) = self.locate(input_index, &region);
        let data_offset = match self.input.blocks[rank as usize].storage {
            Storage::Contiguous { data_offset } => data_offset,
            // Read whole, whatever part the read block needs.
            Storage::Encoded { offset, len, .. } => return Some((rank, offset, len)),
            _ => return None,
        };
        let file_strides = crate::array::geometry::strides(&place.shape);
        let first = crate::array::geometry::linear_offset(&place.origin, &file_strides);
        let last_coords: Vec<u64> = (0..region.ndim())
            .map(|d| place.origin[d] + region.shape[d] - 1)
            .collect();
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
    fn read_ahead(&mut self, workers: &Workers) {
        let total = self.plan.read.count();
        let mut advice = Vec::new();
        while self.ahead.block < total
            && (self.ahead.outstanding == 0 || self.ahead.outstanding < self.read_ahead)
        {
            let read_box = self
                .plan
                .read
                .block(&self.plan.read_index_at(self.ahead.block));
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
            advice.push((rank, start, len));
        }
        // The files not open yet are opened on the workers, each a metadata
        // round trip; the advice then goes out in the order of the reads.
        let mut seen = HashSet::new();
        let unopened: Vec<u64> = advice
            .iter()
            .map(|&(rank, ..)| rank)
            .filter(|rank| !self.handles.contains(rank) && seen.insert(*rank))
            .collect();
        let input = self.input;
        let mut opened: HashMap<u64, (File, Metadata)> = workers
            .map(unopened, |rank| {
                // A file that cannot be opened is left for the read to report.
                let opened = open_regular_with_metadata(&input.blocks[rank as usize].path).ok();
                opened.map(|opened| (rank, opened))
            })
            .into_iter()
            .flatten()
            .collect();
        for (rank, start, len) in advice {
            if let Some((file, meta)) = opened.remove(&rank) {
                self.handles.put(rank, InputHandle::Opened(file, meta));
            }
            let block = &self.input.blocks[rank as usize];
            self.advised_bytes += match self.handles.get(&rank) {
                Some(InputHandle::Opened(file, _)) => {
                    read_ahead_input(file, block.check.as_deref(), start, len)
                }
                Some(InputHandle::Contiguous { file, .. } | InputHandle::Encoded(file)) => {
                    read_ahead_input(file, None, start, len)
                }
                Some(InputHandle::Hdf5(_)) | None => 0,
            };
        }
    }

    /// Every byte of input `rank` the plan needs has been read (each is
    /// read once): its file is closed and its pages dropped
    /// ([`pagecache::drop_cached_pages`]), only its own bytes' when the
    /// file holds other blocks too (TIFF pages and strips), whose pages
    /// may have been read ahead.
    fn finished_with_input(&mut self, rank: u64) {
        let Some(handle) = self.handles.pop(&rank) else {
            return;
        };
        let Some(file) = handle.file() else {
            return;
        };
        match self.span_in_shared_file(rank) {
            Some((offset, len)) => pagecache::drop_cached_range(file, offset, len),
            None => pagecache::drop_cached_pages(file),
        }
    }

    /// Where input `rank`'s bytes lie in its file, if the blocks beside it
    /// in the grid are in the same file.
    fn span_in_shared_file(&self, rank: u64) -> Option<(u64, u64)> {
        let blocks = &self.input.blocks;
        let block = &blocks[rank as usize];
        let neighbours = [rank.checked_sub(1), rank.checked_add(1)];
        let shared = neighbours
            .into_iter()
            .flatten()
            .filter_map(|other| blocks.get(other as usize))
            .any(|other| other.path == block.path);
        if !shared {
            return None;
        }
        match block.storage {
            Storage::Contiguous { data_offset } => {
                let region = self.plan.input.block(&self.plan.input.unravel(rank));
                let file_box = self.input.files.file_box(&region);
                Some((data_offset, file_box.volume() * self.elem))
            }
            Storage::Encoded { offset, len, .. } => Some((offset, len)),
            _ => None,
        }
    }

    /// Reads `region` of input block `rank` (lying in its file as `place`
    /// says) into the pieces `buffers` of `grid`.
    fn read_input(
        &mut self,
        rank: u64,
        place: &InFile,
        region: &Region,
        grid: &PieceGrid,
        buffers: &mut [Vec<u8>],
        counter: &mut SeekCounter,
    ) -> Result<()> {
        let block = &self.input.blocks[rank as usize];
        let layout = RowLayout::in_file(region, place, self.elem, grid);
        if let Storage::Absent { fill } = &block.storage {
            self.fill_bytes +=
                fill_absent(self.witness, rank, block, fill, &layout, buffers, counter)?;
            return Ok(());
        }
        let key = FileKey::Input(rank);
        let opened = (&mut self.handles, &mut self.identities);
        match ready_handle(opened, self.input, rank, self.witness)? {
            InputHandle::Contiguous { file, data_offset } => {
                let reads = &mut self.reads;
                layout.read_segments((file, &block.path, *data_offset), buffers, |segment| {
                    reads.read(key, data_offset + segment.offset, segment.len)
                })
            }
            InputHandle::Hdf5(reader) => {
                let reads = &mut self.reads;
                count_as_contiguous(&layout, |offset, len| reads.read(key, offset, len))?;
                read_hdf5_pieces(reader, place, region, grid, buffers)
            }
            InputHandle::Opened(..) | InputHandle::Encoded(_) => Err(unchecked(&block.path)),
        }
    }
}

/// The decoded bytes of encoded input block `block` (all of its file, of
/// `file_shape`, padding included), through its open `handle`. Its encoded
/// bytes are read whole in one call
/// ([`BlockDecode::read_decoded`](crate::format::decode::BlockDecode::read_decoded)),
/// at their offset for their length, which is what `count` is told: one
/// seek, as the planner predicts. An absent chunk (no handle) is the fill
/// value, counted as an empty call at offset 0: one seek too, so that a
/// plan's count does not depend on which chunks exist.
pub(super) fn decoded_block(
    handle: Option<&InputHandle>,
    block: &InputBlock,
    file_shape: &[u64],
    mut count: impl FnMut(u64, u64),
) -> Result<Vec<u8>> {
    match (&block.storage, handle) {
        (Storage::Absent { fill }, _) => {
            count(0, 0);
            Ok(fill.repeat(crate::array::geometry::volume(file_shape) as usize))
        }
        (
            Storage::Encoded {
                decoder,
                offset,
                len,
            },
            Some(InputHandle::Encoded(file)),
        ) => {
            let decoded = decoder.read_decoded(&block.path, file, *offset, *len)?;
            count(*offset, *len);
            Ok(decoded)
        }
        _ => Err(not_scanned_encoded(&block.path)),
    }
}

/// A worker's read of input block `block` (through its `handle`, in an
/// array whose blocks are `encoded` or not) into `target`, its region of
/// a step's pieces, which lies in its file as `place` says. An encoded
/// block is read whole and decoded first (an absent one is its fill
/// value); returns the bytes decoded, 0 for a block read in place.
fn read_block(
    block: &InputBlock,
    (handle, encoded): (Option<&InputHandle>, bool),
    place: &InFile,
    mut target: ClaimedRegion<'_>,
) -> Result<u64> {
    let layout = target.layout(place);
    if encoded {
        let decoded = decoded_block(handle, block, &place.shape, |_, _| {})?;
        layout.for_each_segment(|segment| {
            layout.copy_segment_from(&decoded, 0, segment, &mut target)
        })?;
        return Ok(decoded.len() as u64);
    }
    match (&block.storage, handle) {
        (Storage::Absent { fill }, _) => {
            layout.for_each_segment(|segment| layout.fill_segment(segment, &mut target, fill))?
        }
        (_, Some(InputHandle::Contiguous { file, data_offset })) => {
            layout.read_segments((file, &block.path, *data_offset), &mut target, |_| {})?
        }
        _ => return Err(unchecked(&block.path)),
    }
    Ok(0)
}

/// The error for a block read as encoded that was not scanned as such.
fn not_scanned_encoded(path: &Path) -> Error {
    Error::bad_input(
        path,
        "is read as an encoded chunk but was not scanned as one",
    )
}

/// Input block `rank`'s handle in `handles`, ready to read: the cached one,
/// its header checked first if it was only opened to be read ahead. A file
/// opened now has its identity noted in `identities`, or, opened before
/// (evicted from the cache), checked against the one noted then.
fn ready_handle<'h>(
    (handles, identities): (
        &'h mut LruCache<u64, InputHandle>,
        &mut HashMap<u64, FileIdentity>,
    ),
    input: &InputArray,
    rank: u64,
    witness: Option<&dyn InputWitness>,
) -> Result<&'h InputHandle> {
    let (handle, opened_as) = match handles.pop(&rank) {
        Some(InputHandle::Opened(file, meta)) => {
            let (handle, identity) = InputHandle::open(input, rank, Some((file, meta)), witness)?;
            (handle, Some(identity))
        }
        Some(handle) => (handle, None),
        None => {
            let (handle, identity) = InputHandle::open(input, rank, None, witness)?;
            (handle, Some(identity))
        }
    };
    if let Some(identity) = opened_as {
        note_identity(identities, &input.blocks[rank as usize], rank, identity)?;
    }
    handles.put(rank, handle);
    handles.get(&rank).ok_or_else(|| {
        Error::bad_input(
            &input.blocks[rank as usize].path,
            "input handle vanished from cache",
        )
    })
}

/// Notes `identity`, that of input `rank`'s file (`block`) as just opened,
/// in `identities`; a file opened before (and since evicted from the cache)
/// must be as it was then ([`unchanged`]).
fn note_identity(
    identities: &mut HashMap<u64, FileIdentity>,
    block: &InputBlock,
    rank: u64,
    identity: FileIdentity,
) -> Result<()> {
    match identities.entry(rank) {
        Entry::Occupied(first) => unchanged(block, first.get(), &identity),
        Entry::Vacant(entry) => {
            entry.insert(identity);
            Ok(())
        }
    }
}

/// Counts, through `count`, the segments a contiguous file would cost for
/// `layout`, for reads that libhdf5 makes: so plans stay comparable.
pub(super) fn count_as_contiguous(
    layout: &RowLayout,
    mut count: impl FnMut(u64, u64),
) -> Result<()> {
    layout.for_each_segment(|segment| {
        count(segment.offset, segment.len);
        Ok(())
    })
}

/// Reads `region` of an HDF5 dataset (lying in its file as `place` says)
/// into the pieces `buffers` of `grid` that it overlaps: libhdf5 moves the
/// bytes.
pub(super) fn read_hdf5_pieces(
    reader: &Hdf5BlockReader,
    place: &InFile,
    region: &Region,
    grid: &PieceGrid,
    buffers: &mut [Vec<u8>],
) -> Result<()> {
    for (local, buffer) in buffers.iter_mut().enumerate() {
        let piece = grid.piece_box(local);
        if let Some(part) = piece.intersect(region) {
            let in_file = place.of_part(region, &part);
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

/// The error for a file read before its header was checked.
pub(super) fn unchecked(path: &Path) -> Error {
    Error::bad_input(path, "read before its header was checked")
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
