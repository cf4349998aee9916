//! A broad property test of `rechunk` through the library: random arrays of
//! every numeric dtype (each multi-byte one in both byte orders), 1 to 8
//! dimensions, shapes that do and do not divide, input and output blocks of
//! any shape (past the array on an axis meaning the whole axis), memory
//! limits from none down to the least any plan can hold, both strategies,
//! every input format (npy, HDF5 contiguous, HDF5 chunked, NIfTI-1 plain
//! and gzipped, Zarr v2 and v3) and every output format (h5, npy, nii, raw, zarr, zarr3).
//!
//! The oracle is independent of the crate: inputs are written and outputs
//! read by naive writers and readers in `tests/property/files.rs` (npy and
//! NIfTI-1 headers and Zarr metadata by hand from the formats' specs, gzip
//! through flate2's encoder, HDF5
//! through libhdf5 with the file's own type), and the expected content of
//! every block is cut from the whole array by the plain index arithmetic in
//! `tests/property/naive.rs`. Element `n` (C-order linear index in the whole
//! array) holds the low bytes of `splitmix64(n)`, stored in the dtype's byte
//! order. Beside the bytes, every run's counted seeks and peak held bytes
//! must equal the plan's predictions, the peak must stay within the memory
//! limit, and every byte must be read and written exactly once.
//!
//! 300 cases by default; `RECHUNKFS_PROPERTY_CASES=10000` (or proptest's own
//! `PROPTEST_CASES`) runs more.

#[path = "property/files.rs"]
mod files;
#[path = "property/naive.rs"]
mod naive;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestError, TestRunner};
use rechunkfs::format::BlockFormat;
use rechunkfs::input::{HeaderChecks, InputArray};
use rechunkfs::output::directory::{self, OutputSpec};
use rechunkfs::plan::{self, Problem, Strategy as PlanStrategy};
use rechunkfs::Error;

use naive::{Block, Elem};

/// Cases run when neither variable below says otherwise.
const DEFAULT_CASES: u32 = 300;

/// Elements in the whole array at most: a case then takes milliseconds.
const MAX_VOLUME: u64 = 3_000;

/// Block files on either side at most: creating thousands of HDF5 files
/// would make a case take seconds without covering anything new.
const MAX_FILES: u64 = 400;

/// How the input array is stored.
#[derive(Clone, PartialEq)]
enum Input {
    Npy,
    H5,
    /// Each file chunked in `chunk` (clipped to the file, and never equal
    /// to its shape when the file has more than one element), optionally
    /// deflated.
    H5Chunked {
        chunk: Vec<u64>,
        deflate: bool,
    },
    Nifti,
    /// `.nii.gz`: NIfTI-1 gzipped in two members, read whole and inflated.
    NiftiGz,
    /// Chunk keys joined by `separator`; chunks past the array are padded
    /// with bytes no reader may take for data; `compressed` chunks are
    /// encoded (v2 Blosc, v3 zstd and crc32c) and read whole.
    Zarr {
        v3: bool,
        separator: char,
        compressed: bool,
    },
}

impl fmt::Debug for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Input::Npy => write!(f, "npy"),
            Input::H5 => write!(f, "h5 contiguous"),
            Input::H5Chunked { chunk, deflate } => {
                write!(
                    f,
                    "h5 chunked {chunk:?}{}",
                    if *deflate { " deflate" } else { "" }
                )
            }
            Input::Nifti => write!(f, "nii"),
            Input::NiftiGz => write!(f, "nii.gz"),
            Input::Zarr {
                v3,
                separator,
                compressed,
            } => {
                let v = if *v3 { "3" } else { "2" };
                let how = if *compressed { " compressed" } else { "" };
                write!(f, "zarr{v} '{separator}'{how}")
            }
        }
    }
}

impl Input {
    fn name(&self) -> &'static str {
        match self {
            Input::Npy => "npy",
            Input::H5 => "h5",
            Input::H5Chunked { .. } => "h5 chunked",
            Input::Nifti => "nii",
            Input::NiftiGz => "nii.gz",
            Input::Zarr {
                v3: false,
                compressed: false,
                ..
            } => "zarr",
            Input::Zarr {
                v3: true,
                compressed: false,
                ..
            } => "zarr3",
            Input::Zarr { v3: false, .. } => "zarr compressed",
            Input::Zarr { v3: true, .. } => "zarr3 compressed",
        }
    }

    /// The user-facing axis order of a NIfTI input is (x, y, z): block
    /// names, in and out, are the C-order index reversed.
    fn reverses_names(&self) -> bool {
        self.is_nifti()
    }

    fn is_nifti(&self) -> bool {
        matches!(self, Input::Nifti | Input::NiftiGz)
    }
}

