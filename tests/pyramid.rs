//! Multiscale pyramids, checked by readers rechunkfs did not write: inputs
//! made by zarr-python and nibabel; every level of `rechunk`'s OME-Zarr
//! (v2 and v3), Neuroglancer precomputed and npy outputs opened with
//! TensorStore (numpy for npy) and compared voxel by voxel with TensorStore's
//! downsample of the source chained level by level (mean, mode, stride for
//! nearest), on shapes that do not divide; the multiscales metadata read
//! by zarr-python and ome-zarr, its scales and translations checked
//! against nibabel's affine; the planned reads, writes and peak memory of
//! the levels equal to the counted ones.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::mounted::MountedView;
use common::{json_u64, python, stderr};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pyramid.py");

fn rechunkfs(args: &[&str]) -> Output {
    common::run_rechunkfs(args, 0)
}

fn fixture(args: &[&str]) -> String {
    let output = Command::new(python())
        .arg(FIXTURE)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "pyramid.py {args:?}: {}",
        stderr(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn make_zarr(dir: &Path, shape: &str, chunks: &str, dtype: &str, labels: bool) -> PathBuf {
    let input = dir.join("in.zarr");
    let mut args = vec!["zarr", input.to_str().unwrap(), "--shape", shape];
    args.extend(["--chunks", chunks, "--dtype", dtype]);
    if labels {
        args.push("--labels");
    }
    fixture(&args);
    input
}

/// Rechunks `input` into `out` with `extra` flags, returning the JSON report.
fn rechunk(input: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "rechunk",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--json",
    ];
    args.extend(extra);
    let output = rechunkfs(&args);
    assert!(
        output.status.success(),
        "rechunk {extra:?}: {}",
        stderr(&output)
    );
    serde_json::from_slice(&output.stdout).expect("JSON report")
}

/// Runs the fixture's check of `out` against `source`.
fn check(
    out: &Path,
    layout: &str,
    source: &Path,
    method: &str,
    factors: &str,
) -> serde_json::Value {
    let summary = fixture(&[
        "check",
        out.to_str().unwrap(),
        "--layout",
        layout,
        "--source",
        source.to_str().unwrap(),
        "--method",
        method,
        "--factors",
        factors,
    ]);
    serde_json::from_str(&summary).expect("summary JSON")
}

/// The pyramid part of a report: counted equals planned, level by level.
fn assert_as_planned(report: &serde_json::Value) {
    let pyramid = &report["pyramid"];
    let counted = pyramid["levels"].as_array().expect("levels counted");
    let planned = pyramid["planned"]["levels"]
        .as_array()
        .expect("levels planned");
    assert_eq!(counted.len() + 1, planned.len(), "{pyramid}");
    for (k, level) in counted.iter().enumerate() {
        let cost = &planned[k + 1]["cost"];
        for (count, plan) in [
            ("blocks", "blocks"),
            ("reads", "reads"),
            ("bytes_read", "bytes_read"),
            ("writes", "writes"),
            ("bytes_written", "bytes_written"),
            ("peak_bytes", "peak_bytes"),
        ] {
            assert_eq!(
                json_u64(level, count),
                json_u64(cost, plan),
                "level {}: {count}",
                k + 1
            );
        }
    }
    assert_eq!(
        counted.iter().map(|l| json_u64(l, "peak_bytes")).max(),
        Some(json_u64(pyramid, "planned.peak_memory_bytes"))
    );
}

#[test]
fn ome_zarr_levels_equal_tensorstore_downsampling_for_every_rule() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "37,29,23", "10,8,7", "<u2", false);
    for (format, method) in [("zarr", "mean"), ("zarr3", "mean"), ("zarr", "nearest")] {
        let out = dir.path().join(format!("{format}-{method}"));
        let report = rechunk(
            &input,
            &out,
            &[
                "--shape",
                "8,8,8",
                "--format",
                format,
                "--levels",
                "auto",
                "--downsample",
                method,
            ],
        );
        assert_as_planned(&report);
        let summary = check(&out, format, &input, method, "2,2,2");
        // auto: 37×29×23 → 19×15×12 → 10×8×6 → 5×4×3, the first to fit one 8³ block.
        assert_eq!(summary["levels"], 4, "{summary}");
        assert_eq!(summary["shapes"][3], serde_json::json!([5, 4, 3]));
    }
}

