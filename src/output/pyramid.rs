//! `rechunk`'s pyramid levels: each level below level 0 built from the one
//! before (never from the input), into a directory of its own, then the
//! files that describe the whole pyramid: an OME-Zarr group's metadata,
//! or a precomputed volume's `info`. The levels are built in memory from
//! level 0's regions as they are written when the plan allows
//! ([`rechunk_streaming_levels`]), else read back from level 0's files
//! after it ([`build_levels`]).
//!
//! Layout (relative to OUT): block-file formats keep level 0 where a run
//! without levels puts it, and level `k` in `k/`; Zarr pyramids are an
//! OME-Zarr image, level `k` the array `k/`; precomputed scales are in
//! `k/` (their `key`). A level's blocks are written like level 0's: under
//! a hidden name, renamed once on disk; the pyramid's metadata comes last.
//!
//! Level 1 sees every voxel of level 0: the range of its values (the
//! OME-Zarr `omero` window) is gathered as it does, at no read more.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::array::geometry::{linear_offset, strides, volume, FileShape, IndexBox, Partition};
use crate::array::space::Space;
use crate::engine::downsample::{CellMaker, LevelBuilder, LevelFiles, LevelStream, PyramidStats};
use crate::engine::{BlockSink, OutputTarget, ReduceToCells, RegionCells};
use crate::engine::{Executor, RunStats};
use crate::error::{Error, Result};
use crate::format::encode::BlockEncode;
use crate::format::ome::{self, ScaleLevel, Window, WindowOf, WorldAxis};
use crate::format::{precomputed, BlockFormat, PyramidKind};
use crate::input::InputArray;
use crate::output::directory::{
    finish_array, write_atomically, DirectorySink, OutputSpec, PartOutput,
};
use crate::output::filetree::output_file_shape;
use crate::output::job;
use crate::plan::pyramid::{rows_per_pass, Downsample, Pyramid};
use crate::plan::Plan;

/// Where level `k` of a pyramid of `levels` levels goes, relative to OUT
/// (`None`: OUT itself).
pub fn level_dir(format: BlockFormat, levels: usize, k: usize) -> Option<String> {
    (format.levels_in_own_dirs(levels) || k > 0).then(|| k.to_string())
}

/// Checks that `format` can hold a pyramid over an array of `shape` and
/// `dtype` in blocks of `block` (internal order), read from
/// `input_format` placed in the world by `space`, and gives its axes as
/// viewers see them, and whether the input's affine had a rotation they
/// cannot carry.
pub fn pyramid_axes(
    format: BlockFormat,
    input_format: BlockFormat,
    space: &Space,
    shape: &[u64],
    block: &[u64],
    dtype: crate::DType,
) -> Result<(Vec<WorldAxis>, bool)> {
    format.check_pyramid(shape, block, dtype)?;
    let leading_is_time = input_format.traits().leading_axis_is_time;
    ome::world_axes(space, shape.len(), leading_is_time)
}

/// How `format`'s files are shaped around a level's blocks.
pub fn files_of(format: BlockFormat) -> impl Fn(&Partition) -> FileShape {
    move |grid| output_file_shape(format, grid)
}

/// What the pyramid's metadata needs beyond its levels.
pub struct PyramidOutput<'a> {
    pub pyramid: &'a Pyramid,
    pub spec: &'a OutputSpec,
    /// The axes as viewers see them (OME-Zarr, precomputed).
    pub axes: &'a [WorldAxis],
    pub mem: Option<u64>,
    /// For the levels' `rechunkfs.json` (raw blocks).
    pub input_block: &'a [u64],
    pub source: &'a Path,
}

/// The levels built so far: removed when dropped, unless kept.
#[derive(Default)]
pub struct BuiltLevels {
    sinks: Vec<DirectorySink>,
    dirs: Vec<PathBuf>,
    metadata: Vec<PathBuf>,
    kept: bool,
    pub stats: Vec<PyramidStats>,
    /// Level 0's range of values, once level 1 has read it all.
    pub window: Option<Window>,
}

