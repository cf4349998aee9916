//! Lying and hostile encoded inputs: chunks that decompress to far more
//! than their chunk, frames and headers that claim sizes their bytes
//! cannot hold, shard indexes pointing outside their shard, PackBits runs
//! past their strip. Inputs are written by zarr-python, nibabel and
//! tifffile, then tampered with.
//!
//! Each case runs the real binary as a child, with its own deadline, and
//! checks what a user sees: exit code 1 (never a panic's 101 or an
//! abort's 134), a message naming the file, and (for the bombs) a peak
//! RSS, the child's `ru_maxrss`, within `--mem` + 64 MiB.

#[macro_use]
mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{python, run_fixture, zarr_python_writes};

/// What a child run of rechunkfs came to.
struct Run {
    /// Its exit code; `None` when a signal ended it.
    code: Option<i32>,
    stderr: String,
    /// Its peak resident set, in KiB.
    max_rss_kib: u64,
}

/// Starts one command, waits for it at most a deadline and prints its
/// exit code (negative: the signal) and its peak RSS. A process inherits
/// the peak RSS of the one that forked it (Linux keeps the old memory's
/// high-water mark across exec), so the child is started from this small
/// process, not from the test's, whose RSS holds every test's inputs.
const LAUNCHER: &str = "import resource, subprocess, sys\n\
    deadline, log, args = float(sys.argv[1]), sys.argv[2], sys.argv[3:]\n\
    try:\n\
    \x20   with open(log, 'wb') as err:\n\
    \x20       code = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n\
    \x20                             stderr=err, timeout=deadline).returncode\n\
    except subprocess.TimeoutExpired:\n\
    \x20   print('stuck')\n\
    \x20   sys.exit(0)\n\
    print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n";

/// Runs rechunkfs with `args`, killed (failing the test, saying what was
/// stuck) if it runs past `deadline`; with its peak RSS.
fn run_measured(args: &[&str], deadline: Duration) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let output = Command::new(python())
        .args(["-c", LAUNCHER])
        .arg(deadline.as_secs().to_string())
        .arg(&log)
        .arg(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(args)
        .args(common::fault_threads(args))
        .output()
        .expect("run the launcher");
    let stderr = fs::read_to_string(&log).unwrap_or_default();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "launcher: {stdout}{}",
        common::stderr(&output)
    );
    assert!(
        stdout.trim() != "stuck",
        "stuck: rechunkfs {args:?} ran past {deadline:?} and was killed; it said: {stderr}"
    );
    let numbers: Vec<i64> = stdout
        .split_whitespace()
        .map(|n| n.parse().expect("code and peak RSS"))
        .collect();
    Run {
        code: (numbers[0] >= 0).then_some(numbers[0] as i32),
        stderr,
        max_rss_kib: numbers[1] as u64,
    }
}

/// The bomb tests' memory bound (`--mem`) and the slack the README allows
/// over it for the program itself.
const MEM: &str = "64M";
const MEM_BYTES: u64 = 64 << 20;
const SLACK: u64 = 64 << 20;

/// Refused as a user should see it: exit code 1, the message naming
/// `names` (the file, the chunk) and saying `says`.
fn assert_refused(run: &Run, what: &str, names: &str, says: &str) {
    assert_eq!(
        run.code,
        Some(1),
        "{what}: exit code (101 is a panic, 134 an abort; None a signal): {}",
        run.stderr
    );
    assert!(
        run.stderr.contains(names) && run.stderr.contains(says),
        "{what}: the message should name {names:?} and say {says:?}: {}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("panicked"),
        "{what}: panicked: {}",
        run.stderr
    );
}

fn rechunk(input: &Path, out: &Path, shape: &str) -> Run {
    run_measured(
        &[
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            shape,
            "--mem",
            MEM,
        ],
        Duration::from_secs(120),
    )
}

fn assert_within_memory(run: &Run, what: &str) {
    let peak = run.max_rss_kib * 1024;
    assert!(
        peak <= MEM_BYTES + SLACK,
        "{what}: peak RSS {peak} bytes, past --mem {MEM} + 64 MiB"
    );
}

