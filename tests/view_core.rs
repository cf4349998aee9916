//! The view's core driven without mounting: directory, sizes, reads that
//! are served or parked, failure and resume. The executor is stepped by
//! hand (its progress callback waits for the test), so ordering is
//! asserted on states, never on timings.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rechunkfs::engine::Executor;
use rechunkfs::format::BlockFormat;
use rechunkfs::input::{InputAccess, InputArray};
use rechunkfs::plan::{self, Plan, Problem, Strategy};
use rechunkfs::sys::process::Requester;
use rechunkfs::view::materialise::StagingSink;
use rechunkfs::view::staging::{Journal, Manifest, Staging};
use rechunkfs::view::{
    Access, BlockTemplates, CacheMode, ViewCore, ViewLayout, METADATA_INO, ROOT_INO, WAIT_NAME,
};
use rechunkfs::DType;

use common::{dtype, make_blocks, TestRng};

struct Fixture {
    _root: tempfile::TempDir,
    array: Vec<u64>,
    dtype: DType,
    format: BlockFormat,
    input: InputArray,
    plan: Plan,
    staging_dir: std::path::PathBuf,
    manifest: Manifest,
}

fn fixture(
    array: &[u64],
    input_block: &[u64],
    output_block: &[u64],
    format: BlockFormat,
) -> Fixture {
    let root = tempfile::tempdir().unwrap();
    let dtype = dtype("<u2");
    let dir = make_blocks(
        root.path(),
        "in",
        array,
        input_block,
        dtype,
        BlockFormat::Hdf5,
    );
    let input = InputArray::scan(&dir, None).unwrap();
    let problem = Problem::new(
        input.shape.clone(),
        input.block_shape.clone(),
        output_block.to_vec(),
        2,
    )
    .unwrap();
    let output_files = rechunkfs::output::filetree::output_file_shape(format, &problem.output());
    let problem = problem.with_files(input.files.clone(), output_files);
    let plan = plan::plan(&problem, Strategy::Keep, None).unwrap();
    let manifest = Manifest::new(&input, output_block, format);
    Fixture {
        staging_dir: root.path().join("staging"),
        _root: root,
        array: array.to_vec(),
        dtype,
        format,
        input,
        plan,
        manifest,
    }
}

fn open_core(f: &Fixture) -> (Arc<ViewCore>, Vec<u64>) {
    open_core_with(f, |core| core)
}

/// As [`open_core`], the core passed through `build` first.
fn open_core_with(
    f: &Fixture,
    build: impl FnOnce(ViewCore) -> ViewCore,
) -> (Arc<ViewCore>, Vec<u64>) {
    let (staging, done) = Staging::open(&f.staging_dir, &f.manifest, false).unwrap();
    let layout = ViewLayout {
        source: f.input.source.clone(),
        array: f.array.clone(),
        input_block: f.input.block_shape.clone(),
        output_block: f.plan.problem.output_block.clone(),
        output: rechunkfs::output::directory::OutputSpec {
            format: f.format,
            dataset: "/data".into(),
            dtype: f.dtype,
            space: rechunkfs::array::space::Space::identity(f.array.len()),
            axis_order: rechunkfs::array::axes::AxisOrder::C,
            encoding: Default::default(),
            commit_batch_bytes: rechunkfs::output::directory::COMMIT_BATCH_BYTES,
        },
    };
    let templates = BlockTemplates::for_view(&layout, &f.plan.output).unwrap();
    (
        Arc::new(build(ViewCore::new(
            layout,
            &f.plan,
            templates,
            Arc::new(staging),
            &done,
        ))),
        done,
    )
}

fn block_ino(core: &ViewCore, rank: u64) -> u64 {
    core.lookup(ROOT_INO, OsStr::new(&core.block_name(rank)))
        .unwrap()
        .ino
}

/// A read whose reply lands in a channel.
fn read_into(
    core: &ViewCore,
    ino: u64,
    offset: u64,
    size: u32,
) -> mpsc::Receiver<Result<Vec<u8>, i32>> {
    read_handle(core, 0, ino, offset, size)
}

/// Reads `size` bytes at `offset` of `ino` through `handle`; the reply
/// lands in a channel.
fn read_handle(
    core: &ViewCore,
    handle: u64,
    ino: u64,
    offset: u64,
    size: u32,
) -> mpsc::Receiver<Result<Vec<u8>, i32>> {
    let (tx, rx) = mpsc::channel();
    core.read(
        ino,
        handle,
        offset,
        size,
        Box::new(move |result| {
            let _ = tx.send(result);
        }),
    );
    rx
}

/// Opens the wait file: its inode and a handle.
fn open_wait_file(core: &ViewCore) -> (u64, u64) {
    let ino = core.lookup(ROOT_INO, OsStr::new(WAIT_NAME)).unwrap().ino;
    let (handle, mode) = core.open(ino, false).unwrap();
    assert_eq!(mode, CacheMode::Direct);
    (ino, handle)
}

/// The file the view must serve for output block `rank`: the core's
/// header and trailer for its shape around the oracle's data. That file is
/// also read by its format's own reader here, so the header is held to the
/// format, not only to the code that made it.
fn expected(f: &Fixture, core: &ViewCore, rank: u64) -> Vec<u8> {
    let block = &common::oracle::grid_blocks(&f.array, &f.plan.problem.output_block)[rank as usize];
    let template = core.template(rank);
    let mut file = template.prefix.clone();
    file.extend(common::oracle::sample_bytes(
        &f.array,
        &block.origin,
        &block.shape,
        f.dtype.size,
    ));
    file.extend_from_slice(&template.suffix);
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch
        .path()
        .join(format!("{}.{}", block.stem(), f.format.extension()));
    std::fs::write(&path, &file).unwrap();
    common::verified_block_file(&path, &f.array, block, f.dtype, f.format);
    file
}

