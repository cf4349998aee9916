//! Zarr with the real readers: zarr-python and TensorStore open rechunkfs
//! views (real FUSE mounts) and `rechunk` outputs as Zarr v2 and v3 arrays
//! and read every region equal to the source, edge chunks included; Zarr
//! arrays written by zarr-python rechunk byte-exact to block files and to
//! Zarr; compressed arrays and groups are refused, naming the path and the
//! problem. Python comes from RECHUNKFS_PYTHON or target/pyenv (made by
//! scripts/setup); mounts need /dev/fuse (and root or fusermount3).

#[macro_use]
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rechunkfs::format::BlockFormat;

use common::{
    dtype, make_blocks, python, stderr, verify_output, verify_zarr_output, zarr_python_writes,
};

fn rechunkfs(args: &[&str], step_delay_ms: u64) -> Output {
    common::run_rechunkfs(args, step_delay_ms)
}

fn shape_text(shape: &[u64]) -> String {
    shape
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn zarr_version(format: BlockFormat) -> &'static str {
    if format == BlockFormat::Zarr3 {
        "3"
    } else {
        "2"
    }
}

/// zarr-python and TensorStore open `path` as a Zarr array of the sample
/// array in chunks of `chunks`, and read the whole of it, every edge chunk
/// and random regions equal to the source.
fn both_readers_agree(path: &Path, array: &[u64], chunks: &[u64], dt: &str, format: BlockFormat) {
    let output = Command::new(python())
        .arg(common::ZARR_CHECKER)
        .arg("check")
        .arg(path)
        .args([
            "--array",
            &shape_text(array),
            "--chunks",
            &shape_text(chunks),
        ])
        .args(["--dtype", dt, "--zarr-format", zarr_version(format)])
        .args(["--reader", "both", "--regions", "30"])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the Zarr readers disagree with the source: {stdout}{}",
        stderr(&output)
    );
    for reader in ["zarr-python", "tensorstore"] {
        assert!(stdout.contains(&format!("{reader}: ")), "{stdout}");
    }
}

/// A mounted view, unmounted when dropped whatever the test did.
struct MountedView {
    view: PathBuf,
}

impl MountedView {
    fn new(
        input: &Path,
        root: &Path,
        shape: &str,
        format: &str,
        step_delay_ms: u64,
    ) -> MountedView {
        let view = root.join("view");
        fs::create_dir_all(&view).unwrap();
        let staging = root.join("staging");
        let output = rechunkfs(
            &[
                "mount",
                input.to_str().unwrap(),
                view.to_str().unwrap(),
                "--shape",
                shape,
                "--format",
                format,
                "--staging",
                staging.to_str().unwrap(),
            ],
            step_delay_ms,
        );
        assert!(output.status.success(), "mount failed: {}", stderr(&output));
        MountedView { view }
    }

