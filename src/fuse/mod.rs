//! The FUSE adapter: translates fuser's calls into [`ViewCore`] methods and
//! their results into replies. No decisions about the view are made here:
//! what to answer, and how an open file is served, is the core's; what is
//! left is fuser's types, the kernel's settings, and the passthrough
//! backings the core's answers name.
//!
//! Reads of pending blocks hand fuser's `ReplyData` to the core, which
//! parks it; the session loop moves on at once. Every write path answers
//! EROFS.

mod client;
mod daemon;
mod mountpoint;

/// Bringing a view up and down, as the commands call it: checks before
/// mounting, the daemon that serves the view, and what other processes do
/// to it (status, wait, unmount).
pub mod session {
    pub use super::client::{check_daemon, detach, read_status, unmount, wait_status, Unmounted};
    pub use super::daemon::{log_path, serve, serve_in_background, Extras};
    pub use super::mountpoint::{check_fuse, check_mount_point, is_mounted};
}

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::view::{BlockOpen, CacheMode, NodeAttr, NodeKind, ViewCore};

/// Block files never change, so the kernel may trust their attributes long.
const STABLE_TTL: Duration = Duration::from_secs(3600);

/// Parked reads beyond fuser's default of 16 would stall every other read.
const MAX_BACKGROUND: u16 = 256;

/// Readahead allowed to the kernel: one page (see `init`).
const READAHEAD_BYTES: u32 = 4096;

/// How often the threads that parked reads are checked for having been
/// interrupted or killed ([`ViewCore::interrupt_requesters`]).
const REQUESTER_CHECK: Duration = Duration::from_millis(200);

/// The filesystem the kernel talks to.
pub struct RechunkFs {
    core: Arc<ViewCore>,
    /// The passthrough backing of each inode the core serves so (one per
    /// inode, for as long as any handle using it is open). Its lock is held
    /// from the core's answer to an open or release until the backing is
    /// registered or dropped, so the two agree.
    backing: Mutex<HashMap<u64, BackingId>>,
    /// To the thread that reads ahead for sweeping readers
    /// ([`ViewCore::read_ahead`]): opening a cold file blocks on the disk,
    /// which must not hold up the thread answering the open.
    read_ahead: Option<SyncSender<Vec<u64>>>,
}

/// Read-ahead requests waiting for the thread; more are dropped (advice).
const READ_AHEAD_QUEUE: usize = 64;

impl RechunkFs {
    pub fn new(core: Arc<ViewCore>) -> RechunkFs {
        let (sender, requests) = sync_channel::<Vec<u64>>(READ_AHEAD_QUEUE);
        let reader_core = core.clone();
        let worker = std::thread::Builder::new()
            .name("read-ahead".into())
            .spawn(move || {
                for ranks in requests {
                    reader_core.read_ahead(&ranks);
                }
            });
        let read_ahead = match worker {
            Ok(_) => Some(sender),
            Err(e) => {
                log::warn!("no read-ahead for sweeping readers: cannot start its thread ({e})");
                None
            }
        };
        watch_requesters(core.clone());
        RechunkFs {
            core,
            backing: Mutex::new(HashMap::new()),
            read_ahead,
        }
    }

    fn attr(&self, node: &NodeAttr) -> FileAttr {
        let (kind, nlink) = match node.kind {
            NodeKind::Directory => (FileType::Directory, 2),
            NodeKind::File => (FileType::RegularFile, 1),
        };
        FileAttr {
            ino: INodeNo(node.ino),
            size: node.size,
            blocks: node.size.div_ceil(512),
            atime: node.mtime,
            mtime: node.mtime,
            ctime: node.mtime,
            crtime: node.mtime,
            kind,
            perm: node.perm,
            nlink,
            uid: node.uid,
            gid: node.gid,
            rdev: 0,
            // Readers size their buffered reads by this: a page, so that a
            // reader parsing a header (Python's io, numpy) asks for the
            // header page only, never for pending data.
            blksize: 4096,
            flags: 0,
        }
    }

