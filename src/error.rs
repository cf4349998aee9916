//! The library's error type: what went wrong, where, and what to do about it.
//!
//! Every variant's message is written for the person at the terminal; the
//! FUSE layer maps each to an errno with [`Error::errno`].

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An OS call on a named file failed.
    #[error("{path}: {action} failed: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// An OS call that concerns no one file failed (`fork`, `pipe`,
    /// `sigprocmask`, starting a thread).
    #[error("{action}: {call} failed: {source}")]
    Os {
        call: &'static str,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The input (a block file or the grid they form) is not usable as given.
    #[error("{path}: {problem}")]
    BadInput { path: PathBuf, problem: String },

    /// A block file's content is not what its extension promises.
    #[error("{path}: not a valid {format} file: {problem}")]
    BadBlockFile {
        path: PathBuf,
        format: &'static str,
        problem: String,
    },

    /// A dtype spelling or a type found in a file that we cannot carry.
    #[error("{0}")]
    UnsupportedDtype(String),

    /// A command-line value (shape, memory size, strategy...) is malformed.
    #[error("{0}")]
    BadArgument(String),

    /// No plan fits in the memory allowed: the least one needs `needed`
    /// bytes, and `--mem` allows `allowed`. The message says which plan
    /// and what to do.
    #[error("{message}")]
    DoesNotFit {
        needed: u64,
        allowed: u64,
        message: String,
    },

    /// libhdf5 refused an operation.
    #[error("{path}: HDF5: {message}")]
    Hdf5 { path: PathBuf, message: String },

    /// The output location is not usable (exists and is not empty, ...).
    #[error("{path}: {problem}")]
    BadOutput { path: PathBuf, problem: String },

    /// The work was cancelled (shutdown, unmount) before it finished.
    #[error("cancelled")]
    Cancelled,

    /// An input file changed while it was being read (written in place,
    /// replaced): bytes read from it may mix two versions, so nothing made
    /// from them may be kept as complete. `change` says what differs.
    #[error("{path}: changed while it was being read ({change})")]
    InputChanged { path: PathBuf, change: String },
}

impl Error {
    /// Wrap an I/O error with the file and the action that failed.
    pub fn io(path: impl Into<PathBuf>, action: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            action,
            source,
        }
    }

    /// Wrap the failure of an OS call that concerns no one file.
    pub fn os(call: &'static str, action: &'static str, source: std::io::Error) -> Error {
        Error::Os {
            call,
            action,
            source,
        }
    }

    pub fn bad_input(path: impl Into<PathBuf>, problem: impl Into<String>) -> Error {
        Error::BadInput {
            path: path.into(),
            problem: problem.into(),
        }
    }

    /// Whether the OS call failed for want of space (the filesystem is
    /// full, or the user's quota is): something freeing space may fix.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            Error::Io { source, .. } | Error::Os { source, .. }
                if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        )
    }

    /// The errno a filesystem reply should carry for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { source, .. } | Error::Os { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            Error::Cancelled => libc::EINTR,
            _ => libc::EIO,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