impl BuiltLevels {
    fn keep(mut self) -> BuiltLevels {
        self.kept = true;
        self
    }
}

impl Drop for BuiltLevels {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        for sink in &mut self.sinks {
            sink.discard();
        }
        for path in &self.metadata {
            let _ = std::fs::remove_file(path);
        }
        for dir in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Builds levels 1.. of `output.pyramid` under `out`, level 0 being in
/// `level0`, then writes the pyramid's metadata. A failure (or `cancel`)
/// removes every level it wrote.
pub fn build_levels(
    out: &Path,
    level0: &mut DirectorySink,
    output: &PyramidOutput,
    cancel: Option<&AtomicBool>,
) -> Result<BuiltLevels> {
    let PyramidOutput { pyramid, spec, .. } = output;
    let format = spec.format;
    let files = files_of(format);
    let mut built = BuiltLevels::default();
    let n = pyramid.levels.len();
    for k in 1..n {
        let mut sink = open_level(out, output, k, &mut built)?;
        let rows = rows_per_pass(pyramid, &files, k, spec.dtype.size as u64, output.mem)?;
        let mut builder = LevelBuilder::new(pyramid, &files, k, rows, spec.dtype);
        let below = built.sinks.last_mut().unwrap_or(&mut *level0);
        let watched = (k == 1).then(|| LevelValues::new(&pyramid.levels[0], format, spec.dtype));
        let mut source = SinkFiles {
            sink: below,
            watched,
        };
        for rank in 0..pyramid.levels[k].count() {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                built.sinks.push(sink);
                return Err(Error::Cancelled);
            }
            let result = builder.build(rank, &mut source, &mut sink);
            if let Err(error) = result {
                built.sinks.push(sink);
                return Err(error);
            }
        }
        if let Some(watched) = &source.watched {
            built.window = watched.window();
        }
        let finished = finish_array(&mut sink, output.input_block, output.source);
        built.stats.push(builder.stats);
        built.sinks.push(sink);
        finished?;
    }
    write_metadata(out, output, &mut built)?;
    Ok(built.keep())
}

/// Makes level `k`'s directory under `out` (recorded in `built`, which
/// removes it on failure) and the sink its blocks are written through.
fn open_level(
    out: &Path,
    output: &PyramidOutput,
    k: usize,
    built: &mut BuiltLevels,
) -> Result<DirectorySink> {
    let PyramidOutput { pyramid, spec, .. } = output;
    let dir = out.join(level_dir(spec.format, pyramid.levels.len(), k).unwrap_or_default());
    let level_spec = level_spec(spec, pyramid, k);
    let level = PartOutput::whole(&pyramid.levels[k]);
    let there = match std::fs::create_dir(&dir) {
        Ok(()) => false,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => true,
        Err(e) => return Err(Error::io(&dir, "creating a level's directory", e)),
    };
    let sink = DirectorySink::new(&dir, pyramid.levels[k].clone(), level_spec, level)?;
    if there {
        // A run killed while building its levels with level 0 leaves their
        // directories holding its temporaries only: taken back once those
        // are gone. Anything else is another pyramid's.
        let is_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        if is_dir {
            sink.remove_stale_temporaries(None)?;
        }
        if !is_dir || !holds_only_directories(&dir) {
            return Err(Error::BadOutput {
                path: dir,
                problem: "is there already (--overwrite replaces level 0's blocks, not other \
                          levels' directories): remove it, or choose another OUT"
                    .into(),
            });
        }
    }
    built.dirs.push(dir);
    Ok(sink)
}

/// Whether `dir` holds nothing but directories that hold nothing else
/// (links are not followed: one is something else).
fn holds_only_directories(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.into_iter().all(|entry| {
        entry.is_ok_and(|entry| {
            entry.file_type().is_ok_and(|t| t.is_dir()) && holds_only_directories(&entry.path())
        })
    })
}

