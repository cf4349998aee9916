//! How many threads the engine's CPU work may spread over: by default the
//! CPUs this process may use, which the standard library reads from its
//! affinity mask and its cgroup's CPU quota (so `taskset`, SLURM's
//! `--cpus-per-task` and container limits are honoured); `--threads`
//! sets it for the whole process. A run's `Workers` are a pool of that
//! many threads made when the run starts and gone with it, never a global
//! pool, which would not survive the fork that daemonises a view. The
//! run's threads count the CPUs they use, so a batch takes workers only
//! for idle ones, and a thread waiting for another helps with its batch
//! instead of sleeping.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

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

/// `job` applied to each of `items` on up to [`threads`] threads made for
/// this call, the results in the items' order: for work before a run has
/// its workers, such as stat'ing every input file, each a metadata round
/// trip on a cluster filesystem. Each thread takes a run of neighbouring
/// items. A thread the system refuses leaves its items to the caller; a
/// panic in a job panics the caller.
pub fn map_on_threads<T: Sync, R: Send>(items: &[T], job: impl Fn(&T) -> R + Sync) -> Vec<R> {
    map_on(threads(), items, job)
}

/// [`map_on_threads`] on up to `threads` threads.
pub(super) fn map_on<T: Sync, R: Send>(
    threads: usize,
    items: &[T],
    job: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.min(items.len());
    if threads <= 1 {
        return items.iter().map(job).collect();
    }
    let job = &job;
    let run = |part: &[T]| part.iter().map(job).collect::<Vec<R>>();
    std::thread::scope(|scope| {
        let started: Vec<_> = items
            .chunks(items.len().div_ceil(threads))
            .map(|part| {
                let spawned = std::thread::Builder::new()
                    .name("helper".into())
                    .spawn_scoped(scope, move || run(part));
                (part, spawned)
            })
            .collect();
        started
            .into_iter()
            .flat_map(|(part, spawned)| match spawned {
                Ok(thread) => thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => run(part),
            })
            .collect()
    })
}

/// A run's worker threads, one per thread CPU work may use: the reader's
/// reading, decoding and copying into pieces and the writer's gathering,
/// encoding and writing all run on them, so the run keeps as many CPUs busy as it was given, and
/// starts no thread per batch (8,000 batches of W1-image started 8,000
/// threads). With one worker there is no pool: every job runs on the
/// thread that asks for it.
pub(super) struct Workers {
    /// `None`: one worker, every job run where it is asked for.
    pool: Option<rayon::ThreadPool>,
    count: usize,
    /// Workers running a task or a share of a batch, or about to.
    busy: Arc<AtomicUsize>,
    /// The batches running now, for a thread of the run with nothing to
    /// do to [`help`](Self::help) with.
    open: Mutex<Vec<Arc<OpenBatch>>>,
}

