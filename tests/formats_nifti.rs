//! NIfTI (1 and 2, plain and gzipped), MINC2 and raw blocks checked by the
//! readers people use: nibabel loads every `.nii` block (of `rechunk`
//! outputs and of a real FUSE view) and finds its voxels, voxel sizes and
//! place in the world right; nifti_tool (the NIfTI library's) reads NIfTI-2
//! outputs; h5py reads the `.h5` blocks made from MINC2; numpy reads raw
//! blocks with the metadata file. Inputs are made by nibabel (NIfTI, and
//! the images it ships for its own tests) and h5py (MINC2, laid out so
//! nibabel's MINC2 reader, the ground truth, loads them) through
//! `tests/fixtures/make_nifti.py` and `tests/fixtures/make_minc2.py`;
//! `tests/fixtures/check_blocks.py` does the checking. Also: gzipped inputs
//! are read whole, once, as planned, and damaged ones are refused naming the
//! file; what NIfTI cannot hold is refused, with a message, before anything
//! is written; and shapes follow the input's axis order.

#[macro_use]
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rechunkfs::format::BlockFormat;

use common::mounted::MountedView;
use common::{dtype, make_blocks, python, run_fixture, stderr};

fn rechunkfs(args: &[&str]) -> Output {
    common::run_rechunkfs(args, 0)
}

