//! The materialiser: a background thread that runs the plan into the
//! staging area and tells the view as each block completes, and beside it
//! an extractor thread that writes the blocks readers wait for straight
//! from the input, without waiting for the plan's step in progress.
//!
//! A block is reported done only after its data are synced and its journal
//! record is synced after them, so a crash never leaves a block recorded
//! complete without its bytes.
//!
//! Each pending block is written by one side only: the plan claims a block
//! when it starts writing it, the extractor before it reads it, and a
//! block claimed by one is skipped by the other ([`Publisher::claim`]).
//! Both publish complete blocks through the one [`Publisher`], which
//! batches their durability and passes level-0 blocks on to a third
//! thread that builds a pyramid's blocks as their sources complete
//! (`Levels`). The extractor holds one output block and one input block's
//! buffer at a time; the view plans the executor within `--mem` less
//! that ([`on_demand_bytes`]), so the two never exceed it together.
//!
//! A full staging filesystem pauses it ([`SpaceWait`]) rather than failing
//! the view, and before it starts, the files an earlier run left of blocks
//! never recorded done are removed: their space is the run's.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::array::geometry::{volume, IndexBox, Partition};
use crate::array::names::parse_grid_index;
use crate::engine::downsample::{LevelBuilder, LevelFiles};
use crate::engine::seekio::{self, FileKey, SeekCounter};
use crate::engine::{
    read_region, region_read_bytes, BlockSink, Executor, OpenOutput, OutputFiles, OutputTarget,
    RunStats,
};
use crate::error::{Error, Result};
use crate::input::InputArray;
use crate::output::pyramid::{files_of, LevelValues};
use crate::plan::Plan;
use crate::sys::pagecache;
use crate::view::core::{OnDemandCount, ViewCore};
use crate::view::space::SpaceWait;
use crate::view::staging::{Staging, WindowRecord};

/// Staging files kept open while partially written.
const OPEN_OUTPUTS: usize = 128;

/// A [`BlockSink`] writing the view's block files into its staging area:
/// the plan's side. Blocks the extractor claimed are skipped.
pub struct StagingSink {
    core: Arc<ViewCore>,
    files: OutputFiles,
    shared: Arc<Mutex<Publisher>>,
    space: SpaceWait,
}

/// Who writes a pending block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claimant {
    Plan,
    Extractor,
}

/// What the plan's sink and the extractor share: who writes each block
/// being written, and the publication of complete blocks.
///
/// A completed block is served at once (its bytes are in the page cache,
/// readable through the staging file), while its durability is batched:
/// the files of a batch are synced, then their journal records are written
/// and synced together. A crash loses only unrecorded blocks, which a
/// remount redoes.
struct Publisher {
    core: Arc<ViewCore>,
    /// Level-0 blocks being written, by whom; a block leaves once done.
    claims: HashMap<u64, Claimant>,
    /// Where complete level-0 blocks go to have their pyramid blocks
    /// built ([`LevelThread`]), while it runs.
    to_levels: Option<crossbeam_channel::Sender<u64>>,
    /// Completed blocks not yet recorded: their data are synced (one
    /// syncfs for the batch) before their journal records are written.
    unsynced: Vec<u64>,
    unsynced_bytes: u64,
    last_flush: Instant,
    /// How long a durability batch stays open ([`SYNC_BATCH_AGE`]).
    batch_age: Duration,
    /// Whether staged blocks' pages are dropped once synced (arrays the
    /// page cache cannot hold: [`crate::sys::cgroup::page_cache_cannot_hold`]).
    drop_synced: bool,
    space: SpaceWait,
}

/// A durability batch closes at this many bytes...
const SYNC_BATCH_BYTES: u64 = 256 << 20;
/// ...or this many blocks...
const SYNC_BATCH_BLOCKS: usize = 1024;
/// ...or this long after the last one.
const SYNC_BATCH_AGE: Duration = Duration::from_secs(2);

/// The most bytes extracting one output block of `output_block` (the
/// shape of the view's blocks, or of its shards of `shard_chunks`) from
/// `input` on `threads` threads holds at once: the block's array, beside
/// either one input block's buffer per thread while they are read
/// ([`region_read_bytes`]) or, for a shard, its encoding. The view's plan
/// leaves this much of `--mem` free.
pub fn on_demand_bytes(
    input: &InputArray,
    output_block: &[u64],
    shard_chunks: Option<&[u64]>,
    threads: usize,
) -> Result<u64> {
    let block = volume(output_block) * input.dtype.size as u64;
    let encoded = match shard_chunks {
        Some(inner) => crate::format::encode::ShardLayout::new(output_block, inner, input.dtype)?
            .template()
            .file_len(),
        None => 0,
    };
    Ok(block + (threads as u64 * region_read_bytes(input)).max(encoded))
}