/// Runs the executor on its own thread, one read block per token sent;
/// dropping the sender lets it run freely, setting `cancel` stops it.
fn stepped_run_cancellable(
    f: &Fixture,
    core: Arc<ViewCore>,
    cancel: Arc<AtomicBool>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    stepped_run_with(f, core, cancel, false)
}

/// As [`stepped_run_cancellable`]; with `on_demand`, waited-for blocks are
/// extracted beside the plan.
fn stepped_run_with(
    f: &Fixture,
    core: Arc<ViewCore>,
    cancel: Arc<AtomicBool>,
    on_demand: bool,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (go, _reached, handle) = stepped_run_observed(f, core, cancel, on_demand);
    (go, handle)
}

/// As [`stepped_run_with`], and says on `reached` each time the run stops
/// between read blocks.
fn stepped_run_observed(
    f: &Fixture,
    core: Arc<ViewCore>,
    cancel: Arc<AtomicBool>,
    on_demand: bool,
) -> (
    mpsc::Sender<()>,
    mpsc::Receiver<()>,
    std::thread::JoinHandle<()>,
) {
    let (reached_tx, reached) = mpsc::channel::<()>();
    let (go, wait) = mpsc::channel::<()>();
    let plan = f.plan.clone();
    let input = f.input.clone();
    let handle = std::thread::spawn(move || {
        let mut sink = StagingSink::new(core.clone());
        let extractor =
            on_demand.then(|| sink.start_extractor(input.clone(), cancel.clone()).unwrap());
        let result = Executor::new(&plan, &input)
            .with_cancel(&cancel)
            .with_witness(core.staging().as_ref())
            .run(&mut sink, |_| {
                let _ = reached_tx.send(());
                let _ = wait.recv();
            });
        drop(extractor);
        // Completed blocks become durable (journaled) in batches; the end
        // of a run, stopped or not, closes the last batch.
        sink.flush().unwrap();
        match result {
            Ok(stats) => core.finish(&stats),
            Err(rechunkfs::Error::Cancelled) => {}
            Err(e) => panic!("executor failed: {e}"),
        }
    });
    (go, reached, handle)
}

/// Starts a stepped run and lets it read one block at a time until output
/// block `rank` is done. Each step waits for the run to stop again before
/// looking, so it goes at most a read block or two past that point, however
/// slow the writer is: steps sent blindly would queue up and could finish
/// the whole run.
fn stepped_run_until_done(
    f: &Fixture,
    core: &Arc<ViewCore>,
    rank: u64,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (go, reached, runner) =
        stepped_run_observed(f, core.clone(), Arc::new(AtomicBool::new(false)), false);
    loop {
        let stopped = reached.recv_timeout(Duration::from_secs(30));
        if core.is_done(rank) {
            return (go, runner);
        }
        assert!(stopped.is_ok(), "block {rank} not done and the run stopped");
        go.send(()).unwrap();
    }
}

fn stepped_run(
    f: &Fixture,
    core: Arc<ViewCore>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    stepped_run_cancellable(f, core, Arc::new(AtomicBool::new(false)))
}

#[test]
fn directory_names_and_sizes_are_exact_from_the_start() {
    let f = fixture(&[30, 25, 20], &[7, 9, 6], &[8, 10, 20], BlockFormat::Hdf5);
    let (core, _) = open_core(&f);
    let names: Vec<String> = core
        .readdir(ROOT_INO, 0)
        .unwrap()
        .map(|(_, e)| e.name)
        .collect();
    assert_eq!(
        &names[..4],
        &[".", "..", "rechunkfs.json", ".rechunkfs-status.json"]
    );
    assert_eq!(names.len() as u64, 4 + core.output().count());
    // Resuming a listing from an offset continues where it left off.
    let tail: Vec<String> = core
        .readdir(ROOT_INO, 10)
        .unwrap()
        .map(|(_, e)| e.name)
        .collect();
    assert_eq!(tail, names[10..]);
    for rank in 0..core.output().count() {
        let attr = core
            .lookup(ROOT_INO, OsStr::new(&core.block_name(rank)))
            .unwrap();
        assert_eq!(
            attr.size,
            expected(&f, &core, rank).len() as u64,
            "size of {}",
            core.block_name(rank)
        );
    }
    for bad in ["4_0_0.h5", "0_0.h5", "0_0_0.npy", "00_0_0.h5", "x", "0_0_0"] {
        assert_eq!(
            core.lookup(ROOT_INO, OsStr::new(bad)),
            Err(libc::ENOENT),
            "{bad}"
        );
    }
    let meta = read_into(&core, METADATA_INO, 0, 1 << 20)
        .recv()
        .unwrap()
        .unwrap();
    let meta: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    assert_eq!(meta["array_shape"], serde_json::json!([30, 25, 20]));
    assert_eq!(meta["grid_shape"], serde_json::json!([4, 3, 1]));
    assert_eq!(core.open(block_ino(&core, 0), true), Err(libc::EROFS));
    assert_eq!(
        core.open(block_ino(&core, 0), false).unwrap().1,
        CacheMode::KeepCache
    );
}

