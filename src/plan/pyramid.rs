//! Multiscale pyramids: the levels below the rechunked array (level 0),
//! each downsampled from the one before by per-axis factors, and what
//! building them costs, predicted exactly.
//!
//! Level k+1 has shape `ceil(L_k / f)` and blocks of the output block
//! shape capped at its size. Its block `j` is computed from the box of
//! level k that starts at `j·B_{k+1}·f`, which is aligned to level k's
//! blocks: every level-k block belongs to exactly one level-(k+1) block's
//! source box, so a level is read back once, whole.
//!
//! One level-(k+1) block is built at a time, in passes of at most `rows`
//! of its rows along the first axis (the whole block when it fits in
//! memory): each pass reads, per level-k file it meets, the rows it needs
//! in one call (rows of a C-order file are contiguous), gathers them into
//! one slab and downsamples the slab. The memory held is three buffers,
//! sized for the first (largest) block and reused: the output block's
//! file, the slab, and one file's rows as read.
//!
//! `rechunk` can instead build the levels in memory as level 0 is written
//! ([`stream_cost`]): each region of level 0 the writer hands on makes
//! whole cells of one level-1 block, which is held until complete, then
//! written and passed on. The workers that write a batch of regions
//! downsample them into their cells, a slab of rows at a time; the cells
//! of a batch are held until the writer has placed them. A [`StreamBook`]
//! run over the plan's batches in the writer's order gives the bytes held
//! exactly; the engine keeps the same book.

use serde::Serialize;

use crate::array::axes::AxisOrder;
use std::collections::HashMap;

use crate::array::geometry::{volume, FileShape, IndexBox, Partition, Region};
use crate::array::units::parse_shape;
use crate::error::{Error, Result};
use crate::format::BlockFormat;
use crate::plan::Plan;

/// How a cell of `f0 × f1 × …` voxels becomes one voxel, following
/// TensorStore's `downsample` methods of the same names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Downsample {
    /// The arithmetic mean; integers rounded to nearest, ties to even.
    Mean,
    /// The most frequent value; among equally frequent ones, the smallest.
    Mode,
    /// The cell's first voxel (TensorStore's `stride`).
    Nearest,
}

impl Downsample {
    pub fn name(self) -> &'static str {
        match self {
            Downsample::Mean => "mean",
            Downsample::Mode => "mode",
            Downsample::Nearest => "nearest",
        }
    }
}

impl std::str::FromStr for Downsample {
    type Err = Error;
    fn from_str(text: &str) -> Result<Downsample> {
        match text.trim().to_ascii_lowercase().as_str() {
            "mean" => Ok(Downsample::Mean),
            "mode" => Ok(Downsample::Mode),
            "nearest" | "stride" => Ok(Downsample::Nearest),
            other => Err(Error::BadArgument(format!(
                "unknown downsampling '{other}': use mean (intensities), mode or nearest (labels)"
            ))),
        }
    }
}

/// How many levels to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LevelCount {
    /// This many levels in all, level 0 included.
    Exactly(usize),
    /// Until a level fits in one block along every downsampled axis.
    Auto,
}

impl std::str::FromStr for LevelCount {
    type Err = Error;
    fn from_str(text: &str) -> Result<LevelCount> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("auto") {
            return Ok(LevelCount::Auto);
        }
        match text.parse::<usize>() {
            Ok(n) if (1..=MAX_LEVELS).contains(&n) => Ok(LevelCount::Exactly(n)),
            _ => Err(Error::BadArgument(format!(
                "--levels {text}: give a number of levels from 1 to {MAX_LEVELS} (level 0, \
                 the full resolution, included) or auto"
            ))),
        }
    }
}

/// More levels than any array of 2^64 voxels halved needs.
pub const MAX_LEVELS: usize = 64;

/// `--levels`, `--factors` and `--downsample` as given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyramidFlags {
    pub levels: Option<String>,
    pub factors: Option<String>,
    pub downsample: String,
}