/// A 16×16 u2 array (chunks of 512 bytes) written by zarr-python as Zarr
/// `version` with `codec`; its single chunk's path.
fn small_zarr(root: &Path, name: &str, version: &str, codec: &str) -> (PathBuf, PathBuf) {
    let input = root.join(name);
    zarr_python_writes(
        &input,
        &[16, 16],
        &[16, 16],
        "<u2",
        version,
        &["--codec", codec],
    );
    let chunk = if version == "3" {
        input.join("c/0/0")
    } else {
        input.join("0.0")
    };
    assert!(chunk.is_file(), "zarr-python wrote {}", chunk.display());
    (input, chunk)
}

/// A zstd frame of 17 bytes declaring `declared` bytes of content, whose
/// one RLE block holds 1000 zero bytes.
fn lying_zstd_frame(declared: u64) -> Vec<u8> {
    let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd];
    // Frame header descriptor: an 8-byte content size, single segment.
    frame.push(0b1110_0000);
    frame.extend(declared.to_le_bytes());
    // Last block, RLE, 1000 bytes: its header (3 bytes), then its byte.
    let header: u32 = 1 | (1 << 1) | (1000 << 3);
    frame.extend(&header.to_le_bytes()[..3]);
    frame.push(0);
    frame
}

/// A 17-byte zstd chunk claiming 1 TiB aborted the process when the
/// decoder sized its buffer by the frame's claim: refused instead, in v2
/// and v3, naming the chunk.
#[test]
fn a_zstd_chunk_claiming_a_tebibyte_is_refused_naming_it() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    for version in ["2", "3"] {
        let (input, chunk) = small_zarr(root.path(), &format!("v{version}"), version, "zstd");
        let frame = lying_zstd_frame(1 << 40);
        assert_eq!(frame.len(), 17);
        fs::write(&chunk, frame).unwrap();
        let run = rechunk(&input, &root.path().join(format!("out{version}")), "8,8");
        let what = format!("v{version}");
        assert_refused(
            &run,
            &what,
            &chunk.display().to_string(),
            "declares 1099511627776",
        );
        assert_within_memory(&run, &what);
    }
}

/// zstd frames of zeros: `len` bytes, with the content size declared or not.
fn zstd_zeros(len: u64, declared: bool) -> Vec<u8> {
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    encoder.include_contentsize(declared).unwrap();
    if declared {
        encoder.set_pledged_src_size(Some(len)).unwrap();
    }
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..len >> 20 {
        encoder.write_all(&zeros).unwrap();
    }
    encoder.finish().unwrap()
}

/// A gzip member of `len` zero bytes, written by Python's zlib.
fn gzip_zeros(path: &Path, len: u64) {
    let script = "import sys, zlib\n\
        c = zlib.compressobj(9, zlib.DEFLATED, 31)\n\
        block = bytes(1 << 20)\n\
        with open(sys.argv[1], 'wb') as f:\n\
        \x20   for _ in range(int(sys.argv[2]) >> 20):\n\
        \x20       f.write(c.compress(block))\n\
        \x20   f.write(c.flush())\n";
    common::run_python(script, &[path.to_str().unwrap(), &len.to_string()]);
}

/// `len` zero bytes as one Blosc buffer (zstd inside), written by numcodecs.
fn blosc_zeros(path: &Path, len: u64) {
    let script = "import sys, numcodecs\n\
        blosc = numcodecs.Blosc(cname='zstd', clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)\n\
        open(sys.argv[1], 'wb').write(blosc.encode(bytes(int(sys.argv[2]))))\n";
    common::run_python(script, &[path.to_str().unwrap(), &len.to_string()]);
}

