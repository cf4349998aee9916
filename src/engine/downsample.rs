//! Building a pyramid level's blocks from the level before it: read back
//! from its files ([`LevelBuilder`], the passes and buffers
//! [`crate::plan::pyramid`] plans), or in memory from level 0's regions as
//! they are written ([`LevelStream`], fed the cells the workers make of
//! each region, [`CellMaker`]); and the downsampling of one slab.
//!
//! The rules are TensorStore's `downsample` methods, voxel for voxel: a
//! cell is `f` voxels along each axis from a multiple of `f`, the last one
//! cut short by the array's end (it still makes a voxel, from the voxels
//! it has). `mean` sums in C order within the cell (integers exactly, in
//! 128 bits; `f2` and `f4` in `f32`; `f8` in `f64`) and divides by the
//! cell's voxel count, rounding integers to nearest with ties to even;
//! `mode` takes the most frequent value, the smallest among ties;
//! `nearest` takes the cell's first voxel.

use std::collections::HashMap;
use std::io::IoSlice;

use parking_lot::Mutex;

use half::f16;
use serde::Serialize;

use super::seekio::write_all_at;
use super::sink::{BlockSink, ReduceToCells, RegionCells};
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::geometry::{strides, volume, FileShape, IndexBox, Partition, Region, MAX_DIMS};
use crate::error::{Error, Result};
use crate::format::ome::WindowOf;
use crate::plan::pyramid::{
    cell_slab_rows, downsampled_shape, level_buffers, stream_scratch, Downsample, Pyramid,
    StreamBook,
};

/// Where a level's blocks are read back from.
pub trait LevelFiles {
    /// Reads `buf.len()` bytes of block `rank`'s data region, from byte
    /// `offset` of it, in one call.
    fn read_data(&mut self, rank: u64, offset: u64, buf: &mut [u8]) -> Result<()>;
}

/// What building pyramid levels did: counted, not estimated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PyramidStats {
    pub blocks: u64,
    pub reads: u64,
    pub bytes_read: u64,
    pub writes: u64,
    pub bytes_written: u64,
    pub peak_bytes: u64,
}

/// Builds the blocks of one level (`k ≥ 1`) of a pyramid, in passes of
/// `rows` output rows, with buffers allocated once for the largest block.
pub struct LevelBuilder<'a> {
    pyramid: &'a Pyramid,
    k: usize,
    dtype: DType,
    rows: u64,
    below_files: FileShape,
    level_files: FileShape,
    out: Vec<u8>,
    slab: Vec<u8>,
    scratch: Vec<u8>,
    threads: usize,
    pub stats: PyramidStats,
}

impl<'a> LevelBuilder<'a> {
    pub fn new(
        pyramid: &'a Pyramid,
        files: &dyn Fn(&Partition) -> FileShape,
        k: usize,
        rows: u64,
        dtype: DType,
    ) -> LevelBuilder<'a> {
        let elem = dtype.size as u64;
        let (out, slab, scratch) = level_buffers(pyramid, files, k, rows, elem);
        LevelBuilder {
            pyramid,
            k,
            dtype,
            rows,
            below_files: files(&pyramid.levels[k - 1]),
            level_files: files(&pyramid.levels[k]),
            out: vec![0; out as usize],
            slab: vec![0; slab as usize],
            scratch: vec![0; scratch as usize],
            threads: super::workers::threads(),
            stats: PyramidStats {
                peak_bytes: out + slab + scratch,
                ..PyramidStats::default()
            },
        }
    }

    /// Downsamples with up to `threads` threads (by default
    /// [`workers::threads`](super::workers::threads)).
    pub fn with_threads(mut self, threads: usize) -> LevelBuilder<'a> {
        self.threads = threads.max(1);
        self
    }

    /// Computes block `rank` of the level from `below` and writes it
    /// whole, in one call, into `sink`'s file for it.
    pub fn build(
        &mut self,
        rank: u64,
        below: &mut dyn LevelFiles,
        sink: &mut dyn BlockSink,
    ) -> Result<()> {
        let level = &self.pyramid.levels[self.k];
        let index = level.unravel(rank);
        let block = level.block(&index);
        let file_shape = self.level_files.file_box(&block).shape;
        let elem = self.dtype.size as u64;
        let out_len = (volume(&file_shape) * elem) as usize;
        let out = self
            .out
            .get_mut(..out_len)
            .ok_or_else(|| Error::Internal("pyramid block larger than planned".into()))?;
        out.fill(0);
        let source = self.pyramid.source_box(self.k, &index);
        let f0 = self.pyramid.factors[0];
        let mut start = 0;
        while start < block.shape[0] {
            let end = (start + self.rows).min(block.shape[0]);
            let src_start = start * f0;
            let src_end = (end * f0).min(source.shape[0]);
            let mut origin = source.origin.clone();
            origin[0] += src_start;
            let mut slab_shape = source.shape.clone();
            slab_shape[0] = src_end - src_start;
            let slab_region = Region::new(origin, slab_shape);
            self.gather(&slab_region, below)?;
            let slab_len = (slab_region.volume() * elem) as usize;
            let out = &mut self.out[..out_len];
            downsample(
                &self.slab[..slab_len],
                &slab_region.shape,
                &self.pyramid.factors,
                self.dtype,
                self.pyramid.method,
                out,
                &file_shape,
                start,
                self.threads,
            );
            start = end;
        }
        let target = sink.target(rank)?;
        write_all_at(
            target.file,
            target.path,
            &mut [IoSlice::new(&self.out[..out_len])],
            target.data_offset,
        )?;
        sink.complete(rank)?;
        self.stats.blocks += 1;
        self.stats.writes += 1;
        self.stats.bytes_written += out_len as u64;
        Ok(())
    }

    /// Fills the slab with `region` of the level below, one read per file
    /// it meets: the file's rows in the region, across its whole width.
    fn gather(&mut self, region: &Region, below: &mut dyn LevelFiles) -> Result<()> {
        let grid = &self.pyramid.levels[self.k - 1];
        let elem = self.dtype.size as u64;
        let slab_strides = strides(&region.shape);
        for index in IndexBox::new(grid.overlapping(region)) {
            let block = grid.block(&index);
            let file = self.below_files.file_box(&block).shape;
            let row_len = volume(&file[1..]) * elem;
            let first = region.origin[0].max(block.origin[0]);
            let last = region.end(0).min(block.end(0));
            let len = ((last - first) * row_len) as usize;
            let scratch = self
                .scratch
                .get_mut(..len)
                .ok_or_else(|| Error::Internal("pyramid source rows larger than planned".into()))?;
            below.read_data(
                grid.linear(&index),
                (first - block.origin[0]) * row_len,
                scratch,
            )?;
            self.stats.reads += 1;
            self.stats.bytes_read += len as u64;
            // The block's voxels in these rows, line by line along the last axis.
            let rows_box = Region::new(
                [vec![first], block.origin[1..].to_vec()].concat(),
                [vec![last - first], block.shape[1..].to_vec()].concat(),
            );
            copy_lines(
                &self.scratch[..len],
                &file,
                &rows_box,
                &mut self.slab,
                region,
                &slab_strides,
                elem,
            );
        }
        Ok(())
    }
}

