//! Real FUSE mounts through the `rechunkfs` binary: every byte read back by
//! this process and by other programs, parked reads, concurrency, kill -9
//! and resume, unmount with parked readers, read-only refusals, and the
//! mount-point checks. Needs /dev/fuse (and root or fusermount3).

#[macro_use]
mod common;

use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rechunkfs::array::geometry::Partition;
use rechunkfs::array::names::grid_name;
use rechunkfs::format::BlockFormat;

use common::mounted::MountedView;
use common::{dtype, make_blocks, python, stderr, TestRng};

fn run(args: &[&str], step_delay_ms: u64) -> Output {
    common::run_rechunkfs(args, step_delay_ms)
}

/// `input` mounted on `view` as blocks of `shape` in `format`, staged in
/// `staging`, the materialiser paused `step_delay_ms` after each read
/// block, with `extra` arguments.
fn mount_at(
    input: &Path,
    (view, staging): (&Path, &Path),
    (shape, format): (&str, &str),
    step_delay_ms: u64,
    extra: &[&str],
) -> MountedView {
    let args = [&["--shape", shape, "--format", format][..], extra].concat();
    MountedView::at(input, view, staging, &args, step_delay_ms)
}

/// [`mount_at`] on `root/view`, staged in `root/staging`.
fn mount_under(
    root: &Path,
    input: &Path,
    (shape, format): (&str, &str),
    step_delay_ms: u64,
    extra: &[&str],
) -> MountedView {
    let (view, staging) = (root.join("view"), root.join("staging"));
    mount_at(
        input,
        (&view, &staging),
        (shape, format),
        step_delay_ms,
        extra,
    )
}

fn xattr_state(path: &Path) -> String {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = CString::new("user.rechunkfs.state").unwrap();
    let mut value = [0u8; 32];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    assert!(
        n >= 0,
        "getxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    String::from_utf8_lossy(&value[..n as usize]).into_owned()
}

/// Every file of the view, read by this process, is its format's file of
/// the source's block: read by the format's reader, with the size `stat`
/// gives. Returns each file's bytes by name.
fn check_every_file(
    view: &Path,
    array: &[u64],
    block: &[u64],
    format: BlockFormat,
    dt: &str,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    for grid_block in common::oracle::grid_blocks(array, block) {
        let name = format!("{}.{}", grid_block.stem(), format.extension());
        let path = view.join(&name);
        let bytes = common::verified_block_file(&path, array, &grid_block, dtype(dt), format);
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            bytes.len() as u64,
            "size of {}",
            path.display()
        );
        files.insert(name, bytes);
    }
    files
}

/// The block of the grid of `array` in blocks of `block` at `index`.
fn grid_block(array: &[u64], block: &[u64], index: &[u64]) -> common::oracle::GridBlock {
    common::oracle::grid_blocks(array, block)
        .into_iter()
        .find(|b| b.index == index)
        .expect("a block of the grid")
}

