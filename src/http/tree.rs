//! What is served: a tree of read-only files, found by their path names.
//! A directory on disk ([`DirTree`], which may be a mounted view: its
//! reads then wait for pending blocks in the kernel) or a view's core
//! ([`ViewTree`], whose reads of pending blocks are parked like the FUSE
//! adapter's). What may wait says so beforehand (`would_wait`) and can
//! call back once it need not (`when_ready`), so that a request waiting
//! for a view holds no thread: a view's reads are parked with a callback.
//! A directory's reads cannot be: one through a mounted view waits in the
//! kernel, on the thread that reads.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::view::{Errno, NodeAttr, NodeKind, ViewCore, ROOT_INO, STATE_XATTR, WAIT_INO};

/// Called once what was asked for can be had without waiting.
pub type Ready = Box<dyn FnOnce() + Send>;

/// Why a path cannot be read.
#[derive(Debug)]
pub enum Unreadable {
    NotFound,
    /// A directory: nothing to send (no listings).
    Directory,
    /// A symbolic link leading out of the root, or a file the server's
    /// user may not read.
    Forbidden,
    Failed(std::io::Error),
}

/// An open file of the tree.
pub trait Content: Send {
    /// Its length in bytes, fixed while it is open.
    fn size(&self) -> u64;
    /// Up to `len` bytes at `offset` (fewer only at the end); waits for
    /// data that is not there yet (a pending block).
    fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
    /// Whether `read_at(offset, len)` would wait for data not there yet;
    /// reads nothing.
    fn would_wait(&self, _offset: u64, _len: usize) -> bool {
        false
    }
    /// Calls `ready` once `read_at(offset, len)` would not wait, holding
    /// no thread meanwhile; at once unless it would.
    fn when_ready(&mut self, _offset: u64, _len: usize, ready: Ready) {
        ready()
    }
}

/// A tree of files to serve.
pub trait Tree: Send + Sync {
    /// Opens the file at `names` (checked path names, from the root down).
    fn open(&self, names: &[String]) -> std::result::Result<Box<dyn Content>, Unreadable>;
    /// Whether opening `names` would wait (a view's wait file while the
    /// view is made); looks nothing up on disk.
    fn would_wait(&self, _names: &[String]) -> bool {
        false
    }
    /// Calls `ready` once opening `names` would not wait, holding no
    /// thread meanwhile; at once unless it would.
    fn when_ready(&self, _names: &[String], ready: Ready) {
        ready()
    }
}

/// Whether `tree` has a file at `names`.
pub fn has_file(tree: &dyn Tree, names: &[&str]) -> bool {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    tree.open(&names).is_ok()
}

/// A directory on disk. Paths are resolved beneath it by the kernel
/// (`openat2` with `RESOLVE_BENEATH`): a symbolic link inside it that
/// leads out of it, even one made after the server started, is refused.
pub struct DirTree {
    root: OwnedFd,
    path: PathBuf,
}

