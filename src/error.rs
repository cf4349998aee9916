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

    /// A broken invariant, or one of the program's own threads dying: a
    /// bug in rechunkfs, nothing the input or the arguments did. The text
    /// says which.
    #[error(
        "internal error: {0} (a bug in rechunkfs; please report it with the command that met it)"
    )]
    Internal(String),

    /// The view's daemon could not bring the view up: its own error,
    /// which crossed the fork as text.
    #[error("{0}")]
    Daemon(String),
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

    /// The errno a filesystem reply should carry for this error. A reader
    /// of the view asked for bytes; what it can act on is whether trying
    /// again may help (EINTR, ENOSPC) or the bytes cannot be had (EIO).
    /// Every variant is named, so a new one must choose.
    pub fn errno(&self) -> i32 {
        match self {
            // The OS's own answer is the truest (ENOSPC, EDQUOT, ENOENT, a
            // hung mount's ETIMEDOUT...); a synthetic io::Error carries none.
            Error::Io { source, .. } | Error::Os { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            // The reader's wait ended before the bytes existed (unmount,
            // shutdown, its own interruption): trying again may succeed.
            Error::Cancelled => libc::EINTR,
            // The input cannot give these bytes as its files promise: a
            // device error is what reads of a damaged disk get, and
            // nothing the reader changes will help.
            Error::BadInput { .. }
            | Error::BadBlockFile { .. }
            | Error::UnsupportedDtype(_)
            | Error::Hdf5 { .. } => libc::EIO,
            // An input rewritten under the view: its blocks may mix two
            // versions, so the view fails rather than serve them. Not
            // ESTALE: the reader's own handle on the view is still valid,
            // and every later read of a pending block gets EIO from the
            // failed view, so this one does too.
            Error::InputChanged { .. } => libc::EIO,
            // The staging area (the view's output) or the view itself is
            // unusable: the view failed, and its pending bytes never come.
            Error::BadOutput { .. } | Error::Daemon(_) => libc::EIO,
            // Refusals of what was asked, met at mount time, never by a
            // read; if one ever reaches a reader, the view failed. EINVAL
            // would blame the reader's read(2) arguments, which are fine.
            Error::BadArgument(_) | Error::DoesNotFit { .. } => libc::EIO,
            // A bug: the bytes cannot be trusted to come.
            Error::Internal(_) => libc::EIO,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn io(errno: i32) -> Error {
        Error::io("/x", "writing", std::io::Error::from_raw_os_error(errno))
    }

    #[test]
    fn an_os_error_keeps_its_errno_and_the_rest_map_as_documented() {
        assert_eq!(io(libc::ENOSPC).errno(), libc::ENOSPC);
        assert_eq!(io(libc::EDQUOT).errno(), libc::EDQUOT);
        let synthetic = Error::io("/x", "reading", std::io::Error::other("short"));
        assert_eq!(synthetic.errno(), libc::EIO);
        assert_eq!(Error::Cancelled.errno(), libc::EINTR);
        let changed = Error::InputChanged {
            path: "/in".into(),
            change: "size".into(),
        };
        assert_eq!(changed.errno(), libc::EIO);
        assert_eq!(Error::Internal("lost".into()).errno(), libc::EIO);
        assert_eq!(Error::BadArgument("--shape".into()).errno(), libc::EIO);
    }

    #[test]
    fn an_internal_error_says_it_is_a_bug_not_the_users_doing() {
        let message = Error::Internal("the writer thread panicked".into()).to_string();
        assert!(
            message.starts_with("internal error: the writer thread panicked"),
            "{message}"
        );
        assert!(message.contains("a bug in rechunkfs"), "{message}");
    }
}