#[test]
fn labels_by_mode_with_anisotropic_factors_and_a_tight_memory_limit() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "30,21,17", "7,7,7", "<i2", true);
    let out = dir.path().join("labels");
    // 20 KiB: level 1's 8³ block (1 KiB) and its 16×16×8 source (4 KiB)
    // fit whole; the limit still holds the passes to what it allows.
    let report = rechunk(
        &input,
        &out,
        &[
            "--shape",
            "8,8,8",
            "--format",
            "zarr3",
            "--levels",
            "3",
            "--downsample",
            "mode",
            "--factors",
            "2,2,1",
            "--mem",
            "3K",
        ],
    );
    assert_as_planned(&report);
    let planned = &report["pyramid"]["planned"];
    assert!(
        json_u64(planned, "peak_memory_bytes") <= 3 * 1024,
        "{planned}"
    );
    let rows = json_u64(&planned["levels"][1]["cost"], "rows_per_pass");
    assert!(
        rows < 8,
        "passes of fewer rows than a block under the limit: {planned}"
    );
    let summary = check(&out, "zarr3", &input, "mode", "2,2,1");
    assert_eq!(summary["shapes"][2], serde_json::json!([8, 6, 17]));
}

#[test]
fn precomputed_scales_open_in_tensorstore() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    for (dtype, method) in [("<f4", "mean"), ("|u1", "nearest"), ("<u4", "mode")] {
        let labels = method == "mode";
        let case = dir.path().join(dtype.trim_start_matches(['<', '|']));
        std::fs::create_dir(&case).unwrap();
        let input = make_zarr(&case, "33,26,19", "9,9,9", dtype, labels);
        let out = case.join("precomputed");
        let report = rechunk(
            &input,
            &out,
            &[
                "--shape",
                "16,8,12",
                "--format",
                "precomputed",
                "--levels",
                "3",
                "--downsample",
                method,
            ],
        );
        assert_as_planned(&report);
        let summary = check(&out, "precomputed", &input, method, "2,2,2");
        let info = &summary["info"];
        assert_eq!(
            info["scales"][0]["chunk_sizes"],
            serde_json::json!([[12, 8, 16]])
        );
        assert_eq!(
            info["scales"][2]["resolution"],
            serde_json::json!([4.0, 4.0, 4.0])
        );
        assert_eq!(info["type"], if labels { "segmentation" } else { "image" });
    }
    // A chunk's file is named by the voxels it holds, x first.
    let edge = dir.path().join("f4/precomputed/0/12-19_24-26_32-33");
    assert_eq!(std::fs::metadata(&edge).unwrap().len(), 7 * 2 * 4);
}

#[test]
fn a_nifti_input_keeps_its_world_space_in_every_level() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("image.nii");
    fixture(&[
        "nifti",
        input.to_str().unwrap(),
        "--shape",
        "21,18,13",
        "--dtype",
        "<i2",
    ]);
    let out = dir.path().join("ome");
    // Shapes in NIfTI's (x, y, z) order.
    let report = rechunk(
        &input,
        &out,
        &["--shape", "8,8,8", "--format", "zarr3", "--levels", "3"],
    );
    assert_as_planned(&report);
    let summary = check(&out, "zarr3", &input, "mean", "2,2,2");
    let scale = &summary["multiscale"]["datasets"][1]["coordinateTransformations"][0]["scale"];
    assert_eq!(scale, &serde_json::json!([4.0, 1.5, 1.0]));
    let precomputed = dir.path().join("precomputed");
    rechunk(
        &input,
        &precomputed,
        &[
            "--shape",
            "8,8,8",
            "--format",
            "precomputed",
            "--levels",
            "2",
        ],
    );
    let summary = check(&precomputed, "precomputed", &input, "mean", "2,2,2");
    // Voxel sizes in nanometres, x first: 0.5, 0.75 and 2 mm, doubled.
    assert_eq!(
        summary["info"]["scales"][1]["resolution"],
        serde_json::json!([1.0e6, 1.5e6, 4.0e6])
    );
    // NIfTI blocks of level 1 carry the level's affine: each block's voxel
    // (0, 0, 0) at the centre of the level-0 voxels it averages.
    let nii = dir.path().join("nii");
    rechunk(&input, &nii, &["--shape", "8,8,8", "--levels", "2"]);
    let script = r#"
