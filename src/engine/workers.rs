//! How many threads the engine's CPU work may spread over: by default the
//! CPUs this process may use, which the standard library reads from its
//! affinity mask and its cgroup's CPU quota (so `taskset`, SLURM's
//! `--cpus-per-task` and container limits are honoured); `--threads`
//! sets it for the whole process. [`on_workers`] runs a batch of jobs,
//! one scoped thread each: threads made for the batch, never a global pool,
//! which would not survive the fork that daemonises a view.

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

/// `job` applied to each of `items` (as many as there are workers), the
/// first on the calling thread and each other on a scoped thread of its
/// own, the results in the items' order. A job that panics panics the
/// caller, as it would have inline.
pub(super) fn on_workers<I, R, F>(items: impl IntoIterator<Item = I>, job: F) -> Vec<R>
where
    I: Send,
    R: Send,
    F: Fn(I) -> R + Sync,
{
    let mut items: Vec<I> = items.into_iter().collect();
    if items.len() <= 1 {
        return items.drain(..).map(&job).collect();
    }
    // Each item waits in a slot its thread takes it from: the first, and
    // one the OS refuses a thread for, are done here instead.
    let slots: Vec<parking_lot::Mutex<Option<I>>> = items
        .into_iter()
        .map(|item| parking_lot::Mutex::new(Some(item)))
        .collect();
    let job = &job;
    let run = |slot: &parking_lot::Mutex<Option<I>>| slot.lock().take().map(job);
    std::thread::scope(|scope| {
        let handles: Vec<_> = slots
            .iter()
            .enumerate()
            .map(|(at, slot)| {
                (at > 0).then(|| {
                    std::thread::Builder::new()
                        .name("worker".into())
                        .spawn_scoped(scope, move || run(slot))
                        .ok()
                })?
            })
            .collect();
        handles
            .into_iter()
            .zip(&slots)
            .filter_map(|(handle, slot)| match handle {
                Some(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                None => run(slot),
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_on_workers_come_back_in_order() {
        let squares = on_workers(0..8u64, |n| {
            std::thread::sleep(std::time::Duration::from_millis(8 - n));
            n * n
        });
        assert_eq!(squares, [0, 1, 4, 9, 16, 25, 36, 49]);
    }

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
