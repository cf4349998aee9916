//! What other processes do to a running view: read its status file, wait
//! for it to end, and unmount it (also when its daemon has died). They
//! talk to the daemon only through the view's files and signals.
//!
//! A daemon that is stopped (SIGSTOP, a frozen cgroup, `scontrol suspend`)
//! answers nothing, and a call into its view would wait until it is
//! continued. So its pid is found from the mount table, not the view, and
//! its state is read from /proc before anything enters the view, and
//! again while waiting on it: `status` then says so at once, and `umount`
//! detaches the view without waiting on the daemon.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fuse::bad_view;
use crate::fuse::mountpoint::{
    absolute, connection_of, daemon_of, is_mounted, is_stopped, stopped_daemon,
};
use crate::sys::process::{requester, Requester};
use crate::view::{Status, STATUS_NAME};

/// Reads a mounted view's status file.
pub fn read_status(view: &Path) -> Result<Status> {
    read_status_file(view, STATUS_NAME)
}

/// How often a wait on a view checks that its daemon is not stopped.
const DAEMON_CHECK: Duration = Duration::from_millis(100);

/// Waits until a mounted view has stopped materialising (every block done,
/// a failure, or an unmount), and returns its status then. It polls the
/// status file rather than read the wait file: a read the daemon holds
/// cannot be abandoned if the daemon is stopped meanwhile (the kernel
/// waits for its answer even when the reader is killed), and a stopped
/// daemon must end the wait with an error.
pub fn wait_status(view: &Path) -> Result<Status> {
    loop {
        let status = read_status(view)?;
        if status.state != "materialising" {
            return Ok(status);
        }
        std::thread::sleep(DAEMON_CHECK);
    }
}

/// Refuses to go on if a view is mounted at `view` and its daemon is
/// stopped: call before anything that enters `view`.
pub fn check_daemon(view: &Path) -> Result<()> {
    check_not_stopped(view, daemon_of(view))
}

/// Refuses to go on if the daemon of the view at `view` is stopped.
fn check_not_stopped(view: &Path, daemon: Option<u32>) -> Result<()> {
    match daemon.filter(|&pid| is_stopped(pid)) {
        Some(pid) => Err(stopped_daemon(view, pid)),
        None => Ok(()),
    }
}

/// The bytes of file `name` of the view at `view`, read on a thread of
/// its own while this one checks that the daemon is not stopped: a call
/// into a stopped daemon's view waits until it is continued. The outer
/// error says the daemon is stopped; the inner one is the read's.
fn read_view_file(view: &Path, name: &str) -> Result<std::io::Result<Vec<u8>>> {
    let daemon = daemon_of(view);
    check_not_stopped(view, daemon)?;
    let path = view.join(name);
    let (answer, answered) = std::sync::mpsc::channel();
    let reading = path.clone();
    let spawned = std::thread::Builder::new()
        .name("read-view".into())
        .spawn(move || {
            let _ = answer.send(fs::read(reading));
        });
    if spawned.is_err() {
        return Ok(fs::read(path));
    }
    loop {
        match answered.recv_timeout(DAEMON_CHECK) {
            Ok(result) => return Ok(result),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => check_not_stopped(view, daemon)?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Ok(Err(std::io::Error::other(
                    "the read of the view ended without an answer",
                )))
            }
        }
    }
}

fn read_status_file(view: &Path, name: &str) -> Result<Status> {
    let path = view.join(name);
    let bytes = match read_view_file(view, name)? {
        Ok(bytes) => bytes,
        // ENOTCONN once the daemon is gone; ECONNABORTED for a read it had
        // parked (a wait) when it died.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => {
            return Err(bad_view(
                view,
                format!(
                    "the view's daemon is not running (it died or was killed); run `rechunkfs umount {}`, \
                     then mount again with the same arguments to resume",
                    view.display()
                ),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad_view(view, "is not a mounted rechunkfs view (no status file)"));
        }
        Err(e) => return Err(Error::io(&path, "reading", e)),
    };
    serde_json::from_slice(&bytes).map_err(|e| bad_view(&path, format!("unreadable status: {e}")))
}

/// How an unmount went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// The mount is gone, and its daemon has ended (or was already dead).
    Done,
    /// The daemon (this pid) is stopped: the view was detached without it.
    /// It ends once continued, and holds the staging area until then.
    DaemonStopped(u32),
}

/// Unmounts a view: asks its daemon to stop (parked reads get an error,
/// the materialiser stops between read blocks), and detaches the mount
/// directly when the daemon is gone, stopped, or not done in 10 s.
pub fn unmount(view: &Path) -> Result<Unmounted> {
    if !is_mounted(view) {
        return Err(bad_view(view, "is not mounted"));
    }
    let stopped = || daemon_of(view).filter(|&pid| is_stopped(pid));
    if let Some(pid) = stopped() {
        return detach_stopped(view, pid);
    }
    let status = match read_status(view) {
        Ok(status) => status,
        Err(_) => match stopped() {
            Some(pid) => return detach_stopped(view, pid),
            None => return detach(view).map(|()| Unmounted::Done),
        },
    };
    let pid = nix::unistd::Pid::from_raw(status.pid as i32);
    if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_ok() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Gone from the mount table, and the daemon gone too: it
            // holds the staging area's lock until it exits, so a mount
            // right after this one would be refused before.
            if !is_mounted(view) && requester(status.pid) == Requester::Gone {
                return Ok(Unmounted::Done);
            }
            if is_stopped(status.pid) && is_mounted(view) {
                return detach_stopped(view, status.pid);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !is_mounted(view) {
            log::warn!(
                "{} is unmounted, but its daemon (pid {}) is still running after 10 s",
                view.display(),
                status.pid
            );
            return Ok(Unmounted::Done);
        }
        log::warn!(
            "the daemon did not unmount {} in 10 s; detaching it",
            view.display()
        );
    }
    detach(view).map(|()| Unmounted::Done)
}

/// Unmounts the view whose daemon `pid` is stopped, without a call that
/// waits on it: its FUSE connection is aborted when the kernel offers
/// that (readers waiting in the view get an error now, not once the
/// daemon is continued), and the mount is detached. The daemon is asked
/// to end; it does once continued.
fn detach_stopped(view: &Path, pid: u32) -> Result<Unmounted> {
    if let Some(connection) = connection_of(view) {
        let abort = connection.join("abort");
        if let Err(e) = fs::write(&abort, "1") {
            log::debug!("{}: {e}", abort.display());
        }
    }
    detach(view)?;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    Ok(Unmounted::DaemonStopped(pid))
}

/// Detaches the mount, so it goes away as soon as no file in it is open.
pub fn detach(view: &Path) -> Result<()> {
    let target = absolute(view);
    if nix::unistd::geteuid().is_root() {
        nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|e| Error::io(&target, "unmounting", e.into()))
    } else {
        let status = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&target)
            .status()
            .map_err(|e| Error::os("fusermount3", "unmounting the view", e))?;
        if status.success() {
            Ok(())
        } else {
            Err(bad_view(
                &target,
                format!("fusermount3 -u -z failed ({status})"),
            ))
        }
    }
}