import sys, nibabel as nib, numpy as np
whole = nib.load(sys.argv[1]).affine
block = nib.load(sys.argv[2]).affine
origin = np.array([8, 8, 0])  # block 1_1_0 of level 1, (x, y, z)
level0 = origin * 2 + 0.5
expected = whole.copy()
expected[:3, :3] = whole[:3, :3] * 2
expected[:3, 3] = (whole @ np.append(level0, 1))[:3]
assert np.allclose(block, expected), (block, expected)
"#;
    let output = Command::new(python())
        .args(["-c", script])
        .arg(&input)
        .arg(nii.join("1/1_1_0.nii"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn a_time_axis_is_kept_whole_and_described_as_time() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("series.nii");
    // NIfTI's (x, y, z, t): 3 time points of a 12×10×9 image.
    fixture(&[
        "nifti",
        input.to_str().unwrap(),
        "--shape",
        "12,10,9,3",
        "--dtype",
        "<u2",
    ]);
    let out = dir.path().join("ome");
    let report = rechunk(
        &input,
        &out,
        &[
            "--shape",
            "8,8,8,1",
            "--format",
            "zarr",
            "--levels",
            "3",
            "--factors",
            "2,2,1",
        ],
    );
    assert_as_planned(&report);
    // C order (t, z, y, x): t and z (NIfTI's third axis, factor 1) kept.
    let summary = check(&out, "zarr", &input, "mean", "1,1,2,2");
    assert_eq!(summary["shapes"][2], serde_json::json!([3, 9, 3, 3]));
    let axes = &summary["multiscale"]["axes"];
    assert_eq!(
        axes[0],
        serde_json::json!({"name": "t", "type": "time", "unit": "second"})
    );
    assert_eq!(axes[1]["type"], "space");
}

#[test]
fn block_file_levels_go_in_numbered_folders() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "20,15,11", "6,6,6", "<u2", false);
    let out = dir.path().join("npy");
    let report = rechunk(
        &input,
        &out,
        &["--shape", "4,4,4", "--format", "npy", "--levels", "3"],
    );
    assert_as_planned(&report);
    assert!(out.join("0_0_0.npy").is_file() && out.join("2/0_0_0.npy").is_file());
    check(&out, "npy", &input, "mean", "2,2,2");
}