/// The memory limit given to the planner.
#[derive(Clone, Copy, Debug)]
enum Mem {
    Unlimited,
    /// This fraction of what keep(r̂) holds at its peak.
    Fraction(f64),
    /// The least any plan can hold: one element being read while one is
    /// being written.
    Least,
    /// What the strategy's plan without a limit holds at its peak, plus
    /// this many bytes: the edge where a limit starts to bind.
    OwnPeak(i64),
}

#[derive(Clone)]
struct Case {
    elem: Elem,
    /// C order, as every shape here.
    array: Vec<u64>,
    input_block: Vec<u64>,
    output_block: Vec<u64>,
    input: Input,
    /// When the input is one block file, scan that file rather than its
    /// directory.
    single_file: bool,
    output: BlockFormat,
    mem: Mem,
    baseline: bool,
    /// Threads decoding input blocks (and encoding output blocks) at once.
    workers: usize,
}

impl fmt::Debug for Case {
    /// One line, as a shrunk case is read.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} array {:?} in blocks {:?} as {:?}{} -> blocks {:?} as {} {}, mem {:?}, {} threads",
            self.elem,
            self.array,
            self.input_block,
            self.input,
            if self.single_file {
                " (scan the file)"
            } else {
                ""
            },
            self.output_block,
            self.output.extension(),
            if self.baseline { "baseline" } else { "keep" },
            self.mem,
            self.workers,
        )
    }
}

/// Whether NIfTI-1 can hold an array of `elem` with `ndim` dimensions: it
/// has no 16-bit float datatype and `dim[0]` is at most 7
/// (src/format/nifti.rs refuses both, and
/// `nifti_refuses_what_it_cannot_hold` below checks it does). Sides are
/// 16-bit too, far past any side here.
fn nifti_can_hold(elem: Elem, ndim: usize) -> bool {
    files::nifti_datatype(elem).is_some() && ndim <= 7
}

fn volume(shape: &[u64]) -> u64 {
    shape.iter().product()
}

fn block_count(array: &[u64], block: &[u64]) -> u64 {
    array
        .iter()
        .zip(block)
        .map(|(&a, &b)| a.div_ceil(b.min(a)))
        .product()
}

/// The most dimensions an array has here (as rechunkfs).
const MAX_NDIM: usize = 8;

/// Sides along which most arrays of this many dimensions stay small.
fn max_side(ndim: usize) -> u64 {
    [0, 3_000, 50, 14, 7, 5, 4, 3, 3][ndim]
}

/// `u` in [0, 1) as a whole number in `1..=n`, 1 for 0. Shapes are drawn
/// as such fractions, for every dimension at once, so that shrinking
/// moves each side towards 1 and can drop dimensions without redrawing
/// the others (a strategy that draws sides after the number of dimensions
/// shrinks poorly).
fn scaled(u: f64, n: u64) -> u64 {
    (1 + (u * n as f64) as u64).min(n)
}

/// How a block side is drawn from its axis's side.
#[derive(Clone, Copy, Debug)]
enum Side {
    /// Anything up to a little past the whole axis.
    Any(f64),
    /// A side that divides the axis.
    Divisor(f64),
}

impl Side {
    fn of(self, side: u64) -> u64 {
        match self {
            Side::Any(u) => scaled(u, side + 2),
            Side::Divisor(u) => {
                let most = scaled(u, side);
                (1..=most).rev().find(|d| side % d == 0).unwrap_or(1)
            }
        }
    }
}

fn sides() -> impl Strategy<Value = Vec<Side>> {
    proptest::collection::vec(
        prop_oneof![
            (0.0f64..1.0).prop_map(Side::Any),
            (0.0f64..1.0).prop_map(Side::Divisor),
        ],
        MAX_NDIM,
    )
}

fn fractions() -> impl Strategy<Value = Vec<f64>> {
    proptest::collection::vec(0.0f64..1.0, MAX_NDIM)
}

/// The input's format and its options (the HDF5 chunk shape as fractions
/// of each block side).
#[derive(Clone, Debug)]
enum InputKind {
    Npy,
    H5,
    H5Chunked {
        chunk: Vec<f64>,
        deflate: bool,
    },
    Nifti,
    NiftiGz,
    Zarr {
        v3: bool,
        separator: char,
        compressed: bool,
    },
}

fn input_kind() -> impl Strategy<Value = InputKind> {
    prop_oneof![
        Just(InputKind::Npy),
        Just(InputKind::H5),
        (fractions(), any::<bool>())
            .prop_map(|(chunk, deflate)| InputKind::H5Chunked { chunk, deflate }),
        Just(InputKind::Nifti),
        Just(InputKind::NiftiGz),
        (prop_oneof![Just('.'), Just('/')], any::<bool>()).prop_map(|(separator, compressed)| {
            InputKind::Zarr {
                v3: false,
                separator,
                compressed,
            }
        }),
        (prop_oneof![Just('/'), Just('.')], any::<bool>()).prop_map(|(separator, compressed)| {
            InputKind::Zarr {
                v3: true,
                separator,
                compressed,
            }
        }),
    ]
}

