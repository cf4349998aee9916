//! Compressed and sharded outputs with the real readers: `rechunk
//! --compress` writes Zarr v2 and v3 arrays (zstd, gzip, blosc) that
//! zarr-python and TensorStore read equal to the source, every region and
//! edge chunk; `--shard` writes Zarr v3 shards (uncompressed and
//! compressed, indexed as zarr-python indexes them) that both read too;
//! `--format h5 --compress gzip` writes blocks h5py reads as deflated
//! datasets holding the source's bytes. Inputs are written by zarr-python.
//! Seeks and peak memory are the plan's exactly, within tight `--mem`
//! too, and combinations a format cannot hold are refused before OUT is
//! touched, saying what to do. A view (a real FUSE mount) of uncompressed
//! shards has exact sizes from the first stat, both readers read it while
//! it fills and once done, and its shards are byte for byte those
//! `rechunk` writes.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rechunkfs::format::BlockFormat;

use common::mounted::MountedView;
use common::{json_u64, python, stderr, zarr_python_writes};

fn rechunkfs(args: &[&str]) -> Output {
    common::run_rechunkfs(args, 0)
}

fn shape_text(shape: &[u64]) -> String {
    shape
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn clipped(shape: &[u64], array: &[u64]) -> Vec<u64> {
    shape.iter().zip(array).map(|(&s, &a)| s.min(a)).collect()
}

/// The sample array written by zarr-python as Zarr v3, zstd-compressed,
/// in chunks of `chunks`.
fn zarr_python_input(root: &Path, array: &[u64], chunks: &[u64], dt: &str) -> PathBuf {
    let input = root.join("in.zarr");
    zarr_python_writes(&input, array, chunks, dt, "3", &["--codec", "zstd"]);
    input
}

/// Runs `rechunk IN OUT --shape SHAPE ARGS --json` and returns its report,
/// having checked that the seeks and the peak memory are the plan's and
/// that every output block was written in one call.
fn rechunk_as_planned(input: &Path, out: &Path, shape: &[u64], args: &[&str]) -> serde_json::Value {
    let shape = shape_text(shape);
    let mut all = vec![
        "rechunk",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--shape",
        &shape,
        "--json",
    ];
    all.extend(args);
    let output = rechunkfs(&all);
    assert!(output.status.success(), "{all:?}: {}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    common::assert_counts_as_planned(&report, &format!("{all:?}"));
    assert_eq!(
        json_u64(&report, "seeks.write"),
        json_u64(&report, "output_blocks"),
        "{all:?}: one write per encoded block"
    );
    let ratio = report["compression_ratio"].as_f64().expect("a ratio");
    let (encoded, written) = (
        json_u64(&report, "encoded_from_bytes"),
        json_u64(&report, "bytes_written"),
    );
    assert!((ratio - encoded as f64 / written as f64).abs() < 1e-9);
    report
}

/// zarr-python and TensorStore open `path` as a Zarr array of the sample
/// array (`dt`) in (inner) chunks of `chunks`, and read the whole of it,
/// every edge chunk and random regions equal to the source.
fn both_readers_agree(path: &Path, array: &[u64], chunks: &[u64], dt: &str, version: &str) {
    let output = Command::new(python())
        .arg(common::ZARR_CHECKER)
        .arg("check")
        .arg(path)
        .args(["--array", &shape_text(array)])
        .args(["--chunks", &shape_text(chunks)])
        .args(["--dtype", dt, "--zarr-format", version])
        .args(["--reader", "both", "--regions", "20"])
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

fn metadata(out: &Path, version: &str) -> serde_json::Value {
    let name = if version == "2" {
        ".zarray"
    } else {
        "zarr.json"
    };
    serde_json::from_slice(&std::fs::read(out.join(name)).expect("metadata")).expect("JSON")
}

/// `--compress` as the metadata must name it: (v2 compressor, v3 codec).
fn expected_codec(compress: &str, typesize: usize) -> (serde_json::Value, serde_json::Value) {
    use serde_json::json;
    let parts: Vec<&str> = compress.split(':').collect();
    match parts[0] {
        "zstd" => {
            let level: u64 = parts.get(1).map_or(3, |l| l.parse().unwrap());
            let checksum = parts.get(2) != Some(&"nochecksum");
            (
                json!({"id": "zstd", "level": level}),
                json!({"name": "zstd", "configuration": {"level": level, "checksum": checksum}}),
            )
        }
        "gzip" => {
            let level: u64 = parts.get(1).map_or(5, |l| l.parse().unwrap());
            (
                json!({"id": "gzip", "level": level}),
                json!({"name": "gzip", "configuration": {"level": level}}),
            )
        }
        _ => {
            let cname = parts.get(1).copied().unwrap_or("lz4");
            let level: u64 = parts.get(2).map_or(5, |l| l.parse().unwrap());
            (
                json!({"id": "blosc", "cname": cname, "clevel": level, "shuffle": 1, "blocksize": 0}),
                json!({"name": "blosc", "configuration": {
                    "cname": cname, "clevel": level, "shuffle": "shuffle",
                    "typesize": typesize, "blocksize": 0}}),
            )
        }
    }
}

#[test]
fn every_codec_for_zarr_and_zarr3_reads_back_in_zarr_python_and_tensorstore() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [37u64, 29, 23];
    let input = zarr_python_input(root.path(), &array, &[10, 8, 7], "<u2");
    let codecs = [
        "zstd",
        "zstd:19",
        "zstd:5:nochecksum",
        "gzip",
        "gzip:9",
        "blosc",
        "blosc:zstd:3",
        "blosc:zlib:1",
    ];
    for (n, compress) in codecs.iter().enumerate() {
        for format in [BlockFormat::Zarr, BlockFormat::Zarr3] {
            // Shapes that do not divide the array, and (every other codec)
            // ones that do along two sides.
            let shape: &[u64] = if n % 2 == 0 {
                &[16, 9, 11]
            } else {
                &[37, 29, 5]
            };
            let version = if format == BlockFormat::Zarr {
                "2"
            } else {
                "3"
            };
            let out = root.path().join(format!("out{n}v{version}"));
            let name = if version == "2" { "zarr" } else { "zarr3" };
            rechunk_as_planned(
                &input,
                &out,
                shape,
                &["--format", name, "--compress", compress],
            );
            let meta = metadata(&out, version);
            let (v2, v3) = expected_codec(compress, 2);
            if version == "2" {
                assert_eq!(meta["compressor"], v2, "{compress}");
            } else {
                let codecs = meta["codecs"].as_array().expect("codecs");
                assert_eq!(codecs[0]["name"], "bytes", "{compress}: bytes first");
                assert_eq!(codecs[1], v3, "{compress}");
            }
            both_readers_agree(&out, &array, &clipped(shape, &array), "<u2", version);
        }
    }
}

/// zstd chunks carry a content checksum (the frame descriptor's bit 2)
/// unless `nochecksum` is asked, in Zarr v2 (whose metadata cannot say so)
/// and v3 alike: a damaged output chunk is then refused on read, by
/// rechunkfs reading it back and by zarr-python, instead of read as wrong
/// values.
#[test]
fn zstd_chunks_carry_checksums_that_catch_damage_unless_left_out() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [20u64, 12, 9];
    let input = zarr_python_input(root.path(), &array, &[10, 8, 7], "<u2");
    for (name, chunk) in [("zarr", "0.0.0"), ("zarr3", "c/0/0/0")] {
        for (compress, checksum) in [("zstd", true), ("zstd:3:nochecksum", false)] {
            let out = root.path().join(format!("{name}-{checksum}"));
            rechunk_as_planned(
                &input,
                &out,
                &array,
                &["--format", name, "--compress", compress],
            );
            let path = out.join(chunk);
            let mut bytes = std::fs::read(&path).unwrap();
            assert_eq!(
                bytes[..4],
                [0x28, 0xb5, 0x2f, 0xfd],
                "{name} {compress}: a frame"
            );
            assert_eq!(
                bytes[4] & 4 != 0,
                checksum,
                "{name} {compress}: the frame's checksum flag"
            );
            if !checksum {
                continue;
            }
            // The checksum is the frame's last 4 bytes: damage it.
            let last = bytes.len() - 1;
            bytes[last] ^= 0x5a;
            std::fs::write(&path, &bytes).unwrap();
            let again = root.path().join(format!("{name}-again"));
            let output = rechunkfs(&[
                "rechunk",
                out.to_str().unwrap(),
                again.to_str().unwrap(),
                "--shape",
                "5,5,5",
                // The damaged chunk is decoded by one of the workers.
                "--threads",
                "4",
            ]);
            let message = stderr(&output);
            assert_eq!(output.status.code(), Some(1), "{name}: {message}");
            assert!(
                message.contains(chunk) && message.contains("checksum"),
                "{name}: {message}"
            );
            let read = Command::new(python())
                .args([
                    "-c",
                    "import sys, zarr; zarr.open(sys.argv[1], mode='r')[:]",
                ])
                .arg(&out)
                .output()
                .expect("run python");
            assert!(
                !read.status.success(),
                "{name}: zarr-python read a damaged chunk"
            );
        }
    }
}

/// Files by path (relative to their tree) with their bytes.
type Tree = Vec<(PathBuf, Vec<u8>)>;

/// Every file under `dir`, by path relative to it, with its bytes.
fn files_under(dir: &Path) -> Tree {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.push((path.strip_prefix(dir).unwrap().to_path_buf(), bytes));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_thread_count_writes_the_same_bytes_holding_what_it_plans() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [30u64, 26, 21];
    let input = zarr_python_input(root.path(), &array, &[6, 5, 7], "<u2");
    let shape = [10u64, 13, 7];
    for (name, args) in [
        ("zstd3", &["--format", "zarr3", "--compress", "zstd"][..]),
        ("gzip2", &["--format", "zarr", "--compress", "gzip:5"]),
        ("shard", &["--format", "zarr3", "--shard", "10,26,14"]),
        ("h5gz", &["--format", "h5", "--compress", "gzip:5"]),
    ] {
        let mut first: Option<(Tree, u64)> = None;
        for threads in ["1", "2", "3", "8"] {
            let out = root.path().join(format!("{name}-{threads}"));
            let mut all = args.to_vec();
            all.extend(["--threads", threads]);
            // Seeks and the peak held are the plan's for every count.
            let report = rechunk_as_planned(&input, &out, &shape, &all);
            let peak = json_u64(&report, "peak_memory_bytes");
            let files = files_under(&out);
            assert!(!files.is_empty(), "{name}: no output");
            match &first {
                None => first = Some((files, peak)),
                Some((alone, peak_alone)) => {
                    assert!(
                        files == *alone,
                        "{name}: {threads} threads wrote other bytes than one"
                    );
                    // Workers hold their blocks at once: a step's decoded
                    // input chunks (6x5x7 of them, several per step) and a
                    // slab's encoded outputs, so more of them hold more.
                    assert!(
                        peak > *peak_alone,
                        "{name}: {threads} threads held {peak} bytes, one {peak_alone}"
                    );
                }
            }
        }
        if name != "h5gz" {
            let version = if name == "gzip2" { "2" } else { "3" };
            let out = root.path().join(format!("{name}-8"));
            both_readers_agree(&out, &array, &shape, "<u2", version);
        }
    }
    // `plan` says how many threads its peak is for.
    let planned = rechunkfs(&[
        "plan",
        input.to_str().unwrap(),
        "--shape",
        &shape_text(&shape),
        "--format",
        "zarr3",
        "--compress",
        "zstd",
        "--threads",
        "3",
    ]);
    let text = String::from_utf8_lossy(&planned.stdout);
    assert!(planned.status.success(), "{}", stderr(&planned));
    assert!(text.contains("threads       3 "), "{text}");
}

/// A view fills on any number of workers: from a compressed input (its
/// chunks decoded on the workers), into shards (each encoded on one) and
/// into plain blocks, 1, 2, 3 and 8 threads serve the bytes one thread
/// serves, the plan's run making the planned seeks and holding the planned
/// peak; both readers read the sharded view of 8.
#[test]
fn a_view_serves_the_same_bytes_on_every_thread_count_holding_what_it_plans() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [30u64, 26, 21];
    let input = zarr_python_input(root.path(), &array, &[6, 5, 7], "<u2");
    let shape = [10u64, 13, 7];
    for (name, format) in [
        ("shard", &["--format", "zarr3", "--shard", "10,26,14"][..]),
        ("npy", &["--format", "npy"]),
    ] {
        let mut first: Option<Tree> = None;
        for threads in ["1", "2", "3", "8"] {
            let what = format!("{name}, {threads} threads");
            let shape = shape_text(&shape);
            let args = [&["--shape", &shape, "--threads", threads][..], format].concat();
            let dir = root.path().join(format!("{name}-{threads}"));
            let mounted = MountedView::new(&input, &dir, &args, 0);
            let status = mounted.wait_complete();
            // No reader came before the end: the plan's run made every block.
            assert_eq!(json_u64(&status, "on_demand_blocks"), 0, "{what}: {status}");
            assert_eq!(
                json_u64(&status, "seeks_made"),
                json_u64(&status, "seeks_planned"),
                "{what}: seeks"
            );
            assert_eq!(
                json_u64(&status, "peak_held_bytes"),
                json_u64(&status, "peak_held_bytes_planned"),
                "{what}: peak memory"
            );
            let mut files = files_under(&mounted.view);
            // The view's live status differs from run to run; the rest may not.
            files.retain(|(path, _)| path != Path::new(".rechunkfs-status.json"));
            assert!(files.len() > 1, "{what}: {files:?}");
            match &first {
                None => first = Some(files),
                Some(alone) => {
                    let differ: Vec<_> = files
                        .iter()
                        .zip(alone)
                        .filter(|(a, b)| a != b)
                        .map(|(a, _)| a.0.display().to_string())
                        .collect();
                    assert!(
                        files.len() == alone.len() && differ.is_empty(),
                        "{what}: other bytes than one thread's in {differ:?}"
                    );
                }
            }
            if threads == "8" && name == "shard" {
                both_readers_agree(&mounted.view, &array, &[10, 13, 7], "<u2", "3");
            }
        }
    }
}

