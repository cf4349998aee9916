//! One input block file ([`InputBlock`]), the header a block the scan did
//! not read is expected to have ([`HeaderCheck`]), when headers are read
//! ([`HeaderChecks`]), and what tells one version of a file from another
//! ([`FileIdentity`]): the types every scanner of this stage builds on.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::Storage;

/// When the scan reads the headers of block files (see the notes of
/// [`crate::input`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderChecks {
    /// Every header, before the scan returns.
    AtScan,
    /// A few at the scan; each of the others just before its data is read
    /// ([`InputArray::confirmed_storage`](super::InputArray::confirmed_storage)).
    BeforeUse,
}

/// One input block file.
#[derive(Clone, Debug)]
pub struct InputBlock {
    pub path: PathBuf,
    pub storage: Storage,
    /// Set when the scan did not read this block's header: its `storage`
    /// is that of a probed block of the same shape, and holds only if the
    /// file starts with the same header bytes.
    pub check: Option<Arc<HeaderCheck>>,
}

/// The header a block not probed at scan time is expected to have: that
/// of a probed block of the same shape. Files of equal length with equal
/// bytes before their data have the same layout (the probe parses
/// identical bytes identically), and nothing follows their data.
#[derive(Debug)]
pub struct HeaderCheck {
    /// The probed block.
    pub like: PathBuf,
    pub len: u64,
    /// Its bytes before the data.
    pub header: Vec<u8>,
}

impl InputBlock {
    /// The file's identity ([`FileIdentity`]) now; an absent Zarr chunk's
    /// is all zeros, so one written later shows as a change. Not taken by the
    /// scan: a view records them as it reads each file (8,000 cold stats
    /// up front took 0.07 s).
    pub fn identity(&self) -> Result<FileIdentity> {
        match self.storage {
            Storage::Absent { .. } => Ok(FileIdentity::ABSENT),
            _ => FileIdentity::of(&self.path),
        }
    }
}

/// What tells one version of a file from another: its size, its
/// modification and change times, and its inode. Size and mtime alone miss
/// a rewrite whose owner restores them (`touch -r`); the change time is
/// set by the kernel on every write and cannot be set back by a user, and
/// a file replaced by another (written beside it, renamed over it) has
/// another inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FileIdentity {
    pub size: u64,
    /// Nanoseconds since the epoch (negative before it).
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    pub inode: u64,
}

impl FileIdentity {
    /// What a file that does not exist has (an absent Zarr chunk).
    pub const ABSENT: FileIdentity = FileIdentity {
        size: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        inode: 0,
    };

    pub fn of(path: &Path) -> Result<FileIdentity> {
        let meta = fs::metadata(path).map_err(|e| Error::io(path, "stat", e))?;
        Ok(FileIdentity::of_metadata(&meta))
    }

    /// The identity of `path` now, [`ABSENT`](Self::ABSENT) if it does not exist.
    pub fn now(path: &Path) -> Result<FileIdentity> {
        FileIdentity::of_stat(path, fs::metadata(path).as_ref())
    }

    /// The identity that `stat` of `path` (following a symlink) found:
    /// [`ABSENT`](Self::ABSENT) for a file that does not exist.
    pub fn of_stat(
        path: &Path,
        stat: std::result::Result<&fs::Metadata, &std::io::Error>,
    ) -> Result<FileIdentity> {
        match stat {
            Ok(meta) => Ok(FileIdentity::of_metadata(meta)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileIdentity::ABSENT),
            Err(e) => {
                let error = e.raw_os_error().map_or_else(
                    || std::io::Error::from(e.kind()),
                    std::io::Error::from_raw_os_error,
                );
                Err(Error::io(path, "stat", error))
            }
        }
    }

    /// What differs from `earlier` to this identity, for a person:
    /// "size 4096 -> 8192 bytes, modified", "replaced by another file".
    pub fn changes_from(&self, earlier: &FileIdentity) -> String {
        if *earlier == FileIdentity::ABSENT {
            return "created".into();
        }
        if *self == FileIdentity::ABSENT {
            return "removed".into();
        }
        let mut changes = Vec::new();
        if self.inode != earlier.inode {
            changes.push(format!(
                "replaced by another file (inode {} -> {})",
                earlier.inode, self.inode
            ));
        }
        if self.size != earlier.size {
            changes.push(format!("size {} -> {} bytes", earlier.size, self.size));
        }
        if self.mtime_ns != earlier.mtime_ns {
            changes.push("modified (its mtime changed)".into());
        } else if self.ctime_ns != earlier.ctime_ns {
            // The kernel sets ctime on every write; a restored mtime
            // (`touch -r`) cannot undo it.
            changes.push("written or its attributes changed (its ctime changed)".into());
        }
        if changes.is_empty() {
            return "unchanged".into();
        }
        changes.join(", ")
    }

    /// The identity a stat of the file found.
    pub fn of_metadata(meta: &fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        let ns = |seconds: i64, nanos: i64| seconds as i128 * 1_000_000_000 + nanos as i128;
        FileIdentity {
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
        }
    }
}
