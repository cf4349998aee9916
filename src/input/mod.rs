//! Input discovery: find the block files of an array (a directory of
//! `{i}_{j}_{k}.h5` files, or one file), check that they form a complete,
//! consistent grid, and describe the whole array.
//!
//! The scan never guesses: a missing or duplicated index, a block whose
//! shape disagrees with its position, mixed dtypes, a truncated file or a
//! name that does not parse is refused with the file and the problem named.
//!
//! When every header is read ([`HeaderChecks::AtScan`]) is a choice. On a
//! cold cache the scan of W1's 8,000 HDF5 blocks spends 0.3 s waiting for
//! their headers, one disk read each, and then the run reads each file
//! again for its data. With [`HeaderChecks::BeforeUse`] the scan probes two
//! blocks of each kind (interior, or last along some dimensions) and fixes
//! the grid from them; every other block is checked when its file is first
//! read, against the header of a probed block of its kind, and the header
//! comes in with its data. A block whose header differs is probed then, and
//! one that does not fit stops the run with the same message a full scan
//! gives.
//!
//! Block file names and the shapes in messages are in the user-facing axis
//! order of the input's format ([`AxisOrder`]); everything stored here is
//! in internal C order.

mod zarr;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use serde::Serialize;

use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry::{self, FileShape, Partition};
use crate::array::names::{grid_name, parse_grid_index};
use crate::array::space::Space;
use crate::error::{Error, Result};
use crate::format::{self, BlockFormat, Storage};
use crate::sys::pagecache;

/// The HDF5 dataset read when none is named.
pub const DEFAULT_DATASET: &str = "/data";

/// When the scan reads the headers of block files (see the module's notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderChecks {
    /// Every header, before the scan returns.
    AtScan,
    /// A few at the scan; each of the others just before its data is read
    /// ([`InputArray::confirmed_storage`]).
    BeforeUse,
}

/// One input block file.
#[derive(Clone, Debug)]
pub struct InputBlock {
    pub path: PathBuf,
    pub storage: Storage,
    /// Set when the scan did not read this block's header: its `storage`
    /// is that of a probed block of the same shape, and holds only if the
    /// file starts with the same header bytes.
    pub check: Option<Arc<HeaderCheck>>,
}

/// The header a block not probed at scan time is expected to have: that
/// of a probed block of the same shape. Files of equal length with equal
/// bytes before their data have the same layout (the probe parses
/// identical bytes identically), and nothing follows their data.
#[derive(Debug)]
pub struct HeaderCheck {
    /// The probed block.
    pub like: PathBuf,
    pub len: u64,
    /// Its bytes before the data.
    pub header: Vec<u8>,
}

impl InputBlock {
    /// The file's size and modification time now; an absent Zarr chunk's
    /// are zero, so one written later shows as a change. Not taken by the
    /// scan: a view records them as it reads each file (8,000 cold stats
    /// up front took 0.07 s).
    pub fn identity(&self) -> Result<FileIdentity> {
        match self.storage {
            Storage::Absent { .. } => Ok(FileIdentity::ABSENT),
            _ => FileIdentity::of(&self.path),
        }
    }
}

impl HeaderCheck {
    /// What blocks like `path` (open as `file`, `len` bytes, probed as
    /// `info`) must start with, if its header can stand for theirs: its
    /// data raw at the end of the file, after a header short enough to
    /// compare.
    fn of_probed(
        path: &Path,
        file: &fs::File,
        len: u64,
        info: &format::BlockInfo,
    ) -> Result<Option<HeaderCheck>> {
        let Storage::Contiguous { data_offset } = info.storage else {
            return Ok(None);
        };
        if data_offset > CACHED_HEADER_BYTES || data_offset + info.data_len() != len {
            return Ok(None);
        }
        let mut header = vec![0u8; data_offset as usize];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut header, 0)
            .map_err(|e| Error::io(path, "reading its header", e))?;
        Ok(Some(HeaderCheck {
            like: path.to_path_buf(),
            len,
            header,
        }))
    }

    /// Whether `file`, `len` bytes long, has the length and header bytes
    /// of the block this check was made from.
    fn passes(&self, file: &fs::File, len: u64) -> bool {
        if len != self.len {
            return false;
        }
        let mut header = vec![0u8; self.header.len()];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut header, 0).is_ok()
            && header == self.header
    }
}