/// Makes level 1's cells of each region of level 0 on the worker that
/// writes it, a slab of rows at a time ([`cell_slab_rows`]), and watches
/// the range of its values: level 1 sees every voxel of level 0. Its
/// slabs are kept for reuse, one per worker at once.
pub struct CellMaker {
    factors: Vec<u64>,
    dtype: DType,
    method: Downsample,
    slab_rows: u64,
    slabs: Mutex<Vec<Vec<u8>>>,
}

impl CellMaker {
    pub fn new(pyramid: &Pyramid, dtype: DType) -> CellMaker {
        CellMaker {
            factors: pyramid.factors.clone(),
            dtype,
            method: pyramid.method,
            slab_rows: cell_slab_rows(pyramid, dtype.size as u64),
            slabs: Mutex::new(Vec::new()),
        }
    }
}

impl ReduceToCells for CellMaker {
    /// The cells of `region` (whose origin is a multiple of the factors).
    fn cells(
        &self,
        region: &Region,
        gather: &mut dyn FnMut(&Region, &mut [u8]) -> Result<()>,
    ) -> Result<RegionCells> {
        let elem = self.dtype.size as u64;
        let cells_shape = downsampled_shape(&region.shape, &self.factors);
        let mut cells = vec![0; (volume(&cells_shape) * elem) as usize];
        let mut window = WindowOf::new(self.dtype);
        let plane = volume(&region.shape[1..]) * elem;
        let mut slab = self.slabs.lock().pop().unwrap_or_default();
        let mut made = || {
            let mut start = 0;
            while start < region.shape[0] {
                let end = (start + self.slab_rows).min(region.shape[0]);
                let mut part = region.clone();
                part.origin[0] += start;
                part.shape[0] = end - start;
                let len = (part.shape[0] * plane) as usize;
                if slab.len() < len {
                    slab.resize(len, 0);
                }
                gather(&part, &mut slab[..len])?;
                window.observe(&slab[..len]);
                downsample(
                    &slab[..len],
                    &part.shape,
                    &self.factors,
                    self.dtype,
                    self.method,
                    &mut cells,
                    &cells_shape,
                    start / self.factors[0],
                    1,
                );
                start = end;
            }
            Ok(())
        };
        let result = made();
        self.slabs.lock().push(slab);
        result.map(|()| RegionCells {
            region: region.clone(),
            cells,
            window,
        })
    }
}

/// Builds every level below level 0 in memory from level 0's regions as
/// they are written ([`BlockSink::written`]), a batch at a time, as the
/// workers reduced them to cells ([`CellMaker`]): each region's cells are
/// placed in the block of level 1 they belong to, held until its last
/// cells come, then written whole, in one call, and downsampled into
/// level 2 the same way, and so on. Needs regions that make whole cells,
/// which [`crate::plan::pyramid::stream_cost`] checks; a cell's voxels
/// are summed in the same order as from a slab, so the bytes are the same.
pub struct LevelStream<'a> {
    pyramid: &'a Pyramid,
    dtype: DType,
    level_files: Vec<FileShape>,
    book: StreamBook,
    /// Per level, the blocks begun (C order, the block's own shape).
    begun: Vec<HashMap<u64, Vec<u8>>>,
    cells: Vec<u8>,
    file: Vec<u8>,
    /// Per level from 1: what building it did.
    pub stats: Vec<PyramidStats>,
}

