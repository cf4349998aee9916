//! A header fuzzer: for each input format (npy, NIfTI-1 plain and gzipped,
//! HDF5, MINC2, Zarr v2 and v3), seeded mutations of a valid small input (bit flips, bytes
//! set, truncations, insertions and deletions, length and shape fields set
//! to extremes, text edits of npy headers, JSON edits of Zarr metadata).
//! Each mutated input is scanned by the library and, when accepted,
//! rechunked. No case may panic or hang (each runs in a thread with a
//! deadline), and an accepted one must give the array the input's own
//! reader says it holds: npy and NIfTI headers parsed by hand
//! (`common::readers`, a `.nii.gz` inflated whole by flate2 first), HDF5 and MINC2 read by libhdf5, Zarr by a reader
//! written here from the specifications.
//!
//! `RECHUNKFS_FUZZ_CASES` sets the number of cases per format (default
//! 300); `RECHUNKFS_FUZZ_SEED` moves every case to other seeds.

#[macro_use]
mod common;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rechunkfs::array::axes::AxisOrder;
use rechunkfs::array::space::Space;
use rechunkfs::format::BlockFormat;
use rechunkfs::input::{HeaderChecks, InputArray};
use rechunkfs::output::directory::{self, OutputSpec};
use rechunkfs::plan::{self, Strategy};
use serde_json::{json, Value};

use common::readers;
use common::{dtype, make_blocks, TestRng};

/// The seed array, in C order, and its blocks: four along the first axis,
/// so that a scan that reads headers before use leaves some unread.
const ARRAY: [u64; 3] = [12, 5, 4];
const BLOCK: [u64; 3] = [3, 5, 4];
/// Zarr chunks, which leave padded edge chunks.
const CHUNKS: [u64; 3] = [4, 3, 4];
/// The output blocks each accepted input is rechunked into.
const OUT_BLOCK: u64 = 4;
/// Past this a case counts as hung.
const DEADLINE: Duration = Duration::from_secs(10);

fn cases() -> u64 {
    std::env::var("RECHUNKFS_FUZZ_CASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(300)
}

fn base_seed() -> u64 {
    std::env::var("RECHUNKFS_FUZZ_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(18)
}

/// An array of values as its reader sees it: C-order shape, element kind
/// (`u`, `i`, `f`) and size, and the elements as little-endian bytes, so
/// that two readers agree whatever byte order each file stores.
#[derive(Clone, Debug, PartialEq)]
struct Values {
    shape: Vec<u64>,
    kind: char,
    size: usize,
    little: Vec<u8>,
}

impl Values {
    /// From a numpy type string (`<u2`, `>f4`, `|u1`) and the data's bytes,
    /// exactly as many as the shape needs.
    fn from_descr(shape: Vec<u64>, descr: &str, data: &[u8]) -> Result<Values, String> {
        let mut chars = descr.chars();
        let order = chars.next().ok_or("empty type")?;
        let kind = chars.next().ok_or("type without a kind")?;
        let size: usize = chars
            .as_str()
            .parse()
            .map_err(|_| format!("type {descr}"))?;
        if !"uif".contains(kind) || ![1, 2, 4, 8].contains(&size) || (kind == 'f' && size == 1) {
            return Err(format!("type {descr}"));
        }
        let count = shape.iter().try_fold(1u64, |n, &side| n.checked_mul(side));
        let len = count
            .and_then(|n| n.checked_mul(size as u64))
            .filter(|&len| len <= data.len() as u64)
            .ok_or_else(|| format!("{} bytes of data for {shape:?} {descr}", data.len()))?;
        let mut little = data[..len as usize].to_vec();
        if order == '>' {
            for element in little.chunks_mut(size) {
                element.reverse();
            }
        }
        Ok(Values {
            shape,
            kind,
            size,
            little,
        })
    }
}

/// The formats fuzzed, and how each seed input is laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fuzzed {
    Npy,
    Nifti,
    /// `.nii.gz`: the header mutated inside the gzip stream, or the
    /// stream's own bytes.
    NiftiGz,
    Hdf5,
    Minc2,
    Zarr2,
    Zarr3,
}

impl Fuzzed {
    fn is_zarr(self) -> bool {
        matches!(self, Fuzzed::Zarr2 | Fuzzed::Zarr3)
    }

    fn extension(self) -> &'static str {
        match self {
            Fuzzed::Npy => "npy",
            Fuzzed::Nifti => "nii",
            Fuzzed::NiftiGz => "nii.gz",
            Fuzzed::Hdf5 => "h5",
            Fuzzed::Minc2 => "mnc",
            Fuzzed::Zarr2 | Fuzzed::Zarr3 => "",
        }
    }

    /// The files a case may mutate, relative to the input directory.
    fn targets(self, dir: &Path) -> Vec<PathBuf> {
        match self {
            Fuzzed::Zarr2 => vec![PathBuf::from(".zarray")],
            Fuzzed::Zarr3 => vec![PathBuf::from("zarr.json")],
            _ => {
                let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                    .expect("list seed")
                    .map(|e| PathBuf::from(e.expect("entry").file_name()))
                    .collect();
                files.sort();
                files
            }
        }
    }
}

// ---------------------------------------------------------------- seeds

/// A valid input of `format` under `root`, as a directory.
fn seed_input(root: &Path, format: Fuzzed) -> PathBuf {
    let u2 = dtype("<u2");
    match format {
        Fuzzed::Npy => make_blocks(root, "seed", &ARRAY, &BLOCK, u2, BlockFormat::Npy),
        Fuzzed::Nifti => make_blocks(root, "seed", &ARRAY, &BLOCK, u2, BlockFormat::Nifti),
        Fuzzed::NiftiGz => {
            let dir = make_blocks(root, "seed", &ARRAY, &BLOCK, u2, BlockFormat::Nifti);
            for name in Fuzzed::Nifti.targets(&dir) {
                let plain = dir.join(&name);
                let bytes = std::fs::read(&plain).expect("read seed block");
                std::fs::write(plain.with_extension("nii.gz"), gzip(&bytes)).expect("write");
                std::fs::remove_file(plain).expect("remove plain seed block");
            }
            dir
        }
        Fuzzed::Hdf5 => make_blocks(root, "seed", &ARRAY, &BLOCK, u2, BlockFormat::Hdf5),
        Fuzzed::Minc2 => {
            let out = root.join("minc");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/make_minc2.py");
            let output = std::process::Command::new(common::python())
                .arg(script)
                .arg(&out)
                .args(["--shape", "12,5,4", "--dtype", "<u2", "--blocks", "3,5,4"])
                .args(["--scaling", "none"])
                .output()
                .expect("run python");
            assert!(output.status.success(), "{}", common::stderr(&output));
            out.join("blocks")
        }
        Fuzzed::Zarr2 => common::make_zarr(root, "seed", &ARRAY, &CHUNKS, u2, BlockFormat::Zarr),
        Fuzzed::Zarr3 => common::make_zarr(root, "seed", &ARRAY, &CHUNKS, u2, BlockFormat::Zarr3),
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("gzip in memory");
    encoder.finish().expect("gzip in memory")
}

/// All that the gzip stream (one member or more) `bytes` inflates to, as
/// `gzip -d` would.
fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut inflated = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut inflated)
        .map_err(|e| format!("does not inflate: {e}"))?;
    Ok(inflated)
}