/// Size and modification time of a file, to notice changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FileIdentity {
    pub size: u64,
    pub mtime_ns: i128,
}

impl FileIdentity {
    /// What a file that does not exist has (an absent Zarr chunk).
    pub const ABSENT: FileIdentity = FileIdentity {
        size: 0,
        mtime_ns: 0,
    };

    pub fn of(path: &Path) -> Result<FileIdentity> {
        let meta = fs::metadata(path).map_err(|e| Error::io(path, "stat", e))?;
        Ok(FileIdentity::of_metadata(&meta))
    }

    /// The identity of `path` now, [`ABSENT`](Self::ABSENT) if it does not exist.
    pub fn now(path: &Path) -> Result<FileIdentity> {
        match fs::metadata(path) {
            Ok(meta) => Ok(FileIdentity::of_metadata(&meta)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileIdentity::ABSENT),
            Err(e) => Err(Error::io(path, "stat", e)),
        }
    }

    /// The identity a stat of the file found.
    pub fn of_metadata(meta: &fs::Metadata) -> FileIdentity {
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        FileIdentity {
            size: meta.len(),
            mtime_ns,
        }
    }
}

/// A whole array stored as a grid of block files.
#[derive(Clone, Debug)]
pub struct InputArray {
    /// The directory (or single file) it was scanned from.
    pub source: PathBuf,
    pub format: BlockFormat,
    /// HDF5 dataset path inside each block file.
    pub dataset: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Shape of every block but the edge ones (which may be smaller).
    pub block_shape: Vec<u64>,
    /// How block files are shaped around their blocks (Zarr pads edge chunks).
    pub files: FileShape,
    /// Blocks in C order of their grid index.
    pub blocks: Vec<InputBlock>,
}

impl InputArray {
    /// Scans `path` (a directory of block files or one file), reading every
    /// header; `dataset` names the HDF5 dataset (default `/data`).
    pub fn scan(path: &Path, dataset: Option<&str>) -> Result<InputArray> {
        InputArray::scan_with(path, dataset, HeaderChecks::AtScan)
    }

    /// [`scan`](Self::scan), reading the headers `checks` says now.
    pub fn scan_with(
        path: &Path,
        dataset: Option<&str>,
        checks: HeaderChecks,
    ) -> Result<InputArray> {
        let dataset = dataset.unwrap_or(DEFAULT_DATASET).to_string();
        let meta = fs::metadata(path).map_err(|e| Error::io(path, "reading the input", e))?;
        if meta.is_file() {
            return scan_single_file(path, dataset);
        }
        if !meta.is_dir() {
            return Err(Error::bad_input(
                path,
                "is neither a block file nor a directory of block files",
            ));
        }
        if let Some(zarr) = format::zarr::read_metadata(path)? {
            return zarr::scan_array(path, zarr);
        }
        let named = list_block_files(path)?;
        assemble_grid(path, named, dataset, checks)
    }