impl PyramidFlags {
    /// The pyramid these flags ask for over an array of `shape` (internal
    /// order) in blocks of `block`, written as `format`; `None` when there
    /// is none to make (no `--levels`, or one level, and a format whose
    /// output is not always a pyramid, as precomputed's is).
    pub fn pyramid(
        &self,
        shape: &[u64],
        block: &[u64],
        order: AxisOrder,
        format: BlockFormat,
    ) -> Result<Option<Pyramid>> {
        let always = format.always_a_pyramid();
        let count = match &self.levels {
            Some(text) => text.parse::<LevelCount>()?,
            None if always => LevelCount::Exactly(1),
            None => return Ok(None),
        };
        let method: Downsample = self.downsample.parse()?;
        let factors = factors_of(self.factors.as_deref(), shape.len(), order)?;
        if count == LevelCount::Exactly(1) && !always {
            return Ok(None);
        }
        Pyramid::new(shape, block, factors, count, method).map(Some)
    }

    /// A short description, to tell staging areas of different pyramids apart.
    pub fn describe(&self) -> String {
        format!(
            "levels {} factors {} {}",
            self.levels.as_deref().unwrap_or("1"),
            self.factors.as_deref().unwrap_or("2"),
            self.downsample
        )
    }
}

/// `--factors` (per spatial axis, in the user's order, or per axis) as
/// factors per internal axis; 2 along each spatial axis by default.
fn factors_of(text: Option<&str>, ndim: usize, order: AxisOrder) -> Result<Vec<u64>> {
    let spatial = spatial_dims(ndim);
    let Some(text) = text else {
        return Ok((0..ndim)
            .map(|d| if spatial.contains(&d) { 2 } else { 1 })
            .collect());
    };
    let given = parse_shape(text)?;
    let user: Vec<u64> = if given.len() == ndim {
        given
    } else if given.len() == spatial.len() {
        // The spatial axes are the last internal ones: the user's first
        // ones when the user's order is reversed (NIfTI).
        let rest = vec![1; ndim - spatial.len()];
        match order {
            AxisOrder::C => [rest, given].concat(),
            _ => [given, rest].concat(),
        }
    } else {
        return Err(Error::BadArgument(format!(
            "--factors {text} has {} values; give one per spatial axis ({}) or one per axis ({ndim})",
            given.len(),
            spatial.len()
        )));
    };
    let internal = order.to_internal(&user);
    if let Some(d) = (0..ndim).find(|&d| !spatial.contains(&d) && internal[d] != 1) {
        return Err(Error::BadArgument(format!(
            "--factors {text}: axis {} is not spatial (the spatial axes are the last three in C \
             order) and is kept whole: give it a factor of 1",
            order.user_axis(d, ndim)
        )));
    }
    Ok(internal)
}

/// Spatial axes: the last three in C order (fewer in a smaller array).
pub fn spatial_dims(ndim: usize) -> std::ops::Range<usize> {
    ndim.saturating_sub(3)..ndim
}

/// The levels of a pyramid over an array and how each is built.
#[derive(Clone, Debug)]
pub struct Pyramid {
    /// Factors per internal axis (1 on non-spatial axes).
    pub factors: Vec<u64>,
    pub method: Downsample,
    /// Level 0 (the rechunked array), then each downsampled level: its
    /// blocks (the output block shape capped at the level's size).
    pub levels: Vec<Partition>,
}

