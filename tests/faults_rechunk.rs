//! `rechunk` stopped part-way: by SIGINT or SIGTERM at random points, by
//! SIGKILL at random points, and by a full output filesystem (a small
//! tmpfs made here). Whatever stops it, no visible file in OUT
//! may be wrong: each is checked byte for byte against the oracle, read by
//! the format's own reader. The blocks it finished are kept, and the same
//! command run again writes only the rest: the kept blocks' mtimes do not
//! change.
//!
//! `RECHUNKFS_FAULT_ITERATIONS` raises the number of random points tried
//! (default: a few, to stay quick in CI).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rechunkfs::format::BlockFormat;

use common::oracle::{self, GridBlock};
use common::{dtype, make_blocks, stderr, TestRng};

const ARRAY: [u64; 3] = [128, 128, 128];
const IN_BLOCK: [u64; 3] = [32, 32, 32];
const OUT_BLOCK: [u64; 3] = [40, 40, 40];
const SHAPE: &str = "40,40,40";

/// Pause after each of the 8 read blocks: a run takes about a second, so
/// a signal lands anywhere in it.
const STEP_DELAY_MS: &str = "120";

/// How many random points each test tries.
fn iterations(default: u64) -> u64 {
    std::env::var("RECHUNKFS_FAULT_ITERATIONS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

fn text(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// `rechunk IN OUT` as `format`, started and not waited for; `slow`
/// pauses it after each read block.
fn start_rechunk(
    input: &Path,
    out: &Path,
    format: BlockFormat,
    extra: &[&str],
    slow: bool,
) -> Child {
    common::interruptible(&mut Command::new(env!("CARGO_BIN_EXE_rechunkfs")))
        .args(["rechunk", text(input), text(out), "--shape", SHAPE, "-q"])
        .args(["--format", format.extension()])
        .args(extra)
        .args(["--threads", "4"])
        .env(
            "RECHUNKFS_STEP_DELAY_MS",
            if slow { STEP_DELAY_MS } else { "0" },
        )
        // Completed blocks are committed (synced, renamed) about four at a
        // time, so a kill finds visible blocks beside partial ones.
        .env("RECHUNKFS_COMMIT_BATCH_BYTES", "500000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rechunkfs")
}

/// Waits for `child`, failing the test past `limit`.
fn wait_within(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("reap");
            panic!(
                "rechunkfs did not end within {limit:?}: {}",
                stderr(&output)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().expect("collect output")
}

fn rechunk(input: &Path, out: &Path, format: BlockFormat, extra: &[&str]) -> Output {
    wait_within(
        start_rechunk(input, out, format, extra, false),
        Duration::from_secs(60),
    )
}

/// Every file under `dir`, as paths relative to it.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).expect("list") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path.strip_prefix(dir).expect("inside").to_path_buf());
            }
        }
    }
    found.sort();
    found
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'))
}

/// A run's temporary file (a block or metadata file not finished).
fn is_temporary(path: &Path) -> bool {
    is_hidden(path) && path.to_string_lossy().ends_with(".partial")
}

/// The mtime of every visible file under `out`.
fn mtimes(out: &Path) -> Vec<(PathBuf, std::time::SystemTime)> {
    files_under(out)
        .into_iter()
        .filter(|path| !is_hidden(path))
        .map(|path| {
            let modified = std::fs::metadata(out.join(&path))
                .and_then(|m| m.modified())
                .expect("mtime");
            (path, modified)
        })
        .collect()
}

/// Runs the same command again: it must finish the job, leave every block
/// `before` held untouched (same mtime) and no temporary.
fn rerun_finishes_without_rewriting(case: &str, input: &Path, out: &Path, format: BlockFormat) {
    let before = mtimes(out);
    let rerun = rechunk(input, out, format, &[]);
    assert!(rerun.status.success(), "{case}: rerun: {}", stderr(&rerun));
    verify_complete(out, format);
    let after: std::collections::HashMap<_, _> = mtimes(out).into_iter().collect();
    for (path, modified) in before {
        if path == Path::new("zarr.json") {
            continue;
        }
        assert_eq!(
            after.get(&path),
            Some(&modified),
            "{case}: {} was written again",
            path.display()
        );
    }
    let temporaries: Vec<PathBuf> = files_under(out)
        .into_iter()
        .filter(|path| is_temporary(path))
        .collect();
    assert!(temporaries.is_empty(), "{case}: left {temporaries:?}");
}

