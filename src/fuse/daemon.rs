//! The process that serves a view: it mounts the view with its materialiser
//! running, serves the kernel (and, with `mount --serve`, HTTP clients
//! from the same core) until an unmount or a shutdown signal, and
//! can fork itself into the background, writing its log beside the staging
//! area, once the view is usable.
//!
//! It ends promptly once told to, whatever its threads are doing: a thread
//! stuck in the kernel (the materialiser reading from a hung filesystem)
//! is left behind rather than waited for, and a shutdown signal ends the
//! process [`EXIT_GRACE`] later even if a reader still holds a file of the
//! view open (the session would otherwise serve it until it closes).

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::SigSet;

use crate::error::{Error, Result};
use crate::fuse::client::detach;
use crate::fuse::mountpoint::fs_name;
use crate::fuse::{bad_view, RechunkFs};
use crate::http::HttpServer;
use crate::input::InputArray;
use crate::sys::process::exit_now;
use crate::view::materialise::{Materialiser, STOP_GRACE};
use crate::view::{PreparedView, ViewCore};

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

/// A thread that waits for a shutdown signal, then answers parked
/// readers, tells the materialiser to stop, detaches the view, and ends
/// the process [`EXIT_GRACE`] later if it has not ended by then.
fn spawn_signal_thread(
    signals: SigSet,
    core: Arc<ViewCore>,
    view: PathBuf,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(signal) = signals.wait() {
                log::info!("{signal:?}: unmounting {}", view.display());
                // Answer parked readers first, so their files can close and
                // the detached mount can go.
                core.shutdown();
                stop.store(true, Ordering::Relaxed);
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

/// Makes a panic on any of the daemon's threads (fuser's session threads,
/// read-ahead, the requester watcher, HTTP) fail the view, as the
/// materialiser's own does ([`ViewCore::fail_on_panic`]): a view whose
/// thread died must not look as if it were still being filled. The
/// panicking thread may hold the view's lock until it unwinds, so another
/// thread fails the view.
fn fail_view_on_panic(core: &Arc<ViewCore>) {
    let view = Arc::downgrade(core);
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
        let mut what = crate::view::panic_text(info.payload());
        if let Some(at) = info.location() {
            what = format!("{what}, at {at}");
        }
        let message = crate::view::panic_failure(&thread, what);
        let _ = std::thread::Builder::new()
            .name("panic".into())
            .spawn(move || core.fail(message));
    }));
}

/// How fuser mounts and runs the session of a view of `input`.
fn session_config(input: &InputArray, allow_other: bool) -> fuser::Config {
    let options = vec![
        fuser::MountOption::FSName(fs_name(std::process::id(), &input.source)),
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

/// Mounts the view and serves it until it is unmounted or a shutdown
/// signal arrives, and over HTTP too with `http`. `ready` is told once the
/// view is usable (or why not).
pub fn serve(
    prepared: PreparedView,
    http: Option<HttpServer>,
    ready: impl FnOnce(Result<()>),
) -> Result<()> {
    let signals = block_shutdown_signals()?;
    let PreparedView {
        core,
        input,
        plan,
        view,
        allow_other,
        on_demand,
    } = prepared;
    fail_view_on_panic(&core);
    let config = session_config(&input, allow_other);
    // Started first, so its first reads overlap the mount: nothing it
    // does needs the view mounted, and if mounting fails, what it
    // completed meanwhile is kept in the staging area like any other.
    let materialiser = Materialiser::start(core.clone(), input, plan, on_demand)?;
    let mounting = Instant::now();
    let mut session = match fuser::Session::new(RechunkFs::new(core.clone()), &view, &config) {
        Ok(session) => session,
        Err(e) => {
            core.shutdown();
            stop_or_exit(materialiser, 1);
            let error = Error::io(&view, "mounting the view", e);
            let message = error.to_string();
            ready(Err(error));
            return Err(bad_view(&view, message));
        }
    };
    log::debug!("mounted in {:.3} s", mounting.elapsed().as_secs_f64());
    spawn_signal_thread(
        signals,
        core.clone(),
        view.clone(),
        materialiser.cancel_flag(),
    )?;

    let _unmounter = session.unmount_callable();
    if let Some(Err(error)) = http.map(HttpServer::start) {
        core.shutdown();
        stop_or_exit(materialiser, 1);
        let message = error.to_string();
        ready(Err(error));
        return Err(bad_view(&view, message));
    }
    ready(Ok(()));
    let result = session.run();
    core.shutdown();
    stop_or_exit(materialiser, i32::from(result.is_err()));
    result.map_err(|e| Error::io(&view, "serving the view", e))
}

/// Stops the materialiser; if it does not stop in time (a thread stuck in
/// the kernel would hold the process's exit, and its exit handlers), ends
/// the process now with `code`. Parked readers were answered before.
fn stop_or_exit(materialiser: Materialiser, code: i32) {
    if !materialiser.stop(STOP_GRACE) {
        log::warn!("exiting without the materialiser, which is stuck");
        exit_now(code);
    }
}

/// Forks a daemon that serves the view, and returns its pid once the view
/// is mounted and usable (or the reason it could not be); it serves `http`
/// too. Must be called before any thread is started: only the calling
/// thread survives a fork.
pub fn serve_in_background(prepared: PreparedView, http: Option<HttpServer>) -> Result<i32> {
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
                error => Err(Error::BadOutput {
                    path: PathBuf::from("mount"),
                    problem: error.to_string(),
                }),
            }
        }
        nix::unistd::ForkResult::Child => {
            drop(read_end);
            run_daemon(prepared, http, write_end, &log)
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
fn run_daemon(
    prepared: PreparedView,
    http: Option<HttpServer>,
    write_end: OwnedFd,
    log: &Path,
) -> ! {
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
    let result = serve(prepared, http, move |ready| {
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