impl<'a> LevelStream<'a> {
    /// The levels of `pyramid`, from a level 0 written by `workers` workers.
    pub fn new(
        pyramid: &'a Pyramid,
        files: &dyn Fn(&Partition) -> FileShape,
        dtype: DType,
        workers: usize,
    ) -> LevelStream<'a> {
        let elem = dtype.size as u64;
        let level0 = &pyramid.levels[0];
        let block0 = level0.block(&vec![0; level0.ndim()]);
        let cells = volume(&downsampled_shape(&block0.shape, &pyramid.factors)) * elem;
        let slabs = cell_slab_rows(pyramid, elem)
            * volume(&block0.shape[1..])
            * elem
            * workers.max(1) as u64;
        // The rest of the scratch: one level file, the largest.
        let file = stream_scratch(pyramid, files, elem, workers) - slabs - cells;
        LevelStream {
            pyramid,
            dtype,
            level_files: pyramid.levels.iter().map(files).collect(),
            book: StreamBook::new(pyramid, files, elem, workers),
            begun: vec![HashMap::new(); pyramid.levels.len()],
            cells: vec![0; cells as usize],
            file: vec![0; file as usize],
            stats: vec![PyramidStats::default(); pyramid.levels.len() - 1],
        }
    }

    /// The most bytes held so far (scratch, the cells of a batch, and the
    /// blocks begun).
    pub fn peak_bytes(&self) -> u64 {
        self.book.peak
    }

    /// Whether every block begun has been written.
    pub fn finished(&self) -> bool {
        self.book.finished()
    }

    /// Takes a batch of regions of level 0, as cells, into the levels
    /// below, in order; `sinks[k - 1]` receives level `k`'s blocks as they
    /// complete.
    pub fn take(&mut self, batch: Vec<RegionCells>, sinks: &mut [impl BlockSink]) -> Result<()> {
        let held = batch
            .iter()
            .map(|taken| self.book.cells_bytes(&taken.region))
            .sum();
        self.book.hold(held);
        for taken in batch {
            let bytes = self.book.cells_bytes(&taken.region);
            if taken.cells.len() as u64 != bytes {
                return Err(Error::Internal(format!(
                    "the cells of a region at {:?} are {} bytes, not {bytes}",
                    taken.region.origin,
                    taken.cells.len()
                )));
            }
            self.place(0, &taken.region, &taken.cells, sinks)?;
            drop(taken);
            self.book.let_go(bytes);
        }
        let peak = self.book.peak;
        for stats in &mut self.stats {
            stats.peak_bytes = peak;
        }
        Ok(())
    }

    /// Places `cells`, those `region` of level `k` makes, in their block
    /// of level `k + 1`; a block thereby complete is written and passed on.
    fn place(
        &mut self,
        k: usize,
        region: &Region,
        cells: &[u8],
        sinks: &mut [impl BlockSink],
    ) -> Result<()> {
        match self.place_cells(k, region, cells)? {
            Some((rank, block)) => self.complete(k + 1, rank, &block, sinks),
            None => Ok(()),
        }
    }

    /// Copies `cells`, those `region` of level `k` makes, into their block
    /// of level `k + 1`, begun here if it is not yet; returns its rank and
    /// box once complete.
    fn place_cells(
        &mut self,
        k: usize,
        region: &Region,
        cells: &[u8],
    ) -> Result<Option<(u64, Region)>> {
        let taken = self.book.take(k, region).ok_or_else(|| {
            Error::Internal(format!(
                "plan error: a region of pyramid level {k} at {:?} does not make whole cells of \
                 level {}",
                region.origin,
                k + 1
            ))
        })?;
        let level = &self.pyramid.levels[k + 1];
        let block = level.block(&level.unravel(taken.rank));
        let elem = self.dtype.size as u64;
        let begun = self.begun[k + 1]
            .entry(taken.rank)
            .or_insert_with(|| vec![0; (block.volume() * elem) as usize]);
        copy_into(cells, &taken.cells, begun, &block, &block.shape, elem);
        Ok(taken.complete.then_some((taken.rank, block)))
    }

    /// Writes block `rank` of level `k` (`block`), complete, and passes it
    /// on to the next level.
    fn complete(
        &mut self,
        k: usize,
        rank: u64,
        block: &Region,
        sinks: &mut [impl BlockSink],
    ) -> Result<()> {
        let done = self.begun[k].remove(&rank).unwrap_or_default();
        self.write(k, rank, block, &done, &mut sinks[k - 1])?;
        if k + 1 < self.pyramid.levels.len() {
            self.feed(k, block, &done, sinks)?;
        }
        drop(done);
        self.book.release(k, rank);
        Ok(())
    }

    /// Downsamples `data`, `region` of level `k` (C order), into its cells
    /// of level `k + 1`, and places them.
    fn feed(
        &mut self,
        k: usize,
        region: &Region,
        data: &[u8],
        sinks: &mut [impl BlockSink],
    ) -> Result<()> {
        let elem = self.dtype.size as u64;
        let cells_shape = downsampled_shape(&region.shape, &self.pyramid.factors);
        let cells_len = (volume(&cells_shape) * elem) as usize;
        let cells = self
            .cells
            .get_mut(..cells_len)
            .ok_or_else(|| Error::Internal("pyramid block larger than planned".into()))?;
        downsample(
            data,
            &region.shape,
            &self.pyramid.factors,
            self.dtype,
            self.pyramid.method,
            cells,
            &cells_shape,
            0,
            1,
        );
        let cells = std::mem::take(&mut self.cells);
        let placed = self.place_cells(k, region, &cells[..cells_len]);
        self.cells = cells;
        match placed? {
            Some((rank, block)) => self.complete(k + 1, rank, &block, sinks),
            None => Ok(()),
        }
    }

    /// Writes block `rank` of level `k` (`block`, its voxels `data`) into
    /// its file whole, padding and all, in one call.
    fn write(
        &mut self,
        k: usize,
        rank: u64,
        block: &Region,
        data: &[u8],
        sink: &mut dyn BlockSink,
    ) -> Result<()> {
        let elem = self.dtype.size as u64;
        let file_shape = self.level_files[k].file_box(block).shape;
        let len = (volume(&file_shape) * elem) as usize;
        let bytes: &[u8] = if file_shape == block.shape {
            data
        } else {
            let file = self
                .file
                .get_mut(..len)
                .ok_or_else(|| Error::BadArgument("pyramid block larger than planned".into()))?;
            file.fill(0);
            copy_into(data, block, file, block, &file_shape, elem);
            &self.file[..len]
        };
        let target = sink.target(rank)?;
        write_all_at(
            target.file,
            target.path,
            &mut [IoSlice::new(bytes)],
            target.data_offset,
        )?;
        sink.complete(rank)?;
        let stats = &mut self.stats[k - 1];
        stats.blocks += 1;
        stats.writes += 1;
        stats.bytes_written += len as u64;
        Ok(())
    }
}

