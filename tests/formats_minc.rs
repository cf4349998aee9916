//! MINC2 images as minc-tools make them (`rawtominc`, `mincresample`,
//! `mincreshape`) and as nibabel ships them (its `tests/data`), rechunked
//! with `--values scaled` (their physical values) and `--values stored`,
//! every voxel of every output block checked against the input as nibabel
//! (`get_fdata`, rounded to float32) and h5py (the stored voxels) read it,
//! by `tests/fixtures/check_minc_values.py`. Also: the plan's seeks and
//! peak memory are the run's; what cannot be written without `--values`
//! is refused, naming it; MINC1 is refused; a mounted view serves the same
//! values.

#[macro_use]
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{json_u64, python, run_fixture, stderr};

fn rechunkfs(args: &[&str]) -> Output {
    common::run_rechunkfs(args, 0)
}

fn text(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// A MINC2 image made by minc-tools in `dir` (see make_minc_tools.py):
/// `dir/whole.mnc`, and with `--blocks` also `dir/blocks/`.
fn make_minc(dir: &Path, shape: &str, kind: &str, extra: &[&str]) {
    let mut args = vec![text(dir), "--shape", shape, "--kind", kind];
    args.extend(extra);
    run_fixture("make_minc_tools.py", &args);
}

/// The directory of nibabel's test images.
fn nibabel_data() -> PathBuf {
    let output = Command::new(python())
        .args([
            "-c",
            "import nibabel, os; print(os.path.join(os.path.dirname(nibabel.__file__), 'tests', 'data'))",
        ])
        .output()
        .expect("run python");
    assert!(output.status.success(), "{}", stderr(&output));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// `rechunk IN OUT --shape SHAPE` with `extra` options, which must succeed
/// with the seeks and peak memory that `plan` (given the same options)
/// predicts; returns the run's JSON report.
fn rechunk_as_planned(input: &Path, out: &Path, shape: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "rechunk",
        text(input),
        text(out),
        "--shape",
        shape,
        "--json",
    ];
    args.extend(extra);
    let output = rechunkfs(&args);
    assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    let mut plan_args = vec!["plan", text(input), "--shape", shape, "--json"];
    plan_args.extend(extra);
    let planned = rechunkfs(&plan_args);
    assert!(
        planned.status.success(),
        "{plan_args:?}: {}",
        stderr(&planned)
    );
    let plan: serde_json::Value = serde_json::from_slice(&planned.stdout).expect("JSON plan");
    for (made, predicted) in [
        ("seeks.made", "seeks.planned"),
        ("seeks.read", "seeks.read"),
        ("seeks.write", "seeks.write"),
        ("peak_memory_bytes", "peak_memory_bytes"),
    ] {
        assert_eq!(
            json_u64(&report, made),
            json_u64(&plan, predicted),
            "{args:?}: {made} against the plan's {predicted}\nrun: {report}\nplan: {plan}"
        );
    }
    report
}

/// check_minc_values.py: every block of `out` against `input`.
fn check(out: &Path, input: &Path, block: &str, format: &str, values: &str) -> String {
    run_fixture(
        "check_minc_values.py",
        &[
            text(out),
            "--input",
            text(input),
            "--block",
            block,
            "--format",
            format,
            "--values",
            values,
        ],
    )
}

/// The dtype `plan` reports for `input` (of `ndim` dimensions) with `extra` options.
fn planned_dtype(input: &Path, ndim: usize, extra: &[&str]) -> String {
    let shape = vec!["2"; ndim].join(",");
    let mut args = vec!["plan", text(input), "--shape", &shape, "--json"];
    args.extend(extra);
    let output = rechunkfs(&args);
    assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    plan["dtype"].as_str().unwrap().to_owned()
}

/// The image shape of `file` as `mincinfo` reports it: its dimensions'
/// lengths, in the order the image lists them.
fn mincinfo_shape(file: &Path) -> Vec<u64> {
    let run = |args: &[&str]| {
        let output = Command::new("mincinfo")
            .args(args)
            .arg(file)
            .output()
            .expect("run mincinfo");
        assert!(
            output.status.success(),
            "mincinfo {args:?}: {}",
            stderr(&output)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let names = run(&["-vardims", "image"]);
    let mut args = Vec::new();
    for name in names.split_whitespace() {
        args.extend(["-dimlength", name]);
    }
    run(&args)
        .split_whitespace()
        .map(|n| n.parse().expect("a length"))
        .collect()
}

/// An image made by minc-tools, and how it is rechunked.
struct Case {
    /// make_minc_tools.py's --kind, its image shape and other options.
    kind: &'static str,
    shape: &'static str,
    make: &'static [&'static str],
    /// `whole.mnc` or `blocks`.
    input: &'static str,
    /// Output block shapes and formats, each with each.
    blocks: &'static [&'static str],
    formats: &'static [&'static str],
}