#[test]
fn a_pending_read_waits_for_its_block_while_done_blocks_are_served() {
    let f = fixture(&[24, 20, 18], &[6, 5, 9], &[8, 10, 6], BlockFormat::Hdf5);
    let (core, _) = open_core(&f);
    let last = core.output().count() - 1;
    let last_ino = block_ino(&core, last);
    let template_len = core.template(last).data_offset;

    // Header bytes of a pending block come at once.
    let header = read_into(&core, last_ino, 0, template_len as u32)
        .try_recv()
        .unwrap()
        .unwrap();
    assert_eq!(header, expected(&f, &core, last)[..template_len as usize]);

    // A read spanning header and data parks.
    let parked = read_into(&core, last_ino, 100, (template_len + 500) as u32);
    assert!(
        parked.try_recv().is_err(),
        "a pending block's data cannot be served yet"
    );

    let (go, runner) = stepped_run_until_done(&f, &core, 0);
    // Block 0 is done, the last one is not: reading block 0 is answered
    // during the read call itself, while the other read stays parked.
    assert!(!core.is_done(last));
    let first = read_into(&core, block_ino(&core, 0), 0, 1 << 20).try_recv();
    assert_eq!(first.unwrap().unwrap(), expected(&f, &core, 0));
    assert!(
        parked.try_recv().is_err(),
        "still parked while its block is pending"
    );
    assert_eq!(core.status().waiting_reads, 1);

    while !core.is_done(last) {
        if go.send(()).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(go);
    runner.join().unwrap();
    let answered = parked
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    let whole = expected(&f, &core, last);
    assert_eq!(answered, whole[100..(100 + template_len + 500) as usize]);
    assert_eq!(core.status().state, "complete");
}

#[test]
fn every_byte_of_every_file_at_random_offsets_including_past_the_end() {
    for format in [BlockFormat::Hdf5, BlockFormat::Npy] {
        let f = fixture(&[23, 19, 17], &[6, 5, 7], &[8, 7, 5], format);
        let (core, _) = open_core(&f);
        let (go, runner) = stepped_run(&f, core.clone());
        drop(go); // run freely
        runner.join().unwrap();
        let mut rng = TestRng(7);
        for rank in 0..core.output().count() {
            let whole = expected(&f, &core, rank);
            let ino = block_ino(&core, rank);
            assert_eq!(
                read_into(&core, ino, 0, 1 << 20).recv().unwrap().unwrap(),
                whole
            );
            for _ in 0..20 {
                let offset = rng.below(whole.len() as u64 + 100);
                let size = rng.below(9000) as u32 + 1;
                let got = read_into(&core, ino, offset, size).recv().unwrap().unwrap();
                let start = (offset as usize).min(whole.len());
                let end = (offset as usize + size as usize).min(whole.len());
                assert_eq!(
                    got,
                    whole[start..end],
                    "{} at {offset}+{size}",
                    core.block_name(rank)
                );
            }
        }
    }
}

#[test]
fn a_failed_materialiser_fails_pending_reads_and_keeps_done_blocks() {
    let f = fixture(&[24, 20, 18], &[6, 5, 9], &[8, 10, 6], BlockFormat::Npy);
    let (core, _) = open_core(&f);
    let last = core.output().count() - 1;
    let parked = read_into(&core, block_ino(&core, last), 0, 1 << 20);
    let (go, runner) = stepped_run_until_done(&f, &core, 0);
    core.fail("input vanished: test".into());
    assert_eq!(
        parked.recv_timeout(Duration::from_secs(5)).unwrap(),
        Err(libc::EIO)
    );
    assert_eq!(
        read_into(&core, block_ino(&core, last), 0, 1 << 20)
            .recv()
            .unwrap(),
        Err(libc::EIO)
    );
    assert_eq!(
        read_into(&core, block_ino(&core, 0), 0, 1 << 20)
            .recv()
            .unwrap()
            .unwrap(),
        expected(&f, &core, 0)
    );
    let status = core.status();
    assert_eq!(status.state, "failed");
    assert_eq!(status.error.as_deref(), Some("input vanished: test"));
    assert_eq!(
        core.getxattr(block_ino(&core, last), OsStr::new("user.rechunkfs.state"))
            .unwrap(),
        b"failed"
    );
    drop(go);
    runner.join().unwrap();
}

#[test]
fn a_panic_on_the_materialiser_fails_the_view_and_its_parked_reads() {
    let f = fixture(&[24, 20, 18], &[6, 5, 9], &[8, 10, 6], BlockFormat::Npy);
    // The materialiser's first progress waits for the test, then panics.
    let (go, wait) = mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let (core, _) = open_core_with(&f, |core| {
        core.with_progress_observer(move |_| {
            let _ = wait.lock().unwrap().recv();
            panic!("injected for a test");
        })
    });
    let last = core.output().count() - 1;
    let parked = read_into(&core, block_ino(&core, last), 0, 1 << 20);
    let materialiser = rechunkfs::view::materialise::Materialiser::start(
        core.clone(),
        f.input.clone(),
        f.plan.clone(),
        false,
    )
    .unwrap();
    go.send(()).unwrap();
    assert_eq!(
        parked
            .recv_timeout(Duration::from_secs(10))
            .expect("the parked read: still unanswered 10 s after the materialiser panicked"),
        Err(libc::EIO)
    );
    let status = core.status();
    assert_eq!(status.state, "failed");
    let error = status.error.unwrap_or_default();
    assert!(
        error.contains("the view's materialiser thread panicked (injected for a test)"),
        "{error}"
    );
    assert_eq!(
        read_into(&core, block_ino(&core, last), 0, 1 << 20)
            .recv_timeout(Duration::from_secs(10))
            .unwrap(),
        Err(libc::EIO)
    );
    // A wait for the end is answered at once.
    let wait_ino = core.lookup(ROOT_INO, OsStr::new(WAIT_NAME)).unwrap().ino;
    let waited = read_into(&core, wait_ino, 0, 1 << 20)
        .recv_timeout(Duration::from_secs(10))
        .expect("the wait file: unanswered after the panic")
        .unwrap();
    let waited: serde_json::Value = serde_json::from_slice(&waited).unwrap();
    assert_eq!(waited["state"], "failed");
    assert!(materialiser.stop(Duration::from_secs(5)));
}

#[test]
fn shutdown_answers_parked_reads_with_an_error() {
    let f = fixture(&[12, 12], &[5, 5], &[4, 4], BlockFormat::Npy);
    let (core, _) = open_core(&f);
    let parked: Vec<_> = (0..5)
        .map(|_| read_into(&core, block_ino(&core, 3), 0, 1 << 20))
        .collect();
    core.shutdown();
    for reply in parked {
        assert_eq!(
            reply.recv_timeout(Duration::from_secs(5)).unwrap(),
            Err(libc::EIO)
        );
    }
}

/// Reads `size` bytes at `offset` of `ino` for thread `requester`; the
/// reply lands in a channel.
fn read_by(
    core: &ViewCore,
    requester: u32,
    ino: u64,
    offset: u64,
    size: u32,
) -> mpsc::Receiver<Result<Vec<u8>, i32>> {
    let (tx, rx) = mpsc::channel();
    core.read_by(
        requester,
        ino,
        0,
        offset,
        size,
        Box::new(move |result| {
            let _ = tx.send(result);
        }),
    );
    rx
}

#[test]
fn parked_reads_of_readers_interrupted_or_gone_end_with_eintr_and_are_forgotten() {
    let f = fixture(&[12, 12], &[5, 5], &[4, 4], BlockFormat::Npy);
    let (core, _) = open_core(&f);
    let (gone, interrupted, waiting) = (1001, 1002, 1003);
    let killed = read_by(&core, gone, block_ino(&core, 3), 0, 1 << 20);
    let left = read_by(&core, waiting, block_ino(&core, 5), 0, 1 << 20);
    let (wait_ino, handle) = open_wait_file(&core);
    let (tx, stopped_waiting) = mpsc::channel();
    core.read_by(
        interrupted,
        wait_ino,
        handle,
        0,
        1 << 20,
        Box::new(move |result| {
            let _ = tx.send(result);
        }),
    );
    assert_eq!(core.status().waiting_reads, 2);
    assert_eq!(core.parked_requesters(), vec![gone, interrupted, waiting]);
    let ended = core.interrupt_requesters(|requester| match requester {
        1001 => Requester::Gone,
        1002 => Requester::Interrupted,
        _ => Requester::Waiting,
    });
    assert_eq!(ended, 2);
    assert_eq!(
        killed.recv_timeout(Duration::from_secs(5)).unwrap(),
        Err(libc::EINTR)
    );
    assert_eq!(
        stopped_waiting
            .recv_timeout(Duration::from_secs(5))
            .unwrap(),
        Err(libc::EINTR)
    );
    assert_eq!(
        core.status().waiting_reads,
        1,
        "status counts the reader left"
    );
    assert_eq!(core.parked_requesters(), vec![waiting]);
    // Nobody waits for block 3 any more: it is left to the plan.
    assert_eq!(core.take_urgent(), vec![5]);
    assert!(left.try_recv().is_err(), "the waiting reader still waits");
    core.shutdown();
    assert_eq!(
        left.recv_timeout(Duration::from_secs(5)).unwrap(),
        Err(libc::EIO)
    );
}

#[test]
fn view_files_carry_the_access_of_the_inputs() {
    let f = fixture(&[12, 12], &[5, 5], &[4, 4], BlockFormat::Npy);
    let (core, _) = open_core(&f);
    let everyone = core.getattr(block_ino(&core, 0)).unwrap();
    assert_eq!(everyone.perm, 0o444, "inputs' access unknown: as before");
    drop(core);
    // Inputs of one owner, two groups, read bits 0o640 & 0o644.
    let inputs = InputAccess {
        mode: 0o100640,
        uid: Some(4321),
        gid: None,
    };
    let access = Access::of_inputs(&inputs);
    assert_eq!((access.uid, access.read), (4321, 0o400), "no group read");
    assert_eq!(access.gid, nix::unistd::getgid().as_raw());
    let (core, _) = open_core(&f);
    let core = Arc::into_inner(core).unwrap().with_access(access);
    let file = core.getattr(block_ino(&core, 0)).unwrap();
    assert_eq!((file.perm, file.uid, file.gid), (0o400, 4321, access.gid));
    assert_eq!(core.getattr(ROOT_INO).unwrap().perm, 0o500);
    assert_eq!(core.getattr(METADATA_INO).unwrap().perm, 0o400);
}

#[test]
fn the_wait_file_is_answered_when_every_block_is_done() {
    let f = fixture(&[24, 20, 18], &[6, 5, 9], &[8, 10, 6], BlockFormat::Npy);
    let (core, _) = open_core(&f);
    let (ino, handle) = open_wait_file(&core);
    // Read in two parts through one handle, as a reader with a small
    // buffer would: both parts must come from the same snapshot.
    let head = read_handle(&core, handle, ino, 0, 40);
    let (go, runner) = stepped_run_until_done(&f, &core, 0);
    assert!(
        head.try_recv().is_err(),
        "the wait must not end while blocks are pending"
    );
    drop(go);
    runner.join().unwrap();
    let mut bytes = head.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(bytes.len(), 40);
    let tail = read_handle(&core, handle, ino, 40, 1 << 20)
        .try_recv()
        .unwrap()
        .unwrap();
    bytes.extend(tail);
    let status: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status["state"], "complete");
    assert_eq!(status["blocks_done"], core.output().count());
    core.release(handle);
    // Once complete, a new wait is answered at once.
    let (ino, handle) = open_wait_file(&core);
    let again = read_handle(&core, handle, ino, 0, 1 << 20)
        .try_recv()
        .unwrap()
        .unwrap();
    let again: serde_json::Value = serde_json::from_slice(&again).unwrap();
    assert_eq!(again["state"], "complete");
    // It is not listed: a tool copying the view must not wait on it.
    assert!(core
        .readdir(ROOT_INO, 0)
        .unwrap()
        .all(|(_, entry)| entry.name != WAIT_NAME));
}

