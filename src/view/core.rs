//! The view's filesystem, as plain methods ([`ViewCore`]): the tree of output block files
//! (flat `{i}_{j}_{k}.h5`, Zarr v2 `i.j.k`, or Zarr v3 nested `c/i/j/k`, as
//! [`FileTree`] lays them out) beside static metadata files, their exact
//! sizes, and reads that are answered at once (done blocks, header bytes,
//! metadata) or parked until the block completes (pending data).
//!
//! Nothing here knows about FUSE: [`crate::fuse`] is a thin adapter that
//! calls these methods, and tests drive them directly. Replies are
//! callbacks, so a parked read holds no thread: it waits in a list until
//! the materialiser marks its block done, or until the view fails or shuts
//! down, which answers it with an error, or until the process that made it
//! is interrupted or gone ([`ViewCore::interrupt_requesters`]), which
//! answers it with EINTR.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use lru::LruCache;
use parking_lot::{Condvar, Mutex};

use super::layout::{
    self, BlockTemplates, Namespace, ViewLayout, ViewPyramid, STATE_XATTR, STATUS_INO, STATUS_NAME,
    WAIT_INO, WAIT_NAME,
};
use super::node::{Access, CacheMode, DirEntry, Errno, NodeAttr, NodeKind, ReadReply};
use super::opens::{BlockOpen, OpenFiles};
use super::staging::{Staging, WindowRecord};
use super::sweep::Sweeps;
use crate::array::dtype::DType;
use crate::array::geometry::Partition;
use crate::array::names::block_file_name;
use crate::engine::RunStats;
use crate::error::Result;
use crate::format::{self, BlockTemplate};
use crate::output::filetree::{Dir, FileTree, Node};
use crate::plan::Plan;
use crate::sys::pagecache;

pub(super) struct Waiter {
    offset: u64,
    end: u64,
    /// The thread that made the read (0: unknown).
    pub(super) requester: u32,
    pub(super) reply: ReadReply,
}

/// A read of the wait file, parked until materialising ends.
pub(super) struct EndWaiter {
    handle: u64,
    offset: u64,
    size: u32,
    pub(super) requester: u32,
    pub(super) reply: ReadReply,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Materialising,
    Complete,
    Failed,
    Stopping,
}

/// What extracting one block on demand cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct OnDemandCount {
    pub seeks: u64,
    pub bytes_read: u64,
    pub seconds: f64,
    /// The most bytes held at once.
    pub held_bytes: u64,
}

pub(super) struct ViewState {
    pub(super) done: Vec<bool>,
    pub(super) done_count: u64,
    pub(super) done_bytes: u64,
    pub(super) resumed: u64,
    pub(super) waiters: HashMap<u64, Vec<Waiter>>,
    pub(super) end_waiters: Vec<EndWaiter>,
    pub(super) phase: Phase,
    pub(super) failure: Option<String>,
    pub(super) run: RunStats,
    /// Pending blocks with parked reads, not yet asked for out of order.
    pub(super) urgent: Vec<u64>,
    pub(super) on_demand_blocks: u64,
    pub(super) on_demand_seeks: u64,
    pub(super) on_demand_seconds: f64,
    /// Input bytes read for blocks extracted on demand.
    pub(super) on_demand_bytes_read: u64,
    /// The most bytes one extraction held, and the bytes set aside for
    /// it beside the plan's within `--mem` (0: no extraction).
    pub(super) on_demand_peak_bytes: u64,
    pub(super) on_demand_reserved_bytes: u64,
    /// The threads one extraction reads its input blocks on.
    pub(super) on_demand_threads: usize,
    /// The filesystem the materialiser waits for space on, if it does.
    pub(super) waiting_for_space: Option<std::path::PathBuf>,
}

impl ViewState {
    /// `blocks` blocks, none done yet.
    fn new(blocks: u64) -> ViewState {
        ViewState {
            done: vec![false; blocks as usize],
            done_count: 0,
            done_bytes: 0,
            resumed: 0,
            waiters: HashMap::new(),
            end_waiters: Vec::new(),
            phase: Phase::Materialising,
            failure: None,
            run: RunStats::default(),
            urgent: Vec::new(),
            on_demand_blocks: 0,
            on_demand_seeks: 0,
            on_demand_seconds: 0.0,
            on_demand_bytes_read: 0,
            on_demand_peak_bytes: 0,
            on_demand_reserved_bytes: 0,
            on_demand_threads: 1,
            waiting_for_space: None,
        }
    }
}