#[test]
fn minc_tools_images_scaled_equal_nibabel_get_fdata_in_every_voxel() {
    require!(Readers, MincTools);
    let root = tempfile::tempdir().unwrap();
    // Shapes that divide the image and shapes that do not; block grids
    // whose edge blocks are smaller; chunked, compressed images.
    let cases = [
        Case {
            kind: "float-short",
            shape: "7,9,11",
            make: &[],
            input: "whole.mnc",
            blocks: &["7,3,11", "4,4,5"],
            formats: &["h5", "nii", "npy"],
        },
        Case {
            kind: "float-short",
            shape: "7,9,11",
            make: &["--resample", "8,10,13", "--blocks", "3,4,5", "--compress"],
            input: "blocks",
            blocks: &["8,5,13", "5,3,6", "100,100,100"],
            formats: &["h5", "nii"],
        },
        Case {
            kind: "byte",
            shape: "5,6,7",
            make: &["--compress"],
            input: "whole.mnc",
            blocks: &["5,2,7", "2,4,3"],
            formats: &["nii", "raw"],
        },
        Case {
            kind: "short",
            shape: "7,9,11",
            make: &["--blocks", "4,5,7"],
            input: "blocks",
            blocks: &["3,3,3"],
            formats: &["h5", "nii"],
        },
    ];
    for (n, case) in cases.iter().enumerate() {
        let base = root.path().join(format!("case{n}"));
        make_minc(&base, case.shape, case.kind, case.make);
        let input = base.join(case.input);
        assert_eq!(planned_dtype(&input, 3, &["--values", "scaled"]), "<f4");
        // The array is in the order minc-tools list the image's dimensions.
        let planned = rechunkfs(&[
            "plan",
            text(&input),
            "--shape",
            "1,1,1",
            "--json",
            "--values",
            "scaled",
        ]);
        let plan: serde_json::Value = serde_json::from_slice(&planned.stdout).expect("JSON plan");
        let array: Vec<u64> = serde_json::from_value(plan["array"].clone()).unwrap();
        // (blocks cut from whole.mnc tile it.)
        assert_eq!(array, mincinfo_shape(&base.join("whole.mnc")));
        for block in case.blocks {
            for format in case.formats {
                let out = base.join(format!("{format}-{}", block.replace(',', "x")));
                rechunk_as_planned(
                    &input,
                    &out,
                    block,
                    &["--values", "scaled", "--format", format, "--mem", "6K"],
                );
                let said = check(&out, &input, block, format, "scaled");
                assert!(said.starts_with("checked"), "{said}");
            }
        }
    }
}

#[test]
fn stored_values_move_as_h5py_reads_them() {
    require!(Readers, MincTools);
    let root = tempfile::tempdir().unwrap();
    make_minc(
        root.path(),
        "7,9,11",
        "float-short",
        &["--blocks", "3,4,5", "--compress"],
    );
    let blocks = root.path().join("blocks");
    // Stored values are written to h5 (MINC2's default output) when asked for.
    for (name, extra) in [
        ("stored", &["--values", "stored"][..]),
        ("npy", &["--values", "stored", "--format", "npy"][..]),
    ] {
        let out = root.path().join(name);
        let mut options = vec!["--mem", "4K"];
        options.extend(extra);
        rechunk_as_planned(&blocks, &out, "4,5,6", &options);
        let format = if name == "npy" { "npy" } else { "h5" };
        let said = check(&out, &blocks, "4,5,6", format, "stored");
        assert!(said.starts_with("checked"), "{said}");
    }
    assert_eq!(planned_dtype(&blocks, 3, &["--values", "stored"]), "<i2");
    // One global scaling: NIfTI's scl_slope/scl_inter carry it, stored.
    let byte = root.path().join("byte");
    make_minc(&byte, "5,6,7", "byte", &[]);
    let out = byte.join("nii");
    rechunk_as_planned(&byte.join("whole.mnc"), &out, "3,3,3", &["--format", "nii"]);
    let said = check(&out, &byte.join("whole.mnc"), "3,3,3", "nii", "stored");
    assert!(said.starts_with("checked"), "{said}");
}