/// The threads worth extracting an output block of `outputs` from `input`
/// on, of `threads`: no more than the input blocks one output block
/// overlaps at most, each read by one.
pub fn on_demand_threads(input: &InputArray, outputs: &Partition, threads: usize) -> usize {
    let inputs = input.grid();
    let most: u64 = (0..outputs.ndim())
        .map(|d| {
            let (output_axis, input_axis) = (outputs.axis(d), inputs.axis(d));
            (0..output_axis.count())
                .map(|k| {
                    let (start, end) = (output_axis.start(k), output_axis.end(k));
                    input_axis.overlapping(start, end).len() as u64
                })
                .max()
                .unwrap_or(1)
        })
        .product();
    threads.clamp(1, usize::try_from(most).unwrap_or(usize::MAX).max(1))
}

impl StagingSink {
    pub fn new(core: Arc<ViewCore>) -> StagingSink {
        let array_bytes = volume(&core.output().array_shape()) * core.layout().dtype.size as u64;
        let publisher = Publisher {
            drop_synced: crate::sys::cgroup::page_cache_cannot_hold(array_bytes),
            claims: HashMap::new(),
            to_levels: None,
            unsynced: Vec::new(),
            unsynced_bytes: 0,
            last_flush: Instant::now(),
            batch_age: SYNC_BATCH_AGE,
            space: SpaceWait::new(),
            core: core.clone(),
        };
        StagingSink {
            core,
            files: OutputFiles::new(OPEN_OUTPUTS),
            shared: Arc::new(Mutex::new(publisher)),
            space: SpaceWait::new(),
        }
    }

    /// A wait for space ends when `cancel` is set (the view stops).
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> StagingSink {
        self.space = SpaceWait::new().with_cancel(cancel.clone());
        self.shared.lock().space = SpaceWait::new().with_cancel(cancel);
        self
    }

    /// Durability batches stay open for at most `age`.
    fn set_batch_age(&mut self, age: Duration) {
        self.shared.lock().batch_age = age;
    }

    /// Starts extracting the blocks readers wait for from `input`, beside
    /// the plan, until the extractor is stopped (or dropped) or `cancel`
    /// is set. Its memory is [`on_demand_bytes`], which the plan must
    /// leave free.
    pub fn start_extractor(&self, input: InputArray, cancel: Arc<AtomicBool>) -> Result<Extractor> {
        let ended = Arc::new(AtomicBool::new(false));
        let serving = Serving {
            core: self.core.clone(),
            shared: self.shared.clone(),
            input,
            ended: ended.clone(),
            space: SpaceWait::new().with_cancel(cancel.clone()),
            cancel,
        };
        let thread = std::thread::Builder::new()
            .name("extractor".into())
            .spawn(move || {
                let core = serving.core.clone();
                core.fail_on_panic("extractor", || serving.serve());
            })
            .map_err(|e| Error::os("thread spawn", "starting the extractor", e))?;
        Ok(Extractor {
            ended,
            thread: Some(thread),
        })
    }

    /// Records every completed block in the journal, which syncs their data
    /// first: the order that makes a record trustworthy.
    pub fn flush(&mut self) -> Result<()> {
        self.shared.lock().flush()
    }
}

impl BlockSink for StagingSink {
    fn encoder(&self) -> Option<Arc<dyn crate::format::encode::BlockEncode>> {
        self.core.encoder()
    }

    fn wants(&mut self, rank: u64) -> bool {
        self.shared.lock().claim(rank, Claimant::Plan)
    }

    fn target(&mut self, rank: u64) -> Result<OutputTarget<'_>> {
        open_target(&self.core, &mut self.files, rank)
    }

    fn complete(&mut self, rank: u64) -> Result<()> {
        // Closed now: the batch's syncfs needs no open file.
        if let Some(open) = self.files.close(rank) {
            pagecache::start_writeback(&open.file);
        }
        // Its writes went through: a wait for space they were in is over.
        self.space.recovered(&self.core);
        let mut shared = self.shared.lock();
        shared.finish_block(rank)?;
        shared.pass_to_levels(rank);
        Ok(())
    }

    fn no_space(&mut self, error: Error) -> Result<()> {
        self.space.pause(&self.core, &error)
    }
}

/// The file of block `rank`, opened in `files` on its first write.
fn open_target<'f>(
    core: &ViewCore,
    files: &'f mut OutputFiles,
    rank: u64,
) -> Result<OutputTarget<'f>> {
    if !files.is_open(rank) {
        let path = core.staged_path(rank);
        let template = core.template(rank);
        let file = if files.was_created(rank) {
            Staging::open_block(&path, true)?
        } else {
            // Whatever an interrupted run left here is not recorded
            // done, so it is rewritten from scratch.
            Staging::create_block(&template, &path)?
        };
        let output = OpenOutput {
            file: Arc::new(file),
            path,
            data_offset: template.data_offset,
            file_shape: core.files().file_shape(rank),
        };
        files.insert(rank, output);
    }
    files.target(rank)
}

impl Publisher {
    /// Claims pending block `rank` for `who`, unless it is done or the
    /// other side writes it. A claim holds until the block is done (or its
    /// extraction fails: the plan then writes it from scratch).
    fn claim(&mut self, rank: u64, who: Claimant) -> bool {
        if self.core.is_done(rank) {
            return false;
        }
        *self.claims.entry(rank).or_insert(who) == who
    }