impl Pyramid {
    /// The levels over `array` in blocks of `block`: `count` of them, or
    /// as many as `Auto` asks. `factors` are per internal axis.
    pub fn new(
        array: &[u64],
        block: &[u64],
        factors: Vec<u64>,
        count: LevelCount,
        method: Downsample,
    ) -> Result<Pyramid> {
        if factors.iter().all(|&f| f == 1) {
            return Err(Error::BadArgument(
                "--factors are all 1: every level would be level 0; give a factor of 2 or more \
                 along some axis"
                    .into(),
            ));
        }
        let mut shape = array.to_vec();
        let mut levels = vec![level_grid(&shape, block)];
        loop {
            let done = match count {
                LevelCount::Exactly(n) => levels.len() >= n,
                LevelCount::Auto => fits_one_block(&shape, block, &factors),
            };
            if done || levels.len() >= MAX_LEVELS {
                break;
            }
            shape = downsampled_shape(&shape, &factors);
            levels.push(level_grid(&shape, block));
        }
        Ok(Pyramid {
            factors,
            method,
            levels,
        })
    }

    /// Cumulative factor of level `k` along each axis (its voxel size in
    /// level-0 voxels).
    pub fn scale(&self, k: usize) -> Vec<u64> {
        self.factors
            .iter()
            .map(|&f| f.saturating_pow(k as u32))
            .collect()
    }

    /// The box of level `k - 1` that level `k`'s block `index` is computed from.
    pub fn source_box(&self, k: usize, index: &[usize]) -> crate::array::geometry::Region {
        let block = self.levels[k].block(index);
        let below = self.levels[k - 1].array_shape();
        let origin: Vec<u64> = (0..block.ndim())
            .map(|d| block.origin[d] * self.factors[d])
            .collect();
        let shape = (0..block.ndim())
            .map(|d| (block.end(d) * self.factors[d]).min(below[d]) - origin[d])
            .collect();
        crate::array::geometry::Region::new(origin, shape)
    }
}

fn level_grid(shape: &[u64], block: &[u64]) -> Partition {
    let capped: Vec<u64> = shape.iter().zip(block).map(|(&s, &b)| s.min(b)).collect();
    Partition::regular(shape, &capped)
}

/// `ceil(shape / factors)`: a last, partial cell still makes a voxel.
pub fn downsampled_shape(shape: &[u64], factors: &[u64]) -> Vec<u64> {
    shape
        .iter()
        .zip(factors)
        .map(|(&s, &f)| s.div_ceil(f))
        .collect()
}

/// Whether a level of `shape` fits in one block along every axis that is
/// downsampled, or can be downsampled no further.
fn fits_one_block(shape: &[u64], block: &[u64], factors: &[u64]) -> bool {
    let fits = (0..shape.len()).all(|d| factors[d] == 1 || shape[d] <= block[d]);
    let flat = (0..shape.len()).all(|d| factors[d] == 1 || shape[d] == 1);
    fits || flat
}

/// What building the levels below level 0 costs, predicted exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PyramidCost {
    /// Per level from 1: its cost.
    pub levels: Vec<LevelCost>,
    /// The most bytes held at once building any level.
    pub peak_bytes: u64,
    /// Whether the levels are built in memory as level 0 is written
    /// ([`stream_cost`]), not read back after it.
    pub streamed: bool,
    /// Why they are read back, when the plan could not stream them.
    pub read_back_because: Option<String>,
}

impl PyramidCost {
    pub fn total(&self) -> LevelCost {
        self.levels
            .iter()
            .fold(LevelCost::default(), |sum, level| LevelCost {
                blocks: sum.blocks + level.blocks,
                rows_per_pass: sum.rows_per_pass.max(level.rows_per_pass),
                reads: sum.reads + level.reads,
                bytes_read: sum.bytes_read + level.bytes_read,
                writes: sum.writes + level.writes,
                bytes_written: sum.bytes_written + level.bytes_written,
                peak_bytes: sum.peak_bytes.max(level.peak_bytes),
            })
    }
}

/// One level's blocks, the calls reading level k back and writing level k+1, and memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LevelCost {
    pub blocks: u64,
    /// Output rows (first axis) computed per pass.
    pub rows_per_pass: u64,
    pub reads: u64,
    pub bytes_read: u64,
    pub writes: u64,
    pub bytes_written: u64,
    pub peak_bytes: u64,
}