#[test]
fn plan_predicts_what_rechunk_counts() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "37,29,23", "10,8,7", "<u2", false);
    let args = [
        "--shape", "8,8,8", "--format", "zarr", "--levels", "auto", "--mem", "64K",
    ];
    let mut plan_args = vec!["plan", input.to_str().unwrap(), "--json"];
    plan_args.extend(args);
    let output = rechunkfs(&plan_args);
    assert!(output.status.success(), "{}", stderr(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let report = rechunk(&input, &dir.path().join("out"), &args);
    assert_eq!(plan["pyramid"], report["pyramid"]["planned"]);
}

#[test]
fn counted_reads_writes_and_memory_equal_the_plan_for_many_shapes_and_limits() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "41,23,30", "9,11,7", "<u2", false);
    let cases: [(&str, &str, &str, &str); 6] = [
        ("zarr", "8,8,8", "auto", "2,2,2"),
        ("zarr3", "16,5,9", "4", "2,2,2"),
        ("npy", "7,7,7", "3", "3,2,1"),
        ("precomputed", "10,6,30", "3", "2,2,2"),
        ("zarr", "41,23,30", "2", "2,2,2"),
        ("h5", "5,23,4", "3", "2,1,2"),
    ];
    for (i, (format, shape, levels, factors)) in cases.into_iter().enumerate() {
        for mem in ["6K", "64K", "8M"] {
            let out = dir.path().join(format!("{i}-{mem}"));
            let args = [
                "--shape",
                shape,
                "--format",
                format,
                "--levels",
                levels,
                "--factors",
                factors,
                "--mem",
                mem,
                "--downsample",
                "nearest",
            ];
            let mut plan_args = vec![
                "rechunk",
                input.to_str().unwrap(),
                out.to_str().unwrap(),
                "--json",
            ];
            plan_args.extend(args);
            let output = rechunkfs(&plan_args);
            if !output.status.success() {
                // A limit too small for one row of a block is refused, saying so.
                assert!(
                    stderr(&output).contains("needs at least"),
                    "{args:?}: {}",
                    stderr(&output)
                );
                assert_eq!(mem, "6K", "{args:?}: {}", stderr(&output));
                continue;
            }
            let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_as_planned(&report);
        }
    }
}

#[test]
fn what_a_format_cannot_hold_is_refused_before_out_is_touched() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "10,10,10", "5,5,5", ">u2", false);
    let out = dir.path().join("out");
    for (extra, says) in [
        (vec!["--format", "precomputed"], "little-endian"),
        (
            vec!["--format", "zarr", "--levels", "2", "--factors", "2,2"],
            "one per spatial axis",
        ),
        (
            vec!["--format", "zarr", "--levels", "2", "--factors", "1,1,1"],
            "all 1",
        ),
        (vec!["--format", "zarr", "--levels", "0"], "from 1 to"),
        (
            vec!["--format", "zarr", "--levels", "2", "--downsample", "max"],
            "mean",
        ),
    ] {
        let mut args = vec![
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            "4,4,4",
        ];
        args.extend(&extra);
        let output = rechunkfs(&args);
        assert!(!output.status.success(), "{extra:?} was accepted");
        assert!(
            stderr(&output).contains(says),
            "{extra:?}: {}",
            stderr(&output)
        );
        assert!(!out.exists(), "{extra:?} touched OUT");
    }
}

#[test]
fn a_view_serves_pending_pyramid_blocks_exactly_while_it_fills() {
    require!(Fuse, Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "37,29,23", "10,8,7", "<u2", false);
    // 100 ms after each read block: levels 1 to 3 stay pending for a while.
    let flags = [
        "--shape", "8,8,8", "--format", "zarr", "--levels", "4", "--mem", "64K",
    ];
    let view = MountedView::new(&input, dir.path(), &flags, 100);
    let status = view.status();
    assert_eq!(
        json_u64(&status, "blocks_total"),
        60 + 12 + 2 + 1,
        "{status}"
    );
    // Every level's file is listed with its exact size from the start.
    let edge = view.view.join("3/0.0.0");
    // Level 3 is 5×4×3: one chunk of that shape.
    assert_eq!(std::fs::metadata(&edge).unwrap().len(), 5 * 4 * 3 * 2);
    // Level 1's last chunk comes from the plan's last level-0 blocks: a
    // read of it has them extracted on demand, and it is built from them.
    let last = std::fs::read(view.view.join("1/2.1.1")).unwrap();
    assert_eq!(last.len(), 8 * 8 * 8 * 2);
    let status = view.status();
    assert!(json_u64(&status, "on_demand_blocks") >= 1, "{status}");
    let reads = fixture(&[
        "reads",
        view.view.to_str().unwrap(),
        "--source",
        input.to_str().unwrap(),
        "--levels",
        "4",
        "--chunks",
        "8,8,8",
        "--count",
        "15",
    ]);
    let reads: serde_json::Value = serde_json::from_str(&reads).unwrap();
    assert!(
        json_u64(&reads, "pending") >= 1,
        "no read found a pending block: {reads}"
    );
    let status = view.wait_complete();
    let levels = status["levels"].as_array().expect("per-level progress");
    let done: Vec<u64> = levels.iter().map(|l| json_u64(l, "blocks_done")).collect();
    assert_eq!(done, vec![60, 12, 2, 1], "{status}");
    check(&view.view, "zarr", &input, "mean", "2,2,2");
}