#[test]
fn every_byte_through_the_mount_equals_the_source_for_other_programs_too() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    for (format, dt, array, inb, outb) in [
        (
            BlockFormat::Hdf5,
            "<u2",
            [37u64, 29, 23],
            [10u64, 8, 7],
            [16u64, 9, 11],
        ),
        (
            BlockFormat::Npy,
            ">f4",
            [30, 30, 30],
            [10, 10, 10],
            [15, 15, 15],
        ),
    ] {
        let base = root.path().join(format.extension());
        let input = make_blocks(&base, "in", &array, &inb, dtype(dt), BlockFormat::Hdf5);
        let shape = outb
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mounted = mount_under(&base, &input, (&shape, format.extension()), 0, &[]);
        // Read from another thread of this process while it fills.
        let view = mounted.view.clone();
        let reader = std::thread::spawn(move || check_every_file(&view, &array, &outb, format, dt));
        let files = reader.join().unwrap();
        // And with external programs: cat, and numpy/h5py.
        let cat = Command::new("cat")
            .arg(mounted.view.join(format!("0_1_0.{}", format.extension())))
            .output()
            .unwrap();
        assert_eq!(
            cat.stdout,
            files[&format!("0_1_0.{}", format.extension())],
            "cat"
        );
        let array_text = array
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let verify = Command::new(python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/verify.py"
            ))
            .args([
                mounted.view.to_str().unwrap(),
                "--array",
                &array_text,
                "--block",
                &shape,
                "--dtype",
                dt,
            ])
            .args(["--format", format.extension()])
            .output()
            .expect("python");
        assert!(
            verify.status.success(),
            "python: {}{}",
            String::from_utf8_lossy(&verify.stdout),
            stderr(&verify)
        );
        let meta: serde_json::Value =
            serde_json::from_slice(&fs::read(mounted.view.join("rechunkfs.json")).unwrap())
                .unwrap();
        assert_eq!(meta["array_shape"], serde_json::json!(array));
        mounted.wait_complete();
        let status = mounted.status();
        // Blocks the readers had extracted beside the plan are skipped by
        // it: each one write (keep writes output blocks whole) fewer.
        assert_eq!(
            common::json_u64(&status, "seeks_made") + common::json_u64(&status, "on_demand_blocks"),
            common::json_u64(&status, "seeks_planned"),
            "the materialiser made the planned seeks: {status}"
        );
        let umount = mounted.umount();
        assert!(umount.status.success(), "{}", stderr(&umount));
        assert!(!rechunkfs::fuse::session::is_mounted(&mounted.view));
    }
}

#[test]
fn a_read_of_a_pending_block_waits_and_others_are_served_meanwhile() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [40u64, 36, 30];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[10, 9, 10],
        dtype("u1"),
        BlockFormat::Hdf5,
    );
    let mounted = mount_under(root.path(), &input, ("8,9,6", "h5"), 40, &["--in-order"]);
    let grid = Partition::regular(&array, &[8, 9, 6]);
    let last_index: Vec<usize> = grid.grid_shape().iter().map(|n| n - 1).collect();
    let last = mounted.view.join(format!("{}.h5", grid_name(&last_index)));
    let first = mounted.view.join("0_0_0.h5");

    assert_eq!(
        xattr_state(&last),
        "pending",
        "the last block is pending when its read is issued"
    );
    let order = Arc::new(AtomicUsize::new(0));
    let (order_a, last_a) = (order.clone(), last.clone());
    let parked = std::thread::spawn(move || {
        let bytes = fs::read(&last_a).unwrap();
        (bytes, order_a.fetch_add(1, Ordering::SeqCst))
    });
    while xattr_state(&first) != "done" {
        std::thread::sleep(Duration::from_millis(5));
    }
    let first_bytes = fs::read(&first).unwrap();
    let first_rank = order.fetch_add(1, Ordering::SeqCst);
    let first_block = grid_block(&array, &[8, 9, 6], &[0, 0, 0]);
    assert_eq!(
        first_bytes,
        common::verified_block_file(&first, &array, &first_block, dtype("u1"), BlockFormat::Hdf5)
    );
    assert_eq!(
        xattr_state(&last),
        "pending",
        "still pending after the done block was served"
    );
    let (last_bytes, last_rank) = parked.join().unwrap();
    assert!(
        first_rank < last_rank,
        "the done block was answered before the pending one"
    );
    let last_index: Vec<u64> = last_index.iter().map(|&i| i as u64).collect();
    let last_block = grid_block(&array, &[8, 9, 6], &last_index);
    assert_eq!(
        last_bytes,
        common::verified_block_file(&last, &array, &last_block, dtype("u1"), BlockFormat::Hdf5)
    );
}

