//! TIFF inputs written by tifffile (tests/fixtures/tiff_cases.py): stacks
//! of slices (a directory, or a glob) and multi-page TIFF and BigTIFF,
//! uncompressed (whole pages, strips scattered in the file, tiles) and
//! compressed (LZW, deflate, PackBits, zstd, with the horizontal and
//! floating-point predictors), 1- to 8-byte samples in either byte order,
//! RGB pixels too (interleaved or in planes), thumbnails left out. Each rechunks to npy, HDF5 and Zarr with seeks and peak
//! memory as planned, every voxel equal to tifffile's reading of the input
//! and the stored byte order kept; a real FUSE view of a stack serves the
//! same bytes. Bad input (truncated, mismatched slices, JPEG, 1-bit
//! samples, damaged strips, damaged directories) is refused naming the file,
//! never with a panic or a wrong block.

#[macro_use]
mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use common::mounted::MountedView;
use common::{python, stderr};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiff_cases.py");

fn rechunkfs(args: &[&str]) -> Output {
    common::run_rechunkfs(args, 0)
}

/// How tifffile writes one input.
#[derive(Clone, Copy)]
struct Input {
    /// "file" (multi-page, or one page) or "stack" (a directory of slices).
    kind: &'static str,
    shape: &'static str,
    dtype: &'static str,
    /// tifffile.imwrite's options, as JSON.
    options: &'static str,
    bigtiff: bool,
    /// Strips moved apart in the file after writing.
    scatter: bool,
    /// A reduced-resolution page appended to each file.
    thumbnail: bool,
}

impl Input {
    const fn file(shape: &'static str, dtype: &'static str, options: &'static str) -> Input {
        Input {
            kind: "file",
            shape,
            dtype,
            options,
            bigtiff: false,
            scatter: false,
            thumbnail: false,
        }
    }

    const fn stack(shape: &'static str, dtype: &'static str, options: &'static str) -> Input {
        Input {
            kind: "stack",
            ..Input::file(shape, dtype, options)
        }
    }

    const fn bigtiff(self) -> Input {
        Input {
            bigtiff: true,
            ..self
        }
    }

    const fn scattered(self) -> Input {
        Input {
            scatter: true,
            ..self
        }
    }

    const fn with_thumbnail(self) -> Input {
        Input {
            thumbnail: true,
            ..self
        }
    }

    /// Writes the input at `path` with tifffile.
    fn write(&self, path: &Path, seed: u64) {
        let mut command = Command::new(python());
        command
            .arg(FIXTURE)
            .arg("write")
            .arg(path)
            .args(["--kind", self.kind, "--shape", self.shape])
            .args(["--dtype", self.dtype, "--options", self.options])
            .args(["--seed", &seed.to_string()]);
        if self.bigtiff {
            command.arg("--bigtiff");
        }
        if self.scatter {
            command.arg("--scatter-strips");
        }
        if self.thumbnail {
            command.arg("--thumbnail");
        }
        let output = command.output().expect("run python");
        assert!(
            output.status.success(),
            "tifffile failed to write {}: {}",
            path.display(),
            stderr(&output)
        );
    }
}

/// Checks `out` (blocks of `block`, in `format`) against tifffile's reading
/// of `input` (of `kind`): every voxel, and the stored byte order. With
/// `kind` "pages" (a damaged file), tifffile reads each page by its own
/// directory, and a file it cannot read passes.
fn tifffile_agrees(out: &Path, input: &Path, kind: &str, format: &str, block: &str) {
    let output = Command::new(python())
        .arg(FIXTURE)
        .arg("check")
        .arg(out)
        .arg("--input")
        .arg(input)
        .args(["--kind", kind, "--format", format, "--block", block])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let agrees = stdout.contains("voxels equal")
        || kind == "pages" && stdout.contains("cannot read the input page by page");
    assert!(
        output.status.success() && agrees,
        "{} ({format}) differs from tifffile's reading of {}: {stdout}{}",
        out.display(),
        input.display(),
        stderr(&output)
    );
}