/// Copies `from` (the C-order voxels of `part`) into `to`, a C-order
/// array of `to_shape` whose first voxel is at `origin`'s, a last-axis
/// line at a time.
fn copy_into(
    from: &[u8],
    part: &Region,
    to: &mut [u8],
    origin: &Region,
    to_shape: &[u64],
    elem: u64,
) {
    let ndim = part.ndim();
    let to_strides = strides(to_shape);
    let line = (part.shape[ndim - 1] * elem) as usize;
    let lines = &part.shape[..ndim - 1];
    let mut at = [0u64; MAX_DIMS];
    for from_line in from.chunks_exact(line.max(1)).take(volume(lines) as usize) {
        let mut to_at = part.origin[ndim - 1] - origin.origin[ndim - 1];
        for d in 0..ndim - 1 {
            to_at += (part.origin[d] + at[d] - origin.origin[d]) * to_strides[d];
        }
        let to_at = (to_at * elem) as usize;
        to[to_at..to_at + line].copy_from_slice(from_line);
        for d in (0..ndim - 1).rev() {
            at[d] += 1;
            if at[d] < lines[d] {
                break;
            }
            at[d] = 0;
        }
    }
}

/// Copies `part` (whole along every axis but the first, whose rows `rows`
/// holds as its file lays them out, `file` being the file's shape) into
/// `slab` (which holds `region`, C order, `slab_strides` in elements), one
/// last-axis line at a time.
fn copy_lines(
    rows: &[u8],
    file: &[u64],
    part: &Region,
    slab: &mut [u8],
    region: &Region,
    slab_strides: &[u64],
    elem: u64,
) {
    let ndim = part.ndim();
    let file_strides = strides(file);
    let line = (part.shape[ndim - 1] * elem) as usize;
    let lines = &part.shape[..ndim - 1];
    let count = volume(lines);
    let mut at = vec![0u64; ndim - 1];
    for _ in 0..count {
        // `at` is relative to `part`, which starts where `rows` does.
        let mut from = 0;
        let mut to = 0;
        for d in 0..ndim - 1 {
            from += at[d] * file_strides[d];
            to += (part.origin[d] + at[d] - region.origin[d]) * slab_strides[d];
        }
        to += (part.origin[ndim - 1] - region.origin[ndim - 1]) * slab_strides[ndim - 1];
        let (from, to) = ((from * elem) as usize, (to * elem) as usize);
        slab[to..to + line].copy_from_slice(&rows[from..from + line]);
        for d in (0..ndim - 1).rev() {
            at[d] += 1;
            if at[d] < lines[d] {
                break;
            }
            at[d] = 0;
        }
    }
}

/// Downsamples `src` (C order, `src_shape`) by `factors` into `out`, a
/// C-order array of `out_shape`, from its row `out_row` along the first
/// axis on, with up to `threads` threads (each takes whole rows of cells
/// along the first axis, so the result does not depend on how many).
#[allow(clippy::too_many_arguments)]
pub fn downsample(
    src: &[u8],
    src_shape: &[u64],
    factors: &[u64],
    dtype: DType,
    method: Downsample,
    out: &mut [u8],
    out_shape: &[u64],
    out_row: u64,
    threads: usize,
) {
    // One axis is downsampled as two, the second of length 1, so that
    // every path can take a row of cells along the first axis.
    let (src_2d, factors_2d, out_2d);
    let (src_shape, factors, out_shape) = if src_shape.len() == 1 {
        src_2d = [src_shape[0], 1];
        factors_2d = [factors[0], 1];
        out_2d = [out_shape[0], 1];
        (&src_2d[..], &factors_2d[..], &out_2d[..])
    } else {
        (src_shape, factors, out_shape)
    };
    let big = dtype.endian == Endian::Big;
    let job = Job {
        src,
        src_shape,
        factors,
        out_shape,
        method,
        big,
    };
    let row_bytes = (volume(&out_shape[1..]) * dtype.size as u64) as usize;
    let rows = src_shape[0].div_ceil(factors[0]);
    let start = out_row as usize * row_bytes;
    let out = &mut out[start..start + rows as usize * row_bytes];
    match (dtype.kind, dtype.size) {
        (Kind::Unsigned, 1) => job.spread::<u8>(out, rows, row_bytes, threads),
        (Kind::Unsigned, 2) => job.spread::<u16>(out, rows, row_bytes, threads),
        (Kind::Unsigned, 4) => job.spread::<u32>(out, rows, row_bytes, threads),
        (Kind::Unsigned, _) => job.spread::<u64>(out, rows, row_bytes, threads),
        (Kind::Signed, 1) => job.spread::<i8>(out, rows, row_bytes, threads),
        (Kind::Signed, 2) => job.spread::<i16>(out, rows, row_bytes, threads),
        (Kind::Signed, 4) => job.spread::<i32>(out, rows, row_bytes, threads),
        (Kind::Signed, _) => job.spread::<i64>(out, rows, row_bytes, threads),
        (Kind::Float, 2) => job.spread::<f16>(out, rows, row_bytes, threads),
        (Kind::Float, 4) => job.spread::<f32>(out, rows, row_bytes, threads),
        (Kind::Float, _) => job.spread::<f64>(out, rows, row_bytes, threads),
    }
}

/// Bytes of source below which a slab is downsampled on the calling
/// thread: starting a thread costs tens of microseconds, the time to
/// average about this much.
const BYTES_PER_THREAD: usize = 1 << 20;

