//! Whether a view can be mounted here: the mount point and FUSE itself are
//! checked in the calling process, before anything is started, so the
//! person sees what is wrong at once. Also whether the daemon of a view
//! mounted here is stopped, read from /proc without entering the view.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fuse::bad_view;

/// A mount as /proc/self/mountinfo lists it.
struct Mount {
    point: PathBuf,
    /// The kernel's device number of the mounted filesystem (its FUSE
    /// connection's number under /sys/fs/fuse/connections).
    device: u64,
    /// What was mounted: for a view, its daemon's pid and input
    /// ([`fs_name`]).
    source: String,
    /// The user a FUSE mount belongs to (its `user_id` option).
    user: Option<u32>,
}

/// Mounts listed in /proc/self/mountinfo, in mount order.
fn mounts() -> Vec<Mount> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let (major, minor) = fields.get(2)?.split_once(':')?;
            let device = major.parse::<u64>().ok()? << 20 | minor.parse::<u64>().ok()?;
            // After the optional fields: "-", the type, the source.
            let dash = fields.iter().position(|f| *f == "-")?;
            let user = fields.get(dash + 3).and_then(|options| {
                options
                    .split(',')
                    .find_map(|option| option.strip_prefix("user_id="))
                    .and_then(|uid| uid.parse().ok())
            });
            Some(Mount {
                point: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(fields.get(4)?))),
                device,
                source: String::from_utf8_lossy(&unescape(fields.get(dash + 2)?)).into_owned(),
                user,
            })
        })
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape(field: &str) -> Vec<u8> {
    let mut decoded = Vec::new();
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                decoded.push(value);
                i += 4;
                continue;
            }
        }
        decoded.push(bytes[i]);
        i += 1;
    }
    decoded
}

/// The name a view's filesystem is mounted under: the daemon's pid, so
/// that `status` and `umount` find it without a call into the view (which
/// a stopped daemon would never answer), then the input.
pub(super) fn fs_name(pid: u32, input: &Path) -> String {
    format!("rechunkfs@{pid}:{}", input.display())
}

/// The topmost mount at `view`, found without entering it.
fn mount_at(view: &Path) -> Option<Mount> {
    let wanted = absolute(view);
    let resolved = resolved_outside(view);
    mounts()
        .into_iter()
        .rev()
        .find(|m| m.point == wanted || Some(&m.point) == resolved.as_ref())
}

/// The pid of the daemon serving the view mounted at `view`, from its
/// mount's name; `None` if no view is mounted there. The name is taken
/// only if that process belongs to the mount's user: only that user (or
/// root) could have made a mount naming it, so a signal sent to it on the
/// name's word reaches no one else's process.
pub(super) fn daemon_of(view: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let mount = mount_at(view)?;
    let rest = mount.source.strip_prefix("rechunkfs@")?;
    let pid: u32 = rest.split_once(':')?.0.parse().ok()?;
    let owner = fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    (Some(owner) == mount.user).then_some(pid)
}

/// The FUSE connection of the mount at `view`: its directory under
/// /sys/fs/fuse/connections (where `abort` ends it), when that is mounted.
pub(super) fn connection_of(view: &Path) -> Option<PathBuf> {
    let dir = PathBuf::from(format!(
        "/sys/fs/fuse/connections/{}",
        mount_at(view)?.device
    ));
    dir.is_dir().then_some(dir)
}

/// `path` with its parent's links and dots resolved but not its last
/// component: resolving that would enter a mount there, and wait on its
/// daemon.
fn resolved_outside(path: &Path) -> Option<PathBuf> {
    let absolute = absolute(path);
    match absolute.file_name() {
        Some(name) if !matches!(name.to_str(), Some("." | "..")) => {
            let parent = absolute.parent()?.canonicalize().ok()?;
            Some(parent.join(name))
        }
        _ => absolute.canonicalize().ok(),
    }
}

/// The absolute form of `path` without resolving it (a dead FUSE mount
/// cannot be resolved: stat fails with ENOTCONN).
pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Whether something is mounted at `view` (found without entering it).
pub fn is_mounted(view: &Path) -> bool {
    mount_at(view).is_some()
}

/// Whether process `pid` is stopped (state `T`, or `t` when traced).
pub fn is_stopped(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which may hold anything.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'T' | 't'))
    })
}

/// The refusal to enter `view`, whose daemon `pid` is stopped.
pub fn stopped_daemon(view: &Path, pid: u32) -> Error {
    bad_view(
        view,
        format!(
            "the view's daemon (pid {pid}) is stopped (SIGSTOP, a frozen cgroup or a suspended \
             job), so nothing in the view answers until it is continued. Continue it (kill -CONT \
             {pid}), or run `rechunkfs umount {}`, which detaches the view without it",
            view.display()
        ),
    )
}

/// The mount point must exist, be an empty directory, and not be mounted.
pub fn check_mount_point(view: &Path) -> Result<()> {
    // Before any stat of it: a view there whose daemon is stopped would
    // never answer.
    if let Some(pid) = daemon_of(view).filter(|&pid| is_stopped(pid)) {
        return Err(stopped_daemon(view, pid));
    }
    let meta = match fs::metadata(view) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad_view(
                view,
                "does not exist; create an empty directory to mount the view on (mkdir -p it)",
            ))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(bad_view(
                view,
                format!(
                    "is a view whose daemon has died; run `rechunkfs umount {}` first, then mount again \
                     (completed blocks are kept)",
                    view.display()
                ),
            ))
        }
        Err(e) => return Err(Error::io(view, "checking the mount point", e)),
    };
    if !meta.is_dir() {
        return Err(bad_view(
            view,
            "is not a directory; the view is mounted on an empty directory",
        ));
    }
    if is_mounted(view) {
        return Err(bad_view(
            view,
            format!(
                "is already a mount point; unmount it first (rechunkfs umount {})",
                view.display()
            ),
        ));
    }
    let mut entries = fs::read_dir(view).map_err(|e| Error::io(view, "listing", e))?;
    if entries.next().is_some() {
        return Err(bad_view(
            view,
            "is not empty; mount the view on an empty directory so nothing in it is hidden",
        ));
    }
    Ok(())
}

/// FUSE must be usable: /dev/fuse present and, unless root, fusermount3.
pub fn check_fuse() -> Result<()> {
    let fuse = Path::new("/dev/fuse");
    if !fuse.exists() {
        return Err(bad_view(
            fuse,
            "is missing: this system has no FUSE support (load the fuse kernel module: modprobe fuse; \
             in a container, pass the device in)",
        ));
    }
    if let Err(e) = fs::OpenOptions::new().read(true).write(true).open(fuse) {
        return Err(Error::io(fuse, "opening (needed to mount a view)", e));
    }
    if !nix::unistd::geteuid().is_root() && which("fusermount3").is_none() {
        return Err(bad_view(
            Path::new("fusermount3"),
            "is not installed, and mounting without root needs it: install the fuse3 package \
             (apt-get install fuse3)",
        ));
    }
    Ok(())
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}