    fn ttl(&self, ino: u64) -> Duration {
        if self.core.changes(ino) {
            Duration::ZERO
        } else {
            STABLE_TTL
        }
    }
}

impl RechunkFs {
    /// Replies to an open the page cache may keep, in the mode the core
    /// chooses: cached, or passthrough (registering the inode's backing at
    /// its first passthrough open).
    fn open_kept(&self, ino: u64, handle: u64, reply: ReplyOpen) {
        let mut backing = self.backing.lock();
        let fh = FileHandle(handle);
        match self.core.open_block(ino, handle) {
            BlockOpen::Cached => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
            BlockOpen::Passthrough => match backing.get(&ino) {
                Some(id) => reply.opened_passthrough(fh, FopenFlags::empty(), id),
                None => {
                    log::error!("inode {ino}: no passthrough backing; serving it by reads");
                    self.core.serve_cached(handle);
                    reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE);
                }
            },
            BlockOpen::PassthroughFrom(file) => match reply.open_backing(file.as_fd()) {
                Ok(id) => {
                    let id = backing.entry(ino).or_insert(id);
                    reply.opened_passthrough(fh, FopenFlags::empty(), id);
                }
                Err(e) => {
                    log::warn!("passthrough refused ({e}); serving completed blocks by reads");
                    self.core.allow_passthrough(false);
                    self.core.serve_cached(handle);
                    reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE);
                }
            },
        }
    }

    /// Hands the done blocks a reader sweeping the view will open next to
    /// the read-ahead thread.
    fn read_ahead_after(&self, ino: u64) {
        let ahead = self.core.opened(ino);
        if let (false, Some(sender)) = (ahead.is_empty(), &self.read_ahead) {
            let _ = sender.try_send(ahead);
        }
    }
}

/// Starts a thread that answers, with EINTR, the parked reads of threads
/// interrupted or gone since (fuser does not pass FUSE INTERRUPT on; see
/// [`crate::sys::process`]).
fn watch_requesters(core: Arc<ViewCore>) {
    let watcher = std::thread::Builder::new()
        .name("requesters".into())
        .spawn(move || loop {
            std::thread::sleep(REQUESTER_CHECK);
            let ended = core.interrupt_requesters(crate::sys::process::requester);
            if ended > 0 {
                log::info!("{ended} parked reads ended: their readers were interrupted or gone");
            }
        });
    if let Err(e) = watcher {
        log::warn!("parked reads of killed readers stay parked: cannot start its thread ({e})");
    }
}