fn text(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// A NIfTI image made by nibabel: `DIR/whole.nii` and `DIR/blocks/{i}_{j}_{k}.nii`.
fn make_nifti(dir: &Path, shape: &str, descr: &str, blocks: &str, scale: Option<&str>) {
    let mut args = vec![
        text(dir),
        "--shape",
        shape,
        "--dtype",
        descr,
        "--blocks",
        blocks,
    ];
    if let Some(scale) = scale {
        args.extend(["--scale", scale]);
    }
    run_fixture("make_nifti.py", &args);
}

/// A MINC2 image made by h5py: `DIR/whole.mnc` and `DIR/blocks/{i}_{j}_{k}.mnc`.
fn make_minc2(dir: &Path, shape: &str, descr: &str, blocks: &str, scaling: &str) {
    run_fixture(
        "make_minc2.py",
        &[
            text(dir),
            "--shape",
            shape,
            "--dtype",
            descr,
            "--blocks",
            blocks,
            "--scaling",
            scaling,
        ],
    );
}

/// `rechunk IN OUT --shape SHAPE [--format FORMAT]`, which must succeed,
/// with seeks as planned.
fn rechunk_ok(input: &Path, out: &Path, shape: &str, format: Option<&str>) {
    rechunk_ok_with(input, out, shape, format, &[]);
}

/// As [`rechunk_ok`], with `extra` arguments.
fn rechunk_ok_with(input: &Path, out: &Path, shape: &str, format: Option<&str>, extra: &[&str]) {
    let mut args = vec![
        "rechunk",
        text(input),
        text(out),
        "--shape",
        shape,
        "--json",
        "--mem",
        "4K",
    ];
    if let Some(format) = format {
        args.extend(["--format", format]);
    }
    args.extend(extra);
    let output = rechunkfs(&args);
    assert!(
        output.status.success(),
        "rechunk {args:?}: {}",
        stderr(&output)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    assert_eq!(
        common::json_u64(&report, "seeks.made"),
        common::json_u64(&report, "seeks.planned")
    );
}

/// `check_blocks.py`: every block of `out` against the whole image `reference`.
fn check(out: &Path, reference: &Path, block: Option<&str>, format: &str, extra: &[&str]) {
    let mut args = vec![
        text(out),
        "--reference",
        text(reference),
        "--format",
        format,
    ];
    if let Some(block) = block {
        args.extend(["--block", block]);
    }
    args.extend_from_slice(extra);
    let said = run_fixture("check_blocks.py", &args);
    assert!(said.contains("voxels exact, placed right"), "{said}");
}

#[test]
fn nifti_input_rechunks_to_nifti_h5_and_raw_that_readers_place_right() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // Shapes are nibabel's (x, y, z); 11, 9, 7 divide by neither 4 nor 5.
    for (descr, scale) in [("|u1", None), (">i2", Some("2,-3")), ("<f4", None)] {
        let base = root.path().join(descr.replace(['|', '<', '>'], "_"));
        make_nifti(&base, "11,9,7", descr, "4,4,4", scale);
        let whole = base.join("whole.nii");
        let blocks = base.join("blocks");
        for (index, (shape, format)) in [
            ("5,5,5", "nii"),
            ("11,3,7", "nii"),
            ("5,5,5", "h5"),
            ("4,9,2", "raw"),
        ]
        .into_iter()
        .enumerate()
        {
            let out = base.join(format!("out{index}"));
            rechunk_ok(&blocks, &out, shape, Some(format));
            let block = (format != "raw").then_some(shape);
            check(&out, &whole, block, format, &[]);
        }
        // Splitting the single file follows the same rule (and the default
        // output format is the input's).
        let split = base.join("split");
        rechunk_ok(&whole, &split, "6,4,7", None);
        check(&split, &whole, Some("6,4,7"), "nii", &[]);
        // Real files put the data right after the header.
        let first = fs::read(split.join("0_0_0.nii")).unwrap();
        let vox_offset: [u8; 4] = first[108..112].try_into().unwrap();
        let value = if descr == ">i2" {
            f32::from_be_bytes(vox_offset)
        } else {
            f32::from_le_bytes(vox_offset)
        };
        assert_eq!(value, 352.0);
        if descr == ">i2" {
            // A big-endian input makes big-endian outputs: bytes moved, never swapped.
            assert_eq!(&first[0..4], &348i32.to_be_bytes());
        }
    }
}

#[test]
fn minc2_input_rechunks_to_nifti_and_h5_that_nibabel_and_h5py_read() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // Shapes are C order, as the image's dimorder zspace,yspace,xspace lists them.
    for (descr, scaling) in [
        ("<u2", "global"),
        (">i2", "none"),
        ("<f4", "global"),
        ("|u1", "global"),
    ] {
        let base = root.path().join(descr.replace(['|', '<', '>'], "_"));
        make_minc2(&base, "7,9,11", descr, "4,4,4", scaling);
        let whole = base.join("whole.mnc");
        let blocks = base.join("blocks");
        for (index, (input, shape, format)) in [
            (&blocks, "5,5,5", Some("nii")),
            (&blocks, "7,3,11", Some("nii")),
            (&whole, "3,4,5", Some("nii")),
            (&blocks, "5,5,5", None),
            (&whole, "2,9,4", Some("h5")),
        ]
        .into_iter()
        .enumerate()
        {
            let out = base.join(format!("out{index}"));
            // HDF5 cannot record an integer image's scaling: its stored
            // values are written only when asked for.
            let scaled_to_h5 = format != Some("nii") && descr != "<f4" && scaling != "none";
            let values: &[&str] = if scaled_to_h5 {
                &["--values", "stored"]
            } else {
                &[]
            };
            rechunk_ok_with(input, &out, shape, format, values);
            // MINC2 input is written as plain HDF5 unless told otherwise.
            check(&out, &whole, Some(shape), format.unwrap_or("h5"), &[]);
        }
    }
}

