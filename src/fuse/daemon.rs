//! The process that serves a view: it starts the view, mounts it, serves
//! the kernel (and whatever the command starts beside the mount, such as
//! `mount --serve`'s HTTP server over the same core) until an unmount or a
//! shutdown signal, and can fork itself into the background, writing its
//! log beside the staging area, once the view is usable.
//!
//! It ends promptly once told to, whatever its threads are doing: a thread
//! stuck in the kernel (the materialiser reading from a hung filesystem)
//! is left behind rather than waited for, and a shutdown signal ends the
//! process [`EXIT_GRACE`] later even if a reader still holds a file of the
//! view open (the session would otherwise serve it until it closes).

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::SigSet;

use crate::error::{Error, Result};
use crate::fuse::client::detach;
use crate::fuse::mountpoint::fs_name;
use crate::fuse::{bad_view, RechunkFs};
use crate::sys::process::exit_now;
use crate::view::{Pacing, PreparedView, RunningView, ViewStopper};

/// How long after a shutdown signal the daemon exits, done or not.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Where a background daemon writes its log: beside its staging area.
pub fn log_path(prepared: &PreparedView) -> PathBuf {
    prepared.core.staging().dir().join("daemon.log")
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread and every thread it
/// starts afterwards, so one thread can wait for them with `sigwait`.
fn block_shutdown_signals() -> Result<SigSet> {
    use nix::sys::signal::{SigmaskHow, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .map_err(|e| Error::os("pthread_sigmask", "blocking shutdown signals", e.into()))?;
    Ok(set)
}

/// A thread that waits for a shutdown signal, then stops the view
/// (answering parked readers), detaches it, and ends the process
/// [`EXIT_GRACE`] later if it has not ended by then.
fn spawn_signal_thread(signals: SigSet, stopper: ViewStopper, view: PathBuf) -> Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(signal) = signals.wait() {
                log::info!("{signal:?}: unmounting {}", view.display());
                // Parked readers are answered first, so their files can
                // close and the detached mount can go.
                stopper.stop();
                if let Err(e) = detach(&view) {
                    log::error!("{e}");
                }
                std::thread::sleep(EXIT_GRACE);
                log::warn!(
                    "still running {} s after {signal:?} (a file of the view still open, or a \
                     thread stuck in the kernel): exiting now",
                    EXIT_GRACE.as_secs()
                );
                exit_now(0);
            }
        })
        .map_err(|e| Error::os("thread spawn", "starting the signal thread", e))?;
    Ok(())
}

/// How fuser mounts and runs the session of a view of the input `source`.
fn session_config(source: &Path, allow_other: bool) -> fuser::Config {
    let options = vec![
        fuser::MountOption::FSName(fs_name(std::process::id(), source)),
        fuser::MountOption::Subtype("rechunkfs".into()),
        fuser::MountOption::RO,
        fuser::MountOption::NoAtime,
        fuser::MountOption::DefaultPermissions,
    ];
    let mut config = fuser::Config::default();
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.mount_options = options;
    // Reads of done blocks are preads that may wait on the disk; a few
    // threads keep one slow read from delaying the rest.
    config.n_threads = Some(4);
    config.clone_fd = true;
    config
}

/// What a command adds to the view it serves: how the materialiser is
/// paced, and what is started beside the mount once it is up (`mount
/// --serve`'s HTTP server). A start that fails unmounts the view and is
/// the mount's error.
#[derive(Default)]
pub struct Extras {
    pub pacing: Pacing,
    pub beside: Vec<Box<dyn FnOnce() -> Result<()>>>,
}

/// Mounts the view and serves it until it is unmounted or a shutdown
/// signal arrives, with `extras`. `ready` is told once the view is usable
/// (or why not).
pub fn serve(prepared: PreparedView, extras: Extras, ready: impl FnOnce(Result<()>)) -> Result<()> {
    let signals = block_shutdown_signals()?;
    let config = session_config(&prepared.input.source, prepared.allow_other);
    let view = prepared.view.clone();
    // Started first, so its first reads overlap the mount: nothing it
    // does needs the view mounted, and if mounting fails, what it
    // completed meanwhile is kept in the staging area like any other.
    let running = prepared.start(extras.pacing)?;
    // fuser's session threads, read-ahead, the requester watcher, HTTP.
    running.fail_on_any_panic();
    let mounting = Instant::now();
    let fs = RechunkFs::new(running.core().clone());
    let mut session = match fuser::Session::new(fs, &view, &config) {
        Ok(session) => session,
        Err(e) => {
            stop_or_exit(running, 1);
            let error = Error::io(&view, "mounting the view", e);
            let message = error.to_string();
            ready(Err(error));
            return Err(bad_view(&view, message));
        }
    };
    log::debug!("mounted in {:.3} s", mounting.elapsed().as_secs_f64());
    spawn_signal_thread(signals, running.stopper(), view.clone())?;

    let _unmounter = session.unmount_callable();
    for start in extras.beside {
        if let Err(error) = start() {
            stop_or_exit(running, 1);
            let message = error.to_string();
            ready(Err(error));
            return Err(bad_view(&view, message));
        }
    }
    ready(Ok(()));
    let result = session.run();
    stop_or_exit(running, i32::from(result.is_err()));
    result.map_err(|e| Error::io(&view, "serving the view", e))
}