    /// The storage of block `rank`, whose file is open as `file`: as the
    /// scan found it, or for a block whose header the scan did not read
    /// (see [`HeaderChecks`]), once the file is checked to start with the
    /// header expected. A file that differs is probed now: if it still
    /// holds a block of the right shape and dtype its own storage is used;
    /// if not, the error is the one a full scan gives.
    pub fn confirmed_storage(
        &self,
        rank: usize,
        file: &fs::File,
        meta: Option<&fs::Metadata>,
    ) -> Result<Storage> {
        let block = &self.blocks[rank];
        let Some(check) = &block.check else {
            return Ok(block.storage.clone());
        };
        let len = match meta {
            Some(meta) => meta.len(),
            None => file
                .metadata()
                .map_err(|e| Error::io(&block.path, "stat", e))?
                .len(),
        };
        if check.passes(file, len) {
            return Ok(block.storage.clone());
        }
        let info = format::probe(
            &block.path,
            self.format,
            self.format.input_dataset(&self.dataset),
        )?;
        let grid = self.grid();
        let expected = grid.block(&grid.unravel(rank as u64)).shape;
        if info.shape == expected && info.dtype == self.dtype {
            return Ok(info.storage);
        }
        // A full scan names the odd block the way it always does (it may
        // be one the grid was fixed from).
        match InputArray::scan(&self.source, Some(&self.dataset)) {
            Err(error) => Err(error),
            Ok(_) => {
                let order = self.axis_order();
                Err(Error::bad_input(
                    &block.path,
                    format!(
                        "changed while being read: it now holds a {} {} block where {} {} was \
                         scanned",
                        geometry::show_shape(&order.to_user(&info.shape)),
                        info.dtype,
                        geometry::show_shape(&order.to_user(&expected)),
                        self.dtype
                    ),
                ))
            }
        }
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The input blocks as a partition of the array.
    pub fn grid(&self) -> Partition {
        Partition::regular(&self.shape, &self.block_shape)
    }

    pub fn nbytes(&self) -> u64 {
        geometry::volume(&self.shape) * self.dtype.size as u64
    }

    /// The order of shapes and block indices people use for this input
    /// (see [`crate::array::axes`]): the input's format decides it for the whole run.
    pub fn axis_order(&self) -> AxisOrder {
        self.format.axis_order()
    }

    /// Where the array lies in the world, for NIfTI outputs: from the headers
    /// of NIfTI and MINC2 inputs (block 0's affine is the whole array's),
    /// identity for the others. MINC2 scaling is one global range only if
    /// every block has the same one; otherwise NIfTI output is refused.
    pub fn space(&self) -> Result<Space> {
        let Some(first) = self.blocks.first() else {
            return Ok(Space::identity(self.ndim()));
        };
        let probe = |block: &InputBlock, shape: Vec<u64>| -> Result<Option<Space>> {
            let info = format::BlockInfo {
                shape,
                dtype: self.dtype,
                storage: block.storage.clone(),
            };
            format::probe_space(&block.path, self.format, &info)
        };
        let Some(mut space) = probe(first, self.block_shape.clone())? else {
            return Ok(Space::identity(self.ndim()));
        };
        let grid = self.grid();
        for (rank, block) in self.blocks.iter().enumerate().skip(1) {
            let region = grid.block(&grid.unravel(rank as u64));
            let Some(other) = probe(block, region.shape)? else {
                continue;
            };
            if space.nifti_refusal.is_none() {
                if let Some(refusal) = other.nifti_refusal {
                    space.nifti_refusal = Some(refusal);
                } else if other.scaling != space.scaling {
                    space.nifti_refusal = Some(format!(
                        "{} scales its values by (slope, intercept) {:?} but {} by {:?}; a set \
                         of NIfTI blocks made from them would need one scaling",
                        block.path.display(),
                        other.scaling,
                        first.path.display(),
                        space.scaling
                    ));
                }
            }
            // Each block's own affine should put it where its position in
            // the grid says; if not, the blocks' affines disagree, and the
            // first block's is the one carried.
            let expected = space.block_affine(&region.origin);
            let disagrees = expected
                .iter()
                .flatten()
                .zip(other.affine.iter().flatten())
                .any(|(a, b)| (a - b).abs() > 1e-3 * a.abs().max(1.0));
            if disagrees {
                log::warn!(
                    "{}: its affine {:?} does not place it at its grid position (expected {:?}); \
                     using the affine of {}",
                    block.path.display(),
                    other.affine,
                    expected,
                    first.path.display()
                );
            }
        }
        Ok(space)
    }
}

fn scan_single_file(path: &Path, dataset: String) -> Result<InputArray> {
    let format = format_of(path)?;
    let info = format::probe(path, format, format.input_dataset(&dataset))?;
    Ok(InputArray {
        source: path.to_path_buf(),
        format,
        dtype: info.dtype,
        shape: info.shape.clone(),
        block_shape: info.shape,
        files: FileShape::Exact,
        blocks: vec![InputBlock {
            path: path.to_path_buf(),
            storage: info.storage,
            check: None,
        }],
        dataset,
    })
}

fn format_of(path: &Path) -> Result<BlockFormat> {
    refuse_compressed_nifti(path)?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    BlockFormat::from_extension(ext).ok_or_else(|| {
        Error::bad_input(
            path,
            format!(
                "unknown block file extension '.{ext}'; rechunkfs reads .h5/.hdf5 (HDF5), .npy, \
                 .nii (NIfTI-1) and .mnc (MINC2) files"
            ),
        )
    })
}

/// `.nii.gz` is the usual way NIfTI travels, but its voxels are not at a
/// fixed offset, so rechunkfs cannot read them in place: say so rather than
/// skip the file as one of an unknown type.
fn refuse_compressed_nifti(path: &Path) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.ends_with(".nii.gz") {
        return Err(Error::bad_input(
            path,
            "gzip-compressed NIfTI (.nii.gz) is not supported: its voxels cannot be read in \
             place; decompress it first (gunzip FILE.nii.gz, or gunzip -k to keep the original)",
        ));
    }
    Ok(())
}

