//! Faults a view must survive, through real mounts of the `rechunkfs`
//! binary: a staging area other users must not read, nor own, write or
//! plant links in, a staging area inside the view or the input, a daemon
//! stopped with SIGSTOP, a daemon thread that panics, two mounts on one
//! staging area, readers killed or interrupted while parked, an input
//! rewritten with its size and mtime restored, a full staging filesystem,
//! a daemon thread stuck in the kernel, a mount by an ordinary user,
//! kill -9 of the daemon at random points, and 64 readers on a filling
//! view. Needs /dev/fuse; the tmpfs, other-user and `/dev/fuse` tests need
//! root too, as `./scripts/test` runs.
//!
//! Every wait polls against a deadline: no assertion rests on a sleep.
//! `RECHUNKFS_FAULT_ITERATIONS` raises the kill -9 iterations (10).

#[macro_use]
mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rechunkfs::array::geometry::Partition;
use rechunkfs::array::names::grid_name;
use rechunkfs::format::BlockFormat;
use rechunkfs::sys::process::{requester, Requester};

use common::oracle::{grid_blocks, GridBlock};
use common::{dtype, json_u64, make_blocks, stderr, TestRng};

const BIN: &str = env!("CARGO_BIN_EXE_rechunkfs");
/// The user `nobody`, and a user with no files at all.
const NOBODY: u32 = 65534;
const STRANGER: u32 = 12345;

/// Runs `rechunkfs args`, the materialiser paused `step_delay_ms` after
/// each read block, with `env` set.
fn run_with(args: &[&str], step_delay_ms: u64, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .args(common::fault_threads(args))
        .env("RECHUNKFS_STEP_DELAY_MS", step_delay_ms.to_string());
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run rechunkfs")
}

fn run(args: &[&str], step_delay_ms: u64) -> Output {
    run_with(args, step_delay_ms, &[])
}

/// Polls `done` every 10 ms until it holds; fails naming `what` after
/// `limit`. Returns how long it took.
fn within(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// A mounted view, unmounted when dropped whatever the test did.
struct View {
    view: PathBuf,
    staging: PathBuf,
    args: Vec<String>,
}

impl View {
    /// The mount command's arguments for `input` at `view`, staged in
    /// `staging`, in blocks of `shape`, npy.
    fn args(input: &Path, view: &Path, staging: &Path, shape: &str, extra: &[&str]) -> Vec<String> {
        fs::create_dir_all(view).unwrap();
        let mut args: Vec<String> = ["mount", path_str(input), path_str(view), "--shape", shape]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--format", "npy", "--staging", path_str(staging)].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    fn mount(
        input: &Path,
        view: &Path,
        staging: &Path,
        shape: &str,
        delay: u64,
        extra: &[&str],
    ) -> View {
        let args = View::args(input, view, staging, shape, extra);
        let output = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), delay);
        assert!(output.status.success(), "mount failed: {}", stderr(&output));
        View {
            view: view.to_path_buf(),
            staging: staging.to_path_buf(),
            args,
        }
    }

    /// Mounts again with the same arguments.
    fn remount(&self, delay: u64) -> Output {
        run(
            &self.args.iter().map(String::as_str).collect::<Vec<_>>(),
            delay,
        )
    }

    fn status(&self) -> serde_json::Value {
        let output = run(&["status", "--json", path_str(&self.view)], 0);
        assert!(output.status.success(), "status: {}", stderr(&output));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn pid(&self) -> u32 {
        json_u64(&self.status(), "pid") as u32
    }

    fn wait_complete(&self) {
        let output = run(&["status", "--wait", "--json", path_str(&self.view)], 0);
        assert!(
            output.status.success(),
            "status --wait: {}",
            stderr(&output)
        );
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(status["state"], "complete");
    }

    fn umount(&self) -> Output {
        run(&["umount", path_str(&self.view)], 0)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = self.umount();
        }
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = rechunkfs::fuse::session::detach(&self.view);
        }
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs `program args` as user and group `id`, with no other groups.
fn as_user(id: u32, program: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={id}"),
            &format!("--regid={id}"),
            "--clear-groups",
            "--",
            program,
        ])
        .args(args)
        .output()
        .expect("run setpriv")
}

/// Checks the npy file at `path` is the sample array's `block` (`dt`),
/// by the npy reader, against the oracle; returns its bytes.
fn check_block(path: &Path, array: &[u64], block: &GridBlock, dt: &str) -> Vec<u8> {
    common::verified_block_file(path, array, block, dtype(dt), BlockFormat::Npy)
}

/// Checks every block file of the view of `array` in blocks of `block`.
fn check_view(view: &Path, array: &[u64], block: &[u64], dt: &str) {
    for grid_block in grid_blocks(array, block) {
        check_block(
            &view.join(format!("{}.npy", grid_block.stem())),
            array,
            &grid_block,
            dt,
        );
    }
}

/// The staged file of output block `rank` of `array` in blocks of `block`.
fn staged(staging: &Path, array: &[u64], block: &[u64], rank: u64) -> PathBuf {
    let index = Partition::regular(array, block).unravel(rank);
    staging
        .join("blocks")
        .join(format!("{}.npy", grid_name(&index)))
}

fn journal(staging: &Path) -> rechunkfs::view::staging::Journal {
    rechunkfs::view::staging::Journal::read(staging).unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// The small array most tests here view: 24×24 u1 in 12×12 npy blocks
/// (IN under `root`), viewed as [`SMALL_BLOCK`] blocks.
const SMALL_ARRAY: [u64; 2] = [24, 24];
const SMALL_BLOCK: [u64; 2] = [8, 8];

fn small_grid(root: &Path) -> PathBuf {
    make_blocks(
        root,
        "in",
        &SMALL_ARRAY,
        &[12, 12],
        dtype("u1"),
        BlockFormat::Npy,
    )
}

/// A test directory other users may enter (tempdir makes it 0700).
fn open_tempdir() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
    root
}

/// Gives the files of `input` to `nobody`, with modes whose read bits
/// all share only the owner's.
fn give_to_nobody(input: &Path) {
    for (k, entry) in fs::read_dir(input).unwrap().enumerate() {
        let path = entry.unwrap().path();
        std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        let file_mode = [0o640, 0o644, 0o600, 0o664][k % 4];
        fs::set_permissions(&path, fs::Permissions::from_mode(file_mode)).unwrap();
    }
}

/// Mounts `input` at `view` with --allow-other, staged in the default area
/// under `cache` (as `$XDG_CACHE_HOME`).
fn mount_in_default_area(input: &Path, view: &Path, cache: &Path) -> View {
    fs::create_dir(view).unwrap();
    let (input, view_str) = (path_str(input), path_str(view));
    let args = ["mount", input, view_str, "--shape", "8,8", "--allow-other"];
    let output = run_with(&args, 0, &[("XDG_CACHE_HOME", path_str(cache))]);
    assert!(output.status.success(), "mount: {}", stderr(&output));
    let status = run(&["status", "--json", view_str], 0);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    View {
        view: view.to_path_buf(),
        staging: PathBuf::from(status["staging"].as_str().unwrap()),
        args: Vec::new(),
    }
}