    /// Block `rank` is written: served at once, made durable in a batch.
    fn finish_block(&mut self, rank: u64) -> Result<()> {
        self.unsynced_bytes += self.core.template(rank).file_len();
        self.unsynced.push(rank);
        self.core.mark_done(&[rank]);
        self.claims.remove(&rank);
        self.space.recovered(&self.core);
        if self.unsynced_bytes >= SYNC_BATCH_BYTES
            || self.unsynced.len() >= SYNC_BATCH_BLOCKS
            || self.last_flush.elapsed() >= self.batch_age
        {
            loop {
                match self.flush() {
                    Err(error) if error.is_no_space() => self.space.pause(&self.core, &error)?,
                    result => break result?,
                }
            }
            self.space.recovered(&self.core);
        }
        Ok(())
    }

    /// Records every completed block in the journal, which syncs their data
    /// first: the order that makes a record trustworthy.
    fn flush(&mut self) -> Result<()> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        self.core.staging().record_done(&self.unsynced)?;
        // Synced: readers of these blocks now read them from the disk, like
        // blocks done in an earlier session (see pagecache::drop_cached_pages).
        if self.drop_synced {
            for &rank in &self.unsynced {
                pagecache::drop_cached_pages_of(&self.core.staged_path(rank));
            }
        }
        self.unsynced.clear();
        self.unsynced_bytes = 0;
        self.last_flush = Instant::now();
        Ok(())
    }

    /// Level-0 block `rank` is done: the levels build what it completes.
    fn pass_to_levels(&self, rank: u64) {
        if let Some(to_levels) = &self.to_levels {
            // A failed levels thread has failed the view already.
            let _ = to_levels.send(rank);
        }
    }
}

/// Builds the pyramid's blocks, each once the blocks of the level below
/// it is computed from are done, reading those back from the staging
/// area: on a thread of its own while the plan runs ([`LevelThread`]), so
/// that neither the plan's writer nor the extractor waits for it; one
/// block at a time, with one level's buffers.
struct Levels {
    core: Arc<ViewCore>,
    shared: Arc<Mutex<Publisher>>,
    /// Pyramid blocks' files while they are built.
    files: OutputFiles,
    space: SpaceWait,
    /// A pyramid's window, while it is gathered.
    window: Option<Level0Window>,
}

impl Levels {
    fn new(core: Arc<ViewCore>, shared: Arc<Mutex<Publisher>>, cancel: Arc<AtomicBool>) -> Levels {
        Levels {
            window: Level0Window::of(&core),
            core,
            shared,
            files: OutputFiles::new(OPEN_OUTPUTS),
            space: SpaceWait::new().with_cancel(cancel),
        }
    }

    /// After block `rank` is done: builds the block of the next pyramid
    /// level whose sources it completes, if it does (which goes on up
    /// the levels as each completes).
    fn build_parents(&mut self, rank: u64) -> Result<()> {
        let core = self.core.clone();
        let Some(view) = core.pyramid() else {
            return Ok(());
        };
        let files = core.files();
        let (k, local) = files.level_of(rank);
        if k + 1 >= files.level_count() {
            return Ok(());
        }
        let below = files.level_grid(k);
        let origin = below.block(&below.unravel(local)).origin;
        let above = files.level_grid(k + 1);
        let parent: Vec<usize> = (0..origin.len())
            .map(|d| above.axis(d).locate(origin[d] / view.pyramid.factors[d]))
            .collect();
        let parent_local = above.linear(&parent);
        let parent_rank = files.level_ranks(k + 1).start + parent_local;
        if core.is_done(parent_rank) || !sources_done(&core, k + 1, &parent) {
            return Ok(());
        }
        self.build_pyramid_block(k + 1, parent_local)
    }

    /// Computes block `local` of pyramid level `k` from level `k - 1`'s
    /// staged blocks, and completes it like any other.
    fn build_pyramid_block(&mut self, k: usize, local: u64) -> Result<()> {
        let core = self.core.clone();
        let view = core
            .pyramid()
            .ok_or_else(|| Error::Internal("a pyramid block of a view without one".into()))?;
        let files = files_of(core.layout().format);
        let mut builder =
            LevelBuilder::new(&view.pyramid, &files, k, view.rows[k], core.layout().dtype);
        // Level 1 reads every voxel of level 0: its window is gathered so.
        let mut window = if k == 1 { self.window.take() } else { None };
        let mut below = StagedLevel {
            core: &core,
            first: core.files().level_ranks(k - 1).start,
            watched: window.as_mut().map(|w| &mut w.values),
        };
        let first = core.files().level_ranks(k).start;
        let mut sink = LevelSink {
            levels: self,
            first,
        };
        let built = builder.build(local, &mut below, &mut sink);
        if let Some(window) = &mut window {
            if built.is_ok() {
                window.level1_done(&core);
            }
        }
        if k == 1 {
            self.window = window.filter(|w| !w.complete);
        }
        built?;
        // One level's buffers at a time: the next level's block, if this
        // one completes its sources, comes after these are freed.
        drop(builder);
        self.build_parents(first + local)
    }