#[test]
fn a_remounted_view_resumes_its_pyramid() {
    require!(Fuse, Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "30,21,17", "7,7,7", "<i2", true);
    let flags = [
        "--shape",
        "8,8,8",
        "--format",
        "precomputed",
        "--levels",
        "3",
        "--downsample",
        "mode",
        "--mem",
        "64K",
    ];
    let view = MountedView::new(&input, dir.path(), &flags, 100);
    // Until some blocks are done; then stopped halfway.
    while json_u64(&view.status(), "blocks_done") < 10 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    view.unmount();
    let view = MountedView::new(&input, dir.path(), &flags, 0);
    let status = view.wait_complete();
    assert!(json_u64(&status, "blocks_resumed") >= 10, "{status}");
    assert_eq!(
        json_u64(&status, "blocks_done"),
        json_u64(&status, "blocks_total")
    );
    check(&view.view, "precomputed", &input, "mode", "2,2,2");
}

/// A uint16 Zarr array in 1000..=3000 (a viewer's default 0-65535 shows
/// it black), in a shape 16³ chunks do not divide: the padding of edge
/// chunks (zeros) must not count.
fn make_narrow(dir: &Path) -> PathBuf {
    let input = dir.join("narrow.zarr");
    let make = r#"
import sys, numpy as np, zarr
data = np.random.default_rng(3).integers(1000, 3000, size=(37, 29, 23), endpoint=True).astype("<u2")
z = zarr.create_array(sys.argv[1], shape=data.shape, chunks=(10, 8, 7), dtype=data.dtype, compressors=None, zarr_format=2)
z[...] = data
"#;
    let output = Command::new(python())
        .args(["-c", make])
        .arg(&input)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    input
}

/// Reads an OME-Zarr image's `omero` window with zarr-python, beside
/// numpy's range of the source.
const READ_OMERO: &str = r#"
import json, sys, numpy as np, zarr
source = zarr.open_array(sys.argv[1], mode="r")[...]
group = zarr.open_group(sys.argv[2], mode="r")
attributes = group.attrs.asdict()
omero = attributes.get("ome", attributes)["omero"]
window = omero["channels"][0]["window"]
print(json.dumps({"window": [window["start"], window["end"], window["min"], window["max"]],
                  "numpy": [int(source.min()), int(source.max())],
                  "channels": len(omero["channels"])}))
"#;

#[test]
fn ome_zarr_carries_level_zeros_range_as_its_omero_window() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_narrow(dir.path());
    let read = READ_OMERO;
    for format in ["zarr", "zarr3"] {
        let out = dir.path().join(format);
        rechunk(
            &input,
            &out,
            &["--shape", "16,16,16", "--format", format, "--levels", "3"],
        );
        let output = Command::new(python())
            .args(["-c", read])
            .arg(&input)
            .arg(&out)
            .output()
            .unwrap();
        assert!(output.status.success(), "{format}: {}", stderr(&output));
        let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let (lo, hi) = (&seen["numpy"][0], &seen["numpy"][1]);
        assert_eq!(
            seen["window"],
            serde_json::json!([lo, hi, lo, hi]),
            "{format}: {seen}"
        );
        assert_eq!(seen["channels"], 1, "{format}");
    }
}

/// The metadata file `name` of a view, read through the mount: its size
/// as `stat` gives it and as read, and whether it parses as JSON.
const READ_METADATA: &str = r#"
import json, os, sys
path = sys.argv[1]
size = os.stat(path).st_size
data = open(path, "rb").read()
print(json.dumps({"size": size, "read": len(data), "json": json.loads(data)}))
"#;