/// An error about the view's mount point (or what mounting it needs).
fn bad_view(path: &std::path::Path, problem: impl Into<String>) -> crate::error::Error {
    crate::error::Error::BadOutput {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

fn errno(code: i32) -> Errno {
    Errno::from(std::io::Error::from_raw_os_error(code))
}

impl Filesystem for RechunkFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_background(MAX_BACKGROUND) {
            log::warn!("kernel allows only {max} background requests");
            let _ = config.set_max_background(max);
        }
        // The kernel's readahead would turn a small read of a header into
        // a request that reaches into pending data, and park it. With one
        // page of readahead, a header read asks for the header page only;
        // large reads still go out as large requests (up to max_pages).
        if let Err(nearest) = config.set_max_readahead(READAHEAD_BYTES) {
            let _ = config.set_max_readahead(nearest);
        }
        // Passthrough (Linux 6.9+, CAP_SYS_ADMIN) serves completed blocks
        // from the staging files inside the kernel; without it, reads come
        // here and are served by pread.
        if config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS)
            .is_err()
        {
            log::info!("the kernel lists directories without attributes (no READDIRPLUS)");
        }
        // Without CAP_SYS_ADMIN (a mount by an ordinary user) the kernel
        // would refuse every backing: not asked for at all, so nothing is
        // tried and nothing is reported.
        let privileged = crate::sys::process::may_use_passthrough();
        let passthrough = privileged
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        self.core.allow_passthrough(passthrough);
        log::info!(
            "passthrough for completed blocks: {}",
            match (privileged, passthrough) {
                (_, true) => "offered by the kernel",
                (false, false) => "not used (it needs CAP_SYS_ADMIN)",
                (true, false) => "not available",
            }
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.core.lookup(parent.0, name) {
            Ok(node) => reply.entry(&self.ttl(node.ino), &self.attr(&node), Generation(0)),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.getattr(ino.0) {
            Ok(node) => reply.attr(&self.ttl(ino.0), &self.attr(&node)),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
        match self.core.open(ino.0, write) {
            Ok((handle, CacheMode::KeepCache)) => {
                self.open_kept(ino.0, handle, reply);
                self.read_ahead_after(ino.0);
            }
            Ok((handle, CacheMode::Direct)) => {
                reply.opened(FileHandle(handle), FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(code) => reply.error(errno(code)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.core.read_by(
            req.pid(),
            ino.0,
            fh.0,
            offset,
            size,
            Box::new(move |result| match result {
                Ok(bytes) => reply.data(&bytes),
                Err(code) => reply.error(errno(code)),
            }),
        );
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut backing = self.backing.lock();
        if let Some(ino) = self.core.release(fh.0) {
            backing.remove(&ino);
        }
        drop(backing);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is ever dirty here. ENOSYS tells the kernel so once and
        // for all: it stops sending FLUSH on every close (one round trip
        // per file saved), and close() still succeeds.
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.getattr(ino.0) {
            Ok(node) if node.kind == NodeKind::Directory => {
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.core.readdir(ino.0, offset) {
            Ok(entries) => {
                for (next, entry) in entries {
                    let kind = match entry.kind {
                        NodeKind::Directory => FileType::Directory,
                        NodeKind::File => FileType::RegularFile,
                    };
                    if reply.add(INodeNo(entry.ino), next, kind, &entry.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(code) => reply.error(errno(code)),
        }
    }

    /// Entries with their attributes, so that listing a view and then
    /// opening its files costs no LOOKUP per file.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        match self.core.readdir(ino.0, offset) {
            Ok(entries) => {
                for (next, entry) in entries {
                    let Ok(node) = self.core.getattr(entry.ino) else {
                        continue;
                    };
                    let ttl = self.ttl(entry.ino);
                    if reply.add(
                        INodeNo(entry.ino),
                        next,
                        &entry.name,
                        &ttl,
                        &self.attr(&node),
                        Generation(0),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(code) => reply.error(errno(code)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.core.files().block_count() + 2;
        let bytes = self.core.array_bytes();
        reply.statfs(bytes.div_ceil(4096), 0, 0, files, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.core.getxattr(ino.0, name) {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() <= size as usize => reply.data(&value),
            Ok(_) => reply.error(Errno::ERANGE),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = self.core.listxattr(ino.0);
        if size == 0 {
            reply.size(names.len() as u32);
        } else if names.len() <= size as usize {
            reply.data(&names);
        } else {
            reply.error(Errno::ERANGE);
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.core.getattr(ino.0) {
            Ok(_) if mask.contains(AccessFlags::W_OK) => reply.error(Errno::EROFS),
            Ok(_) => reply.ok(),
            Err(code) => reply.error(errno(code)),
        }
    }

    // Every way of changing the view is refused: it is read-only.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
}

#[cfg(test)]
mod tests {
    /// The daemon takes what runs beside the mount from the command, so
    /// HTTP and FUSE are siblings over the view's core.
    #[test]
    fn the_adapter_does_not_import_the_http_server() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fuse");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                !text.contains(concat!("crate::", "http")),
                "{} imports the HTTP server",
                path.display()
            );
        }
    }
}