fn output_format() -> impl Strategy<Value = BlockFormat> {
    proptest::sample::select(vec![
        BlockFormat::Npy,
        BlockFormat::Hdf5,
        BlockFormat::Raw,
        BlockFormat::Nifti,
        BlockFormat::Zarr,
        BlockFormat::Zarr3,
    ])
}

fn mem_strategy() -> impl Strategy<Value = Mem> {
    prop_oneof![
        2 => Just(Mem::Unlimited),
        // Log-uniform from 1/10,000 of keep(r̂)'s peak up to 4 times it:
        // baseline often needs more than keep(r̂), and should run under a
        // limit as well as be refused by one.
        5 => (-0.6f64..4.0).prop_map(|x| Mem::Fraction(10f64.powf(-x))),
        2 => Just(Mem::Least),
        1 => (-1i64..=1).prop_map(Mem::OwnPeak),
    ]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let shapes = (1..=MAX_NDIM, fractions(), sides(), sides());
    let formats = (input_kind(), any::<bool>(), output_format());
    let run = (
        mem_strategy(),
        proptest::bool::weighted(0.3),
        proptest::sample::select(vec![1usize, 2, 3, 8]),
    );
    (proptest::sample::select(Elem::all()), shapes, formats, run)
        .prop_map(
            |(
                elem,
                (ndim, array, input_block, output_block),
                (kind, single_file, output),
                (mem, baseline, workers),
            )| {
                let array: Vec<u64> = array[..ndim]
                    .iter()
                    .map(|&u| scaled(u, max_side(ndim)))
                    .collect();
                let blocks = |sides: &[Side]| -> Vec<u64> {
                    sides
                        .iter()
                        .zip(&array)
                        .map(|(side, &a)| side.of(a))
                        .collect()
                };
                let (input_block, output_block) = (blocks(&input_block), blocks(&output_block));
                let input = match kind {
                    InputKind::Npy => Input::Npy,
                    InputKind::H5 => Input::H5,
                    InputKind::H5Chunked { chunk, deflate } => Input::H5Chunked {
                        chunk: chunk
                            .iter()
                            .zip(&input_block)
                            .zip(&array)
                            .map(|((&u, &b), &a)| scaled(u, b.min(a)))
                            .collect(),
                        deflate,
                    },
                    InputKind::Nifti => Input::Nifti,
                    InputKind::NiftiGz => Input::NiftiGz,
                    InputKind::Zarr {
                        v3,
                        separator,
                        compressed,
                    } => Input::Zarr {
                        v3,
                        separator,
                        compressed,
                    },
                };
                Case {
                    elem,
                    array,
                    input_block,
                    output_block,
                    input,
                    single_file,
                    output,
                    mem,
                    baseline,
                    workers,
                }
            },
        )
        .prop_filter("array too large", |case| volume(&case.array) <= MAX_VOLUME)
        .prop_filter("too many block files", |case| {
            block_count(&case.array, &case.input_block) <= MAX_FILES
                && block_count(&case.array, &case.output_block) <= MAX_FILES
        })
        // Not left out quietly: `nifti_refuses_what_it_cannot_hold` checks
        // rechunkfs refuses these.
        .prop_filter(
            "NIfTI-1 cannot hold this dtype or this many dimensions",
            |case| {
                let ndim = case.array.len();
                (!case.input.is_nifti() && case.output != BlockFormat::Nifti)
                    || nifti_can_hold(case.elem, ndim)
            },
        )
}