/// Every directory of the staging area is 0700 and every file 0600;
/// returns how many files it holds.
fn assert_owner_only(staging: &Path) -> usize {
    let mut files = 0;
    for dir in [staging.to_path_buf(), staging.join("blocks")] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                assert_eq!(mode(&path), 0o600, "{}", path.display());
                files += 1;
            }
        }
    }
    files
}

#[test]
fn the_staging_area_and_the_view_are_as_private_as_the_inputs() {
    require!(Fuse);
    assert!(is_root(), "needs root, to give the inputs to another user");
    let root = open_tempdir();
    let input = small_grid(root.path());
    give_to_nobody(&input);
    let cache = root.path().join("cache");
    let mounted = mount_in_default_area(&input, &root.path().join("view"), &cache);
    mounted.wait_complete();
    let block_file = mounted.view.join("1_2.npy");
    let meta = fs::metadata(&block_file).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o400, "the read bits every input has");
    assert_eq!(
        (meta.uid(), meta.gid()),
        (NOBODY, NOBODY),
        "the inputs' owner"
    );
    assert_eq!(mode(&mounted.view), 0o500, "the view's directory");
    let stranger = as_user(STRANGER, "cat", &[path_str(&block_file)]);
    assert!(
        stderr(&stranger).contains("Permission denied"),
        "another user: {stranger:?}"
    );
    let owner = as_user(NOBODY, "cat", &[path_str(&block_file)]);
    assert!(
        owner.status.success(),
        "the inputs' owner: {}",
        stderr(&owner)
    );
    assert_eq!(owner.stdout, fs::read(&block_file).unwrap());

    assert_eq!(mode(&cache.join("rechunkfs")), 0o700);
    let files = assert_owner_only(&mounted.staging);
    assert_eq!(files, 4 + 9, "manifest, journal, lock, log and 9 blocks");
    let staged = mounted.staging.join("blocks").join("1_2.npy");
    let stranger = as_user(STRANGER, "cat", &[path_str(&staged)]);
    assert!(
        !stranger.status.success(),
        "another user read the staging area"
    );
}

#[test]
fn a_second_mount_on_one_staging_area_is_refused_at_once_naming_the_first() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [32u64, 32, 32];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[16, 16, 16],
        dtype("u1"),
        BlockFormat::Npy,
    );
    let staging = root.path().join("staging");
    let first = View::mount(
        &input,
        &root.path().join("a"),
        &staging,
        "8,8,8",
        200,
        &["--in-order"],
    );
    let pid = first.pid();
    let second = root.path().join("b");
    let started = Instant::now();
    let refused = run(
        &View::args(&input, &second, &staging, "8,8,8", &[])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        0,
    );
    let took = started.elapsed();
    assert!(
        !refused.status.success(),
        "a second daemon on the same staging area"
    );
    let message = stderr(&refused);
    assert!(
        message.contains("in use by") && message.contains(&format!("pid {pid}")),
        "{message}"
    );
    assert!(took < Duration::from_secs(5), "refused only after {took:?}");
    assert!(!rechunkfs::fuse::session::is_mounted(&second));

    // A mount right after an unmount is not refused: the old daemon has
    // let go of the area by the time `umount` returns.
    let umount = first.umount();
    assert!(umount.status.success(), "{}", stderr(&umount));
    assert_eq!(
        requester(pid),
        Requester::Gone,
        "umount returned before its daemon ended"
    );
    let again = first.remount(0);
    assert!(again.status.success(), "quick remount: {}", stderr(&again));
    first.wait_complete();
    check_view(&first.view, &array, &[8, 8, 8], "u1");
    assert_each_block_recorded_once(&staging, 64);
}

/// Starts `program args` with its output kept.
fn spawn(program: &str, args: &[&str]) -> Child {
    common::interruptible(&mut Command::new(program))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a reader")
}

/// Parks a Python reader on `block` of `view`, sends it SIGINT, and
/// checks it raises KeyboardInterrupt (its read returned EINTR) and its
/// read is no longer counted; returns how long it took to end.
fn interrupt_a_python_reader(view: &View, block: &Path) -> Duration {
    let waiting = || json_u64(&view.status(), "waiting_reads");
    // Data only: a read that had copied the header page already would
    // return those bytes instead of EINTR.
    let script = "import sys; f = open(sys.argv[1], 'rb'); f.seek(4096); f.read()";
    let mut python = spawn(&common::python(), &["-c", script, path_str(block)]);
    within(Duration::from_secs(20), "the Python reader parked", || {
        waiting() == 1
    });
    let pid = nix::unistd::Pid::from_raw(python.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let took = within(
        Duration::from_secs(10),
        "the interrupted reader ended",
        || python.try_wait().unwrap().is_some(),
    );
    let output = python.wait_with_output().unwrap();
    assert!(
        stderr(&output).contains("KeyboardInterrupt"),
        "{}",
        stderr(&output)
    );
    within(Duration::from_secs(10), "its read forgotten", || {
        waiting() == 0
    });
    took
}

#[test]
fn killed_and_interrupted_readers_are_answered_and_no_longer_counted() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &[40, 40, 40],
        &[10, 10, 10],
        dtype("u1"),
        BlockFormat::Npy,
    );
    let (dir, staging) = (root.path().join("view"), root.path().join("staging"));
    let view = View::mount(&input, &dir, &staging, "8,8,8", 60_000, &["--in-order"]);
    let waiting = || json_u64(&view.status(), "waiting_reads");
    let mut readers: Vec<Child> = (0..3)
        .map(|k| spawn("cat", &[path_str(&dir.join(format!("4_4_{k}.npy")))]))
        .collect();
    within(Duration::from_secs(20), "three readers parked", || {
        waiting() == 3
    });
    for reader in &mut readers {
        reader.kill().unwrap();
        reader.wait().unwrap();
    }
    let took = within(
        Duration::from_secs(10),
        "killed readers' reads forgotten",
        || waiting() == 0,
    );
    eprintln!("3 killed readers: status showed waiting 0 after {took:?}");
    let took = interrupt_a_python_reader(&view, &dir.join("4_3_4.npy"));
    eprintln!("an interrupted Python reader ended {took:?} after SIGINT");
    assert_eq!(view.status()["state"], "materialising", "the view goes on");
}

#[test]
fn an_input_rewritten_with_its_size_and_mtime_restored_is_refused() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &[10, 10],
        &[5, 5],
        dtype("u1"),
        BlockFormat::Npy,
    );
    let staging = root.path().join("staging");
    let view = View::mount(&input, &root.path().join("view"), &staging, "4,4", 0, &[]);
    view.wait_complete();
    let umount = view.umount();
    assert!(umount.status.success(), "{}", stderr(&umount));
    let file = input.join("0_0.npy");
    let reference = root.path().join("reference");
    let copied = Command::new("cp")
        .args(["-p", path_str(&file), path_str(&reference)])
        .status();
    assert!(copied.unwrap().success());
    // Other data in place (so the same size and inode), then the mtime
    // set back as it was: only the ctime tells.
    std::thread::sleep(Duration::from_millis(20));
    let mut bytes = fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&file, &bytes).unwrap();
    let touched = Command::new("touch")
        .args(["-r", path_str(&reference), path_str(&file)])
        .status();
    assert!(touched.unwrap().success());
    let (before, after) = (
        fs::metadata(&reference).unwrap(),
        fs::metadata(&file).unwrap(),
    );
    assert_eq!(
        (after.len(), after.modified().unwrap()),
        (before.len(), before.modified().unwrap())
    );
    let refused = view.remount(0);
    assert!(
        !refused.status.success(),
        "a rewritten input went unnoticed"
    );
    let message = stderr(&refused);
    assert!(
        message.contains("input file 0_0.npy was modified") && message.contains("--rebuild"),
        "{message}"
    );
}