/// `.nii.gz`: the NIfTI header inside (inflated, mutated, gzipped again),
/// or a third of the time the gzip stream's own bytes.
fn mutate_nifti_gz(rng: &mut TestRng, bytes: &mut Vec<u8>) -> String {
    if rng.below(3) == 0 {
        return format!("gzip stream: {}", mutate_bytes(rng, bytes, 64));
    }
    let mut inflated = gunzip(bytes).expect("the seed inflates");
    let what = mutate_nifti(rng, &mut inflated);
    *bytes = gzip(&inflated);
    what
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("make case directory");
    for entry in std::fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

// ------------------------------------------------------------ mutations

/// Values a length or shape field is set to: the edges of its width.
fn extreme(rng: &mut TestRng, width: usize, was: u64) -> u64 {
    let all = if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    };
    let choices = [
        0,
        1,
        all,
        all >> 1,
        (all >> 1) + 1,
        was.wrapping_add(1) & all,
        was.wrapping_sub(1) & all,
        was.wrapping_mul(2) & all,
        was.wrapping_mul(1000) & all,
        rng.below(all.max(1)),
    ];
    choices[rng.below(choices.len() as u64) as usize]
}

/// Sets the `width`-byte little-endian (or big-endian) field at `at`.
fn set_field(bytes: &mut [u8], at: usize, width: usize, value: u64, little: bool) {
    if at + width > bytes.len() {
        return;
    }
    for (i, byte) in value.to_le_bytes().into_iter().take(width).enumerate() {
        let to = if little { at + i } else { at + width - 1 - i };
        bytes[to] = byte;
    }
}

fn get_field(bytes: &[u8], at: usize, width: usize, little: bool) -> u64 {
    let mut value = 0u64;
    for i in 0..width.min(8) {
        let from = if little { at + i } else { at + width - 1 - i };
        value |= u64::from(*bytes.get(from).unwrap_or(&0)) << (8 * i);
    }
    value
}

/// A position, mostly in the first `header` bytes.
fn position(rng: &mut TestRng, len: usize, header: usize) -> usize {
    let span = if rng.below(5) == 0 {
        len
    } else {
        header.min(len)
    };
    rng.below(span.max(1) as u64) as usize
}

/// One of the byte-level mutations every format gets; says what it did.
fn mutate_bytes(rng: &mut TestRng, bytes: &mut Vec<u8>, header: usize) -> String {
    let len = bytes.len();
    let at = position(rng, len, header);
    match rng.below(6) {
        0 if at < len => {
            let bit = rng.below(8);
            bytes[at] ^= 1 << bit;
            format!("flip bit {bit} of byte {at}")
        }
        1 if at < len => {
            let value = rng.below(256) as u8;
            bytes[at] = value;
            format!("set byte {at} to {value}")
        }
        2 => {
            let to = position(rng, len, header + 16);
            bytes.truncate(to);
            format!("truncate to {to} bytes")
        }
        3 => {
            let count = 1 + rng.below(16) as usize;
            let inserted: Vec<u8> = (0..count).map(|_| rng.below(256) as u8).collect();
            bytes.splice(at..at, inserted);
            format!("insert {count} bytes at {at}")
        }
        4 if at < len => {
            let end = (at + 1 + rng.below(16) as usize).min(len);
            bytes.drain(at..end);
            format!("delete bytes {at}..{end}")
        }
        _ => {
            let count = 2 + rng.below(6);
            for _ in 0..count {
                let at = position(rng, len, header);
                if at < len {
                    bytes[at] = rng.below(256) as u8;
                }
            }
            format!("set {count} random bytes")
        }
    }
}

/// npy: the version, the header length field, or the header dict's text.
fn mutate_npy(rng: &mut TestRng, bytes: &mut Vec<u8>) -> String {
    match rng.below(4) {
        0 => {
            let width = if bytes.get(6) == Some(&1) { 2 } else { 4 };
            let value = extreme(rng, width, get_field(bytes, 8, width, true));
            set_field(bytes, 8, width, value, true);
            format!("header length field set to {value}")
        }
        1 => {
            let at = 6 + rng.below(2) as usize;
            let value = [0u8, 1, 2, 3, 4, 255][rng.below(6) as usize];
            bytes[at] = value;
            format!("version byte {at} set to {value}")
        }
        2 => edit_npy_dict(rng, bytes),
        _ => mutate_bytes(rng, bytes, 128),
    }
}

/// Pieces of the seed's npy header dict, and what each may become.
const EDITS: &[(&str, &[&str])] = &[
    (
        "<u2",
        &[
            ">u2", "<i2", "<f2", "|u1", "<u8", "<c8", "<U2", "O", "<u0", "<u", "", "<u22",
        ],
    ),
    (
        "(3, 5, 4)",
        &[
            "(3, 5)",
            "(0, 5, 4)",
            "(3, 5, 4, 1)",
            "()",
            "(3, -5, 4)",
            "(99999999999999999999, 5, 4)",
            "(3, 5, 4,)",
            "(4, 5, 4)",
            "(2, 5, 4)",
            "[3, 5, 4]",
            "(1, 3, 5, 4)",
            "(3, 5, 65536)",
        ],
    ),
    ("False", &["True", "0", "None", "'False'"]),
    ("'descr'", &["'desc'", "'shape'", "'descr' "]),
    ("'shape'", &["'fortran_order'", "'shap'"]),
    ("{", &["", "{{", "["]),
    (
        "}",
        &[
            "",
            "}}",
            ", 'extra': 1}",
            ", 'descr': '>u2'}",
            ", 'shape': (12, 5, 2)}",
        ],
    ),
];

/// Replaces a piece of the npy header dict's text, keeping its length
/// (padded or cut at the end) half the time, so the length field agrees.
fn edit_npy_dict(rng: &mut TestRng, bytes: &mut Vec<u8>) -> String {
    let Some(end) = npy_header_end(bytes) else {
        return mutate_bytes(rng, bytes, 128);
    };
    let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let (from, choices) = EDITS[rng.below(EDITS.len() as u64) as usize];
    let to = choices[rng.below(choices.len() as u64) as usize];
    let Some(at) = text.find(from) else {
        return mutate_bytes(rng, bytes, 128);
    };
    let mut edited = text.clone();
    edited.replace_range(at..at + from.len(), to);
    if rng.below(2) == 0 {
        // Same length: pad before the newline, or cut spaces.
        while edited.len() < text.len() {
            edited.insert(edited.len() - 1, ' ');
        }
        while edited.len() > text.len() && edited.ends_with(" \n") {
            edited.remove(edited.len() - 2);
        }
    }
    bytes.splice(..end, edited.into_bytes());
    format!("npy header: {from:?} -> {to:?}")
}

/// Where an npy header's text ends (at its newline, within 4 KiB).
fn npy_header_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .iter()
        .take(4096)
        .position(|&b| b == b'\n')
        .map(|at| at + 1)
}

/// NIfTI-1: the fields that say lengths, shapes, types and where data lie.
fn mutate_nifti(rng: &mut TestRng, bytes: &mut Vec<u8>) -> String {
    // (offset, width, name)
    const FIELDS: &[(usize, usize, &str)] = &[
        (0, 4, "sizeof_hdr"),
        (40, 2, "dim[0]"),
        (42, 2, "dim[1]"),
        (44, 2, "dim[2]"),
        (46, 2, "dim[3]"),
        (48, 2, "dim[4]"),
        (56, 2, "dim[7]"),
        (70, 2, "datatype"),
        (72, 2, "bitpix"),
        (252, 2, "qform_code"),
        (254, 2, "sform_code"),
        (344, 4, "magic"),
    ];
    match rng.below(3) {
        0 => {
            let (at, width, name) = FIELDS[rng.below(FIELDS.len() as u64) as usize];
            let value = extreme(rng, width, get_field(bytes, at, width, true));
            set_field(bytes, at, width, value, true);
            format!("{name} set to {value}")
        }
        1 => {
            let floats = [
                0.0f32,
                -1.0,
                352.0,
                353.0,
                351.0,
                1e20,
                f32::NAN,
                f32::INFINITY,
                352.5,
                1e9,
                4096.0,
            ];
            let value = floats[rng.below(floats.len() as u64) as usize];
            let at = [108usize, 112, 116, 76, 80][rng.below(5) as usize];
            bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
            format!("float at {at} set to {value}")
        }
        _ => mutate_bytes(rng, bytes, 352),
    }
}

