//! A view's life once prepared: the view starts its materialiser and
//! stops it, so what serves the view (the FUSE daemon, `serve`, a test)
//! starts it and stops it and knows nothing of what runs inside.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::Result;
use crate::view::core::{panic_failure, panic_text, ViewCore};
use crate::view::materialise::{Materialiser, Pacing, STOP_GRACE};
use crate::view::prepare::PreparedView;

/// A view being filled: its core, served from any thread, and its
/// materialiser. Dropping it stops it as [`RunningView::stop`] does.
pub struct RunningView {
    core: Arc<ViewCore>,
    materialiser: Option<Materialiser>,
}

/// Stops a running view from another thread (a signal's): parked reads
/// are answered at once, and the materialiser stops between read blocks.
#[derive(Clone)]
pub struct ViewStopper {
    core: Arc<ViewCore>,
    cancel: Arc<AtomicBool>,
}

impl ViewStopper {
    pub fn stop(&self) {
        // Readers first: their files can close while the materialiser
        // winds down.
        self.core.shutdown();
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl PreparedView {
    /// Starts filling the view: the plan runs into its staging area, paced
    /// by `pacing`, and (unless the mount asked for the plan's order)
    /// blocks readers wait for are extracted ahead of it.
    pub fn start(self, pacing: Pacing) -> Result<RunningView> {
        let materialiser = Materialiser::start_paced(
            self.core.clone(),
            self.input,
            self.plan,
            self.on_demand,
            pacing,
        )?;
        Ok(RunningView {
            core: self.core,
            materialiser: Some(materialiser),
        })
    }
}

impl RunningView {
    pub fn core(&self) -> &Arc<ViewCore> {
        &self.core
    }

    /// Makes a panic on any thread of the process fail the view, as the
    /// materialiser's own does ([`ViewCore::fail_on_panic`]): a view whose
    /// thread died must not look as if it were still being filled. For a
    /// process that serves this one view; the panicking thread may hold
    /// the view's lock until it unwinds, so another thread fails the view.
    pub fn fail_on_any_panic(&self) {
        let view = Arc::downgrade(&self.core);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let Some(core) = view.upgrade() else {
                return;
            };
            let thread = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string();
            let mut what = panic_text(info.payload());
            if let Some(at) = info.location() {
                what = format!("{what}, at {at}");
            }
            let message = panic_failure(&thread, what);
            let _ = std::thread::Builder::new()
                .name("panic".into())
                .spawn(move || core.fail(message));
        }));
    }

    pub fn stopper(&self) -> ViewStopper {
        ViewStopper {
            core: self.core.clone(),
            cancel: self.materialiser.as_ref().map_or_else(
                || Arc::new(AtomicBool::new(true)),
                Materialiser::cancel_flag,
            ),
        }
    }

    /// Answers parked reads, stops the materialiser between read blocks
    /// and waits for it to make what it completed durable, up to
    /// [`STOP_GRACE`]. Returns false if it did not end by then (a thread
    /// stuck in the kernel, reading a hung filesystem): it is left behind,
    /// and only ending the process ends it.
    pub fn stop(mut self) -> bool {
        self.stop_now()
    }

    fn stop_now(&mut self) -> bool {
        self.core.shutdown();
        self.materialiser
            .take()
            .is_none_or(|materialiser| materialiser.stop(STOP_GRACE))
    }
}

impl Drop for RunningView {
    fn drop(&mut self) {
        self.stop_now();
    }
}