/// Chunks that should decode to 512 bytes, replaced by streams of 512 MiB
/// (zstd with and without a declared size, gzip, zlib) or a Blosc buffer
/// of 256 MiB: refused at byte 513 or by the size declared, with the peak
/// RSS within `--mem` + 64 MiB, where decoding whole reached 534 MiB
/// (zstd, zlib), 1 GiB (gzip).
#[test]
fn decompression_bombs_are_refused_within_the_memory_bound() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let big = 512u64 << 20;
    let cases: [(&str, &str, &str); 5] = [
        ("zstd-declared", "3", "zstd"),
        ("zstd-streamed", "3", "zstd"),
        ("gzip", "3", "gzip"),
        ("zlib", "2", "zlib"),
        ("blosc", "2", "blosc-zstd"),
    ];
    for (name, version, codec) in cases {
        let (input, chunk) = small_zarr(root.path(), name, version, codec);
        match name {
            "zstd-declared" => fs::write(&chunk, zstd_zeros(big, true)).unwrap(),
            "zstd-streamed" => fs::write(&chunk, zstd_zeros(big, false)).unwrap(),
            "gzip" => gzip_zeros(&chunk, big),
            "blosc" => blosc_zeros(&chunk, big / 2),
            _ => {
                let gzip = root.path().join("zeros.gz");
                gzip_zeros(&gzip, big);
                let member = fs::read(&gzip).unwrap();
                // The same deflate data as a zlib stream (its Adler-32 is
                // not checked before the size is).
                let mut zlib = vec![0x78, 0xda];
                zlib.extend(&member[10..member.len() - 8]);
                zlib.extend([0, 0, 0, 0]);
                fs::write(&chunk, zlib).unwrap();
            }
        }
        let encoded = fs::metadata(&chunk).unwrap().len();
        assert!(encoded < 1 << 20, "{name}: a bomb of {encoded} bytes");
        let run = rechunk(&input, &root.path().join(format!("out-{name}")), "8,8");
        let says = match name {
            "zstd-declared" => "declares 536870912",
            "blosc" => "declares 268435456",
            _ => "more than the 512 bytes",
        };
        assert_within_memory(&run, name);
        assert_refused(&run, name, &chunk.display().to_string(), says);
    }
}

/// CRC-32C (Castagnoli, reflected), bit by bit.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Shard index entries outside their shard: an offset that wraps past
/// 2^64 in an index without crc32c (zarrs panicked: exit 101), a length
/// past the shard's end under a valid crc32c, an entry inside the index.
/// Each is refused naming the shard and the inner chunk.
#[test]
fn shard_index_entries_outside_their_shard_are_refused_naming_the_chunk() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // 16×16 u2 in shards of 8×8 holding 4×4 chunks: 4 entries per index.
    let entries = 4usize;
    let index_len = entries * 16;
    for case in ["wraps", "past-the-end", "in-the-index"] {
        let input = root.path().join(case);
        zarr_python_writes(
            &input,
            &[16, 16],
            &[4, 4],
            "<u2",
            "3",
            &["--codec", "zstd", "--shards", "8,8"],
        );
        let shard = input.join("c/0/1");
        let mut bytes = fs::read(&shard).unwrap();
        let len = bytes.len();
        let at = len - index_len - 4;
        let set = |bytes: &mut Vec<u8>, entry: usize, offset: u64, nbytes: u64| {
            bytes[at + 16 * entry..at + 16 * entry + 8].copy_from_slice(&offset.to_le_bytes());
            bytes[at + 16 * entry + 8..at + 16 * entry + 16].copy_from_slice(&nbytes.to_le_bytes());
        };
        match case {
            "wraps" => {
                // The spec allows an index without crc32c: drop it.
                let meta_path = input.join("zarr.json");
                let mut meta: serde_json::Value =
                    serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
                let codecs = &mut meta["codecs"][0]["configuration"]["index_codecs"];
                let kept: Vec<serde_json::Value> = codecs
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|c| c["name"] != "crc32c")
                    .cloned()
                    .collect();
                *codecs = serde_json::Value::Array(kept);
                fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
                for other in ["c/0/0", "c/1/0", "c/1/1"] {
                    let other = input.join(other);
                    let kept = fs::read(&other).unwrap();
                    fs::write(&other, &kept[..kept.len() - 4]).unwrap();
                }
                bytes.truncate(len - 4);
                set(&mut bytes, 2, u64::MAX - 7, 100);
            }
            "past-the-end" => {
                set(&mut bytes, 2, 0, len as u64);
                let crc = crc32c(&bytes[at..at + index_len]);
                bytes[len - 4..].copy_from_slice(&crc.to_le_bytes());
            }
            _ => {
                set(&mut bytes, 2, at as u64, 16);
                let crc = crc32c(&bytes[at..at + index_len]);
                bytes[len - 4..].copy_from_slice(&crc.to_le_bytes());
            }
        }
        fs::write(&shard, &bytes).unwrap();
        let run = rechunk(&input, &root.path().join(format!("out-{case}")), "5,5");
        assert_refused(
            &run,
            case,
            &shard.display().to_string(),
            "inner chunk [1, 0]",
        );
    }
}

