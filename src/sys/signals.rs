//! Stopping a command cleanly on SIGINT, SIGTERM or SIGHUP: the first such
//! signal only raises a flag, which the work polls between steps, so the
//! command can remove what it half wrote and say so before it ends. The
//! second one of a kind has its default action (the handler resets itself),
//! so a user can still stop a command stuck in the kernel at once.
//!
//! A signal that was ignored when the process started (`nohup`, a
//! background job of a non-interactive shell) stays ignored.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::error::{Error, Result};

/// The signals that ask a command to stop.
const STOPPING: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Set by the first stopping signal.
static STOP: AtomicBool = AtomicBool::new(false);

/// The number of the first stopping signal (0: none yet).
static FIRST: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stopping_signal(signo: libc::c_int) {
    // Only atomics here: nothing else is async-signal-safe.
    let _ = FIRST.compare_exchange(0, signo, Ordering::SeqCst, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// Catches the stopping signals from now on; returns the flag the first
/// one sets, to hand to work that polls it.
pub fn catch_stopping_signals() -> Result<&'static AtomicBool> {
    // SA_RESETHAND: a second signal of a kind takes its default action.
    // SA_RESTART: a slow system call carries on instead of failing EINTR.
    let catch = SigAction::new(
        SigHandler::Handler(on_stopping_signal),
        SaFlags::SA_RESETHAND | SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in STOPPING {
        // SAFETY: the handler touches only atomics.
        let before = unsafe { signal::sigaction(signal, &catch) }
            .map_err(|e| Error::os("sigaction", "catching stopping signals", e.into()))?;
        if before.handler() == SigHandler::SigIgn {
            // SAFETY: restoring the disposition the process started with.
            unsafe { signal::sigaction(signal, &before) }
                .map_err(|e| Error::os("sigaction", "keeping a signal ignored", e.into()))?;
        }
    }
    Ok(&STOP)
}

/// The first stopping signal caught, if any.
pub fn caught() -> Option<Signal> {
    Signal::try_from(FIRST.load(Ordering::SeqCst)).ok()
}

/// Ends the process as `signal` would have without a handler, so that a
/// parent (a shell running a script) sees it killed by the signal and
/// stops too, rather than a plain failure it would carry on after.
pub fn end_by(signal: Signal) -> ! {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: setting a signal's disposition to its default.
    let _ = unsafe { signal::sigaction(signal, &default) };
    let mut only = SigSet::empty();
    only.add(signal);
    let _ = signal::pthread_sigmask(signal::SigmaskHow::SIG_UNBLOCK, Some(&only), None);
    let _ = signal::raise(signal);
    // Not reached for the stopping signals, whose default action ends the
    // process; the shell's convention for a death by signal otherwise.
    std::process::exit(128 + signal as i32)
}