/// One element type's arithmetic for the three rules.
trait Element: Copy + PartialEq + PartialOrd {
    const SIZE: usize;
    /// The type a mean sums in.
    type Sum: Copy;
    fn load(bytes: &[u8], big: bool) -> Self;
    fn store(self, bytes: &mut [u8], big: bool);
    fn zero() -> Self::Sum;
    fn add(sum: Self::Sum, x: Self) -> Self::Sum;
    fn mean(sum: Self::Sum, count: u64) -> Self;
    /// [`mean`](Element::mean) of `2^shift` values.
    fn mean_pow2(sum: Self::Sum, shift: u32) -> Self {
        Self::mean(sum, 1 << shift)
    }
}

/// Integer division rounding to nearest, ties to even, as TensorStore's
/// mean rounds (C++ division truncates toward zero, `%` follows the sign
/// of the dividend, as Rust's do).
macro_rules! round_half_even {
    ($name:ident, $t:ty) => {
        fn $name(sum: $t, count: u64) -> $t {
            let n = count as $t;
            let (q, r) = (sum / n, sum % n);
            if sum >= 0 {
                q + <$t>::from(r * 2 + (q & 1) > n)
            } else {
                q - <$t>::from(r * 2 - (q & 1) < -n)
            }
        }
    };
}
round_half_even!(round_half_even, i128);
// Sums of 8- and 16-bit values fit in 64 bits for any cell of fewer than
// 2^47 voxels, and 64-bit division is many times faster than 128-bit.
round_half_even!(round_half_even_64, i64);

macro_rules! integer_element {
    ($sum:ty, $round:ident: $($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            type Sum = $sum;
            fn load(bytes: &[u8], big: bool) -> $t {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(&bytes[..Self::SIZE]);
                if big { <$t>::from_be_bytes(raw) } else { <$t>::from_le_bytes(raw) }
            }
            fn store(self, bytes: &mut [u8], big: bool) {
                let raw = if big { self.to_be_bytes() } else { self.to_le_bytes() };
                bytes[..Self::SIZE].copy_from_slice(&raw);
            }
            fn zero() -> $sum { 0 }
            fn add(sum: $sum, x: $t) -> $sum { sum + x as $sum }
            fn mean(sum: $sum, count: u64) -> $t {
                // The mean of values of a type lies within its range.
                $round(sum, count) as $t
            }
            fn mean_pow2(sum: $sum, shift: u32) -> $t {
                if sum < 0 {
                    return Self::mean(sum, 1 << shift);
                }
                // `$round` by shifts: the same quotient and remainder.
                let (q, r) = (sum >> shift, sum & ((1 << shift) - 1));
                (q + <$sum>::from(r * 2 + (q & 1) > (1 << shift))) as $t
            }
        }
    )*};
}
integer_element!(i64, round_half_even_64: u8, u16, i8, i16);
integer_element!(i128, round_half_even: u32, u64, i32, i64);

macro_rules! float_element {
    ($t:ty, $sum:ty, $to_sum:expr, $from_sum:expr) => {
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            type Sum = $sum;
            fn load(bytes: &[u8], big: bool) -> $t {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(&bytes[..Self::SIZE]);
                if big {
                    <$t>::from_be_bytes(raw)
                } else {
                    <$t>::from_le_bytes(raw)
                }
            }
            fn store(self, bytes: &mut [u8], big: bool) {
                let raw = if big {
                    self.to_be_bytes()
                } else {
                    self.to_le_bytes()
                };
                bytes[..Self::SIZE].copy_from_slice(&raw);
            }
            fn zero() -> $sum {
                0.0
            }
            fn add(sum: $sum, x: $t) -> $sum {
                sum + $to_sum(x)
            }
            fn mean(sum: $sum, count: u64) -> $t {
                $from_sum(sum / count as $sum)
            }
        }
    };
}
float_element!(f16, f32, f16::to_f32, f16::from_f32);
float_element!(f32, f32, |x| x, |x| x);
float_element!(f64, f64, |x| x, |x| x);

/// The arguments of one [`downsample`] call.
struct Job<'a> {
    src: &'a [u8],
    src_shape: &'a [u64],
    factors: &'a [u64],
    out_shape: &'a [u64],
    method: Downsample,
    big: bool,
}