#[test]
fn the_wait_file_says_why_when_the_view_fails_or_stops() {
    let f = fixture(&[12, 12], &[5, 5], &[4, 4], BlockFormat::Npy);
    let (core, _) = open_core(&f);
    let (ino, handle) = open_wait_file(&core);
    let waiting = read_handle(&core, handle, ino, 0, 1 << 20);
    core.fail("input vanished: test".into());
    let status = waiting
        .recv_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["state"], "failed");
    assert_eq!(status["error"], "input vanished: test");
    // One view at a time holds a staging area (its lock).
    drop(core);

    let (core, _) = open_core(&f);
    let (ino, handle) = open_wait_file(&core);
    let waiting = read_handle(&core, handle, ino, 0, 1 << 20);
    core.shutdown();
    let status = waiting
        .recv_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["state"], "stopping");
}

#[test]
fn status_wait_polls_a_daemon_that_serves_no_wait_file() {
    // What a daemon of an earlier version shows: the status file only.
    let f = fixture(&[12, 12], &[5, 5], &[4, 4], BlockFormat::Npy);
    let (core, _) = open_core(&f);
    let old_view = tempfile::tempdir().unwrap();
    let status_path = old_view.path().join(rechunkfs::view::STATUS_NAME);
    let mut status = core.status();
    assert_eq!(status.state, "materialising");
    std::fs::write(&status_path, serde_json::to_vec(&status).unwrap()).unwrap();
    let first_read = ReadWatch::new(&status_path);
    let view = old_view.path().to_path_buf();
    let waiter = std::thread::spawn(move || rechunkfs::fuse::session::wait_status(&view));
    // The waiter has read "materialising" once; it must poll again.
    first_read.wait();
    status.state = "complete".into();
    // Replaced whole, as a poll must never see half a file.
    let next = old_view.path().join("next.json");
    std::fs::write(&next, serde_json::to_vec(&status).unwrap()).unwrap();
    std::fs::rename(&next, &status_path).unwrap();
    let waited = waiter.join().unwrap().unwrap();
    assert_eq!(waited.state, "complete", "returned while materialising");
}