#[test]
fn per_slice_minc2_scaling_is_refused_until_values_says_which() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    make_minc2(root.path(), "6,5,4", "<u2", "3,5,4", "per-slice");
    let blocks = root.path().join("blocks");
    let out = root.path().join("out");
    let output = rechunkfs(&[
        "rechunk",
        text(&blocks),
        text(&out),
        "--shape",
        "4,4,4",
        "--format",
        "nii",
    ]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("varies per slice") && message.contains("h5"),
        "{message}"
    );
    assert!(!out.exists(), "nothing may be written when refused");
    // A view is refused the same way, before anything is mounted.
    let view = root.path().join("view");
    fs::create_dir(&view).unwrap();
    let mount = rechunkfs(&[
        "mount",
        text(&blocks),
        text(&view),
        "--shape",
        "4,4,4",
        "--format",
        "nii",
        "--staging",
        text(&root.path().join("staging")),
    ]);
    assert!(!mount.status.success());
    assert!(
        stderr(&mount).contains("varies per slice"),
        "{}",
        stderr(&mount)
    );
    assert!(!rechunkfs::fuse::session::is_mounted(&view));
    assert!(
        !root.path().join("staging").exists(),
        "no staging area for a refused view"
    );
    let unsaid = rechunkfs(&["rechunk", text(&blocks), text(&out), "--shape", "4,4,4"]);
    assert!(
        !unsaid.status.success(),
        "HDF5 output cannot record the scaling"
    );
    let message = stderr(&unsaid);
    assert!(
        message.contains("--values scaled") && message.contains("--values stored"),
        "{message}"
    );
    assert!(!out.exists(), "nothing may be written when refused");
    rechunk_ok_with(&blocks, &out, "4,4,4", Some("h5"), &["--values", "stored"]);
    check(
        &out,
        &root.path().join("whole.mnc"),
        Some("4,4,4"),
        "h5",
        &[],
    );
}

#[test]
fn hdf5_input_makes_nifti_blocks_placed_by_their_voxel_offset() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // C order for HDF5 input: names and --shape are (z, y, x) here.
    let array = [9u64, 10, 11];
    let input = make_blocks(
        root.path(),
        "in",
        &array,
        &[4, 4, 4],
        dtype(">i2"),
        BlockFormat::Hdf5,
    );
    let reference = make_blocks(
        root.path(),
        "whole",
        &array,
        &array,
        dtype(">i2"),
        BlockFormat::Hdf5,
    );
    let out = root.path().join("out");
    rechunk_ok(&input, &out, "5,3,11", Some("nii"));
    check(
        &out,
        &reference.join("0_0_0.h5"),
        Some("5,3,11"),
        "nii",
        &[],
    );
    // nibabel's shape of C-order block (5, 3, 11) is (11, 3, 5).
    let probe = Command::new(python())
        .args([
            "-c",
            "import nibabel, sys; print(nibabel.load(sys.argv[1]).shape)",
            text(&out.join("1_3_0.nii")),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "(11, 1, 4)");
}

/// `rechunk` must fail naming `expected`, and write nothing.
fn assert_refused(args: &[&str], out: &Path, expected: &[&str]) {
    let output = rechunkfs(args);
    assert!(!output.status.success(), "should refuse {args:?}");
    let message = stderr(&output);
    for part in expected {
        assert!(message.contains(part), "message lacks '{part}': {message}");
    }
    assert!(!out.exists(), "nothing may be written when refused");
}

#[test]
fn what_nifti_cannot_hold_is_refused_with_a_message() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");

    // More than 7 dimensions.
    let eight = make_blocks(
        root.path(),
        "eight",
        &[2, 1, 1, 1, 1, 1, 1, 2],
        &[1, 1, 1, 1, 1, 1, 1, 2],
        dtype("u1"),
        BlockFormat::Npy,
    );
    assert_refused(
        &[
            "rechunk",
            text(&eight),
            text(&out),
            "--shape",
            "2,1,1,1,1,1,1,1",
            "--format",
            "nii",
        ],
        &out,
        &["NIfTI-1 holds at most 7 dimensions", "8"],
    );

    // float16, which NIfTI-1 has no datatype for.
    let half = make_blocks(
        root.path(),
        "half",
        &[4, 4, 4],
        &[2, 2, 2],
        dtype("<f2"),
        BlockFormat::Hdf5,
    );
    assert_refused(
        &[
            "rechunk",
            text(&half),
            text(&out),
            "--shape",
            "4,4,4",
            "--format",
            "nii",
        ],
        &out,
        &["NIfTI-1 has no datatype", "f2", "float16"],
    );

    // MINC2 is read, not written.
    assert_refused(
        &[
            "rechunk",
            text(&half),
            text(&out),
            "--shape",
            "4,4,4",
            "--format",
            "mnc",
        ],
        &out,
        &["does not write"],
    );
}