/// The state of a mounted view, shared by the filesystem adapter, the
/// materialiser and status readers.
pub struct ViewCore {
    layout: ViewLayout,
    output: Partition,
    /// The pyramid of levels the view serves beside level 0, if any.
    pyramid: Option<ViewPyramid>,
    names: Namespace,
    templates: BlockTemplates,
    pub(super) staging: Arc<Staging>,
    pub(super) planned_seeks: u64,
    /// The most array bytes the plan's run holds, as its plan predicts.
    pub(super) planned_peak_bytes: u64,
    pub(super) state: Mutex<ViewState>,
    /// Notified when a block becomes urgent ([`ViewCore::wait_urgent`]).
    urgent_added: Condvar,
    staged_files: Mutex<LruCache<u64, Arc<File>>>,
    /// Per open handle of a file whose contents change (the status files,
    /// a pyramid's windowed metadata): its bytes when opened, so that
    /// reads at several offsets agree.
    status_snapshots: Mutex<HashMap<u64, Vec<u8>>>,
    /// Level 0's display window, for a pyramid's metadata once complete.
    window: Mutex<WindowRecord>,
    opens: Mutex<OpenFiles>,
    sweeps: Mutex<Sweeps>,
    pub(super) read_ahead_blocks: AtomicU64,
    next_handle: AtomicU64,
    mounted_at: SystemTime,
    pub(super) started: Instant,
    access: Access,
    /// Told the run's progress on the materialiser's thread.
    progress_observer: Option<ProgressObserver>,
}

/// What [`ViewCore::with_progress_observer`] calls.
type ProgressObserver = Box<dyn Fn(&RunStats) + Send + Sync>;

/// Done block files kept open for reads.
const OPEN_STAGED_FILES: usize = 256;

/// How far ahead of a reader sweeping the view its next blocks are read:
/// four blocks (W1's 250 KB blocks read 1.8–2.5× faster cold so), or fewer
/// when they are large: the kernel reads ahead within each file anyway.
const SWEEP_AHEAD_BLOCKS: u64 = 4;
const SWEEP_AHEAD_BYTES: u64 = 32 << 20;

impl ViewCore {
    /// A view of `plan`'s output, its files made from `templates`, staged
    /// in `staging`, with `done` blocks already complete there.
    pub fn new(
        layout: ViewLayout,
        plan: &Plan,
        templates: BlockTemplates,
        staging: Arc<Staging>,
        done: &[u64],
    ) -> ViewCore {
        ViewCore::with_levels(layout, plan, templates, staging, done, None)
    }

    /// As [`ViewCore::new`], serving the levels of `pyramid` too (its
    /// templates in `templates`), each in its directory.
    pub fn with_levels(
        layout: ViewLayout,
        plan: &Plan,
        templates: BlockTemplates,
        staging: Arc<Staging>,
        done: &[u64],
        pyramid: Option<ViewPyramid>,
    ) -> ViewCore {
        let output = plan.output.clone();
        let files = match &pyramid {
            Some(view) => {
                let levels = &view.pyramid.levels;
                let dirs = (0..levels.len())
                    .map(|k| crate::output::pyramid::level_dir(layout.format, levels.len(), k))
                    .collect();
                FileTree::pyramid(layout.format, levels, layout.axis_order, dirs)
            }
            None => FileTree::for_output(layout.format, output.clone(), layout.axis_order),
        };
        let block_bytes = output.block(&output.unravel(0)).volume() * layout.dtype.size as u64;
        let sweeps = Sweeps::new(
            files.block_count(),
            |rank| files.path(rank),
            (SWEEP_AHEAD_BYTES / block_bytes.max(1)).clamp(1, SWEEP_AHEAD_BLOCKS),
        );
        let blocks = files.block_count();
        let core = ViewCore {
            names: Namespace::new(&layout, files, pyramid.as_ref()),
            pyramid,
            planned_seeks: plan.prediction.seeks(),
            planned_peak_bytes: plan.prediction.peak_bytes,
            state: Mutex::new(ViewState::new(blocks)),
            urgent_added: Condvar::new(),
            staged_files: Mutex::new(LruCache::new(
                NonZeroUsize::new(OPEN_STAGED_FILES).unwrap_or(NonZeroUsize::MIN),
            )),
            status_snapshots: Mutex::new(HashMap::new()),
            window: Mutex::new(staging.recorded_window().unwrap_or_default()),
            opens: Mutex::new(OpenFiles::default()),
            sweeps: Mutex::new(sweeps),
            read_ahead_blocks: AtomicU64::new(0),
            next_handle: AtomicU64::new(1),
            mounted_at: SystemTime::now(),
            started: Instant::now(),
            access: Access::everyone(),
            progress_observer: None,
            templates,
            output,
            staging,
            layout,
        };
        core.resume(done);
        core
    }