/// The buffers building level `k` holds, in bytes, for passes of `rows`
/// output rows: (output file, slab, one file's rows).
pub fn level_buffers(
    pyramid: &Pyramid,
    files: &dyn Fn(&Partition) -> FileShape,
    k: usize,
    rows: u64,
    elem: u64,
) -> (u64, u64, u64) {
    let level = &pyramid.levels[k];
    let below = &pyramid.levels[k - 1];
    let first = level.block(&vec![0; level.ndim()]);
    let out = volume(&files(level).file_box(&first).shape) * elem;
    let source = pyramid.source_box(k, &vec![0; level.ndim()]);
    let src_rows = (rows * pyramid.factors[0]).min(source.shape[0]);
    let slab = src_rows * volume(&source.shape[1..]) * elem;
    let below_first = files(below).file_box(&below.block(&vec![0; below.ndim()]));
    let file_rows = src_rows.min(below_first.shape[0]);
    let scratch = file_rows * volume(&below_first.shape[1..]) * elem;
    (out, slab, scratch)
}

/// The cost of building every level below level 0 of `pyramid`, each pass
/// as many rows as `mem` allows (the whole block when it fits); `files`
/// says how a level's files are shaped around its blocks.
pub fn pyramid_cost(
    pyramid: &Pyramid,
    files: &dyn Fn(&Partition) -> FileShape,
    elem: u64,
    mem: Option<u64>,
) -> Result<PyramidCost> {
    let mut cost = PyramidCost::default();
    for k in 1..pyramid.levels.len() {
        let rows = rows_per_pass(pyramid, files, k, elem, mem)?;
        let level = level_cost(pyramid, files, k, rows, elem);
        cost.peak_bytes = cost.peak_bytes.max(level.peak_bytes);
        cost.levels.push(level);
    }
    Ok(cost)
}

/// The most output rows a pass of level `k` may take within `mem`.
pub fn rows_per_pass(
    pyramid: &Pyramid,
    files: &dyn Fn(&Partition) -> FileShape,
    k: usize,
    elem: u64,
    mem: Option<u64>,
) -> Result<u64> {
    let block_rows = pyramid.levels[k].axis(0).extent(0);
    let held = |rows| {
        let (out, slab, scratch) = level_buffers(pyramid, files, k, rows, elem);
        out + slab + scratch
    };
    let Some(mem) = mem else {
        return Ok(block_rows);
    };
    if held(1) > mem {
        return Err(Error::BadArgument(format!(
            "building pyramid level {k} needs at least {} of memory (one block and the rows it \
             comes from), more than the {} allowed; give more --mem or a smaller --shape",
            crate::array::units::show_bytes(held(1)),
            crate::array::units::show_bytes(mem)
        )));
    }
    // Held bytes grow with rows: the largest that fits, by bisection.
    let (mut fits, mut too_many) = (1, block_rows + 1);
    while too_many - fits > 1 {
        let mid = (fits + too_many) / 2;
        if held(mid) <= mem {
            fits = mid;
        } else {
            too_many = mid;
        }
    }
    Ok(fits)
}