/// The block of the output grid a visible file of `format` is named for.
fn block_named(relative: &Path, format: BlockFormat) -> Option<GridBlock> {
    let name = relative.to_str()?;
    let stem = match format {
        BlockFormat::Zarr3 => name.strip_prefix("c/")?.replace('/', "_"),
        _ => name
            .strip_suffix(&format!(".{}", format.extension()))?
            .to_string(),
    };
    oracle::grid_blocks(&ARRAY, &OUT_BLOCK)
        .into_iter()
        .find(|block| block.stem() == stem)
}

/// Checks every visible file in `out` (finished or not, the run stopped):
/// each is a block byte-exact against the oracle, or array metadata,
/// which is there only once every block is. Returns how many blocks.
fn check_visible(out: &Path, format: BlockFormat) -> usize {
    let u2 = dtype("u2");
    let all = oracle::grid_blocks(&ARRAY, &OUT_BLOCK).len();
    let visible: Vec<PathBuf> = files_under(out)
        .into_iter()
        .filter(|path| !is_hidden(path))
        .collect();
    let mut blocks = 0;
    for relative in &visible {
        let path = out.join(relative);
        if relative == Path::new("zarr.json") {
            continue;
        }
        let block = block_named(relative, format)
            .unwrap_or_else(|| panic!("{}: not an output block", path.display()));
        if format == BlockFormat::Zarr3 {
            let data = oracle::sample_bytes(&ARRAY, &block.origin, &block.shape, u2.size);
            let bytes = std::fs::read(&path).expect("read chunk");
            let whole = oracle::padded(&data, &block.shape, &OUT_BLOCK, u2.size);
            assert!(bytes == whole, "{}: wrong bytes", path.display());
        } else {
            common::verified_block_file(&path, &ARRAY, &block, u2, format);
        }
        blocks += 1;
    }
    if visible.iter().any(|path| path == Path::new("zarr.json")) {
        assert_eq!(blocks, all, "zarr.json is visible before every chunk");
    }
    blocks
}

fn verify_complete(out: &Path, format: BlockFormat) {
    if format == BlockFormat::Zarr3 {
        common::verify_zarr_output(out, &ARRAY, &OUT_BLOCK, dtype("u2"), format);
    } else {
        common::verify_output(out, &ARRAY, &OUT_BLOCK, dtype("u2"), format);
    }
}

/// What became of one run that was sent a signal.
#[derive(Debug, Default)]
struct Outcomes {
    /// Stopped by the signal's handler: cleaned up and said so.
    interrupted: u64,
    /// Ended by the signal before the handler was set (OUT never touched).
    before_start: u64,
    /// Finished before the signal came.
    finished: u64,
    /// The longest a stopped run took to end after its signal.
    slowest_stop: Duration,
    /// Stopped runs that kept blocks they finished.
    kept_blocks: u64,
}