/// Rechunks `input` by `plan` into `level0` (level 0's directory under
/// `out`) with levels 1.. of `output.pyramid` built in memory from level
/// 0's blocks as they are written ([`LevelStream`]), then the pyramid's
/// metadata. For a plan whose pyramid cost is streamed
/// ([`crate::plan::pyramid::stream_cost`]). A failure (or `cancel`)
/// removes every level it wrote, level 0 included.
pub fn rechunk_streaming_levels(
    input: &InputArray,
    plan: &Plan,
    (out, level0): (&Path, &Path),
    output: &PyramidOutput,
    cancel: Option<&AtomicBool>,
    progress: impl FnMut(&RunStats),
) -> Result<(RunStats, BuiltLevels)> {
    let PyramidOutput { pyramid, spec, .. } = output;
    let mut built = BuiltLevels::default();
    let mut sink0 = DirectorySink::new(
        level0,
        plan.output.clone(),
        (*spec).clone(),
        PartOutput::of_plan(plan, 0),
    )?;
    let run = (|| {
        for k in 1..pyramid.levels.len() {
            let sink = open_level(out, output, k, &mut built)?;
            built.sinks.push(sink);
        }
        let files = files_of(spec.format);
        let mut streaming = Streaming {
            level0: &mut sink0,
            levels: &mut built.sinks,
            stream: LevelStream::new(pyramid, &files, spec.dtype, plan.problem.workers),
            cells: Arc::new(CellMaker::new(pyramid, spec.dtype)),
            window: WindowOf::new(spec.dtype),
        };
        let mut executor = Executor::new(plan, input);
        if let Some(cancel) = cancel {
            executor = executor.with_cancel(cancel);
        }
        let stats = executor.run(&mut streaming, progress)?;
        if !streaming.stream.finished() {
            return Err(Error::BadArgument(
                "plan error: level 0 was written but a pyramid block is not complete".into(),
            ));
        }
        let (stream_stats, window) = (streaming.stream.stats, streaming.window.window());
        finish_array(&mut sink0, output.input_block, output.source)?;
        for sink in &mut built.sinks {
            finish_array(sink, output.input_block, output.source)?;
        }
        built.stats = stream_stats;
        built.window = window;
        write_metadata(out, output, &mut built)?;
        Ok(stats)
    })();
    match run {
        Ok(stats) => Ok((stats, built.keep())),
        Err(error) => {
            sink0.discard();
            Err(error)
        }
    }
}

/// Level 0's sink, passing what is written on to the levels below.
struct Streaming<'a, 'p> {
    level0: &'a mut DirectorySink,
    levels: &'a mut [DirectorySink],
    stream: LevelStream<'p>,
    /// How the workers reduce each region of level 0 they write.
    cells: Arc<CellMaker>,
    /// Level 0's range of values, from every region written.
    window: WindowOf,
}

impl BlockSink for Streaming<'_, '_> {
    fn target(&mut self, rank: u64) -> Result<OutputTarget<'_>> {
        self.level0.target(rank)
    }
    fn encoder(&self) -> Option<Arc<dyn BlockEncode>> {
        self.level0.encoder()
    }
    fn complete(&mut self, rank: u64) -> Result<()> {
        self.level0.complete(rank)
    }
    fn wants(&mut self, rank: u64) -> bool {
        self.level0.wants(rank)
    }
    fn between_steps(&mut self, stats: &RunStats) -> Result<()> {
        self.level0.between_steps(stats)
    }
    fn no_space(&mut self, error: Error) -> Result<()> {
        self.level0.no_space(error)
    }
    fn takes_cells(&self) -> Option<Arc<dyn ReduceToCells>> {
        Some(self.cells.clone())
    }
    fn written(&mut self, batch: Vec<RegionCells>) -> Result<()> {
        for taken in &batch {
            self.window.include(taken.window.window());
        }
        self.stream.take(batch, self.levels)
    }
}