/// Where cases write their files: tmpfs when there is one. Every run ends
/// in a `syncfs`, which on a disk also flushes whatever else the machine
/// is writing (a build beside the test), and a case then takes seconds.
fn scratch_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("RECHUNKFS_PROPERTY_DIR") {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    let writable = tempfile::tempdir_in(shm).is_ok();
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The name of a block file of grid `index` (C order).
fn block_name(index: &[u64], reversed: bool, ext: &str) -> String {
    let mut parts: Vec<String> = index.iter().map(u64::to_string).collect();
    if reversed {
        parts.reverse();
    }
    format!("{}.{ext}", parts.join("_"))
}

/// Writes the input array as the case says and returns the path to scan.
fn write_input(root: &Path, case: &Case, whole: &[u8]) -> PathBuf {
    let (array, elem) = (&case.array, case.elem);
    let dir = root.join("in");
    std::fs::create_dir(&dir).unwrap();
    let grid = naive::blocks(array, &case.input_block);
    if let Input::Zarr {
        v3,
        separator,
        compressed,
    } = case.input
    {
        // The chunk shape as given, even past the array: every chunk file
        // is padded to it.
        let chunk = &case.input_block;
        let (name, text) = files::zarr_metadata(v3, array, chunk, elem, separator, compressed);
        std::fs::write(dir.join(name), &text).unwrap();
        for block in &grid {
            let path = dir.join(files::zarr_chunk_key(v3, &block.index, separator));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut bytes = naive::cut(whole, array, block, chunk, elem, 0xA5);
            if compressed {
                bytes = files::zarr_encode(&text, &bytes, elem);
            }
            std::fs::write(path, bytes).unwrap();
        }
        return dir;
    }
    let ext = match case.input {
        Input::Npy => "npy",
        Input::H5 | Input::H5Chunked { .. } => "h5",
        Input::NiftiGz => "nii.gz",
        _ => "nii",
    };
    let single = case.single_file && grid.len() == 1;
    for block in &grid {
        let data = naive::cut(whole, array, block, &block.shape, elem, 0);
        let path = if single {
            // A single file is scanned by itself, whatever its name.
            dir.join(format!("whole.{ext}"))
        } else {
            dir.join(block_name(&block.index, case.input.reverses_names(), ext))
        };
        match &case.input {
            Input::Npy => files::write_npy(&path, &block.shape, elem, &data),
            Input::H5 => files::write_h5(&path, &block.shape, elem, &data, None, false),
            Input::H5Chunked { chunk, deflate } => {
                let chunk = file_chunk(chunk, &block.shape);
                files::write_h5(&path, &block.shape, elem, &data, Some(&chunk), *deflate)
            }
            Input::Nifti => files::write_nifti(&path, &block.shape, &block.origin, elem, &data),
            Input::NiftiGz => {
                files::write_nifti(&path, &block.shape, &block.origin, elem, &data);
                files::gzip_in_two_members(&path);
            }
            Input::Zarr { .. } => unreachable!(),
        }
        if single {
            return path;
        }
    }
    dir
}

/// The HDF5 chunk shape of a file of `shape`: `chunk` clipped to it, and
/// halved along its first long axis if it would be the file's own shape,
/// so a chunked input never degenerates into one chunk per block.
fn file_chunk(chunk: &[u64], shape: &[u64]) -> Vec<u64> {
    let mut clipped: Vec<u64> = chunk.iter().zip(shape).map(|(&c, &s)| c.min(s)).collect();
    if clipped == shape {
        if let Some(axis) = shape.iter().position(|&s| s > 1) {
            clipped[axis] = shape[axis].div_ceil(2);
        }
    }
    clipped
}

/// Every file under `dir`, as paths relative to it.
fn list_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap();
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    found
}

/// Checks that `out` holds exactly the output blocks of the case, each
/// declaring the right shape and type and holding the reference bytes.
fn verify_output(case: &Case, out: &Path, whole: &[u8]) {
    let (array, elem) = (&case.array, case.elem);
    let side: Vec<u64> = case
        .output_block
        .iter()
        .zip(array)
        .map(|(&b, &a)| b.min(a))
        .collect();
    let grid = naive::blocks(array, &side);
    let mut expected_files = Vec::new();
    match case.output {
        BlockFormat::Zarr | BlockFormat::Zarr3 => {
            let v3 = case.output == BlockFormat::Zarr3;
            let (meta_name, separator) = check_zarr_metadata(out, v3, array, &side, elem);
            expected_files.push(meta_name.to_string());
            for block in &grid {
                // Zarr chunk keys are in C order whatever the input's
                // axis order: they index the array as Zarr stores it.
                let key = files::zarr_chunk_key(v3, &block.index, separator);
                let found =
                    std::fs::read(out.join(&key)).unwrap_or_else(|e| panic!("chunk {key}: {e}"));
                // Padding holds the fill value, 0.
                let expected = naive::cut(whole, array, block, &side, elem, 0);
                assert!(
                    found == expected,
                    "chunk {key}: bytes differ from the reference"
                );
                expected_files.push(key);
            }
        }
        format => {
            for block in &grid {
                let name = block_name(
                    &block.index,
                    case.input.reverses_names(),
                    format.extension(),
                );
                let path = out.join(&name);
                let expected = naive::cut(whole, array, block, &block.shape, elem, 0);
                check_block_file(&path, format, block, elem, &expected);
                expected_files.push(name);
            }
            if format == BlockFormat::Raw {
                // Raw blocks carry no header: rechunkfs.json describes them.
                expected_files.push("rechunkfs.json".into());
            }
        }
    }
    expected_files.sort();
    assert_eq!(
        list_files(out),
        expected_files,
        "exactly the output blocks (and their metadata), nothing partial"
    );
}

