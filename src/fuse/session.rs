//! Bringing a view up and down: checking the mount point and FUSE, preparing
//! the view (scan, plan, staging), running the session with its
//! materialiser, clean shutdown on SIGINT/SIGTERM, and `umount`/`status`
//! from another process.
//!
//! Everything that can be wrong with the arguments is checked before
//! mounting, in the calling process, so the person sees it at once.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::format::BlockFormat;
use crate::fuse::RechunkFs;
use crate::input::{HeaderChecks, InputArray};
use crate::plan::{self, Plan, Problem, Strategy};
use crate::view::materialise::Materialiser;
use crate::view::staging::{Manifest, Staging};
use crate::view::{BlockTemplates, Status, ViewCore, ViewLayout, STATUS_NAME, WAIT_NAME};

/// What `rechunkfs mount` was asked for.
#[derive(Clone, Debug)]
pub struct MountRequest {
    pub input: PathBuf,
    pub view: PathBuf,
    pub output_block: Vec<u64>,
    pub mem: Option<u64>,
    pub strategy: Strategy,
    pub staging: Option<PathBuf>,
    pub format: Option<BlockFormat>,
    pub dataset: String,
    pub rebuild: bool,
    pub allow_other: bool,
    /// Never extract blocks ahead of the plan for waiting readers.
    pub in_order: bool,
}

/// A view ready to mount: everything checked, nothing running yet.
pub struct PreparedView {
    pub core: Arc<ViewCore>,
    pub input: InputArray,
    pub plan: Plan,
    pub view: PathBuf,
    pub allow_other: bool,
    /// The memory limit, also for blocks extracted ahead of the plan.
    pub mem: Option<u64>,
    /// Whether blocks readers wait for may be extracted ahead of the plan.
    pub on_demand: bool,
}

fn bad_view(path: &Path, problem: impl Into<String>) -> Error {
    Error::BadOutput {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Mount points listed in /proc/self/mountinfo (octal escapes decoded).
fn mount_points() -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| {
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
            PathBuf::from(std::ffi::OsStr::from_bytes(&decoded))
        })
        .collect()
}

/// The absolute form of `path` without resolving it (a dead FUSE mount
/// cannot be resolved: stat fails with ENOTCONN).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

pub fn is_mounted(view: &Path) -> bool {
    let wanted = absolute(view);
    let canonical = view.canonicalize().ok();
    mount_points()
        .iter()
        .any(|m| *m == wanted || Some(m) == canonical.as_ref())
}