/// The pyramid's metadata ([`pyramid_metadata`]), and each Zarr v3
/// level's `dimension_names`.
fn write_metadata(out: &Path, output: &PyramidOutput, built: &mut BuiltLevels) -> Result<()> {
    let PyramidOutput {
        pyramid,
        spec,
        axes,
        ..
    } = output;
    if is_ome_group(spec, pyramid) && zarr3(spec) {
        for k in 0..pyramid.levels.len() {
            let path = out.join(k.to_string()).join("zarr.json");
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, "reading", e))?;
            let bytes = level_array_metadata(spec, pyramid, bytes, axes);
            write_atomically(&path, &bytes, &job::run_tag(0))?;
        }
    }
    for (name, bytes) in pyramid_metadata(spec, pyramid, axes, built.window) {
        let path = out.join(name);
        built.metadata.push(path.clone());
        write_atomically(&path, &bytes, &job::run_tag(0))?;
    }
    File::open(out)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(out, "syncing the directory", e))
}

/// Whether `pyramid`, written as `spec` says, is an OME-Zarr image: a
/// Zarr group of one array per level. A Zarr pyramid of one level is that
/// array alone.
pub fn is_ome_group(spec: &OutputSpec, pyramid: &Pyramid) -> bool {
    matches!(spec.format.traits().pyramid, PyramidKind::OmeZarr { .. }) && pyramid.levels.len() > 1
}

/// Whether `spec` writes Zarr v3 OME-Zarr (0.5), whose level arrays name their dimensions.
fn zarr3(spec: &OutputSpec) -> bool {
    spec.format.traits().pyramid == PyramidKind::OmeZarr { zarr3: true }
}

/// The files describing `pyramid` (with `axes` as viewers see them),
/// written as `spec` says, at the top of its output: the OME-Zarr group's
/// metadata, or the precomputed `info`, each with level 0's display
/// `window` once it is known (`omero`; `rechunkfs.window`). None for block
/// files, whose levels describe themselves, nor for a Zarr pyramid of one
/// level. `rechunk` writes these bytes and a view serves them.
pub fn pyramid_metadata(
    spec: &OutputSpec,
    pyramid: &Pyramid,
    axes: &[WorldAxis],
    window: Option<Window>,
) -> Vec<(&'static str, Vec<u8>)> {
    let levels: Vec<ScaleLevel> = scale_levels(pyramid);
    if spec.format.traits().pyramid == PyramidKind::Precomputed {
        let labels = pyramid.method != Downsample::Mean;
        let segmentation = precomputed::is_segmentation(spec.dtype, labels);
        let info = precomputed::info(axes, &levels, spec.dtype, segmentation);
        return vec![("info", ome::with_window(info, window))];
    }
    if !is_ome_group(spec, pyramid) {
        return Vec::new();
    }
    ome::group_files(axes, &levels, pyramid.method.name(), zarr3(spec), window)
}

/// A level's array metadata file `bytes` as the pyramid holds it: in an
/// OME-Zarr 0.5 image (Zarr v3), with `dimension_names` matching the axes.
pub fn level_array_metadata(
    spec: &OutputSpec,
    pyramid: &Pyramid,
    bytes: Vec<u8>,
    axes: &[WorldAxis],
) -> Vec<u8> {
    if is_ome_group(spec, pyramid) && zarr3(spec) {
        ome::with_dimension_names(bytes, axes)
    } else {
        bytes
    }
}

/// The description of level `k` of `pyramid` written as `spec` says: its
/// space scaled for a downsampled level.
pub fn level_spec(spec: &OutputSpec, pyramid: &Pyramid, k: usize) -> OutputSpec {
    if k == 0 {
        return spec.clone();
    }
    OutputSpec {
        space: level_space(&spec.space, &pyramid.scale(k)),
        ..spec.clone()
    }
}

/// The world space of a level whose voxels are `scale` level-0 voxels
/// long (internal order): each axis's step scaled, and voxel 0 moved to
/// the centre of the level-0 voxels it covers.
pub fn level_space(space: &Space, scale: &[u64]) -> Space {
    let mut level = space.clone();
    let ndim = scale.len();
    for nifti_axis in 0..ndim.min(3) {
        let factor = scale[ndim - 1 - nifti_axis] as f64;
        for row in level.affine.iter_mut() {
            row[3] += row[nifti_axis] * (factor - 1.0) / 2.0;
            row[nifti_axis] *= factor;
        }
        if let Some(zoom) = level.zooms.get_mut(nifti_axis) {
            *zoom *= factor;
        }
    }
    level
}