/// Checks a Zarr array's metadata; returns its file name and the chunk
/// key separator it declares.
fn check_zarr_metadata(
    out: &Path,
    v3: bool,
    array: &[u64],
    chunk: &[u64],
    elem: Elem,
) -> (&'static str, char) {
    let name = if v3 { "zarr.json" } else { ".zarray" };
    let text = std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let meta: serde_json::Value = serde_json::from_str(&text).unwrap();
    let shape = |value: &serde_json::Value| -> Vec<u64> {
        value
            .as_array()
            .unwrap_or_else(|| panic!("{name}: {value} is no list"))
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    assert_eq!(shape(&meta["shape"]), array, "{name}: shape");
    assert_eq!(meta["fill_value"].as_f64(), Some(0.0), "{name}: fill_value");
    let separator = if v3 {
        assert_eq!(meta["zarr_format"].as_u64(), Some(3), "{name}");
        assert_eq!(meta["node_type"].as_str(), Some("array"), "{name}");
        assert_eq!(meta["data_type"].as_str(), Some(elem.zarr3_name().as_str()));
        assert_eq!(meta["chunk_grid"]["name"].as_str(), Some("regular"));
        assert_eq!(
            shape(&meta["chunk_grid"]["configuration"]["chunk_shape"]),
            chunk
        );
        let codecs = meta["codecs"].as_array().expect("codecs");
        assert_eq!(codecs.len(), 1, "{name}: one codec, bytes");
        assert_eq!(codecs[0]["name"].as_str(), Some("bytes"));
        let endian = codecs[0]["configuration"]["endian"].as_str();
        if elem.size > 1 {
            assert_eq!(
                endian,
                Some(if elem.big { "big" } else { "little" }),
                "{name}"
            );
        }
        let encoding = &meta["chunk_key_encoding"];
        assert_eq!(encoding["name"].as_str(), Some("default"), "{name}");
        match encoding["configuration"]["separator"].as_str() {
            None | Some("/") => '/',
            Some(".") => '.',
            Some(other) => panic!("{name}: separator {other}"),
        }
    } else {
        assert_eq!(meta["zarr_format"].as_u64(), Some(2), "{name}");
        assert_eq!(shape(&meta["chunks"]), chunk, "{name}: chunks");
        assert_eq!(
            meta["dtype"].as_str(),
            Some(elem.descr().as_str()),
            "{name}"
        );
        assert!(meta["compressor"].is_null(), "{name}: compressor");
        assert!(
            meta["filters"].is_null() || meta["filters"].as_array().is_some_and(|f| f.is_empty())
        );
        assert_eq!(meta["order"].as_str(), Some("C"), "{name}");
        match meta.get("dimension_separator").map(|s| s.as_str()) {
            None | Some(Some(".")) => '.',
            Some(Some("/")) => '/',
            other => panic!("{name}: dimension_separator {other:?}"),
        }
    };
    (name, separator)
}

/// Checks one output block file: what its header declares, and its data.
fn check_block_file(path: &Path, format: BlockFormat, block: &Block, elem: Elem, expected: &[u8]) {
    let name = path.display();
    match format {
        BlockFormat::Hdf5 => {
            let h5 = files::read_h5(path);
            assert_eq!(h5.shape, block.shape, "{name}: shape");
            assert_eq!((h5.kind, h5.size), (elem.kind, elem.size), "{name}: type");
            assert_eq!(h5.big, elem.big, "{name}: byte order");
            if let Some(fields) = h5.half_fields {
                assert_eq!(fields, [15, 10, 5, 0, 10, 15], "{name}: IEEE binary16");
            }
            assert!(
                h5.data == expected,
                "{name}: bytes differ from the reference"
            );
            // Stored contiguously, so a reader may also map the bytes.
            let offset =
                h5.offset
                    .unwrap_or_else(|| panic!("{name}: not contiguous")) as usize;
            let raw = std::fs::read(path).unwrap();
            assert!(
                raw[offset..offset + expected.len()] == *expected,
                "{name}: bytes at the dataset's offset differ"
            );
        }
        BlockFormat::Npy => {
            let npy = files::read_npy(path);
            assert_eq!(npy.descr, elem.descr(), "{name}: descr");
            assert!(!npy.fortran_order, "{name}: fortran_order");
            assert_eq!(npy.shape, block.shape, "{name}: shape");
            assert!(
                npy.data == expected,
                "{name}: bytes differ from the reference"
            );
        }
        BlockFormat::Nifti => {
            let nii = files::read_nifti(path);
            let reversed: Vec<u64> = block.shape.iter().rev().copied().collect();
            assert_eq!(
                nii.dims, reversed,
                "{name}: dim[] lists x (the last C axis) first"
            );
            assert_eq!(
                Some(nii.datatype),
                files::nifti_datatype(elem),
                "{name}: datatype"
            );
            assert_eq!(nii.bitpix as usize, elem.size * 8, "{name}: bitpix");
            // A one-byte element has no order; the header is written little-endian then.
            assert_eq!(
                nii.big, elem.big,
                "{name}: header byte order follows the data's"
            );
            assert!(
                nii.vox_offset >= 352.0 && nii.vox_offset.fract() == 0.0,
                "{name}: vox_offset {}",
                nii.vox_offset
            );
            assert!(
                nii.data == expected,
                "{name}: bytes differ from the reference"
            );
            // The whole array has unit voxels at the world origin (the
            // NIfTI inputs here say so, and others have no world space):
            // each block is translated to where its first voxel lies.
            assert!(nii.sform_code > 0, "{name}: sform_code");
            let ndim = block.shape.len();
            for (row, values) in nii.srow.iter().enumerate() {
                let shift = if row < ndim {
                    block.origin[ndim - 1 - row] as f32
                } else {
                    0.0
                };
                let mut expected_row = [0.0f32; 4];
                expected_row[row] = 1.0;
                expected_row[3] = shift;
                assert_eq!(*values, expected_row, "{name}: srow {row}");
            }
        }
        BlockFormat::Raw => {
            let raw = std::fs::read(path).unwrap();
            assert!(raw == expected, "{name}: bytes differ from the reference");
        }
        other => panic!("no reader for {other:?}"),
    }
}

/// What the runs covered, to show and to check that no part of the matrix
/// went untried.
#[derive(Default)]
struct Coverage {
    counts: BTreeMap<String, u64>,
}

impl Coverage {
    fn count(&mut self, key: String) {
        *self.counts.entry(key).or_default() += 1;
    }

    fn get(&self, key: &str) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }
}

