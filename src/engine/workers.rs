//! How many threads the engine's CPU work may spread over: by default the
//! CPUs this process may use, which the standard library reads from its
//! affinity mask and its cgroup's CPU quota (so `taskset`, SLURM's
//! `--cpus-per-task` and container limits are honoured); `--threads`
//! sets it for the whole process.

use std::sync::atomic::{AtomicUsize, Ordering};

/// 0 until set: then the CPUs available.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// The threads CPU work may use, at least 1.
pub fn threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => available(),
        n => n,
    }
}

/// Sets the threads CPU work may use (`None`: the CPUs available).
pub fn set_threads(threads: Option<usize>) {
    THREADS.store(threads.unwrap_or(0), Ordering::Relaxed);
}

/// The CPUs this process may use.
pub fn available() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taskset_is_honoured() {
        // A thread narrowed to one CPU is what a process started under
        // `taskset -c N` is.
        std::thread::spawn(|| {
            // SAFETY: a zeroed cpu_set_t is an empty set; both calls get
            // its true size and act on this thread alone.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                let size = std::mem::size_of::<libc::cpu_set_t>();
                assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
                let first = (0..libc::CPU_SETSIZE as usize)
                    .find(|&cpu| libc::CPU_ISSET(cpu, &set))
                    .unwrap();
                libc::CPU_ZERO(&mut set);
                libc::CPU_SET(first, &mut set);
                assert_eq!(libc::sched_setaffinity(0, size, &set), 0);
            }
            assert_eq!(available(), 1);
        })
        .join()
        .unwrap();
    }
}