impl Workers {
    /// `count` workers (at least 1).
    pub(super) fn new(count: usize) -> Result<Workers> {
        let count = count.max(1);
        if count == 1 {
            return Ok(Workers::one());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(count)
            .thread_name(|_| "worker".into())
            .build()
            .map_err(|e| Error::Internal(format!("starting {count} worker threads: {e}")))?;
        Ok(Workers {
            pool: Some(pool),
            count,
            busy: Arc::default(),
            open: Mutex::default(),
        })
    }

    /// One worker: the calling thread.
    pub(super) fn one() -> Workers {
        Workers {
            pool: None,
            count: 1,
            busy: Arc::default(),
            open: Mutex::default(),
        }
    }

    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// `job` applied to each of `items`, the results in the items' order:
    /// the calling thread takes them one by one, and so does a worker for
    /// each CPU that no thread of the run is using, whether it is idle when
    /// the batch comes or falls idle while it runs (the writer between two
    /// slabs, while the reader reads a step). A helper leaves at its next
    /// item once the run's threads outnumber its CPUs again, so the
    /// batch never makes the run's threads take turns on them. At most as
    /// many threads take items at once as there are workers (each job may
    /// hold a block: the planner counts one per worker). A batch never
    /// waits in a queue behind other tasks (the encoders' blocks): the
    /// caller, which waits for it anyway, does what no helper takes. A job
    /// that panics panics the caller, as it would have inline.
    pub(super) fn map<I, R, F>(&self, items: impl IntoIterator<Item = I>, job: F) -> Vec<R>
    where
        I: Send,
        R: Send,
        F: Fn(I) -> R + Sync,
    {
        let items: Vec<I> = items.into_iter().collect();
        let most_helpers = (self.count - 1).min(items.len().saturating_sub(1));
        let Some(pool) = self.pool.as_ref().filter(|_| most_helpers > 0) else {
            return items.into_iter().map(job).collect();
        };
        let slots: Vec<parking_lot::Mutex<(Option<I>, Option<R>)>> = items
            .into_iter()
            .map(|item| parking_lot::Mutex::new((Some(item), None)))
            .collect();
        let next = AtomicUsize::new(0);
        let take_item = || match slots.get(next.fetch_add(1, Ordering::Relaxed)) {
            Some(slot) => {
                let item = slot.lock().0.take();
                if let Some(item) = item {
                    let result = job(item);
                    slot.lock().1 = Some(result);
                }
                true
            }
            None => false,
        };
        let take: &(dyn Fn() -> bool + Sync) = &take_item;
        // SAFETY: the batch is closed below before `take_item` goes out of
        // scope, and closing waits for every thread inside it.
        let batch = Arc::new(unsafe { OpenBatch::new(take) });
        self.open.lock().push(Arc::clone(&batch));
        pool.in_place_scope(|scope| {
            let mut helpers = 0;
            loop {
                while helpers < most_helpers {
                    let Some(busy) = Busy::start_if_idle(&self.busy, self.count) else {
                        break;
                    };
                    helpers += 1;
                    let take_item = &take_item;
                    scope.spawn(move |_| {
                        while busy.fits(self.count) && take_item() {}
                        drop(busy);
                    });
                }
                if !take_item() {
                    break;
                }
            }
        });
        self.open.lock().retain(|open| !Arc::ptr_eq(open, &batch));
        batch.wait_for_helpers();
        slots
            .into_iter()
            .filter_map(|slot| slot.into_inner().1)
            .collect()
    }

    /// Takes items of a batch another thread of the run is running, while
    /// the run's busy threads fit its CPUs: for a thread with nothing to do
    /// until that work is done (the writer waiting for the reader's next
    /// slab), which then goes on using its CPU instead of sleeping while a
    /// worker is woken on it. The caller counts itself busy
    /// ([`working`](Self::working)) while it helps. Returns whether an
    /// item was taken. A job that panics here panics the batch's caller.
    pub(super) fn help(&self) -> bool {
        let batch = {
            let open = self.open.lock();
            let Some(batch) = open.first() else {
                return false;
            };
            // Entered under the lock the batch is closed under, so the
            // batch waits for this thread once it is closed.
            batch.enter();
            Arc::clone(batch)
        };
        let mut took = false;
        let fits = || self.busy.load(Ordering::Acquire) <= self.count;
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            while fits() && batch.take_item() {
                took = true;
            }
        }));
        batch.leave(ran.err());
        took
    }

    /// Counts the calling thread (the reader, the writer) as a busy worker
    /// until the guard is dropped, so that batches take helpers only for
    /// CPUs no other thread of the run is using: more threads running than
    /// CPUs would take turns on them, each switch a cost.
    pub(super) fn working(&self) -> impl Drop {
        Busy::start(&self.busy)
    }

    /// Runs `task` on a worker, or at once on the calling thread when it
    /// is the one worker. A task must answer its own panics: one that
    /// escapes a worker aborts the process.
    pub(super) fn spawn(&self, task: impl FnOnce() + Send + 'static) {
        match &self.pool {
            Some(pool) => {
                let busy = Busy::start(&self.busy);
                pool.spawn(move || {
                    task();
                    drop(busy);
                });
            }
            None => task(),
        }
    }
}