/// Block files in `dir` with their grid index and format. Hidden files and
/// files of other types are skipped (with a log line); a block-file
/// extension on a name that is not a grid index is an error.
fn list_block_files(dir: &Path) -> Result<Vec<(Vec<usize>, PathBuf, BlockFormat)>> {
    let mut named = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, "listing", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, "listing", e))?;
        let path = entry.path();
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with('.') {
            continue;
        }
        refuse_compressed_nifti(&path)?;
        let Some(format) = path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(BlockFormat::from_extension)
        else {
            log::warn!(
                "{}: not a block file (unknown extension), ignored",
                path.display()
            );
            continue;
        };
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let index = parse_grid_index(stem).ok_or_else(|| {
            Error::bad_input(
                &path,
                format!(
                    "the name does not parse as a grid index: block files are named by their \
                     position, one whole number per dimension, like 0_0_0.{} or 2_1_3.{}",
                    format.extension(),
                    format.extension()
                ),
            )
        })?;
        // Names are in the user's order; the grid is kept in C order.
        named.push((format.axis_order().to_internal(&index), path, format));
    }
    Ok(named)
}

fn assemble_grid(
    dir: &Path,
    named: Vec<(Vec<usize>, PathBuf, BlockFormat)>,
    dataset: String,
    checks: HeaderChecks,
) -> Result<InputArray> {
    // Formats whose headers do not depend on the block's position (NIfTI's
    // and MINC2's place it in the world) can be checked against another's.
    let comparable = named
        .first()
        .is_some_and(|(_, _, format)| matches!(format, BlockFormat::Hdf5 | BlockFormat::Npy));
    if checks == HeaderChecks::AtScan || !comparable {
        return assemble(dir, named, dataset, false);
    }
    match assemble(dir, named.clone(), dataset.clone(), true) {
        Ok(array) => Ok(array),
        // Found among the few blocks probed: a full scan names the odd
        // block out the way it always does.
        Err(error) => assemble(dir, named, dataset, false).and(Err(error)),
    }
}