/// Level `k`'s cost with passes of `rows` output rows.
fn level_cost(
    pyramid: &Pyramid,
    files: &dyn Fn(&Partition) -> FileShape,
    k: usize,
    rows: u64,
    elem: u64,
) -> LevelCost {
    let level = &pyramid.levels[k];
    let below = &pyramid.levels[k - 1];
    let (out, slab, scratch) = level_buffers(pyramid, files, k, rows, elem);
    // Along every axis but the first, each level-k block is read in every
    // pass of the one block whose source box holds it.
    let across: u64 = (1..below.ndim())
        .map(|d| below.axis(d).count() as u64)
        .product();
    let f0 = pyramid.factors[0];
    let (mut reads_down, mut row_bytes) = (0u64, 0u64);
    let level_axis = level.axis(0);
    let below_axis = below.axis(0);
    for j in 0..level_axis.count() {
        let mut start = level_axis.start(j);
        while start < level_axis.end(j) {
            let end = (start + rows).min(level_axis.end(j));
            let (src_start, src_end) = (start * f0, (end * f0).min(below_axis.len()));
            reads_down += below_axis.overlapping(src_start, src_end).len() as u64;
            row_bytes += src_end - src_start;
            start = end;
        }
    }
    let below_files = files(below);
    let cross_bytes = (1..below.ndim())
        .map(|d| axis_file_extents(below, &below_files, d))
        .product::<u64>()
        * elem;
    let level_files = files(level);
    let bytes_written = (0..level.ndim())
        .map(|d| axis_file_extents(level, &level_files, d))
        .product::<u64>()
        * elem;
    LevelCost {
        blocks: level.count(),
        rows_per_pass: rows,
        reads: reads_down * across,
        bytes_read: row_bytes * cross_bytes,
        writes: level.count(),
        bytes_written,
        peak_bytes: out + slab + scratch,
    }
}

/// The sum, over the blocks along axis `d` of `grid`, of their files'
/// extents along it (a file's volume is the product of its extents, so
/// sums of volumes over a grid are products of these).
fn axis_file_extents(grid: &Partition, files: &FileShape, d: usize) -> u64 {
    let axis = grid.axis(d);
    (0..axis.count())
        .map(|i| files.file_extent(d, axis.extent(i)))
        .sum()
}

/// Output blocks the writer makes files for and hands to its workers at
/// once, within a slab: the cells its workers make of a batch's regions
/// are held together until the writer places them.
pub const WRITE_BATCH_BLOCKS: usize = 64;

/// Level 0's regions in the order the writer hands them on as they are
/// written, in the writer's batches: per read block in the plan's order,
/// the slabs of the write block it completes, one per step (the first
/// also taking what earlier read blocks hold), each cut by the output
/// blocks it meets, C order, [`WRITE_BATCH_BLOCKS`] at a time.
pub fn written_batches(plan: &Plan) -> impl Iterator<Item = Vec<Region>> + '_ {
    let step_axis = plan.steps.axis(0);
    plan.read_blocks_in_order().flat_map(move |read_index| {
        let read_box = plan.read.block(&read_index);
        let write_box = plan
            .completed_write_block(&read_index)
            .map(|index| plan.write.block(&index));
        let steps = step_axis.overlapping(read_box.origin[0], read_box.end(0));
        let first = steps.start;
        steps
            .filter_map(move |step| {
                let write_box = write_box.as_ref()?;
                let from = if step == first {
                    0
                } else {
                    step_axis.start(step)
                };
                let start = write_box.origin[0].max(from);
                let end = write_box.end(0).min(step_axis.end(step));
                (start < end).then(|| {
                    let mut slab = write_box.clone();
                    slab.origin[0] = start;
                    slab.shape[0] = end - start;
                    slab
                })
            })
            .flat_map(move |slab| {
                let regions: Vec<Region> = IndexBox::new(plan.output.overlapping(&slab))
                    .filter_map(|index| plan.output.block(&index).intersect(&slab))
                    .collect();
                regions
                    .chunks(WRITE_BATCH_BLOCKS)
                    .map(<[Region]>::to_vec)
                    .collect::<Vec<_>>()
            })
    })
}

/// The cells of level `k + 1` that a region of level `k` makes, and the
/// block of level `k + 1` they lie in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub rank: u64,
    pub cells: Region,
    /// Its last voxel came with these cells: the block is done.
    pub complete: bool,
}