    /// Builds every pyramid block not done whose sources are (a resumed
    /// view's, left when it stopped between a source and its block).
    fn catch_up(&mut self) -> Result<()> {
        let core = self.core.clone();
        if let Some(window) = &mut self.window {
            window.reread_if_unrecorded(&core)?;
        }
        let files = core.files();
        for k in 1..files.level_count() {
            let grid = files.level_grid(k);
            for local in 0..grid.count() {
                let rank = files.level_ranks(k).start + local;
                if !core.is_done(rank) && sources_done(&core, k, &grid.unravel(local)) {
                    self.build_pyramid_block(k, local)?;
                }
            }
        }
        Ok(())
    }
}

/// The running [`Levels`]: first builds what an earlier run left to build
/// ([`Levels::catch_up`]), then what each level-0 block the publisher
/// passes it completes, until the queue closes or the view stops (what is
/// left then is caught up later). A failure fails the view and stops the
/// plan, as the extractor's does.
struct LevelThread {
    shared: Arc<Mutex<Publisher>>,
    thread: JoinHandle<(Levels, Result<()>)>,
}

impl LevelThread {
    fn start(mut levels: Levels, cancel: Arc<AtomicBool>) -> Result<LevelThread> {
        let shared = levels.shared.clone();
        let (to_levels, done) = crossbeam_channel::unbounded::<u64>();
        // Passed from now on: a block the extractor completes while the
        // levels catch up is built after.
        shared.lock().to_levels = Some(to_levels);
        let spawned = std::thread::Builder::new()
            .name("levels".into())
            .spawn(move || {
                let core = levels.core.clone();
                let build = || {
                    levels.catch_up()?;
                    for rank in done.iter() {
                        if cancel.load(Ordering::Relaxed) {
                            break;
                        }
                        levels.build_parents(rank)?;
                    }
                    Ok(())
                };
                let Some(built) = core.fail_on_panic("levels", build) else {
                    // The view has failed, saying why.
                    cancel.store(true, Ordering::Relaxed);
                    return (
                        levels,
                        Err(Error::Internal("the levels thread panicked".into())),
                    );
                };
                if let Err(error) = &built {
                    if !matches!(error, Error::Cancelled) {
                        log::error!("building the pyramid failed: {error}");
                        core.fail(error.to_string());
                    }
                    cancel.store(true, Ordering::Relaxed);
                }
                (levels, built)
            })
            .map_err(|e| Error::os("thread spawn", "starting the levels thread", e));
        match spawned {
            Ok(thread) => Ok(LevelThread { shared, thread }),
            Err(error) => {
                shared.lock().to_levels = None;
                Err(error)
            }
        }
    }

    /// Waits until every level-0 block passed so far has had its pyramid
    /// blocks built; returns the levels and how their building went.
    fn finish(self) -> Result<(Levels, Result<()>)> {
        // Closing the queue ends the thread once it is empty.
        self.shared.lock().to_levels = None;
        self.thread
            .join()
            .map_err(|_| Error::Internal("the levels thread panicked".into()))
    }
}

/// The running extractor: stopped and joined when dropped.
pub struct Extractor {
    /// Set to stop it after the block in hand.
    ended: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Extractor {
    /// Stops it after the block in hand (which it publishes) and waits.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.ended.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the extractor thread panicked");
            }
        }
    }
}