/// A tmpfs of `size` made for a test at `at`, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(at: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(at).unwrap();
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
                path_str(at),
            ])
            .status()
            .expect("mount -t tmpfs");
        assert!(mounted.success(), "mount -t tmpfs failed");
        Tmpfs(at.to_path_buf())
    }

    /// Writes a file at `path` until the filesystem is full; its size.
    fn fill(&self, path: &Path) -> u64 {
        let mut file = fs::File::create(path).unwrap();
        let chunk = vec![0xa5u8; 4096];
        let mut written = 0;
        while file.write_all(&chunk).is_ok() {
            written += chunk.len() as u64;
        }
        written
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

const FULL_ARRAY: [u64; 3] = [64, 64, 64];
const FULL_BLOCK: [u64; 3] = [16, 16, 16];

/// An input of [`FULL_ARRAY`], and a tmpfs of 1 MiB for the staging area
/// of its view in blocks of [`FULL_BLOCK`]: 64 staged files of 8 KiB (a
/// header page and a data page), 512 KiB.
fn small_filesystem(root: &Path) -> (PathBuf, Tmpfs) {
    assert!(is_root(), "needs root, to make a small tmpfs");
    let input = make_blocks(
        root,
        "in",
        &FULL_ARRAY,
        &[32, 32, 32],
        dtype("u1"),
        BlockFormat::Npy,
    );
    (input, Tmpfs::new(&root.join("fs"), "1m"))
}

/// The view and every block its journal records are the oracle's.
fn check_view_and_journal(view: &View) {
    check_view(&view.view, &FULL_ARRAY, &FULL_BLOCK, "u1");
    let blocks = grid_blocks(&FULL_ARRAY, &FULL_BLOCK);
    for &rank in &journal(&view.staging).done {
        let path = staged(&view.staging, &FULL_ARRAY, &FULL_BLOCK, rank);
        check_block(&path, &FULL_ARRAY, &blocks[rank as usize], "u1");
    }
}

#[test]
fn a_remount_on_a_full_filesystem_reclaims_the_partial_blocks_of_earlier_runs() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let (input, tmpfs) = small_filesystem(root.path());
    let (dir, staging) = (root.path().join("view"), tmpfs.0.join("staging"));
    // A run stopped early leaves blocks undone; then the space is taken
    // by a partial file of a block the plan reaches last, as a run stopped
    // by a full disk leaves one. The remount reclaims it and completes.
    let view = View::mount(&input, &dir, &staging, "16,16,16", 60_000, &["--in-order"]);
    let umount = view.umount();
    assert!(umount.status.success(), "{}", stderr(&umount));
    assert!(!journal(&staging).done.contains(&63));
    let partial = tmpfs.fill(&staged(&staging, &FULL_ARRAY, &FULL_BLOCK, 63));
    assert!(partial > 256 << 10, "the partial holds {partial} bytes");
    let again = view.remount(0);
    assert!(
        again.status.success(),
        "remount on a full filesystem: {}",
        stderr(&again)
    );
    view.wait_complete();
    check_view_and_journal(&view);
}

#[test]
fn a_full_staging_filesystem_is_waited_out_then_the_view_completes_exact() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let (input, tmpfs) = small_filesystem(root.path());
    let (dir, staging) = (root.path().join("view"), tmpfs.0.join("staging"));
    let view = View::mount(&input, &dir, &staging, "16,16,16", 100, &["--in-order"]);
    let filler = tmpfs.0.join("filler");
    tmpfs.fill(&filler);
    within(
        Duration::from_secs(20),
        "status says the view waits for space",
        || view.status()["waiting_for_space"] == path_str(&tmpfs.0),
    );
    let text = run(&["status", path_str(&dir)], 0);
    let text = String::from_utf8_lossy(&text.stdout);
    let expected = format!("waiting for space on {}", tmpfs.0.display());
    assert!(text.contains(&expected), "{text}");
    assert_eq!(view.status()["state"], "materialising");
    fs::remove_file(&filler).unwrap();
    view.wait_complete();
    assert!(view.status()["waiting_for_space"].is_null());
    check_view_and_journal(&view);
}

/// A copy of the input directory `from` at `to`.
fn copy_input(from: &Path, to: &Path) -> PathBuf {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
    to.to_path_buf()
}

/// A way to stop a view whose daemon has pid `u32`.
type StopView = fn(&View, u32);

/// Whether process `pid`'s thread named `name` waits in the kernel for a
/// filesystem (a FUSE request, or a page being read).
fn stuck_in_the_kernel(pid: u32, name: &str) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        let read = |file: &str| fs::read_to_string(task.path().join(file)).unwrap_or_default();
        let wchan = read("wchan");
        read("comm").trim() == name
            && ["fuse", "request", "folio", "page"]
                .iter()
                .any(|w| wchan.contains(w))
    })
}

/// A view of `source` whose pending blocks stay pending: reads of them
/// wait there, in the kernel, as on a hung network filesystem. (A FIFO
/// would not do: inputs are opened without blocking and refused unless
/// regular.) Returns it and a block file of it whose data reads hang.
fn hung_view(root: &Path, source: &Path) -> (View, PathBuf) {
    let (dir, staging) = (root.join("slow"), root.join("slow-staging"));
    let slow = View::mount(source, &dir, &staging, "16,16,16", 60_000, &["--in-order"]);
    let hung = slow.view.join("3_1_0.npy");
    // Its header page, read now, is then in the page cache: the scan of
    // an input linking to it reads it from there, not through a request
    // stuck behind the pending data.
    let mut header = vec![0u8; 4096];
    let mut file = fs::File::open(&hung).unwrap();
    file.read_exact(&mut header).unwrap();
    (slow, hung)
}

/// Mounts a copy of `source` whose block 3_1_0 is a link to `hung`, and
/// waits until its materialiser is stuck reading it.
fn mount_with_a_stuck_thread(root: &Path, source: &Path, hung: &Path, k: usize) -> View {
    let input = copy_input(source, &root.join(format!("in{k}")));
    fs::remove_file(input.join("3_1_0.npy")).unwrap();
    std::os::unix::fs::symlink(hung, input.join("3_1_0.npy")).unwrap();
    let (dir, staging) = (
        root.join(format!("view{k}")),
        root.join(format!("staging{k}")),
    );
    let view = View::mount(&input, &dir, &staging, "8,8,8", 0, &["--in-order"]);
    let pid = view.pid();
    within(
        Duration::from_secs(20),
        "the materialiser stuck in a read",
        || stuck_in_the_kernel(pid, "materialiser"),
    );
    view
}