/// Checks the names of `named`, probes their headers (with `defer`, only
/// those [`HeaderChecks::BeforeUse`] needs) and puts the array together.
fn assemble(
    dir: &Path,
    named: Vec<(Vec<usize>, PathBuf, BlockFormat)>,
    dataset: String,
    defer: bool,
) -> Result<InputArray> {
    let Some((first_index, first_path, format)) = named.first().cloned() else {
        return Err(Error::bad_input(
            dir,
            "holds no block files; expected files named by grid index like 0_0_0.h5 or 0_0_0.npy",
        ));
    };
    let ndim = first_index.len();
    let order = format.axis_order();
    // Grid indices as the file names write them.
    let user_name = |index: &[usize]| grid_name(&order.to_user(index));
    if ndim > geometry::MAX_DIMS {
        return Err(Error::bad_input(
            &first_path,
            format!(
                "names {ndim} dimensions; rechunkfs handles 1 to {}",
                geometry::MAX_DIMS
            ),
        ));
    }
    let mut by_index: BTreeMap<Vec<usize>, PathBuf> = BTreeMap::new();
    for (index, path, file_format) in &named {
        if *file_format != format {
            return Err(Error::bad_input(
                path,
                format!(
                    "is {} but {} is {}: all blocks of one array must share a format",
                    file_format.name(),
                    first_path.display(),
                    format.name()
                ),
            ));
        }
        if index.len() != ndim {
            return Err(Error::bad_input(
                path,
                format!(
                    "names a {}-dimensional grid index but {} names a {ndim}-dimensional one",
                    index.len(),
                    first_path.display()
                ),
            ));
        }
        if let Some(other) = by_index.insert(index.clone(), path.clone()) {
            return Err(Error::bad_input(
                path,
                format!(
                    "duplicates block {}: {} claims the same grid index",
                    user_name(index),
                    other.display()
                ),
            ));
        }
    }
    let grid: Vec<usize> = (0..ndim)
        .map(|d| by_index.keys().map(|i| i[d]).max().unwrap_or(0) + 1)
        .collect();
    for index in geometry::IndexBox::grid(&grid) {
        if !by_index.contains_key(&index) {
            return Err(Error::bad_input(
                dir,
                format!(
                    "block {} is missing: the names present span a {} grid, which needs all {} blocks",
                    user_name(&index),
                    order.to_user(&grid).iter().map(|n| n.to_string()).collect::<Vec<_>>().join("×"),
                    grid.iter().product::<usize>()
                ),
            ));
        }
    }

    // Which blocks are probed now: all, or when checks are deferred two of
    // each kind (a kind: the dimensions along which a block is the last,
    // which decide its shape), enough to fix the grid.
    let entries: Vec<(Vec<usize>, PathBuf)> = by_index.into_iter().collect();
    let kind_of = |index: &[usize]| -> usize {
        (0..ndim).fold(0, |kind, d| {
            kind << 1 | usize::from(index[d] == grid[d] - 1)
        })
    };
    let mut probe_now = vec![!defer; entries.len()];
    if defer {
        let mut first_of_kind: BTreeMap<usize, usize> = BTreeMap::new();
        let mut last_of_kind: BTreeMap<usize, usize> = BTreeMap::new();
        for (rank, (index, _)) in entries.iter().enumerate() {
            first_of_kind.entry(kind_of(index)).or_insert(rank);
            last_of_kind.insert(kind_of(index), rank);
        }
        for &rank in first_of_kind.values().chain(last_of_kind.values()) {
            probe_now[rank] = true;
        }
    }
    let mut probed = ProbeCache::default();
    let mut infos = probe_blocks(&entries, &probe_now, &mut probed, format, &dataset)?;
    // Each kind's first probed block stands for the rest of its kind, if
    // its header can be compared; the kinds whose cannot are probed now.
    let mut templates: BTreeMap<usize, (Storage, Arc<HeaderCheck>)> = BTreeMap::new();
    if defer {
        for ((index, path), info) in entries.iter().zip(&infos) {
            let kind = kind_of(index);
            if let Some(info) = info {
                if let std::collections::btree_map::Entry::Vacant(slot) = templates.entry(kind) {
                    if let Some(check) = header_check(path, info)? {
                        slot.insert((info.storage.clone(), Arc::new(check)));
                    }
                }
            }
        }
        let rest: Vec<bool> = entries
            .iter()
            .zip(&infos)
            .map(|((index, _), info)| info.is_none() && !templates.contains_key(&kind_of(index)))
            .collect();
        for (rank, info) in probe_blocks(&entries, &rest, &mut probed, format, &dataset)?
            .into_iter()
            .enumerate()
        {
            if info.is_some() {
                infos[rank] = info;
            }
        }
    }

    // The probed blocks in C order; the first one sets dtype and rank.
    let mut blocks = Vec::with_capacity(entries.len());
    let mut shapes = Vec::with_capacity(entries.len());
    let mut dtype: Option<DType> = None;
    for ((index, path), info) in entries.iter().zip(infos) {
        let Some(info) = info else {
            let Some((storage, check)) = templates.get(&kind_of(index)) else {
                return Err(Error::bad_input(
                    path,
                    "was neither probed nor like a probed block",
                ));
            };
            blocks.push(InputBlock {
                path: path.clone(),
                storage: storage.clone(),
                check: Some(check.clone()),
            });
            continue;
        };
        if info.shape.len() != ndim {
            return Err(Error::bad_input(
                path,
                format!(
                    "holds a {}-dimensional array but its name gives {ndim} grid indices",
                    info.shape.len()
                ),
            ));
        }
        match dtype {
            None => dtype = Some(info.dtype),
            Some(first) if first != info.dtype => {
                return Err(Error::bad_input(
                    path,
                    format!(
                        "has dtype {} but {} has {}: all blocks must share one dtype",
                        info.dtype,
                        entries[0].1.display(),
                        first
                    ),
                ))
            }
            Some(_) => {}
        }
        shapes.push((index.clone(), path.clone(), info.shape));
        blocks.push(InputBlock {
            path: path.clone(),
            storage: info.storage,
            check: None,
        });
    }
    let dtype = dtype.ok_or_else(|| Error::bad_input(dir, "holds no block files"))?;

    // Along each dimension, blocks before the last share one extent and the
    // last ones share another, no longer. The expected extents are what most
    // blocks in that position have, so the odd block out is the one named.
    let mut interior_extent = vec![0u64; ndim];
    let mut last_extent = vec![0u64; ndim];
    for d in 0..ndim {
        let most_common = |last: bool| -> u64 {
            let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
            for (index, _, shape) in &shapes {
                if (index[d] == grid[d] - 1) == last {
                    *counts.entry(shape[d]).or_default() += 1;
                }
            }
            counts
                .into_iter()
                .max_by_key(|&(extent, n)| (n, extent))
                .map_or(0, |(e, _)| e)
        };
        last_extent[d] = most_common(true);
        interior_extent[d] = if grid[d] > 1 {
            most_common(false)
        } else {
            last_extent[d]
        };
    }
    for (index, path, shape) in &shapes {
        for d in 0..ndim {
            let is_last = index[d] == grid[d] - 1;
            let expected = if is_last {
                last_extent[d]
            } else {
                interior_extent[d]
            };
            if shape[d] != expected {
                let example = shapes
                    .iter()
                    .find(|(i, _, s)| (i[d] == grid[d] - 1) == is_last && s[d] == expected)
                    .map_or(String::new(), |(_, p, _)| {
                        format!(" (like {})", p.display())
                    });
                return Err(Error::bad_input(
                    path,
                    format!(
                        "has shape {} which does not fit its position {} in the grid: along \
                         dimension {} {} blocks are {expected} long{example}, this one is {}",
                        geometry::show_shape(&order.to_user(shape)),
                        user_name(index),
                        order.user_axis(d, ndim),
                        if is_last {
                            "the last"
                        } else {
                            "all but the last"
                        },
                        shape[d]
                    ),
                ));
            }
        }
    }
    for d in 0..ndim {
        if last_extent[d] > interior_extent[d] {
            return Err(Error::bad_input(
                dir,
                format!(
                    "along dimension {} the last blocks are {} long, longer than the others ({}): \
                     only edge blocks may differ, and only by being shorter",
                    order.user_axis(d, ndim),
                    last_extent[d],
                    interior_extent[d]
                ),
            ));
        }
    }
    let origin_shape = interior_extent;
    let shape: Vec<u64> = (0..ndim)
        .map(|d| origin_shape[d] * (grid[d] as u64 - 1) + last_extent[d])
        .collect();
    Ok(InputArray {
        source: dir.to_path_buf(),
        format,
        dataset,
        dtype,
        shape,
        block_shape: origin_shape,
        files: FileShape::Exact,
        blocks,
    })
}

