//! Helpers shared by the integration tests: make sample arrays, and check
//! output blocks voxel by voxel against the source. Expected bytes come
//! from [`oracle`] and files are read by [`readers`]: neither uses
//! rechunkfs's own geometry or format code.

#![allow(dead_code)]

pub mod mounted;
pub mod oracle;
#[macro_use]
pub mod prerequisites;
pub mod readers;

use std::path::{Path, PathBuf};

use rechunkfs::cli::sample;
use rechunkfs::format::BlockFormat;
use rechunkfs::DType;

use oracle::GridBlock;

/// `command`, its child to start with SIGINT and SIGQUIT at their default
/// actions, as a command typed at a terminal has them. A harness started
/// in the background of a non-interactive shell ignores both, a child
/// inherits that, and rechunkfs (like Python) keeps a signal ignored that
/// it started ignoring: a test that interrupts it would then wait in vain.
pub fn interruptible(command: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        })
    }
}

pub fn dtype(text: &str) -> DType {
    text.parse().expect("test dtype")
}

/// Writes the sample array as blocks into a fresh directory under `root`.
pub fn make_blocks(
    root: &Path,
    name: &str,
    array: &[u64],
    block: &[u64],
    dtype: DType,
    format: BlockFormat,
) -> PathBuf {
    let dir = root.join(name);
    sample::write_sample(&dir, array, block, dtype, format, "/data").expect("write sample");
    dir
}

/// Reads a block file by its format's own reader (see [`readers`]): its
/// C-order shape, numpy type string and data bytes.
pub fn block_bytes(path: &Path, format: BlockFormat) -> (Vec<u64>, String, Vec<u8>) {
    let block = readers::read_block(path, format.extension(), "/data");
    (block.shape, block.descr, block.data)
}

/// Checks one block file of the sample array: read by its format's reader,
/// its shape, type and every byte are the oracle's. Returns the file's
/// bytes, header included, now known good: reads of parts of it are
/// checked against them.
pub fn verified_block_file(
    path: &Path,
    array: &[u64],
    block: &GridBlock,
    dtype: DType,
    format: BlockFormat,
) -> Vec<u8> {
    let expected = oracle::sample_bytes(array, &block.origin, &block.shape, dtype.size);
    let file = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if format == BlockFormat::Raw {
        assert!(
            file == expected,
            "{}: bytes differ from the source",
            path.display()
        );
        return file;
    }
    let read = readers::read_block(path, format.extension(), "/data");
    assert_eq!(read.shape, block.shape, "{}: shape", path.display());
    assert_eq!(read.descr, dtype.numpy_descr(), "{}: type", path.display());
    assert!(
        read.data == expected,
        "{}: bytes differ from the source array",
        path.display()
    );
    file
}

/// Checks that `out` holds exactly the output grid of the sample array, each
/// block byte-exact, with no leftover temporary files.
pub fn verify_output(
    out: &Path,
    array: &[u64],
    out_block: &[u64],
    dtype: DType,
    format: BlockFormat,
) {
    let mut expected_names = Vec::new();
    for block in oracle::grid_blocks(array, out_block) {
        let name = format!("{}.{}", block.stem(), format.extension());
        verified_block_file(&out.join(&name), array, &block, dtype, format);
        expected_names.push(name);
    }
    let mut present: Vec<String> = std::fs::read_dir(out)
        .expect("list out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name != "rechunkfs.json")
        .collect();
    present.sort();
    expected_names.sort();
    assert_eq!(
        present, expected_names,
        "exactly the output blocks, no partial files"
    );
}

/// A small deterministic random number generator for tests (no seed files,
/// same sequence every run).
pub struct TestRng(pub u64);

impl TestRng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        sample::splitmix64(self.0) % n.max(1)
    }
}

/// Whether `format` is one of the Zarr formats (a directory with metadata
/// and chunk files, not block files).
pub fn is_zarr(format: BlockFormat) -> bool {
    matches!(format, BlockFormat::Zarr | BlockFormat::Zarr3)
}