#[test]
fn the_daemon_exits_promptly_even_with_a_thread_stuck_in_the_kernel() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let source = make_blocks(
        root.path(),
        "source",
        &[64, 32, 32],
        &[16, 16, 16],
        dtype("u1"),
        BlockFormat::Npy,
    );
    let (slow, hung) = hung_view(root.path(), &source);
    let ways: [(&str, StopView); 3] = [
        ("rechunkfs umount", |view, _| {
            let umount = view.umount();
            assert!(umount.status.success(), "{}", stderr(&umount));
        }),
        ("SIGTERM", |_, pid| {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        }),
        ("umount(2)", |view, _| {
            rechunkfs::fuse::session::detach(&view.view).unwrap()
        }),
    ];
    for (k, (way, stop)) in ways.iter().enumerate() {
        let view = mount_with_a_stuck_thread(root.path(), &source, &hung, k);
        let pid = view.pid();
        let started = Instant::now();
        stop(&view, pid);
        within(Duration::from_secs(5), way, || {
            requester(pid) == Requester::Gone
        });
        let took = started.elapsed();
        eprintln!("{way}: the daemon with a stuck thread ended after {took:?}");
        assert!(took < Duration::from_secs(4), "{way}: ended after {took:?}");
        within(Duration::from_secs(5), "the view unmounted", || {
            !rechunkfs::fuse::session::is_mounted(&view.view)
        });
    }
    within(
        Duration::from_secs(10),
        "the stuck reads ended with their daemons",
        || json_u64(&slow.status(), "waiting_reads") == 0,
    );
}

/// `/dev/fuse` readable and writable by all (as distributions ship it)
/// while the test runs; its mode restored after.
struct OpenFuseDevice(u32);

impl OpenFuseDevice {
    fn new() -> OpenFuseDevice {
        let before = mode(Path::new("/dev/fuse"));
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
        OpenFuseDevice(before)
    }
}

impl Drop for OpenFuseDevice {
    fn drop(&mut self) {
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0));
    }
}

/// The lines of `text` that warn or report an error, or a passthrough
/// refused: what a mount by an ordinary user must not say.
fn noise(text: &str) -> Vec<String> {
    let words = ["WARN", "ERROR", "error", "passthrough refused"];
    text.lines()
        .filter(|line| words.iter().any(|w| line.contains(w)))
        .map(String::from)
        .collect()
}

/// Runs `rechunkfs args` as `nobody` and checks it succeeded, saying
/// nothing of warnings or errors.
fn rechunkfs_as_nobody(args: &[&str]) -> Output {
    let output = as_user(NOBODY, BIN, args);
    assert!(
        output.status.success(),
        "{args:?} as nobody: {}",
        stderr(&output)
    );
    assert_eq!(noise(&stderr(&output)), Vec::<String>::new(), "{args:?}");
    output
}

#[test]
fn an_ordinary_user_mounts_through_fusermount3_and_passthrough_stays_quiet() {
    require!(Fuse);
    assert!(
        is_root(),
        "needs root, to act as another user and open /dev/fuse to all"
    );
    let _device = OpenFuseDevice::new();
    let root = open_tempdir();
    let (array, block) = ([30u64, 20, 20], [10u64, 10, 10]);
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[15, 10, 20],
        dtype("<u2"),
        BlockFormat::Npy,
    );
    let [view, staging, copy] = ["view", "staging", "copy"].map(|name| root.path().join(name));
    for dir in [&view, &staging, &copy] {
        fs::create_dir(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let mount = View::args(&input, &view, &staging, "10,10,10", &[]);
    rechunkfs_as_nobody(&mount.iter().map(String::as_str).collect::<Vec<_>>());
    let _mounted = View {
        view: view.clone(),
        staging: staging.clone(),
        args: Vec::new(),
    };
    let waited = rechunkfs_as_nobody(&["status", "--wait", "--json", path_str(&view)]);
    let status: serde_json::Value = serde_json::from_slice(&waited.stdout).unwrap();
    // Only its user may enter a view mounted without --allow-other: the
    // view is read as nobody, into a copy checked here.
    let from = format!("{}/.", view.display());
    let copied = as_user(NOBODY, "cp", &["-r", &from, path_str(&copy)]);
    assert!(copied.status.success(), "cp as nobody: {}", stderr(&copied));
    check_view(&copy, &array, &block, "<u2");
    rechunkfs_as_nobody(&["umount", path_str(&view)]);
    assert!(!rechunkfs::fuse::session::is_mounted(&view));
    assert_eq!(requester(json_u64(&status, "pid") as u32), Requester::Gone);
    let log = fs::read_to_string(staging.join("daemon.log")).unwrap();
    assert_eq!(noise(&log), Vec::<String>::new(), "the daemon's log");
    assert!(
        log.contains("passthrough for completed blocks: not used"),
        "{log}"
    );
}

const KILL_ARRAY: [u64; 3] = [40, 36, 32];
const KILL_BLOCK: [u64; 3] = [8, 9, 8];

/// Mounts with `args`, kills the daemon with SIGKILL after `delay`, and
/// clears the dead mount. Returns whether it was still materialising.
fn mount_and_kill_after(args: &[&str], view: &Path, delay: Duration) -> bool {
    // Batches of 50 ms: records are written often, so kills land between
    // a batch's data and its records too.
    let mounted = run_with(args, 25, &[("RECHUNKFS_SYNC_BATCH_MS", "50")]);
    assert!(mounted.status.success(), "mount: {}", stderr(&mounted));
    let status = run(&["status", "--json", path_str(view)], 0);
    let pid = json_u64(&serde_json::from_slice(&status.stdout).unwrap(), "pid") as u32;
    std::thread::sleep(delay);
    let status = run(&["status", "--json", path_str(view)], 0);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let signal = nix::sys::signal::Signal::SIGKILL;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
    within(Duration::from_secs(5), "the killed daemon gone", || {
        requester(pid) == Requester::Gone
    });
    let umount = run(&["umount", path_str(view)], 0);
    assert!(
        umount.status.success(),
        "umount of a dead view: {}",
        stderr(&umount)
    );
    status["state"] == "materialising"
}

/// Every block the journal in `staging` records done has its bytes: the
/// oracle's. Returns how many it records.
fn check_journaled_blocks(staging: &Path) -> usize {
    let blocks = grid_blocks(&KILL_ARRAY, &KILL_BLOCK);
    let done = journal(staging).done;
    for &rank in &done {
        let path = staged(staging, &KILL_ARRAY, &KILL_BLOCK, rank);
        check_block(&path, &KILL_ARRAY, &blocks[rank as usize], ">u2");
    }
    done.len()
}

/// The journal in `staging` records each of `total` blocks exactly once.
fn assert_each_block_recorded_once(staging: &Path, total: u64) {
    let mut done = journal(staging).done;
    let recorded = done.len();
    done.sort_unstable();
    done.dedup();
    assert_eq!(done.len() as u64, total, "every block recorded");
    assert_eq!(recorded, done.len(), "no block recorded twice");
}

#[test]
fn kill_9_at_random_points_then_resume_is_byte_exact() {
    require!(Fuse);
    let iterations: u64 = std::env::var("RECHUNKFS_FAULT_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10);
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &KILL_ARRAY,
        &[10, 12, 16],
        dtype(">u2"),
        BlockFormat::Npy,
    );
    let (dir, staging) = (root.path().join("view"), root.path().join("staging"));
    let args = View::args(&input, &dir, &staging, "8,9,8", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut rng = TestRng(2026);
    let (mut checked, mut mid_run) = (0, 0);
    for _ in 0..iterations {
        let delay = Duration::from_millis(rng.below(400));
        mid_run += u64::from(mount_and_kill_after(&args, &dir, delay));
        // No block recorded done without its bytes.
        checked += check_journaled_blocks(&staging);
    }
    let view = View::mount(&input, &dir, &staging, "8,9,8", 0, &[]);
    view.wait_complete();
    check_view(&view.view, &KILL_ARRAY, &KILL_BLOCK, ">u2");
    let total = Partition::regular(&KILL_ARRAY, &KILL_BLOCK).count();
    assert_each_block_recorded_once(&staging, total);
    eprintln!(
        "kill -9: {iterations} kills ({mid_run} mid-run), {checked} recorded blocks checked \
         after them, then all {total} blocks byte-exact"
    );
}

/// The bytes the npy view file of `block` must hold: its header as the
/// view serves it (read at once even while pending, checked by the npy
/// reader), then the oracle's data.
fn expected_npy_file(path: &Path, array: &[u64], block: &GridBlock, dt: &str) -> Vec<u8> {
    let mut file = fs::File::open(path).unwrap();
    let mut head = vec![0u8; 10];
    file.read_exact(&mut head).unwrap();
    let mut header = vec![0u8; 10 + u16::from_le_bytes([head[8], head[9]]) as usize];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut header).unwrap();
    let parsed =
        common::readers::npy_header(&header).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        (parsed.shape.as_slice(), parsed.descr.as_str()),
        (block.shape.as_slice(), dt)
    );
    header.extend(common::oracle::sample_bytes(
        array,
        &block.origin,
        &block.shape,
        dtype(dt).size,
    ));
    header
}