impl Drop for Extractor {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// How long the extractor waits for a reader before it looks whether it
/// is to stop.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// The extractor's thread.
struct Serving {
    core: Arc<ViewCore>,
    shared: Arc<Mutex<Publisher>>,
    input: InputArray,
    ended: Arc<AtomicBool>,
    cancel: Arc<AtomicBool>,
    space: SpaceWait,
}

impl Serving {
    /// Extracts the level-0 blocks that waited-for blocks need, one at a
    /// time, in the order they were asked for, until stopped: level-0
    /// blocks asked for themselves first, then the sources of pyramid
    /// blocks (a coarse tile's many must not hold up a block's one). A
    /// failure fails the view (and stops the plan) as the plan's own would.
    fn serve(mut self) {
        // (waited-for block, level-0 block it needs), each kind in order
        let mut direct: VecDeque<(u64, u64)> = VecDeque::new();
        let mut sources: VecDeque<(u64, u64)> = VecDeque::new();
        while !self.ended.load(Ordering::Relaxed) && !self.cancel.load(Ordering::Relaxed) {
            let urgent = if direct.is_empty() && sources.is_empty() {
                self.core.wait_urgent(IDLE_WAIT)
            } else {
                self.core.take_urgent()
            };
            for wanted in urgent {
                let queue = match self.core.files().level_of(wanted).0 {
                    0 => &mut direct,
                    _ => &mut sources,
                };
                let needed = level0_sources(&self.core, wanted);
                queue.extend(needed.into_iter().map(|rank| (wanted, rank)));
            }
            let Some((wanted, rank)) = direct.pop_front().or_else(|| sources.pop_front()) else {
                continue;
            };
            // A block nobody waits for any more is left to the plan.
            if self.core.is_done(rank) || !self.core.is_waited_for(wanted) {
                continue;
            }
            // Claimed by the plan, it is being written now: the plan
            // finishes it within the read block in hand.
            if !self.shared.lock().claim(rank, Claimant::Extractor) {
                continue;
            }
            let published = self.extract_waiting_for_space(rank).and_then(|count| {
                // Counted before waiting readers are woken, so the status
                // they see already includes it.
                self.core.record_on_demand(count);
                let mut shared = self.shared.lock();
                shared.finish_block(rank)?;
                shared.pass_to_levels(rank);
                Ok(())
            });
            if published.is_err() {
                self.shared.lock().claims.remove(&rank);
            }
            match published {
                Ok(()) => {}
                Err(Error::Cancelled) => break,
                Err(error) => {
                    log::error!(
                        "extracting {} on demand failed: {error}",
                        self.core.block_name(rank)
                    );
                    self.core.fail(error.to_string());
                    self.cancel.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
    }

    /// [`extract`], tried again while the staging filesystem is full.
    fn extract_waiting_for_space(&mut self, rank: u64) -> Result<OnDemandCount> {
        loop {
            match extract(&self.core, rank, &self.input) {
                Err(error) if error.is_no_space() => self.space.pause(&self.core, &error)?,
                result => {
                    self.space.recovered(&self.core);
                    return result;
                }
            }
        }
    }
}

/// Writes level-0 block `rank` into the staging area, reading just its
/// part of `input`, its data on their way to the disk; the caller
/// publishes it. Holds at most [`on_demand_bytes`]: the block's array
/// (allocated at once at its file's size, padded in place) beside the
/// buffers of the input blocks read at once (up to the view's extraction
/// threads), or beside its encoding.
fn extract(core: &ViewCore, rank: u64, input: &InputArray) -> Result<OnDemandCount> {
    let started = Instant::now();
    let region = core.output().block(&core.output().unravel(rank));
    let template = core.template(rank).into_owned();
    let file_shape = core.files().file_shape(rank);
    let elem = input.dtype.size;
    let file_bytes = volume(&file_shape) as usize * elem;
    let mut data = Vec::with_capacity(file_bytes);
    data.resize(region.volume() as usize * elem, 0);
    let mut counter = SeekCounter::default();
    let reading = read_region(
        input,
        &region,
        &mut data,
        &mut counter,
        Some(core.staging().as_ref()),
        core.on_demand_threads(),
    )?;
    let mut held = file_bytes as u64 + reading;
    if file_shape != region.shape {
        pad_in_place(&mut data, &region.shape, &file_shape, elem);
    }
    let path = core.staged_path(rank);
    // An encoded block (a shard) is its whole file, trailer included.
    let (data, at) = match core.encoder() {
        Some(encoder) => {
            let encoded = encoder.encode(&path, &file_shape, data)?;
            held = held.max((file_bytes + encoded.len()) as u64);
            (encoded, 0)
        }
        None => (data, template.data_offset),
    };
    let file = Staging::create_block(&template, &path)?;
    seekio::write_all_at(&file, &path, &mut [IoSlice::new(&data)], at)?;
    counter.write(FileKey::Output(rank), at, data.len() as u64);
    pagecache::start_writeback(&file);
    Ok(OnDemandCount {
        seeks: counter.seeks(),
        bytes_read: counter.bytes_read,
        seconds: started.elapsed().as_secs_f64(),
        held_bytes: held,
    })
}

/// Removes the staged files of blocks not recorded done, which an earlier
/// run (killed, or stopped by a full disk) left behind: on a full
/// filesystem their space is what this run needs.
fn reclaim_partials(core: &ViewCore) {
    let keep = |name: &str| staged_rank(core, name).is_some_and(|rank| core.is_done(rank));
    match core.staging().reclaim(keep) {
        Ok((0, _)) => {}
        Ok((files, bytes)) => {
            log::info!("removed {files} staged files of blocks never completed ({bytes} bytes)")
        }
        Err(e) => log::warn!("cannot reclaim the space of unfinished blocks: {e}"),
    }
}

/// Whether every block of level `k - 1` that block `index` of level `k`
/// is computed from is done.
fn sources_done(core: &ViewCore, k: usize, index: &[usize]) -> bool {
    let Some(view) = core.pyramid() else {
        return false;
    };
    let files = core.files();
    let source = view.pyramid.source_box(k, index);
    let below = files.level_grid(k - 1);
    let first = files.level_ranks(k - 1).start;
    IndexBox::new(below.overlapping(&source)).all(|i| core.is_done(first + below.linear(&i)))
}

/// The pending level-0 blocks to extract for waited-for block `rank`: the
/// block itself, or those a pyramid block is computed from, which is built
/// as they complete (with the blocks of the levels between): a coarse
/// tile costs the reads of its own region.
fn level0_sources(core: &ViewCore, rank: u64) -> Vec<u64> {
    let files = core.files();
    let (k, _) = files.level_of(rank);
    let Some(view) = core.pyramid().filter(|_| k > 0) else {
        return [rank].into_iter().filter(|&r| !core.is_done(r)).collect();
    };
    let region = files.block_region(rank);
    let scale = view.pyramid.scale(k);
    let level0 = files.level_grid(0);
    let full = level0.array_shape();
    let origin: Vec<u64> = (0..region.ndim())
        .map(|d| region.origin[d] * scale[d])
        .collect();
    let shape = (0..region.ndim())
        .map(|d| (region.end(d) * scale[d]).min(full[d]) - origin[d])
        .collect();
    IndexBox::new(level0.overlapping(&crate::array::geometry::Region::new(origin, shape)))
        .map(|i| level0.linear(&i))
        .filter(|&r| !core.is_done(r))
        .collect()
}

/// A pyramid level's blocks as a [`BlockSink`] of their own ranks
/// (within the level), written into the staging area.
struct LevelSink<'a> {
    levels: &'a mut Levels,
    /// The view's rank of the level's first block.
    first: u64,
}

impl BlockSink for LevelSink<'_> {
    fn target(&mut self, rank: u64) -> Result<OutputTarget<'_>> {
        let levels = &mut *self.levels;
        open_target(&levels.core, &mut levels.files, self.first + rank)
    }