/// Rechunks `input` to `out` and holds the run to its plan: seeks made
/// equal those planned, and the peak memory held equals the predicted one.
fn rechunk_as_planned(input: &str, out: &Path, shape: &str, format: &str) -> serde_json::Value {
    let output = rechunkfs(&[
        "rechunk",
        input,
        out.to_str().unwrap(),
        "--shape",
        shape,
        "--format",
        format,
        "--json",
    ]);
    assert!(
        output.status.success(),
        "{input} -> {format} {shape}: {}",
        stderr(&output)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    common::assert_counts_as_planned(&report, &format!("{input}: {report}"));
    report
}

/// (input, output format, output block shape): shapes that do and do not
/// divide the array.
const CASES: [(Input, &str, &str); 23] = [
    // Uncompressed pages, each one run of bytes: blocks of a whole page.
    (Input::file("9,37,29", "<u2", "{}"), "npy", "4,10,8"),
    (
        Input::file("6,20,16", ">f8", r#"{"byteorder": ">"}"#).bigtiff(),
        "h5",
        "3,10,16",
    ),
    // Strips moved apart: one block per strip, read in place.
    (
        Input::file("9,37,29", "<u2", r#"{"rowsperstrip": 5}"#).scattered(),
        "h5",
        "3,37,29",
    ),
    (
        Input::stack("5,23,17", ">i4", r#"{"rowsperstrip": 4, "byteorder": ">"}"#).scattered(),
        "npy",
        "2,7,6",
    ),
    // Tiles, padded at the edges as TIFF stores them.
    (
        Input::file("5,40,45", ">f4", r#"{"tile": [16, 16], "byteorder": ">"}"#).bigtiff(),
        "zarr",
        "5,20,20",
    ),
    // Compressed strips and tiles, read whole and decoded.
    (
        Input::file(
            "7,33,21",
            "|u1",
            r#"{"compression": "lzw", "rowsperstrip": 7}"#,
        ),
        "npy",
        "7,10,10",
    ),
    (
        Input::file(
            "6,30,25",
            ">u2",
            r#"{"compression": "zlib", "predictor": 2, "byteorder": ">", "rowsperstrip": 8}"#,
        ),
        "zarr3",
        "4,16,16",
    ),
    (
        Input::file("5,19,23", "<i2", r#"{"compression": "packbits"}"#),
        "npy",
        "2,19,5",
    ),
    (
        Input::file(
            "4,40,50",
            "<f4",
            r#"{"compression": "zstd", "predictor": 3, "tile": [16, 32]}"#,
        ),
        "h5",
        "3,15,50",
    ),
    (
        Input::file(
            "4,21,22",
            "<i8",
            r#"{"compression": 32946, "predictor": 2, "rowsperstrip": 6}"#,
        ),
        "npy",
        "4,8,9",
    ),
    (
        Input::file(
            "3,35,26",
            ">f4",
            r#"{"compression": "lzw", "predictor": 3, "byteorder": ">", "tile": [16, 16]}"#,
        )
        .bigtiff(),
        "npy",
        "2,20,13",
    ),
    // Stacks of slices, in natural order (slice_10 after slice_9).
    (
        Input::stack(
            "11,30,20",
            "<u2",
            r#"{"compression": "lzw", "predictor": 2}"#,
        ),
        "npy",
        "4,16,16",
    ),
    (Input::stack("12,17,19", "|u1", "{}"), "h5", "5,17,7"),
    (
        Input::stack(
            "3,25,21",
            ">f4",
            r#"{"compression": "zlib", "predictor": 3, "byteorder": ">"}"#,
        )
        .bigtiff(),
        "zarr",
        "2,9,21",
    ),
    (
        Input::stack(
            "4,33,40",
            "<u2",
            r#"{"compression": "zstd", "tile": [16, 16]}"#,
        ),
        "npy",
        "3,20,20",
    ),
    // RGB pixels: (Z, Y, X, 3).
    (Input::file("3,20,30,3", "|u1", "{}"), "npy", "2,8,8,3"),
    (
        Input::stack(
            "3,20,30,3",
            "|u1",
            r#"{"compression": "lzw", "rowsperstrip": 3}"#,
        ),
        "h5",
        "3,15,7,3",
    ),
    // RGB in separate planes: (Z, 3, Y, X).
    (
        Input::file(
            "4,3,20,30",
            "|u1",
            r#"{"planarconfig": "separate", "photometric": "rgb"}"#,
        ),
        "npy",
        "3,2,8,8",
    ),
    (
        Input::file(
            "2,3,25,22",
            "<u2",
            r#"{"planarconfig": "separate", "photometric": "rgb", "rowsperstrip": 7}"#,
        )
        .scattered(),
        "h5",
        "2,3,10,22",
    ),
    (
        Input::stack(
            "3,3,26,21",
            ">u2",
            r#"{"planarconfig": "separate", "photometric": "rgb", "compression": "zlib",
                "predictor": 2, "tile": [16, 16], "byteorder": ">"}"#,
        ),
        "npy",
        "2,1,20,21",
    ),
    // Thumbnails (reduced-resolution pages) are left out, as tifffile does.
    (
        Input::file("5,30,26", "<u2", r#"{"compression": "lzw"}"#).with_thumbnail(),
        "npy",
        "2,16,16",
    ),
    (
        Input::stack("4,30,26", "|u1", "{}").with_thumbnail(),
        "h5",
        "3,30,9",
    ),
    // One page: a 2-D array.
    (
        Input::file(
            "45,38",
            "<u2",
            r#"{"compression": "zlib", "tile": [16, 16]}"#,
        ),
        "npy",
        "20,20",
    ),
];

#[test]
fn tiff_inputs_rechunk_byte_exact_as_planned() {
    require!(Readers);
    for (number, (input, format, block)) in CASES.iter().enumerate() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join(if input.kind == "file" {
            "in.tif"
        } else {
            "slices"
        });
        input.write(&path, number as u64);
        let out = root.path().join("out");
        let report = rechunk_as_planned(path.to_str().unwrap(), &out, block, format);
        tifffile_agrees(&out, &path, input.kind, format, block);
        if input.options.contains("compression") {
            // Each compressed strip or tile is read once, in one call.
            let blocks = input_blocks(&path, block);
            assert_eq!(common::json_u64(&report, "seeks.read"), blocks, "{report}");
        }
    }
}

/// The number of input blocks `plan` finds in `input`.
fn input_blocks(input: &Path, block: &str) -> u64 {
    let output = rechunkfs(&["plan", input.to_str().unwrap(), "--shape", block, "--json"]);
    assert!(output.status.success(), "plan: {}", stderr(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    plan["input_grid"]
        .as_array()
        .unwrap_or_else(|| panic!("no input_grid in {plan}"))
        .iter()
        .map(|n| n.as_u64().unwrap())
        .product()
}

/// Several ways to name one stack: a quoted glob (which leaves out other
/// files beside it), and a directory whose slices do not all share a
/// compression (so every strip is decoded, the uncompressed ones too).
#[test]
fn a_glob_names_a_stack_and_slices_may_differ_in_compression() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let slices = root.path().join("slices");
    Input::stack("11,21,18", "<u2", r#"{"rowsperstrip": 6}"#).write(&slices, 1);
    fs::write(slices.join("notes.txt"), "not a slice").unwrap();
    Input::file("1,21,18", "<u2", r#"{"rowsperstrip": 6}"#).write(&slices.join("other.tif"), 2);
    let pattern = slices.join("slice_*.tif");
    let out = root.path().join("out");
    let report = rechunk_as_planned(pattern.to_str().unwrap(), &out, "4,8,8", "npy");
    assert_eq!(
        common::json_u64(&report, "output_blocks"),
        3 * 3 * 3,
        "{report}"
    );
    tifffile_agrees(&out, &slices, "stack", "npy", "4,8,8");

    fs::remove_file(slices.join("other.tif")).unwrap();
    fs::remove_file(slices.join("notes.txt")).unwrap();
    Input::file(
        "1,21,18",
        "<u2",
        r#"{"rowsperstrip": 6, "compression": "lzw", "predictor": 2}"#,
    )
    .write(&slices.join("slice_3.tif"), 3);
    let out = root.path().join("mixed");
    rechunk_as_planned(slices.to_str().unwrap(), &out, "5,21,10", "h5");
    tifffile_agrees(&out, &slices, "stack", "h5", "5,21,10");
}

#[test]
fn a_view_of_a_tiff_stack_serves_its_blocks_byte_exact() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let slices = root.path().join("slices");
    Input::stack(
        "10,37,29",
        ">u2",
        r#"{"compression": "lzw", "byteorder": ">"}"#,
    )
    .write(&slices, 7);
    let mounted = MountedView::new(
        &slices,
        root.path(),
        &["--shape", "4,16,16", "--format", "npy"],
        0,
    );
    let status = mounted.wait_complete();
    assert_eq!(
        common::json_u64(&status, "seeks_made"),
        common::json_u64(&status, "seeks_planned"),
        "{status}"
    );
    // Read through the mount, as any program reads it.
    tifffile_agrees(&mounted.view, &slices, "stack", "npy", "4,16,16");
}

/// Runs `rechunk` on `input`, which must be refused with a message naming
/// `names` and saying each of `expected`, keeping no block.
fn assert_refused(input: &Path, names: &Path, expected: &[&str]) {
    assert_refused_keeping(input, names, expected, None);
}

/// As [`assert_refused`], but a block the run kept is allowed when it is
/// the same file in `exact` (a run of the undamaged input).
fn assert_refused_keeping(input: &Path, names: &Path, expected: &[&str], exact: Option<&Path>) {
    let out = input.with_extension("out");
    let output = rechunkfs(&[
        "rechunk",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--shape",
        "2,8,8",
        "--format",
        "npy",
    ]);
    let message = stderr(&output);
    assert!(!output.status.success(), "{} was accepted", input.display());
    assert!(!message.contains("panicked"), "{message}");
    assert!(message.contains(names.to_str().unwrap()), "{message}");
    for part in expected {
        assert!(message.contains(part), "expected {part:?} in: {message}");
    }
    for (name, bytes) in kept_blocks(&out) {
        let reference = exact.map(|dir| fs::read(dir.join(&name)).unwrap_or_default());
        assert_eq!(
            reference.as_ref(),
            Some(&bytes),
            "a refused run kept {name}, which is not the exact block"
        );
    }
}

/// The block files a run left in `out` (its job record aside), with their
/// bytes; a temporary left behind fails the test.
fn kept_blocks(out: &Path) -> Vec<(String, Vec<u8>)> {
    let mut kept = Vec::new();
    for entry in fs::read_dir(out).into_iter().flatten() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == ".rechunkfs-job.json" {
            continue;
        }
        assert!(!name.starts_with('.'), "a temporary was left: {name}");
        kept.push((name, fs::read(entry.path()).unwrap()));
    }
    kept
}

#[test]
fn bad_tiff_inputs_are_refused_naming_the_file() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let at = |name: &str| root.path().join(name);

    // Truncated: inside a later page's directory, and inside the data.
    Input::file("6,30,20", "<u2", "{}").write(&at("cut.tif"), 1);
    let whole = fs::read(at("cut.tif")).unwrap();
    fs::write(at("cut.tif"), &whole[..whole.len() * 2 / 3]).unwrap();
    assert_refused(&at("cut.tif"), &at("cut.tif"), &["truncated"]);
    Input::file("1,30,20", "<u2", r#"{"compression": "zlib"}"#).write(&at("short.tif"), 1);
    let whole = fs::read(at("short.tif")).unwrap();
    fs::write(at("short.tif"), &whole[..whole.len() - 10]).unwrap();
    assert_refused(&at("short.tif"), &at("short.tif"), &["truncated"]);

    // Slices that disagree in size or type, named.
    let stack = at("sizes");
    Input::stack("4,20,16", "<u2", "{}").write(&stack, 1);
    Input::file("1,20,17", "<u2", "{}").write(&stack.join("slice_2.tif"), 2);
    assert_refused(
        &stack,
        &stack.join("slice_2.tif"),
        &["20×17", "agree in size and type"],
    );
    let stack = at("types");
    Input::stack("4,20,16", "<u2", "{}").write(&stack, 1);
    Input::file("1,20,16", "<f4", "{}").write(&stack.join("slice_3.tif"), 2);
    assert_refused(
        &stack,
        &stack.join("slice_3.tif"),
        &["f32", "agree in size"],
    );
    let stack = at("orders");
    Input::stack("3,20,16", "<u2", "{}").write(&stack, 1);
    Input::file("1,20,16", ">u2", r#"{"byteorder": ">"}"#).write(&stack.join("slice_1.tif"), 2);
    assert_refused(
        &stack,
        &stack.join("slice_1.tif"),
        &["big-endian", "little-endian", "byteorder="],
    );
    // A multi-page file among one-page slices.
    let stack = at("pages");
    Input::stack("3,20,16", "<u2", "{}").write(&stack, 1);
    Input::file("2,20,16", "<u2", "{}").write(&stack.join("slice_1.tif"), 2);
    assert_refused(&stack, &stack.join("slice_1.tif"), &["has 2 pages"]);

    // What is not decoded or not carried, with what to do.
    Input::file("2,32,32", "|u1", r#"{"compression": "jpeg"}"#).write(&at("jpeg.tif"), 1);
    assert_refused(
        &at("jpeg.tif"),
        &at("jpeg.tif"),
        &["(JPEG)", "compression='zlib'"],
    );
    Input::file("2,20,16", "?", "{}").write(&at("bilevel.tif"), 1);
    assert_refused(
        &at("bilevel.tif"),
        &at("bilevel.tif"),
        &["1-bit samples", "wider type"],
    );
    Input::file("2,20,16", "<c8", "{}").write(&at("complex.tif"), 1);
    assert_refused(&at("complex.tif"), &at("complex.tif"), &["SampleFormat"]);

    // Names: a pattern matching nothing, and TIFF beside other blocks.
    assert_refused(&at("none_*.tif"), &at("none_*.tif"), &["matches no files"]);
    assert_refused(
        &at("s*/slice_0.tif"),
        &at("s*/slice_0.tif"),
        &["in the file name only"],
    );
    let mixed = at("mixed");
    Input::stack("2,20,16", "<u2", "{}").write(&mixed, 1);
    fs::write(mixed.join("0_0_0.npy"), b"").unwrap();
    assert_refused(&mixed, &mixed, &["other block files"]);
}

/// A compressed strip whose bytes are damaged stops the run, naming the
/// file, page and strip; nothing is left behind.
#[test]
fn a_damaged_compressed_strip_stops_the_run_naming_it() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let input = root.path().join("in.tif");
    Input::file(
        "3,20,16",
        "<u2",
        r#"{"compression": "zlib", "rowsperstrip": 10}"#,
    )
    .write(&input, 1);
    let exact = root.path().join("exact");
    let clean = rechunkfs(&[
        "rechunk",
        input.to_str().unwrap(),
        exact.to_str().unwrap(),
        "--shape",
        "2,8,8",
        "--format",
        "npy",
    ]);
    assert!(clean.status.success(), "{}", stderr(&clean));
    let offsets = Command::new(python())
        .args([
            "-c",
            "import sys, tifffile; p = tifffile.TiffFile(sys.argv[1]).pages[1]; \
             print(p.dataoffsets[1], p.databytecounts[1])",
        ])
        .arg(&input)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&offsets.stdout);
    let numbers: Vec<usize> = text
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let mut bytes = fs::read(&input).unwrap();
    for byte in &mut bytes[numbers[0] + 2..numbers[0] + numbers[1]] {
        *byte = 0x5a;
    }
    fs::write(&input, bytes).unwrap();
    assert_refused_keeping(
        &input,
        &input,
        &["page 1, strip 1", "do not decode"],
        Some(&exact),
    );
}

/// Damaged directories and truncations: each is refused or read, never a
/// panic or a hang; what is read equals tifffile's reading of each page by
/// its own directory, when tifffile can read them.
#[test]
fn damaged_tiff_directories_never_panic() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let mut rng = common::TestRng(17);
    let inputs = [
        Input::file("3,12,10", "<u2", r#"{"rowsperstrip": 5}"#),
        Input::file("3,12,10", ">f4", r#"{"byteorder": ">", "tile": [16, 16]}"#).bigtiff(),
        Input::file(
            "3,12,10",
            "<u2",
            r#"{"compression": "lzw", "predictor": 2}"#,
        ),
    ];
    let mut read = 0;
    for (number, input) in inputs.iter().enumerate() {
        let path = root.path().join(format!("good{number}.tif"));
        input.write(&path, 1);
        let good = fs::read(&path).unwrap();
        for case in 0..30 {
            let mut bytes = good.clone();
            if case % 4 == 0 {
                bytes.truncate(rng.below(bytes.len() as u64) as usize);
            } else {
                // The header and directories lie before the data.
                let span = bytes.len().min(400) as u64;
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(span) as usize;
                    bytes[at] = rng.below(256) as u8;
                }
            }
            let damaged = root.path().join("damaged.tif");
            fs::write(&damaged, &bytes).unwrap();
            let out = root.path().join("damaged.out");
            let output = rechunkfs(&[
                "rechunk",
                damaged.to_str().unwrap(),
                out.to_str().unwrap(),
                "--shape",
                "2,8,8",
                "--format",
                "npy",
                "--mem",
                "64M",
            ]);
            let message = stderr(&output);
            assert!(
                !message.contains("panicked") && output.status.code().is_some(),
                "input {number}, case {case}: {message}"
            );
            if output.status.success() {
                tifffile_agrees(&out, &damaged, "pages", "npy", "2,8,8");
                read += 1;
            } else {
                // A damaged page count can leave one page: a 2-D array.
                let named = message.contains("damaged.tif") || message.contains("--shape 2,8,8");
                assert!(named, "{message}");
            }
            let _ = fs::remove_dir_all(&out);
        }
    }
    // Damage that leaves the file readable (a tag TIFF does not need, a
    // strip's bytes) is read, not refused.
    assert!(read >= 10, "only {read} damaged files were read");
}