#[test]
fn nibabel_test_images_scaled_equal_get_fdata() {
    require!(Readers);
    let data = nibabel_data();
    let root = tempfile::tempdir().unwrap();
    // small.mnc: int16, per-slice ranges, contiguous. minc2_4d.mnc: uint8,
    // chunked and gzip-compressed, ranges per (time, zspace).
    // minc2_1_scale.mnc: one range. minc2-no-att.mnc: scalar ranges
    // whose dimorder names a dimension they do not have (nibabel cuts it).
    // minc2-4d-d.mnc: float64, its values as stored.
    for (name, shapes, formats) in [
        ("small.mnc", &["5,8,10", "18,28,29"][..], &["h5", "nii"][..]),
        (
            "minc2_4d.mnc",
            &["1,4,7,20", "2,3,20,6"][..],
            &["h5", "nii"][..],
        ),
        ("minc2_1_scale.mnc", &["3,7,20"][..], &["npy"][..]),
        ("minc2-no-att.mnc", &["4,6,20"][..], &["h5"][..]),
        ("minc2-4d-d.mnc", &["2,5,16,3"][..], &["h5"][..]),
    ] {
        let input = data.join(name);
        for block in shapes {
            for format in formats {
                let out = root
                    .path()
                    .join(format!("{name}-{format}-{}", block.replace(',', "x")));
                rechunk_as_planned(
                    &input,
                    &out,
                    block,
                    &["--values", "scaled", "--format", format],
                );
                let said = check(&out, &input, block, format, "scaled");
                assert!(said.starts_with("checked"), "{name}: {said}");
            }
        }
    }
    assert_eq!(
        planned_dtype(&data.join("minc2-4d-d.mnc"), 4, &["--values", "scaled"]),
        "<f8"
    );
    // The stored values of the 4-D image, through libhdf5, as h5py reads them.
    let input = data.join("minc2_4d.mnc");
    let out = root.path().join("4d-stored");
    rechunk_as_planned(&input, &out, "2,3,7,20", &["--values", "stored"]);
    let said = check(&out, &input, "2,3,7,20", "h5", "stored");
    assert!(said.starts_with("checked"), "{said}");
}

#[test]
fn big_endian_blocks_made_by_h5py_scale_alike() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // Laid out as libminc lays MINC2 out, big-endian, a range per slice;
    // 7×9×11 in 4×4×4 blocks leaves smaller edge blocks.
    run_fixture(
        "make_minc2.py",
        &[
            text(root.path()),
            "--shape",
            "7,9,11",
            "--dtype",
            ">i2",
            "--blocks",
            "4,4,4",
            "--scaling",
            "per-slice",
        ],
    );
    let blocks = root.path().join("blocks");
    for (format, block) in [("h5", "5,5,5"), ("nii", "3,9,2"), ("npy", "7,9,11")] {
        let out = root.path().join(format);
        rechunk_as_planned(
            &blocks,
            &out,
            block,
            &["--values", "scaled", "--format", format, "--mem", "4K"],
        );
        let said = check(&out, &blocks, block, format, "scaled");
        assert!(said.starts_with("checked"), "{said}");
    }
}

#[test]
fn without_values_what_would_lose_the_scaling_is_refused_naming_the_way_out() {
    require!(Readers);
    let data = nibabel_data();
    let root = tempfile::tempdir().unwrap();
    let small = data.join("small.mnc");
    for format in ["nii", "h5", "npy", "raw", "zarr"] {
        let out = root.path().join(format);
        let output = rechunkfs(&[
            "rechunk",
            text(&small),
            text(&out),
            "--shape",
            "5,5,5",
            "--format",
            format,
        ]);
        assert!(!output.status.success(), "{format}");
        let message = stderr(&output);
        assert!(
            message.contains("varies per slice") && message.contains("--values scaled"),
            "{format}: {message}"
        );
        assert!(
            !out.exists(),
            "{format}: nothing may be written when refused"
        );
        let plan = rechunkfs(&["plan", text(&small), "--shape", "5,5,5", "--format", format]);
        assert!(!plan.status.success() && stderr(&plan).contains("--values scaled"));
    }
    // Stored values said outright: NIfTI still cannot say a per-slice scaling.
    let output = rechunkfs(&[
        "rechunk",
        text(&small),
        text(&root.path().join("nii")),
        "--shape",
        "5,5,5",
        "--format",
        "nii",
        "--values",
        "stored",
    ]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("--values scaled"),
        "{}",
        stderr(&output)
    );
    // Inputs with nothing to scale, and values rechunkfs does not know.
    let h5 = root.path().join("in.h5");
    run_script_inline(&format!(
        "import h5py, numpy; h5py.File('{}', 'w')['data'] = numpy.arange(24, dtype='<u2').reshape(2, 3, 4)",
        h5.display()
    ));
    for (input, values, expected) in [
        (&h5, "scaled", "applies to MINC2 images"),
        (&small, "physical", "use stored"),
    ] {
        let output = rechunkfs(&[
            "rechunk",
            text(input),
            text(&root.path().join("never")),
            "--shape",
            "2,2,2",
            "--values",
            values,
        ]);
        assert!(!output.status.success());
        assert!(stderr(&output).contains(expected), "{}", stderr(&output));
    }
    // MINC1 is netCDF: refused as such, with the conversion to make.
    let output = rechunkfs(&[
        "rechunk",
        text(&data.join("minc1_1_scale.mnc")),
        text(&root.path().join("never")),
        "--shape",
        "2,2,2",
    ]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("MINC1 (netCDF)") && stderr(&output).contains("mincconvert -2"),
        "{}",
        stderr(&output)
    );
    // --help says what each value does and when the default applies.
    for command in ["rechunk", "mount", "plan"] {
        let help = rechunkfs(&[command, "--help"]);
        let said = String::from_utf8_lossy(&help.stdout).replace(char::is_whitespace, " ");
        assert!(
            said.contains("--values")
                && said.contains("get_fdata")
                && said.contains("Default: stored"),
            "{command} --help: {said}"
        );
    }
}