#[test]
fn many_concurrent_random_readers_get_correct_bytes_without_deadlock() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [45u64, 40, 33];
    let block = [16u64, 11, 9];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[9, 10, 11],
        dtype("<i4"),
        BlockFormat::Hdf5,
    );
    let mounted = mount_under(root.path(), &input, ("16,11,9", "npy"), 5, &[]);
    let blocks = Arc::new(common::oracle::grid_blocks(&array, &block));
    let (done_tx, done_rx) = mpsc::channel();
    for thread in 0..12u64 {
        let (view, blocks, done_tx) = (mounted.view.clone(), blocks.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let mut rng = TestRng(thread * 1000);
            for _ in 0..60 {
                let rank = rng.below(blocks.len() as u64);
                let grid_block = &blocks[rank as usize];
                let path = view.join(format!("{}.npy", grid_block.stem()));
                let expected = expected_npy_file(&path, &array, grid_block, "<i4");
                let mut file = fs::File::open(&path).unwrap();
                // Offsets anywhere, including across the header/data
                // boundary (4096) and past the end.
                let offset = match rng.below(3) {
                    0 => 4096 - rng.below(200),
                    1 => expected.len() as u64 - rng.below(300).min(expected.len() as u64),
                    _ => rng.below(expected.len() as u64 + 50),
                };
                let len = rng.below(20_000) + 1;
                file.seek(SeekFrom::Start(offset)).unwrap();
                let mut got = Vec::new();
                file.take(len).read_to_end(&mut got).unwrap();
                let start = (offset as usize).min(expected.len());
                let end = (offset + len).min(expected.len() as u64) as usize;
                assert_eq!(got, expected[start..end], "block {rank} at {offset}+{len}");
            }
            done_tx.send(thread).unwrap();
        });
    }
    drop(done_tx);
    for _ in 0..12 {
        done_rx
            .recv_timeout(Duration::from_secs(180))
            .expect("a reader hung or failed");
    }
}

fn journal_ranks(staging: &Path) -> Vec<u64> {
    rechunkfs::view::staging::Journal::read(staging)
        .unwrap()
        .done
}

#[test]
fn kill_9_then_umount_and_remount_resumes_without_rewriting_done_blocks() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [48u64, 40, 36];
    let block = [12u64, 10, 9];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[8, 20, 12],
        dtype(">u2"),
        BlockFormat::Hdf5,
    );
    let staging = root.path().join("staging");
    let view = root.path().join("view");
    let mounted = mount_at(&input, (&view, &staging), ("12,10,9", "h5"), 150, &[]);
    while journal_ranks(&staging).len() < 5 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = mounted.status()["pid"].as_i64().unwrap();
    // A `status --wait` parked on the daemon when it dies.
    let waiting = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| mounted.wait());
        std::thread::sleep(Duration::from_millis(100));
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        waiter.join().expect("status --wait thread")
    });
    assert!(!waiting.status.success());
    assert!(
        stderr(&waiting).contains("not running"),
        "{}",
        stderr(&waiting)
    );
    // The dead daemon's mount answers ENOTCONN; status says what to do.
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let out = run(&["status", view.to_str().unwrap()], 0);
        if !out.status.success() {
            break stderr(&out);
        }
        assert!(
            Instant::now() < deadline,
            "daemon still answering after kill -9"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(dead.contains("not running"), "{dead}");
    let before = journal_ranks(&staging);
    let total = Partition::regular(&array, &block).count();
    assert!((before.len() as u64) < total, "killed mid-materialisation");
    let times_before: Vec<_> = before
        .iter()
        .map(|&rank| {
            let name = format!(
                "{}.h5",
                grid_name(&Partition::regular(&array, &block).unravel(rank))
            );
            fs::metadata(staging.join("blocks").join(name))
                .unwrap()
                .modified()
                .unwrap()
        })
        .collect();
    let umount = mounted.umount();
    assert!(
        umount.status.success(),
        "umount of a dead view: {}",
        stderr(&umount)
    );
    assert!(!rechunkfs::fuse::session::is_mounted(&view));

    let remounted = MountedView::mount(mounted.args.clone(), 0);
    std::mem::forget(mounted);
    assert!(common::json_u64(&remounted.status(), "blocks_resumed") >= before.len() as u64);
    remounted.wait_complete();
    check_every_file(&view, &array, &block, BlockFormat::Hdf5, ">u2");
    let after = journal_ranks(&staging);
    let mut unique = after.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), after.len(), "no block recorded twice");
    assert_eq!(unique.len() as u64, total);
    for (rank, then) in before.iter().zip(times_before) {
        let name = format!(
            "{}.h5",
            grid_name(&Partition::regular(&array, &block).unravel(*rank))
        );
        let now = fs::metadata(staging.join("blocks").join(name))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(
            now, then,
            "block {rank}, complete before the kill, was rewritten"
        );
    }
}