impl Job<'_> {
    /// Runs rows `0..rows` of cells along the first axis, `out` holding
    /// them (`row_bytes` each), over scoped threads that each take a run
    /// of whole rows.
    fn spread<T: Element>(&self, out: &mut [u8], rows: u64, row_bytes: usize, threads: usize) {
        let useful = self.src.len() / BYTES_PER_THREAD;
        let threads = threads.min(useful).min(rows as usize).max(1);
        if threads == 1 {
            self.rows::<T>(0, out);
            return;
        }
        let per_thread = rows.div_ceil(threads as u64);
        std::thread::scope(|scope| {
            for (i, chunk) in out.chunks_mut(per_thread as usize * row_bytes).enumerate() {
                scope.spawn(move || self.rows::<T>(i as u64 * per_thread, chunk));
            }
        });
    }

    /// Computes the rows of cells along the first axis that `out` holds,
    /// the first being row `first`.
    fn rows<T: Element>(&self, first: u64, out: &mut [u8]) {
        if self.method == Downsample::Mean {
            self.mean_rows::<T>(first, out);
        } else {
            self.cell_by_cell::<T>(first, out);
        }
    }

    /// The mean, summed a source line at a time into one accumulator per
    /// cell of the output row: each cell still receives its voxels one by
    /// one in C order (the order [`reduce`] sums in, which float sums
    /// depend on), but the source is read once, in order, with no
    /// per-voxel index arithmetic. Needs two axes or more.
    fn mean_rows<T: Element>(&self, first: u64, out: &mut [u8]) {
        let ndim = self.src_shape.len();
        let last = ndim - 1;
        let cells: Vec<u64> = (0..ndim)
            .map(|d| self.src_shape[d].div_ceil(self.factors[d]))
            .collect();
        let src_strides = strides(self.src_shape);
        let out_strides = strides(self.out_shape);
        let row_bytes = out_strides[0] as usize * T::SIZE;
        let line_bytes = self.src_shape[last] as usize * T::SIZE;
        let row_cells = cells[last] as usize;
        let mut sums = vec![T::zero(); volume(&cells[1..]) as usize];
        for (r, out_row) in out.chunks_mut(row_bytes).enumerate() {
            let lo0 = (first + r as u64) * self.factors[0];
            let hi0 = (lo0 + self.factors[0]).min(self.src_shape[0]);
            sums.fill(T::zero());
            for i0 in lo0..hi0 {
                // `at` walks the axes between the first and the last.
                let mut at = [0u64; MAX_DIMS];
                for _ in 0..volume(&self.src_shape[1..last]) {
                    let mut from = i0 * src_strides[0];
                    let mut cell_line = 0u64;
                    for d in 1..last {
                        from += at[d] * src_strides[d];
                        cell_line = cell_line * cells[d] + at[d] / self.factors[d];
                    }
                    let from = from as usize * T::SIZE;
                    let line = &self.src[from..from + line_bytes];
                    let cell_line = cell_line as usize * row_cells;
                    let sums = &mut sums[cell_line..cell_line + row_cells];
                    if self.big {
                        add_line::<T, true>(sums, line, self.factors[last] as usize);
                    } else {
                        add_line::<T, false>(sums, line, self.factors[last] as usize);
                    }
                    for d in (1..last).rev() {
                        at[d] += 1;
                        if at[d] < self.src_shape[d] {
                            break;
                        }
                        at[d] = 0;
                    }
                }
            }
            // Each cell's voxel count is the product of its extents.
            let extent = |d: usize, c: u64| {
                let lo = c * self.factors[d];
                (lo + self.factors[d]).min(self.src_shape[d]) - lo
            };
            // A line of cells along the last axis shares its count but for
            // a last cell cut short.
            let mut cell = [0u64; MAX_DIMS];
            for line_sums in sums.chunks_exact(row_cells) {
                let mut count = hi0 - lo0;
                let mut at = 0u64;
                for d in 1..last {
                    count *= extent(d, cell[d]);
                    at += cell[d] * out_strides[d];
                }
                let whole = count * self.factors[last];
                let line = &mut out_row[at as usize * T::SIZE..][..row_cells * T::SIZE];
                for (c, (&sum, bytes)) in line_sums
                    .iter()
                    .zip(line.chunks_exact_mut(T::SIZE))
                    .enumerate()
                {
                    let n = extent(last, c as u64);
                    let value = if n == self.factors[last] && whole.is_power_of_two() {
                        T::mean_pow2(sum, whole.trailing_zeros())
                    } else {
                        T::mean(sum, count * n)
                    };
                    value.store(bytes, self.big);
                }
                for d in (1..last).rev() {
                    cell[d] += 1;
                    if cell[d] < cells[d] {
                        break;
                    }
                    cell[d] = 0;
                }
            }
        }
    }

    /// Mode and nearest: each cell's values gathered and reduced.
    fn cell_by_cell<T: Element>(&self, first: u64, out: &mut [u8]) {
        let ndim = self.src_shape.len();
        let mut cells = [1u64; MAX_DIMS];
        for (cell, (&len, &f)) in cells
            .iter_mut()
            .zip(self.src_shape.iter().zip(self.factors))
        {
            *cell = len.div_ceil(f);
        }
        let src_strides = strides(self.src_shape);
        let out_strides = strides(self.out_shape);
        let row_bytes = out_strides[0] as usize * T::SIZE;
        let mut values: Vec<T> = Vec::with_capacity(self.factors.iter().product::<u64>() as usize);
        for (r, out_row) in out.chunks_mut(row_bytes).enumerate() {
            let mut cell = [0u64; MAX_DIMS];
            cell[0] = first + r as u64;
            for _ in 0..volume(&cells[1..ndim]) {
                let (mut lo, mut hi) = ([0u64; MAX_DIMS], [0u64; MAX_DIMS]);
                for d in 0..ndim {
                    lo[d] = cell[d] * self.factors[d];
                    hi[d] = (lo[d] + self.factors[d]).min(self.src_shape[d]);
                }
                values.clear();
                self.cell_values(&lo[..ndim], &hi[..ndim], &src_strides, &mut values);
                let value = reduce(self.method, &mut values);
                let mut at = 0;
                for d in 1..ndim {
                    at += cell[d] * out_strides[d];
                }
                let at = at as usize * T::SIZE;
                value.store(&mut out_row[at..at + T::SIZE], self.big);
                for d in (1..ndim).rev() {
                    cell[d] += 1;
                    if cell[d] < cells[d] {
                        break;
                    }
                    cell[d] = 0;
                }
            }
        }
    }

    /// The cell `[lo, hi)`'s values in C order (only its first for
    /// nearest), a run along the last axis at a time.
    fn cell_values<T: Element>(
        &self,
        lo: &[u64],
        hi: &[u64],
        src_strides: &[u64],
        values: &mut Vec<T>,
    ) {
        let last = lo.len() - 1;
        let mut at = [0u64; MAX_DIMS];
        at[..last].copy_from_slice(&lo[..last]);
        loop {
            let line: u64 = (0..last).map(|d| at[d] * src_strides[d]).sum();
            let (start, end) = ((line + lo[last]) as usize, (line + hi[last]) as usize);
            if self.method == Downsample::Nearest {
                values.push(T::load(&self.src[start * T::SIZE..], self.big));
                return;
            }
            let run = &self.src[start * T::SIZE..end * T::SIZE];
            values.extend(
                run.chunks_exact(T::SIZE)
                    .map(|bytes| T::load(bytes, self.big)),
            );
            let mut d = last;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                at[d] += 1;
                if at[d] < hi[d] {
                    break;
                }
                at[d] = lo[d];
            }
        }
    }
}