/// A batch running on its caller's thread, open to threads of the run that
/// have nothing else to do.
struct OpenBatch {
    /// Takes the batch's next item and runs its job (false: none left).
    take: *const (dyn Fn() -> bool + Sync + 'static),
    /// Helpers inside, and the first panic one of them caught.
    inside: Mutex<(usize, Option<Box<dyn Any + Send>>)>,
    left: Condvar,
}

// SAFETY: `take` is Sync, and it is called only while the batch is open or
// a helper that entered before it closed is inside (see `OpenBatch::new`).
unsafe impl Send for OpenBatch {}
// SAFETY: as for Send.
unsafe impl Sync for OpenBatch {}

impl OpenBatch {
    /// A batch whose items `take` takes.
    ///
    /// # Safety
    ///
    /// `take` must outlive the batch's being open: it is closed (taken out
    /// of [`Workers::open`]) and [`wait_for_helpers`](Self::wait_for_helpers)
    /// has returned before `take` is dropped.
    unsafe fn new(take: &(dyn Fn() -> bool + Sync)) -> OpenBatch {
        let take: *const (dyn Fn() -> bool + Sync + '_) = take;
        OpenBatch {
            // SAFETY: only the lifetime changes; the caller keeps `take`
            // alive for as long as it is used.
            take: unsafe {
                std::mem::transmute::<
                    *const (dyn Fn() -> bool + Sync + '_),
                    *const (dyn Fn() -> bool + Sync + 'static),
                >(take)
            },
            inside: Mutex::new((0, None)),
            left: Condvar::new(),
        }
    }

    fn take_item(&self) -> bool {
        // SAFETY: called by a helper inside the batch: see `new`.
        unsafe { (*self.take)() }
    }

    fn enter(&self) {
        self.inside.lock().0 += 1;
    }

    /// A helper leaves, with the panic of a job it ran, if any.
    fn leave(&self, panic: Option<Box<dyn Any + Send>>) {
        let mut inside = self.inside.lock();
        inside.0 -= 1;
        if inside.1.is_none() {
            inside.1 = panic;
        }
        self.left.notify_all();
    }

    /// Waits until every helper has left (each finishes the item it has),
    /// then panics with the first panic one of them caught.
    fn wait_for_helpers(&self) {
        let mut inside = self.inside.lock();
        while inside.0 > 0 {
            self.left.wait(&mut inside);
        }
        if let Some(panic) = inside.1.take() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// One worker counted busy, until dropped (a panic included).
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn start(busy: &Arc<AtomicUsize>) -> Busy {
        busy.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(busy))
    }

    /// A worker counted busy if fewer than `count` are.
    fn start_if_idle(busy: &Arc<AtomicUsize>, count: usize) -> Option<Busy> {
        busy.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            (now < count).then_some(now + 1)
        })
        .ok()
        .map(|_| Busy(Arc::clone(busy)))
    }

    /// Whether the run's busy threads, this one among them, fit on
    /// `count` CPUs.
    fn fits(&self, count: usize) -> bool {
        self.0.load(Ordering::Acquire) <= count
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_mapped_on_threads_come_back_in_order() {
        for count in [1, 2, 3, 8] {
            for len in [0usize, 1, 2, 7, 10, 100] {
                let items: Vec<usize> = (0..len).collect();
                let threads_used = parking_lot::Mutex::new(std::collections::HashSet::new());
                let doubled = map_on(count, &items, |&n| {
                    threads_used.lock().insert(std::thread::current().id());
                    2 * n
                });
                assert_eq!(doubled, items.iter().map(|n| 2 * n).collect::<Vec<_>>());
                // A thread per run of neighbouring items, the runs as even as may be.
                let threads = count.min(len);
                let runs = match threads {
                    0 | 1 => len.min(1),
                    _ => len.div_ceil(len.div_ceil(threads)),
                };
                assert_eq!(
                    threads_used.into_inner().len(),
                    runs,
                    "{count} threads, {len} items"
                );
            }
        }
    }

    #[test]
    fn jobs_on_workers_come_back_in_order() {
        for count in [1, 2, 3, 8] {
            let workers = Workers::new(count).unwrap();
            assert_eq!(workers.count(), count);
            let squares = workers.map(0..8u64, |n| {
                std::thread::sleep(std::time::Duration::from_millis(8 - n));
                n * n
            });
            assert_eq!(squares, [0, 1, 4, 9, 16, 25, 36, 49]);
        }
    }

    #[test]
    fn a_batch_takes_no_helper_while_the_run_uses_every_cpu() {
        let workers = Workers::new(2).unwrap();
        let here = std::thread::current().id();
        // The reader and the writer at work: both CPUs taken.
        let (reader, writer) = (workers.working(), workers.working());
        let threads = workers.map(0..64, |_| std::thread::current().id());
        assert!(threads.iter().all(|&thread| thread == here));
        drop((reader, writer));
        assert_eq!(workers.busy.load(Ordering::Acquire), 0);
    }

    /// Waits up to ten seconds for `done`.
    fn wait_for(mut done: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !done() && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_cpu_that_falls_idle_during_a_batch_joins_it() {
        let workers = Workers::new(2).unwrap();
        let here = std::thread::current().id();
        let reader = workers.working();
        let writer = parking_lot::Mutex::new(Some(workers.working()));
        let elsewhere = AtomicUsize::new(0);
        let threads = workers.map(0..64, |n| {
            if n == 0 {
                // The writer is done with its slab: a CPU is free.
                writer.lock().take();
            } else if std::thread::current().id() == here {
                wait_for(|| elsewhere.load(Ordering::Acquire) > 0);
            } else {
                elsewhere.fetch_add(1, Ordering::AcqRel);
            }
            std::thread::current().id()
        });
        assert!(threads.iter().any(|&thread| thread != here));
        drop(reader);
        assert_eq!(workers.busy.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_helper_leaves_when_the_run_needs_its_cpu_back() {
        let workers = Workers::new(2).unwrap();
        let here = std::thread::current().id();
        let reader = workers.working();
        let writer = parking_lot::Mutex::new(None);
        let helped = AtomicUsize::new(0);
        let threads = workers.map(0..64, |_| {
            if std::thread::current().id() == here {
                wait_for(|| helped.load(Ordering::Acquire) > 0);
            } else if helped.fetch_add(1, Ordering::AcqRel) == 0 {
                // The writer has a slab again while the helper works.
                *writer.lock() = Some(workers.working());
            }
            std::thread::current().id()
        });
        let by_helper = threads.iter().filter(|&&thread| thread != here).count();
        assert_eq!(by_helper, 1, "the helper takes no item after its first");
        drop((reader, writer));
        assert_eq!(workers.busy.load(Ordering::Acquire), 0);
    }

    /// The calling thread (the reader) and a writer counted busy: the
    /// reader's id, and the writer's count, for the writer to take; both
    /// before a batch starts, so no worker joins it.
    fn reader_and_writer_at_work(
        workers: &Workers,
    ) -> (std::thread::ThreadId, impl Drop, impl Drop + Send) {
        (
            std::thread::current().id(),
            workers.working(),
            workers.working(),
        )
    }

    #[test]
    fn a_thread_waiting_for_a_batch_helps_with_it() {
        let workers = Workers::new(2).unwrap();
        let (reader, _reading, writing) = reader_and_writer_at_work(&workers);
        let helped = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let _working = writing;
                let mut took = false;
                wait_for(|| {
                    took |= workers.help();
                    took
                });
                took
            });
            let threads = workers.map(0..64, |_| {
                if std::thread::current().id() == reader {
                    wait_for(|| helped.load(Ordering::Acquire) > 0);
                } else {
                    helped.fetch_add(1, Ordering::AcqRel);
                }
                std::thread::current().id()
            });
            assert!(writer.join().unwrap(), "the waiting thread took items");
            assert!(threads.iter().any(|&thread| thread != reader));
        });
        // Closed once it returned: nothing left to help with.
        assert!(!workers.help());
    }

    #[test]
    fn a_job_that_panics_on_a_helping_thread_panics_the_batchs_caller() {
        let workers = Workers::new(2).unwrap();
        let (reader, _reading, writing) = reader_and_writer_at_work(&workers);
        let helped = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _working = writing;
                wait_for(|| workers.help() || helped.load(Ordering::Acquire) > 0);
            });
            let batch = std::panic::catch_unwind(AssertUnwindSafe(|| {
                workers.map(0..64, |_| {
                    if std::thread::current().id() == reader {
                        wait_for(|| helped.load(Ordering::Acquire) > 0);
                    } else {
                        helped.fetch_add(1, Ordering::AcqRel);
                        panic!("a damaged block");
                    }
                })
            }));
            assert!(batch.is_err());
        });
    }

    #[test]
    fn a_task_runs_on_a_worker_or_at_once_on_the_one() {
        let one = Workers::one();
        let (sent, got) = std::sync::mpsc::channel();
        let here = std::thread::current().id();
        one.spawn(move || sent.send(std::thread::current().id()).unwrap());
        assert_eq!(got.recv().unwrap(), here);
        let two = Workers::new(2).unwrap();
        let (sent, got) = std::sync::mpsc::channel();
        two.spawn(move || sent.send(std::thread::current().id()).unwrap());
        assert_ne!(got.recv().unwrap(), here);
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