fn view_metadata(path: &Path) -> serde_json::Value {
    let output = Command::new(python())
        .args(["-c", READ_METADATA])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}: {}",
        path.display(),
        stderr(&output)
    );
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        seen["size"],
        seen["read"],
        "{}: stat and read disagree",
        path.display()
    );
    seen["json"].clone()
}

#[test]
fn a_views_metadata_gains_level_zeros_window_when_level_1_completes() {
    require!(Fuse, Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_narrow(dir.path());
    let numpy = r#"
import json, sys, zarr
a = zarr.open_array(sys.argv[1], mode="r")[...]
print(json.dumps([int(a.min()), int(a.max())]))
"#;
    let output = Command::new(python())
        .args(["-c", numpy])
        .arg(&input)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let range: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for (format, file) in [
        ("zarr", ".zattrs"),
        ("zarr3", "zarr.json"),
        ("precomputed", "info"),
    ] {
        let root = dir.path().join(format);
        std::fs::create_dir(&root).unwrap();
        let flags = [
            "--shape", "8,8,8", "--format", format, "--levels", "4", "--mem", "64K",
        ];
        // 50 ms after each of 64 read blocks: level 1 needs the last; level
        // 2 has blocks built before level 1 completes.
        let view = MountedView::new(&input, &root, &flags, 50);
        let window = |metadata: &serde_json::Value| match format {
            "precomputed" => metadata["rechunkfs"]["window"].clone(),
            _ => {
                let ome = if format == "zarr3" {
                    &metadata["attributes"]["ome"]
                } else {
                    metadata
                };
                let window = &ome["omero"]["channels"][0]["window"];
                if window.is_null() {
                    return serde_json::Value::Null;
                }
                serde_json::json!([window["start"], window["end"]])
            }
        };
        let pending = view_metadata(&view.view.join(file));
        let level1 = &view.status()["levels"][1];
        assert!(
            json_u64(level1, "blocks_done") < json_u64(level1, "blocks_total"),
            "{format}: level 1 completed before the pending metadata was read: {level1}"
        );
        assert!(
            window(&pending).is_null(),
            "{format}: a window before level 1 is done: {pending}"
        );
        view.wait_complete();
        let done = view_metadata(&view.view.join(file));
        assert_eq!(window(&done), range, "{format}: {done}");
        if format != "precomputed" {
            let output = Command::new(python())
                .args(["-c", READ_OMERO])
                .arg(&input)
                .arg(&view.view)
                .output()
                .unwrap();
            assert!(output.status.success(), "{format}: {}", stderr(&output));
            let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            let (lo, hi) = (&seen["numpy"][0], &seen["numpy"][1]);
            assert_eq!(
                seen["window"],
                serde_json::json!([lo, hi, lo, hi]),
                "{format}: {seen}"
            );
        }
        view.unmount();
        // The journal holds it: a remount serves it before anything runs.
        let journal = rechunkfs::view::staging::Journal::read(&root.join("staging")).unwrap();
        let recorded = journal.window.expect("a window recorded in the journal");
        assert!(recorded.complete, "{format}: {recorded:?}");
        let view = MountedView::new(&input, &root, &flags, 0);
        let again = view_metadata(&view.view.join(file));
        assert_eq!(window(&again), range, "{format} remounted: {again}");
        view.unmount();
    }
}

/// The visible files at the top of `dir`, sorted, with their bytes
/// (`rechunkfs.json`, which names where each output is, left out).
fn top_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                path,
            )
        })
        .filter(|(name, _)| !name.starts_with(".rechunkfs") && name != "rechunkfs.json")
        .map(|(name, path)| (name, std::fs::read(path).unwrap()))
        .collect();
    files.sort();
    files
}

