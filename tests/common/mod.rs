//! Helpers shared by the integration tests: make sample arrays, and check
//! output blocks voxel by voxel against the source.

#![allow(dead_code)]

#[macro_use]
pub mod prerequisites;

use std::path::{Path, PathBuf};

use rechunkfs::array::geometry::{IndexBox, Partition};
use rechunkfs::array::names::grid_name;
use rechunkfs::cli::sample;
use rechunkfs::format::{self, hdf5::Hdf5BlockReader, BlockFormat, Storage};
use rechunkfs::DType;

pub fn dtype(text: &str) -> DType {
    text.parse().expect("test dtype")
}

/// Writes the sample array as blocks into a fresh directory under `root`.
pub fn make_blocks(
    root: &Path,
    name: &str,
    array: &[u64],
    block: &[u64],
    dtype: DType,
    format: BlockFormat,
) -> PathBuf {
    let dir = root.join(name);
    sample::write_sample(&dir, array, block, dtype, format, "/data").expect("write sample");
    dir
}

/// Reads a block file's array bytes: raw from its data offset, and, for
/// HDF5, also through libhdf5 (a real reader, not our offsets), checking both agree.
pub fn block_bytes(path: &Path, format: BlockFormat) -> (Vec<u64>, DType, Vec<u8>) {
    let info = format::probe(path, format, "/data")
        .unwrap_or_else(|e| panic!("probe {}: {e}", path.display()));
    let nbytes = info.shape.iter().product::<u64>() as usize * info.dtype.size;
    let raw = match &info.storage {
        Storage::Contiguous { data_offset } => {
            let all = std::fs::read(path).expect("read block");
            all[*data_offset as usize..*data_offset as usize + nbytes].to_vec()
        }
        Storage::Hdf5Dataset { .. } | Storage::Absent { .. } => Vec::new(),
    };
    if format == BlockFormat::Hdf5 {
        let reader = Hdf5BlockReader::open(path, "/data").expect("open with libhdf5");
        let mut via_lib = vec![0u8; nbytes];
        let origin = vec![0; info.shape.len()];
        reader
            .read_box(&origin, &info.shape, &mut via_lib, &info.shape, &origin)
            .expect("libhdf5 read");
        if !raw.is_empty() {
            assert!(
                raw == via_lib,
                "{}: libhdf5 and raw offset disagree",
                path.display()
            );
        }
        return (info.shape, info.dtype, via_lib);
    }
    (info.shape, info.dtype, raw)
}

/// Checks that `out` holds exactly the output grid of the sample array, each
/// block byte-exact, with no leftover temporary files.
pub fn verify_output(
    out: &Path,
    array: &[u64],
    out_block: &[u64],
    dtype: DType,
    format: BlockFormat,
) {
    let grid = Partition::regular(array, out_block);
    let mut expected_names = Vec::new();
    for index in IndexBox::grid(&grid.grid_shape()) {
        let region = grid.block(&index);
        let name = format!("{}.{}", grid_name(&index), format.extension());
        let path = out.join(&name);
        let (shape, found_dtype, bytes) = block_bytes(&path, format);
        assert_eq!(shape, region.shape, "{name}: shape");
        assert_eq!(found_dtype, dtype, "{name}: dtype");
        let expected = sample::region_bytes(array, &region, dtype.size);
        assert!(
            bytes == expected,
            "{name}: bytes differ from the source array"
        );
        expected_names.push(name);
    }
    let mut present: Vec<String> = std::fs::read_dir(out)
        .expect("list out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    expected_names.sort();
    assert_eq!(
        present, expected_names,
        "exactly the output blocks, no partial files"
    );
}

/// The exact bytes of the view's file for output block `region`: the
/// view's (page-aligned) template around the sample data.
pub fn expected_view_file(
    array: &[u64],
    region: &rechunkfs::array::geometry::Region,
    dtype: DType,
    format: BlockFormat,
) -> Vec<u8> {
    let template = format::template_aligned(
        format,
        &region.shape,
        dtype,
        "/data",
        format::VIEW_DATA_ALIGNMENT,
    )
    .expect("template");
    let mut bytes = template.prefix.clone();
    bytes.extend_from_slice(&sample::region_bytes(array, region, dtype.size));
    bytes.extend_from_slice(&template.suffix);
    bytes
}

/// A small deterministic random number generator for tests (no seed files,
/// same sequence every run).
pub struct TestRng(pub u64);

impl TestRng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        sample::splitmix64(self.0) % n.max(1)
    }
}

/// Whether `format` is one of the Zarr formats (a directory with metadata
/// and chunk files, not block files).
pub fn is_zarr(format: BlockFormat) -> bool {
    matches!(format, BlockFormat::Zarr | BlockFormat::Zarr3)
}

/// The exact bytes of the chunk file for output block `region` in chunks
/// of `chunk`: the sample data, C order, padded with zeros to the whole
/// chunk (Zarr's edge chunks; the fill value is 0).
pub fn expected_chunk_file(
    array: &[u64],
    region: &rechunkfs::array::geometry::Region,
    chunk: &[u64],
    dtype: DType,
) -> Vec<u8> {
    let data = sample::region_bytes(array, region, dtype.size);
    let elem = dtype.size;
    let chunk_strides = rechunkfs::array::geometry::strides(chunk);
    let mut bytes = vec![0u8; chunk.iter().product::<u64>() as usize * elem];
    let last = region.ndim() - 1;
    let row_len = region.shape[last] as usize * elem;
    let rows: Vec<usize> = region.shape[..last].iter().map(|&n| n as usize).collect();
    for (i, row) in IndexBox::grid(&rows).enumerate() {
        let at: u64 = row
            .iter()
            .zip(&chunk_strides)
            .map(|(&r, &s)| r as u64 * s)
            .sum();
        let at = at as usize * elem;
        bytes[at..at + row_len].copy_from_slice(&data[i * row_len..(i + 1) * row_len]);
    }
    bytes
}