/// A `.nii.gz` of 8³ bytes written by nibabel, its header then edited to
/// claim `side`³ voxels, gzipped again: a file of about a kilobyte.
fn lying_nifti_gz(root: &Path, side: i16) -> PathBuf {
    let dir = root.join(format!("nifti{side}"));
    run_fixture(
        "make_nifti.py",
        &[
            dir.to_str().unwrap(),
            "--shape",
            "8,8,8",
            "--dtype",
            "uint8",
            "--gzip",
        ],
    );
    let path = dir.join("whole.nii.gz");
    let mut image = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::MultiGzDecoder::new(fs::File::open(&path).unwrap()),
        &mut image,
    )
    .unwrap();
    assert_eq!(
        image[..4],
        348i32.to_le_bytes(),
        "a little-endian NIfTI-1 header"
    );
    for d in 1..=3 {
        image[40 + 2 * d..42 + 2 * d].copy_from_slice(&side.to_le_bytes());
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(&image).unwrap();
    fs::write(&path, encoder.finish().unwrap()).unwrap();
    path
}

/// A kilobyte `.nii.gz` claiming 32767³ voxels ran for minutes and took
/// gigabytes; one claiming 8192³ aborted. Deflate cannot exceed 1032:1,
/// so both are refused at the scan (by `plan` as by `rechunk`), naming the
/// file and the claim, before any work.
#[test]
fn a_gzipped_nifti_claiming_more_than_its_bytes_can_hold_is_refused_at_the_scan() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    for side in [32767i16, 8192] {
        let input = lying_nifti_gz(root.path(), side);
        let claimed = (side as u64).pow(3);
        let what = format!("{side}³");
        let plan = run_measured(
            &["plan", input.to_str().unwrap(), "--shape", "64,64,64"],
            Duration::from_secs(60),
        );
        assert_refused(
            &plan,
            &what,
            "whole.nii.gz",
            &format!("claims {}", claimed + 352),
        );
        let run = rechunk(&input, &root.path().join(format!("out{side}")), "64,64,64");
        assert_refused(&run, &what, "whole.nii.gz", "can hold at most");
        assert_within_memory(&run, &what);
    }
}

/// Zarr metadata claiming chunks of 4096³ bytes over chunk files of a
/// few hundred bytes: refused at the scan, naming a chunk file.
#[test]
fn zarr_chunks_too_small_for_the_chunk_their_metadata_claims_are_refused_at_the_scan() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    for (version, codec, meta_name, chunk) in [
        ("2", "zstd", ".zarray", "0.0.0"),
        ("3", "gzip", "zarr.json", "c/0/0/0"),
    ] {
        let input = root.path().join(format!("v{version}"));
        zarr_python_writes(
            &input,
            &[8, 8, 8],
            &[8, 8, 8],
            "|u1",
            version,
            &["--codec", codec],
        );
        let meta_path = input.join(meta_name);
        let mut meta: serde_json::Value =
            serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
        let side = serde_json::json!([4096, 4096, 4096]);
        meta["shape"] = side.clone();
        if version == "2" {
            meta["chunks"] = side;
        } else {
            meta["chunk_grid"]["configuration"]["chunk_shape"] = side;
        }
        fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
        let plan = run_measured(
            &["plan", input.to_str().unwrap(), "--shape", "64,64,64"],
            Duration::from_secs(60),
        );
        assert_refused(&plan, version, chunk, "claims 68719476736");
    }
}