/// `--levels auto` over an array one block holds is a pyramid of one
/// level: a Zarr view of it serves that array, its metadata at the top
/// as `rechunk` writes it (one description, one writer), and zarr-python
/// opens it; no OME-Zarr group naming a level `0/` that is not there.
#[test]
fn a_zarr_pyramid_of_one_level_is_the_array_in_a_view_as_in_rechunk() {
    require!(Fuse, Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "12,10,9", "5,5,5", "<u2", false);
    for format in ["zarr", "zarr3"] {
        let flags = [
            "--shape", "16,16,16", "--format", format, "--levels", "auto",
        ];
        let out = dir.path().join(format!("out-{format}"));
        rechunk(&input, &out, &flags);
        let view = MountedView::new(&input, &dir.path().join(format), &flags, 0);
        view.wait_complete();
        let (served, written) = (top_files(&view.view), top_files(&out));
        let names = |files: &[(String, Vec<u8>)]| -> Vec<String> {
            files.iter().map(|(name, _)| name.clone()).collect()
        };
        assert_eq!(names(&served), names(&written), "{format}");
        assert!(served == written, "{format}: the metadata differs");
        let same = common::run_python(
            "import sys, zarr, numpy\n\
             a = zarr.open_array(sys.argv[1], mode='r')\n\
             b = zarr.open_array(sys.argv[2], mode='r')\n\
             print(a.shape == b.shape and numpy.array_equal(a[...], b[...]))",
            &[view.view.to_str().unwrap(), input.to_str().unwrap()],
        );
        assert_eq!(same.trim(), "True", "{format}");
        view.unmount();
    }
}

/// Every file under `dir`, by its path relative to `dir`, with its bytes.
fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.insert(path.strip_prefix(dir).unwrap().to_path_buf(), bytes);
            }
        }
    }
    files
}

#[test]
fn levels_built_as_level_0_is_written_read_nothing_back_and_equal_levels_read_back() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "37,29,23", "10,8,7", "<u2", false);
    for (format, method, shape) in [
        ("zarr", "mean", "8,8,8"),
        ("zarr3", "mode", "8,6,4"),
        ("npy", "mean", "6,10,8"),
    ] {
        let args = [
            "--shape",
            shape,
            "--format",
            format,
            "--levels",
            "auto",
            "--downsample",
            method,
        ];
        let streamed_out = dir.path().join(format!("{format}-streamed"));
        let streamed = rechunk(&input, &streamed_out, &args);
        let planned = &streamed["pyramid"]["planned"];
        assert_eq!(planned["streamed"], true, "{format}: {planned}");
        assert_as_planned(&streamed);
        for level in streamed["pyramid"]["levels"].as_array().unwrap() {
            assert_eq!(json_u64(level, "reads"), 0, "{format}: {level}");
            assert_eq!(json_u64(level, "bytes_read"), 0, "{format}: {level}");
        }
        let summary = check(&streamed_out, format, &input, method, "2,2,2");
        assert_eq!(summary["levels"], 4, "{format}: {summary}");
        // A --mem that holds level 0's plan but not the levels beside it.
        let mem = ["2K", "4K", "8K", "16K", "32K", "64K"]
            .into_iter()
            .find(|mem| {
                let mut plan_args = vec!["plan", input.to_str().unwrap(), "--json", "--mem", mem];
                plan_args.extend(args);
                let output = rechunkfs(&plan_args);
                let Ok(plan) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
                    return false;
                };
                let because = plan["pyramid"]["read_back_because"].as_str().unwrap_or("");
                output.status.success() && because.contains("beside level 0")
            })
            .unwrap_or_else(|| panic!("{format}: no --mem reads the levels back"));
        let read_back_out = dir.path().join(format!("{format}-read-back"));
        let mut read_back_args = args.to_vec();
        read_back_args.extend(["--mem", mem]);
        let read_back = rechunk(&input, &read_back_out, &read_back_args);
        assert_eq!(read_back["pyramid"]["planned"]["streamed"], false);
        assert_as_planned(&read_back);
        assert!(json_u64(&read_back["pyramid"]["levels"][0], "reads") > 0);
        let (streamed_files, read_back_files) = (tree(&streamed_out), tree(&read_back_out));
        assert_eq!(
            streamed_files.keys().collect::<Vec<_>>(),
            read_back_files.keys().collect::<Vec<_>>(),
            "{format}"
        );
        for (path, bytes) in &streamed_files {
            assert!(
                read_back_files[path] == *bytes,
                "{format}: {} differs",
                path.display()
            );
        }
    }
}