static COVERAGE: Mutex<Option<Coverage>> = Mutex::new(None);

fn covered(keys: &[String]) {
    let mut guard = COVERAGE.lock().unwrap_or_else(|e| e.into_inner());
    let coverage = guard.get_or_insert_with(Coverage::default);
    for key in keys {
        coverage.count(key.clone());
    }
}

/// Rechunks the case's array and checks everything against the reference.
fn run_case(case: &Case, scratch: &Path) {
    let (array, elem) = (&case.array, case.elem);
    let root = tempfile::tempdir_in(scratch).unwrap();
    let whole = naive::whole_array(array, elem);
    let input_path = write_input(root.path(), case, &whole);
    // As `rechunk` scans: most headers are checked as their blocks are read.
    let input = InputArray::scan_with(&input_path, None, HeaderChecks::BeforeUse)
        .unwrap_or_else(|e| panic!("scan: {e}"));
    assert_eq!(input.shape, *array, "scanned shape");
    let input_side: Vec<u64> = case
        .input_block
        .iter()
        .zip(array)
        .map(|(&b, &a)| b.min(a))
        .collect();
    assert_eq!(input.block_shape, input_side, "scanned block shape");
    assert_eq!(input.dtype.numpy_descr(), elem.descr(), "scanned dtype");

    let size = elem.size as u64;
    let problem = Problem::new(
        array.clone(),
        input.block_shape.clone(),
        case.output_block.clone(),
        size,
    )
    .unwrap();
    let output_files =
        rechunkfs::output::filetree::output_file_shape(case.output, &problem.output());
    let problem = problem
        .with_files(input.files.clone(), output_files)
        .with_workers(case.workers);
    let least = 2 * size;
    let mem = match case.mem {
        Mem::Unlimited => None,
        Mem::Fraction(f) => {
            let peak = plan::keep_rhat(&problem).prediction.peak_bytes;
            Some(((peak as f64 * f) as u64).max(least))
        }
        Mem::Least => Some(least),
        Mem::OwnPeak(offset) => {
            let unlimited = if case.baseline {
                plan::baseline(&problem)
            } else {
                plan::keep_rhat(&problem)
            };
            Some(
                unlimited
                    .prediction
                    .peak_bytes
                    .saturating_add_signed(offset)
                    .max(least),
            )
        }
    };
    let strategy = if case.baseline {
        PlanStrategy::Baseline
    } else {
        PlanStrategy::Keep
    };
    let strategy_name = if case.baseline { "baseline" } else { "keep" };
    let limited = if mem.is_some() {
        "limited"
    } else {
        "unlimited"
    };
    let plan = match plan::plan(&problem, strategy, mem) {
        Ok(plan) => plan,
        // Baseline reads whole input blocks and cannot shrink to fit; keep
        // must always fit down to `least`.
        Err(Error::DoesNotFit {
            needed, allowed, ..
        }) if case.baseline
            && needed > allowed
            && Some(allowed) == mem
            && needed == plan::baseline(&problem).prediction.peak_bytes =>
        {
            covered(&["baseline does not fit".to_string()]);
            return;
        }
        // Encoded inputs are read whole: no plan holds less than an input
        // block and its decoded copy. The least the refusal names must fit.
        Err(Error::DoesNotFit {
            needed, allowed, ..
        }) if input.files.is_encoded() && needed > allowed && Some(allowed) == mem => {
            let fits = plan::plan(&problem, strategy, Some(needed))
                .unwrap_or_else(|e| panic!("the least memory named ({needed}) does not fit: {e}"));
            assert!(fits.prediction.peak_bytes <= needed);
            covered(&["encoded input does not fit".to_string()]);
            return;
        }
        Err(e) => panic!("plan ({strategy_name}, mem {mem:?}): {e}"),
    };

    let out = root.path().join("out");
    directory::prepare_output_dir(&out, false).unwrap();
    // As the command line does: the input decides the world space and the
    // order block files are named in.
    let spec = OutputSpec {
        format: case.output,
        dataset: "/data".into(),
        dtype: input.dtype,
        space: input.space().unwrap(),
        axis_order: input.axis_order(),
        encoding: Default::default(),
        commit_batch_bytes: rechunkfs::output::directory::COMMIT_BATCH_BYTES,
    };
    let stats = directory::rechunk(&input, &plan, &out, spec, None, |_| {})
        .unwrap_or_else(|e| panic!("rechunk: {e}"));
    let predicted = &plan.prediction;
    assert_eq!(stats.read_seeks, predicted.read_seeks, "read seeks vs plan");
    assert_eq!(
        stats.write_seeks, predicted.write_seeks,
        "write seeks vs plan"
    );
    assert_eq!(
        stats.peak_held_bytes, predicted.peak_bytes,
        "peak held bytes vs plan"
    );
    if let Some(mem) = mem {
        assert!(
            stats.peak_held_bytes <= mem,
            "peak {} over --mem {mem}",
            stats.peak_held_bytes
        );
    }
    let nbytes = volume(array) * size;
    // An encoded chunk is read whole: its file's bytes, once.
    let encoded_bytes: u64 = input
        .blocks
        .iter()
        .map(|block| match block.storage {
            rechunkfs::format::Storage::Encoded { len, .. } => len,
            _ => 0,
        })
        .sum();
    let read = if input.files.is_encoded() {
        encoded_bytes
    } else {
        nbytes
    };
    assert_eq!(stats.bytes_read, read, "every byte read once");
    // Every byte written once, and the padding between the rows of a
    // padded (Zarr) edge chunk filled in the same calls, as predicted.
    assert_eq!(
        stats.bytes_written, predicted.bytes_written,
        "bytes written vs plan"
    );
    if !matches!(case.output, BlockFormat::Zarr | BlockFormat::Zarr3) {
        assert_eq!(stats.bytes_written, nbytes, "every byte written once");
    }
    verify_output(case, &out, &whole);

    let past = |block: &[u64]| block.iter().zip(array).any(|(b, a)| b > a);
    let mut keys = vec![
        format!("dtype {:?}", elem),
        format!("ndim {}", array.len()),
        format!("in {}", case.input.name()),
        format!("out {}", case.output.extension()),
        format!(
            "in {} -> out {}",
            case.input.name(),
            case.output.extension()
        ),
        format!("{strategy_name} {limited}"),
        format!(
            "input blocks {} the array",
            if case.array.iter().zip(&input_side).all(|(a, b)| a % b == 0) {
                "divide"
            } else {
                "do not divide"
            }
        ),
        format!(
            "output blocks {} the array",
            if case
                .array
                .iter()
                .zip(&case.output_block)
                .all(|(a, b)| a % b.min(a) == 0)
            {
                "divide"
            } else {
                "do not divide"
            }
        ),
    ];
    if past(&case.input_block) {
        keys.push("input block past the array".into());
    }
    if past(&case.output_block) {
        keys.push("output block past the array".into());
    }
    if input_path.is_file() {
        keys.push("input scanned as one file".into());
    }
    if let Input::H5Chunked { deflate: true, .. } = case.input {
        keys.push("h5 chunked deflated".into());
    }
    if mem == Some(least) {
        keys.push(format!("{strategy_name} at the least memory"));
    }
    covered(&keys);
}