/// The bookkeeping of levels built in memory from the regions of the
/// level above them as these are written: per level, the blocks begun
/// and the voxels each still waits for, and the bytes held (each block
/// begun held whole until written and passed on, and the fixed scratch
/// of [`stream_scratch`]). The planner and the engine run the same book
/// over the same regions, so what the run holds is what the plan says.
#[derive(Clone, Debug)]
pub struct StreamBook {
    factors: Vec<u64>,
    levels: Vec<Partition>,
    elem: u64,
    open: Vec<HashMap<u64, u64>>,
    held: u64,
    pub peak: u64,
}

/// The buffers streaming holds besides the blocks begun and the cells of
/// a batch: one slab of level-0 rows per worker as it gathers them
/// ([`cell_slab_rows`]), the cells of one level-0 block (for the levels
/// below level 1), and one level file as written (in bytes, together).
pub fn stream_scratch(
    pyramid: &Pyramid,
    files: &dyn Fn(&Partition) -> FileShape,
    elem: u64,
    workers: usize,
) -> u64 {
    let first = |grid: &Partition| grid.block(&vec![0; grid.ndim()]);
    let block0 = first(&pyramid.levels[0]);
    let slab = cell_slab_rows(pyramid, elem) * volume(&block0.shape[1..]);
    let cells = downsampled_shape(&block0.shape, &pyramid.factors);
    let largest_file = pyramid.levels[1..]
        .iter()
        .map(|grid| volume(&files(grid).file_box(&first(grid)).shape))
        .max()
        .unwrap_or(0);
    (slab * workers.max(1) as u64 + volume(&cells) + largest_file) * elem
}

/// Bytes of level-0 rows a worker gathers at once to downsample: about
/// this many, and at least one row of cells.
const CELL_SLAB_BYTES: u64 = 1 << 20;

/// Rows of level 0 (along the first axis, a multiple of its factor) a
/// worker gathers at once to downsample a region: as many rows of cells
/// as [`CELL_SLAB_BYTES`] holds, at least one, at most a block's.
pub fn cell_slab_rows(pyramid: &Pyramid, elem: u64) -> u64 {
    let level0 = &pyramid.levels[0];
    let block0 = level0.block(&vec![0; level0.ndim()]);
    let f0 = pyramid.factors[0];
    let plane = volume(&block0.shape[1..]) * elem;
    let cell_rows = (CELL_SLAB_BYTES / (f0 * plane).max(1)).max(1);
    (cell_rows * f0).min(block0.shape[0].div_ceil(f0) * f0)
}

/// Bytes of the cells of level 1 that `region` of level 0 makes (whole
/// cells: a last one cut by the array's end still makes a voxel).
pub fn cells_bytes(region: &Region, factors: &[u64], elem: u64) -> u64 {
    volume(&downsampled_shape(&region.shape, factors)) * elem
}

impl StreamBook {
    pub fn new(
        pyramid: &Pyramid,
        files: &dyn Fn(&Partition) -> FileShape,
        elem: u64,
        workers: usize,
    ) -> StreamBook {
        let held = stream_scratch(pyramid, files, elem, workers);
        StreamBook {
            factors: pyramid.factors.clone(),
            levels: pyramid.levels.clone(),
            elem,
            open: vec![HashMap::new(); pyramid.levels.len()],
            held,
            peak: held,
        }
    }

    /// Bytes held for one block of level `k` begun: its voxels.
    pub fn block_bytes(&self, k: usize, rank: u64) -> u64 {
        let grid = &self.levels[k];
        grid.block(&grid.unravel(rank)).volume() * self.elem
    }

