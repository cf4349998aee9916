//! Piece buffers kept for reuse between steps, within the plan's peak: a
//! fresh buffer costs page faults or a memset, and freeing a large one
//! interrupts the other thread (see [`BufferPool`] for the measurements).

use std::collections::HashMap;

/// Piece buffers written and handed back, kept for the next steps of the
/// same sizes. A fresh buffer of [`OWN_MAPPING_BYTES`](crate::sys::limits::OWN_MAPPING_BYTES) or more costs a page
/// fault and a zeroed page for every 4 KiB the reader fills, and freeing it
/// unmaps it, which interrupts the other thread to flush its TLB. A merge
/// (ten 8.5 MB steps) made 21,800 minor page faults and spent 0.09-0.13 s
/// in the kernel that way, against 5,100 and 0.05-0.06 s with reuse. A
/// smaller one comes from the heap, which zeroes it: W1's 686 MB of pieces
/// under 1 MiB were all memset before being read into. A grid's
/// pieces come in a few sizes, so most are reused. What the pool keeps and
/// the bytes held fit in the plan's peak, when a buffer is given back and
/// when a step takes its buffers (kept ones of other sizes are freed then),
/// so memory stays within what the plan holds at most.
#[derive(Default)]
pub(super) struct BufferPool {
    free: HashMap<usize, Vec<Vec<u8>>>,
    bytes: u64,
}

impl BufferPool {
    /// Buffers of `lens` bytes for a step, while `held` bytes are held
    /// besides: kept ones (holding old bytes, all of which the step
    /// overwrites) where the sizes match, new zeroed ones otherwise. Kept
    /// buffers that would not fit beside the step in `peak` are freed
    /// first, so the new ones never come on top of them.
    pub(super) fn take_step(&mut self, lens: &[usize], held: u64, peak: u64) -> Vec<Vec<u8>> {
        let kept: Vec<Option<Vec<u8>>> = lens
            .iter()
            .map(|&len| {
                let buffer = self.free.get_mut(&len).and_then(Vec::pop);
                if buffer.is_some() {
                    self.bytes -= len as u64;
                }
                buffer
            })
            .collect();
        let step: u64 = lens.iter().map(|&len| len as u64).sum();
        let room = peak.saturating_sub(held + step);
        while self.bytes > room {
            let Some((&len, buffers)) = self.free.iter_mut().find(|(_, b)| !b.is_empty()) else {
                break;
            };
            buffers.pop();
            self.bytes -= len as u64;
        }
        kept.into_iter()
            .zip(lens)
            .map(|(buffer, &len)| buffer.unwrap_or_else(|| vec![0u8; len]))
            .collect()
    }

    /// Keeps `buffer` if it, the buffers kept and the `held` bytes fit in
    /// `peak`; frees it otherwise.
    pub(super) fn give(&mut self, buffer: Vec<u8>, held: u64, peak: u64) {
        let len = buffer.len();
        if held + self.bytes + len as u64 <= peak {
            self.bytes += len as u64;
            self.free.entry(len).or_default().push(buffer);
        }
    }

    /// Bytes of the buffers kept.
    pub(super) fn kept_bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_pool_reuses_buffers_within_the_plans_peak() {
        let mib = 1usize << 20;
        let mut pool = BufferPool::default();
        let peak = 4 << 20;
        let mut first = pool.take_step(&[2 * mib], 0, peak).remove(0);
        first[0] = 7;
        // Kept: 2 MiB held besides, peak 4 MiB.
        pool.give(first, 2 << 20, peak);
        assert_eq!(pool.bytes, 2 << 20);
        // Over the peak with it: freed, whatever its size.
        pool.give(vec![0u8; mib], 2 << 20, peak);
        pool.give(vec![0u8; 100], (4 << 20) - (2 << 20) - 99, peak);
        assert_eq!(pool.bytes, 2 << 20);
        // Small buffers are kept too.
        pool.give(vec![5u8; 100], 0, peak);
        assert_eq!(pool.bytes, (2 << 20) + 100);
        assert_eq!(pool.take_step(&[100], 0, peak)[0][0], 5);
        assert_eq!(pool.bytes, 2 << 20);
        // The same size comes back with its old bytes; another is new.
        let step = pool.take_step(&[2 * mib, 2 * mib], 0, peak);
        assert_eq!((step[0][0], step[1][0]), (7, 0));
        assert_eq!(pool.bytes, 0);
        // A kept buffer of another size that would not fit beside a step
        // is freed before the step's new buffers are made.
        pool.give(vec![0u8; 3 * mib], 0, peak);
        assert_eq!(pool.bytes, 3 << 20);
        let step = pool.take_step(&[2 * mib], 0, peak);
        assert_eq!(step[0].len(), 2 * mib);
        assert_eq!(pool.bytes, 0, "3 MiB kept + a 2 MiB step > the 4 MiB peak");
        // One that fits stays.
        pool.give(vec![0u8; mib], 0, peak);
        pool.take_step(&[2 * mib], 0, peak);
        assert_eq!(pool.bytes, 1 << 20);
    }
}