/// Every place `value` is stored as a `width`-byte little-endian number.
fn occurrences(bytes: &[u8], value: u64, width: usize) -> Vec<usize> {
    let pattern = &value.to_le_bytes()[..width];
    bytes
        .windows(width)
        .enumerate()
        .filter(|(_, w)| *w == pattern)
        .map(|(at, _)| at)
        .collect()
}

/// HDF5 (and MINC2, which is HDF5): fields found by their values (the
/// dataset's sides, its data address and length) set to extremes, bytes
/// just after structure signatures, and byte-level mutations.
fn mutate_hdf5(rng: &mut TestRng, bytes: &mut Vec<u8>, data_offset: usize) -> String {
    let header = data_offset.max(512);
    match rng.below(4) {
        0 => {
            let wanted = [3u64, 5, 4, 120, data_offset as u64];
            let value = wanted[rng.below(wanted.len() as u64) as usize];
            let width = [8usize, 4][rng.below(2) as usize];
            let found = occurrences(&bytes[..header.min(bytes.len())], value, width);
            if found.is_empty() {
                return mutate_bytes(rng, bytes, header);
            }
            let at = found[rng.below(found.len() as u64) as usize];
            let to = extreme(rng, width, value);
            set_field(bytes, at, width, to, true);
            format!("{width}-byte field {value} at {at} set to {to}")
        }
        1 => {
            let signatures: [&[u8]; 6] = [b"OHDR", b"TREE", b"HEAP", b"SNOD", b"\x89HDF", b"GCOL"];
            let signature = signatures[rng.below(signatures.len() as u64) as usize];
            let found: Vec<usize> = bytes
                .windows(4)
                .enumerate()
                .filter(|(_, w)| *w == signature)
                .map(|(at, _)| at)
                .collect();
            if found.is_empty() {
                return mutate_bytes(rng, bytes, header);
            }
            let at = found[rng.below(found.len() as u64) as usize] + rng.below(48) as usize;
            if at >= bytes.len() {
                return mutate_bytes(rng, bytes, header);
            }
            let value = rng.below(256) as u8;
            bytes[at] = value;
            format!(
                "byte {at} after {:?} set to {value}",
                String::from_utf8_lossy(signature)
            )
        }
        _ => mutate_bytes(rng, bytes, header),
    }
}

/// A JSON value to put in place of another.
fn json_palette(rng: &mut TestRng) -> Value {
    let choices = [
        json!(0),
        json!(1),
        json!(-1),
        json!(2147483648u64),
        json!(9007199254740993u64),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1.5),
        json!(3.0),
        json!(1e308),
        json!("NaN"),
        json!("Infinity"),
        json!("0x7fc00000"),
        json!("0xffff"),
        json!("0x10000"),
        json!(""),
        json!("C"),
        json!("F"),
        json!("<u2"),
        json!(">u2"),
        json!("|u1"),
        json!("<f8"),
        json!("<U2"),
        json!("int16"),
        json!("uint8"),
        json!("float16"),
        json!("bool"),
        json!("complex64"),
        json!("."),
        json!("/"),
        json!("v2"),
        json!("default"),
        json!("regular"),
        json!("little"),
        json!("big"),
        json!(null),
        json!(true),
        json!([]),
        json!([0]),
        json!([4, 3]),
        json!([1, 1, 1]),
        json!([4, 3, 4, 1]),
        json!([0, 0, 0]),
        json!([12, 5, 0]),
        json!([4294967296u64, 5, 4]),
        json!({}),
        json!({"name": "bytes"}),
        json!({"name": "bytes", "configuration": {"endian": "big"}}),
        json!({"id": "zlib", "level": 1}),
    ];
    choices[rng.below(choices.len() as u64) as usize].clone()
}

/// The paths (keys and indices) of every value inside `value`.
fn json_paths(value: &Value, at: &mut Vec<String>, found: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                at.push(key.clone());
                found.push(at.clone());
                json_paths(inner, at, found);
                at.pop();
            }
        }
        Value::Array(list) => {
            for (i, inner) in list.iter().enumerate() {
                at.push(i.to_string());
                found.push(at.clone());
                json_paths(inner, at, found);
                at.pop();
            }
        }
        _ => {}
    }
}

fn json_at<'v>(value: &'v mut Value, path: &[String]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |inner, step| match inner {
        Value::Object(map) => map.get_mut(step),
        Value::Array(list) => step.parse::<usize>().ok().and_then(|i| list.get_mut(i)),
        _ => None,
    })
}

/// Zarr metadata: a field replaced, removed or added, an element added to
/// a list, or (a tenth of the time) the JSON text itself mutated.
fn mutate_zarr_json(rng: &mut TestRng, bytes: &mut Vec<u8>) -> String {
    let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
    let Some(mut doc) = parsed.filter(|_| rng.below(10) != 0) else {
        return mutate_bytes(rng, bytes, bytes.len());
    };
    let mut paths = Vec::new();
    json_paths(&doc, &mut Vec::new(), &mut paths);
    let path = paths[rng.below(paths.len() as u64) as usize].clone();
    let what = match rng.below(6) {
        0 => {
            let (parent, last) = path.split_at(path.len() - 1);
            match json_at(&mut doc, parent) {
                Some(Value::Object(map)) => {
                    map.remove(&last[0]);
                }
                Some(Value::Array(list)) => {
                    let i: usize = last[0].parse().unwrap_or(0);
                    if i < list.len() {
                        list.remove(i);
                    }
                }
                _ => {}
            }
            format!("removed {}", path.join("."))
        }
        1 => {
            if let Some(Value::Object(map)) = json_at(&mut doc, &[]) {
                map.insert("unexpected".into(), json_palette(rng));
            }
            "added a field".to_string()
        }
        2 => {
            let extra = json_palette(rng);
            match json_at(&mut doc, &path) {
                Some(Value::Array(list)) => list.push(extra.clone()),
                Some(other) => *other = extra.clone(),
                None => {}
            }
            format!("{} extended with {extra}", path.join("."))
        }
        _ => {
            let to = json_palette(rng);
            if let Some(inner) = json_at(&mut doc, &path) {
                *inner = to.clone();
            }
            format!("{} set to {to}", path.join("."))
        }
    };
    *bytes = serde_json::to_vec_pretty(&doc).expect("encode JSON");
    what
}

/// Mutates one file of the case's input; says what it did.
fn mutate(rng: &mut TestRng, format: Fuzzed, dir: &Path, data_offsets: &[usize]) -> String {
    let targets = format.targets(dir);
    let pick = rng.below(targets.len() as u64) as usize;
    let path = dir.join(&targets[pick]);
    let mut bytes = std::fs::read(&path).expect("read target");
    let what = match format {
        Fuzzed::Npy => mutate_npy(rng, &mut bytes),
        Fuzzed::Nifti => mutate_nifti(rng, &mut bytes),
        Fuzzed::NiftiGz => mutate_nifti_gz(rng, &mut bytes),
        Fuzzed::Hdf5 | Fuzzed::Minc2 => mutate_hdf5(rng, &mut bytes, data_offsets[pick]),
        Fuzzed::Zarr2 | Fuzzed::Zarr3 => {
            if rng.below(8) == 0 {
                // An absent chunk reads as the fill value.
                let chunk = zarr_chunk_files(dir);
                if let Some(victim) = chunk.get(rng.below(chunk.len() as u64) as usize) {
                    std::fs::remove_file(victim).expect("remove chunk");
                }
            }
            mutate_zarr_json(rng, &mut bytes)
        }
    };
    std::fs::write(&path, bytes).expect("write mutated file");
    format!("{}: {what}", targets[pick].display())
}