/// Probes the blocks of `entries` marked in `which`, in C order, reading
/// their headers ahead (see [`HeaderReadahead`]).
fn probe_blocks(
    entries: &[(Vec<usize>, PathBuf)],
    which: &[bool],
    probed: &mut ProbeCache,
    format: BlockFormat,
    dataset: &str,
) -> Result<Vec<Option<format::BlockInfo>>> {
    let paths: Vec<&Path> = entries
        .iter()
        .zip(which)
        .filter(|(_, &now)| now)
        .map(|((_, path), _)| path.as_path())
        .collect();
    let mut readahead = HeaderReadahead::new(&paths);
    let mut done = 0;
    let mut infos = Vec::with_capacity(entries.len());
    for ((_, path), &now) in entries.iter().zip(which) {
        if !now {
            infos.push(None);
            continue;
        }
        readahead.reach(done);
        done += 1;
        infos.push(Some(probed.probe(
            path,
            format,
            format.input_dataset(dataset),
        )?));
    }
    Ok(infos)
}

/// [`HeaderCheck::of_probed`] for the probed block at `path`.
fn header_check(path: &Path, info: &format::BlockInfo) -> Result<Option<HeaderCheck>> {
    let file = fs::File::open(path).map_err(|e| Error::io(path, "opening", e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    HeaderCheck::of_probed(path, &file, len, info)
}

/// Asks the kernel for the first bytes of the files a little ahead of the
/// probe. Probing reads one header at a time, and on a cold cache each
/// waits a full disk round trip: 8,000 blocks took 1.4 s that way. With
/// the next headers already queued the disk serves them together.
struct HeaderReadahead<'a> {
    paths: &'a [&'a Path],
    /// Files below this rank have been advised.
    advised: usize,
}