/// Each level's shape, blocks and voxel size in level-0 voxels.
pub fn scale_levels(pyramid: &Pyramid) -> Vec<ScaleLevel> {
    pyramid
        .levels
        .iter()
        .enumerate()
        .map(|(k, grid)| ScaleLevel {
            shape: grid.array_shape(),
            block: (0..grid.ndim()).map(|d| grid.axis(d).extent(0)).collect(),
            factor: pyramid.scale(k),
        })
        .collect()
}

/// A finished level's blocks, read back from their committed files.
struct SinkFiles<'a> {
    sink: &'a mut DirectorySink,
    /// The level's values, watched as they are read.
    watched: Option<LevelValues>,
}

impl LevelFiles for SinkFiles<'_> {
    fn read_data(&mut self, rank: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (path, data_offset) = self.sink.committed_block(rank)?;
        let file = File::open(&path).map_err(|e| Error::io(&path, "opening", e))?;
        file.read_exact_at(buf, data_offset + offset)
            .map_err(|e| Error::io(&path, "reading back", e))?;
        if let Some(watched) = &mut self.watched {
            watched.observe(rank, offset, buf);
        }
        Ok(())
    }
}

/// The range of a level's values, from whole rows (along the first axis)
/// of its block files as they are read: the voxels of each row that are
/// the block's, not the padding of an edge block's file.
pub struct LevelValues {
    grid: Partition,
    files: FileShape,
    elem: u64,
    range: WindowOf,
}

impl LevelValues {
    /// Watches the values of `grid`'s blocks, in `format`'s files of `dtype`.
    pub fn new(grid: &Partition, format: BlockFormat, dtype: crate::DType) -> LevelValues {
        LevelValues {
            grid: grid.clone(),
            files: files_of(format)(grid),
            elem: dtype.size as u64,
            range: WindowOf::new(dtype),
        }
    }

    /// Goes on from `window`, the range of values seen before.
    pub fn seen(mut self, window: Option<Window>) -> LevelValues {
        self.range = self.range.seen(window);
        self
    }

    /// The range of the values observed, if any was finite.
    pub fn window(&self) -> Option<Window> {
        self.range.window()
    }

    /// Takes in `rows`, the bytes at `offset` in the data of block
    /// `rank`'s file (whole rows along the first axis from a row's start;
    /// others are ignored).
    pub fn observe(&mut self, rank: u64, offset: u64, rows: &[u8]) {
        let block = self.grid.block(&self.grid.unravel(rank));
        let file = self.files.file_box(&block).shape;
        let ndim = file.len();
        let row_len = volume(&file[1..]) * self.elem;
        // Pyramids have 2 axes or more; reads start on a row.
        if ndim < 2 || row_len == 0 || offset % row_len != 0 {
            return;
        }
        let row_strides = strides(&file[1..]);
        let middle: Vec<usize> = block.shape[1..ndim - 1]
            .iter()
            .map(|&n| n as usize)
            .collect();
        let line = (block.shape[ndim - 1] * self.elem) as usize;
        let rows_in_block = block.shape[0].saturating_sub(offset / row_len) as usize;
        if file[1..] == block.shape[1..] {
            // No padding across a row: the rows are the block's voxels, whole.
            let len = (rows_in_block * row_len as usize).min(rows.len());
            self.range.observe(&rows[..len]);
            return;
        }
        for row in rows.chunks_exact(row_len as usize).take(rows_in_block) {
            // Each line along the last axis that lies in the block.
            for index in IndexBox::grid(&middle) {
                let coords: Vec<u64> = index.iter().map(|&i| i as u64).chain([0]).collect();
                let start = (linear_offset(&coords, &row_strides) * self.elem) as usize;
                if let Some(bytes) = row.get(start..start + line) {
                    self.range.observe(bytes);
                }
            }
        }
    }
}