    /// Takes `region` of level `k` (below the last level): the cells of
    /// level `k + 1` it makes. None when it does not make whole cells (it
    /// cuts one), lies across two blocks of level `k + 1`, or repeats
    /// voxels already taken.
    pub fn take(&mut self, k: usize, region: &Region) -> Option<Taken> {
        let shape = self.levels[k].array_shape();
        let mut origin = Vec::with_capacity(region.ndim());
        let mut end = Vec::with_capacity(region.ndim());
        for (d, (&f, &len)) in self.factors.iter().zip(&shape).enumerate() {
            let (lo, hi) = (region.origin[d], region.end(d));
            if lo % f != 0 || (hi % f != 0 && hi != len) {
                return None;
            }
            origin.push(lo / f);
            end.push(hi.div_ceil(f));
        }
        let level = self.levels.get(k + 1)?;
        let index: Vec<usize> = (0..origin.len())
            .map(|d| level.axis(d).locate(origin[d]))
            .collect();
        let block = level.block(&index);
        if (0..origin.len()).any(|d| end[d] > block.end(d)) {
            return None;
        }
        let rank = level.linear(&index);
        let cells = Region::new(
            origin.clone(),
            origin.iter().zip(&end).map(|(o, e)| e - o).collect(),
        );
        let bytes = self.block_bytes(k + 1, rank);
        if !self.open[k + 1].contains_key(&rank) {
            self.hold(bytes);
        }
        let left = self.open[k + 1].entry(rank).or_insert(block.volume());
        *left = left.checked_sub(cells.volume())?;
        let complete = *left == 0;
        if complete {
            self.open[k + 1].remove(&rank);
        }
        Some(Taken {
            rank,
            cells,
            complete,
        })
    }

    /// Block `rank` of level `k`, complete, is written and passed on.
    pub fn release(&mut self, k: usize, rank: u64) {
        self.let_go(self.block_bytes(k, rank));
    }

    /// `bytes` more are held: a block begun, or the cells of a batch of
    /// level-0 regions as the workers made them.
    pub fn hold(&mut self, bytes: u64) {
        self.held += bytes;
        self.peak = self.peak.max(self.held);
    }

    /// `bytes` held are let go: a block written, or cells placed in theirs.
    pub fn let_go(&mut self, bytes: u64) {
        self.held -= bytes;
    }

    /// Bytes of the cells of level 1 that `region` of level 0 makes.
    pub fn cells_bytes(&self, region: &Region) -> u64 {
        cells_bytes(region, &self.factors, self.elem)
    }

    /// Whether every block begun is done.
    pub fn finished(&self) -> bool {
        self.open.iter().all(HashMap::is_empty)
    }
}

/// Runs `book` over `region` of level `k` and, for each block of level
/// `k + 1` it completes, over that block in turn (down to the last level).
fn feed(book: &mut StreamBook, k: usize, region: &Region) -> Option<()> {
    let taken = book.take(k, region)?;
    if taken.complete {
        if k + 2 < book.levels.len() {
            let grid = &book.levels[k + 1];
            let block = grid.block(&grid.unravel(taken.rank));
            feed(book, k + 1, &block)?;
        }
        book.release(k + 1, taken.rank);
    }
    Some(())
}