fn zarr_chunk_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).expect("list") {
            let path = entry.expect("entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                pending.push(path);
            } else if !name.starts_with('.') && name != "zarr.json" {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

// ------------------------------------------------- the reference readers

/// A dataset read by libhdf5, values converted by it to this machine's
/// byte order (little-endian here); half floats, which the `hdf5` crate
/// reads only with an extra dependency, as libhdf5 places their bytes.
fn hdf5_values(path: &Path, dataset: &str) -> Result<Values, String> {
    use hdf5::types::{FloatSize, IntSize, TypeDescriptor};
    let file = hdf5::File::open(path).map_err(|e| format!("libhdf5 open: {e}"))?;
    let data = file
        .dataset(dataset)
        .map_err(|e| format!("libhdf5 dataset: {e}"))?;
    let shape: Vec<u64> = data.shape().iter().map(|&n| n as u64).collect();
    let descriptor = data
        .dtype()
        .and_then(|t| t.to_descriptor())
        .map_err(|e| format!("libhdf5 type: {e}"))?;
    macro_rules! read {
        ($kind:expr, $t:ty) => {{
            let values = data
                .read_raw::<$t>()
                .map_err(|e| format!("libhdf5 read: {e}"))?;
            let little = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            Ok(Values {
                shape,
                kind: $kind,
                size: std::mem::size_of::<$t>(),
                little,
            })
        }};
    }
    match descriptor {
        TypeDescriptor::Unsigned(IntSize::U1) => read!('u', u8),
        TypeDescriptor::Unsigned(IntSize::U2) => read!('u', u16),
        TypeDescriptor::Unsigned(IntSize::U4) => read!('u', u32),
        TypeDescriptor::Unsigned(IntSize::U8) => read!('u', u64),
        TypeDescriptor::Integer(IntSize::U1) => read!('i', i8),
        TypeDescriptor::Integer(IntSize::U2) => read!('i', i16),
        TypeDescriptor::Integer(IntSize::U4) => read!('i', i32),
        TypeDescriptor::Integer(IntSize::U8) => read!('i', i64),
        TypeDescriptor::Float(FloatSize::U4) => read!('f', f32),
        TypeDescriptor::Float(FloatSize::U8) => read!('f', f64),
        TypeDescriptor::Float(_) => {
            drop(data);
            drop(file);
            let block = readers::try_read_block(path, "h5", dataset)?;
            Values::from_descr(block.shape, &block.descr, &block.data)
        }
        other => Err(format!("type {other:?}")),
    }
}

/// A Python literal, as much of it as npy headers use.
#[derive(Clone, Debug, PartialEq)]
enum Py {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Seq(Vec<Py>),
    Dict(Vec<(Py, Py)>),
}

/// Parses the Python literal at the start of `text`; returns it and the rest.
fn py_literal(text: &str) -> Result<(Py, &str), String> {
    let text = text.trim_start();
    let first = text.chars().next().ok_or("end of header")?;
    if first == '\'' || first == '"' {
        return py_string(first, &text[1..]);
    }
    if let Some((close, rest)) = match first {
        '(' => Some((')', &text[1..])),
        '[' => Some((']', &text[1..])),
        '{' => Some(('}', &text[1..])),
        _ => None,
    } {
        return py_sequence(close, rest);
    }
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '+'))
        .unwrap_or(text.len());
    let word = &text[..end];
    let value = match word {
        "True" => Py::Bool(true),
        "False" => Py::Bool(false),
        "None" => Py::None,
        _ => Py::Int(
            word.parse()
                .map_err(|_| format!("not a literal: {word:?}"))?,
        ),
    };
    Ok((value, &text[end..]))
}

/// A string literal's value up to its closing `quote`, escapes read as
/// Python reads them (an unknown one keeps its backslash).
fn py_string(quote: char, text: &str) -> Result<(Py, &str), String> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        if c == quote {
            return Ok((Py::Str(value), &text[at + 1..]));
        }
        if c != '\\' {
            value.push(c);
            continue;
        }
        match chars.next().ok_or("a backslash at the end")?.1 {
            e @ ('\\' | '\'' | '"') => value.push(e),
            'n' => value.push('\n'),
            't' => value.push('\t'),
            'r' => value.push('\r'),
            e if "abfvxNuU01234567\n".contains(e) => return Err(format!("escape \\{e}")),
            e => {
                value.push('\\');
                value.push(e);
            }
        }
    }
    Err("unclosed string".into())
}

/// The items of a tuple, list or dict up to `close`.
fn py_sequence(close: char, mut rest: &str) -> Result<(Py, &str), String> {
    let (mut items, mut pairs) = (Vec::new(), Vec::new());
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(close) {
            let value = if close == '}' {
                Py::Dict(pairs)
            } else {
                Py::Seq(items)
            };
            return Ok((value, after));
        }
        let (item, after) = py_literal(rest)?;
        rest = after.trim_start();
        if close == '}' {
            rest = rest.strip_prefix(':').ok_or("no ':' in a dict")?;
            let (value, after) = py_literal(rest)?;
            pairs.push((item, value));
            rest = after.trim_start();
        } else {
            items.push(item);
        }
        match rest.strip_prefix(',') {
            Some(after) => rest = after,
            None if rest.starts_with(close) => {}
            None => return Err("no ',' between items".into()),
        }
    }
}

/// An npy file as numpy's `np.load` reads it: the dict's last value of a
/// key wins (Python's dict literal), the data follow the header length
/// field wherever it ends, and bytes after the data are ignored. Headers
/// numpy would refuse only for their form (no closing newline, a list
/// for a shape, extra keys) are read the same way.
fn npy_values(path: &Path) -> Result<Values, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    if bytes.len() < 12 || !bytes.starts_with(b"\x93NUMPY") {
        return Err("no npy magic".into());
    }
    let (start, len) = match bytes[6] {
        1 => (10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize),
        2 | 3 => (
            12,
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
        ),
        v => return Err(format!("version {v}")),
    };
    let header = bytes.get(start..start + len).ok_or("short header")?;
    let text: String = header.iter().map(|&b| char::from(b)).collect();
    let (Py::Dict(pairs), rest) = py_literal(&text)? else {
        return Err("not a dict".into());
    };
    if !rest.trim().is_empty() {
        return Err("text after the dict".into());
    }
    let get = |key: &str| {
        pairs
            .iter()
            .rev()
            .find(|(k, _)| *k == Py::Str(key.into()))
            .map(|(_, v)| v.clone())
            .ok_or(format!("no {key}"))
    };
    let (Py::Str(descr), Py::Bool(false), Py::Seq(sides)) =
        (get("descr")?, get("fortran_order")?, get("shape")?)
    else {
        return Err("descr, fortran_order or shape".into());
    };
    let shape = sides
        .iter()
        .map(|side| match side {
            Py::Int(n) => u64::try_from(*n).map_err(|_| format!("side {n}")),
            other => Err(format!("side {other:?}")),
        })
        .collect::<Result<Vec<u64>, String>>()?;
    let descr = match descr.as_str() {
        "u1" | "i1" | "b" | "B" => format!("|{descr}"),
        other => other.to_string(),
    };
    Values::from_descr(shape, &descr, &bytes[start + len..])
}