/// Sees, through inotify, a file opened for reading being closed: a
/// reader has read it.
struct ReadWatch {
    fd: std::os::fd::OwnedFd,
}

impl ReadWatch {
    fn new(path: &Path) -> ReadWatch {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(raw >= 0, "inotify: {}", std::io::Error::last_os_error());
        // SAFETY: `raw` is a new descriptor owned by nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        let watch = unsafe { libc::inotify_add_watch(raw, name.as_ptr(), libc::IN_CLOSE_NOWRITE) };
        assert!(
            watch >= 0,
            "inotify watch: {}",
            std::io::Error::last_os_error()
        );
        ReadWatch { fd }
    }

    /// Blocks until the watched file has been read and closed once.
    fn wait(&self) {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, 10_000) };
        assert_eq!(ready, 1, "no read of the status file within 10 s");
    }
}

fn journal_ranks(dir: &Path) -> Vec<u64> {
    Journal::read(dir).unwrap().done
}

/// Every prefix of the journal (what a crash can leave) records each
/// input file a completed block was made from before that block, so a
/// remount checks every input the block depends on.
fn assert_blocks_journaled_after_their_inputs(f: &Fixture, core: &ViewCore) {
    let bytes = std::fs::read(f.staging_dir.join("done.journal")).unwrap();
    let prefix_dir = tempfile::tempdir().unwrap();
    let inputs = f.input.grid();
    for len in (0..=bytes.len()).step_by(8) {
        std::fs::write(prefix_dir.path().join("done.journal"), &bytes[..len]).unwrap();
        let journal = Journal::read(prefix_dir.path()).unwrap();
        let read: std::collections::HashSet<u64> =
            journal.inputs_read.iter().map(|&(rank, _)| rank).collect();
        for &rank in &journal.done {
            let region = core.output().block(&core.output().unravel(rank));
            for index in rechunkfs::array::geometry::IndexBox::new(inputs.overlapping(&region)) {
                let input = inputs.linear(&index);
                assert!(
                    read.contains(&input),
                    "block {} recorded before its input {} ({len} journal bytes)",
                    core.block_name(rank),
                    input
                );
            }
        }
    }
    // And the identities are the files' own.
    for (rank, identity) in Journal::read(&f.staging_dir).unwrap().inputs_read {
        assert_eq!(identity, f.input.blocks[rank as usize].identity().unwrap());
    }
}

#[test]
fn resume_keeps_completed_blocks_and_redoes_only_the_rest() {
    let f = fixture(&[30, 28, 26], &[10, 7, 13], &[12, 9, 8], BlockFormat::Hdf5);
    let (core, _) = open_core(&f);
    let cancel = Arc::new(AtomicBool::new(false));
    let (go, runner) = stepped_run_cancellable(&f, core.clone(), cancel.clone());
    for _ in 0..f.plan.read.count() / 2 {
        go.send(()).unwrap();
    }
    while core.status().blocks_done == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Abandon the run half way, as a crash would.
    cancel.store(true, Ordering::Relaxed);
    drop(go);
    runner.join().unwrap();
    let done_before = journal_ranks(&f.staging_dir);
    assert_blocks_journaled_after_their_inputs(&f, &core);
    assert!(
        !done_before.is_empty() && (done_before.len() as u64) < core.output().count(),
        "{} of {} done when abandoned",
        done_before.len(),
        core.output().count()
    );
    let times_before: Vec<_> = done_before
        .iter()
        .map(|&r| {
            std::fs::metadata(core.staged_path(r))
                .unwrap()
                .modified()
                .unwrap()
        })
        .collect();
    drop(core);

    let (core, done) = open_core(&f);
    assert!(done.len() >= done_before.len());
    assert_eq!(core.status().blocks_resumed, done.len() as u64);
    let (go, runner) = stepped_run(&f, core.clone());
    drop(go);
    runner.join().unwrap();
    let journal = journal_ranks(&f.staging_dir);
    let mut unique = journal.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), journal.len(), "no block was completed twice");
    assert_eq!(unique.len() as u64, core.output().count());
    for (rank, before) in done_before.iter().zip(times_before) {
        let now = std::fs::metadata(core.staged_path(*rank))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(now, before, "a resumed block was rewritten");
    }
    for rank in 0..core.output().count() {
        let got = read_into(&core, block_ino(&core, rank), 0, 1 << 22)
            .recv()
            .unwrap()
            .unwrap();
        assert_eq!(got, expected(&f, &core, rank));
    }
}

