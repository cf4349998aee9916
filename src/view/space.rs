//! Waiting out a full staging filesystem. A write that fails for want of
//! space (ENOSPC, or EDQUOT for a quota) is tried again after a pause that
//! doubles from 0.1 s up to 5 s, while `status` says which filesystem the
//! view waits for; once space is freed the view goes on by itself, and the
//! blocks it completes are exact as ever (a block is rewritten whole, or
//! its failed part in place, before it is marked done).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sys::disk::filesystem_of;
use crate::view::core::ViewCore;

const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);
/// A stop request is noticed within this while pausing.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// The materialiser's wait for space.
pub(crate) struct SpaceWait {
    pause: Duration,
    /// The full filesystem, while waiting for it.
    filesystem: Option<PathBuf>,
    /// Set when the view stops: the wait ends with [`Error::Cancelled`].
    cancel: Option<Arc<AtomicBool>>,
}

impl SpaceWait {
    pub(crate) fn new() -> SpaceWait {
        SpaceWait {
            pause: FIRST_PAUSE,
            filesystem: None,
            cancel: None,
        }
    }

    pub(crate) fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> SpaceWait {
        self.cancel = Some(cancel);
        self
    }

    /// Pauses after `error` (no space) before the write is tried again;
    /// [`Error::Cancelled`] if the view stops meanwhile.
    pub(crate) fn pause(&mut self, core: &ViewCore, error: &Error) -> Result<()> {
        if self.filesystem.is_none() {
            let filesystem = filesystem_of(core.staging().dir());
            log::warn!(
                "{error}; waiting for space on {}, trying again from time to time",
                filesystem.display()
            );
            core.waiting_for_space(Some(filesystem.clone()));
            self.filesystem = Some(filesystem);
        }
        let mut left = self.pause;
        while !left.is_zero() {
            if self
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
            {
                return Err(Error::Cancelled);
            }
            let nap = left.min(STOP_CHECK);
            std::thread::sleep(nap);
            left -= nap;
        }
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        Ok(())
    }

    /// A write went through: if the view was waiting, it no longer is.
    pub(crate) fn recovered(&mut self, core: &ViewCore) {
        if let Some(filesystem) = self.filesystem.take() {
            log::info!("space again on {}: going on", filesystem.display());
            core.waiting_for_space(None);
        }
        self.pause = FIRST_PAUSE;
    }
}