    fn status(&self) -> serde_json::Value {
        let output = rechunkfs(&["status", "--json", self.view.to_str().unwrap()], 0);
        assert!(output.status.success(), "status: {}", stderr(&output));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn wait_complete(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let status = self.status();
            if status["state"] == "complete" {
                return status;
            }
            assert!(Instant::now() < deadline, "not finished: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for MountedView {
    fn drop(&mut self) {
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = rechunkfs(&["umount", self.view.to_str().unwrap()], 0);
        }
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = rechunkfs::fuse::session::detach(&self.view);
        }
    }
}

/// (dtype, array, input blocks, output chunks): shapes that do and do not
/// divide evenly, both byte orders.
/// A view or rechunk case: the dtype, the array, input blocks, output chunks.
type Case = (&'static str, [u64; 3], [u64; 3], [u64; 3]);

const CASES: [Case; 5] = [
    ("<u2", [37, 29, 23], [10, 8, 7], [16, 9, 11]),
    (">f4", [30, 30, 30], [10, 10, 10], [15, 10, 6]),
    (">i8", [17, 13, 11], [5, 6, 4], [6, 5, 7]),
    ("|u1", [20, 21, 22], [20, 21, 22], [7, 21, 8]),
    ("<f2", [9, 10, 11], [3, 4, 5], [9, 10, 11]),
];

#[test]
fn zarr_python_and_tensorstore_read_zarr_views() {
    require!(Fuse, Readers);
    for format in [BlockFormat::Zarr, BlockFormat::Zarr3] {
        for (dt, array, inb, outb) in CASES {
            let root = tempfile::tempdir().unwrap();
            let input = make_blocks(
                root.path(),
                "in",
                &array,
                &inb,
                dtype(dt),
                BlockFormat::Hdf5,
            );
            let mounted = MountedView::new(
                &input,
                root.path(),
                &shape_text(&outb),
                format.extension(),
                0,
            );
            both_readers_agree(&mounted.view, &array, &outb, dt, format);
            // The view is the array, with rechunkfs's own files beside it.
            let names: Vec<String> = fs::read_dir(&mounted.view)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            for name in ["rechunkfs.json", ".rechunkfs-status.json"] {
                assert!(names.contains(&name.to_string()), "{names:?}");
            }
            if format == BlockFormat::Zarr3 {
                assert!(names.contains(&"zarr.json".to_string()) && names.contains(&"c".into()));
            } else {
                assert!(names.contains(&".zarray".to_string()) && names.contains(&"0.0.0".into()));
            }
            let status = mounted.wait_complete();
            assert_eq!(status["seeks_made"], status["seeks_planned"], "{status}");
            // Every chunk file, as any program reads it, is the padded chunk.
            verify_zarr_output(&mounted.view, &array, &outb, dtype(dt), format);
        }
    }
}

#[test]
fn a_viewer_reads_chunks_on_demand_while_the_view_fills() {
    require!(Fuse, Readers);
    // Slow materialisation: the readers open the array at once, and their
    // reads of pending chunks wait for those chunks, then get them whole.
    for format in [BlockFormat::Zarr3, BlockFormat::Zarr] {
        let root = tempfile::tempdir().unwrap();
        let (dt, array, inb, outb) = ("<u2", [40u64, 36, 30], [10u64, 9, 10], [16u64, 9, 7]);
        let input = make_blocks(
            root.path(),
            "in",
            &array,
            &inb,
            dtype(dt),
            BlockFormat::Hdf5,
        );
        let mounted = MountedView::new(
            &input,
            root.path(),
            &shape_text(&outb),
            format.extension(),
            150,
        );
        assert_eq!(mounted.status()["state"], "materialising");
        both_readers_agree(&mounted.view, &array, &outb, dt, format);
    }
}

#[test]
fn zarr_python_and_tensorstore_read_rechunk_outputs() {
    require!(Readers);
    for format in [BlockFormat::Zarr, BlockFormat::Zarr3] {
        for (dt, array, inb, outb) in CASES {
            let root = tempfile::tempdir().unwrap();
            let input = make_blocks(root.path(), "in", &array, &inb, dtype(dt), BlockFormat::Npy);
            let out = root.path().join("out");
            let output = rechunkfs(
                &[
                    "rechunk",
                    input.to_str().unwrap(),
                    out.to_str().unwrap(),
                    "--shape",
                    &shape_text(&outb),
                    "--format",
                    format.extension(),
                    "--json",
                ],
                0,
            );
            assert!(output.status.success(), "{}", stderr(&output));
            let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(
                common::json_u64(&report, "seeks.made"),
                common::json_u64(&report, "seeks.planned"),
                "{report}"
            );
            verify_zarr_output(&out, &array, &outb, dtype(dt), format);
            both_readers_agree(&out, &array, &outb, dt, format);
        }
    }
    // Merging into one chunk, and a 1-D array.
    let root = tempfile::tempdir().unwrap();
    for (format, array, inb, outb) in [
        (
            BlockFormat::Zarr3,
            vec![9u64, 8],
            vec![4u64, 3],
            vec![1000u64, 1000],
        ),
        (BlockFormat::Zarr, vec![100], vec![7], vec![15]),
    ] {
        let base = root.path().join(format.extension());
        let input = make_blocks(&base, "in", &array, &inb, dtype("<f8"), BlockFormat::Hdf5);
        let out = base.join("out");
        let output = rechunkfs(
            &[
                "rechunk",
                input.to_str().unwrap(),
                out.to_str().unwrap(),
                "--shape",
                &shape_text(&outb),
                "--format",
                format.extension(),
                "--quiet",
            ],
            0,
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let chunks: Vec<u64> = outb.iter().zip(&array).map(|(&b, &n)| b.min(n)).collect();
        both_readers_agree(&out, &array, &chunks, "<f8", format);
    }
}

#[test]
fn zarr_arrays_written_by_zarr_python_rechunk_byte_exact() {
    require!(Readers);
    // zarr-python keeps a v2 array's byte order but stores v3 arrays
    // little-endian, so the big-endian source is a v2 one.
    for (version, dt, chunks) in [
        ("2", "<u2", [10u64, 8, 7]),
        ("2", ">f4", [16, 30, 7]),
        ("3", "<i4", [10, 8, 7]),
        // Chunks longer than the array along the last dimension.
        ("3", "<u2", [12, 12, 40]),
    ] {
        let root = tempfile::tempdir().unwrap();
        let array = [37u64, 29, 23];
        let input = root.path().join("in.zarr");
        zarr_python_writes(&input, &array, &chunks, dt, version, &[]);
        for (out_format, outb) in [
            (BlockFormat::Hdf5, [16u64, 9, 11]),
            (BlockFormat::Npy, [37, 29, 23]),
            (BlockFormat::Zarr, [8, 10, 6]),
            (BlockFormat::Zarr3, [20, 29, 5]),
        ] {
            let out = root.path().join(format!("out.{}", out_format.extension()));
            let output = rechunkfs(
                &[
                    "rechunk",
                    input.to_str().unwrap(),
                    out.to_str().unwrap(),
                    "--shape",
                    &shape_text(&outb),
                    "--format",
                    out_format.extension(),
                    "--json",
                ],
                0,
            );
            assert!(
                output.status.success(),
                "{version} {dt}: {}",
                stderr(&output)
            );
            let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(
                common::json_u64(&report, "seeks.made"),
                common::json_u64(&report, "seeks.planned"),
                "{report}"
            );
            if common::is_zarr(out_format) {
                verify_zarr_output(&out, &array, &outb, dtype(dt), out_format);
                both_readers_agree(&out, &array, &outb, dt, out_format);
            } else {
                verify_output(&out, &array, &outb, dtype(dt), out_format);
            }
        }
    }
}

/// Rechunks `input` into one npy block of the whole array (`shape`) under
/// `root`: the JSON report, whose seeks made must equal the plan's, and
/// the block's data.
fn merge_to_npy(input: &Path, root: &Path, shape: &str) -> (serde_json::Value, Vec<u8>) {
    let out = root.join("out");
    let output = rechunkfs(
        &[
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            shape,
            "--format",
            "npy",
            "--json",
        ],
        0,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        common::json_u64(&report, "seeks.made"),
        common::json_u64(&report, "seeks.planned"),
        "{report}"
    );
    let name = vec!["0"; shape.split(',').count()].join("_") + ".npy";
    let (_, _, bytes) = common::block_bytes(&out.join(name), BlockFormat::Npy);
    (report, bytes)
}

#[test]
fn absent_chunks_are_the_fill_value() {
    require!(Readers);
    // zarr-python leaves out chunks it need not store; a missing chunk
    // reads as the fill value.
    let root = tempfile::tempdir().unwrap();
    let array = [20u64, 15];
    let input = root.path().join("in.zarr");
    zarr_python_writes(
        &input,
        &array,
        &[8, 6],
        "<u2",
        "2",
        &["--fill-value", "513", "--drop", "1,2", "--drop", "0,0"],
    );
    let (report, bytes) = merge_to_npy(&input, root.path(), "20,15");
    assert_eq!(report["fill_bytes"], (8 * 6 + 8 * 3) * 2, "{report}");
    let source = common::oracle::sample_bytes(&array, &[0, 0], &array, 2);
    for y in 0..20usize {
        for x in 0..15usize {
            let at = (y * 15 + x) * 2;
            let absent = (y < 8 && x < 6) || ((8..16).contains(&y) && x >= 12);
            let expected = if absent {
                &[1u8, 2][..]
            } else {
                &source[at..at + 2]
            };
            assert_eq!(&bytes[at..at + 2], expected, "element ({y}, {x})");
        }
    }
}

#[test]
fn an_absent_chunk_read_into_a_reused_buffer_is_zeros() {
    require!(Readers);
    // A merge of 4 MiB slabs, read in steps: the third step's buffer is the
    // first one's, written and handed back, still holding its bytes. The
    // third slab is an absent chunk, which reads as zeros.
    let root = tempfile::tempdir().unwrap();
    let array = [128u64, 256, 256];
    let input = root.path().join("in.zarr");
    zarr_python_writes(
        &input,
        &array,
        &[32, 256, 256],
        "<u2",
        "2",
        &["--drop", "2,0,0"],
    );
    let plan = rechunkfs(
        &[
            "plan",
            input.to_str().unwrap(),
            "--shape",
            "128,256,256",
            "--json",
        ],
        0,
    );
    assert!(plan.status.success(), "{}", stderr(&plan));
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan["read_steps"], 4, "{plan}");

    let (report, bytes) = merge_to_npy(&input, root.path(), "128,256,256");
    let slab = 32 * 256 * 256 * 2;
    assert_eq!(report["fill_bytes"], slab, "{report}");
    let mut expected = common::oracle::sample_bytes(&array, &[0, 0, 0], &array, 2);
    expected[2 * slab..3 * slab].fill(0);
    assert!(
        bytes == expected,
        "the merged array differs from the source"
    );
}

fn assert_refused(input: &Path, expected: &[&str]) {
    let out = input.with_extension("out");
    let output = rechunkfs(
        &[
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            "4,4",
        ],
        0,
    );
    assert!(!output.status.success(), "{} was accepted", input.display());
    let message = stderr(&output);
    assert!(message.contains(input.to_str().unwrap()), "{message}");
    for part in expected {
        assert!(message.contains(part), "expected {part:?} in: {message}");
    }
    assert!(
        !out.exists(),
        "nothing is written when the input is refused"
    );
}

#[test]
fn compressed_arrays_and_groups_are_refused_naming_the_path() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [10u64, 9];
    let compressed2 = root.path().join("compressed2.zarr");
    zarr_python_writes(&compressed2, &array, &[4, 4], "<u2", "2", &["--compressed"]);
    assert_refused(&compressed2, &[".zarray", "compressed", "compressors=None"]);
    let compressed3 = root.path().join("compressed3.zarr");
    zarr_python_writes(&compressed3, &array, &[4, 4], "<u2", "3", &["--compressed"]);
    assert_refused(&compressed3, &["zarr.json", "codecs are [bytes, zstd]"]);
    for version in ["2", "3"] {
        let group = root.path().join(format!("group{version}.zarr"));
        zarr_python_writes(&group, &array, &[4, 4], "<u2", version, &["--group"]);
        let data = group.join("data");
        assert_refused(
            &group,
            &["is a Zarr group, not an array", data.to_str().unwrap()],
        );
        // The array inside the group is fine.
        let out = root.path().join(format!("group{version}.out"));
        let output = rechunkfs(
            &[
                "rechunk",
                data.to_str().unwrap(),
                out.to_str().unwrap(),
                "--shape",
                "4,4",
            ],
            0,
        );
        assert!(output.status.success(), "{}", stderr(&output));
    }
    // Fortran order, and a damaged chunk.
    let fortran = root.path().join("fortran.zarr");
    zarr_python_writes(&fortran, &array, &[4, 4], "<u2", "2", &[]);
    let zarray = fortran.join(".zarray");
    let text = fs::read_to_string(&zarray)
        .unwrap()
        .replace("\"C\"", "\"F\"");
    fs::write(&zarray, text).unwrap();
    assert_refused(&fortran, &["Fortran order"]);
    let damaged = root.path().join("damaged.zarr");
    zarr_python_writes(&damaged, &array, &[4, 4], "<u2", "3", &[]);
    let chunk = damaged.join("c").join("1").join("1");
    fs::write(&chunk, [0u8; 7]).unwrap();
    assert_refused(&damaged, &["c/1/1", "is 32 bytes, but this file has 7"]);
}

#[test]
fn overwrite_replaces_a_zarr_array_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let array = [23u64, 19, 17];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[6, 5, 7],
        dtype("<u2"),
        BlockFormat::Npy,
    );
    for format in [BlockFormat::Zarr3, BlockFormat::Zarr] {
        let out = root.path().join(format!("out.{}", format.extension()));
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("notes.txt"), "mine").unwrap();
        for (shape, overwrite) in [("8,7,5", true), ("5,19,4", true), ("30,2,9", false)] {
            let mut args = vec![
                "rechunk",
                input.to_str().unwrap(),
                out.to_str().unwrap(),
                "--shape",
                shape,
                "--format",
                format.extension(),
                "--quiet",
            ];
            if overwrite {
                args.push("--overwrite");
            }
            let output = rechunkfs(&args, 0);
            if !overwrite {
                assert!(!output.status.success(), "a full OUT needs --overwrite");
                assert!(
                    stderr(&output).contains("--overwrite"),
                    "{}",
                    stderr(&output)
                );
                continue;
            }
            assert!(output.status.success(), "{}", stderr(&output));
            fs::rename(out.join("notes.txt"), root.path().join("notes.txt")).unwrap();
            let outb: Vec<u64> = shape.split(',').map(|n| n.parse().unwrap()).collect();
            // Exactly the new array's files: the old chunks are gone.
            verify_zarr_output(&out, &array, &outb, dtype("<u2"), format);
            fs::rename(root.path().join("notes.txt"), out.join("notes.txt")).unwrap();
        }
    }
}