/// A PackBits strip whose runs go past the strip was cut silently, and
/// its block looked complete: refused, naming the file and the strip.
#[test]
fn packbits_runs_past_their_strip_are_refused() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("runs.tif");
    let script = "import sys, numpy, tifffile\n\
        a = (numpy.arange(64 * 64) * 7 % 251).astype(numpy.uint8).reshape(64, 64)\n\
        tifffile.imwrite(sys.argv[1], a, compression='packbits', rowsperstrip=16)\n\
        page = tifffile.TiffFile(sys.argv[1]).pages[0]\n\
        print(page.dataoffsets[1], page.databytecounts[1])\n";
    let text = common::run_python(script, &[path.to_str().unwrap()]);
    let numbers: Vec<usize> = text
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let (offset, count) = (numbers[0], numbers[1]);
    let mut bytes = fs::read(&path).unwrap();
    // Runs of 128 sevens, as many as the strip's bytes hold: 64 times the
    // strip's 1024 pixels.
    for (i, byte) in bytes[offset..offset + count].iter_mut().enumerate() {
        *byte = if i % 2 == 0 { 0x81 } else { 7 };
    }
    fs::write(&path, &bytes).unwrap();
    let run = rechunk(&path, &root.path().join("out"), "32,32");
    assert_refused(&run, "PackBits", "runs.tif", "strip 1");
    assert!(run.stderr.contains("past the 1024 bytes"), "{}", run.stderr);
}

/// A deflated TIFF strip of zeros whose page then claims 60000 rows (its
/// ImageLength and RowsPerStrip edited): its few bytes cannot hold them
/// even at deflate's 1032:1, so it is refused at the scan, naming the file.
#[test]
fn a_tiff_strip_too_short_for_the_rows_its_page_claims_is_refused_at_the_scan() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("tall.tif");
    let script = "import struct, sys, numpy, tifffile\n\
        tifffile.imwrite(sys.argv[1], numpy.zeros((64, 64), numpy.uint8), compression='zlib',\n\
        \x20                rowsperstrip=64)\n\
        with tifffile.TiffFile(sys.argv[1]) as f:\n\
        \x20   tags = f.pages[0].tags\n\
        \x20   edits = [(tags[name].valueoffset, tags[name].dtype) for name in\n\
        \x20            ('ImageLength', 'RowsPerStrip')]\n\
        \x20   order = f.byteorder\n\
        with open(sys.argv[1], 'r+b') as f:\n\
        \x20   for offset, dtype in edits:\n\
        \x20       f.seek(offset)\n\
        \x20       f.write(struct.pack(order + ('H' if dtype == 3 else 'I'), 60000))\n";
    common::run_python(script, &[path.to_str().unwrap()]);
    let plan = run_measured(
        &["plan", path.to_str().unwrap(), "--shape", "64,64"],
        Duration::from_secs(60),
    );
    assert_refused(
        &plan,
        "tall TIFF",
        "tall.tif",
        &format!("claims {}", 60000 * 64),
    );
}

/// An HDF5 dataset written by h5py in one deflated chunk of 1 MiB, that
/// chunk's bytes then replaced by a zlib stream of 512 MiB of zeros (it
/// fits in the chunk's stored bytes): libhdf5 inflated it whole (550 MiB
/// peak) before finding it too long. Refused within `--mem` + 64 MiB,
/// naming the file and the dataset.
#[test]
fn a_deflated_hdf5_chunk_inflating_past_its_chunk_is_refused_within_the_memory_bound() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("bomb.h5");
    let script = "import sys, h5py, numpy, zlib\n\
        rng = numpy.random.default_rng(1)\n\
        a = rng.integers(0, 65535, size=(512, 1024), dtype=numpy.uint16)\n\
        with h5py.File(sys.argv[1], 'w') as f:\n\
        \x20   f.create_dataset('data', data=a, chunks=(512, 1024), compression='gzip',\n\
        \x20                    compression_opts=1)\n\
        with h5py.File(sys.argv[1], 'r') as f:\n\
        \x20   info = f['data'].id.get_chunk_info(0)\n\
        c = zlib.compressobj(9)\n\
        bomb = b''.join(c.compress(bytes(1 << 20)) for _ in range(512)) + c.flush()\n\
        assert len(bomb) <= info.size, (len(bomb), info.size)\n\
        with open(sys.argv[1], 'r+b') as f:\n\
        \x20   f.seek(info.byte_offset)\n\
        \x20   f.write(bomb)\n";
    common::run_python(script, &[path.to_str().unwrap()]);
    let run = rechunk(&path, &root.path().join("out"), "64,64");
    assert_within_memory(&run, "HDF5");
    assert_refused(
        &run,
        "HDF5",
        "bomb.h5",
        "dataset '/data' inflates to more than",
    );
}