fn signal_of(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

const FORMATS: [BlockFormat; 3] = [BlockFormat::Npy, BlockFormat::Hdf5, BlockFormat::Zarr3];

/// Checks what a run stopped by `signal` said and left: the blocks it
/// finished, each exact, and none of its temporaries. Returns how many
/// blocks it kept.
fn check_stopped(
    case: &str,
    message: &str,
    signal: Signal,
    out: &Path,
    existed: bool,
    outcomes: &mut Outcomes,
) -> usize {
    if message.is_empty() {
        // Killed before the handler was set: nothing written yet.
        assert!(!out.exists() || existed, "{case}: OUT was made");
        outcomes.before_start += 1;
        return 0;
    }
    assert!(
        message.contains(&format!("interrupted by {signal}"))
            && message.contains("kept every block it finished")
            && message.contains("run the same command again"),
        "{case}"
    );
    outcomes.interrupted += 1;
    let temporaries: Vec<PathBuf> = files_under(out)
        .into_iter()
        .filter(|path| is_temporary(path))
        .collect();
    assert!(temporaries.is_empty(), "{case}: left {temporaries:?}");
    visible_blocks(out)
}

/// How many visible files `out` holds (each checked by [`check_visible`]).
fn visible_blocks(out: &Path) -> usize {
    files_under(out)
        .iter()
        .filter(|path| !is_hidden(path) && *path != Path::new("zarr.json"))
        .count()
}

#[test]
fn sigint_and_sigterm_stop_a_run_promptly_keep_its_blocks_and_a_rerun_writes_the_rest() {
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &IN_BLOCK,
        dtype("u2"),
        BlockFormat::Npy,
    );
    let mut rng = TestRng(18_007);
    let mut outcomes = Outcomes::default();
    for iteration in 0..iterations(9) {
        let format = FORMATS[(iteration % 3) as usize];
        let signal = [Signal::SIGINT, Signal::SIGTERM][rng.below(2) as usize];
        // Half the runs into an OUT that exists (and must stay, empty).
        let existed = rng.below(2) == 0;
        let out = root.path().join(format!("out{iteration}"));
        if existed {
            std::fs::create_dir(&out).unwrap();
        }
        let child = start_rechunk(&input, &out, format, &[], true);
        let delay = Duration::from_millis(rng.below(900));
        std::thread::sleep(delay);
        let sent = Instant::now();
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let output = wait_within(child, Duration::from_secs(20));
        let took = sent.elapsed();
        let message = stderr(&output);
        let case = format!("run {iteration} ({format:?}, {signal} after {delay:?}): {message}");
        if output.status.success() {
            verify_complete(&out, format);
            outcomes.finished += 1;
            continue;
        }
        assert_eq!(signal_of(output.status), Some(signal as i32), "{case}");
        assert!(
            took < Duration::from_secs(3),
            "{case}: ended {took:?} after"
        );
        outcomes.slowest_stop = outcomes.slowest_stop.max(took);
        if check_stopped(&case, &message, signal, &out, existed, &mut outcomes) > 0 {
            check_visible(&out, format);
            outcomes.kept_blocks += 1;
        }
        rerun_finishes_without_rewriting(&case, &input, &out, format);
    }
    eprintln!("signals: {outcomes:?}");
    assert!(outcomes.interrupted >= 3, "{outcomes:?}");
}

#[test]
fn sigkill_leaves_no_wrong_visible_file_and_a_rerun_finishes_without_rewriting() {
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &IN_BLOCK,
        dtype("u2"),
        BlockFormat::Npy,
    );
    let mut rng = TestRng(18_009);
    let (mut visible_blocks, mut partial_files) = (0, 0);
    for iteration in 0..iterations(9) {
        let format = FORMATS[(iteration % 3) as usize];
        let out = root.path().join(format!("out{iteration}"));
        let mut child = start_rechunk(&input, &out, format, &[], true);
        let delay = Duration::from_millis(100 + rng.below(1000));
        std::thread::sleep(delay);
        child.kill().expect("SIGKILL");
        let output = wait_within(child, Duration::from_secs(20));
        let case = format!("run {iteration} ({format:?}, SIGKILL after {delay:?})");
        if output.status.success() || !out.exists() {
            continue;
        }
        visible_blocks += check_visible(&out, format);
        partial_files += files_under(&out)
            .iter()
            .filter(|path| is_temporary(path))
            .count();
        // The same command again removes the killed run's temporaries and
        // writes only the blocks it had not finished.
        rerun_finishes_without_rewriting(&case, &input, &out, format);
        if iteration == 0 {
            // --overwrite starts over instead.
            let again = rechunk(&input, &out, format, &["--overwrite"]);
            assert!(again.status.success(), "{case}: {}", stderr(&again));
            verify_complete(&out, format);
        }
    }
    eprintln!("SIGKILL: {visible_blocks} visible blocks checked, {partial_files} partial files");
    assert!(visible_blocks > 0 && partial_files > 0);
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallFilesystem {
    dir: tempfile::TempDir,
}

