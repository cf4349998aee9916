//! What other processes do to a running view: read its status file, wait
//! for it to end, and unmount it (also when its daemon has died). They
//! talk to the daemon only through the view's files and signals.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fuse::bad_view;
use crate::fuse::mountpoint::{absolute, is_mounted};
use crate::sys::process::{requester, Requester};
use crate::view::{Status, STATUS_NAME, WAIT_NAME};

/// Reads a mounted view's status file.
pub fn read_status(view: &Path) -> Result<Status> {
    read_status_file(view, STATUS_NAME)
}

/// Waits until a mounted view has stopped materialising (every block done,
/// a failure, or an unmount), and returns its status then. The wait is one
/// read that the daemon answers when that happens, so it ends at once.
pub fn wait_status(view: &Path) -> Result<Status> {
    match fs::symlink_metadata(view.join(WAIT_NAME)) {
        // A daemon of an earlier version serves no wait file: poll it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => loop {
            let status = read_status(view)?;
            if status.state != "materialising" {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        },
        _ => read_status_file(view, WAIT_NAME),
    }
}

fn read_status_file(view: &Path, name: &str) -> Result<Status> {
    let path = view.join(name);
    let bytes = match fs::read(&path) {
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

/// Unmounts a view: asks its daemon to stop (parked reads get an error,
/// the materialiser stops between read blocks), and detaches the mount
/// directly when the daemon is gone.
pub fn unmount(view: &Path) -> Result<()> {
    if !is_mounted(view) {
        return Err(bad_view(view, "is not mounted"));
    }
    match read_status(view) {
        Ok(status) => {
            let pid = nix::unistd::Pid::from_raw(status.pid as i32);
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_ok() {
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    // Gone from the mount table, and the daemon gone too: it
                    // holds the staging area's lock until it exits, so a
                    // mount right after this one would be refused before.
                    if !is_mounted(view) && requester(status.pid) == Requester::Gone {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                if !is_mounted(view) {
                    log::warn!(
                        "{} is unmounted, but its daemon (pid {}) is still running after 10 s",
                        view.display(),
                        status.pid
                    );
                    return Ok(());
                }
                log::warn!(
                    "the daemon did not unmount {} in 10 s; detaching it",
                    view.display()
                );
            }
            detach(view)
        }
        Err(_) => detach(view),
    }
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