#[test]
fn unmount_with_parked_readers_errors_them_promptly_and_frees_the_mount_point() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [40u64, 40, 40];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[10, 10, 10],
        dtype("u1"),
        BlockFormat::Npy,
    );
    let mounted = mount_under(root.path(), &input, ("8,8,8", "npy"), 200, &["--in-order"]);
    let waiting = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| mounted.wait());
        park_three_readers_and_unmount(&mounted);
        waiter.join().expect("status --wait thread")
    });
    // status --wait saw the view stop before it was complete.
    assert!(!waiting.status.success());
}

/// Parks three reads of pending blocks, unmounts, and checks each read
/// fails and the mount point is free again.
fn park_three_readers_and_unmount(mounted: &MountedView) {
    let (tx, rx) = mpsc::channel();
    for k in 0..3 {
        let path = mounted.view.join(format!("4_4_{k}.npy"));
        let tx = tx.clone();
        std::thread::spawn(move || {
            let result = fs::read(&path);
            tx.send(result.map(|b| b.len())).unwrap();
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::json_u64(&mounted.status(), "waiting_reads") < 3 {
        assert!(
            Instant::now() < deadline,
            "readers did not park: {}",
            mounted.status()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let umount = mounted.umount();
    assert!(umount.status.success(), "{}", stderr(&umount));
    for _ in 0..3 {
        let result = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a parked reader hung after unmount");
        assert!(
            result.is_err(),
            "a parked read of a pending block must fail, got {result:?}"
        );
    }
    assert!(!rechunkfs::fuse::session::is_mounted(&mounted.view));
    assert_eq!(
        fs::read_dir(&mounted.view).unwrap().count(),
        0,
        "the mount point is free and empty again"
    );
}

#[test]
fn every_write_path_is_refused_with_erofs() {
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
    let mounted = mount_under(root.path(), &input, ("4,4", "npy"), 0, &[]);
    let view = &mounted.view;
    let block = view.join("0_0.npy");
    let erofs = |result: std::io::Result<()>, what: &str| {
        let error = result.expect_err(what);
        assert_eq!(error.raw_os_error(), Some(libc::EROFS), "{what}: {error}");
    };
    erofs(fs::write(view.join("new.npy"), b"x").map(|_| ()), "create");
    erofs(
        fs::OpenOptions::new().write(true).open(&block).map(|_| ()),
        "open for writing",
    );
    erofs(
        fs::OpenOptions::new().append(true).open(&block).map(|_| ()),
        "append",
    );
    erofs(
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .truncate(true)
            .open(&block)
            .map(|_| ()),
        "truncate",
    );
    erofs(fs::rename(&block, view.join("moved.npy")), "rename");
    erofs(fs::remove_file(&block), "unlink");
    erofs(fs::create_dir(view.join("d")), "mkdir");
    erofs(
        std::os::unix::fs::symlink("0_0.npy", view.join("link")),
        "symlink",
    );
    erofs(
        fs::set_permissions(&block, std::os::unix::fs::PermissionsExt::from_mode(0o644)),
        "chmod",
    );
    let truncate = Command::new("truncate")
        .args(["-s", "0", block.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!truncate.status.success());
    assert!(
        stderr(&truncate).contains("Read-only file system"),
        "{}",
        stderr(&truncate)
    );
}

#[test]
fn mount_point_and_input_refusals_say_what_is_wrong() {
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
    let attempt = |view: &Path, input: &Path| -> String {
        let output = run(
            &[
                "mount",
                input.to_str().unwrap(),
                view.to_str().unwrap(),
                "--shape",
                "4,4",
                "--staging",
                staging.to_str().unwrap(),
            ],
            0,
        );
        assert!(
            !output.status.success(),
            "mount on {} should be refused",
            view.display()
        );
        stderr(&output)
    };
    assert!(attempt(&root.path().join("missing"), &input).contains("does not exist"));
    let file = root.path().join("file");
    fs::write(&file, b"x").unwrap();
    assert!(attempt(&file, &input).contains("is not a directory"));
    let full = root.path().join("full");
    fs::create_dir(&full).unwrap();
    fs::write(full.join("x"), b"x").unwrap();
    assert!(attempt(&full, &input).contains("is not empty"));
    let mounted = mount_at(
        &input,
        (&root.path().join("view"), &staging),
        ("4,4", "npy"),
        0,
        &[],
    );
    assert!(attempt(&mounted.view, &input).contains("already a mount point"));
    let broken = root.path().join("broken");
    fs::create_dir(&broken).unwrap();
    fs::copy(input.join("0_0.npy"), broken.join("0_0.npy")).unwrap();
    fs::copy(input.join("1_1.npy"), broken.join("1_1.npy")).unwrap();
    let empty_view = root.path().join("empty-view");
    fs::create_dir(&empty_view).unwrap();
    assert!(attempt(&empty_view, &broken).contains("block 0_1 is missing"));
    assert!(!rechunkfs::fuse::session::is_mounted(&empty_view));
}

#[test]
fn a_bad_block_the_materialiser_reaches_fails_the_view_and_status_says_why() {
    require!(Fuse);
    // 13³ in 3³ blocks: 2_1_2's header is checked when the materialiser
    // first reads it (rechunkfs::input::HeaderChecks), not at the mount.
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &[13, 13, 13],
        &[3, 3, 3],
        dtype("u16"),
        BlockFormat::Npy,
    );
    let region = rechunkfs::array::geometry::Region::new(vec![6, 3, 6], vec![3, 2, 3]);
    rechunkfs::cli::sample::write_block_file(
        &input.join("2_1_2.npy"),
        &[13, 13, 13],
        &region,
        dtype("u16"),
        BlockFormat::Npy,
        "/data",
    )
    .unwrap();
    let mounted = mount_under(root.path(), &input, ("4,4,4", "npy"), 0, &[]);
    let output = mounted.wait();
    assert!(!output.status.success(), "status --wait must fail");
    let message = stderr(&output);
    for part in ["failed", "2_1_2.npy", "does not fit its position 2_1_2"] {
        assert!(message.contains(part), "'{part}' missing: {message}");
    }
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["state"], "failed");
    // A block the plan never reached is an error to read, not a hang.
    let far = mounted.view.join("3_3_3.npy");
    assert!(
        fs::read(&far).is_err(),
        "reading a block never made must fail"
    );
}

#[test]
fn a_changed_input_is_refused_until_rebuild() {
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
    let view = root.path().join("view");
    {
        let mounted = mount_at(&input, (&view, &staging), ("4,4", "npy"), 0, &[]);
        mounted.wait_complete();
    }
    // Rewrite one input block with other content of the same shape.
    let region = rechunkfs::array::geometry::Region::new(vec![0, 0], vec![5, 5]);
    std::thread::sleep(Duration::from_millis(20));
    rechunkfs::cli::sample::write_block_file(
        &input.join("0_0.npy"),
        &[11, 10],
        &region,
        dtype("u1"),
        BlockFormat::Npy,
        "/data",
    )
    .unwrap();
    let args = [
        "mount",
        input.to_str().unwrap(),
        view.to_str().unwrap(),
        "--shape",
        "4,4",
        "--staging",
        staging.to_str().unwrap(),
    ];
    let refused = run(&args, 0);
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert!(
        message.contains("input file 0_0.npy was modified") && message.contains("--rebuild"),
        "{message}"
    );
    let mut rebuild: Vec<&str> = args.to_vec();
    rebuild.push("--rebuild");
    let output = run(&rebuild, 0);
    assert!(output.status.success(), "{}", stderr(&output));
    let remounted = MountedView::adopt(view.clone());
    assert_eq!(remounted.status()["blocks_resumed"], 0);
}

#[test]
fn opening_a_pending_block_to_learn_its_shape_never_waits() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    for format in [BlockFormat::Hdf5, BlockFormat::Npy] {
        let base = root.path().join(format.extension());
        let input = make_blocks(
            &base,
            "in",
            &[60, 60, 60],
            &[20, 20, 20],
            dtype("<u2"),
            BlockFormat::Hdf5,
        );
        let mounted = mount_under(&base, &input, ("30,30,30", format.extension()), 400, &[]);
        let path = mounted.view.join(format!("1_1_1.{}", format.extension()));
        assert_eq!(xattr_state(&path), "pending");
        // The usual readers learn shape and dtype from the header alone;
        // the block must still be pending afterwards, so nothing waited for it.
        let script = match format {
            BlockFormat::Hdf5 => "import h5py,sys\nwith h5py.File(sys.argv[1]) as f: print(f['data'].shape, f['data'].dtype)",
            _ => "import numpy,sys\nm=numpy.load(sys.argv[1], mmap_mode='r'); print(m.shape, m.dtype)",
        };
        let output = Command::new(python())
            .args(["-c", script, path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "(30, 30, 30) uint16"
        );
        assert_eq!(
            xattr_state(&path),
            "pending",
            "learning the shape of {format:?} waited for the data"
        );
    }
}

#[test]
fn a_reader_of_a_far_block_is_served_ahead_of_the_plan() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let array = [48u64, 40, 36];
    let block = [12u64, 10, 9];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[8, 20, 12],
        dtype("<u2"),
        BlockFormat::Hdf5,
    );
    // Slow enough that the plan cannot reach the last block for seconds.
    let mounted = mount_under(root.path(), &input, ("12,10,9", "h5"), 300, &[]);
    let grid = Partition::regular(&array, &block);
    let last_index: Vec<usize> = grid.grid_shape().iter().map(|n| n - 1).collect();
    let last = mounted.view.join(format!("{}.h5", grid_name(&last_index)));
    assert_eq!(xattr_state(&last), "pending");
    let bytes = fs::read(&last).unwrap();
    let last_index: Vec<u64> = last_index.iter().map(|&i| i as u64).collect();
    let last_block = grid_block(&array, &block, &last_index);
    assert_eq!(
        bytes,
        common::verified_block_file(&last, &array, &last_block, dtype("<u2"), BlockFormat::Hdf5)
    );
    let status = mounted.status();
    assert_eq!(status["on_demand_blocks"], 1, "{status}");
    assert_eq!(
        status["state"], "materialising",
        "served while the plan still runs: {status}"
    );
    // A block in the middle: among its inputs is 3_1_1, whose header no
    // one read at the mount (rechunkfs::input::HeaderChecks); extracting
    // the block checks it.
    let middle = mounted.view.join("2_2_2.h5");
    assert_eq!(xattr_state(&middle), "pending");
    let middle_bytes = fs::read(&middle).unwrap();
    let middle_block = grid_block(&array, &block, &[2, 2, 2]);
    assert_eq!(
        middle_bytes,
        common::verified_block_file(
            &middle,
            &array,
            &middle_block,
            dtype("<u2"),
            BlockFormat::Hdf5
        )
    );
    assert_eq!(mounted.status()["on_demand_blocks"], 2);
    mounted.wait_complete();
    check_every_file(&mounted.view, &array, &block, BlockFormat::Hdf5, "<u2");
    let status = mounted.status();
    assert!(
        common::json_u64(&status, "seeks_made") < common::json_u64(&status, "seeks_planned"),
        "the plan skipped the extracted block"
    );
}

#[test]
fn a_reader_sweeping_the_view_is_read_ahead_and_a_viewer_is_not() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    // 2 × 2 × 12 blocks: in name order 0_0_10 comes before 0_0_2.
    let array = [4u64, 4, 60];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[3, 4, 7],
        dtype("<u2"),
        BlockFormat::Hdf5,
    );
    let mounted = mount_under(root.path(), &input, ("2,2,5", "h5"), 0, &[]);
    mounted.wait_complete();
    let grid = Partition::regular(&array, &[2, 2, 5]);
    let blocks = common::oracle::grid_blocks(&array, &[2, 2, 5]);
    let check = |rank: u64| {
        let block = &blocks[rank as usize];
        let path = mounted.view.join(format!("{}.h5", block.stem()));
        common::verified_block_file(&path, &array, block, dtype("<u2"), BlockFormat::Hdf5);
    };
    // A tiled viewer: no two blocks in a row are neighbours in grid or name order.
    for rank in [0, 24, 5, 40, 13, 31, 20] {
        check(rank);
    }
    assert_eq!(mounted.status()["read_ahead_blocks"], 0);

    // `ls | sort` order: after the first two, every block is read ahead.
    let mut ranks: Vec<u64> = (0..grid.count()).collect();
    ranks.sort_by_key(|&rank| grid_name(&grid.unravel(rank)));
    assert_eq!(ranks[..4], [0, 1, 10, 11]);
    for &rank in &ranks {
        check(rank);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while mounted.status()["read_ahead_blocks"] != grid.count() - 2 {
        assert!(
            Instant::now() < deadline,
            "read ahead: {}",
            mounted.status()["read_ahead_blocks"]
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The bytes an npy view file of the source's block `region` must hold:
/// its header, read at once even while the block is pending and checked
/// by the npy reader, then the oracle's data.
fn expected_npy_file(
    path: &Path,
    array: &[u64],
    region: &common::oracle::GridBlock,
    dt: &str,
) -> Vec<u8> {
    let mut file = fs::File::open(path).unwrap();
    let mut head = vec![0u8; 12];
    file.read_exact(&mut head).unwrap();
    let header_len = u16::from_le_bytes([head[8], head[9]]) as usize;
    let mut header = vec![0u8; 10 + header_len];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut header).unwrap();
    let parsed =
        common::readers::npy_header(&header).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(parsed.shape, region.shape, "{}", path.display());
    assert_eq!(parsed.descr, dt, "{}", path.display());
    let elem = dtype(dt).size;
    header.extend(common::oracle::sample_bytes(
        array,
        &region.origin,
        &region.shape,
        elem,
    ));
    header
}

/// `mount` tells the user's terminal nothing but what goes wrong: the
/// view's planning of a pyramid's level 0 is no line there.
#[test]
fn mounting_a_pyramid_prints_no_log_lines() {
    require!(Fuse);
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &[20, 18, 16],
        &[10, 9, 8],
        dtype("<u2"),
        BlockFormat::Hdf5,
    );
    let view = root.path().join("view");
    fs::create_dir_all(&view).unwrap();
    let staging = root.path().join("staging");
    let output = common::run_rechunkfs(
        &[
            "mount",
            input.to_str().unwrap(),
            view.to_str().unwrap(),
            "--staging",
            staging.to_str().unwrap(),
            "--shape",
            "8,8,8",
            "--format",
            "zarr",
            "--levels",
            "2",
        ],
        0,
    );
    // Unmounted when dropped, whatever the asserts find.
    let mounted = MountedView::adopt(view);
    let said = stderr(&output);
    assert!(output.status.success(), "mount failed: {said}");
    assert!(!said.contains("INFO"), "log lines on the terminal:\n{said}");
    mounted.wait_complete();
}