impl DirTree {
    pub fn new(path: &Path) -> Result<DirTree> {
        let root =
            File::open(path).map_err(|e| Error::io(path, "opening the directory to serve", e))?;
        let meta = root
            .metadata()
            .map_err(|e| Error::io(path, "reading the directory to serve", e))?;
        if !meta.is_dir() {
            return Err(Error::BadArgument(format!(
                "{} is not a directory: serve a view or an output directory",
                path.display()
            )));
        }
        Ok(DirTree {
            root: root.into(),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `relative` beneath the root, never following a link out of it.
    fn open_beneath(&self, relative: &str) -> std::io::Result<File> {
        use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
        // Non-blocking, so that a FIFO in the tree cannot hold the thread;
        // reads of regular files ignore the flag.
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = nix::fcntl::openat2(self.root.as_raw_fd(), relative, how)
            .map_err(std::io::Error::from)?;
        // SAFETY: openat2 returned a new descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

impl Tree for DirTree {
    fn open(&self, names: &[String]) -> std::result::Result<Box<dyn Content>, Unreadable> {
        let relative = if names.is_empty() {
            ".".to_string()
        } else {
            names.join("/")
        };
        let file = self
            .open_beneath(&relative)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG) => Unreadable::NotFound,
                Some(libc::EXDEV | libc::ELOOP | libc::EACCES | libc::EPERM) => {
                    Unreadable::Forbidden
                }
                _ => Unreadable::Failed(e),
            })?;
        let meta = file.metadata().map_err(Unreadable::Failed)?;
        if meta.is_dir() {
            return Err(Unreadable::Directory);
        }
        if !meta.is_file() {
            return Err(Unreadable::NotFound);
        }
        Ok(Box::new(DiskFile {
            file,
            len: meta.len(),
        }))
    }
}

struct DiskFile {
    file: File,
    len: u64,
}

impl Content for DiskFile {
    fn size(&self) -> u64 {
        self.len
    }

    fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let len = len.min(self.len.saturating_sub(offset) as usize);
        let mut bytes = vec![0u8; len];
        let mut filled = 0;
        while filled < len {
            match self
                .file
                .read_at(&mut bytes[filled..], offset + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        bytes.truncate(filled);
        Ok(bytes)
    }
}

/// A mounted view, served from its core: the same files, sizes and bytes
/// as through FUSE.
pub struct ViewTree {
    core: Arc<ViewCore>,
}

impl ViewTree {
    pub fn new(core: Arc<ViewCore>) -> ViewTree {
        ViewTree { core }
    }
}

impl ViewTree {
    fn node(&self, names: &[String]) -> std::result::Result<NodeAttr, Unreadable> {
        let mut node = self.core.getattr(ROOT_INO).map_err(view_error)?;
        for name in names {
            node = self
                .core
                .lookup(node.ino, OsStr::new(name))
                .map_err(view_error)?;
        }
        Ok(node)
    }
}

impl Tree for ViewTree {
    fn would_wait(&self, names: &[String]) -> bool {
        self.node(names).is_ok_and(|node| node.ino == WAIT_INO)
            && self.core.status().state == "materialising"
    }

    fn when_ready(&self, names: &[String], ready: Ready) {
        // A read of the wait file is parked until materialising ends.
        let wait_file = self.node(names).is_ok_and(|node| node.ino == WAIT_INO);
        let Some(handle) = wait_file
            .then(|| self.core.open(WAIT_INO, false).ok())
            .flatten()
            .map(|(handle, _)| handle)
        else {
            return ready();
        };
        let core = self.core.clone();
        self.core.read(
            WAIT_INO,
            handle,
            0,
            0,
            Box::new(move |_| {
                core.release(handle);
                ready();
            }),
        );
    }

    fn open(&self, names: &[String]) -> std::result::Result<Box<dyn Content>, Unreadable> {
        let node = self.node(names)?;
        if node.kind == NodeKind::Directory {
            return Err(Unreadable::Directory);
        }
        let (handle, _) = self.core.open(node.ino, false).map_err(view_error)?;
        let mut file = ViewFile {
            core: self.core.clone(),
            ino: node.ino,
            handle,
            len: node.size,
            early: Arc::new(Mutex::new(None)),
        };
        if self.core.changes(node.ino) {
            // The status files: their length is that of the snapshot read.
            let bytes = file
                .read_at(0, u32::MAX as usize)
                .map_err(Unreadable::Failed)?;
            return Ok(Box::new(Snapshot(bytes)));
        }
        Ok(Box::new(file))
    }
}

fn view_error(errno: i32) -> Unreadable {
    match errno {
        libc::ENOENT | libc::ENOTDIR => Unreadable::NotFound,
        libc::EACCES | libc::EPERM => Unreadable::Forbidden,
        _ => Unreadable::Failed(std::io::Error::from_raw_os_error(errno)),
    }
}

/// An open file of a view: reads go through [`ViewCore::read`], which
/// parks those of pending blocks until they are done.
struct ViewFile {
    core: Arc<ViewCore>,
    ino: u64,
    handle: u64,
    len: u64,
    /// A read made by [`Content::when_ready`], answered (or not yet),
    /// for `read_at` to take.
    early: Arc<Mutex<Option<Early>>>,
}

/// A read answered before it was asked for.
struct Early {
    offset: u64,
    len: usize,
    result: std::result::Result<Vec<u8>, Errno>,
}

impl Content for ViewFile {
    fn size(&self) -> u64 {
        self.len
    }

    fn would_wait(&self, _offset: u64, _len: usize) -> bool {
        // A pending block's header bytes would not wait, but asking for
        // them is not worth telling apart.
        self.core
            .getxattr(self.ino, OsStr::new(STATE_XATTR))
            .is_ok_and(|state| state == b"pending")
    }

    fn when_ready(&mut self, offset: u64, len: usize, ready: Ready) {
        let early = self.early.clone();
        self.core.read(
            self.ino,
            self.handle,
            offset,
            u32::try_from(len).unwrap_or(u32::MAX),
            Box::new(move |result| {
                *early.lock() = Some(Early {
                    offset,
                    len,
                    result,
                });
                ready();
            }),
        );
    }

    fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let early = self.early.lock().take();
        if let Some(early) = early.filter(|e| (e.offset, e.len) == (offset, len)) {
            return early.result.map_err(std::io::Error::from_raw_os_error);
        }
        let (send, answer) = sync_channel(1);
        let size = u32::try_from(len).unwrap_or(u32::MAX);
        self.core.read(
            self.ino,
            self.handle,
            offset,
            size,
            Box::new(move |result| {
                let _ = send.send(result);
            }),
        );
        // The core answers every read, parked or not: with the bytes, or
        // an error when the view fails or shuts down.
        match answer.recv() {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(errno)) => Err(std::io::Error::from_raw_os_error(errno)),
            Err(_) => Err(std::io::Error::other("the view dropped a read")),
        }
    }
}

impl Drop for ViewFile {
    fn drop(&mut self) {
        self.core.release(self.handle);
    }
}

/// Bytes read once (a view's status file).
struct Snapshot(Vec<u8>);

impl Content for Snapshot {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let start = (offset as usize).min(self.0.len());
        let end = start.saturating_add(len).min(self.0.len());
        Ok(self.0[start..end].to_vec())
    }
}