#[test]
fn sixty_four_readers_on_a_filling_view_read_exact_bytes() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [48u64, 40, 36];
    let block = [16u64, 10, 9];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[12, 20, 9],
        dtype("<i4"),
        BlockFormat::Npy,
    );
    let view = View::mount(
        &input,
        &root.path().join("view"),
        &root.path().join("staging"),
        "16,10,9",
        5,
        &[],
    );
    let blocks = Arc::new(grid_blocks(&array, &block));
    let (done_tx, done_rx) = mpsc::channel();
    const READERS: u64 = 64;
    const READS: u64 = 25;
    for reader in 0..READERS {
        let (dir, blocks, done_tx) = (view.view.clone(), blocks.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let mut rng = TestRng(reader * 7919);
            for _ in 0..READS {
                let grid_block = &blocks[rng.below(blocks.len() as u64) as usize];
                let path = dir.join(format!("{}.npy", grid_block.stem()));
                let expected = expected_npy_file(&path, &array, grid_block, "<i4");
                let offset = match rng.below(3) {
                    0 => 4096 - rng.below(100),
                    1 => expected.len() as u64 - rng.below(200),
                    _ => rng.below(expected.len() as u64 + 50),
                };
                let len = rng.below(12_000) + 1;
                let mut file = fs::File::open(&path).unwrap();
                file.seek(SeekFrom::Start(offset)).unwrap();
                let mut got = Vec::new();
                file.take(len).read_to_end(&mut got).unwrap();
                let start = (offset as usize).min(expected.len());
                let end = (offset + len).min(expected.len() as u64) as usize;
                assert!(
                    got == expected[start..end],
                    "{} at {offset}+{len}",
                    path.display()
                );
            }
            done_tx.send(()).unwrap();
        });
    }
    drop(done_tx);
    for _ in 0..READERS {
        done_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a reader hung or read wrong bytes");
    }
    view.wait_complete();
    eprintln!("64 readers × {READS} reads on a filling view: all byte-exact");
}

/// Runs `rechunkfs args` as a child, which must end within `limit`; if it
/// does not, the stopped `daemon` is continued (so the child can end) and
/// the test fails naming `what` as stuck.
fn run_within(args: &[&str], limit: Duration, daemon: u32, what: &str) -> Output {
    run_within_as(None, args, limit, daemon, what)
}

/// [`run_within`] as user `user` (and group of that id), if given.
fn run_within_as(
    user: Option<u32>,
    args: &[&str],
    limit: Duration,
    daemon: u32,
    what: &str,
) -> Output {
    let mut command = match user {
        Some(id) => {
            let mut command = Command::new("setpriv");
            command.args([
                &format!("--reuid={id}"),
                &format!("--regid={id}"),
                "--clear-groups",
                "--",
                BIN,
            ]);
            command
        }
        None => Command::new(BIN),
    };
    let mut child = command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rechunkfs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(daemon as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}, stuck");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Whether process `pid` is stopped, as /proc says.
fn is_stopped(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
    })
}

/// Continues a stopped process when dropped, whatever the test did.
struct ContinueOnDrop(u32);

impl Drop for ContinueOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0 as i32),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

#[test]
fn a_stopped_daemon_is_named_by_status_and_umount_at_once() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let (array, block) = (SMALL_ARRAY, SMALL_BLOCK);
    let input = small_grid(root.path());
    let [view, staging] = ["view", "staging"].map(|name| root.path().join(name));
    // Slow enough to be materialising when stopped.
    let mounted = View::mount(&input, &view, &staging, "8,8", 3000, &[]);
    let pid = mounted.pid();
    let view_str = path_str(&view);
    // A wait begun before the stop must end too.
    let waiter = Command::new(BIN)
        .args(["status", "--wait", view_str])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _continue = ContinueOnDrop(pid);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    within(Duration::from_secs(5), "the daemon stops", || {
        is_stopped(pid)
    });
    let said = format!("daemon (pid {pid}) is stopped");
    for args in [
        vec!["status", view_str],
        vec!["status", "--wait", "--json", view_str],
    ] {
        let output = run_within(&args, Duration::from_secs(5), pid, &args.join(" "));
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(
            stderr(&output).contains(&said),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let start = Instant::now();
    let mut waiter = waiter;
    while waiter.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(5) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
            let _ = waiter.kill();
            panic!("status --wait begun before the stop: stuck on the stopped daemon");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let waited = waiter.wait_with_output().unwrap();
    assert!(!waited.status.success());
    assert!(stderr(&waited).contains(&said), "{}", stderr(&waited));
    // A mount on it is refused without entering it.
    let args = View::args(&input, &view, &root.path().join("other"), "8,8", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let again = run_within(
        &args,
        Duration::from_secs(5),
        pid,
        "mount on the stopped view",
    );
    assert!(!again.status.success());
    assert!(stderr(&again).contains(&said), "{}", stderr(&again));

    let unmounted = run_within(
        &["umount", view_str],
        Duration::from_secs(5),
        pid,
        "umount of a stopped daemon's view",
    );
    assert!(unmounted.status.success(), "umount: {}", stderr(&unmounted));
    assert!(
        stderr(&unmounted).contains(&format!("without its daemon (pid {pid}), which is stopped")),
        "{}",
        stderr(&unmounted)
    );
    assert!(!rechunkfs::fuse::session::is_mounted(&view));
    assert!(is_stopped(pid), "umount waited for the daemon");
    // Continued, it ends (it was asked to), freeing the staging area.
    drop(_continue);
    within(Duration::from_secs(10), "the continued daemon ends", || {
        requester(pid) == Requester::Gone
    });
    let remounted = View::mount(&input, &view, &staging, "8,8", 0, &[]);
    remounted.wait_complete();
    check_view(&view, &array, &block, "u1");
}

/// Mounts `input` on `view` staged in `staging`, which must be refused
/// before anything is mounted; the refusal's output.
fn refused_mount(input: &Path, view: &Path, staging: &Path) -> Output {
    let args = View::args(input, view, staging, "8,8", &[]);
    let output = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), 0);
    let mounted = rechunkfs::fuse::session::is_mounted(view);
    if mounted {
        let _ = rechunkfs::fuse::session::detach(view);
    }
    assert!(
        !output.status.success() && !mounted,
        "{} staged in {}: mounted",
        view.display(),
        staging.display()
    );
    output
}

