//! The plain values the view answers with: nodes and their attributes,
//! directory entries, how a file is cached, who may read the view, and the
//! errno or bytes a read is answered with.

use std::time::SystemTime;

/// An errno for a reply.
pub type Errno = i32;

/// What a read is answered with: the bytes, or an errno.
pub type ReadReply = Box<dyn FnOnce(std::result::Result<Vec<u8>, Errno>) + Send>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Directory,
    File,
}

/// What `stat` shows of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAttr {
    pub ino: u64,
    pub kind: NodeKind,
    pub size: u64,
    pub mtime: SystemTime,
    /// Permission bits: read (and for directories search) only.
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
}

/// Who may read the view: its files' owner and read bits. The view of
/// inputs some users cannot read must not show those users their data
/// ([`Access::of_inputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub uid: u32,
    pub gid: u32,
    /// Read bits (a subset of 0o444).
    pub read: u16,
}

impl Access {
    /// Readable by all, owned by this process's user: the access of a
    /// view whose inputs' access is not given ([`ViewCore::with_access`]).
    pub fn everyone() -> Access {
        Access {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            read: 0o444,
        }
    }

    /// The most restrictive access of the inputs: the read bits every
    /// input has, their owner and group. Inputs of different owners give
    /// the view to this process's user; of different groups, to its
    /// group, without group read, since that group may not read them all.
    pub fn of_inputs(inputs: &crate::input::InputAccess) -> Access {
        let mut read = (inputs.mode & 0o444) as u16;
        let gid = inputs.gid.unwrap_or_else(|| {
            read &= !0o040;
            nix::unistd::getgid().as_raw()
        });
        Access {
            uid: inputs.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
            gid,
            read,
        }
    }

    /// The permission bits of a node of `kind`: a directory may be searched
    /// by whoever may read it.
    pub(super) fn perm(&self, kind: NodeKind) -> u16 {
        match kind {
            NodeKind::File => self.read,
            NodeKind::Directory => self.read | self.read >> 2,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: NodeKind,
    pub name: String,
}

/// How a file should be opened by the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// Contents never change: keep the page cache across opens.
    KeepCache,
    /// Contents change between reads (the status file): bypass the cache.
    Direct,
}
