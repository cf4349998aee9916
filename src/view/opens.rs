//! Which way each open file is served. The kernel refuses (EIO) to mix
//! cached and passthrough opens of one inode, so an inode stays in the
//! mode of its open handles until they are all closed; a done block opened
//! while none is open in cached mode is served by passthrough, when the
//! kernel allows it: the kernel then reads the staged file itself, and no
//! read of it reaches the view.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

/// How an open block file is served.
#[derive(Debug)]
pub enum BlockOpen {
    /// By reads through the view, the page cache kept across opens.
    Cached,
    /// By the kernel from the staged file, through the backing registered
    /// for the inode by an open still in use.
    Passthrough,
    /// By the kernel from this staged file: the inode's first passthrough
    /// open, whose backing is to be registered now. If the kernel refuses
    /// it, [`ViewCore::serve_cached`](super::ViewCore::serve_cached).
    PassthroughFrom(Arc<File>),
}

/// Open handles by mode, per inode.
#[derive(Default)]
pub(super) struct OpenFiles {
    /// Whether done blocks may be served by passthrough.
    passthrough: bool,
    /// Cached-mode handles per inode.
    cached: HashMap<u64, u64>,
    /// Passthrough handles per inode: its backing is in use while any is open.
    backed: HashMap<u64, u64>,
    /// Each handle's inode and whether it is passthrough.
    handles: HashMap<u64, (u64, bool)>,
}

impl OpenFiles {
    /// Handles per inode in one mode.
    fn counts(&mut self, passthrough: bool) -> &mut HashMap<u64, u64> {
        if passthrough {
            &mut self.backed
        } else {
            &mut self.cached
        }
    }

    fn add(&mut self, ino: u64, handle: u64, passthrough: bool) {
        *self.counts(passthrough).entry(ino).or_default() += 1;
        self.handles.insert(handle, (ino, passthrough));
    }

    /// Forgets `handle`; the inode whose backing it was the last to use.
    pub(super) fn remove(&mut self, handle: u64) -> Option<u64> {
        let (ino, passthrough) = self.handles.remove(&handle)?;
        let counts = self.counts(passthrough);
        let count = counts.get_mut(&ino)?;
        *count -= 1;
        if *count > 0 {
            return None;
        }
        counts.remove(&ino);
        passthrough.then_some(ino)
    }
}

impl OpenFiles {
    /// Whether done blocks may be served by passthrough (the kernel offers it).
    pub(super) fn allow_passthrough(&mut self, allowed: bool) {
        self.passthrough = allowed;
    }

    /// How to serve `handle`, an open of `ino`; `done_file` is the staged
    /// file of `ino` if it is a completed block.
    pub(super) fn open_block(
        &mut self,
        ino: u64,
        handle: u64,
        done_file: impl FnOnce() -> Option<Arc<File>>,
    ) -> BlockOpen {
        let cached_open = self.cached.get(&ino).copied().unwrap_or(0) > 0;
        if !cached_open && self.passthrough {
            if self.backed.contains_key(&ino) {
                self.add(ino, handle, true);
                return BlockOpen::Passthrough;
            }
            if let Some(file) = done_file() {
                self.add(ino, handle, true);
                return BlockOpen::PassthroughFrom(file);
            }
        }
        self.add(ino, handle, false);
        BlockOpen::Cached
    }

    /// Serves `handle` in cached mode after all.
    pub(super) fn serve_cached(&mut self, handle: u64) {
        if let Some((ino, true)) = self.handles.get(&handle).copied() {
            self.remove(handle);
            self.add(ino, handle, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_keeps_its_mode_until_its_last_handle_closes() {
        let mut opens = OpenFiles::default();
        opens.add(7, 1, true);
        opens.add(7, 2, true);
        opens.add(8, 3, false);
        assert_eq!(opens.remove(1), None, "handle 2 still uses the backing");
        assert_eq!(opens.remove(2), Some(7), "the last passthrough handle");
        assert_eq!(opens.remove(3), None, "a cached inode has no backing");
        assert_eq!(opens.remove(3), None, "a handle is forgotten once");
        assert!(opens.cached.is_empty() && opens.backed.is_empty() && opens.handles.is_empty());
    }
}