#[test]
fn shapes_and_names_follow_the_input_formats_axis_order() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    make_nifti(root.path(), "11,9,7", "<i2", "4,4,4", None);
    let blocks = root.path().join("blocks");
    // nibabel says (11, 9, 7): so does plan, and --shape is (x, y, z).
    let output = rechunkfs(&["plan", text(&blocks), "--shape", "11,3,7", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["array"], serde_json::json!([11, 9, 7]));
    assert_eq!(report["input_block"], serde_json::json!([4, 4, 4]));
    assert_eq!(report["output_block"], serde_json::json!([11, 3, 7]));
    assert_eq!(report["output_grid"], serde_json::json!([1, 3, 1]));
    assert_eq!(report["axis_order"], "nifti");
    let human = rechunkfs(&["plan", text(&blocks), "--shape", "11,3,7"]);
    let said = String::from_utf8_lossy(&human.stdout);
    assert!(
        said.contains("11×9×7") && said.contains("(x, y, z)"),
        "{said}"
    );

    // Written as HDF5, the blocks keep the NIfTI names: 0_2_0 is the third
    // along y, and h5py sees its C-order shape (7, 3, 11).
    let out = root.path().join("out");
    rechunk_ok(&blocks, &out, "11,3,7", Some("h5"));
    let mut names: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["0_0_0.h5", "0_1_0.h5", "0_2_0.h5"]);
    let probe = Command::new(python())
        .args([
            "-c",
            "import h5py, sys; print(h5py.File(sys.argv[1])['/data'].shape)",
            text(&out.join("0_2_0.h5")),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "(7, 3, 11)");

    // `rechunkfs sample --format nii` follows the rule too: --array is (x, y, z).
    let sample = root.path().join("sample");
    let made = rechunkfs(&[
        "sample",
        text(&sample),
        "--array",
        "10,5,3",
        "--blocks",
        "4,5,3",
        "--dtype",
        "<u2",
        "--format",
        "nii",
    ]);
    assert!(made.status.success(), "{}", stderr(&made));
    assert!(sample.join("2_0_0.nii").exists());
    let resplit = root.path().join("resplit");
    rechunk_ok(&sample, &resplit, "3,2,3", None);
    // Checked against the sample's definition, in C order (z, y, x), with
    // names in NIfTI's (x, y, z) order.
    let c_array = [3u64, 5, 10];
    let blocks = common::oracle::grid_blocks(&c_array, &[3, 2, 3]);
    assert_eq!(blocks.len(), 12);
    for block in &blocks {
        let user: Vec<String> = block.index.iter().rev().map(u64::to_string).collect();
        let path = resplit.join(format!("{}.nii", user.join("_")));
        let read = common::readers::read_block(&path, "nii", "");
        assert_eq!(read.shape, block.shape, "{}", path.display());
        assert_eq!(read.descr, "<u2", "{}", path.display());
        let expected = common::oracle::sample_bytes(&c_array, &block.origin, &block.shape, 2);
        assert!(
            read.data == expected,
            "{}: differs from the sample",
            path.display()
        );
    }

    // The rule is in --help.
    for command in ["mount", "rechunk", "plan"] {
        let help = rechunkfs(&[command, "--help"]);
        let said = String::from_utf8_lossy(&help.stdout);
        assert!(
            said.contains("the input's format decides it") && said.contains("(x, y, z)"),
            "{command} --help: {said}"
        );
    }
}

