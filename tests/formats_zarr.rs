//! Zarr with the real readers: zarr-python and TensorStore open rechunkfs
//! views (real FUSE mounts) and `rechunk` outputs as Zarr v2 and v3 arrays
//! and read every region equal to the source, edge chunks included; Zarr
//! arrays written by zarr-python rechunk byte-exact to block files and to
//! Zarr, compressed (every codec, v2 and v3) and sharded too, with seeks
//! and peak memory as planned; groups are refused listing their arrays,
//! and `--array` picks one; codecs not decoded are refused, naming the
//! path and the problem. Python comes from RECHUNKFS_PYTHON or target/pyenv (made by
//! scripts/setup); mounts need /dev/fuse (and root or fusermount3).

#[macro_use]
mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use rechunkfs::format::BlockFormat;

use common::mounted::MountedView;
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

/// `input` mounted as blocks of `shape` in `format` (see [`MountedView::new`]).
fn mount_as(
    input: &Path,
    root: &Path,
    shape: &str,
    format: &str,
    step_delay_ms: u64,
) -> MountedView {
    MountedView::new(
        input,
        root,
        &["--shape", shape, "--format", format],
        step_delay_ms,
    )
}

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
            let mounted = mount_as(
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
        let mounted = mount_as(
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
fn a_view_of_a_sharded_compressed_array_reads_shards_whole() {
    require!(Fuse, Readers);
    // Shards decoded whole by the view's materialiser, which counts the
    // seeks it planned; then, filling slowly, blocks the readers ask for
    // are extracted ahead of the plan from decoded shards.
    let (dt, array, chunks) = (">u2", [40u64, 36, 30], [5u64, 9, 5]);
    let outb = [16u64, 9, 7];
    // 300 ms after each read block: the readers, which start Python
    // first, ask while the plan is still filling the view.
    for step_delay_ms in [0, 300] {
        let root = tempfile::tempdir().unwrap();
        let input = root.path().join("in.zarr");
        let extra = ["--codec", "blosc-zstd", "--shards", "10,18,10"];
        zarr_python_writes(&input, &array, &chunks, dt, "3", &extra);
        let shape = shape_text(&outb);
        let mounted = mount_as(&input, root.path(), &shape, "zarr3", step_delay_ms);
        both_readers_agree(&mounted.view, &array, &outb, dt, BlockFormat::Zarr3);
        let status = mounted.wait_complete();
        if step_delay_ms == 0 {
            assert_eq!(status["seeks_made"], status["seeks_planned"], "{status}");
        } else {
            assert!(status["on_demand_blocks"].as_u64() > Some(0), "{status}");
        }
        verify_zarr_output(&mounted.view, &array, &outb, dtype(dt), BlockFormat::Zarr3);
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

/// A compressed or sharded input: Zarr version, codec (as check_zarr.py
/// `write --codec` names it), dtype, array, chunks, shards (v3; none: not
/// sharded).
type CodecCase = (
    &'static str,
    &'static str,
    &'static str,
    [u64; 3],
    [u64; 3],
    Option<[u64; 3]>,
);

const CODEC_CASES: [CodecCase; 18] = [
    // zarr-python's defaults: zstd in both versions (zarr-python 3).
    ("2", "default", "<u2", [37, 29, 23], [10, 8, 7], None),
    ("3", "default", "<u2", [37, 29, 23], [10, 8, 7], None),
    ("2", "blosc-lz4", ">f4", [37, 29, 23], [16, 30, 7], None),
    ("2", "blosc-zstd", "<i4", [30, 24, 21], [10, 8, 7], None),
    ("2", "blosc-zlib", "|u1", [37, 29, 23], [10, 8, 7], None),
    ("2", "zstd", ">u2", [37, 29, 23], [10, 8, 7], None),
    ("2", "gzip", "<f8", [17, 13, 11], [5, 6, 4], None),
    ("2", "zlib", ">i8", [17, 13, 11], [5, 6, 4], None),
    ("3", "blosc-lz4", ">u2", [37, 29, 23], [10, 8, 7], None),
    ("3", "blosc-zstd", "<f4", [30, 24, 21], [10, 8, 7], None),
    ("3", "blosc-zlib", ">i8", [17, 13, 11], [5, 6, 4], None),
    ("3", "zstd", ">f4", [37, 29, 23], [12, 12, 40], None),
    ("3", "gzip", "<i2", [37, 29, 23], [10, 8, 7], None),
    ("3", "crc32c", "<u2", [37, 29, 23], [10, 8, 7], None),
    // Sharded: uncompressed and compressed inside, shards that do and do
    // not divide the array.
    (
        "3",
        "none",
        "<u2",
        [37, 29, 23],
        [5, 4, 7],
        Some([10, 8, 14]),
    ),
    (
        "3",
        "zstd",
        ">f4",
        [30, 24, 21],
        [5, 4, 7],
        Some([10, 8, 7]),
    ),
    (
        "3",
        "blosc-lz4",
        "<i4",
        [37, 29, 23],
        [5, 8, 7],
        Some([20, 16, 14]),
    ),
    (
        "3",
        "crc32c",
        ">u2",
        [17, 13, 11],
        [5, 6, 4],
        Some([10, 12, 8]),
    ),
];

/// Rechunks `input` to `out` as `args` add, and holds the run to its plan:
/// seeks made equal those planned, the peak memory held equals the
/// predicted one, and every encoded input block (`blocks` of them) is read
/// with one seek. Returns the JSON report.
fn rechunk_as_planned(input: &Path, out: &Path, args: &[&str], blocks: u64) -> serde_json::Value {
    let mut all = vec![
        "rechunk",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--json",
    ];
    all.extend(args);
    let output = rechunkfs(&all, 0);
    assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    common::assert_counts_as_planned(&report, &report.to_string());
    assert_eq!(common::json_u64(&report, "seeks.read"), blocks, "{report}");
    report
}

#[test]
fn compressed_and_sharded_zarr_arrays_rechunk_byte_exact() {
    require!(Readers);
    let outputs = [
        (BlockFormat::Hdf5, [16u64, 9, 11]),
        (BlockFormat::Npy, [40, 40, 40]),
        (BlockFormat::Zarr, [8, 10, 6]),
        (BlockFormat::Zarr3, [20, 29, 5]),
    ];
    for (n, (version, codec, dt, array, chunks, shards)) in CODEC_CASES.into_iter().enumerate() {
        let root = tempfile::tempdir().unwrap();
        let input = root.path().join("in.zarr");
        let mut extra = vec!["--codec", codec];
        let shard_text = shards.map(|s| shape_text(&s));
        if let Some(text) = &shard_text {
            extra.extend(["--shards", text.as_str()]);
        }
        zarr_python_writes(&input, &array, &chunks, dt, version, &extra);
        // An input block is a chunk, or a whole shard.
        let block = shards.unwrap_or(chunks);
        let blocks: u64 = (0..3).map(|d| array[d].div_ceil(block[d])).product();
        // Each case goes to one block-file format and one Zarr version;
        // every third one within a memory limit, so the search plans it.
        let (files, zarr) = (outputs[n % 2], outputs[2 + (n / 2) % 2]);
        for (k, (out_format, outb)) in [files, zarr].into_iter().enumerate() {
            let out = root.path().join(format!("out{k}"));
            let shape = shape_text(&outb);
            let mut args = vec!["--shape", &shape, "--format", out_format.extension()];
            if n % 3 == 2 {
                args.extend(["--mem", "100K"]);
            }
            rechunk_as_planned(&input, &out, &args, blocks);
            let outb: Vec<u64> = outb.iter().zip(&array).map(|(&b, &a)| b.min(a)).collect();
            if common::is_zarr(out_format) {
                verify_zarr_output(&out, &array, &outb, dtype(dt), out_format);
                both_readers_agree(&out, &array, &outb, dt, out_format);
            } else {
                verify_output(&out, &array, &outb, dtype(dt), out_format);
            }
        }
    }
}

#[test]
fn missing_chunks_and_inner_chunks_are_the_fill_value() {
    require!(Readers);
    // A sharded array missing an inner chunk (its shard's index says so)
    // and a whole shard; and a compressed v2 array missing a chunk.
    let array = [20u64, 15];
    for (version, chunks, extra) in [
        (
            "3",
            [4u64, 3],
            &[
                "--codec",
                "zstd",
                "--shards",
                "8,6",
                "--empty-chunk",
                "1,1",
                "--drop",
                "2,2",
            ][..],
        ),
        ("2", [8, 6], &["--codec", "blosc-lz4", "--drop", "1,1"][..]),
    ] {
        let root = tempfile::tempdir().unwrap();
        let input = root.path().join("in.zarr");
        let mut args = extra.to_vec();
        args.extend(["--fill-value", "513"]);
        zarr_python_writes(&input, &array, &chunks, "<u2", version, &args);
        let (report, bytes) = merge_to_npy(&input, root.path(), "20,15");
        assert_eq!(
            report["peak_memory_bytes"], report["planned_peak_memory_bytes"],
            "{report}"
        );
        let source = common::oracle::sample_bytes(&array, &[0, 0], &array, 2);
        // v3: inner chunk (1,1) is [4,8)×[3,6); shard (2,2) is [16,20)×[12,15).
        // v2: chunk (1,1) is [8,16)×[6,12).
        let fill = |y: usize, x: usize| {
            if version == "3" {
                ((4..8).contains(&y) && (3..6).contains(&x)) || (y >= 16 && x >= 12)
            } else {
                (8..16).contains(&y) && (6..12).contains(&x)
            }
        };
        for y in 0..20usize {
            for x in 0..15usize {
                let at = (y * 15 + x) * 2;
                let expected = if fill(y, x) {
                    &[1u8, 2][..]
                } else {
                    &source[at..at + 2]
                };
                assert_eq!(
                    &bytes[at..at + 2],
                    expected,
                    "v{version} element ({y}, {x})"
                );
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

/// Edits the JSON metadata file at `path` in place.
fn rewrite_metadata(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut meta: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    edit(&mut meta);
    fs::write(path, serde_json::to_vec(&meta).unwrap()).unwrap();
}

fn assert_refused(input: &Path, expected: &[&str]) {
    let out = refused_run(input, expected);
    assert!(
        !out.exists(),
        "nothing is written when the input is refused"
    );
}

/// As [`assert_refused`], for a chunk the run reaches: the blocks finished
/// before it are kept, none of the run's temporaries.
fn assert_refused_mid_run(input: &Path, expected: &[&str]) {
    let out = refused_run(input, expected);
    let mut pending = vec![out.clone()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            assert!(
                !path.to_string_lossy().ends_with(".partial"),
                "{} left",
                path.display()
            );
            if path.is_dir() {
                pending.push(path);
            }
        }
    }
}

/// Runs `rechunk` of `input`, which must be refused saying `expected`;
/// returns the OUT it was given.
fn refused_run(input: &Path, expected: &[&str]) -> std::path::PathBuf {
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
    out
}

#[test]
fn groups_and_codecs_not_decoded_are_refused_naming_the_path() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [10u64, 9];
    // Filters (v2) and transpose (v3) change values or order: refused.
    let filtered = root.path().join("filtered.zarr");
    zarr_python_writes(&filtered, &array, &[4, 4], "<u2", "2", &["--codec", "zstd"]);
    rewrite_metadata(&filtered.join(".zarray"), |meta| {
        meta["filters"] = serde_json::json!([{"id": "delta", "dtype": "<u2"}]);
    });
    assert_refused(&filtered, &[".zarray", "filters (delta)"]);
    let transposed = root.path().join("transposed.zarr");
    zarr_python_writes(
        &transposed,
        &array,
        &[4, 4],
        "<u2",
        "3",
        &["--codec", "zstd"],
    );
    rewrite_metadata(&transposed.join("zarr.json"), |meta| {
        let codecs = meta["codecs"].as_array_mut().unwrap();
        codecs.insert(
            0,
            serde_json::json!({"name": "transpose", "configuration": {"order": [1, 0]}}),
        );
    });
    assert_refused(&transposed, &["zarr.json", "transpose is not decoded"]);
    // A damaged compressed chunk stops the run, naming it.
    let damaged = root.path().join("damaged-zstd.zarr");
    zarr_python_writes(&damaged, &array, &[4, 4], "<u2", "3", &["--codec", "zstd"]);
    fs::write(damaged.join("c").join("1").join("1"), [7u8; 9]).unwrap();
    assert_refused_mid_run(&damaged, &["c/1/1", "cannot be decoded"]);
    for version in ["2", "3"] {
        let group = root.path().join(format!("group{version}.zarr"));
        zarr_python_writes(
            &group,
            &array,
            &[4, 4],
            "<u2",
            version,
            &["--group", "--codec", "default"],
        );
        assert_refused(
            &group,
            &[
                "is a Zarr group, not an array",
                "--array: data, other/deeper",
            ],
        );
        // --array picks an array, nested ones too; each is the sample array.
        for name in ["data", "other/deeper"] {
            let out = root.path().join(format!("group{version}.out"));
            let output = rechunkfs(
                &[
                    "rechunk",
                    group.to_str().unwrap(),
                    out.to_str().unwrap(),
                    "--array",
                    name,
                    "--shape",
                    "4,5",
                    "--format",
                    "npy",
                    "--overwrite",
                ],
                0,
            );
            assert!(output.status.success(), "{name}: {}", stderr(&output));
            verify_output(&out, &array, &[4, 5], dtype("<u2"), BlockFormat::Npy);
        }
        let output = rechunkfs(
            &[
                "plan",
                group.to_str().unwrap(),
                "--array",
                "nothing",
                "--shape",
                "4,4",
            ],
            0,
        );
        assert!(!output.status.success());
        let message = stderr(&output);
        assert!(
            message.contains("holds no Zarr array at nothing; its arrays: data, other/deeper"),
            "{message}"
        );
    }
    let plain = root.path().join("plain.zarr");
    zarr_python_writes(&plain, &array, &[4, 4], "<u2", "2", &[]);
    let output = rechunkfs(
        &[
            "plan",
            plain.to_str().unwrap(),
            "--array",
            "data",
            "--shape",
            "4,4",
        ],
        0,
    );
    assert!(
        stderr(&output).contains("is not a Zarr group"),
        "{}",
        stderr(&output)
    );
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
    assert_refused_mid_run(&damaged, &["c/1/1", "is 32 bytes, but this file has 7"]);
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
    let mounted = mount_as(&input, root.path(), "16,9,11", "h5", 0);
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