    fn complete(&mut self, rank: u64) -> Result<()> {
        let rank = self.first + rank;
        if let Some(open) = self.levels.files.close(rank) {
            pagecache::start_writeback(&open.file);
        }
        self.levels.space.recovered(&self.levels.core);
        // The next level's block is built once this level's builder has
        // let go of its buffers (see `Levels::build_pyramid_block`).
        self.levels.shared.lock().finish_block(rank)
    }

    fn no_space(&mut self, error: Error) -> Result<()> {
        let levels = &mut *self.levels;
        levels.space.pause(&levels.core, &error)
    }
}

/// A done level's staged blocks, read back to build the level below it.
struct StagedLevel<'a> {
    core: &'a ViewCore,
    first: u64,
    /// Level 0's values, watched as they are read (building level 1).
    watched: Option<&'a mut LevelValues>,
}

impl LevelFiles for StagedLevel<'_> {
    fn read_data(&mut self, rank: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        let local = rank;
        let rank = self.first + rank;
        let path = self.core.staged_path(rank);
        let data_offset = self.core.template(rank).data_offset;
        let file = Staging::open_block(&path, false)?;
        std::os::unix::fs::FileExt::read_exact_at(&file, buf, data_offset + offset)
            .map_err(|e| Error::io(&path, "reading back", e))?;
        if let Some(values) = &mut self.watched {
            values.observe(local, offset, buf);
            // Noted before the level-1 block completes, so the journal
            // records it no later than the block it covers.
            self.core.staging().note_window(WindowRecord {
                seen: values.window(),
                complete: false,
            });
        }
        Ok(())
    }
}

/// Level 0's range of values (the pyramid's display window), gathered as
/// level 1's blocks read level 0 back, at no read more; complete once
/// every level-1 block is done. What was gathered is recorded in the
/// journal with the blocks it covers, so a remount goes on from it.
struct Level0Window {
    values: LevelValues,
    /// Level-1 blocks not done yet.
    left: u64,
    /// Nothing recorded, yet level-1 blocks are done (an area from a
    /// version that recorded no window): their sources are read again.
    unrecorded: bool,
    complete: bool,
}

impl Level0Window {
    /// The window of `core`'s pyramid, unless there is none or it is complete.
    fn of(core: &ViewCore) -> Option<Level0Window> {
        let view = core.pyramid()?;
        if core.window().complete || view.pyramid.levels.len() < 2 {
            return None;
        }
        let files = core.files();
        let recorded = core.staging().recorded_window();
        let level1 = files.level_ranks(1);
        let left = level1.clone().filter(|&rank| !core.is_done(rank)).count() as u64;
        let mut window = Level0Window {
            values: LevelValues::new(
                files.level_grid(0),
                core.layout().format,
                core.layout().dtype,
            )
            .seen(recorded.and_then(|r| r.seen)),
            unrecorded: recorded.is_none() && left < level1.end - level1.start,
            left,
            complete: false,
        };
        if !window.unrecorded {
            window.complete_if_done(core);
        }
        Some(window)
    }

    /// A level-1 block is done.
    fn level1_done(&mut self, core: &ViewCore) {
        self.left = self.left.saturating_sub(1);
        self.complete_if_done(core);
    }

    /// With every level-1 block done, the window is complete: the view
    /// serves it, and the journal records it.
    fn complete_if_done(&mut self, core: &ViewCore) {
        if self.left > 0 {
            return;
        }
        let record = WindowRecord {
            seen: self.values.window(),
            complete: true,
        };
        self.complete = true;
        core.staging().note_window(record);
        core.set_window(record);
    }