fn case_count() -> u32 {
    if let Some(text) = std::env::var_os("RECHUNKFS_PROPERTY_CASES") {
        let text = text.to_string_lossy();
        return text
            .parse()
            .unwrap_or_else(|_| panic!("RECHUNKFS_PROPERTY_CASES={text} is not a count"));
    }
    if std::env::var_os("PROPTEST_CASES").is_some() {
        return Config::default().cases;
    }
    DEFAULT_CASES
}

#[test]
fn rechunked_blocks_match_a_naive_reference() {
    let cases = case_count();
    let config = Config {
        cases,
        source_file: Some(file!()),
        // Failing seeds go beside this file, as tests/engine.rs's do.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    let scratch = scratch_root();
    let mut runner = TestRunner::new(config);
    // Each shrinking step that fails panics; the minimal case is what
    // matters, reported once below.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let started = std::time::Instant::now();
    let result = runner.run(&case_strategy(), |case| {
        run_case(&case, &scratch);
        Ok(())
    });
    std::panic::set_hook(hook);
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, case)) => {
            panic!("{reason}\nminimal failing case: {case:?}")
        }
        Err(TestError::Abort(reason)) => panic!("proptest aborted: {reason}"),
    }
    let coverage = COVERAGE.lock().unwrap().take().unwrap_or_default();
    let mut report = format!(
        "{cases} cases in {:.1} s under {}:\n",
        started.elapsed().as_secs_f64(),
        scratch.display()
    );
    for (key, count) in &coverage.counts {
        report.push_str(&format!("  {key}: {count}\n"));
    }
    // Shown even when the test passes: the harness hides what passing
    // tests print, and the matrix covered is the point of this test.
    let _ = std::io::stderr().write_all(report.as_bytes());
    if cases >= DEFAULT_CASES {
        let mut missing = Vec::new();
        let mut need = |key: String| {
            if coverage.get(&key) == 0 {
                missing.push(key);
            }
        };
        for elem in Elem::all() {
            need(format!("dtype {elem:?}"));
        }
        for ndim in 1..=8 {
            need(format!("ndim {ndim}"));
        }
        for input in ["npy", "h5", "h5 chunked", "nii", "nii.gz", "zarr", "zarr3"] {
            need(format!("in {input}"));
        }
        for output in ["h5", "npy", "nii", "raw", "zarr", "zarr3"] {
            need(format!("out {output}"));
        }
        for strategy in ["keep", "baseline"] {
            for limit in ["limited", "unlimited"] {
                need(format!("{strategy} {limit}"));
            }
        }
        assert!(missing.is_empty(), "{cases} cases never ran {missing:?}");
    }
}