/// One block file, by the format's own reader.
fn block_values(path: &Path, format: Fuzzed) -> Result<Values, String> {
    match format {
        Fuzzed::Hdf5 => hdf5_values(path, "/data"),
        Fuzzed::Minc2 => hdf5_values(path, "/minc-2.0/image/0/image"),
        Fuzzed::Npy => npy_values(path),
        Fuzzed::NiftiGz => {
            let inflated = gunzip(&std::fs::read(path).map_err(|e| e.to_string())?)?;
            let plain = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
            std::fs::write(plain.path(), inflated).map_err(|e| e.to_string())?;
            block_values(plain.path(), Fuzzed::Nifti)
        }
        _ => {
            let block = readers::try_read_block(path, format.extension(), "/data")?;
            Values::from_descr(block.shape, &block.descr, &block.data)
        }
    }
}

/// The array a directory of block files holds, by the formats' readers:
/// its blocks are a column along the first C-order axis (NIfTI names
/// give the x index first), so the array is their bytes one after another.
fn blocks_values(dir: &Path, format: Fuzzed) -> Result<Values, String> {
    let mut blocks = Vec::new();
    for name in format.targets(dir) {
        let text = name.to_string_lossy().into_owned();
        let stem = text.strip_suffix(&format!(".{}", format.extension()));
        let mut index: Vec<u64> = stem
            .ok_or("a file of another kind")?
            .split('_')
            .map(|part| part.parse().map_err(|_| format!("name {text}")))
            .collect::<Result<_, _>>()?;
        if matches!(format, Fuzzed::Nifti | Fuzzed::NiftiGz) {
            index.reverse();
        }
        blocks.push((index, block_values(&dir.join(&name), format)?));
    }
    blocks.sort_by(|a, b| a.0.cmp(&b.0));
    let mut whole: Option<Values> = None;
    for (rank, (index, block)) in blocks.into_iter().enumerate() {
        let column = index.len() == block.shape.len()
            && index[0] == rank as u64
            && index[1..].iter().all(|&i| i == 0);
        if !column {
            return Err(format!(
                "block {index:?} of shape {:?} out of place",
                block.shape
            ));
        }
        whole = Some(match whole {
            None => block,
            Some(mut whole) => {
                let same = whole.shape[1..] == block.shape[1..]
                    && (whole.kind, whole.size) == (block.kind, block.size);
                if !same {
                    return Err(format!(
                        "blocks {:?} and {:?} differ",
                        whole.shape, block.shape
                    ));
                }
                whole.shape[0] += block.shape[0];
                whole.little.extend(block.little);
                whole
            }
        });
    }
    whole.ok_or_else(|| "no blocks".to_string())
}

/// What Zarr metadata says, as the specifications (v2, v3) define it.
struct ZarrMeta {
    shape: Vec<u64>,
    chunks: Vec<u64>,
    /// numpy type string, byte order included.
    descr: String,
    /// One element of the fill value, in the stored byte order.
    fill: Vec<u8>,
    /// A chunk's path: this, then its grid index joined by `separator`.
    prefix: &'static str,
    separator: String,
}

impl ZarrMeta {
    fn key(&self, index: &[u64]) -> String {
        let parts: Vec<String> = index.iter().map(u64::to_string).collect();
        format!("{}{}", self.prefix, parts.join(&self.separator))
    }
}

fn whole_numbers(value: &Value) -> Result<Vec<u64>, String> {
    value
        .as_array()
        .ok_or(format!("{value} is not a list"))?
        .iter()
        .map(|n| n.as_u64().ok_or(format!("{n} is not a whole number")))
        .collect()
}

/// One element of a fill value: a number, NaN/Infinity for floats, or the
/// value's bits in hex; `null` (v2) is zero, as zarr-python reads it.
fn zarr_fill(value: &Value, descr: &str) -> Result<Vec<u8>, String> {
    let size: usize = descr[2..].parse().map_err(|_| "type")?;
    let kind = descr.as_bytes()[1];
    let little: Vec<u8> = match value {
        Value::Null => vec![0; size],
        Value::String(hex) if hex.starts_with("0x") => {
            let bits = u64::from_str_radix(&hex[2..], 16).map_err(|_| "hex")?;
            if size < 8 && bits >> (8 * size) != 0 {
                return Err("fill bits too wide".into());
            }
            bits.to_le_bytes()[..size].to_vec()
        }
        _ if kind == b'f' => {
            let float = match value {
                Value::String(s) if s == "NaN" => f64::NAN,
                Value::String(s) if s == "Infinity" => f64::INFINITY,
                Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
                _ => value.as_f64().ok_or("fill is no number")?,
            };
            match size {
                4 => (float as f32).to_le_bytes().to_vec(),
                8 => float.to_le_bytes().to_vec(),
                _ => half_bits(float).to_le_bytes().to_vec(),
            }
        }
        Value::Number(n) => {
            let whole = n
                .as_i64()
                .map(i128::from)
                .or(n.as_u64().map(i128::from))
                .or(n
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 1e18)
                    .map(|f| f as i128))
                .ok_or("fill is not whole")?;
            let bits = 8 * size as u32;
            let (low, high) = if kind == b'i' {
                (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
            } else {
                (0, (1i128 << bits) - 1)
            };
            if whole < low || whole > high {
                return Err("fill out of range".into());
            }
            whole.to_le_bytes()[..size].to_vec()
        }
        _ => return Err(format!("fill {value}")),
    };
    Ok(if descr.starts_with('>') {
        little.into_iter().rev().collect()
    } else {
        little
    })
}

/// The half float nearest `value` (ties to an even last bit), found by
/// looking at every finite one; past the largest, infinity.
fn half_bits(value: f64) -> u16 {
    let decode = |bits: u16| {
        let exponent = i32::from((bits >> 10) & 0x1f);
        let fraction = f64::from(bits & 0x3ff);
        let magnitude = if exponent == 0 {
            fraction * 2f64.powi(-24)
        } else {
            (1.0 + fraction / 1024.0) * 2f64.powi(exponent - 15)
        };
        if bits & 0x8000 != 0 {
            -magnitude
        } else {
            magnitude
        }
    };
    let sign = if value.is_sign_negative() { 0x8000 } else { 0 };
    if value.is_nan() {
        return 0x7e00;
    }
    if value.abs() >= 65520.0 {
        return sign | 0x7c00;
    }
    (0..0x7c00u16)
        .map(|magnitude| sign | magnitude)
        .min_by(|&a, &b| {
            let (da, db) = ((decode(a) - value).abs(), (decode(b) - value).abs());
            da.total_cmp(&db).then((a & 1).cmp(&(b & 1)))
        })
        .unwrap_or(0)
}

fn zarr2_meta(dir: &Path) -> Result<ZarrMeta, String> {
    let text = std::fs::read(dir.join(".zarray")).map_err(|e| e.to_string())?;
    let meta: Value = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    let get = |key: &str| meta.get(key).ok_or(format!("no {key}"));
    if get("zarr_format")? != 2 || get("order")? != "C" {
        return Err("not a C-order v2 array".into());
    }
    let raw = |key: &str| meta.get(key).is_none_or(|v| v.is_null() || *v == json!([]));
    if !raw("compressor") || !raw("filters") {
        return Err("not raw bytes".into());
    }
    let descr = get("dtype")?.as_str().ok_or("dtype")?.to_string();
    let separator = match meta.get("dimension_separator") {
        None | Some(Value::Null) => ".".to_string(),
        Some(Value::String(s)) if s == "." || s == "/" => s.clone(),
        Some(other) => return Err(format!("separator {other}")),
    };
    let fill = zarr_fill(meta.get("fill_value").unwrap_or(&Value::Null), &descr)?;
    Ok(ZarrMeta {
        shape: whole_numbers(get("shape")?)?,
        chunks: whole_numbers(get("chunks")?)?,
        descr,
        fill,
        prefix: "",
        separator,
    })
}