/// The workers that write level 0 make level 1's cells of what they write:
/// every thread count writes the bytes one thread writes, with the plan's
/// seeks and peak, the levels' peak growing with the workers' slabs; the
/// pyramid of the most threads is TensorStore's downsampling of the source.
#[test]
fn streamed_levels_are_the_same_for_every_thread_count_and_hold_what_they_plan() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "37,29,23", "10,8,7", "<u2", false);
    let mut first: Option<(std::collections::BTreeMap<PathBuf, Vec<u8>>, u64)> = None;
    for threads in ["1", "2", "3", "8"] {
        let out = dir.path().join(format!("levels-{threads}"));
        let args = [
            "--shape",
            "8,6,8",
            "--format",
            "zarr",
            "--levels",
            "auto",
            "--threads",
            threads,
        ];
        let report = rechunk(&input, &out, &args);
        assert_eq!(report["pyramid"]["planned"]["streamed"], true, "{threads}");
        assert_as_planned(&report);
        common::assert_counts_as_planned(&report, &format!("{threads} threads"));
        let peak = json_u64(&report["pyramid"], "planned.peak_memory_bytes");
        let files = tree(&out);
        match &first {
            None => first = Some((files, peak)),
            Some((alone, peak_alone)) => {
                assert!(
                    files == *alone,
                    "{threads} threads wrote other bytes than one"
                );
                assert!(
                    peak > *peak_alone,
                    "{threads} threads' levels held {peak} bytes, one's {peak_alone}"
                );
            }
        }
    }
    let summary = check(
        &dir.path().join("levels-8"),
        "zarr",
        &input,
        "mean",
        "2,2,2",
    );
    assert_eq!(summary["levels"], 4, "{summary}");
}

#[test]
fn levels_whose_cells_level_0s_blocks_cut_are_read_back_and_plan_says_why() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "37,29,23", "10,8,7", "<u2", false);
    let out = dir.path().join("out");
    let report = rechunk(
        &input,
        &out,
        &["--shape", "7,7,7", "--format", "zarr", "--levels", "3"],
    );
    let planned = &report["pyramid"]["planned"];
    assert_eq!(planned["streamed"], false, "{planned}");
    let because = planned["read_back_because"].as_str().unwrap_or("");
    assert!(because.contains("cut the cells"), "{planned}");
    assert_as_planned(&report);
    let summary = check(&out, "zarr", &input, "mean", "2,2,2");
    assert_eq!(summary["levels"], 3, "{summary}");
}

/// Whether any file under `dir` is a temporary (`*.partial`).
fn holds_a_temporary(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        path.to_string_lossy().ends_with(".partial") || (path.is_dir() && holds_a_temporary(&path))
    })
}

#[test]
fn a_run_killed_while_its_levels_stream_is_run_again_with_overwrite() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = make_zarr(dir.path(), "37,29,23", "10,8,7", "<u2", false);
    let out = dir.path().join("out");
    let args = ["--shape", "8,8,8", "--format", "zarr3", "--levels", "auto"];
    let mut child = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args([
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "-q",
        ])
        .args(args)
        .env("RECHUNKFS_STEP_DELAY_MS", "200")
        .spawn()
        .unwrap();
    // Killed once level 1 has a block begun on disk, level 0 unfinished.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !holds_a_temporary(&out.join("1")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no level-1 temporary in 60 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mut again = args.to_vec();
    again.push("--overwrite");
    let report = rechunk(&input, &out, &again);
    assert_eq!(report["pyramid"]["planned"]["streamed"], true);
    assert!(!holds_a_temporary(&out.join("1")));
    let summary = check(&out, "zarr3", &input, "mean", "2,2,2");
    assert_eq!(summary["levels"], 4, "{summary}");
}