/// The chunk key of a block in a Zarr array of `format`, with default
/// keys: `i.j.k` (v2) or `c/i/j/k` (v3).
pub fn zarr_chunk_key(block: &GridBlock, format: BlockFormat) -> String {
    let parts: Vec<String> = block.index.iter().map(u64::to_string).collect();
    match format {
        BlockFormat::Zarr => parts.join("."),
        _ => format!("c/{}", parts.join("/")),
    }
}

/// Checks that `out` is exactly the Zarr array of the sample array in
/// chunks of `out_block`: its metadata (read here as JSON, by the Zarr
/// specifications' field names), and every chunk file byte-exact (edge
/// chunks padded with the fill value 0), and nothing else but the metadata
/// (and in a view, rechunkfs's own two files).
pub fn verify_zarr_output(
    out: &Path,
    array: &[u64],
    out_block: &[u64],
    dtype: DType,
    format: BlockFormat,
) {
    let chunk: Vec<u64> = out_block
        .iter()
        .zip(array)
        .map(|(&b, &n)| b.min(n))
        .collect();
    let metadata_name = if format == BlockFormat::Zarr {
        ".zarray"
    } else {
        "zarr.json"
    };
    let text = std::fs::read(out.join(metadata_name)).expect("Zarr metadata");
    let meta: serde_json::Value = serde_json::from_slice(&text).expect("metadata is JSON");
    let as_shape = |value: &serde_json::Value| -> Vec<u64> {
        value
            .as_array()
            .unwrap_or_else(|| panic!("not a shape: {value}"))
            .iter()
            .map(|n| n.as_u64().expect("a side"))
            .collect()
    };
    assert_eq!(as_shape(&meta["shape"]), array, "metadata shape");
    if format == BlockFormat::Zarr {
        assert_eq!(meta["zarr_format"], 2);
        assert_eq!(as_shape(&meta["chunks"]), chunk, "metadata chunks");
        assert_eq!(meta["dtype"], dtype.numpy_descr(), "metadata dtype");
        assert!(meta["compressor"].is_null(), "uncompressed");
    } else {
        assert_eq!(meta["zarr_format"], 3);
        let grid = &meta["chunk_grid"]["configuration"]["chunk_shape"];
        assert_eq!(as_shape(grid), chunk, "metadata chunks");
    }
    let mut expected_files = vec![metadata_name.to_string()];
    for block in oracle::grid_blocks(array, &chunk) {
        let name = zarr_chunk_key(&block, format);
        let bytes = std::fs::read(out.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let data = oracle::sample_bytes(array, &block.origin, &block.shape, dtype.size);
        assert!(
            bytes == oracle::padded(&data, &block.shape, &chunk, dtype.size),
            "{name}: bytes differ from the source array"
        );
        expected_files.push(name);
    }
    let mut present = Vec::new();
    list_files(out, out, &mut present);
    present.retain(|name| name != "rechunkfs.json" && name != ".rechunkfs-status.json");
    present.sort();
    expected_files.sort();
    assert_eq!(
        present, expected_files,
        "exactly the metadata and the chunks, no partial files"
    );
}

fn list_files(root: &Path, dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            list_files(root, &path, found);
        } else {
            let relative = path.strip_prefix(root).expect("inside root");
            found.push(relative.to_string_lossy().into_owned());
        }
    }
}

/// The Python script that writes and checks Zarr arrays with zarr-python
/// and TensorStore.
pub const ZARR_CHECKER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/check_zarr.py");