impl SmallFilesystem {
    fn mount(size: &str) -> SmallFilesystem {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount of a tmpfs failed");
        SmallFilesystem { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_output_filesystem_is_said_keeps_finished_blocks_and_a_rerun_after_freeing_space_works() {
    require!(TmpfsMount);
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &IN_BLOCK,
        dtype("u2"),
        BlockFormat::Npy,
    );
    // 8 MiB, 6 of them taken: the 4 MiB array does not fit until the
    // filler goes.
    let small = SmallFilesystem::mount("8m");
    let filler = small.path().join("filler");
    for (case, format) in FORMATS.iter().enumerate() {
        std::fs::write(&filler, vec![1u8; 6 << 20]).unwrap();
        // Into a new OUT, and into an empty one that exists.
        let existed = case % 2 == 1;
        let out = small.path().join(format!("out{case}"));
        if existed {
            std::fs::create_dir(&out).unwrap();
        }
        let output = rechunk(&input, &out, *format, &[]);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{format:?}: {message}");
        for says in [
            &format!("{}: no space left on the output's filesystem", text(&out)),
            "kept every block it finished",
            "run the same command again to write the rest once there is space",
            "No space left on device",
        ] {
            assert!(
                message.contains(says),
                "{format:?} lacks '{says}': {message}"
            );
        }
        check_visible(&out, *format);
        let temporaries: Vec<PathBuf> = files_under(&out)
            .into_iter()
            .filter(|path| is_temporary(path))
            .collect();
        assert!(temporaries.is_empty(), "{format:?}: left {temporaries:?}");
        std::fs::remove_file(&filler).unwrap();
        rerun_finishes_without_rewriting(&format!("{format:?}"), &input, &out, *format);
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// The sample array's npy file at `path` with every data byte inverted:
/// the same size, other values.
fn inverted_npy(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap();
    let data = bytes.len() - (ARRAY.iter().product::<u64>() * 2) as usize;
    for byte in &mut bytes[data..] {
        *byte = !*byte;
    }
    bytes
}

/// Waits (up to 30 s) until `path` exists.
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_input_rewritten_in_place_during_a_run_fails_it_and_no_block_is_torn() {
    let root = tempfile::tempdir().unwrap();
    // One file, read in 8 slabs of 16 rows (--mem 1M), each output block
    // from two or three of them, a pause after each.
    let input = make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &ARRAY,
        dtype("u2"),
        BlockFormat::Npy,
    )
    .join("0_0_0.npy");
    let new = root.path().join("new.npy");
    std::fs::write(&new, inverted_npy(&input)).unwrap();
    let old = root.path().join("old.npy");
    std::fs::copy(&input, &old).unwrap();
    for (case, restore_mtime) in [("cp", false), ("cp, then touch -r", true)] {
        std::fs::copy(&old, &input).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&input).unwrap());
        let out = root.path().join(format!("out-{restore_mtime}"));
        let child = start_rechunk(&input, &out, BlockFormat::Npy, &["--mem", "1M"], true);
        // Two read blocks in: the run has read the file's first slabs.
        wait_for(&out.join(".rechunkfs-job.json"));
        std::thread::sleep(Duration::from_millis(180));
        let copied = Command::new("cp").arg(&new).arg(&input).status().unwrap();
        assert!(copied.success());
        if restore_mtime {
            let touched = Command::new("touch")
                .arg("-r")
                .arg(&old)
                .arg(&input)
                .status();
            assert!(touched.unwrap().success());
        }
        let same = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&input).unwrap());
        assert_eq!(ino, same, "{case}: cp kept the inode");
        let output = wait_within(child, Duration::from_secs(60));
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{case}: {message}");
        for says in [
            text(&input),
            "the input changed while it was being read",
            "--overwrite",
        ] {
            assert!(message.contains(says), "{case} lacks '{says}': {message}");
        }
        // Every block kept was made from the old bytes alone.
        check_visible(&out, BlockFormat::Npy);
        let temporaries: Vec<PathBuf> = files_under(&out)
            .into_iter()
            .filter(|path| is_temporary(path))
            .collect();
        assert!(temporaries.is_empty(), "{case}: left {temporaries:?}");
        // The record holds the old input: a rerun is refused, even with
        // its mtime restored.
        let rerun = rechunk(&input, &out, BlockFormat::Npy, &[]);
        assert_eq!(rerun.status.code(), Some(1), "{case}: rerun");
        assert!(
            stderr(&rerun).contains("changed since"),
            "{case}: {}",
            stderr(&rerun)
        );
    }
}