fn zarr3_meta(dir: &Path) -> Result<ZarrMeta, String> {
    let text = std::fs::read(dir.join("zarr.json")).map_err(|e| e.to_string())?;
    let meta: Value = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    let get = |key: &str| meta.get(key).ok_or(format!("no {key}"));
    if get("zarr_format")? != 3 || get("node_type")? != "array" {
        return Err("not a v3 array".into());
    }
    if meta
        .get("storage_transformers")
        .is_some_and(|t| *t != json!([]))
    {
        return Err("storage transformers".into());
    }
    let grid = get("chunk_grid")?;
    if grid["name"] != "regular" {
        return Err("irregular grid".into());
    }
    let codecs = get("codecs")?.as_array().ok_or("codecs")?;
    let [codec] = codecs.as_slice() else {
        return Err("codecs".into());
    };
    let order = match (&codec["name"], codec["configuration"]["endian"].as_str()) {
        (name, Some("little") | None) if name == "bytes" => '<',
        (name, Some("big")) if name == "bytes" => '>',
        _ => return Err("codec".into()),
    };
    let (kind, bits) = match get("data_type")?.as_str().ok_or("data_type")? {
        name if name.starts_with("uint") => ('u', &name[4..]),
        name if name.starts_with("int") => ('i', &name[3..]),
        name if name.starts_with("float") => ('f', &name[5..]),
        other => return Err(format!("data_type {other}")),
    };
    let bits: usize = bits.parse().map_err(|_| "data_type bits")?;
    let descr = format!("{order}{kind}{}", bits / 8);
    let fill = zarr_fill(get("fill_value")?, &descr)?;
    let encoding = meta
        .get("chunk_key_encoding")
        .cloned()
        .unwrap_or(json!({"name": "default"}));
    let (prefix, default_separator) = match encoding["name"].as_str() {
        Some("default") => ("c/", "/"),
        Some("v2") => ("", "."),
        _ => return Err("chunk key encoding".into()),
    };
    let separator = match encoding["configuration"]["separator"].as_str() {
        None => default_separator.to_string(),
        Some(s) if s == "." || s == "/" => s.to_string(),
        Some(other) => return Err(format!("separator {other}")),
    };
    Ok(ZarrMeta {
        shape: whole_numbers(get("shape")?)?,
        chunks: whole_numbers(&grid["configuration"]["chunk_shape"])?,
        descr,
        fill,
        prefix,
        separator,
    })
}

/// The array a Zarr directory holds: every chunk placed in a C-order
/// buffer (an edge chunk's padding dropped), absent ones the fill value.
fn zarr_values(dir: &Path, format: Fuzzed) -> Result<Values, String> {
    let meta = if format == Fuzzed::Zarr2 {
        zarr2_meta(dir)?
    } else {
        zarr3_meta(dir)?
    };
    let size: usize = meta.descr[2..].parse().map_err(|_| "type")?;
    let (shape, chunks) = (&meta.shape, &meta.chunks);
    if shape.len() != chunks.len() || chunks.contains(&0) || shape.is_empty() {
        return Err("shape and chunks".into());
    }
    let volume = |sides: &[u64]| sides.iter().try_fold(1u64, |n, &side| n.checked_mul(side));
    let count = volume(shape).filter(|&n| n <= 1 << 22);
    let count = count.ok_or("larger than this reader reads")?;
    // A chunk file must hold a whole chunk: one past this size cannot.
    let chunk_len = volume(chunks).and_then(|n| n.checked_mul(size as u64));
    let mut data = meta.fill.repeat(count as usize);
    let grid: Vec<u64> = shape
        .iter()
        .zip(chunks)
        .map(|(n, c)| n.div_ceil(*c))
        .collect();
    for index in grid_indices(&grid) {
        let path = dir.join(meta.key(&index));
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if chunk_len != Some(bytes.len() as u64) {
            return Err(format!("{}: {} bytes", path.display(), bytes.len()));
        }
        let origin: Vec<u64> = index.iter().zip(chunks).map(|(i, c)| i * c).collect();
        place(&mut data, shape, &bytes, chunks, &origin, size);
    }
    Values::from_descr(shape.clone(), &meta.descr, &data)
}

/// Every index of a grid, in C order.
fn grid_indices(grid: &[u64]) -> Vec<Vec<u64>> {
    let total: u64 = grid.iter().product();
    (0..total)
        .map(|mut linear| {
            let mut index = vec![0; grid.len()];
            for d in (0..grid.len()).rev() {
                index[d] = linear % grid[d];
                linear /= grid[d];
            }
            index
        })
        .collect()
}

/// Copies the C-order box `block` (of shape `block_shape`) into `whole`
/// (of shape `shape`) at `origin`, dropping what falls past its edge
/// (a Zarr edge chunk's padding).
fn place(
    whole: &mut [u8],
    shape: &[u64],
    block: &[u8],
    block_shape: &[u64],
    origin: &[u64],
    size: usize,
) {
    let inside: Vec<u64> = block_shape
        .iter()
        .zip(origin.iter().zip(shape))
        .map(|(&side, (&o, &n))| side.min(n.saturating_sub(o)))
        .collect();
    for index in grid_indices(&inside) {
        let at: Vec<u64> = index.iter().zip(origin).map(|(i, o)| i + o).collect();
        let linear = |position: &[u64], dims: &[u64]| {
            position.iter().zip(dims).fold(0u64, |n, (p, d)| n * d + p) as usize * size
        };
        let to = linear(&at, shape);
        let from = linear(&index, block_shape);
        whole[to..to + size].copy_from_slice(&block[from..from + size]);
    }
}

/// The input as its own reader sees it.
fn reference_values(dir: &Path, format: Fuzzed) -> Result<Values, String> {
    if format.is_zarr() {
        zarr_values(dir, format)
    } else {
        blocks_values(dir, format)
    }
}

/// The output npy blocks (named by C-order grid index, of `OUT_BLOCK` a
/// side) put back together, by the npy reader.
/// Every block file in `out`, by grid index; a file not named as a
/// finished block (a temporary left behind) is an error.
fn output_blocks(out: &Path) -> Result<Vec<(Vec<u64>, Values)>, String> {
    let mut blocks = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        let stem = name
            .strip_suffix(".npy")
            .ok_or(format!("output file {name}"))?;
        let index: Vec<u64> = stem
            .split('_')
            .map(|p| p.parse().map_err(|_| format!("output name {name}")))
            .collect::<Result<_, _>>()?;
        let block = readers::try_read_block(&path, "npy", "/data")?;
        blocks.push((
            index,
            Values::from_descr(block.shape, &block.descr, &block.data)?,
        ));
    }
    Ok(blocks)
}

fn output_values(out: &Path) -> Result<Values, String> {
    let blocks = output_blocks(out)?;
    let first = &blocks.first().ok_or("no output blocks")?.1;
    let (kind, size) = (first.kind, first.size);
    let mut shape = vec![0u64; first.shape.len()];
    for (index, block) in &blocks {
        for d in 0..shape.len() {
            shape[d] = shape[d].max(index[d] * OUT_BLOCK + block.shape[d]);
        }
    }
    let mut little = vec![0u8; shape.iter().product::<u64>() as usize * size];
    for (index, block) in &blocks {
        let origin: Vec<u64> = index.iter().map(|i| i * OUT_BLOCK).collect();
        place(
            &mut little,
            &shape,
            &block.little,
            &block.shape,
            &origin,
            size,
        );
    }
    Ok(Values {
        shape,
        kind,
        size,
        little,
    })
}

// ------------------------------------------------------------ the cases

/// What became of one mutated input.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    /// The scan refused it.
    RefusedAtScan,
    /// Planning or the run refused it (a header checked before use).
    RefusedAtRun,
    /// Accepted, rechunked, and equal to what its reader says.
    Accepted,
    /// Accepted, but an array too large to rechunk here (a sparse Zarr
    /// array of fill values can be any size).
    AcceptedTooLarge,
}