    /// Reads level 0's done blocks for an area that recorded no window.
    fn reread_if_unrecorded(&mut self, core: &ViewCore) -> Result<()> {
        if !std::mem::take(&mut self.unrecorded) {
            return Ok(());
        }
        for rank in core.files().level_ranks(0) {
            if !core.is_done(rank) {
                continue;
            }
            let path = core.staged_path(rank);
            let template = core.template(rank);
            let mut data = vec![0u8; template.data_len as usize];
            let file = Staging::open_block(&path, false)?;
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut data, template.data_offset)
                .map_err(|e| Error::io(&path, "reading back", e))?;
            self.values.observe(rank, 0, &data);
        }
        core.staging().note_window(WindowRecord {
            seen: self.values.window(),
            complete: false,
        });
        self.complete_if_done(core);
        Ok(())
    }
}

/// The output block whose staged file is named `name`, if one is
/// (`{i}_{j}_{k}.ext` for level 0, `{level}-{i}_{j}_{k}.ext` for others).
fn staged_rank(core: &ViewCore, name: &str) -> Option<u64> {
    let stem = name.split('.').next()?;
    let (level, stem) = match stem.split_once('-') {
        Some((level, rest)) => (level.parse::<usize>().ok()?, rest),
        None => (0, stem),
    };
    let files = core.files();
    if level >= files.level_count() {
        return None;
    }
    let index = parse_grid_index(stem)?;
    let level_grid = files.level_grid(level);
    let grid = level_grid.grid_shape();
    if index.len() != grid.len() || index.iter().zip(&grid).any(|(i, n)| i >= n) {
        return None;
    }
    let rank = files.level_ranks(level).start + level_grid.linear(&index);
    let staged = core.staged_path(rank);
    (staged.file_name()?.to_str()? == name).then_some(rank)
}

/// Turns `data`, the C-order bytes of a `shape` array, into those of a
/// zero `padded` array holding it at its origin (a Zarr edge chunk), in
/// place: rows move up, last first (none lands on a row not yet moved),
/// then the gaps between them are zeroed. No second copy is held.
fn pad_in_place(data: &mut Vec<u8>, shape: &[u64], padded: &[u64], elem: usize) {
    let last = shape.len() - 1;
    let row = shape[last] as usize * elem;
    let strides = crate::array::geometry::strides(padded);
    let rows: Vec<usize> = shape[..last].iter().map(|&n| n as usize).collect();
    let starts: Vec<usize> = IndexBox::grid(&rows)
        .map(|index| {
            let at: u64 = index
                .iter()
                .zip(&strides)
                .map(|(&i, &s)| i as u64 * s)
                .sum();
            at as usize * elem
        })
        .collect();
    data.resize(volume(padded) as usize * elem, 0);
    for (k, &at) in starts.iter().enumerate().rev() {
        data.copy_within(k * row..(k + 1) * row, at);
    }
    let mut end = 0;
    for &at in &starts {
        data[end..at].fill(0);
        end = at + row;
    }
    let len = data.len();
    data[end..len].fill(0);
}

/// How the materialiser paces itself. The defaults are for use; demos
/// slow it to watch a view fill, and tests hold blocks pending or make
/// records often (the CLI's test hooks set these).
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// A pause after every read block (none by default).
    pub step_delay: Option<Duration>,
    /// How long a durability batch stays open at most
    /// ([`SYNC_BATCH_AGE`] by default).
    pub sync_batch_age: Duration,
}

impl Default for Pacing {
    fn default() -> Pacing {
        Pacing {
            step_delay: None,
            sync_batch_age: SYNC_BATCH_AGE,
        }
    }
}