/// Checks that `out` is exactly the Zarr array of the sample array in
/// chunks of `out_block`: its metadata, and every chunk file byte-exact
/// (padded edge chunks included), and nothing else but the metadata (and
/// in a view, rechunkfs's own two files).
pub fn verify_zarr_output(
    out: &Path,
    array: &[u64],
    out_block: &[u64],
    dtype: DType,
    format: BlockFormat,
) {
    let chunk: Vec<u64> = out_block
        .iter()
        .zip(array)
        .map(|(&b, &n)| b.min(n))
        .collect();
    let meta = format::zarr::read_metadata(out)
        .expect("readable metadata")
        .expect("a Zarr array");
    assert_eq!(meta.format, format);
    assert_eq!(meta.shape, array);
    assert_eq!(meta.chunks, chunk);
    assert_eq!(meta.dtype, dtype);
    let tree = rechunkfs::output::filetree::FileTree::for_output(
        format,
        Partition::regular(array, &chunk),
        rechunkfs::array::axes::AxisOrder::C,
    );
    let mut expected_files = vec![meta
        .path
        .file_name()
        .expect("metadata name")
        .to_string_lossy()
        .into_owned()];
    for rank in 0..tree.block_count() {
        let region = tree.grid().block(&tree.grid().unravel(rank));
        let name = tree.path(rank);
        let bytes = std::fs::read(out.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            bytes == expected_chunk_file(array, &region, &chunk, dtype),
            "{name}: bytes differ from the source array"
        );
        expected_files.push(name);
    }
    let mut present = Vec::new();
    list_files(out, out, &mut present);
    present.retain(|name| name != "rechunkfs.json" && name != ".rechunkfs-status.json");
    present.sort();
    expected_files.sort();
    assert_eq!(
        present, expected_files,
        "exactly the metadata and the chunks, no partial files"
    );
}

fn list_files(root: &Path, dir: &Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            list_files(root, &path, found);
        } else {
            let relative = path.strip_prefix(root).expect("inside root");
            found.push(relative.to_string_lossy().into_owned());
        }
    }
}

/// Writes the sample array as a Zarr array (`format`) in chunks of
/// `chunk`, by rechunking block files with rechunkfs itself; returns its
/// directory.
pub fn make_zarr(
    root: &Path,
    name: &str,
    array: &[u64],
    chunk: &[u64],
    dtype: DType,
    format: BlockFormat,
) -> PathBuf {
    let blocks = make_blocks(
        root,
        &format!("{name}-blocks"),
        array,
        array,
        dtype,
        BlockFormat::Npy,
    );
    let single = blocks.join(format!("{}.npy", vec!["0"; array.len()].join("_")));
    let input = rechunkfs::input::InputArray::scan(&single, None).expect("scan");
    let problem = rechunkfs::plan::Problem::new(
        array.to_vec(),
        array.to_vec(),
        chunk.to_vec(),
        dtype.size as u64,
    )
    .expect("problem");
    let files = rechunkfs::output::filetree::output_file_shape(format, &problem.output());
    let problem = problem.with_files(input.files.clone(), files);
    let plan =
        rechunkfs::plan::plan(&problem, rechunkfs::plan::Strategy::Keep, None).expect("plan");
    let out = root.join(name);
    rechunkfs::output::directory::prepare_output_dir(&out, false).expect("out dir");
    let spec = rechunkfs::output::directory::OutputSpec {
        format,
        dataset: "/data".into(),
        dtype,
        space: rechunkfs::array::space::Space::identity(array.len()),
        axis_order: rechunkfs::array::axes::AxisOrder::C,
    };
    rechunkfs::output::directory::rechunk(&input, &plan, &out, spec, None, |_| {})
        .expect("rechunk");
    out
}

/// Runs the `rechunkfs` binary built for these tests, with the
/// materialiser paused `step_delay_ms` after each read block (0: none).
pub fn run_rechunkfs(args: &[&str], step_delay_ms: u64) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(args)
        .env("RECHUNKFS_STEP_DELAY_MS", step_delay_ms.to_string())
        .output()
        .expect("run rechunkfs")
}

pub fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The Python interpreter with the readers `scripts/setup` installs
/// (numpy, h5py, nibabel, zarr, tensorstore); a test using it first says
/// `require!(Readers)`.
pub fn python() -> String {
    prerequisites::python_path().to_string_lossy().into_owned()
}

/// The unsigned integer at `path` (`seeks.made`) in a JSON report; fails
/// the test when the key is missing or holds anything else, so that two
/// absent keys never compare equal.
pub fn json_u64(value: &serde_json::Value, path: &str) -> u64 {
    let mut at = value;
    for key in path.split('.') {
        at = at
            .get(key)
            .unwrap_or_else(|| panic!("no `{path}` in the report (missing `{key}`): {value}"));
    }
    at.as_u64()
        .unwrap_or_else(|| panic!("`{path}` is {at}, not an unsigned integer"))
}