#[test]
fn staging_inside_the_view_or_the_input_and_a_view_inside_staging_are_refused() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let input = small_grid(root.path());
    let listing = |dir: &Path| {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let input_files = listing(&input);
    let view = root.path().join("view");
    let outer = root.path().join("outer");
    fs::create_dir_all(outer.join("view")).unwrap();
    // A link to the view: the same directory by another name.
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&view, &link).unwrap();
    for (view, staging, said) in [
        (view.clone(), view.join("st"), "is inside the view"),
        (view.clone(), link.join("st"), "is inside the view"),
        (view.clone(), input.clone(), "is the input"),
        (view.clone(), input.join("st"), "is the input"),
        (
            outer.join("view"),
            outer.clone(),
            "is inside the staging area",
        ),
    ] {
        let output = refused_mount(&input, &view, &staging);
        assert!(stderr(&output).contains(said), "{}", stderr(&output));
        assert_eq!(listing(&input), input_files, "the input was added to");
        assert_eq!(listing(&view), Vec::<std::ffi::OsString>::new());
    }
}

/// A file of root's that another user would like root to overwrite.
fn victim(root: &Path) -> PathBuf {
    let victim = root.join("victim");
    fs::write(&victim, b"precious\n").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).unwrap();
    victim
}

fn assert_untouched(victim: &Path) {
    assert_eq!(
        fs::read(victim).unwrap(),
        b"precious\n",
        "written through a link"
    );
    assert_eq!(mode(victim), 0o644, "chmod'ed through a link");
}

#[test]
fn a_staging_area_another_user_owns_or_may_write_is_refused_naming_it() {
    require!(Fuse);
    assert!(is_root(), "needs root, to make directories of another user");
    let root = open_tempdir();
    let (array, block) = (SMALL_ARRAY, SMALL_BLOCK);
    let input = small_grid(root.path());
    let view = root.path().join("view");
    let victim = victim(root.path());
    let chown = |path: &Path| std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    // Another user's area, holding blocks of theirs and a lock that links
    // to a file of root's.
    let theirs = root.path().join("theirs");
    fs::create_dir_all(theirs.join("blocks")).unwrap();
    let forged = theirs.join("blocks").join("0_0.npy");
    fs::write(&forged, b"forged").unwrap();
    std::os::unix::fs::symlink(&victim, theirs.join("lock")).unwrap();
    std::os::unix::fs::symlink(&victim, theirs.join("manifest.partial")).unwrap();
    for path in [&theirs, &theirs.join("blocks"), &forged] {
        chown(path);
    }
    // An area of root's whose blocks directory is another user's.
    let mixed = root.path().join("mixed");
    fs::create_dir_all(mixed.join("blocks")).unwrap();
    chown(&mixed.join("blocks"));
    // An area in a directory every user may write to.
    let shared = root.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    for (staging, culprit, said) in [
        (
            theirs.clone(),
            theirs.clone(),
            "is owned by user nobody (uid 65534), not by you",
        ),
        (
            mixed.clone(),
            mixed.join("blocks"),
            "is owned by user nobody (uid 65534), not by you",
        ),
        (
            shared.join("st"),
            shared.clone(),
            "may be written by other users (mode 0777, not sticky)",
        ),
    ] {
        let output = refused_mount(&input, &view, &staging);
        let said = format!("{}: {said}", culprit.display());
        assert!(stderr(&output).contains(&said), "{}", stderr(&output));
        assert_untouched(&victim);
    }
    assert_eq!(fs::read(&forged).unwrap(), b"forged");
    assert!(
        !shared.join("st").exists(),
        "made in a directory others may write"
    );
    // Sticky, as /tmp is: others can neither remove nor rename what root
    // makes there.
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let mounted = View::mount(&input, &view, &shared.join("st"), "8,8", 0, &[]);
    mounted.wait_complete();
    check_view(&view, &array, &block, "u1");
}

#[test]
fn a_link_in_the_staging_area_is_never_written_through() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let (array, block) = (SMALL_ARRAY, SMALL_BLOCK);
    let input = small_grid(root.path());
    let view = root.path().join("view");
    let victim = victim(root.path());
    // A journal without a manifest belongs to nothing: that link is
    // removed, not followed.
    for name in ["lock", "manifest.partial", "manifest.json"] {
        let staging = root.path().join(format!("staging-{name}"));
        fs::create_dir_all(staging.join("blocks")).unwrap();
        std::os::unix::fs::symlink(&victim, staging.join(name)).unwrap();
        let args = View::args(&input, &view, &staging, "8,8", &[]);
        let output = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), 0);
        let mounted = rechunkfs::fuse::session::is_mounted(&view);
        if mounted {
            let _ = rechunkfs::fuse::session::detach(&view);
        }
        assert!(!output.status.success() && !mounted, "{name}: mounted");
        assert!(
            stderr(&output).contains("symlink"),
            "{name}: {}",
            stderr(&output)
        );
        assert_untouched(&victim);
    }
    // The daemon's log (the view works, logging nowhere), and a journal
    // without a manifest (removed).
    for name in ["daemon.log", "done.journal"] {
        let staging = root.path().join(format!("staging-{name}"));
        fs::create_dir_all(&staging).unwrap();
        std::os::unix::fs::symlink(&victim, staging.join(name)).unwrap();
        let mounted = View::mount(&input, &view, &staging, "8,8", 0, &[]);
        mounted.wait_complete();
        check_view(&view, &array, &block, "u1");
        drop(mounted);
        assert_untouched(&victim);
    }
}