/// The cost of building the levels below level 0 in memory as `plan`
/// writes level 0, each level from the blocks of the one above as they
/// complete: nothing read back, every level's blocks written once, whole.
/// Err says why they cannot be (a region of level 0 or a block that cuts
/// a cell, or more memory than `mem` leaves beside level 0's plan).
pub fn stream_cost(
    plan: &Plan,
    pyramid: &Pyramid,
    files: &dyn Fn(&Partition) -> FileShape,
    elem: u64,
    mem: Option<u64>,
) -> std::result::Result<PyramidCost, String> {
    let mut book = StreamBook::new(pyramid, files, elem, plan.problem.workers);
    for batch in written_batches(plan) {
        book.hold(batch.iter().map(|region| book.cells_bytes(region)).sum());
        for region in &batch {
            if feed(&mut book, 0, region).is_none() {
                return Err(
                    "level 0's blocks, or the slabs they are written in, cut the cells of level \
                     1 (their shapes are not multiples of --factors)"
                        .into(),
                );
            }
            book.let_go(book.cells_bytes(region));
        }
    }
    if !book.finished() {
        return Err("level 0's regions do not cover level 1".into());
    }
    let level0 = plan.prediction.peak_bytes;
    if let Some(mem) = mem.filter(|&mem| level0.saturating_add(book.peak) > mem) {
        return Err(format!(
            "building them as level 0 is written holds {} beside level 0's {}, more than the {} \
             allowed",
            crate::array::units::show_bytes(book.peak),
            crate::array::units::show_bytes(level0),
            crate::array::units::show_bytes(mem)
        ));
    }
    let mut cost = PyramidCost {
        peak_bytes: book.peak,
        streamed: true,
        ..PyramidCost::default()
    };
    for k in 1..pyramid.levels.len() {
        let level = &pyramid.levels[k];
        let level_files = files(level);
        let bytes_written = (0..level.ndim())
            .map(|d| axis_file_extents(level, &level_files, d))
            .product::<u64>()
            * elem;
        cost.levels.push(LevelCost {
            blocks: level.count(),
            rows_per_pass: level.axis(0).extent(0),
            reads: 0,
            bytes_read: 0,
            writes: level.count(),
            bytes_written,
            peak_bytes: book.peak,
        });
    }
    Ok(cost)
}

/// The cost of `rechunk`'s pyramid after `plan`: built as level 0 is
/// written when it can be ([`stream_cost`]), else read back ([`pyramid_cost`]).
pub fn rechunk_pyramid_cost(
    plan: &Plan,
    pyramid: &Pyramid,
    files: &dyn Fn(&Partition) -> FileShape,
    elem: u64,
    mem: Option<u64>,
) -> Result<PyramidCost> {
    if pyramid.levels.len() < 2 {
        return pyramid_cost(pyramid, files, elem, mem);
    }
    match stream_cost(plan, pyramid, files, elem, mem) {
        Ok(cost) => Ok(cost),
        Err(because) => Ok(PyramidCost {
            read_back_because: Some(because),
            ..pyramid_cost(pyramid, files, elem, mem)?
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_book_takes_whole_cells_and_holds_each_block_until_done() {
        // 8×6 in blocks of 4×4, by 2: level 1 is 4×3, one 4×3 block.
        let pyramid = Pyramid::new(
            &[8, 6],
            &[4, 4],
            vec![2, 2],
            LevelCount::Exactly(2),
            Downsample::Mean,
        )
        .unwrap();
        let files = |_: &Partition| FileShape::Exact;
        let mut book = StreamBook::new(&pyramid, &files, 2, 3);
        let scratch = stream_scratch(&pyramid, &files, 2, 3);
        // Three workers' slabs of a whole block, the cells of one, a file.
        assert_eq!(scratch, (3 * 16 + 4 + 12) * 2);
        // A region that cuts a cell along the first axis.
        assert_eq!(book.take(0, &Region::new(vec![0, 0], vec![3, 4])), None);
        let mut book = StreamBook::new(&pyramid, &files, 2, 3);
        let first = book.take(0, &Region::new(vec![0, 0], vec![4, 4])).unwrap();
        assert_eq!(first.cells, Region::new(vec![0, 0], vec![2, 2]));
        assert!(!first.complete);
        assert_eq!(book.peak, scratch + 12 * 2);
        for (origin, shape) in [([4, 0], [4, 4]), ([0, 4], [4, 2])] {
            let taken = book.take(0, &Region::new(origin.to_vec(), shape.to_vec()));
            assert!(!taken.unwrap().complete);
        }
        // The edge cells along the second axis are whole: the array ends there.
        let last = book.take(0, &Region::new(vec![4, 4], vec![4, 2])).unwrap();
        assert_eq!(last.cells, Region::new(vec![2, 2], vec![2, 1]));
        assert!(last.complete && book.finished());
        book.release(1, last.rank);
        assert_eq!(book.peak, scratch + 12 * 2);
    }
}