/// `input` mounted on `base/view` as blocks of `shape` in `format`, with
/// `extra` arguments.
fn mount(input: &Path, base: &Path, (shape, format): (&str, &str), extra: &[&str]) -> MountedView {
    let args = [&["--shape", shape, "--format", format][..], extra].concat();
    MountedView::new(input, base, &args, 0)
}

/// Waits for `mounted` to complete, which it must with the seeks planned.
fn wait_complete_as_planned(mounted: &MountedView) {
    let status = mounted.wait_complete();
    assert_eq!(status["seeks_made"], status["seeks_planned"], "{status}");
}

#[test]
fn nibabel_and_numpy_read_every_block_of_a_mounted_view() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let nifti = root.path().join("nifti");
    make_nifti(&nifti, "11,9,7", ">i2", "4,4,4", Some("0.5,10"));
    let minc = root.path().join("minc");
    make_minc2(&minc, "7,9,11", "<u2", "4,4,4", "global");
    let gzipped = root.path().join("gzipped");
    let gzipped_whole = make_nifti_as(&gzipped, "11,9,7", "<f4", "4,4,4", &["--gzip"]);
    for (name, input, whole, shape, format) in [
        (
            "nii-nii",
            nifti.join("blocks"),
            nifti.join("whole.nii"),
            "5,5,5",
            "nii",
        ),
        (
            "mnc-nii",
            minc.join("blocks"),
            minc.join("whole.mnc"),
            "5,4,11",
            "nii",
        ),
        (
            "mnc-h5",
            minc.join("blocks"),
            minc.join("whole.mnc"),
            "5,4,11",
            "h5",
        ),
        (
            "niigz-nii2",
            gzipped.join("blocks"),
            gzipped_whole.clone(),
            "5,5,5",
            "nii2",
        ),
        (
            "nii-raw",
            nifti.join("blocks"),
            nifti.join("whole.nii"),
            "5,5,5",
            "raw",
        ),
    ] {
        let base = root.path().join(name);
        // HDF5 output cannot record MINC2's scaling: the stored values are asked for.
        let values: &[&str] = if name == "mnc-h5" {
            &["--values", "stored"]
        } else {
            &[]
        };
        let mounted = mount(&input, &base, (shape, format), values);
        // Read while it fills: nibabel's reads wait for pending blocks.
        let (format, extra): (&str, &[&str]) = match format {
            "nii" => ("nii", &["--vox-offset", "4096"]),
            "nii2" => ("nii", &["--vox-offset", "4096", "--nifti-version", "2"]),
            other => (other, &[]),
        };
        check(&mounted.view, &whole, Some(shape), format, extra);
        wait_complete_as_planned(&mounted);
        let umount = rechunkfs(&["umount", text(&mounted.view)]);
        assert!(umount.status.success(), "{}", stderr(&umount));
    }
}

/// A NIfTI image made by nibabel as `options` say (`--gzip`: `.nii.gz`
/// files; `--nifti2`: NIfTI-2): `DIR/whole.nii[.gz]` and
/// `DIR/blocks/{i}_{j}_{k}.nii[.gz]`. Returns the whole file.
fn make_nifti_as(dir: &Path, shape: &str, descr: &str, blocks: &str, options: &[&str]) -> PathBuf {
    let mut args = vec![
        text(dir),
        "--shape",
        shape,
        "--dtype",
        descr,
        "--blocks",
        blocks,
    ];
    args.extend_from_slice(options);
    run_fixture("make_nifti.py", &args);
    let ext = if options.contains(&"--gzip") {
        "nii.gz"
    } else {
        "nii"
    };
    dir.join(format!("whole.{ext}"))
}

/// The files of `input` (a file, or a directory of block files) and
/// their total size.
fn input_files(input: &Path) -> (u64, u64) {
    if input.is_file() {
        return (1, fs::metadata(input).unwrap().len());
    }
    fs::read_dir(input)
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .fold((0, 0), |(n, bytes), len| (n + 1, bytes + len))
}