#[test]
fn nifti_refuses_what_it_cannot_hold() {
    // The combinations the property test leaves out of NIfTI, refused by
    // rechunkfs before anything is written.
    let half: rechunkfs::DType = "<f2".parse().unwrap();
    let byte: rechunkfs::DType = "u1".parse().unwrap();
    for (dtype, shape) in [(half, vec![2u64, 3]), (byte, vec![1u64; 8])] {
        let spec = OutputSpec {
            format: BlockFormat::Nifti,
            dataset: "/data".into(),
            dtype,
            space: rechunkfs::array::space::Space::identity(shape.len()),
            axis_order: rechunkfs::array::axes::AxisOrder::C,
            encoding: Default::default(),
            commit_batch_bytes: rechunkfs::output::directory::COMMIT_BATCH_BYTES,
        };
        let refusal = spec.template(&shape).expect_err("NIfTI-1 cannot hold it");
        assert!(refusal.to_string().contains("NIfTI-1"), "{refusal}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// The closed-form bound on keep's peak memory (`docs/keep.md`, "A
    /// memory bound") is never below the simulated peak: any shapes, any
    /// order of the axes, any memory, plain, padded and encoded files.
    #[test]
    fn the_peak_never_exceeds_its_bound(
        (array, input_block, output_block) in (1usize..=4).prop_flat_map(|n| {
            proptest::collection::vec(1u64..=20, n).prop_flat_map(|array| {
                let blocks = |a: &Vec<u64>| -> Vec<BoxedStrategy<u64>> {
                    a.iter().map(|&len| (1u64..=len + 3).boxed()).collect()
                };
                (Just(array.clone()), blocks(&array), blocks(&array))
            })
        }),
        elem in prop_oneof![Just(1u64), Just(2), Just(8)],
        files in 0u8..4,
        mem_fraction in prop_oneof![Just(None), (0.05f64..1.0).prop_map(Some)],
        shuffle in proptest::collection::vec(0usize..24, 4),
    ) {
        let input_block: Vec<u64> =
            input_block.iter().zip(&array).map(|(b, a)| *b.min(a)).collect();
        let mut order: Vec<usize> = (0..array.len()).collect();
        for (d, pick) in shuffle.iter().enumerate().take(array.len()) {
            order.swap(d, d + pick % (array.len() - d));
        }
        let problem = Problem::new(array, input_block.clone(), output_block.clone(), elem).unwrap();
        let problem = match files {
            0 => problem,
            1 => problem.with_files(
                rechunkfs::array::geometry::FileShape::Padded(input_block),
                rechunkfs::array::geometry::FileShape::Padded(output_block),
            ),
            2 => problem.with_files(
                rechunkfs::array::geometry::FileShape::Encoded { padded_to: Some(input_block) },
                rechunkfs::array::geometry::FileShape::Exact,
            ),
            _ => problem
                .with_files(
                    rechunkfs::array::geometry::FileShape::Exact,
                    rechunkfs::array::geometry::FileShape::Padded(output_block),
                )
                .with_encoded_outputs(),
        };
        let least = plan::keep_rhat(&problem).prediction.peak_bytes;
        let mem = mem_fraction.map(|f| ((least as f64 * f) as u64).max(2 * elem));
        for orders in [plan::Orders::Fixed(order), plan::Orders::Every] {
            if let Ok(chosen) = plan::plan_in(&problem, PlanStrategy::Keep, mem, &orders) {
                prop_assert!(
                    chosen.prediction.peak_bytes <= chosen.prediction.peak_bound,
                    "peak {} above its bound {} in order {:?}",
                    chosen.prediction.peak_bytes,
                    chosen.prediction.peak_bound,
                    chosen.order
                );
            }
        }
    }
}