/// Sleeps for `delay`, or less if `stop` is set meanwhile: a long test
/// delay must not hold up an unmount.
fn pause_unless_stopped(delay: Duration, stop: &AtomicBool) {
    let until = Instant::now() + delay;
    while !stop.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// Runs `plan` into `sink` (with `extractor` beside it, and a pyramid's
/// levels built beside it as their sources complete) until it ends or
/// `stop` is set, then makes whatever completed durable (also when
/// stopping).
fn run(
    core: &Arc<ViewCore>,
    input: &InputArray,
    plan: &Plan,
    (sink, extractor): (&mut StagingSink, Option<Extractor>),
    stop: &Arc<AtomicBool>,
    step_delay: Option<Duration>,
) -> Result<RunStats> {
    let mut read_blocks_done = 0;
    let running = Instant::now();
    let level_thread = match core.pyramid() {
        Some(_) => {
            let levels = Levels::new(core.clone(), sink.shared.clone(), stop.clone());
            Some(LevelThread::start(levels, stop.clone())?)
        }
        None => None,
    };
    let result = Executor::new(plan, input)
        .with_cancel(stop)
        .with_witness(core.staging().as_ref())
        .run(sink, |stats: &RunStats| {
            core.update_run(stats);
            // Progress also comes within a read block's steps;
            // the delay is per read block.
            if stats.read_blocks_done > read_blocks_done {
                read_blocks_done = stats.read_blocks_done;
                if let Some(delay) = step_delay {
                    pause_unless_stopped(delay, stop);
                }
            }
        });
    log::debug!("ran the plan in {:.3} s", running.elapsed().as_secs_f64());
    // Its last block is published before the last flush.
    if let Some(extractor) = extractor {
        extractor.stop();
    }
    let result = match level_thread {
        Some(level_thread) => level_thread.finish().and_then(|(mut levels, built)| {
            // A failure of the levels' own is what stopped the plan.
            built?;
            let stats = result?;
            levels.catch_up().map(|()| stats)
        }),
        None => result,
    };
    // Whatever completed is made durable, also when stopping.
    let flushing = Instant::now();
    let flushed = sink.flush();
    log::debug!("flushed in {:.3} s", flushing.elapsed().as_secs_f64());
    result.and_then(|stats| flushed.map(|()| stats))
}

/// A running materialiser.
pub struct Materialiser {
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends.
    ended: Receiver<()>,
}

/// How long a stop waits for the materialiser, which stops between read
/// blocks and then makes its completed blocks durable. A thread stuck in
/// the kernel (a read from a hung filesystem) is left behind after it.
pub const STOP_GRACE: Duration = Duration::from_millis(1500);

impl Materialiser {
    /// Starts running `plan` over `input` into `core`'s staging area; with
    /// `on_demand`, blocks readers wait for are extracted beside the plan
    /// (which must leave [`on_demand_bytes`] of `--mem` free for it).
    pub fn start(
        core: Arc<ViewCore>,
        input: InputArray,
        plan: Plan,
        on_demand: bool,
    ) -> Result<Materialiser> {
        Materialiser::start_paced(core, input, plan, on_demand, Pacing::default())
    }

    /// [`Materialiser::start`], paced by `pacing`.
    pub fn start_paced(
        core: Arc<ViewCore>,
        input: InputArray,
        plan: Plan,
        on_demand: bool,
        pacing: Pacing,
    ) -> Result<Materialiser> {
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        let (ending, ended) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("materialiser".into())
            .spawn(move || {
                let _ending = ending;
                core.clone().fail_on_panic("materialiser", || {
                    reclaim_partials(&core);
                    let mut sink = StagingSink::new(core.clone()).with_cancel(stop.clone());
                    sink.set_batch_age(pacing.sync_batch_age);
                    let extractor = match on_demand {
                        true => match sink.start_extractor(input.clone(), stop.clone()) {
                            Ok(extractor) => Some(extractor),
                            Err(e) => {
                                log::warn!("{e}: blocks readers wait for wait for the plan");
                                None
                            }
                        },
                        false => None,
                    };
                    let result = run(
                        &core,
                        &input,
                        &plan,
                        (&mut sink, extractor),
                        &stop,
                        pacing.step_delay,
                    );
                    report(&core, &plan, result);
                });
            })
            .map_err(|e| Error::os("thread spawn", "starting the materialiser", e))?;
        Ok(Materialiser {
            cancel,
            thread: Some(thread),
            ended,
        })
    }

    /// The flag that stops the materialiser between read blocks.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Stops it between read blocks and waits for the thread, up to
    /// `grace`. Returns false if the thread did not end by then (it is
    /// stuck in the kernel): it is left running, not joined.
    pub fn stop(mut self, grace: Duration) -> bool {
        self.stop_within(grace)
    }

    fn stop_within(&mut self, grace: Duration) -> bool {
        self.cancel.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else {
            return true;
        };
        match self.ended.recv_timeout(grace) {
            Err(RecvTimeoutError::Timeout) => {
                log::error!(
                    "the materialiser did not stop within {:.1} s (stuck in the kernel?); \
                     leaving it behind",
                    grace.as_secs_f64()
                );
                false
            }
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if thread.join().is_err() {
                    log::error!("the materialiser thread panicked");
                }
                true
            }
        }
    }
}

/// Tells the view how the materialiser's run ended.
fn report(core: &ViewCore, plan: &Plan, result: Result<RunStats>) {
    match result {
        Ok(stats) => {
            log::info!(
                "materialised every block: {} seeks (planned {})",
                stats.seeks(),
                plan.prediction.seeks()
            );
            core.finish(&stats);
        }
        Err(Error::Cancelled) => log::info!("materialiser stopped"),
        Err(error) => {
            log::error!("materialiser failed: {error}");
            core.fail(error.to_string());
        }
    }
}

impl Drop for Materialiser {
    fn drop(&mut self) {
        self.stop_within(STOP_GRACE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_in_place_places_each_row_and_zeros_the_rest() {
        // A 2×3×2 edge chunk of 2-byte elements in a 3×4×5 chunk.
        let (shape, padded, elem) = ([2u64, 3, 2], [3u64, 4, 5], 2usize);
        let data: Vec<u8> = (1..=(2 * 3 * 2 * 2) as u8).collect();
        let mut want = vec![0u8; 3 * 4 * 5 * 2];
        for i in 0..2 {
            for j in 0..3 {
                let from = (i * 3 + j) * 2 * elem;
                let to = (i * 4 + j) * 5 * elem;
                want[to..to + 2 * elem].copy_from_slice(&data[from..from + 2 * elem]);
            }
        }
        let mut got = Vec::with_capacity(want.len());
        got.extend_from_slice(&data);
        let capacity = got.capacity();
        pad_in_place(&mut got, &shape, &padded, elem);
        assert_eq!(got, want);
        assert_eq!(got.capacity(), capacity, "no second buffer");
    }
}