/// Rechunks `input` to `out` as `args` add and holds the run to its plan:
/// seeks made and peak memory held are those planned, and when `gzipped`
/// every input file is read whole, once, in one call. Returns stderr.
fn rechunk_as_planned(input: &Path, out: &Path, args: &[&str], gzipped: bool) -> String {
    let mut all = vec!["rechunk", text(input), text(out), "--json"];
    all.extend_from_slice(args);
    let output = rechunkfs(&all);
    assert!(output.status.success(), "{all:?}: {}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    common::assert_counts_as_planned(&report, &report.to_string());
    if gzipped {
        let (files, bytes) = input_files(input);
        assert_eq!(common::json_u64(&report, "seeks.read"), files, "{report}");
        assert_eq!(common::json_u64(&report, "bytes_read"), bytes, "{report}");
    }
    stderr(&output)
}

#[test]
fn gzipped_and_nifti2_images_rechunk_byte_exact_as_planned() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // Shapes are nibabel's (x, y, z): 23, 17, 9 in blocks of 8, 8, 4 leave
    // smaller edge blocks; 24, 16, 8 divides evenly.
    let cases: [(&str, &str, &str, &[&str]); 5] = [
        ("23,17,9", "8,8,4", "|u1", &["--gzip"]),
        ("24,16,8", "8,8,4", "<i2", &["--gzip"]),
        ("23,17,9", "8,6,4", ">f4", &["--gzip", "--nifti2"]),
        ("24,16,8", "8,8,4", "<f8", &["--nifti2"]),
        ("23,17,9", "23,5,9", ">u2", &["--gzip"]),
    ];
    for (n, (shape, blocks, descr, options)) in cases.into_iter().enumerate() {
        let base = root.path().join(format!("case{n}"));
        let whole = make_nifti_as(&base, shape, descr, blocks, options);
        let gzipped = options.contains(&"--gzip");
        let outputs: [(&str, &str, &[&str]); 4] = [
            ("10,10,10", "nii", &[]),
            ("7,17,3", "h5", &[]),
            ("9,6,9", "nii2", &["--nifti-version", "2"]),
            // Within a memory limit, so the planner searches.
            ("5,9,9", "nii", &["--mem"]),
        ];
        for (k, (out_shape, format, extra)) in outputs.into_iter().enumerate() {
            for (what, input) in [("blocks", base.join("blocks")), ("whole", whole.clone())] {
                let out = base.join(format!("out-{what}-{k}"));
                let mut args = vec!["--shape", out_shape, "--format", format];
                let mut check_extra = extra.to_vec();
                if extra == ["--mem"] {
                    check_extra.clear();
                    // A file read whole needs room for it and its decoded
                    // copy: only the blocks fit so small a limit.
                    if what == "whole" {
                        continue;
                    }
                    args.extend(["--mem", "12K"]);
                }
                rechunk_as_planned(&input, &out, &args, gzipped);
                let format = if format == "nii2" { "nii" } else { format };
                check(&out, &whole, Some(out_shape), format, &check_extra);
            }
        }
    }
}