/// Uncompressed outputs too, from a compressed input (its chunks decoded
/// on the workers) and from an uncompressed one (nothing for workers to
/// hold): every thread count writes the bytes one thread writes, with the
/// plan's seeks and peak; workers hold more only where they decode.
#[test]
fn every_thread_count_writes_the_same_uncompressed_bytes_holding_what_it_plans() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [30u64, 26, 21];
    let zstd = zarr_python_input(root.path(), &array, &[6, 5, 7], "<u2");
    let npy = common::make_blocks(
        root.path(),
        "npy-in",
        &array,
        &[6, 5, 7],
        common::dtype("<u2"),
        BlockFormat::Npy,
    );
    let shape = shape_text(&[10, 13, 7]);
    for (input, decoded) in [(&zstd, true), (&npy, false)] {
        for format in ["npy", "h5", "zarr", "zarr3", "raw"] {
            let mut first: Option<(Tree, u64)> = None;
            for threads in ["1", "2", "3", "8"] {
                let name = format!("{}-{format}-{threads}", decoded as u8);
                let out = root.path().join(&name);
                let output = rechunkfs(&[
                    "rechunk",
                    input.to_str().unwrap(),
                    out.to_str().unwrap(),
                    "--shape",
                    &shape,
                    "--format",
                    format,
                    "--threads",
                    threads,
                    "--json",
                ]);
                assert!(output.status.success(), "{name}: {}", stderr(&output));
                let report: serde_json::Value =
                    serde_json::from_slice(&output.stdout).expect("JSON report");
                common::assert_counts_as_planned(&report, &name);
                let peak = json_u64(&report, "peak_memory_bytes");
                let files = files_under(&out);
                match &first {
                    None => first = Some((files, peak)),
                    Some((alone, peak_alone)) => {
                        assert!(files == *alone, "{name}: other bytes than one thread's");
                        if decoded {
                            assert!(peak > *peak_alone, "{name}: {peak} held, one {peak_alone}");
                        } else {
                            assert_eq!(peak, *peak_alone, "{name}: workers held nothing");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn big_endian_and_float_data_keep_their_bytes_compressed() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [21u64, 30];
    for (n, dt) in [">u2", "<f4", ">f8", "|u1"].into_iter().enumerate() {
        let input = root.path().join(format!("in{n}"));
        zarr_python_writes(&input, &array, &[7, 30], dt, "3", &[]);
        for (format, version) in [("zarr", "2"), ("zarr3", "3")] {
            let out = root.path().join(format!("out{n}-{format}"));
            rechunk_as_planned(
                &input,
                &out,
                &[8, 8],
                &["--format", format, "--compress", "blosc:lz4:5"],
            );
            both_readers_agree(&out, &array, &[8, 8], dt, version);
        }
    }
}

#[test]
fn sharded_zarr3_uncompressed_and_compressed_read_back() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // (array, inner chunks, shards): shards and chunks that do not divide
    // the array, and ones that do; a shard side past the array is the
    // array's side.
    let cases: [([u64; 3], [u64; 3], [u64; 3]); 3] = [
        ([37, 29, 23], [4, 3, 5], [8, 9, 10]),
        ([32, 27, 20], [8, 3, 5], [16, 9, 20]),
        ([37, 29, 23], [37, 10, 4], [100, 20, 12]),
    ];
    for (n, (array, chunks, shards)) in cases.iter().enumerate() {
        let case = root.path().join(format!("case{n}"));
        std::fs::create_dir(&case).unwrap();
        let input = zarr_python_input(&case, array, &[10, 8, 7], "<u2");
        for compress in [None, Some("zstd"), Some("blosc:lz4:3")] {
            let out = root
                .path()
                .join(format!("out{n}-{}", compress.unwrap_or("raw")));
            let shard = shape_text(shards);
            let mut args = vec!["--format", "zarr3", "--shard", &shard];
            if let Some(codec) = compress {
                args.extend(["--compress", codec]);
            }
            rechunk_as_planned(&input, &out, chunks, &args);
            let meta = metadata(&out, "3");
            let grid = &meta["chunk_grid"]["configuration"]["chunk_shape"];
            assert_eq!(grid, &serde_json::json!(clipped(shards, array)));
            let sharding = &meta["codecs"][0];
            assert_eq!(sharding["name"], "sharding_indexed");
            let config = &sharding["configuration"];
            assert_eq!(
                config["chunk_shape"],
                serde_json::json!(clipped(chunks, array))
            );
            assert_eq!(config["index_location"], "end");
            assert_eq!(
                config["index_codecs"],
                serde_json::json!([
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"}
                ])
            );
            assert_eq!(config["codecs"][0]["name"], "bytes");
            assert_eq!(
                config["codecs"].as_array().unwrap().len(),
                1 + compress.is_some() as usize
            );
            both_readers_agree(&out, array, &clipped(chunks, array), "<u2", "3");
        }
    }
}

#[test]
fn gzip_h5_blocks_read_back_in_h5py() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [37u64, 29, 23];
    // Both byte orders and float16, whose HDF5 type h5py reads as numpy's.
    let cases = [
        ("<u2", [16u64, 9, 11], 5),
        (">f4", [37, 29, 23], 9),
        ("<f2", [37, 29, 1], 1),
    ];
    for (n, (dt, shape, level)) in cases.into_iter().enumerate() {
        let case = root.path().join(format!("case{n}"));
        std::fs::create_dir(&case).unwrap();
        let input = zarr_python_input(&case, &array, &[10, 8, 7], dt);
        let out = root.path().join(format!("h5-{level}"));
        let compress = format!("gzip:{level}");
        rechunk_as_planned(
            &input,
            &out,
            &shape,
            &["--format", "h5", "--compress", &compress],
        );
        let script = r#"
import glob, os, sys
import h5py, numpy as np
sys.path.insert(0, sys.argv[1])
from verify import expected_bytes
out, array, block, level = sys.argv[2], [int(x) for x in sys.argv[3].split(',')], \
    [int(x) for x in sys.argv[4].split(',')], int(sys.argv[5])
dtype = np.dtype(sys.argv[6])
grid = [-(-a // b) for a, b in zip(array, block)]
names = sorted(os.listdir(out))
expected = sorted('_'.join(map(str, i)) + '.h5' for i in np.ndindex(*grid))
assert names == expected, (names, expected)
for index in np.ndindex(*grid):
    origin = [i * b for i, b in zip(index, block)]
    shape = [min(b, a - o) for a, b, o in zip(array, block, origin)]
    with h5py.File(os.path.join(out, '_'.join(map(str, index)) + '.h5'), 'r') as f:
        d = f['data']
        assert d.compression == 'gzip' and d.compression_opts == level, (d.compression, d.compression_opts)
        assert list(d.chunks) == shape, (d.chunks, shape)
        assert d.dtype == dtype, (d.dtype, dtype)
        got = d[...]
    assert got.tobytes() == expected_bytes(array, origin, shape, dtype.itemsize), index
print('h5py:', len(names), 'deflated blocks equal to the source')
"#;
        let output = Command::new(python())
            .args(["-c", script])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"))
            .arg(&out)
            .args([&shape_text(&array), &shape_text(&clipped(&shape, &array))])
            .arg(level.to_string())
            .arg(dt)
            .output()
            .expect("run python");
        assert!(
            output.status.success(),
            "h5py disagrees with the source: {}",
            stderr(&output)
        );
    }
}

#[test]
fn tight_memory_plans_hold_what_they_predict_compressed() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [60u64, 50, 40];
    let input = zarr_python_input(root.path(), &array, &[6, 5, 8], "<u2");
    let shape = [10u64, 7, 9];
    let unlimited = rechunk_as_planned(
        &input,
        &root.path().join("unlimited"),
        &shape,
        &["--format", "zarr3", "--compress", "zstd"],
    );
    let peak = json_u64(&unlimited, "planned_peak_memory_bytes");
    // `plan` plans for the same encoding.
    let planned = rechunkfs(&[
        "plan",
        input.to_str().unwrap(),
        "--shape",
        &shape_text(&shape),
        "--format",
        "zarr3",
        "--compress",
        "zstd",
        "--json",
    ]);
    assert!(planned.status.success(), "{}", stderr(&planned));
    let planned: serde_json::Value = serde_json::from_slice(&planned.stdout).unwrap();
    assert_eq!(json_u64(&planned, "peak_memory_bytes"), peak);
    assert_eq!(
        json_u64(&planned, "seeks.planned"),
        json_u64(&unlimited, "seeks.planned")
    );
    // A block gathered whole and its encoding are counted beside the pieces.
    let block = 10 * 7 * 9 * 2;
    assert!(peak >= 2 * block, "{peak}");
    let mut seeks = json_u64(&unlimited, "seeks.planned");
    // Down to near the least any plan needs (37.0 KiB here).
    for (n, mem) in [peak * 19 / 20, peak * 9 / 10, peak * 17 / 20]
        .into_iter()
        .enumerate()
    {
        let out = root.path().join(format!("tight{n}"));
        let mem = mem.to_string();
        let report = rechunk_as_planned(
            &input,
            &out,
            &shape,
            &["--format", "zarr3", "--compress", "zstd", "--mem", &mem],
        );
        assert!(json_u64(&report, "peak_memory_bytes") <= mem.parse().unwrap());
        let planned = json_u64(&report, "seeks.planned");
        assert!(planned >= seeks, "less memory, no fewer seeks");
        seeks = planned;
        both_readers_agree(&out, &array, &shape, "<u2", "3");
    }
    // Sharded too, and gzip HDF5.
    let report = rechunk_as_planned(
        &input,
        &root.path().join("sharded"),
        &[5, 7, 9],
        &[
            "--format",
            "zarr3",
            "--shard",
            "20,14,18",
            "--mem",
            &(peak * 4).to_string(),
        ],
    );
    assert_eq!(json_u64(&report, "output_blocks"), 3 * 4 * 3);
    rechunk_as_planned(
        &input,
        &root.path().join("h5"),
        &shape,
        &[
            "--format",
            "h5",
            "--compress",
            "gzip",
            "--mem",
            &(peak * 9 / 10).to_string(),
        ],
    );
}

#[test]
fn combinations_that_cannot_be_written_are_refused_before_out_is_touched() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let array = [20u64, 12];
    let input = zarr_python_input(root.path(), &array, &[5, 6], "<u2");
    let out = root.path().join("out");
    for (args, says) in [
        (
            vec!["--format", "npy", "--compress", "zstd"],
            "compress --format zarr",
        ),
        (
            vec!["--format", "nii", "--compress", "gzip"],
            "uncompressed",
        ),
        (
            vec!["--format", "raw", "--compress", "gzip"],
            "uncompressed",
        ),
        (vec!["--format", "h5", "--compress", "zstd"], "gzip"),
        (
            vec!["--format", "zarr", "--compress", "lzma"],
            "zstd[:LEVEL]",
        ),
        (
            vec!["--format", "zarr", "--compress", "zstd:40"],
            "out of range",
        ),
        (
            vec!["--format", "zarr", "--shard", "10,12"],
            "--format zarr3",
        ),
        (
            vec!["--format", "zarr3", "--shard", "8,12"],
            "a multiple of the chunk side",
        ),
        (
            vec!["--format", "zarr3", "--shard", "10"],
            "2 positive sides",
        ),
        (
            vec![
                "--format",
                "zarr3",
                "--compress",
                "zstd",
                "--strategy",
                "baseline",
            ],
            "--strategy keep",
        ),
    ] {
        let mut all = vec![
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            "5,6",
        ];
        all.extend(&args);
        let output = rechunkfs(&all);
        assert!(!output.status.success(), "{args:?} was accepted");
        let message = stderr(&output);
        assert!(message.contains(says), "{args:?}: {message}");
        assert!(!out.exists(), "{args:?}: OUT was made");
    }
}

/// Every shard key (`c/i/j/k`) of an array of `array` in shards of `shards`.
fn shard_keys(array: &[u64], shards: &[u64]) -> Vec<String> {
    let grid: Vec<u64> = array
        .iter()
        .zip(shards)
        .map(|(a, s)| a.div_ceil(*s))
        .collect();
    let mut keys = vec![String::from("c")];
    for &n in &grid {
        keys = keys
            .iter()
            .flat_map(|key| (0..n).map(move |i| format!("{key}/{i}")))
            .collect();
    }
    keys
}

/// A sharded case: the array, chunks, shards, and (views) the pause in ms
/// after each read block.
type ShardCase = ([u64; 3], [u64; 3], [u64; 3], u64);

#[test]
fn sharded_zarr3_views_read_while_filling_and_once_done() {
    require!(Fuse, Readers);
    // (array, chunks, shards, ms paused per read block): shards and chunks
    // that do not divide the array, and ones that do; read at once, and
    // while the view fills slowly.
    let cases: [ShardCase; 2] = [
        ([37, 29, 23], [4, 3, 5], [8, 9, 10], 0),
        ([40, 36, 30], [8, 9, 5], [16, 18, 10], 300),
    ];
    for (array, chunks, shards, delay) in cases {
        let root = tempfile::tempdir().unwrap();
        let input = zarr_python_input(root.path(), &array, &[10, 8, 7], "<u2");
        let (shape, shard) = (shape_text(&chunks), shape_text(&shards));
        let args = ["--shape", &shape, "--shard", &shard, "--format", "zarr3"];
        let mounted = MountedView::new(&input, root.path(), &args, delay);
        // Sizes are exact from the first stat: every inner chunk (those
        // past the array's end too) and the index with its checksum.
        let inner: u64 = shards.iter().zip(&chunks).map(|(s, c)| s / c).product();
        let chunk_bytes = chunks.iter().product::<u64>() * 2;
        let shard_len = inner * chunk_bytes + 16 * inner + 4;
        let keys = shard_keys(&array, &shards);
        for key in &keys {
            let len = std::fs::metadata(mounted.view.join(key)).unwrap().len();
            assert_eq!(len, shard_len, "{key}");
        }
        // Filling slowly, the plan cannot reach the last shard for
        // seconds: a read of it is served ahead of the plan, laid out whole.
        let last = keys.last().unwrap();
        let early = (delay > 0).then(|| {
            let bytes = std::fs::read(mounted.view.join(last)).unwrap();
            let status = mounted.status();
            assert_eq!(status["on_demand_blocks"], 1, "{status}");
            assert_eq!(status["state"], "materialising", "{status}");
            bytes
        });
        both_readers_agree(&mounted.view, &array, &chunks, "<u2", "3");
        let status = mounted.wait_complete();
        if delay == 0 {
            assert_eq!(status["seeks_made"], status["seeks_planned"], "{status}");
        }
        both_readers_agree(&mounted.view, &array, &chunks, "<u2", "3");
        // The same shards as rechunk writes, byte for byte.
        let out = root.path().join("out");
        rechunk_as_planned(&input, &out, &chunks, &args[2..]);
        for key in &keys {
            let (served, written) = (
                std::fs::read(mounted.view.join(key)).unwrap(),
                std::fs::read(out.join(key)).unwrap(),
            );
            assert!(served == written, "{key}: the view and rechunk differ");
            if key == last && early.is_some() {
                assert!(
                    early.as_ref() == Some(&written),
                    "{key} served ahead differs"
                );
            }
        }
    }
}

#[test]
fn a_view_refuses_compression_and_shards_of_other_formats() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let input = zarr_python_input(root.path(), &[20, 12], &[5, 6], "<u2");
    let view = root.path().join("view");
    std::fs::create_dir(&view).unwrap();
    for (args, says) in [
        (
            vec!["--format", "zarr3", "--compress", "zstd"],
            "sizes must be exact",
        ),
        (
            vec!["--format", "zarr", "--shard", "10,12"],
            "--format zarr3",
        ),
        (
            vec!["--format", "zarr3", "--shard", "8,12"],
            "multiple of the chunk side",
        ),
    ] {
        let mut all = vec![
            "mount",
            input.to_str().unwrap(),
            view.to_str().unwrap(),
            "--shape",
            "5,6",
        ];
        all.extend(&args);
        let output = rechunkfs(&all);
        assert!(!output.status.success(), "{args:?} was accepted");
        let message = stderr(&output);
        assert!(message.contains(says), "{args:?}: {message}");
        assert!(!rechunkfs::fuse::session::is_mounted(&view));
    }
}