/// `touch -r` `reference` onto `path`: `path`'s mtime set to `reference`'s.
fn touch_like(reference: &Path, path: &Path) {
    let touched = Command::new("touch")
        .arg("-r")
        .arg(reference)
        .arg(path)
        .status();
    assert!(touched.expect("run touch").success(), "touch -r failed");
}

/// A run stopped by SIGINT, then an input block rewritten in place with its
/// size and mtime restored (`touch -r`): the same command run again sees the
/// change (OUT's record keeps each input's ctime and inode too) and refuses
/// to finish OUT from two versions of the input.
#[test]
fn a_resumed_run_catches_an_input_rewritten_with_its_size_and_mtime_restored() {
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &IN_BLOCK,
        dtype("u2"),
        BlockFormat::Npy,
    );
    let out = root.path().join("out");
    let child = start_rechunk(&input, &out, BlockFormat::Npy, &[], true);
    wait_for(&out.join(".rechunkfs-job.json"));
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
    let stopped = wait_within(child, Duration::from_secs(20));
    assert_eq!(
        signal_of(stopped.status),
        Some(Signal::SIGINT as i32),
        "the run was not stopped by SIGINT: {}",
        stderr(&stopped)
    );
    // Same size, same mtime, other bytes: only ctime tells.
    let block = input.join("3_2_1.npy");
    let reference = root.path().join("reference");
    std::fs::copy(&block, &reference).unwrap();
    touch_like(&block, &reference);
    let mut bytes = std::fs::read(&block).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&block, &bytes).unwrap();
    touch_like(&reference, &block);
    let rerun = rechunk(&input, &out, BlockFormat::Npy, &[]);
    let message = stderr(&rerun);
    assert_eq!(rerun.status.code(), Some(1), "{message}");
    for says in ["changed since", "3_2_1.npy", "ctime"] {
        assert!(message.contains(says), "lacks '{says}': {message}");
    }
}

#[test]
fn sigint_stops_a_run_of_a_million_blocks_within_its_first_step() {
    let root = tempfile::tempdir().unwrap();
    // One read block, one step: 1,048,576 one-voxel blocks written by
    // the writer in one slab.
    let input = make_blocks(
        root.path(),
        "in",
        &[128, 128, 64],
        &[128, 128, 64],
        dtype("u1"),
        BlockFormat::Npy,
    )
    .join("0_0_0.npy");
    let out = root.path().join("out");
    let child = common::interruptible(&mut Command::new(env!("CARGO_BIN_EXE_rechunkfs")))
        .args(["rechunk", text(&input), text(&out), "--shape", "1,1,1"])
        .args(["--format", "raw", "-q", "--threads", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rechunkfs");
    wait_for(&out.join(".rechunkfs-job.json"));
    std::thread::sleep(Duration::from_millis(300));
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
    // The whole run takes minutes; a stop takes the renames of the
    // blocks finished.
    let output = wait_within(child, Duration::from_secs(30));
    let message = stderr(&output);
    assert_eq!(
        signal_of(output.status),
        Some(Signal::SIGINT as i32),
        "{message}"
    );
    assert!(message.contains("interrupted by SIGINT"), "{message}");
    let blocks = std::fs::read_dir(&out).unwrap().count();
    assert!(blocks < 1 << 20, "{blocks} files: the run was not stopped");
}