/// Adds `line`, a source line along the last axis, into `sums`, one per
/// run of `factor` values (the last run cut short by the line's end),
/// each value in order; `BIG` says the values' byte order.
fn add_line<T: Element, const BIG: bool>(sums: &mut [T::Sum], line: &[u8], factor: usize) {
    let runs = line.chunks_exact(factor * T::SIZE);
    let tail = runs.remainder();
    let full = runs.len();
    match factor {
        1 => {
            for (sum, bytes) in sums.iter_mut().zip(line.chunks_exact(T::SIZE)) {
                *sum = T::add(*sum, T::load(bytes, BIG));
            }
        }
        2 => {
            for (sum, pair) in sums.iter_mut().zip(runs) {
                let (a, b) = pair.split_at(T::SIZE);
                *sum = T::add(T::add(*sum, T::load(a, BIG)), T::load(b, BIG));
            }
        }
        _ => {
            for (sum, run) in sums.iter_mut().zip(runs) {
                for bytes in run.chunks_exact(T::SIZE) {
                    *sum = T::add(*sum, T::load(bytes, BIG));
                }
            }
        }
    }
    if factor > 1 && !tail.is_empty() {
        let sum = &mut sums[full];
        for bytes in tail.chunks_exact(T::SIZE) {
            *sum = T::add(*sum, T::load(bytes, BIG));
        }
    }
}