/// The mount point must exist, be an empty directory, and not be mounted.
pub fn check_mount_point(view: &Path) -> Result<()> {
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

/// Scans, plans and opens the staging area: everything short of mounting.
pub fn prepare(request: &MountRequest) -> Result<PreparedView> {
    let mut laps = Laps::new();
    // Headers are checked as the materialiser reads each block (see
    // crate::input): a bad one stops it, and `status` says why.
    let input = InputArray::scan_with(
        &request.input,
        Some(&request.dataset),
        HeaderChecks::BeforeUse,
    )?;
    // --shape is in the input's user-facing order (see crate::array::axes).
    let output_block = input.axis_order().to_internal(&request.output_block);
    if output_block.len() != input.ndim() {
        return Err(Error::BadArgument(format!(
            "--shape {} has {} dimensions but the input array {} has {}",
            crate::array::geometry::show_shape(&request.output_block),
            request.output_block.len(),
            crate::array::geometry::show_shape(&input.axis_order().to_user(&input.shape)),
            input.ndim()
        )));
    }
    laps.mark("scan");
    let format = request
        .format
        .unwrap_or_else(|| input.format.default_output());
    let problem = Problem::new(
        input.shape.clone(),
        input.block_shape.clone(),
        output_block,
        input.dtype.size as u64,
    )?;
    let output_files = crate::output::filetree::output_file_shape(format, &problem.output());
    let problem = problem.with_files(input.files.clone(), output_files);
    let cgroup_limit = crate::sys::cgroup::memory_limit();
    let (plan, mem) = plan::plan_within(&problem, request.strategy, request.mem, cgroup_limit)?;
    laps.mark("plan");
    if mem != request.mem {
        log::info!(
            "planning within {} bytes, half of the memory cgroup's {} bytes (--mem: {:?})",
            mem.unwrap_or(0),
            cgroup_limit.unwrap_or(0),
            request.mem
        );
    }
    let staging_dir = match &request.staging {
        Some(dir) => dir.clone(),
        None => Staging::default_dir(&input.source, &input.dataset, &problem.output_block, format)?,
    };
    let layout = ViewLayout {
        source: input.source.clone(),
        array: input.shape.clone(),
        dtype: input.dtype,
        input_block: input.block_shape.clone(),
        output_block: problem.output_block.clone(),
        format,
        // The dataset asked for: also what an HDF5 view of a Zarr or MINC2
        // input (whose image has no /data of its own) names its dataset.
        dataset: request.dataset.clone(),
        space: input.space()?,
        axis_order: input.axis_order(),
    };
    // Before the staging area: what the format cannot hold is refused
    // with nothing made.
    let templates = BlockTemplates::for_view(&layout, &plan.output)?;
    laps.mark("templates");
    let manifest = Manifest::new(&input, &problem.output_block, format);
    let (staging, done) = Staging::open(&staging_dir, &manifest, request.rebuild)?;
    laps.mark("staging");
    let core = Arc::new(ViewCore::new(
        layout,
        &plan,
        templates,
        Arc::new(staging),
        &done,
    ));
    laps.mark("view");
    log::debug!(
        "prepared the view of {} input blocks: {laps}",
        input.blocks.len()
    );
    Ok(PreparedView {
        core,
        input,
        plan,
        view: request.view.clone(),
        allow_other: request.allow_other,
        mem,
        on_demand: !request.in_order,
    })
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread and every thread it
/// starts afterwards, so one thread can wait for them with `sigwait`.
fn block_shutdown_signals() -> Result<nix::sys::signal::SigSet> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .map_err(|e| Error::os("pthread_sigmask", "blocking shutdown signals", e.into()))?;
    Ok(set)
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

/// Mounts the view and serves it until it is unmounted or a shutdown
/// signal arrives. `ready` is told once the view is usable (or why not).
pub fn serve(prepared: PreparedView, ready: impl FnOnce(Result<()>)) -> Result<()> {
    let signals = block_shutdown_signals()?;
    let PreparedView {
        core,
        input,
        plan,
        view,
        allow_other,
        mem,
        on_demand,
    } = prepared;
    let options = vec![
        fuser::MountOption::FSName(format!("rechunkfs:{}", input.source.display())),
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
    // Started first, so its first reads overlap the mount: nothing it
    // does needs the view mounted, and if mounting fails, what it
    // completed meanwhile is kept in the staging area like any other.
    let materialiser = Materialiser::start(core.clone(), input, plan, mem, on_demand)?;
    let mounting = Instant::now();
    let mut session = match fuser::Session::new(RechunkFs::new(core.clone()), &view, &config) {
        Ok(session) => session,
        Err(e) => {
            core.shutdown();
            materialiser.stop();
            let error = Error::io(&view, "mounting the view", e);
            let message = error.to_string();
            ready(Err(error));
            return Err(bad_view(&view, message));
        }
    };
    log::debug!("mounted in {:.3} s", mounting.elapsed().as_secs_f64());

    let shutdown_core = core.clone();
    let shutdown_view = view.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(signal) = signals.wait() {
                log::info!("{signal:?}: unmounting {}", shutdown_view.display());
                // Answer parked readers first, so their files can close and
                // the detached mount can go.
                shutdown_core.shutdown();
                if let Err(e) = detach(&shutdown_view) {
                    log::error!("{e}");
                }
            }
        })
        .map_err(|e| Error::os("thread spawn", "starting the signal thread", e))?;

    let _unmounter = session.unmount_callable();
    ready(Ok(()));
    let result = session.run();
    core.shutdown();
    materialiser.stop();
    result.map_err(|e| Error::io(&view, "serving the view", e))
}

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
                    if !is_mounted(view) {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(20));
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

/// Where a background daemon writes its log: beside its staging area.
pub fn log_path(prepared: &PreparedView) -> PathBuf {
    prepared.core.staging().dir().join("daemon.log")
}

/// Where the time of a few steps went, for a debug log line.
struct Laps {
    started: Instant,
    last: Instant,
    steps: Vec<(&'static str, Duration)>,
}

impl Laps {
    fn new() -> Laps {
        let now = Instant::now();
        Laps {
            started: now,
            last: now,
            steps: Vec::new(),
        }
    }

    /// The step that ends now.
    fn mark(&mut self, step: &'static str) {
        let now = Instant::now();
        self.steps.push((step, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Laps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ms", self.started.elapsed().as_secs_f64() * 1e3)?;
        for (i, (step, took)) in self.steps.iter().enumerate() {
            let open = if i == 0 { " (" } else { ", " };
            write!(f, "{open}{step} {:.1}", took.as_secs_f64() * 1e3)?;
        }
        if !self.steps.is_empty() {
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// Forks a daemon that serves the view, and returns its pid once the view
/// is mounted and usable (or the reason it could not be). Must be called
/// before any thread is started: only the calling thread survives a fork.
pub fn serve_in_background(prepared: PreparedView) -> Result<i32> {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

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
            let mut message = String::new();
            fs::File::from(read_end)
                .read_to_string(&mut message)
                .map_err(|e| Error::os("read", "hearing from the daemon", e))?;
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
            let _ = nix::unistd::setsid();
            if let Ok(null) = fs::File::open("/dev/null") {
                let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
            }
            if let Ok(file) = fs::OpenOptions::new().create(true).append(true).open(&log) {
                let _ = nix::unistd::dup2(file.as_raw_fd(), 1);
                let _ = nix::unistd::dup2(file.as_raw_fd(), 2);
            }
            // The copied table ends at the highest open descriptor; grown
            // again here, before the daemon's threads start.
            crate::sys::limits::reserve_descriptor_table();
            let mut pipe = fs::File::from(write_end);
            // The parent reads to end of file: the pipe must close as soon
            // as the outcome is written, so the closure owns it.
            let result = serve(prepared, move |ready| {
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
    }
}

fn prepared_view_path(log: &Path) -> PathBuf {
    log.parent().map(Path::to_path_buf).unwrap_or_default()
}