/// Stops the view; if its materialiser does not stop in time (a thread
/// stuck in the kernel would hold the process's exit, and its exit
/// handlers), ends the process now with `code`.
fn stop_or_exit(running: RunningView, code: i32) {
    if !running.stop() {
        log::warn!("exiting without the materialiser, which is stuck");
        exit_now(code);
    }
}

/// Forks a daemon that serves the view, and returns its pid once the view
/// is mounted and usable (or the reason it could not be), with `extras`. Must be called before any thread is started: only the calling
/// thread survives a fork.
pub fn serve_in_background(prepared: PreparedView, extras: Extras) -> Result<i32> {
    let log = log_path(&prepared);
    let (read_end, write_end) =
        nix::unistd::pipe().map_err(|e| Error::os("pipe", "starting the daemon", e.into()))?;
    // SAFETY: no other thread exists yet (the view is only prepared), so
    // the child starts from a consistent copy of this one.
    match unsafe { nix::unistd::fork() }
        .map_err(|e| Error::os("fork", "starting the daemon", e.into()))?
    {
        nix::unistd::ForkResult::Parent { child } => {
            drop(write_end);
            let message = hear_from_daemon(read_end)?;
            match message.as_str() {
                "ok" => Ok(child.as_raw()),
                "" => Err(bad_view(
                    &prepared_view_path(&log),
                    format!(
                        "the view's daemon exited before mounting; its log is {}",
                        log.display()
                    ),
                )),
                error => Err(Error::Daemon(error.to_string())),
            }
        }
        nix::unistd::ForkResult::Child => {
            drop(read_end);
            run_daemon(prepared, extras, write_end, &log)
        }
    }
}

/// What the daemon wrote to the pipe before closing it: "ok", an error,
/// or nothing if it died first.
fn hear_from_daemon(read_end: OwnedFd) -> Result<String> {
    use std::io::Read;
    let mut message = String::new();
    fs::File::from(read_end)
        .read_to_string(&mut message)
        .map_err(|e| Error::os("read", "hearing from the daemon", e))?;
    Ok(message)
}

/// The forked daemon: detached from the terminal, logging to `log`, it
/// serves the view and writes to `write_end` whether the view came up.
fn run_daemon(prepared: PreparedView, extras: Extras, write_end: OwnedFd, log: &Path) -> ! {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    let _ = nix::unistd::setsid();
    // Off the caller's terminal and pipes, also if the log cannot be
    // opened: a pipe the daemon held would keep its reader waiting.
    if let Ok(null) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
    // The log names inputs and blocks: the owner's alone, like the area,
    // and never written through a link.
    let opened = crate::sys::trust::open_own(
        log,
        fs::OpenOptions::new().create(true).append(true).mode(0o600),
    );
    if let Ok(file) = opened {
        // A log an earlier version made readable by all.
        let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600));
        let _ = nix::unistd::dup2(file.as_raw_fd(), 1);
        let _ = nix::unistd::dup2(file.as_raw_fd(), 2);
    }
    // The copied table ends at the highest open descriptor; grown
    // again here, before the daemon's threads start.
    crate::sys::limits::reserve_descriptor_table();
    // The lock on the staging area is shared with the parent, which ends
    // now: a second mount's refusal should name this process.
    prepared.core.staging().claim();
    let mut pipe = fs::File::from(write_end);
    // The parent reads to end of file: the pipe must close as soon
    // as the outcome is written, so the closure owns it.
    let result = serve(prepared, extras, move |ready| {
        let message = match ready {
            Ok(()) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        let _ = pipe.write_all(message.as_bytes());
    });
    if let Err(e) = &result {
        log::error!("{e}");
    }
    std::process::exit(i32::from(result.is_err()));
}

fn prepared_view_path(log: &Path) -> PathBuf {
    log.parent().map(Path::to_path_buf).unwrap_or_default()
}
