//! Faults a hostile or unlucky user brings: inputs that are not what their
//! names say, damaged headers, killed processes, full disks. Each case runs
//! the real binary under a deadline: a hang fails the test instead of
//! stalling the suite, and a refusal must name the file and leave nothing
//! behind.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rechunkfs::format::BlockFormat;

use common::{dtype, make_blocks, stderr};

/// Runs the binary with `args`, killing it and failing the test if it has
/// not ended within `limit`.
fn run_within(limit: Duration, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(args)
        .args(common::fault_threads(args))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rechunkfs");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("reap");
            panic!("rechunkfs {args:?} hung: {}", stderr(&output));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("collect output")
}

fn text(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// A 3×3×3 grid of HDF5 blocks under `root/name`.
fn grid(root: &Path, name: &str) -> PathBuf {
    make_blocks(
        root,
        name,
        &[90, 90, 90],
        &[32, 32, 32],
        dtype("u2"),
        BlockFormat::Hdf5,
    )
}

/// `rechunk` and `plan` of `input` both refuse it within seconds, naming
/// `named` and saying each of `says`; no output directory is left.
fn assert_refused(root: &Path, input: &Path, named: &Path, says: &[&str]) {
    let out = root.join("out");
    for args in [
        vec![
            "rechunk",
            text(input),
            text(&out),
            "--shape",
            "40,40,40",
            "-q",
        ],
        vec!["plan", text(input), "--shape", "40,40,40"],
    ] {
        let output = run_within(Duration::from_secs(20), &args);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {message}");
        assert!(
            message.contains(text(named)),
            "{args:?} names no {named:?}: {message}"
        );
        for part in says {
            assert!(message.contains(part), "{args:?} lacks '{part}': {message}");
        }
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
}

#[test]
fn a_fifo_named_like_a_block_is_refused_without_hanging() {
    let root = tempfile::tempdir().unwrap();
    for name in ["1_0_1.h5", "0_0_0.h5"] {
        let input = grid(root.path(), &format!("in-{name}"));
        let fifo = input.join(name);
        std::fs::remove_file(&fifo).unwrap();
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_refused(
            root.path(),
            &input,
            &fifo,
            &["is a FIFO (named pipe), not a regular file"],
        );
        // Given as the input itself.
        assert_refused(root.path(), &fifo, &fifo, &["is a FIFO (named pipe)"]);
    }
}

#[test]
fn a_directory_named_like_a_block_is_refused_as_one() {
    let root = tempfile::tempdir().unwrap();
    let input = grid(root.path(), "in");
    let dir = input.join("1_0_1.h5");
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    assert_refused(
        root.path(),
        &input,
        &dir,
        &["is a directory, not a regular file"],
    );
}

#[test]
fn a_symlink_to_a_block_is_read_and_a_dangling_one_refused() {
    let root = tempfile::tempdir().unwrap();
    let input = grid(root.path(), "in");
    let moved = root.path().join("elsewhere.h5");
    std::fs::rename(input.join("2_2_2.h5"), &moved).unwrap();
    std::os::unix::fs::symlink(&moved, input.join("2_2_2.h5")).unwrap();
    let out = root.path().join("out");
    let output = run_within(
        Duration::from_secs(30),
        &[
            "rechunk",
            text(&input),
            text(&out),
            "--shape",
            "40,40,40",
            "-q",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    common::verify_output(
        &out,
        &[90, 90, 90],
        &[40, 40, 40],
        dtype("u2"),
        BlockFormat::Hdf5,
    );
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_file(&moved).unwrap();
    assert_refused(
        root.path(),
        &input,
        &input.join("2_2_2.h5"),
        &["following the symlink"],
    );
}

#[test]
fn one_index_in_two_formats_is_a_duplicate() {
    let root = tempfile::tempdir().unwrap();
    let input = grid(root.path(), "in");
    let npy = make_blocks(
        root.path(),
        "npy",
        &[90, 90, 90],
        &[32, 32, 32],
        dtype("u2"),
        BlockFormat::Npy,
    );
    std::fs::copy(npy.join("0_0_0.npy"), input.join("0_0_0.npy")).unwrap();
    let out = root.path().join("out");
    let output = run_within(
        Duration::from_secs(20),
        &["rechunk", text(&input), text(&out), "--shape", "40,40,40"],
    );
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{message}");
    assert!(message.contains("duplicates block 0_0_0"), "{message}");
    assert!(
        message.contains("0_0_0.h5") && message.contains("0_0_0.npy"),
        "{message}"
    );
    assert!(!message.contains("share a format"), "{message}");
}

#[test]
fn a_damaged_npy_header_length_is_said_without_quoting_data() {
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &[200, 200, 100],
        &[100, 100, 100],
        dtype("u2"),
        BlockFormat::Npy,
    );
    let block = input.join("1_1_0.npy");
    let mut bytes = std::fs::read(&block).unwrap();
    bytes[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    std::fs::write(&block, &bytes).unwrap();
    let out = root.path().join("out");
    let output = run_within(
        Duration::from_secs(20),
        &["rechunk", text(&input), text(&out), "--shape", "50,50,50"],
    );
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{message}");
    assert!(message.contains("1_1_0.npy"), "{message}");
    assert!(
        message.contains("header length field says 65535 bytes"),
        "{message}"
    );
    assert!(
        message.len() < 400,
        "{} bytes of message: {message}",
        message.len()
    );
    assert!(message.is_ascii(), "{message}");
}

/// `rechunk` whose OUT holds the input, under any name: refused before OUT
/// is touched, the input's bytes unchanged.
fn assert_input_kept(case: &str, args: &[&str], input: &Path, says: &str) {
    let before = std::fs::read(input).expect("read input");
    let output = run_within(Duration::from_secs(30), args);
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{case}: {message}");
    assert!(message.contains(says), "{case} lacks '{says}': {message}");
    let after = std::fs::read(input).unwrap_or_else(|e| panic!("{case}: input gone: {e}"));
    assert!(before == after, "{case}: the input was written");
}

#[test]
fn an_input_inside_out_is_never_removed_or_written() {
    let root = tempfile::tempdir().unwrap();
    let d = make_blocks(
        root.path(),
        "d",
        &[64, 64, 64],
        &[64, 64, 64],
        dtype("u2"),
        BlockFormat::Npy,
    );
    let input = d.join("0_0_0.npy");
    // The case: the input sits in OUT under a block's name.
    for extra in [
        &["--overwrite"][..],
        &[][..],
        &["--levels", "2", "--overwrite"][..],
    ] {
        let mut args = vec![
            "rechunk",
            text(&input),
            text(&d),
            "--shape",
            "32,32,32",
            "-q",
        ];
        args.extend(extra);
        assert_input_kept(&format!("{extra:?}"), &args, &input, "holds the input");
    }
    // Given through a symlink that sits in OUT, the file elsewhere.
    let elsewhere = root.path().join("elsewhere.npy");
    std::fs::copy(&input, &elsewhere).unwrap();
    let out = root.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let link = out.join("0_0_0.npy");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let args = [
        "rechunk",
        text(&link),
        text(&out),
        "--shape",
        "32,32,32",
        "--overwrite",
        "-q",
    ];
    assert_input_kept("symlink", &args, &elsewhere, "holds the input");
    assert!(link.exists(), "the symlink given as IN was removed");
    // A hard link of the input in OUT under a block's name.
    std::fs::remove_file(&link).unwrap();
    std::fs::hard_link(&elsewhere, &link).unwrap();
    let args = [
        "rechunk",
        text(&elsewhere),
        text(&out),
        "--shape",
        "32,32,32",
        "--overwrite",
        "-q",
    ];
    assert_input_kept(
        "hard link",
        &args,
        &elsewhere,
        "under another name (a hard link)",
    );
    assert!(link.exists(), "the hard link was removed");
}

#[test]
fn zarr_chunks_under_out_are_never_removed() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let input = common::make_zarr(
        root.path(),
        "z",
        &[64, 64, 64],
        &[16, 16, 16],
        dtype("u2"),
        BlockFormat::Zarr3,
    );
    // OUT is a directory of the input's chunk tree: --overwrite would
    // take its numbered files for old chunks.
    let out = input.join("c").join("0").join("0");
    let chunk = out.join("0");
    assert!(chunk.is_file(), "zarr-python wrote no {}", chunk.display());
    let args = [
        "rechunk",
        text(&input),
        text(&out),
        "--shape",
        "32,32,32",
        "--format",
        "npy",
        "--overwrite",
        "-q",
    ];
    assert_input_kept("zarr3 chunks", &args, &chunk, "holds the input");
    let count = std::fs::read_dir(&out).unwrap().count();
    assert_eq!(count, 4, "chunks of {} removed", out.display());
}

#[test]
fn a_view_whose_input_is_rewritten_in_place_fails_and_says_why() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [128, 128, 128];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &array,
        dtype("u2"),
        BlockFormat::Npy,
    )
    .join("0_0_0.npy");
    let mut new = std::fs::read(&input).unwrap();
    let data = new.len() - 128 * 128 * 128 * 2;
    for byte in &mut new[data..] {
        *byte = !*byte;
    }
    let replacement = root.path().join("new.npy");
    std::fs::write(&replacement, &new).unwrap();
    // One file read in 8 slabs (--mem 1M), 300 ms after each.
    let args = [
        "--shape",
        "40,40,40",
        "--mem",
        "1M",
        "--in-order",
        "--threads",
        "4",
    ];
    let mounted = common::mounted::MountedView::new(&input, root.path(), &args, 300);
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::json_u64(&mounted.status(), "blocks_done") == 0 {
        assert!(
            Instant::now() < deadline,
            "no block done: {}",
            mounted.status()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let copied = Command::new("cp")
        .arg(&replacement)
        .arg(&input)
        .status()
        .unwrap();
    assert!(copied.success());
    let status = loop {
        let status = mounted.status();
        if status["state"] != "materialising" {
            break status;
        }
        assert!(Instant::now() < deadline, "still filling: {status}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("changed while it was being read") && error.contains(text(&input)),
        "{status}"
    );
    assert!(common::json_u64(&status, "blocks_done") < common::json_u64(&status, "blocks_total"));
}