#[test]
fn a_waited_for_block_is_extracted_ahead_of_the_plan_and_not_written_twice() {
    let f = fixture(&[30, 28, 26], &[10, 7, 13], &[12, 9, 8], BlockFormat::Hdf5);
    let (core, _) = open_core(&f);
    let last = core.output().count() - 1;
    let (go, reached, runner) =
        stepped_run_observed(&f, core.clone(), Arc::new(AtomicBool::new(false)), true);
    // The plan is held after its first read block, and stays held: the
    // waited-for block is served without waiting for its next step.
    reached.recv_timeout(Duration::from_secs(10)).unwrap();
    let parked = read_into(&core, block_ino(&core, last), 0, 1 << 22);
    let answered = parked
        .recv_timeout(Duration::from_secs(10))
        .expect("the read of a far block waited for the plan's held step")
        .unwrap();
    assert_eq!(answered, expected(&f, &core, last));
    let status = core.status();
    assert_eq!(status.on_demand_blocks, 1);
    assert!(
        status.on_demand_seeks >= 2,
        "extraction reads its inputs and writes once"
    );
    assert!(
        status.blocks_done < core.output().count(),
        "the plan is still running"
    );
    let path = core.staged_path(last);
    let extracted_at = std::fs::metadata(&path).unwrap().modified().unwrap();
    drop(go);
    runner.join().unwrap();
    // The plan skipped it: not rewritten, recorded once, and every block exact.
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        extracted_at
    );
    let journal = journal_ranks(&f.staging_dir);
    let mut unique = journal.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), journal.len(), "no block recorded twice");
    assert_eq!(unique.len() as u64, core.output().count());
    for rank in 0..core.output().count() {
        let got = read_into(&core, block_ino(&core, rank), 0, 1 << 22)
            .recv()
            .unwrap()
            .unwrap();
        assert_eq!(got, expected(&f, &core, rank), "{}", core.block_name(rank));
    }
    // Its write was the plan's only seek on that block (keep writes output
    // blocks whole), so the plan's run made exactly one seek fewer.
    let status = core.status();
    assert_eq!(status.seeks_made + 1, status.seeks_planned);
    assert_blocks_journaled_after_their_inputs(&f, &core);
}

#[test]
fn a_block_extracted_ahead_of_the_plan_is_journaled_after_its_inputs() {
    let f = fixture(&[30, 28, 26], &[10, 7, 13], &[12, 9, 8], BlockFormat::Hdf5);
    let (core, _) = open_core(&f);
    let last = core.output().count() - 1;
    let parked = read_into(&core, block_ino(&core, last), 0, 1 << 22);
    let cancel = Arc::new(AtomicBool::new(false));
    let (go, runner) = stepped_run_with(&f, core.clone(), cancel.clone(), true);
    let answered = parked.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(answered.unwrap(), expected(&f, &core, last));
    // Stopped now, the plan has read only its first read block's inputs:
    // the extracted block's own must have been recorded by the extraction.
    cancel.store(true, Ordering::Relaxed);
    drop(go);
    runner.join().unwrap();
    assert!(journal_ranks(&f.staging_dir).contains(&last));
    assert_blocks_journaled_after_their_inputs(&f, &core);
}

/// The node `path` (components joined by `/`) resolves to from the root.
fn resolve(core: &ViewCore, path: &str) -> Result<rechunkfs::view::NodeAttr, i32> {
    let mut node = core.getattr(ROOT_INO)?;
    for component in path.split('/') {
        node = core.lookup(node.ino, OsStr::new(component))?;
    }
    Ok(node)
}

fn names_in(core: &ViewCore, ino: u64, offset: u64) -> Vec<String> {
    core.readdir(ino, offset)
        .unwrap()
        .map(|(_, e)| e.name)
        .collect()
}

fn read_all(core: &ViewCore, ino: u64) -> Vec<u8> {
    read_into(core, ino, 0, 1 << 20).recv().unwrap().unwrap()
}

fn expected_chunk(f: &Fixture, rank: u64) -> Vec<u8> {
    let chunk = &f.plan.problem.output_block;
    let block = &common::oracle::grid_blocks(&f.array, chunk)[rank as usize];
    let data = common::oracle::sample_bytes(&f.array, &block.origin, &block.shape, f.dtype.size);
    common::oracle::padded(&data, &block.shape, chunk, f.dtype.size)
}