/// Writes the sample array with zarr-python (`check_zarr.py write`), as
/// Zarr `version` ("2" or "3") in chunks of `chunks`; `extra` passes the
/// script's options (`--compressed`, `--drop`, `--group`).
pub fn zarr_python_writes(
    path: &Path,
    array: &[u64],
    chunks: &[u64],
    dt: &str,
    version: &str,
    extra: &[&str],
) {
    let joined = |shape: &[u64]| {
        shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let output = std::process::Command::new(python())
        .arg(ZARR_CHECKER)
        .arg("write")
        .arg(path)
        .args(["--array", &joined(array), "--chunks", &joined(chunks)])
        .args(["--dtype", dt, "--zarr-format", version])
        .args(extra)
        .output()
        .expect("run python");
    assert!(output.status.success(), "zarr-python: {}", stderr(&output));
}

/// The sample array as a Zarr array (`format`) in chunks of `chunk`,
/// written by zarr-python with its defaults but no compressor; returns
/// its directory. A test using it says `require!(Readers)`.
pub fn make_zarr(
    root: &Path,
    name: &str,
    array: &[u64],
    chunk: &[u64],
    dtype: DType,
    format: BlockFormat,
) -> PathBuf {
    let out = root.join(name);
    let version = if format == BlockFormat::Zarr {
        "2"
    } else {
        "3"
    };
    zarr_python_writes(&out, array, chunk, &dtype.numpy_descr(), version, &[]);
    out
}

/// Runs the `rechunkfs` binary built for these tests, with the
/// materialiser paused `step_delay_ms` after each read block (0: none).
pub fn run_rechunkfs(args: &[&str], step_delay_ms: u64) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(args)
        .env("RECHUNKFS_STEP_DELAY_MS", step_delay_ms.to_string())
        .output()
        .expect("run rechunkfs")
}

/// `--threads` for the fault suites, to add to `args` when their command
/// takes it (`rechunk`, `mount`, `plan`): 4 workers, more than the cores a
/// test machine may have, so that every promise is kept with workers
/// decoding and encoding beside the reader and the writer.
pub fn fault_threads(args: &[&str]) -> &'static [&'static str] {
    match args.first() {
        Some(&("rechunk" | "mount" | "plan")) => &["--threads", "4"],
        _ => &[],
    }
}

pub fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The Python interpreter with the readers `scripts/setup` installs
/// (numpy, h5py, nibabel, zarr, tensorstore); a test using it first says
/// `require!(Readers)`.
pub fn python() -> String {
    prerequisites::python_path().to_string_lossy().into_owned()
}

/// Runs `tests/fixtures/{script}` with the readers' Python and `args`,
/// failing the test with its output if it fails; returns its stdout.
pub fn run_fixture(script: &str, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(script);
    run_python_args(
        script,
        std::iter::once(path.as_os_str()).chain(args.iter().map(|a| a.as_ref())),
    )
}

/// Runs the Python `code` with the readers' Python and `args`, failing the
/// test with its output if it fails; returns its stdout.
pub fn run_python(code: &str, args: &[&str]) -> String {
    let first = ["-c", code].map(std::ffi::OsStr::new);
    run_python_args(
        "python -c",
        first.into_iter().chain(args.iter().map(|a| a.as_ref())),
    )
}

fn run_python_args<'a>(what: &str, args: impl IntoIterator<Item = &'a std::ffi::OsStr>) -> String {
    let args: Vec<&std::ffi::OsStr> = args.into_iter().collect();
    let output = std::process::Command::new(python())
        .args(&args)
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "{what} {:?} failed: {}{}",
        &args[1..],
        String::from_utf8_lossy(&output.stdout),
        stderr(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The unsigned integer at `path` (`seeks.made`) in a JSON report; fails
/// the test when the key is missing or holds anything else, so that two
/// absent keys never compare equal.
pub fn json_u64(value: &serde_json::Value, path: &str) -> u64 {
    let mut at = value;
    for key in path.split('.') {
        at = at
            .get(key)
            .unwrap_or_else(|| panic!("no `{path}` in the report (missing `{key}`): {value}"));
    }
    at.as_u64()
        .unwrap_or_else(|| panic!("`{path}` is {at}, not an unsigned integer"))
}

/// Fails unless `report` (a run's `--json`) counted the seeks and held the
/// peak its plan predicted; `what` names the run in the message.
pub fn assert_counts_as_planned(report: &serde_json::Value, what: &str) {
    assert_eq!(
        json_u64(report, "seeks.made"),
        json_u64(report, "seeks.planned"),
        "{what}: seeks"
    );
    assert_eq!(
        json_u64(report, "peak_memory_bytes"),
        json_u64(report, "planned_peak_memory_bytes"),
        "{what}: peak memory"
    );
}