/// The NIfTI images nibabel ships for its own tests.
fn nibabel_test_data() -> PathBuf {
    let output = Command::new(python())
        .args([
            "-c",
            "import nibabel, os; print(os.path.join(os.path.dirname(nibabel.__file__), 'tests', 'data'))",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

#[test]
fn nibabels_own_test_images_rechunk_byte_exact() {
    require!(Readers);
    let data = nibabel_test_data();
    let root = tempfile::tempdir().unwrap();
    // NIfTI-1 gzipped (4-D, and a small one), NIfTI-2 gzipped, NIfTI-1
    // big-endian, and a NIfTI-2 CIFTI file (6-D, with extensions before
    // its data); output shapes that do not divide them.
    for (name, shape) in [
        ("example4d.nii.gz", "50,40,10,1"),
        ("standard.nii.gz", "3,2,7"),
        ("example_nifti2.nii.gz", "7,20,5,2"),
        ("anatomical.nii", "10,41,8"),
        ("row_major.dconn.nii", "1,1,1,1,3,4"),
    ] {
        let input = data.join(name);
        assert!(input.exists(), "nibabel ships {}", input.display());
        for (format, extra) in [("nii", &[][..]), ("nii2", &["--nifti-version", "2"][..])] {
            let out = root.path().join(format!("{name}-{format}"));
            rechunk_as_planned(
                &input,
                &out,
                &["--shape", shape, "--format", format],
                name.ends_with(".gz"),
            );
            check(&out, &input, Some(shape), "nii", extra);
        }
    }
}

/// `nifti_tool`'s output for `args`, failing the test if it fails.
fn nifti_tool(args: &[&str]) -> String {
    let output = Command::new("nifti_tool").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "nifti_tool {args:?}: {}",
        stderr(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn nifti2_blocks_on_request_and_for_long_sides_read_by_nibabel_and_nifti_tool() {
    require!(Readers, NiftiTool);
    let root = tempfile::tempdir().unwrap();
    // 40,000 voxels along x: more than NIfTI-1 can say, so nibabel writes
    // the input as NIfTI-2, gzipped, in blocks of 15,000.
    let base = root.path().join("long");
    let whole = make_nifti_as(
        &base,
        "40000,3,2",
        "|u1",
        "15000,3,1",
        &["--gzip", "--nifti2"],
    );
    let blocks = base.join("blocks");

    // NIfTI-1 asked for, NIfTI-2 needed: written as NIfTI-2, and said.
    let out = root.path().join("auto");
    let said = rechunk_as_planned(
        &blocks,
        &out,
        &["--shape", "40000,2,1", "--format", "nii"],
        true,
    );
    assert!(said.contains("writing NIfTI-2 blocks, not NIfTI"), "{said}");
    check(
        &out,
        &whole,
        Some("40000,2,1"),
        "nii",
        &["--nifti-version", "2"],
    );
    let header = nifti_tool(&["-disp_hdr", "-infiles", text(&out.join("0_1_1.nii"))]);
    assert!(header.contains("N-2 header file"), "{header}");
    assert!(header.contains("3 40000 1 1 1 1 1 1"), "{header}");
    // nifti_tool's values of a row of x agree with nibabel's of the input.
    let row = nifti_tool(&[
        "-disp_ci",
        "-1",
        "0",
        "0",
        "0",
        "0",
        "0",
        "0",
        "-quiet",
        "-infiles",
        text(&out.join("0_1_1.nii")),
    ]);
    let expected = Command::new(python())
        .args([
            "-c",
            "import nibabel, numpy, sys; d = numpy.asanyarray(nibabel.load(sys.argv[1]).dataobj.get_unscaled()); print(' '.join(map(str, d[:, 2, 1])))",
            text(&whole),
        ])
        .output()
        .unwrap();
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        String::from_utf8_lossy(&expected.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
    );

    // Within NIfTI-1's limit, nii stays NIfTI-1; nii2 asks for NIfTI-2.
    for (format, version) in [("nii", "1"), ("nii2", "2")] {
        let out = root.path().join(format);
        let said = rechunk_as_planned(
            &blocks,
            &out,
            &["--shape", "20000,3,2", "--format", format],
            true,
        );
        assert!(!said.contains("writing NIfTI-2"), "{said}");
        check(
            &out,
            &whole,
            Some("20000,3,2"),
            "nii",
            &["--nifti-version", version],
        );
        let header = nifti_tool(&["-disp_hdr", "-infiles", text(&out.join("1_0_0.nii"))]);
        let expected = if version == "2" {
            "N-2 header file"
        } else {
            "N-1 header file"
        };
        assert!(header.contains(expected), "{header}");
    }
    let check_hdr = nifti_tool(&[
        "-check_hdr",
        "-infiles",
        text(&root.path().join("nii/0_0_0.nii")),
    ]);
    assert!(check_hdr.contains("header IS GOOD"), "{check_hdr}");
}

#[test]
fn damaged_gzipped_blocks_are_refused_naming_the_file_and_keep_only_exact_blocks() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("img");
    make_nifti_as(&base, "12,9,7", "<i2", "6,5,4", &["--gzip"]);
    let good = base.join("blocks");
    let out = root.path().join("out");
    let damaged = |name: &str, change: &dyn Fn(&mut Vec<u8>)| -> PathBuf {
        let dir = root.path().join(name);
        fs::create_dir(&dir).unwrap();
        for entry in fs::read_dir(&good).unwrap() {
            let entry = entry.unwrap();
            fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        let victim = dir.join("1_1_0.nii.gz");
        let mut bytes = fs::read(&victim).unwrap();
        change(&mut bytes);
        fs::write(&victim, bytes).unwrap();
        dir
    };
    let cut = damaged("cut", &|bytes| bytes.truncate(bytes.len() * 2 / 3));
    let corrupt = damaged("corrupt", &|bytes| {
        let middle = bytes.len() / 2;
        for byte in &mut bytes[middle..middle + 8] {
            *byte ^= 0x5a;
        }
    });
    let header_cut = damaged("header-cut", &|bytes| bytes.truncate(30));
    let trailing = damaged("trailing", &|bytes| bytes.extend_from_slice(b"not gzip"));
    // What a run of the undamaged blocks writes: a refused run may keep
    // blocks it finished, each byte-identical to these.
    let exact = root.path().join("exact");
    rechunk_ok(&good, &exact, "4,4,4", None);
    for (dir, expected) in [
        (&cut, "gzip stream is damaged"),
        (&corrupt, "gzip stream is damaged"),
        (&header_cut, "where its header should be"),
        (&trailing, "gzip stream is damaged"),
    ] {
        let output = rechunkfs(&["rechunk", text(dir), text(&out), "--shape", "4,4,4"]);
        assert!(!output.status.success(), "should refuse {}", dir.display());
        let message = stderr(&output);
        for part in ["1_1_0.nii.gz", expected, "gzipped NIfTI"] {
            assert!(message.contains(part), "message lacks '{part}': {message}");
        }
        for entry in fs::read_dir(&out).into_iter().flatten() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == ".rechunkfs-job.json" {
                continue;
            }
            assert!(!name.starts_with('.'), "a temporary was left: {name}");
            assert_eq!(
                fs::read(entry.path()).unwrap(),
                fs::read(exact.join(&name)).unwrap(),
                "kept block {name} differs from the undamaged run's"
            );
        }
        let _ = fs::remove_dir_all(&out);
    }
    // One block gzipped, the others not.
    let mixed = root.path().join("mixed");
    make_nifti_as(&mixed, "12,9,7", "<i2", "6,5,4", &[]);
    let plain = mixed.join("blocks");
    fs::remove_file(plain.join("1_0_1.nii")).unwrap();
    fs::copy(good.join("1_0_1.nii.gz"), plain.join("1_0_1.nii.gz")).unwrap();
    assert_refused(
        &["rechunk", text(&plain), text(&out), "--shape", "4,4,4"],
        &out,
        &["1_0_1.nii.gz", "is compressed but", "is not"],
    );
}

#[test]
fn a_view_of_blocks_too_long_for_nifti1_serves_nifti2() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("long");
    let whole = make_nifti_as(
        &base,
        "40000,3,2",
        "<i2",
        "15000,3,1",
        &["--gzip", "--nifti2"],
    );
    let mounted = mount(&base.join("blocks"), root.path(), ("40000,2,1", "nii"), &[]);
    assert!(
        mounted.said.contains("writing NIfTI-2 blocks, not NIfTI"),
        "{}",
        mounted.said
    );
    check(
        &mounted.view,
        &whole,
        Some("40000,2,1"),
        "nii",
        &["--vox-offset", "4096", "--nifti-version", "2"],
    );
    wait_complete_as_planned(&mounted);
}