/// One cell's voxel by `method` from its values in C order.
fn reduce<T: Element>(method: Downsample, values: &mut [T]) -> T {
    match method {
        Downsample::Nearest => values[0],
        Downsample::Mean => {
            let sum = values.iter().fold(T::zero(), |sum, &x| T::add(sum, x));
            T::mean(sum, values.len() as u64)
        }
        Downsample::Mode => {
            values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            let (mut best, mut best_count, mut count) = (values[0], 1, 1);
            for i in 1..values.len() {
                if values[i] == values[i - 1] {
                    count += 1;
                } else {
                    count = 1;
                }
                if count > best_count {
                    best = values[i];
                    best_count = count;
                }
            }
            best
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_u8(src: &[u8], shape: &[u64], factors: &[u64], method: Downsample) -> Vec<u8> {
        let out_shape: Vec<u64> = shape
            .iter()
            .zip(factors)
            .map(|(&s, &f)| s.div_ceil(f))
            .collect();
        let mut out = vec![0u8; volume(&out_shape) as usize];
        let dtype = DType::new(Kind::Unsigned, 1, Endian::Little).unwrap();
        downsample(
            src, shape, factors, dtype, method, &mut out, &out_shape, 0, 1,
        );
        out
    }

    #[test]
    fn rules_match_tensorstore_on_small_cases() {
        // TensorStore 0.1: mean [1,2]→2, [2,3]→2, [0..5) by 2 → [0,2,4];
        // mode [3,1,1,3]→1 (smallest of the most frequent); stride takes the first.
        assert_eq!(run_u8(&[1, 2], &[2], &[2], Downsample::Mean), [2]);
        assert_eq!(run_u8(&[2, 3], &[2], &[2], Downsample::Mean), [2]);
        assert_eq!(run_u8(&[255, 254], &[2], &[2], Downsample::Mean), [254]);
        assert_eq!(
            run_u8(&[0, 1, 2, 3, 4], &[5], &[2], Downsample::Mean),
            [0, 2, 4]
        );
        assert_eq!(
            run_u8(&[3, 1, 1, 3, 7], &[5], &[4], Downsample::Mode),
            [1, 7]
        );
        assert_eq!(run_u8(&[1, 2, 3], &[3], &[2], Downsample::Nearest), [1, 3]);
        assert_eq!(
            run_u8(&[1, 2, 3, 4, 5, 6], &[2, 3], &[2, 2], Downsample::Nearest),
            [1, 3]
        );
        assert_eq!(
            run_u8(&[1, 2, 3, 4, 5, 6], &[2, 3], &[2, 2], Downsample::Mean),
            [3, 4] // (1+2+4+5)/4 = 3, (3+6)/2 = 4.5 → 4
        );
    }

    #[test]
    fn negative_means_round_half_to_even() {
        for (sum, count, expected) in [(-3, 2, -2), (-5, 2, -2), (3, 2, 2), (5, 2, 2), (-7, 4, -2)]
        {
            assert_eq!(round_half_even(sum, count), expected, "{sum}/{count}");
            assert_eq!(
                round_half_even_64(sum as i64, count),
                expected as i64,
                "{sum}/{count}"
            );
        }
    }

    #[test]
    fn means_of_powers_of_two_by_shifts_equal_divided_ones() {
        for sum in -300i64..300 {
            for shift in 0..5 {
                assert_eq!(
                    i16::mean_pow2(sum, shift),
                    i16::mean(sum, 1 << shift),
                    "{sum} >> {shift}"
                );
                assert_eq!(
                    i32::mean_pow2(sum as i128, shift),
                    i32::mean(sum as i128, 1 << shift),
                    "{sum} >> {shift}"
                );
            }
        }
    }

    /// Each cell gathered and reduced one by one: the rule, written plainly.
    fn reference(
        src: &[u8],
        shape: &[u64],
        factors: &[u64],
        dtype: DType,
        out_shape: &[u64],
    ) -> Vec<u8> {
        let mut out = vec![0u8; (volume(out_shape) * dtype.size as u64) as usize];
        let big = dtype.endian == Endian::Big;
        let (shape, factors, out_shape2) = if shape.len() == 1 {
            (
                vec![shape[0], 1],
                vec![factors[0], 1],
                vec![out_shape[0], 1],
            )
        } else {
            (shape.to_vec(), factors.to_vec(), out_shape.to_vec())
        };
        let job = Job {
            src,
            src_shape: &shape,
            factors: &factors,
            out_shape: &out_shape2,
            method: Downsample::Mean,
            big,
        };
        match (dtype.kind, dtype.size) {
            (Kind::Unsigned, 2) => job.cell_by_cell::<u16>(0, &mut out),
            (Kind::Signed, 4) => job.cell_by_cell::<i32>(0, &mut out),
            (Kind::Float, 2) => job.cell_by_cell::<f16>(0, &mut out),
            (Kind::Float, 4) => job.cell_by_cell::<f32>(0, &mut out),
            _ => job.cell_by_cell::<u8>(0, &mut out),
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn line_sums_equal_cell_by_cell_means(
            shape in proptest::collection::vec(1u64..9, 1..5),
            factor_seed in proptest::collection::vec(1u64..5, 4),
            kind in 0usize..5,
            big in proptest::bool::ANY,
            seed in 0u64..1000,
        ) {
            let factors: Vec<u64> = factor_seed[..shape.len()].to_vec();
            let endian = if big { Endian::Big } else { Endian::Little };
            let (k, size) = [(Kind::Unsigned, 1), (Kind::Unsigned, 2), (Kind::Signed, 4),
                (Kind::Float, 2), (Kind::Float, 4)][kind];
            let dtype = DType::new(k, size, endian).unwrap();
            let mut state = seed;
            let src: Vec<u8> = (0..volume(&shape) * size as u64)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // Keep float exponents tame: no NaNs, whose bits may differ.
                    ((state >> 33) as u8) & if k == Kind::Float { 0x3f } else { 0xff }
                })
                .collect();
            let out_shape: Vec<u64> =
                shape.iter().zip(&factors).map(|(&s, &f)| s.div_ceil(f)).collect();
            let mut out = vec![0u8; (volume(&out_shape) * size as u64) as usize];
            downsample(&src, &shape, &factors, dtype, Downsample::Mean, &mut out, &out_shape, 0, 1);
            proptest::prop_assert_eq!(out, reference(&src, &shape, &factors, dtype, &out_shape));
        }
    }

    #[test]
    fn any_number_of_threads_gives_the_same_bytes() {
        let shape = [70u64, 130, 120];
        let dtype = DType::new(Kind::Unsigned, 2, Endian::Little).unwrap();
        let src: Vec<u8> = (0..volume(&shape) * 2)
            .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
            .collect();
        let factors = [2u64, 3, 2];
        let out_shape: Vec<u64> = shape
            .iter()
            .zip(&factors)
            .map(|(&s, &f)| s.div_ceil(f))
            .collect();
        for method in [Downsample::Mean, Downsample::Mode, Downsample::Nearest] {
            let run = |threads| {
                let mut out = vec![0u8; (volume(&out_shape) * 2) as usize];
                downsample(
                    &src, &shape, &factors, dtype, method, &mut out, &out_shape, 0, threads,
                );
                out
            };
            let one = run(1);
            for threads in [2, 3, 8] {
                assert_eq!(run(threads), one, "{method:?} with {threads} threads");
            }
        }
        let mut threaded = vec![0u8; (volume(&out_shape) * 2) as usize];
        downsample(
            &src,
            &shape,
            &factors,
            dtype,
            Downsample::Mean,
            &mut threaded,
            &out_shape,
            0,
            4,
        );
        assert_eq!(
            threaded,
            reference(&src, &shape, &factors, dtype, &out_shape)
        );
    }

    /// A region downsampled a slab of rows at a time, however many rows a
    /// slab holds, gives the cells and the range of values the whole
    /// region gives at once, the last slab cut short by the array's end.
    #[test]
    fn cells_made_a_slab_at_a_time_equal_the_whole_regions() {
        use crate::plan::pyramid::LevelCount;
        let array = [9u64, 10, 7];
        let dtype = DType::new(Kind::Unsigned, 2, Endian::Little).unwrap();
        let src: Vec<u8> = (0..volume(&array) * 2)
            .map(|i| (i.wrapping_mul(2654435761) >> 9) as u8)
            .collect();
        let factors = vec![2u64, 2, 3];
        let pyramid = Pyramid::new(
            &array,
            &array,
            factors.clone(),
            LevelCount::Exactly(2),
            Downsample::Mean,
        )
        .unwrap();
        // The region at (4, 2, 3) to the array's end: 5 rows, the last cut.
        let region = Region::new(vec![4, 2, 3], vec![5, 8, 4]);
        let gather = |part: &Region, into: &mut [u8]| {
            let mut at = 0;
            let ranges = (0..3).map(|d| part.origin[d] as usize..part.end(d) as usize);
            for index in IndexBox::new(ranges.collect()) {
                let i = (index[0] * 10 * 7 + index[1] * 7 + index[2]) * 2;
                into[at..at + 2].copy_from_slice(&src[i..i + 2]);
                at += 2;
            }
            Ok(())
        };
        let mut whole = vec![0u8; (region.volume() * 2) as usize];
        gather(&region, &mut whole).unwrap();
        let cells_shape = downsampled_shape(&region.shape, &factors);
        let mut expected = vec![0u8; (volume(&cells_shape) * 2) as usize];
        downsample(
            &whole,
            &region.shape,
            &factors,
            dtype,
            Downsample::Mean,
            &mut expected,
            &cells_shape,
            0,
            1,
        );
        let mut range = WindowOf::new(dtype);
        range.observe(&whole);
        for slab_rows in [2, 4, 6, 10] {
            let mut maker = CellMaker::new(&pyramid, dtype);
            maker.slab_rows = slab_rows;
            let made = maker.cells(&region, &mut { gather }).unwrap();
            assert_eq!(made.cells, expected, "{slab_rows} rows a slab");
            assert_eq!(
                made.window.window(),
                range.window(),
                "{slab_rows} rows a slab"
            );
            assert_eq!(made.region, region);
        }
    }
}