/// Accepted arrays past this are not rechunked.
const LARGEST_RECHUNKED: u64 = 64 << 20;

/// Scans `input` as `rechunk` does, rechunks it into `out` when accepted,
/// and compares; `Err` is a wrong output.
fn run_case(input: &Path, out: &Path, checks: HeaderChecks) -> Result<Outcome, String> {
    let Ok(scanned) = InputArray::scan_with(input, None, checks) else {
        return Ok(Outcome::RefusedAtScan);
    };
    if scanned.nbytes() > LARGEST_RECHUNKED {
        return Ok(Outcome::AcceptedTooLarge);
    }
    let ndim = scanned.ndim();
    let problem = rechunkfs::output::problem_for(&scanned, vec![OUT_BLOCK; ndim], BlockFormat::Npy);
    let Ok(plan) = problem.and_then(|p| plan::plan(&p, Strategy::Keep, None)) else {
        return Ok(Outcome::RefusedAtRun);
    };
    directory::prepare_output_dir(out, false).map_err(|e| e.to_string())?;
    let spec = OutputSpec {
        format: BlockFormat::Npy,
        dataset: "/data".into(),
        dtype: scanned.dtype,
        space: Space::identity(ndim),
        axis_order: AxisOrder::C,
        encoding: Default::default(),
        commit_batch_bytes: rechunkfs::output::directory::COMMIT_BATCH_BYTES,
    };
    if directory::rechunk(&scanned, &plan, out, spec, None, |_| {}).is_err() {
        kept_blocks_are_exact(input, out, fuzzed_of(&scanned))?;
        return Ok(Outcome::RefusedAtRun);
    }
    let got = output_values(out).map_err(|e| format!("the output: {e}"))?;
    let format = fuzzed_of(&scanned);
    let expected = reference_values(input, format)
        .map_err(|e| format!("accepted, but its own reader refuses it: {e}"))?;
    if got != expected {
        return Err(format!(
            "output {:?} {}{} differs from the input as read, {:?} {}{}{}",
            got.shape,
            got.kind,
            got.size,
            expected.shape,
            expected.kind,
            expected.size,
            if got.shape == expected.shape {
                " (values differ)"
            } else {
                ""
            }
        ));
    }
    Ok(Outcome::Accepted)
}

/// After a refused run: what it kept in `out` are finished blocks, each
/// equal to its part of the input as its own reader reads it (where that
/// reader reads the damaged input at all).
fn kept_blocks_are_exact(input: &Path, out: &Path, format: Fuzzed) -> Result<(), String> {
    let blocks = output_blocks(out).map_err(|e| format!("a refused run left {e}"))?;
    let Ok(expected) = reference_values(input, format) else {
        return Ok(());
    };
    for (index, block) in blocks {
        let origin: Vec<u64> = index.iter().map(|i| i * OUT_BLOCK).collect();
        let inside = (0..origin.len())
            .all(|d| origin[d] + block.shape[d] <= expected.shape.get(d).copied().unwrap_or(0));
        // Written over the expected array, an exact block changes nothing.
        let mut probe = expected.little.clone();
        if inside && block.size == expected.size {
            place(
                &mut probe,
                &expected.shape,
                &block.little,
                &block.shape,
                &origin,
                block.size,
            );
        }
        if !inside || block.size != expected.size || probe != expected.little {
            return Err(format!(
                "a refused run kept block {index:?}, which is wrong"
            ));
        }
    }
    Ok(())
}

fn fuzzed_of(input: &InputArray) -> Fuzzed {
    match input.format {
        BlockFormat::Npy => Fuzzed::Npy,
        BlockFormat::Nifti if input.files.is_encoded() => Fuzzed::NiftiGz,
        BlockFormat::Nifti => Fuzzed::Nifti,
        BlockFormat::Hdf5 => Fuzzed::Hdf5,
        BlockFormat::Minc2 => Fuzzed::Minc2,
        BlockFormat::Zarr => Fuzzed::Zarr2,
        BlockFormat::Zarr3 => Fuzzed::Zarr3,
        other @ (BlockFormat::Raw | BlockFormat::Nifti2 | BlockFormat::Precomputed) => {
            panic!("{other:?} is never an input format")
        }
        BlockFormat::Tiff => panic!("TIFF inputs are fuzzed in tests/formats_tiff.rs"),
    }
}