/// A Zarr v3 array of `array` in shards of 8×8 holding chunks of 4×4,
/// whose shard index has no checksum (the spec allows that) and, in its
/// last shard, an entry whose offset plus length wraps past 2^64.
fn shards_with_a_wrapping_index(root: &Path, array: &[u64]) -> PathBuf {
    let input = make_blocks(root, "in", array, &[8, 8], dtype("u1"), BlockFormat::Npy);
    let zarr = root.join("z");
    let output = run(
        &[
            "rechunk",
            path_str(&input),
            path_str(&zarr),
            "--shape",
            "4,4",
            "--shard",
            "8,8",
            "--format",
            "zarr3",
            "-q",
        ],
        0,
    );
    assert!(output.status.success(), "rechunk: {}", stderr(&output));
    let meta_path = zarr.join("zarr.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    let index = &mut meta["codecs"][0]["configuration"]["index_codecs"];
    index
        .as_array_mut()
        .unwrap()
        .retain(|codec| codec["name"] != "crc32c");
    fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let grid = [array[0] / 8, array[1] / 8];
    for i in 0..grid[0] {
        for j in 0..grid[1] {
            let shard = zarr.join(format!("c/{i}/{j}"));
            let mut bytes = fs::read(&shard).unwrap();
            bytes.truncate(bytes.len() - 4);
            if (i, j) == (grid[0] - 1, grid[1] - 1) {
                let entry = bytes.len() - 64;
                bytes[entry..entry + 8].copy_from_slice(&(u64::MAX - 7).to_le_bytes());
            }
            fs::write(&shard, bytes).unwrap();
        }
    }
    zarr
}

#[test]
fn a_daemon_thread_that_panics_fails_the_view_and_its_readers_get_eio() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let input = shards_with_a_wrapping_index(root.path(), &[16, 16]);
    let [view, staging] = ["view", "staging"].map(|name| root.path().join(name));
    let mounted = View::mount(&input, &view, &staging, "4,4", 0, &[]);
    let pid = mounted.pid();
    // zarrs panics on such an index today; once the index is checked
    // first, the view fails the same way with a plain error. Either way
    // it must fail, not stay materialising.
    let waited = run_within(
        &["status", "--wait", "--json", path_str(&view)],
        Duration::from_secs(20),
        pid,
        "status --wait on a view whose materialiser panicked",
    );
    assert!(!waited.status.success(), "the view completed");
    let status: serde_json::Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(!error.is_empty(), "{status}");
    let (tx, rx) = mpsc::channel();
    let block = view.join("3_3.npy");
    std::thread::spawn(move || {
        let _ = tx.send(fs::read(block));
    });
    let read = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a read of a block of the failed view: still unanswered after 20 s");
    assert_eq!(
        read.unwrap_err().raw_os_error(),
        Some(libc::EIO),
        "a pending block"
    );
}

#[test]
fn an_ordinary_user_unmounts_the_view_of_a_stopped_daemon_at_once() {
    require!(Fuse);
    assert!(
        is_root(),
        "needs root, to act as another user and open /dev/fuse to all"
    );
    let _device = OpenFuseDevice::new();
    let root = open_tempdir();
    let input = small_grid(root.path());
    let [view, staging] = ["view", "staging"].map(|name| root.path().join(name));
    for dir in [&view, &staging] {
        fs::create_dir(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let args = View::args(&input, &view, &staging, "8,8", &[]);
    let mut mount = Command::new("setpriv");
    mount
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "--",
            BIN,
        ])
        .args(&args)
        .env("RECHUNKFS_STEP_DELAY_MS", "3000");
    let output = mount.output().unwrap();
    assert!(
        output.status.success(),
        "mount as nobody: {}",
        stderr(&output)
    );
    let _mounted = View {
        view: view.clone(),
        staging: staging.clone(),
        args: Vec::new(),
    };
    let status = as_user(NOBODY, BIN, &["status", "--json", path_str(&view)]);
    let pid = json_u64(&serde_json::from_slice(&status.stdout).unwrap(), "pid") as u32;
    let _continue = ContinueOnDrop(pid);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    within(Duration::from_secs(5), "the daemon stops", || {
        is_stopped(pid)
    });
    let limit = Duration::from_secs(5);
    let status = run_within_as(
        Some(NOBODY),
        &["status", path_str(&view)],
        limit,
        pid,
        "status as nobody",
    );
    assert!(!status.status.success());
    let said = format!("daemon (pid {pid}) is stopped");
    assert!(stderr(&status).contains(&said), "{}", stderr(&status));
    let unmounted = run_within_as(
        Some(NOBODY),
        &["umount", path_str(&view)],
        limit,
        pid,
        "umount as nobody",
    );
    assert!(unmounted.status.success(), "{}", stderr(&unmounted));
    assert!(
        stderr(&unmounted).contains(&format!("without its daemon (pid {pid}), which is stopped")),
        "{}",
        stderr(&unmounted)
    );
    assert!(!rechunkfs::fuse::session::is_mounted(&view));
    drop(_continue);
    within(Duration::from_secs(10), "the continued daemon ends", || {
        requester(pid) == Requester::Gone
    });
}

/// How long each read block of the plan is held in the tests of blocks
/// on demand: far beyond their own deadlines.
const HELD_STEP_MS: u64 = 60_000;
/// What those tests allow a far block: a read that waited for the held
/// step would take [`HELD_STEP_MS`].
const FAR_BLOCK_DEADLINE: Duration = Duration::from_secs(20);

/// The sample array, 64×60×48 u2, written by zarr-python as Zarr v2 in
/// uncompressed 16×20×16 chunks, viewed in npy blocks of
/// [`HELD_VIEW_BLOCK`] (two chunks each), its plan held after its first
/// read block for [`HELD_STEP_MS`]. Returns the view once the plan is in
/// that hold: its first read block's reads are counted (the view counts
/// them as the read block ends, before the hold).
const HELD_ARRAY: [u64; 3] = [64, 60, 48];
const HELD_CHUNK: [u64; 3] = [16, 20, 16];
const HELD_VIEW_BLOCK: [u64; 3] = [16, 20, 32];

fn view_held_in_its_first_step(root: &Path, extra: &[&str]) -> View {
    let input = common::make_zarr(
        root,
        "in.zarr",
        &HELD_ARRAY,
        &HELD_CHUNK,
        dtype("<u2"),
        BlockFormat::Zarr,
    );
    let view = View::mount(
        &input,
        &root.join("view"),
        &root.join("staging"),
        "16,20,32",
        HELD_STEP_MS,
        extra,
    );
    within(
        Duration::from_secs(20),
        "the plan's first read block",
        || json_u64(&view.status(), "seeks_made") > 0,
    );
    view
}

/// Reads a far block of the view (the plan reads in C order), with numpy, and checks
/// it equals the source's region read by zarr-python; fails if that takes
/// [`FAR_BLOCK_DEADLINE`] (it waited for the plan's held step).
fn read_far_block_against_zarr_python(root: &Path, view: &View) {
    let grid = Partition::regular(&HELD_ARRAY, &HELD_VIEW_BLOCK);
    // The last along the first two dimensions, a whole block (the last
    // along the third is cut short).
    let grid_shape = grid.grid_shape();
    let far = [grid_shape[0] - 1, grid_shape[1] - 1, 0];
    let block = grid.block(&far);
    let path = view.view.join(format!("{}.npy", grid_name(&far)));
    let origin: Vec<String> = block.origin.iter().map(u64::to_string).collect();
    let shape: Vec<String> = block.shape.iter().map(u64::to_string).collect();
    let code = "import sys, numpy as np, zarr\n\
        path, source, origin, shape = sys.argv[1:5]\n\
        origin = [int(v) for v in origin.split(',')]\n\
        shape = [int(v) for v in shape.split(',')]\n\
        got = np.load(path)\n\
        want = zarr.open_array(source, mode='r')[tuple(slice(o, o + n) for o, n in zip(origin, shape))]\n\
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)\n\
        assert np.array_equal(got, want), 'bytes differ'\n\
        print('exact')\n";
    let args = [
        path_str(&path).to_string(),
        path_str(&root.join("in.zarr")).to_string(),
        origin.join(","),
        shape.join(","),
    ];
    let said = python_within(code, &args, view, &format!("reading {}", path.display()));
    assert_eq!(said, "exact");
}

