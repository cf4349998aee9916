//! Parked reads whose requester has given up: a reader killed or
//! interrupted while its read waits for a pending block. Its read is
//! answered with EINTR and forgotten, so that `status` no longer counts it
//! and the block is no longer extracted ahead of the plan for it.
//!
//! The kernel tells a FUSE server of this with FUSE INTERRUPT, but fuser
//! 0.18 keeps those to itself (see [`crate::sys::process`]), and never
//! sends them for page-cache reads, which most parked reads are. So the
//! requesters are asked after instead: each parked read carries the id of
//! the thread that made it.

use std::collections::HashMap;

use crate::sys::process::Requester;
use crate::view::{ReadReply, ViewCore};

impl ViewCore {
    /// The threads parked reads were made by (each once; 0, unknown,
    /// left out).
    pub fn parked_requesters(&self) -> Vec<u32> {
        let state = self.state.lock();
        let mut requesters: Vec<u32> = state
            .waiters
            .values()
            .flatten()
            .map(|waiter| waiter.requester)
            .chain(state.end_waiters.iter().map(|waiter| waiter.requester))
            .filter(|&requester| requester != 0)
            .collect();
        requesters.sort_unstable();
        requesters.dedup();
        requesters
    }

    /// Answers with EINTR, and forgets, every parked read whose requester
    /// `state_of` finds interrupted or gone. Returns how many. `state_of`
    /// is asked without the view's lock held (it reads /proc).
    pub fn interrupt_requesters(&self, state_of: impl Fn(u32) -> Requester) -> usize {
        let ended: HashMap<u32, Requester> = self
            .parked_requesters()
            .into_iter()
            .map(|requester| (requester, state_of(requester)))
            .filter(|(_, state)| *state != Requester::Waiting)
            .collect();
        if ended.is_empty() {
            return 0;
        }
        let replies = self.take_replies_of(|requester| ended.contains_key(&requester));
        let count = replies.len();
        for reply in replies {
            reply(Err(libc::EINTR));
        }
        count
    }

    /// Removes the parked reads (block and wait-file reads) made by the
    /// requesters `ended` names, and hands back their replies.
    fn take_replies_of(&self, ended: impl Fn(u32) -> bool) -> Vec<ReadReply> {
        let mut state = self.state.lock();
        let mut replies = Vec::new();
        let mut unwaited = Vec::new();
        state.waiters.retain(|&rank, waiters| {
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(waiters)
                .into_iter()
                .partition(|waiter| ended(waiter.requester));
            replies.extend(gone.into_iter().map(|waiter| waiter.reply));
            *waiters = kept;
            if waiters.is_empty() {
                unwaited.push(rank);
            }
            !waiters.is_empty()
        });
        // A block nobody waits for any more is left to the plan.
        state.urgent.retain(|rank| !unwaited.contains(rank));
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut state.end_waiters)
            .into_iter()
            .partition(|waiter| ended(waiter.requester));
        state.end_waiters = kept;
        replies.extend(gone.into_iter().map(|waiter| waiter.reply));
        replies
    }
}