#[test]
fn zarr3_view_nests_chunks_under_c_with_padded_headerless_files() {
    let f = fixture(&[23, 19, 17], &[6, 5, 7], &[8, 7, 5], BlockFormat::Zarr3);
    let (core, _) = open_core(&f);
    assert_eq!(
        names_in(&core, ROOT_INO, 0),
        [
            ".",
            "..",
            "rechunkfs.json",
            "zarr.json",
            ".rechunkfs-status.json",
            "c"
        ]
    );
    let meta = resolve(&core, "zarr.json").unwrap();
    let meta: serde_json::Value = serde_json::from_slice(&read_all(&core, meta.ino)).unwrap();
    assert_eq!(meta["shape"], serde_json::json!([23, 19, 17]));
    assert_eq!(
        meta["chunk_grid"]["configuration"]["chunk_shape"],
        serde_json::json!([8, 7, 5])
    );
    assert_eq!(meta["codecs"][0]["configuration"]["endian"], "little");

    let c = resolve(&core, "c").unwrap();
    assert_eq!(c.kind, rechunkfs::view::NodeKind::Directory);
    assert_eq!(names_in(&core, c.ino, 0), [".", "..", "0", "1", "2"]);
    assert_eq!(names_in(&core, c.ino, 3), ["1", "2"], "a listing resumes");
    let leaf = resolve(&core, "c/2/1").unwrap();
    assert_eq!(leaf.kind, rechunkfs::view::NodeKind::Directory);
    assert_eq!(names_in(&core, leaf.ino, 2), ["0", "1", "2", "3"]);
    let chunk_bytes = 8 * 7 * 5 * 2;
    for rank in 0..core.output().count() {
        let name = core.block_name(rank);
        let node = resolve(&core, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(node.kind, rechunkfs::view::NodeKind::File);
        // Edge chunks too: every chunk file is a whole padded chunk.
        assert_eq!(node.size, chunk_bytes, "{name}");
    }
    for bad in [
        "c/3",
        "c/00",
        "c/0/3",
        "c/0/0/4",
        "c/0/0/0/0",
        "0.0.0",
        "c.0.0.0",
        "d",
    ] {
        assert!(resolve(&core, bad).is_err(), "{bad}");
    }
    let file = resolve(&core, "c/0/0/0").unwrap();
    assert_eq!(core.lookup(file.ino, OsStr::new("x")), Err(libc::ENOTDIR));
    assert_eq!(core.readdir(file.ino, 0).err(), Some(libc::ENOTDIR));

    // No header: even the first bytes of a pending chunk wait for it.
    let last = core.output().count() - 1;
    let last_ino = resolve(&core, &core.block_name(last)).unwrap().ino;
    let parked = read_into(&core, last_ino, 0, 16);
    assert!(parked.try_recv().is_err(), "a pending chunk's bytes wait");
    let (go, runner) = stepped_run(&f, core.clone());
    drop(go);
    runner.join().unwrap();
    assert_eq!(
        parked
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap(),
        expected_chunk(&f, last)[..16]
    );
    let mut rng = TestRng(3);
    for rank in 0..core.output().count() {
        let whole = expected_chunk(&f, rank);
        let ino = resolve(&core, &core.block_name(rank)).unwrap().ino;
        assert_eq!(read_all(&core, ino), whole, "{}", core.block_name(rank));
        let offset = rng.below(whole.len() as u64);
        let size = rng.below(900) as u32 + 1;
        let end = (offset as usize + size as usize).min(whole.len());
        assert_eq!(
            read_into(&core, ino, offset, size).recv().unwrap().unwrap(),
            whole[offset as usize..end]
        );
    }
    // Progress counts array bytes, not padding.
    let status = core.status();
    assert_eq!(status.bytes_done, status.bytes_total);
    assert_eq!(status.bytes_total, 23 * 19 * 17 * 2);
}

#[test]
fn zarr2_view_lists_flat_chunk_names_beside_its_metadata() {
    let f = fixture(&[30, 25, 20], &[7, 9, 6], &[8, 10, 20], BlockFormat::Zarr);
    let (core, _) = open_core(&f);
    let names = names_in(&core, ROOT_INO, 0);
    assert_eq!(
        &names[..5],
        &[
            ".",
            "..",
            "rechunkfs.json",
            ".zarray",
            ".rechunkfs-status.json"
        ]
    );
    assert_eq!(&names[5..9], ["0.0.0", "0.1.0", "0.2.0", "1.0.0"]);
    assert_eq!(names.len() as u64, 5 + core.output().count());
    let zarray = resolve(&core, ".zarray").unwrap();
    let meta: serde_json::Value = serde_json::from_slice(&read_all(&core, zarray.ino)).unwrap();
    assert_eq!(meta["dtype"], "<u2");
    assert_eq!(meta["chunks"], serde_json::json!([8, 10, 20]));
    assert_eq!(meta["compressor"], serde_json::Value::Null);
    let ours = resolve(&core, "rechunkfs.json").unwrap();
    let ours: serde_json::Value = serde_json::from_slice(&read_all(&core, ours.ino)).unwrap();
    assert_eq!(ours["file_name_pattern"], "{i}.{j}.{k}");
    assert_eq!(ours["format"], "zarr");
    for bad in ["4.0.0", "0.0", "00.0.0", "0_0_0.h5", "0.0.0.0"] {
        assert_eq!(
            core.lookup(ROOT_INO, OsStr::new(bad)),
            Err(libc::ENOENT),
            "{bad}"
        );
    }
    let (go, runner) = stepped_run(&f, core.clone());
    drop(go);
    runner.join().unwrap();
    for rank in 0..core.output().count() {
        let node = resolve(&core, &core.block_name(rank)).unwrap();
        let whole = expected_chunk(&f, rank);
        assert_eq!(node.size, whole.len() as u64);
        assert_eq!(read_all(&core, node.ino), whole);
    }
}

/// A view of `input` (npy blocks of 10×12×10 u2) in 20×12×10 npy blocks,
/// prepared within `mem`, staged under `root/name`.
fn prepared_within(
    input: &Path,
    root: &Path,
    name: &str,
    mem: u64,
) -> rechunkfs::view::PreparedView {
    let view = root.join(name).join("view");
    std::fs::create_dir_all(&view).unwrap();
    rechunkfs::view::prepare(&rechunkfs::view::MountRequest {
        request: rechunkfs::output::request::Request {
            input: input.to_path_buf(),
            dataset: "/data".into(),
            values: None,
            format: Some(BlockFormat::Npy),
            shape: "20,12,10".into(),
            shard: None,
            compress: None,
            mem: Some(mem),
            strategy: Strategy::Keep,
            pyramid: Default::default(),
        },
        view,
        staging: Some(root.join(name).join("staging")),
        rebuild: false,
        allow_other: false,
        in_order: false,
    })
    .unwrap()
}

/// Extracting a block beside the plan holds one output block and one input
/// block's buffer per thread reading its input blocks (each output block
/// here overlaps two); the plan is made within --mem less exactly that, a
/// --mem short of it on two threads extracts on one, and a --mem one byte
/// short of the least plan plus one thread's leaves blocks to the plan.
#[test]
fn the_plan_leaves_exactly_one_extractions_bytes_of_mem_free() {
    let root = tempfile::tempdir().unwrap();
    let input = make_blocks(
        root.path(),
        "in",
        &[40, 36, 30],
        &[10, 12, 10],
        dtype("<u2"),
        BlockFormat::Npy,
    );
    let threads = rechunkfs::engine::workers::threads().min(2) as u64;
    let on = |threads: u64| 20 * 12 * 10 * 2 + threads * 10 * 12 * 10 * 2;
    let extraction = on(threads);
    let generous = prepared_within(&input, root.path(), "generous", 1 << 30);
    assert!(generous.on_demand);
    assert_eq!(generous.core.status().on_demand_reserved_bytes, extraction);
    assert_eq!(generous.core.on_demand_threads() as u64, threads);
    assert!(generous.plan.prediction.peak_bytes + extraction <= 1 << 30);
    let problem = generous.plan.problem.clone();
    drop(generous);
    // The least --mem any plan of this view fits in.
    let (mut low, mut high) = (0u64, 1 << 30);
    while low + 1 < high {
        let mid = (low + high) / 2;
        match plan::plan(&problem, Strategy::Keep, Some(mid)) {
            Ok(_) => high = mid,
            Err(_) => low = mid,
        }
    }
    let least = high;
    let fits = prepared_within(&input, root.path(), "fits", least + extraction);
    assert!(fits.on_demand);
    assert_eq!(fits.core.status().on_demand_reserved_bytes, extraction);
    assert!(fits.plan.prediction.peak_bytes + extraction <= least + extraction);
    drop(fits);
    if threads > 1 {
        let one = prepared_within(&input, root.path(), "one", least + extraction - 1);
        assert!(one.on_demand, "room for an extraction on one thread");
        assert_eq!(one.core.status().on_demand_reserved_bytes, on(1));
        assert_eq!(one.core.on_demand_threads(), 1);
        drop(one);
    }
    let short = prepared_within(&input, root.path(), "short", least + on(1) - 1);
    assert!(
        !short.on_demand,
        "no room for an extraction beside the plan"
    );
    assert_eq!(short.core.status().on_demand_reserved_bytes, 0);
    assert!(short.plan.prediction.peak_bytes < least + on(1));
}

/// A block the plan is partway through writing is left to it: the
/// extractor skips it (and goes on to a far block asked for after it),
/// the plan finishes it, and it is published, counted and journaled once.
#[test]
fn a_block_the_plan_is_writing_is_not_extracted_and_is_published_once() {
    // Merges along the first dimension: each output block is written in
    // slabs, one after each step of its read block (cut at the inputs).
    let f = fixture(
        &[40, 24, 10],
        &[10, 12, 10],
        &[40, 12, 10],
        BlockFormat::Npy,
    );
    assert!(f.plan.steps.axis(0).count() > f.plan.read.axis(0).count());
    let (core, _) = open_core(&f);
    let count = core.output().count();
    let (go, reached, runner) =
        stepped_run_observed(&f, core.clone(), Arc::new(AtomicBool::new(false)), true);
    // Held between two steps of the first read block: its first slab is
    // written, so the plan has claimed the block it belongs to.
    reached.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        core.status().blocks_done,
        0,
        "held within the first read block"
    );
    let order: Vec<Vec<usize>> = f.plan.read_blocks_in_order().collect();
    let first_write = f
        .plan
        .completed_write_block(&order[0])
        .expect("a write block");
    let writing_box = f.plan.write.block(&first_write);
    let in_first_write = |rank: u64| {
        let block = f.plan.output.block(&f.plan.output.unravel(rank));
        block.intersect(&writing_box).is_some()
    };
    let writing_rank = (0..count).find(|&r| in_first_write(r)).unwrap();
    let far = (0..count)
        .rev()
        .find(|&r| !in_first_write(r))
        .expect("a far block");
    assert!(
        std::fs::metadata(core.staged_path(writing_rank)).is_ok(),
        "its first slab is written"
    );
    let waiting = read_into(&core, block_ino(&core, writing_rank), 0, 1 << 22);
    let far_read = read_into(&core, block_ino(&core, far), 0, 1 << 22);
    // The far block, asked for second, is extracted while the plan holds;
    // by then the extractor has passed over the block the plan writes.
    let got = far_read
        .recv_timeout(Duration::from_secs(10))
        .expect("the far block waited for the plan's held step")
        .unwrap();
    assert_eq!(got, expected(&f, &core, far));
    assert!(waiting.try_recv().is_err(), "left to the plan");
    assert_eq!(core.status().on_demand_blocks, 1);
    drop(go);
    runner.join().unwrap();
    assert_eq!(
        waiting
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap(),
        expected(&f, &core, writing_rank)
    );
    let status = core.status();
    assert_eq!(status.on_demand_blocks, 1);
    assert_eq!(status.blocks_done, count, "each block counted once");
    assert_eq!(status.bytes_done, status.bytes_total);
    let mut journal = journal_ranks(&f.staging_dir);
    let recorded = journal.len();
    journal.sort_unstable();
    journal.dedup();
    assert_eq!(journal.len(), recorded, "no block recorded twice");
    assert_eq!(journal.len() as u64, count);
    for rank in 0..count {
        let got = read_into(&core, block_ino(&core, rank), 0, 1 << 22)
            .recv()
            .unwrap()
            .unwrap();
        assert_eq!(got, expected(&f, &core, rank), "{}", core.block_name(rank));
    }
}