#[test]
fn a_zarr_array_mounts_as_a_view_of_hdf5_blocks() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [37u64, 29, 23];
    let input = root.path().join("in.zarr");
    zarr_python_writes(
        &input,
        &array,
        &[10, 8, 7],
        "<i4",
        "3",
        &["--drop", "1,1,1"],
    );
    // The absent chunk is zeros, every other element the source's.
    let mounted = MountedView::new(&input, root.path(), "16,9,11", "h5", 0);
    let status = mounted.wait_complete();
    assert_eq!(
        common::json_u64(&status, "seeks_made"),
        common::json_u64(&status, "seeks_planned"),
        "{status}"
    );
    // Chunk (1, 1, 1) of 10x8x7, dropped above.
    let absent = ([10u64, 8, 7], [10u64, 8, 7]);
    let blocks = common::oracle::grid_blocks(&array, &[16, 9, 11]);
    assert_eq!(blocks.len(), 3 * 4 * 3);
    for block in &blocks {
        let path = mounted.view.join(format!("{}.h5", block.stem()));
        let read = common::readers::read_block(&path, "h5", "/data");
        assert_eq!(read.shape, block.shape, "{}", block.stem());
        assert_eq!(read.descr, "<i4", "{}", block.stem());
        let mut expected = common::oracle::sample_bytes(&array, &block.origin, &block.shape, 4);
        zero_inside(&mut expected, block, absent.0, absent.1, 4);
        assert!(
            read.data == expected,
            "{}: differs from the source",
            block.stem()
        );
    }
}

/// Zeroes, in `bytes` (the C-order data of `block`), the elements inside
/// the box at `origin` with `shape` of the whole array.
fn zero_inside(
    bytes: &mut [u8],
    block: &common::oracle::GridBlock,
    origin: [u64; 3],
    shape: [u64; 3],
    elem: usize,
) {
    let [n0, n1, n2] = [block.shape[0], block.shape[1], block.shape[2]];
    for i in 0..n0 {
        for j in 0..n1 {
            for k in 0..n2 {
                let at = [
                    block.origin[0] + i,
                    block.origin[1] + j,
                    block.origin[2] + k,
                ];
                let inside = (0..3).all(|d| at[d] >= origin[d] && at[d] < origin[d] + shape[d]);
                if inside {
                    let linear = ((i * n1 + j) * n2 + k) as usize * elem;
                    bytes[linear..linear + elem].fill(0);
                }
            }
        }
    }
}