/// Runs one case in a thread: a panic or a run past [`DEADLINE`] fails.
fn run_guarded(input: PathBuf, out: PathBuf, checks: HeaderChecks) -> Result<Outcome, String> {
    let (done, result) = mpsc::channel();
    std::thread::Builder::new()
        .name("fuzz case".into())
        .spawn(move || {
            let outcome =
                std::panic::catch_unwind(AssertUnwindSafe(|| run_case(&input, &out, checks)));
            let _ = done.send(outcome);
        })
        .expect("start a case thread");
    match result.recv_timeout(DEADLINE) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => Err(format!("panicked: {}", panic_text(&*panic))),
        Err(_) => Err(format!("no answer within {DEADLINE:?}: hung")),
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// Counts of each outcome.
#[derive(Debug, Default)]
struct Tally {
    refused_at_scan: u64,
    refused_at_run: u64,
    accepted: u64,
    accepted_too_large: u64,
}

/// The data offsets of the seed's block files (HDF5 mutations aim at the
/// metadata before them).
fn data_offsets(seed: &Path, format: Fuzzed) -> Vec<usize> {
    format
        .targets(seed)
        .iter()
        .map(|name| match format {
            Fuzzed::Hdf5 | Fuzzed::Minc2 => {
                let path = seed.join(name);
                let dataset = if format == Fuzzed::Minc2 {
                    "/minc-2.0/image/0/image"
                } else {
                    "/data"
                };
                let file = hdf5::File::open(&path).expect("seed opens");
                let offset = file.dataset(dataset).ok().and_then(|d| d.offset());
                offset.map_or(2048, |o| o as usize)
            }
            _ => 0,
        })
        .collect()
}

/// Fuzzes `format`: every case mutated from the same valid seed.
fn fuzz(format: Fuzzed) {
    let root = tempfile::tempdir().unwrap();
    let seed = seed_input(root.path(), format);
    // The seed itself must be accepted and read back exactly.
    let seed_out = root.path().join("seed-out");
    let checked = run_guarded(seed.clone(), seed_out, HeaderChecks::AtScan);
    assert_eq!(checked, Ok(Outcome::Accepted), "{format:?} seed");
    let offsets = data_offsets(&seed, format);
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for case in 0..cases() {
        let mut rng = TestRng(base_seed().wrapping_mul(1_000_003) ^ (case << 8) ^ format as u64);
        let input = root.path().join(format!("case{case}"));
        copy_tree(&seed, &input);
        let what = mutate(&mut rng, format, &input, &offsets);
        let checks = if case % 2 == 0 {
            HeaderChecks::BeforeUse
        } else {
            HeaderChecks::AtScan
        };
        let out = root.path().join(format!("out{case}"));
        match run_guarded(input.clone(), out.clone(), checks) {
            Ok(Outcome::RefusedAtScan) => tally.refused_at_scan += 1,
            Ok(Outcome::RefusedAtRun) => tally.refused_at_run += 1,
            Ok(Outcome::Accepted) => tally.accepted += 1,
            Ok(Outcome::AcceptedTooLarge) => tally.accepted_too_large += 1,
            Err(problem) => {
                failures.push(format!("case {case} ({what}, {checks:?}): {problem}"));
                // Kept for a look; a hung case may still be using them.
                continue;
            }
        }
        let _ = std::fs::remove_dir_all(&input);
        let _ = std::fs::remove_dir_all(&out);
    }
    eprintln!(
        "fuzz {format:?}: {} cases in {:.1} s: {tally:?}, {} failed",
        cases(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    if !failures.is_empty() {
        let kept = root.keep();
        panic!(
            "{format:?}: {} of {} cases failed (inputs kept under {}):\n{}",
            failures.len(),
            cases(),
            kept.display(),
            failures.join("\n")
        );
    }
}

#[test]
fn fuzzed_npy_headers() {
    fuzz(Fuzzed::Npy);
}

#[test]
fn fuzzed_nifti_headers() {
    fuzz(Fuzzed::Nifti);
}

#[test]
fn fuzzed_gzipped_nifti_headers() {
    fuzz(Fuzzed::NiftiGz);
}

#[test]
fn fuzzed_hdf5_headers() {
    fuzz(Fuzzed::Hdf5);
}

#[test]
fn fuzzed_minc2_headers() {
    require!(Readers);
    fuzz(Fuzzed::Minc2);
}

#[test]
fn fuzzed_zarr2_metadata() {
    require!(Readers);
    fuzz(Fuzzed::Zarr2);
}

#[test]
fn fuzzed_zarr3_metadata() {
    require!(Readers);
    fuzz(Fuzzed::Zarr3);
}

// ------------------------------------------------ encoded Zarr chunks

/// Runs `case` in a thread: a panic or a run past [`DEADLINE`] fails.
fn guarded<T: Send + 'static>(
    case: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (done, result) = mpsc::channel();
    std::thread::Builder::new()
        .name("fuzz case".into())
        .spawn(move || {
            let _ = done.send(std::panic::catch_unwind(AssertUnwindSafe(case)));
        })
        .expect("start a case thread");
    match result.recv_timeout(DEADLINE) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => Err(format!("panicked: {}", panic_text(&*panic))),
        Err(_) => Err(format!("no answer within {DEADLINE:?}: hung")),
    }
}

/// Scans and rechunks `input` (encoded chunks) into npy blocks in `out`:
/// its values when accepted, `None` when refused.
fn rechunk_encoded(input: &Path, out: &Path) -> Result<Option<Values>, String> {
    let Ok(scanned) = InputArray::scan(input, None) else {
        return Ok(None);
    };
    let ndim = scanned.ndim();
    let problem = rechunkfs::output::problem_for(&scanned, vec![OUT_BLOCK; ndim], BlockFormat::Npy);
    let Ok(plan) = problem.and_then(|p| plan::plan(&p, Strategy::Keep, None)) else {
        return Ok(None);
    };
    directory::prepare_output_dir(out, false).map_err(|e| e.to_string())?;
    let spec = OutputSpec {
        format: BlockFormat::Npy,
        dataset: "/data".into(),
        dtype: scanned.dtype,
        space: Space::identity(ndim),
        axis_order: AxisOrder::C,
        encoding: Default::default(),
        commit_batch_bytes: rechunkfs::output::directory::COMMIT_BATCH_BYTES,
    };
    if directory::rechunk(&scanned, &plan, out, spec, None, |_| {}).is_err() {
        return Ok(None);
    }
    output_values(out).map(Some)
}

/// A shard file's bytes mutated: bit flips, a byte set, a cut, bytes
/// added, or one of its index's u64s (the last `index_len` bytes before
/// any checksum) set to an extreme or to another entry's value.
fn mutate_shard(rng: &mut TestRng, bytes: &mut Vec<u8>, index_at: usize, entries: usize) -> String {
    match rng.below(4) {
        0 => mutate_bytes(rng, bytes, 0),
        _ => {
            let field = rng.below(entries as u64 * 2) as usize;
            let at = index_at + 8 * field;
            let len = bytes.len() as u64;
            let was = get_field(bytes, at, 8, true);
            let value = match rng.below(6) {
                0 => extreme(rng, 8, was),
                1 => u64::MAX - rng.below(1 << 16),
                2 => len - rng.below(8),
                3 => len + rng.below(8),
                4 => get_field(
                    bytes,
                    index_at + 8 * rng.below(entries as u64 * 2) as usize,
                    8,
                    true,
                ),
                _ => was ^ (1 << rng.below(64)),
            };
            set_field(bytes, at, 8, value, true);
            format!("index field {field}: {was} -> {value}")
        }
    }
}

/// zstd-compressed v3 shards written by zarr-python, their bytes and their
/// index entries mutated; with the index's crc32c and without it (the
/// spec allows either; without it a mutated entry reaches the decoder).
/// No case may panic or hang; with the crc32c (and zstd's checksums) an
/// accepted case must read as the seed does.
#[test]
fn fuzzed_zarr3_shards() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // 12×8 u2 in shards of 4×4 holding 2×2 chunks: 4 entries per index.
    let entries = 4usize;
    let seeds: Vec<(PathBuf, bool)> = [true, false]
        .into_iter()
        .map(|crc| {
            let seed = root.path().join(format!("seed-crc{crc}"));
            common::zarr_python_writes(
                &seed,
                &[12, 8],
                &[2, 2],
                "<u2",
                "3",
                &["--codec", "zstd", "--shards", "4,4"],
            );
            if !crc {
                let meta_path = seed.join("zarr.json");
                let mut meta: Value =
                    serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
                let codecs = &mut meta["codecs"][0]["configuration"]["index_codecs"];
                let kept: Vec<Value> = codecs
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|c| c["name"] != "crc32c")
                    .cloned()
                    .collect();
                *codecs = Value::Array(kept);
                std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
                for shard in zarr_chunk_files(&seed) {
                    let bytes = std::fs::read(&shard).unwrap();
                    std::fs::write(&shard, &bytes[..bytes.len() - 4]).unwrap();
                }
            }
            (seed, crc)
        })
        .collect();
    let mut expected = None;
    for (seed, crc) in &seeds {
        let (seed, out) = (seed.clone(), root.path().join(format!("seed-out-{crc}")));
        let values = guarded(move || rechunk_encoded(&seed, &out)).expect("the seed");
        assert!(values.is_some(), "the seed (crc32c {crc}) is accepted");
        assert!(
            expected.is_none() || expected == values,
            "both seeds read alike"
        );
        expected = values;
    }
    let started = Instant::now();
    let (mut tally, mut failures) = (Tally::default(), Vec::new());
    for case in 0..cases() {
        let mut rng = TestRng(base_seed().wrapping_mul(1_000_003) ^ (case << 8) ^ 0x5eed);
        let (seed, crc) = &seeds[case as usize % 2];
        let input = root.path().join(format!("case{case}"));
        copy_tree(seed, &input);
        let shards = zarr_chunk_files(&input);
        let shard = &shards[rng.below(shards.len() as u64) as usize];
        let mut bytes = std::fs::read(shard).unwrap();
        let index_at = bytes.len() - entries * 16 - if *crc { 4 } else { 0 };
        let what = mutate_shard(&mut rng, &mut bytes, index_at, entries);
        std::fs::write(shard, &bytes).unwrap();
        let out = root.path().join(format!("out{case}"));
        let (run_input, run_out) = (input.clone(), out.clone());
        match guarded(move || rechunk_encoded(&run_input, &run_out)) {
            Ok(None) => tally.refused_at_run += 1,
            Ok(Some(got)) if !crc || Some(&got) == expected.as_ref() => tally.accepted += 1,
            Ok(Some(_)) => failures.push(format!(
                "case {case} ({what}, crc32c): accepted with values other than the seed's"
            )),
            Err(problem) => failures.push(format!("case {case} ({what}, crc32c {crc}): {problem}")),
        }
        let _ = std::fs::remove_dir_all(&input);
        let _ = std::fs::remove_dir_all(&out);
    }
    eprintln!(
        "fuzz zarr3 shards: {} cases in {:.1} s: {tally:?}, {} failed",
        cases(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