    /// Counts blocks found complete in the staging area as done (and
    /// resumed); with all of them, the view is complete.
    fn resume(&self, done: &[u64]) {
        let mut state = self.state.lock();
        for &rank in done {
            if let Some(slot) = state.done.get_mut(rank as usize) {
                if !*slot {
                    *slot = true;
                    state.done_count += 1;
                    state.resumed += 1;
                }
            }
        }
        state.done_bytes = 0;
        for rank in 0..state.done.len() as u64 {
            if state.done[rank as usize] {
                state.done_bytes += self.data_len(rank);
            }
        }
        if state.done_count == self.files().block_count() {
            state.phase = Phase::Complete;
        }
    }

    /// The view's files carry `access` (their owner and read bits).
    pub fn with_access(mut self, access: Access) -> ViewCore {
        self.access = access;
        self
    }

    /// Calls `observe` with the run's progress each time the materialiser
    /// reports it, on the materialiser's thread (a panic there fails the
    /// view, as any panic on a view thread does).
    pub fn with_progress_observer(
        mut self,
        observe: impl Fn(&RunStats) + Send + Sync + 'static,
    ) -> ViewCore {
        self.progress_observer = Some(Box::new(observe));
        self
    }

    /// Runs `body`, the work of the view's thread `thread`; if it panics,
    /// the view fails (parked and later reads of pending blocks get EIO,
    /// `status` says which thread panicked and why) rather than staying
    /// `materialising` with no one left to finish it.
    pub fn fail_on_panic<T>(&self, thread: &str, body: impl FnOnce() -> T) -> Option<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
            Ok(value) => Some(value),
            Err(payload) => {
                let message = panic_failure(thread, panic_text(payload.as_ref()));
                log::error!("{message}");
                self.fail(message);
                None
            }
        }
    }

    pub fn layout(&self) -> &ViewLayout {
        &self.layout
    }

    pub fn output(&self) -> &Partition {
        &self.output
    }

    /// The view's pyramid, if it serves one.
    pub fn pyramid(&self) -> Option<&ViewPyramid> {
        self.pyramid.as_ref()
    }

    pub fn staging(&self) -> &Arc<Staging> {
        &self.staging
    }

    /// The files the view serves for the output blocks.
    pub fn files(&self) -> &FileTree {
        self.names.files()
    }

    /// How blocks are encoded whole before they are written (shards), if
    /// they are.
    pub fn encoder(&self) -> Option<Arc<dyn crate::format::encode::BlockEncode>> {
        self.templates.encoder()
    }

    /// The template of output block `rank`'s file (its header bytes and
    /// layout): its file shape's, placed at the block's origin for formats
    /// whose header records it (NIfTI).
    pub fn template(&self, rank: u64) -> Cow<'_, BlockTemplate> {
        let region = self.files().block_region(rank);
        let (level, _) = self.files().level_of(rank);
        let file_shape = self.files().file_shape(rank);
        let template = self.templates.of_shape(level, &file_shape);
        if self.layout.format.traits().place.is_none() {
            return Cow::Borrowed(template);
        }
        let pyramid = self.pyramid.as_ref().map(|p| &p.pyramid);
        let space = layout::level_space_of(&self.layout, pyramid, level);
        Cow::Owned(
            format::place(
                template,
                self.layout.format,
                &file_shape,
                self.layout.dtype,
                &space,
                &region.origin,
            )
            .into_owned(),
        )
    }

    /// Bytes of the array in output block `rank` (not its file's padding).
    fn data_len(&self, rank: u64) -> u64 {
        self.files().block_region(rank).volume() * self.layout.dtype.size as u64
    }

    /// Bytes of the whole array, with every pyramid level.
    pub fn array_bytes(&self) -> u64 {
        let files = self.files();
        (0..files.level_count())
            .map(|k| geometry_bytes(&files.level_grid(k).array_shape(), self.layout.dtype))
            .sum()
    }

    /// The path of output block `rank`'s file in the view (`2_0_1.h5`,
    /// `2.0.1`, `c/2/0/1`).
    pub fn block_name(&self, rank: u64) -> String {
        self.files().path(rank)
    }

    /// Where the staging area keeps output block `rank`'s file: flat
    /// names by grid index, whatever the view's naming.
    pub fn staged_path(&self, rank: u64) -> std::path::PathBuf {
        let (level, local) = self.files().level_of(rank);
        let grid = self.files().level_grid(level);
        let name = block_file_name(&grid.unravel(local), self.layout.format.extension());
        self.staging.block_path(&if level == 0 {
            name
        } else {
            format!("{level}-{name}")
        })
    }

    /// Whether `ino`'s size and contents change while the view is mounted
    /// (the status files, a pyramid's windowed metadata), so that the
    /// kernel must keep neither its attributes nor its pages.
    pub fn changes(&self, ino: u64) -> bool {
        ino == STATUS_INO
            || ino == WAIT_INO
            || self
                .names
                .static_file(ino)
                .is_some_and(|file| file.windowed)
    }

    /// The window gathered so far from level 0 (as level 1 is built), and
    /// whether it is complete: then the pyramid's metadata carries it.
    pub fn window(&self) -> WindowRecord {
        *self.window.lock()
    }

    /// Sets the window gathered from level 0 (see [`ViewCore::window`]).
    pub fn set_window(&self, window: WindowRecord) {
        *self.window.lock() = window;
    }

    /// A static file's bytes now: a pyramid's metadata with the window
    /// once it is complete.
    fn static_bytes<'a>(&self, file: &'a layout::StaticFile) -> Cow<'a, [u8]> {
        let window = self.window();
        match &self.pyramid {
            Some(view) if file.windowed && window.complete => Cow::Owned(layout::windowed(
                &self.layout,
                view,
                &file.name,
                window.seen,
            )),
            _ => Cow::Borrowed(&file.bytes),
        }
    }

    fn node_attr(&self, ino: u64) -> std::result::Result<NodeAttr, Errno> {
        let (kind, size) = if ino == STATUS_INO || ino == WAIT_INO {
            (NodeKind::File, self.status_bytes().len() as u64)
        } else if let Some(file) = self.names.static_file(ino) {
            (NodeKind::File, self.static_bytes(file).len() as u64)
        } else if let Some(rank) = self.names.block_rank(ino) {
            (NodeKind::File, self.template(rank).file_len())
        } else if self.names.dir_of(ino).is_some() {
            (NodeKind::Directory, 0)
        } else {
            return Err(libc::ENOENT);
        };
        Ok(NodeAttr {
            ino,
            kind,
            size,
            mtime: self.mounted_at,
            perm: self.access.perm(kind),
            uid: self.access.uid,
            gid: self.access.gid,
        })
    }

    pub fn getattr(&self, ino: u64) -> std::result::Result<NodeAttr, Errno> {
        self.node_attr(ino)
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> std::result::Result<NodeAttr, Errno> {
        let Some(dir) = self.names.dir_of(parent) else {
            return Err(if self.node_attr(parent).is_ok() {
                libc::ENOTDIR
            } else {
                libc::ENOENT
            });
        };
        let name = name.to_str().ok_or(libc::ENOENT)?;
        if dir == Dir::Root {
            if name == STATUS_NAME {
                return self.node_attr(STATUS_INO);
            }
            if name == WAIT_NAME {
                return self.node_attr(WAIT_INO);
            }
        }
        if let Some(file) = self.names.static_named(dir, name) {
            return self.node_attr(file.ino);
        }
        let node = self.files().lookup(dir, name).ok_or(libc::ENOENT)?;
        self.node_attr(self.names.node_ino(node))
    }

    /// Directory entries from position `offset` on (`.`, `..`; in the root
    /// the metadata and status files; then the tree's entries, blocks in
    /// C order), with each entry's position for resuming.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
    ) -> std::result::Result<impl Iterator<Item = (u64, DirEntry)> + '_, Errno> {
        let Some(dir) = self.names.dir_of(ino) else {
            return Err(if self.node_attr(ino).is_ok() {
                libc::ENOTDIR
            } else {
                libc::ENOENT
            });
        };
        let parent = self.names.node_ino(Node::Dir(self.files().parent(dir)));
        let mut fixed = vec![
            (ino, NodeKind::Directory, ".".to_string()),
            (parent, NodeKind::Directory, "..".to_string()),
        ];
        fixed.extend(
            self.names
                .statics()
                .iter()
                .filter(|file| file.dir == dir)
                .map(|file| (file.ino, NodeKind::File, file.name.clone())),
        );
        if dir == Dir::Root {
            fixed.push((STATUS_INO, NodeKind::File, STATUS_NAME.to_string()));
        }
        let fixed_len = fixed.len() as u64;
        let total = fixed_len + self.files().child_count(dir);
        Ok((offset..total).map(move |position| {
            let entry = if position < fixed_len {
                let (ino, kind, name) = fixed[position as usize].clone();
                DirEntry { ino, kind, name }
            } else {
                let (name, node) = self.files().child(dir, position - fixed_len);
                DirEntry {
                    ino: self.names.node_ino(node),
                    kind: Namespace::node_kind(node),
                    name,
                }
            };
            (position + 1, entry)
        }))
    }

    /// Opens a file: a handle, and how the kernel should cache it. Writes
    /// are refused with EROFS.
    pub fn open(&self, ino: u64, write: bool) -> std::result::Result<(u64, CacheMode), Errno> {
        self.node_attr(ino)?;
        if write {
            return Err(libc::EROFS);
        }
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        if ino == STATUS_INO {
            // One snapshot per open, so reads at several offsets agree.
            self.status_snapshots
                .lock()
                .insert(handle, self.status_bytes());
            return Ok((handle, CacheMode::Direct));
        }
        if ino == WAIT_INO {
            // Its snapshot is taken when materialising has ended.
            return Ok((handle, CacheMode::Direct));
        }
        if let Some(file) = self.names.static_file(ino).filter(|file| file.windowed) {
            let bytes = self.static_bytes(file).into_owned();
            self.status_snapshots.lock().insert(handle, bytes);
            return Ok((handle, CacheMode::Direct));
        }
        Ok((handle, CacheMode::KeepCache))
    }

    /// Closes `handle`. Returns the inode whose passthrough backing it was
    /// the last to use (see [`ViewCore::open_block`]): no longer needed.
    pub fn release(&self, handle: u64) -> Option<u64> {
        self.status_snapshots.lock().remove(&handle);
        self.opens.lock().remove(handle)
    }

    /// Reads `size` bytes at `offset`. `reply` is called now, or later when
    /// the block the bytes belong to completes (or the view fails).
    pub fn read(&self, ino: u64, handle: u64, offset: u64, size: u32, reply: ReadReply) {
        self.read_by(0, ino, handle, offset, size, reply)
    }

    /// [`ViewCore::read`] for thread `requester` (as the FUSE request names
    /// it): a read parked for it ends with EINTR once it is interrupted
    /// or gone ([`ViewCore::interrupt_requesters`]).
    pub fn read_by(
        &self,
        requester: u32,
        ino: u64,
        handle: u64,
        offset: u64,
        size: u32,
        reply: ReadReply,
    ) {
        let read = ReadRequest {
            requester,
            offset,
            size,
            reply,
        };
        let fixed = |bytes: &[u8]| slice_at(bytes, offset, size);
        if ino == STATUS_INO {
            let snapshot = self.status_snapshots.lock().get(&handle).cloned();
            return (read.reply)(Ok(fixed(&snapshot.unwrap_or_else(|| self.status_bytes()))));
        }
        if ino == WAIT_INO {
            return self.read_wait_file(handle, read);
        }
        if let Some(file) = self.names.static_file(ino) {
            if file.windowed {
                if let Some(snapshot) = self.status_snapshots.lock().get(&handle) {
                    return (read.reply)(Ok(fixed(snapshot)));
                }
            }
            return (read.reply)(Ok(fixed(&self.static_bytes(file))));
        }
        if self.names.dir_of(ino).is_some() {
            return (read.reply)(Err(libc::EISDIR));
        }
        let Some(rank) = self.names.block_rank(ino) else {
            return (read.reply)(Err(libc::ENOENT));
        };
        self.read_block(rank, read);
    }

    /// A read of the wait file: parked while materialising, else answered.
    fn read_wait_file(&self, handle: u64, read: ReadRequest) {
        {
            let mut state = self.state.lock();
            if state.phase == Phase::Materialising {
                state.end_waiters.push(EndWaiter {
                    handle,
                    offset: read.offset,
                    size: read.size,
                    requester: read.requester,
                    reply: read.reply,
                });
                return;
            }
        }
        (read.reply)(Ok(slice_at(
            &self.end_snapshot(handle),
            read.offset,
            read.size,
        )))
    }

    /// A read of block `rank`'s file: header and trailer bytes come from its
    /// template, data from the staged file once the block is done.
    fn read_block(&self, rank: u64, read: ReadRequest) {
        let ReadRequest {
            requester,
            offset,
            size,
            reply,
        } = read;
        let template = self.template(rank);
        let file_len = template.file_len();
        let end = offset.saturating_add(size as u64).min(file_len);
        if offset >= end {
            return reply(Ok(Vec::new()));
        }
        let data_start = template.data_offset;
        let data_end = data_start + template.data_len;
        if end <= data_start || offset >= data_end {
            // Header or trailer only: the template has these bytes.
            let bytes = if end <= data_start {
                template.prefix[offset as usize..end as usize].to_vec()
            } else {
                template.suffix[(offset - data_end) as usize..(end - data_end) as usize].to_vec()
            };
            return reply(Ok(bytes));
        }
        let waiter = Waiter {
            offset,
            end,
            requester,
            reply,
        };
        if let Some(reply) = self.park_unless_done(rank, waiter) {
            reply(self.read_staged(rank, offset, end));
        }
    }

    /// Parks `waiter`, a read of block `rank`, until the block is done, or
    /// answers it with EIO if it never will be. Gives the reply back if the
    /// block is done already.
    fn park_unless_done(&self, rank: u64, waiter: Waiter) -> Option<ReadReply> {
        let mut state = self.state.lock();
        if state.done[rank as usize] {
            return Some(waiter.reply);
        }
        match state.phase {
            Phase::Materialising => {
                let waiters = state.waiters.entry(rank).or_default();
                let first = waiters.is_empty();
                waiters.push(waiter);
                if first {
                    // Someone waits for it: the materialiser may
                    // extract it ahead of the plan.
                    state.urgent.push(rank);
                    self.urgent_added.notify_all();
                }
            }
            Phase::Failed | Phase::Stopping | Phase::Complete => {
                drop(state);
                (waiter.reply)(Err(libc::EIO));
            }
        }
        None
    }

    /// The wait file's contents for `handle`: the status when it was first
    /// read after materialising ended, the same for every later read.
    fn end_snapshot(&self, handle: u64) -> Vec<u8> {
        self.status_snapshots
            .lock()
            .entry(handle)
            .or_insert_with(|| self.status_bytes())
            .clone()
    }

    /// Answers the reads of the wait file: materialising has ended.
    fn answer_end_waiters(&self) {
        let end_waiters = std::mem::take(&mut self.state.lock().end_waiters);
        for waiter in end_waiters {
            let snapshot = self.end_snapshot(waiter.handle);
            (waiter.reply)(Ok(slice_at(&snapshot, waiter.offset, waiter.size)));
        }
    }

    fn read_staged(&self, rank: u64, offset: u64, end: u64) -> std::result::Result<Vec<u8>, Errno> {
        let file = self.staged_file(rank).map_err(|e| {
            log::error!("{e}");
            libc::EIO
        })?;
        let mut bytes = vec![0u8; (end - offset) as usize];
        file.read_exact_at(&mut bytes, offset).map_err(|e| {
            log::error!("reading staged block {}: {e}", self.block_name(rank));
            libc::EIO
        })?;
        Ok(bytes)
    }

    fn staged_file(&self, rank: u64) -> Result<Arc<File>> {
        if let Some(file) = self.staged_files.lock().get(&rank) {
            return Ok(file.clone());
        }
        let path = self.staged_path(rank);
        let file = Arc::new(Staging::open_block(&path, false)?);
        self.staged_files.lock().put(rank, file.clone());
        Ok(file)
    }

    /// Notes that a file was opened. For a reader sweeping the blocks in
    /// order ([`Sweeps`]), the done blocks it will open next: to be read
    /// ahead ([`ViewCore::read_ahead`]), away from the thread that answers
    /// the open.
    pub fn opened(&self, ino: u64) -> Vec<u64> {
        let Some(rank) = self.names.block_rank(ino) else {
            return Vec::new();
        };
        let mut ahead = self.sweeps.lock().opened(rank);
        ahead.retain(|&rank| self.is_done(rank));
        ahead
    }

    /// Asks the kernel to read the staged files of done blocks `ranks`.
    /// They stay open in the staged-file cache for the opens that follow.
    pub fn read_ahead(&self, ranks: &[u64]) {
        for &rank in ranks {
            if let Ok(file) = self.staged_file(rank) {
                pagecache::read_ahead(&file, 0, 0);
                self.read_ahead_blocks.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether output block `rank` is complete in the staging area.
    pub fn is_done(&self, rank: u64) -> bool {
        self.state
            .lock()
            .done
            .get(rank as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Marks blocks complete (their data and journal record are durable)
    /// and answers the reads parked on them.
    pub fn mark_done(&self, ranks: &[u64]) {
        let mut woken = Vec::new();
        {
            let mut state = self.state.lock();
            for &rank in ranks {
                if let Some(slot) = state.done.get_mut(rank as usize) {
                    if !*slot {
                        *slot = true;
                        state.done_count += 1;
                        state.done_bytes += self.data_len(rank);
                    }
                }
                if let Some(waiters) = state.waiters.remove(&rank) {
                    woken.push((rank, waiters));
                }
            }
        }
        for (rank, waiters) in woken {
            for waiter in waiters {
                (waiter.reply)(self.read_staged(rank, waiter.offset, waiter.end));
            }
        }
    }

    /// Pending blocks someone is waiting for, oldest first, each returned
    /// once: the materialiser may extract them ahead of the plan.
    pub fn take_urgent(&self) -> Vec<u64> {
        let mut state = self.state.lock();
        let urgent = std::mem::take(&mut state.urgent);
        urgent
            .into_iter()
            .filter(|&rank| !state.done[rank as usize])
            .collect()
    }

    /// As [`ViewCore::take_urgent`], waiting up to `timeout` for one.
    pub fn wait_urgent(&self, timeout: std::time::Duration) -> Vec<u64> {
        {
            let mut state = self.state.lock();
            if state.urgent.is_empty() {
                self.urgent_added.wait_for(&mut state, timeout);
            }
        }
        self.take_urgent()
    }

    /// Whether a read is parked on block `rank`.
    pub fn is_waited_for(&self, rank: u64) -> bool {
        self.state.lock().waiters.contains_key(&rank)
    }

    /// Counts a block extracted ahead of the plan: the seeks, input bytes
    /// and time it took, and the most bytes it held.
    pub fn record_on_demand(&self, extracted: OnDemandCount) {
        let mut state = self.state.lock();
        state.on_demand_blocks += 1;
        state.on_demand_seeks += extracted.seeks;
        state.on_demand_seconds += extracted.seconds;
        state.on_demand_bytes_read += extracted.bytes_read;
        state.on_demand_peak_bytes = state.on_demand_peak_bytes.max(extracted.held_bytes);
    }

    /// The bytes set aside within `--mem` for extracting a block on
    /// demand, on `threads` threads.
    pub fn reserve_on_demand(&self, bytes: u64, threads: usize) {
        let mut state = self.state.lock();
        state.on_demand_reserved_bytes = bytes;
        state.on_demand_threads = threads.max(1);
    }

    /// The threads one extraction reads its input blocks on.
    pub fn on_demand_threads(&self) -> usize {
        self.state.lock().on_demand_threads
    }

    /// The materialiser waits for space on the filesystem at `filesystem`
    /// (or, with `None`, no longer does).
    pub fn waiting_for_space(&self, filesystem: Option<std::path::PathBuf>) {
        self.state.lock().waiting_for_space = filesystem;
    }

    /// Records the materialiser's latest counts.
    pub fn update_run(&self, run: &RunStats) {
        self.state.lock().run = *run;
        if let Some(observe) = &self.progress_observer {
            observe(run);
        }
    }

    /// The materialiser finished: every block is done.
    pub fn finish(&self, run: &RunStats) {
        let mut state = self.state.lock();
        state.run = *run;
        if state.phase == Phase::Materialising {
            state.phase = Phase::Complete;
        }
        // Blocks that were never pending had no waiters; any left are a bug,
        // and must not hang.
        let left: Vec<Waiter> = state.waiters.drain().flat_map(|(_, w)| w).collect();
        drop(state);
        for waiter in left {
            (waiter.reply)(Err(libc::EIO));
        }
        self.answer_end_waiters();
    }

    /// The materialiser failed: pending blocks cannot be served; parked and
    /// later reads of them get EIO. Complete blocks stay readable.
    pub fn fail(&self, message: String) {
        self.end_waiting(Phase::Failed, Some(message));
    }

    /// Shutting down (unmount, signal): parked reads are answered with an
    /// error at once, never left hanging.
    pub fn shutdown(&self) {
        self.end_waiting(Phase::Stopping, None);
    }

    fn end_waiting(&self, phase: Phase, failure: Option<String>) {
        let left: Vec<Waiter> = {
            let mut state = self.state.lock();
            if state.phase != Phase::Complete {
                state.phase = phase;
            }
            // The first failure is the cause; what follows from it (a
            // thread that panicked, then the run it stopped) is not.
            if state.failure.is_none() {
                state.failure = failure;
            }
            state.waiters.drain().flat_map(|(_, w)| w).collect()
        };
        for waiter in left {
            (waiter.reply)(Err(libc::EIO));
        }
        self.answer_end_waiters();
    }

    /// Extended attribute `name` of `ino`.
    pub fn getxattr(&self, ino: u64, name: &OsStr) -> std::result::Result<Vec<u8>, Errno> {
        let rank = self.names.block_rank(ino).ok_or(libc::ENODATA)?;
        if name != STATE_XATTR {
            return Err(libc::ENODATA);
        }
        let state = self.state.lock();
        let value = if state.done[rank as usize] {
            "done"
        } else if state.phase == Phase::Failed {
            "failed"
        } else {
            "pending"
        };
        Ok(value.as_bytes().to_vec())
    }

    pub fn listxattr(&self, ino: u64) -> Vec<u8> {
        if self.names.block_rank(ino).is_some() {
            let mut names = STATE_XATTR.as_bytes().to_vec();
            names.push(0);
            names
        } else {
            Vec::new()
        }
    }
}

impl ViewCore {
    /// Whether done blocks may be served by passthrough (the kernel offers it).
    pub fn allow_passthrough(&self, allowed: bool) {
        self.opens.lock().allow_passthrough(allowed);
    }

    /// How to serve `handle`, an open of `ino` that [`ViewCore::open`]
    /// answered with [`crate::view::CacheMode::KeepCache`]. The caller
    /// registers a [`BlockOpen::PassthroughFrom`] backing (or gives up on
    /// it) before another open or release of the inode is decided.
    pub fn open_block(&self, ino: u64, handle: u64) -> BlockOpen {
        self.opens
            .lock()
            .open_block(ino, handle, || self.done_block_file(ino))
    }

    /// Serves `handle` in cached mode after all: the kernel refused the
    /// backing of its passthrough open.
    pub fn serve_cached(&self, handle: u64) {
        self.opens.lock().serve_cached(handle);
    }

    /// The staged file of `ino` if it is a completed block: what the kernel
    /// may read directly (FUSE passthrough), bypassing this process.
    fn done_block_file(&self, ino: u64) -> Option<Arc<File>> {
        let rank = self.names.block_rank(ino)?;
        if !self.is_done(rank) {
            return None;
        }
        self.staged_file(rank).ok()
    }
}

/// A read as it arrives: who asked, for which bytes, and where the answer goes.
struct ReadRequest {
    requester: u32,
    offset: u64,
    size: u32,
    reply: ReadReply,
}

/// What a panic's payload says: its message, when it is text.
pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

/// The failure a view reports when its thread `thread` panicked, saying `what`.
pub(super) fn panic_failure(thread: &str, what: String) -> String {
    format!(
        "the view's {thread} thread panicked ({what}); this is a bug in rechunkfs or a library \
         it uses: please report it with the daemon's log. Completed blocks stay readable"
    )
}

/// The `size` bytes of `bytes` at `offset`, fewer at its end.
fn slice_at(bytes: &[u8], offset: u64, size: u32) -> Vec<u8> {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    bytes[start..end].to_vec()
}

fn geometry_bytes(array: &[u64], dtype: DType) -> u64 {
    crate::array::geometry::volume(array) * dtype.size as u64
}
