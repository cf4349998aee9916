//! Process limits set once at start: open files, the descriptor table, and
//! the allocator's mmap threshold. Each is set before any thread starts,
//! where it costs nothing, rather than grown under load, where it waits.

/// Buffers this large get mappings of their own from the allocator (see
/// [`map_large_buffers_separately`]), so freeing one returns its memory at once.
pub const OWN_MAPPING_BYTES: usize = 1 << 20;

/// The heap's free memory glibc keeps rather than hands back.
const KEPT_HEAP_BYTES: usize = 1 << 30;

/// Array buffers are large and short-lived. glibc raises its mmap threshold
/// after the first large free, after which such buffers come from the heap
/// and, once freed, stay resident: RSS then outgrows the bytes actually
/// held. A fixed threshold keeps every large buffer mmap'd. The buffers
/// below it (a decoded chunk, an output block gathered to be encoded) are
/// freed and allocated again thousands of times: trimming the heap after
/// each free made every reuse fault its pages in again, which was most of
/// a compressed run's system time (W1-zstd: 3.5 s of system time against
/// 1.9 s untrimmed, the same peak RSS, since those buffers are bounded by
/// what is held). Call it before any buffer exists.
pub fn map_large_buffers_separately() {
    // SAFETY: mallopt only tunes the allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAPPING_BYTES as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT_HEAP_BYTES as libc::c_int);
    }
}

/// How many input files stay open between reads: HDF5 opens are costly,
/// and files opened to be read ahead stay open until they are read (W1's
/// 32 MiB ahead is ~400 blocks), which saves an open and a close per file.
/// A quarter of the descriptors the process may open, within these bounds.
pub fn input_files_kept_open() -> usize {
    let soft = open_file_limit().map_or(1024, |limit| limit.rlim_cur);
    (soft / 4).clamp(64, 1024) as usize
}

/// The process's RLIMIT_NOFILE, if it can be read.
fn open_file_limit() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct passed.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
}

/// The executor keeps the input files it reads ahead open until it reads
/// them (hundreds of small blocks at once); the usual soft limit of 1,024
/// descriptors is a default, not a policy, so it is raised to the hard
/// limit as Go's runtime does. Failure leaves the limit as it was, and
/// [`input_files_kept_open`] sizes the cache to whatever limit there is.
pub fn raise_open_file_limit() {
    if let Some(mut limit) = open_file_limit() {
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max.min(1 << 16);
            // SAFETY: setrlimit reads the struct passed.
            unsafe {
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    }
}

/// Descriptors the process holds beside the executor's open inputs: output
/// blocks, the staging area's journal, logs, a view's FUSE channels.
const OTHER_DESCRIPTORS: usize = 64;

/// Grows the process's descriptor table now to hold the input files the
/// executor keeps open ([`input_files_kept_open`]) and a margin. The kernel grows the
/// table when an open needs a slot beyond it, and in a process with
/// threads it then waits for an RCU grace period before the old table can
/// go: 5-20 ms on this VM, at 256 and at 512 descriptors, so 20-30 ms of a
/// 0.15 s merge of 1,000 files (`perf trace`: the reader's 256th and
/// 512th `openat`). Grown before any thread starts, it waits for nothing;
/// tables never shrink. Call it single-threaded: at start, and again in a
/// forked child, whose table is copied only up to its highest open
/// descriptor. A failure only leaves the growth to later opens.
pub fn reserve_descriptor_table() {
    let Some(limit) = open_file_limit() else {
        return;
    };
    let wanted = (input_files_kept_open() + OTHER_DESCRIPTORS) as u64;
    let Some(highest) = wanted.min(limit.rlim_cur).checked_sub(1) else {
        return;
    };
    for source in 0..=2 {
        // SAFETY: F_DUPFD_CLOEXEC duplicates `source` (if open) onto the
        // lowest free descriptor >= `highest`, which is closed at once.
        let duplicate =
            unsafe { libc::fcntl(source, libc::F_DUPFD_CLOEXEC, highest as libc::c_int) };
        if duplicate >= 0 {
            // SAFETY: `duplicate` is ours, open, and used nowhere else.
            unsafe { libc::close(duplicate) };
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of this process's descriptor table (`FDSize` in /proc).
    fn descriptor_table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line["FDSize:".len()..].trim().parse().unwrap()
    }

    #[test]
    fn the_descriptor_table_is_grown_for_the_input_files_kept_open() {
        let soft = open_file_limit().unwrap().rlim_cur;
        let wanted = ((input_files_kept_open() + OTHER_DESCRIPTORS) as u64).min(soft);
        reserve_descriptor_table();
        let size = descriptor_table_size();
        assert!(size >= wanted, "table of {size} for {wanted} descriptors");
        // The descriptor that grew it is closed again.
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(wanted as libc::c_int - 1, libc::F_GETFD) };
        assert_eq!(flags, -1, "descriptor {} left open", wanted - 1);
    }
}
