//! The materialiser: a background thread that runs the plan into the
//! staging area and tells the view as each block completes.
//!
//! A block is reported done only after its data are synced and its journal
//! record is synced after them, so a crash never leaves a block recorded
//! complete without its bytes.

use std::collections::HashSet;
use std::fs::File;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use lru::LruCache;

use crate::error::{Error, Result};
use crate::execute::{BlockSink, Executor, OutputTarget, RunStats};
use crate::input::InputArray;
use crate::plan::Plan;
use crate::view::ViewCore;

/// Staging files kept open while partially written.
const OPEN_OUTPUTS: usize = 128;

struct OpenOutput {
    file: File,
    path: PathBuf,
    data_offset: u64,
    file_shape: Vec<u64>,
}

/// A [`BlockSink`] writing the view's block files into its staging area.
pub struct StagingSink {
    core: Arc<ViewCore>,
    open: LruCache<u64, OpenOutput>,
    created: HashSet<u64>,
}

impl StagingSink {
    pub fn new(core: Arc<ViewCore>) -> StagingSink {
        StagingSink {
            core,
            open: LruCache::new(NonZeroUsize::new(OPEN_OUTPUTS).unwrap_or(NonZeroUsize::MIN)),
            created: HashSet::new(),
        }
    }
}

impl BlockSink for StagingSink {
    fn wants(&mut self, rank: u64) -> bool {
        !self.core.is_done(rank)
    }

    fn target(&mut self, rank: u64) -> Result<OutputTarget<'_>> {
        if !self.open.contains(&rank) {
            let path = self.core.staged_path(rank);
            let template = self.core.template(rank);
            let file = if self.created.contains(&rank) {
                File::options()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, "reopening", e))?
            } else {
                // Whatever an interrupted run left here is not recorded
                // done, so it is rewritten from scratch.
                self.created.insert(rank);
                template.create_file(&path)?
            };
            let data_offset = template.data_offset;
            self.open.put(
                rank,
                OpenOutput {
                    file,
                    path,
                    data_offset,
                    file_shape: self.core.files().file_shape(rank),
                },
            );
        }
        let open = self
            .open
            .get(&rank)
            .ok_or_else(|| Error::BadArgument("open-file cache lost an entry".into()))?;
        Ok(OutputTarget {
            file: &open.file,
            path: &open.path,
            data_offset: open.data_offset,
            file_shape: &open.file_shape,
        })
    }

    fn complete(&mut self, rank: u64) -> Result<()> {
        self.created.remove(&rank);
        let open = match self.open.pop(&rank) {
            Some(open) => open,
            None => {
                let path = self.core.staged_path(rank);
                let file = File::options()
                    .write(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, "reopening", e))?;
                OpenOutput {
                    file,
                    path,
                    data_offset: 0,
                    file_shape: Vec::new(),
                }
            }
        };
        open.file
            .sync_data()
            .map_err(|e| Error::io(&open.path, "syncing", e))?;
        self.core.staging().record_done(&[rank])?;
        self.core.mark_done(&[rank]);
        Ok(())
    }
}

/// `RECHUNKFS_STEP_DELAY_MS`: a pause after every read block, to watch a
/// view fill (demos) or to hold blocks pending (tests). Unset: no pause.
fn step_delay() -> Option<std::time::Duration> {
    std::env::var("RECHUNKFS_STEP_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(std::time::Duration::from_millis)
}

/// A running materialiser.
pub struct Materialiser {
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Materialiser {
    /// Starts running `plan` over `input` into `core`'s staging area.
    pub fn start(core: Arc<ViewCore>, input: InputArray, plan: Plan) -> Result<Materialiser> {
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("materialiser".into())
            .spawn(move || {
                let mut sink = StagingSink::new(core.clone());
                let progress_core = core.clone();
                let step_delay = step_delay();
                let result = Executor::new(&plan, &input).with_cancel(&stop).run(
                    &mut sink,
                    |stats: &RunStats| {
                        progress_core.update_run(stats);
                        if let Some(delay) = step_delay {
                            std::thread::sleep(delay);
                        }
                    },
                );
                match result {
                    Ok(stats) => {
                        log::info!(
                            "materialised every block: {} seeks (planned {})",
                            stats.seeks(),
                            plan.prediction.seeks()
                        );
                        core.finish(&stats);
                    }
                    Err(Error::Cancelled) => log::info!("materialiser stopped"),
                    Err(error) => {
                        log::error!("materialiser failed: {error}");
                        core.fail(error.to_string());
                    }
                }
            })
            .map_err(|e| Error::io("materialiser", "starting a thread", e))?;
        Ok(Materialiser {
            cancel,
            thread: Some(thread),
        })
    }

    /// Stops between read blocks and waits for the thread.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the materialiser thread panicked");
            }
        }
    }
}

impl Drop for Materialiser {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