/// Runs the Python `code` with `args`, failing the test if it fails or
/// takes [`FAR_BLOCK_DEADLINE`] (`what` waited for the plan's held step of
/// `view`); returns what it printed.
fn python_within(code: &str, args: &[String], view: &View, what: &str) -> String {
    let mut reader = Command::new(common::python())
        .args(["-c", code])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    let started = Instant::now();
    while reader.try_wait().unwrap().is_none() {
        if started.elapsed() > FAR_BLOCK_DEADLINE {
            let _ = reader.kill();
            let _ = reader.wait();
            panic!(
                "{what} was stuck for {FAR_BLOCK_DEADLINE:?}: it waits for the plan's held \
                 step ({HELD_STEP_MS} ms); status: {}",
                view.status()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = reader.wait_with_output().unwrap();
    assert!(output.status.success(), "{what}: {}", stderr(&output));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[test]
fn a_far_block_is_served_while_the_plan_holds_its_step() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let view = view_held_in_its_first_step(root.path(), &[]);
    read_far_block_against_zarr_python(root.path(), &view);
    let status = view.status();
    assert_eq!(status["on_demand_blocks"], 1, "{status}");
    assert_eq!(
        status["state"], "materialising",
        "served while the plan still holds: {status}"
    );
    let unmounted = view.umount();
    assert!(unmounted.status.success(), "{}", stderr(&unmounted));
}

#[test]
fn a_block_on_demand_reads_just_its_chunks_within_memory_set_aside_for_it() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let view = view_held_in_its_first_step(root.path(), &[]);
    read_far_block_against_zarr_python(root.path(), &view);
    let status = view.status();
    // The far block covers two whole chunks: one read of each, all its
    // bytes and nothing more, then one write.
    let block_bytes = HELD_VIEW_BLOCK.iter().product::<u64>() * 2;
    // Both read at once, on two of the suite's four threads.
    let chunk_bytes = 2 * HELD_CHUNK.iter().product::<u64>() * 2;
    assert_eq!(json_u64(&status, "on_demand_blocks"), 1, "{status}");
    assert_eq!(json_u64(&status, "on_demand_bytes_read"), block_bytes);
    assert_eq!(json_u64(&status, "on_demand_seeks"), 3, "{status}");
    // The plan leaves one block and two chunks' buffers of --mem free for
    // it, and that is what it held.
    assert_eq!(
        json_u64(&status, "on_demand_reserved_bytes"),
        block_bytes + chunk_bytes,
        "{status}"
    );
    assert_eq!(
        json_u64(&status, "on_demand_peak_bytes"),
        block_bytes + chunk_bytes,
        "{status}"
    );
    let unmounted = view.umount();
    assert!(unmounted.status.success(), "{}", stderr(&unmounted));
}

/// A viewer's first screen: a coarse tile of a pyramid, asked for while
/// the plan holds its first step, is built from level-0 blocks extracted
/// for it, reading its own region's input and no more; the coarsest tile
/// after it reads the rest, each input byte once. Both exact against
/// TensorStore's downsampling of the source as zarr-python reads it.
#[test]
fn a_viewers_coarse_tiles_read_just_their_regions_while_the_plan_holds() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [128u64, 128, 32];
    let input = common::make_zarr(
        root.path(),
        "in.zarr",
        &array,
        &[16, 16, 16],
        dtype("<u2"),
        BlockFormat::Zarr,
    );
    let view = View::mount(
        &input,
        &root.path().join("view"),
        &root.path().join("staging"),
        "16,16,16",
        HELD_STEP_MS,
        &["--levels", "auto"],
    );
    within(
        Duration::from_secs(20),
        "the plan's first read block",
        || json_u64(&view.status(), "seeks_made") > 0,
    );
    let levels = view.status()["levels"].clone();
    assert_eq!(levels.as_array().map(Vec::len), Some(4), "{levels}");
    let code = "import sys, numpy as np, zarr, tensorstore as ts\n\
        view, source, level, name, box = sys.argv[1:6]\n\
        data = zarr.open_array(source, mode='r')[...]\n\
        for _ in range(int(level)):\n\
        \x20   data = ts.downsample(ts.array(data), [2, 2, 2], 'mean').read().result()\n\
        box = [int(v) for v in box.split(',')]\n\
        want = np.ascontiguousarray(data[tuple(slice(a, b) for a, b in zip(box[::2], box[1::2]))])\n\
        got = np.load(f'{view}/{level}/{name}.npy')\n\
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)\n\
        assert np.array_equal(got, want), f'level {level} tile {name} differs'\n\
        print('exact')\n";
    let tile = |level: &str, name: &str, region: &str| {
        let args = [
            path_str(&view.view).to_string(),
            path_str(&input).to_string(),
            level.to_string(),
            name.to_string(),
            region.to_string(),
        ];
        let what = format!("reading tile {level}/{name}");
        assert_eq!(python_within(code, &args, &view, &what), "exact");
    };
    // Level 1 is 64×64×16 in 16³ tiles: tile 1_1_0 covers level 0's
    // [32, 64) × [32, 64) × [0, 32), eight 16³ chunks of u2.
    tile("1", "1_1_0", "16,32,16,32,0,16");
    let status = view.status();
    assert_eq!(json_u64(&status, "on_demand_blocks"), 8, "{status}");
    assert_eq!(
        json_u64(&status, "on_demand_bytes_read"),
        8 * 16 * 16 * 16 * 2
    );
    // The coarsest level is one 16×16×4 tile over the whole array, from
    // 128 level-0 blocks: the rest of the input is read for it, neither
    // the first tile's part nor the blocks the plan wrote before its hold
    // again.
    tile("3", "0_0_0", "0,16,0,16,0,4");
    let status = view.status();
    let level0 = &status["levels"][0];
    assert_eq!(json_u64(level0, "blocks_done"), 128, "{status}");
    let by_plan = 128 - json_u64(&status, "on_demand_blocks");
    assert!(
        by_plan < 8,
        "the plan held after its first read block: {status}"
    );
    assert_eq!(
        json_u64(&status, "on_demand_bytes_read") + by_plan * 16 * 16 * 16 * 2,
        array.iter().product::<u64>() * 2,
        "{status}"
    );
    assert_eq!(status["state"], "materialising", "{status}");
    let unmounted = view.umount();
    assert!(unmounted.status.success(), "{}", stderr(&unmounted));
}