/// Damaged MINC2 files, read with `--values scaled`: each run either ends
/// with a message (never a panic or a signal) or writes what nibabel reads
/// in the damaged file, where nibabel can read it.
#[test]
fn damaged_images_are_refused_or_scaled_right_never_a_panic() {
    require!(Readers);
    let data = nibabel_data();
    let root = tempfile::tempdir().unwrap();
    let mut rng = common::TestRng(0x6d696e63);
    let (mut refused, mut written) = (0, 0);
    for (name, shape) in [("small.mnc", "5,8,10"), ("minc2_4d.mnc", "1,4,7,20")] {
        let original = fs::read(data.join(name)).unwrap();
        for trial in 0..20 {
            let mut bytes = original.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = rng.below(256) as u8;
            }
            let input = root.path().join(format!("{trial}-{name}"));
            fs::write(&input, &bytes).unwrap();
            let out = root.path().join(format!("{trial}-{name}-out"));
            let args = [
                "rechunk",
                text(&input),
                text(&out),
                "--shape",
                shape,
                "--values",
                "scaled",
                "-q",
            ];
            let output = rechunkfs(&args);
            let said = stderr(&output);
            assert!(
                !said.contains("panicked") && matches!(output.status.code(), Some(0 | 1)),
                "{args:?}: {:?} {said}",
                output.status
            );
            if output.status.success() {
                let checked = run_fixture(
                    "check_minc_values.py",
                    &[
                        text(&out),
                        "--input",
                        text(&input),
                        "--block",
                        shape,
                        "--format",
                        "h5",
                        "--values",
                        "scaled",
                        "--skip-unreadable",
                    ],
                );
                assert!(
                    checked.starts_with("checked") || checked.starts_with("unreadable"),
                    "{checked}"
                );
                written += 1;
            } else {
                assert!(said.starts_with("rechunkfs: error:"), "{said}");
                // The one input block is read whole before any block is
                // written: a refused run keeps at most OUT's job record.
                let kept: Vec<_> = fs::read_dir(&out)
                    .into_iter()
                    .flatten()
                    .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|name| name != ".rechunkfs-job.json")
                    .collect();
                assert!(kept.is_empty(), "{args:?}: a refused run left {kept:?}");
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0 && written > 0,
        "refused {refused}, written {written}"
    );
}

fn run_script_inline(script: &str) {
    let output = Command::new(python())
        .args(["-c", script])
        .output()
        .expect("run python");
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn a_mounted_view_serves_the_scaled_values() {
    require!(Fuse, Readers, MincTools);
    let root = tempfile::tempdir().unwrap();
    make_minc(
        root.path(),
        "7,9,11",
        "float-short",
        &["--blocks", "3,4,5", "--compress"],
    );
    let blocks = root.path().join("blocks");
    for format in ["nii", "h5"] {
        let view = root.path().join(format!("view-{format}"));
        fs::create_dir(&view).unwrap();
        let output = rechunkfs(&[
            "mount",
            text(&blocks),
            text(&view),
            "--shape",
            "4,5,6",
            "--format",
            format,
            "--values",
            "scaled",
            "--staging",
            text(&root.path().join(format!("staging-{format}"))),
        ]);
        assert!(output.status.success(), "mount: {}", stderr(&output));
        let mounted = Unmount(view.clone());
        // Read while it fills: the readers wait for pending blocks.
        let said = check(&view, &blocks, "4,5,6", format, "scaled");
        assert!(said.starts_with("checked"), "{said}");
        let status = rechunkfs(&["status", "--wait", "--json", text(&view)]);
        assert!(status.status.success(), "status: {}", stderr(&status));
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(status["state"], "complete", "{status}");
        assert_eq!(status["seeks_made"], status["seeks_planned"], "{status}");
        drop(mounted);
        assert!(!rechunkfs::fuse::session::is_mounted(&view));
    }
}

/// Unmounts the view when dropped, whatever the test did.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if rechunkfs::fuse::session::is_mounted(&self.0) {
            let _ = rechunkfs(&["umount", text(&self.0)]);
        }
        if rechunkfs::fuse::session::is_mounted(&self.0) {
            let _ = rechunkfs::fuse::session::detach(&self.0);
        }
    }
}