/// How many files ahead of the probe are advised.
const HEADER_READAHEAD_FILES: usize = 256;

/// How much of each file is advised: block headers are a few KiB (HDF5
/// blocks written by h5py: 2 KiB). Not more: on a small cache, data read
/// now would be evicted before the plan reads it.
const HEADER_READAHEAD_BYTES: u64 = 8 << 10;

impl<'a> HeaderReadahead<'a> {
    fn new(paths: &'a [&'a Path]) -> Self {
        HeaderReadahead { paths, advised: 0 }
    }

    /// Advises every file up to `rank + HEADER_READAHEAD_FILES`. Advice
    /// only: a file that cannot be opened is left for the probe to report.
    fn reach(&mut self, rank: usize) {
        let end = (rank + HEADER_READAHEAD_FILES).min(self.paths.len());
        while self.advised < end {
            if let Ok(file) = fs::File::open(self.paths[self.advised]) {
                pagecache::read_ahead(&file, 0, HEADER_READAHEAD_BYTES);
            }
            self.advised += 1;
        }
    }
}

/// Probing HDF5 files through libhdf5 costs ~60 µs each (serialised by
/// its global lock): 0.5 s for 8,000 blocks. The blocks of one grid are
/// usually byte-identical outside their data, so a file whose length and
/// bytes before its data equal those of a file already probed has the same
/// layout (libhdf5 parses identical bytes identically), and is not probed
/// again.
#[derive(Default)]
struct ProbeCache {
    known: Vec<(HeaderCheck, format::BlockInfo)>,
}

/// Files with headers longer than this are always probed in full.
const CACHED_HEADER_BYTES: u64 = 64 << 10;

impl ProbeCache {
    fn probe(
        &mut self,
        path: &Path,
        format: BlockFormat,
        dataset: &str,
    ) -> Result<format::BlockInfo> {
        if format != BlockFormat::Hdf5 {
            return format::probe(path, format, dataset);
        }
        let file = fs::File::open(path).map_err(|e| Error::io(path, "opening", e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(path, "stat", e))?
            .len();
        if let Some((_, info)) = self
            .known
            .iter()
            .find(|(check, _)| check.passes(&file, len))
        {
            return Ok(info.clone());
        }
        let info = format::probe(path, format, dataset)?;
        // Only files that are header + data: nothing after the data could
        // differ unseen. A header that cannot be read is just not kept.
        if self.known.len() < 64 {
            if let Ok(Some(check)) = HeaderCheck::of_probed(path, &file, len, &info) {
                self.known.push((check, info.clone()));
            }
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_names() {
        assert_eq!(parse_grid_index("3_0_12"), Some(vec![3, 0, 12]));
        assert_eq!(parse_grid_index("7"), Some(vec![7]));
        assert_eq!(parse_grid_index("3__1"), None);
        assert_eq!(parse_grid_index("a_1"), None);
        assert_eq!(parse_grid_index("-1_2"), None);
        assert_eq!(grid_name(&[3, 0, 12]), "3_0_12");
    }
}
