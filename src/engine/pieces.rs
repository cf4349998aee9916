//! How one box of the array lies twice: in a block file, as rows grouped
//! into contiguous segments (one I/O call each, so at most one seek), and
//! among piece buffers, the cells of another partition that the executor
//! holds in memory (C order each). And moving bytes between the two
//! without listing the parts first: W1 moves 26 million row parts of 35 to
//! 100 bytes.
//!
//! Small parts go through a packing buffer of [`PACKED_BYTES`], one call
//! per buffer-full that continues where the last ended: the kernel copies
//! a `preadv`/`pwritev` iovec at a time, and for rows of tens of bytes its
//! per-iovec cost (~0.2 µs) dwarfs a user-space copy of the row. Parts of
//! [`PACK_BELOW_BYTES`] or more on average go straight between the file
//! and the pieces in one vectored call.
//!
//! A buffer-full of whole rows is moved by [`Run`]s: the parts of one
//! column over the rows that stay in one piece interval recur at fixed
//! steps, so each is one copy in a loop, not a part worked out on its own
//! (on W1 on a tmpfs that took the user CPU from 0.63 to 0.41 s). Parts
//! one at a time, in the file's order, remain for what needs that order:
//! vectored calls, segments that bridge gaps, and rows longer than the
//! buffer.
//!
//! Several threads fill a step's pieces at once through [`SharedPieces`],
//! each its own input blocks' regions, which are disjoint.

use std::cell::RefCell;
use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::ops::Range;
use std::path::Path;

use crate::array::geometry::{strides, Partition, Region};
use crate::engine::seekio;
use crate::error::Result;

/// Most bytes packed per read or write call (a fixed buffer per thread,
/// outside `--mem`'s array bytes).
pub const PACKED_BYTES: usize = 1 << 20;

/// Parts averaging less than this are packed.
const PACK_BELOW_BYTES: u64 = 16 << 10;

/// The buffer small parts are packed through (one per thread), and how
/// many bytes it takes per call.
pub struct PackingBuffer {
    bytes: Vec<u8>,
    capacity: usize,
}

impl PackingBuffer {
    /// One that takes [`PACKED_BYTES`] per call.
    pub fn new() -> PackingBuffer {
        PackingBuffer::with_capacity(PACKED_BYTES)
    }

    fn with_capacity(capacity: usize) -> PackingBuffer {
        PackingBuffer {
            bytes: Vec::new(),
            capacity,
        }
    }
}

impl Default for PackingBuffer {
    fn default() -> Self {
        PackingBuffer::new()
    }
}

std::thread_local! {
    /// The packing buffer of each thread that reads or writes rows.
    static PACKING: RefCell<PackingBuffer> = RefCell::new(PackingBuffer::new());
}

impl PackingBuffer {
    /// Runs `work` with this thread's packing buffer, kept for the
    /// thread's life (a fresh one should `work` ask for it again inside).
    pub fn of_this_thread<R>(work: impl FnOnce(&mut PackingBuffer) -> R) -> R {
        PACKING.with(|cell| match cell.try_borrow_mut() {
            Ok(mut packing) => work(&mut packing),
            Err(_) => work(&mut PackingBuffer::new()),
        })
    }
}

/// The pieces a container box (a read block, or a write block) is cut into
/// by another partition (write blocks, or read blocks): one C-order buffer
/// per cell of the cutting partition that overlaps the container.
pub struct PieceGrid {
    /// Per dimension: index range of the cutting axis overlapping the container.
    ranges: Vec<Range<usize>>,
    /// Per dimension: the pieces' intervals, clipped to the container.
    intervals: Vec<Vec<(u64, u64)>>,
}

impl PieceGrid {
    pub fn new(cut: &Partition, container: &Region) -> PieceGrid {
        let ranges = cut.overlapping(container);
        let intervals = ranges
            .iter()
            .enumerate()
            .map(|(d, range)| {
                range
                    .clone()
                    .map(|i| {
                        let axis = cut.axis(d);
                        (
                            axis.start(i).max(container.origin[d]),
                            axis.end(i).min(container.end(d)),
                        )
                    })
                    .collect()
            })
            .collect();
        PieceGrid { ranges, intervals }
    }

    pub fn count(&self) -> usize {
        self.intervals.iter().map(Vec::len).product()
    }

    fn local_index(&self, local: usize) -> Vec<usize> {
        let mut index = vec![0; self.intervals.len()];
        let mut rest = local;
        for d in (0..self.intervals.len()).rev() {
            index[d] = rest % self.intervals[d].len();
            rest /= self.intervals[d].len();
        }
        index
    }

    /// Index, in the cutting partition, of piece `local`.
    pub fn cut_index(&self, local: usize) -> Vec<usize> {
        self.local_index(local)
            .iter()
            .zip(&self.ranges)
            .map(|(i, r)| r.start + i)
            .collect()
    }

    pub fn piece_box(&self, local: usize) -> Region {
        let index = self.local_index(local);
        let (origin, shape) = index
            .iter()
            .enumerate()
            .map(|(d, &i)| {
                let (start, end) = self.intervals[d][i];
                (start, end - start)
            })
            .unzip();
        Region::new(origin, shape)
    }

    /// The box the pieces fill.
    pub fn container(&self) -> Region {
        let (origin, shape) = self
            .intervals
            .iter()
            .map(|intervals| match (intervals.first(), intervals.last()) {
                (Some(&(start, _)), Some(&(_, end))) => (start, end - start),
                _ => (0, 0),
            })
            .unzip();
        Region::new(origin, shape)
    }

    pub fn volumes(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.count()).map(|local| self.piece_box(local).volume())
    }

    /// Which of dimension `d`'s piece intervals holds coordinate `x`.
    fn interval_of(&self, d: usize, x: u64) -> usize {
        self.intervals[d].partition_point(|&(_, end)| end <= x)
    }

    /// The pieces' strides in the grid of pieces (C order).
    fn strides(&self) -> Vec<usize> {
        let lens: Vec<u64> = self.intervals.iter().map(|v| v.len() as u64).collect();
        strides(&lens).into_iter().map(|s| s as usize).collect()
    }
}

/// A run of a file's bytes that one I/O call moves: `len` bytes at `offset`
/// of the file's data, holding `rows` of the region (numbered in C order
/// over every dimension but the last).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub len: u64,
    pub rows: Range<u64>,
}

/// Where `len` bytes found `at` bytes into a run of rows live: at `offset`
/// in piece `piece`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub at: usize,
    pub piece: usize,
    pub offset: usize,
    pub len: usize,
}

/// Parts of `len` bytes that recur at fixed steps: one per row of a run of
/// rows that stay in one piece interval along their innermost row
/// dimension. The k-th of the `count` parts is `at + k * at_step` bytes
/// into the rows, at `offset + k * offset_step` in piece `piece`; moved by
/// a loop of copies, with no per-part bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub at: usize,
    pub piece: usize,
    pub offset: usize,
    pub len: usize,
    pub count: usize,
    pub at_step: usize,
    pub offset_step: usize,
}

impl Run {
    /// Bytes of the rows from the first part's start to the last's end.
    fn rows_span(&self) -> usize {
        self.count.saturating_sub(1) * self.at_step + self.len
    }

    /// Bytes of the piece from the first part's start to the last's end.
    fn piece_span(&self) -> usize {
        self.count.saturating_sub(1) * self.offset_step + self.len
    }

    /// The same parts, as one when each continues the last in the rows
    /// and in the piece.
    fn merged(self) -> Run {
        if self.count > 1 && self.at_step == self.len && self.offset_step == self.len {
            Run {
                len: self.len * self.count,
                count: 1,
                ..self
            }
        } else {
            self
        }
    }

    /// Copies the parts from `pieces` into `rows`.
    fn gather_into(&self, pieces: &[Vec<u8>], rows: &mut [u8]) -> Result<()> {
        let piece = pieces
            .get(self.piece)
            .and_then(|piece| piece.get(self.offset..self.offset + self.piece_span()))
            .ok_or_else(beyond_piece)?;
        let rows = rows
            .get_mut(self.at..self.at + self.rows_span())
            .ok_or_else(beyond_rows)?;
        for k in 0..self.count {
            let (to, from) = (k * self.at_step, k * self.offset_step);
            rows[to..to + self.len].copy_from_slice(&piece[from..from + self.len]);
        }
        Ok(())
    }
}

/// Where a region lies in its file: the file's shape (a C-order array)
/// and the region's origin in it. A part of a job clips input blocks, so a
/// region's coordinates and its file's need not share an origin.
///
/// The region's rows are grouped into segments as they lie in the file's
/// *window*, a box of the file holding the region: the whole file, or a
/// smaller box whose gaps one call bridges. Rows that follow each other in
/// the window are one segment, one call over the file from the first row
/// to the last, gaps included: a read reads the gaps and drops them, a
/// write fills them with zeros. So a padded Zarr edge chunk (window: its
/// block) is written in one call, its padding filled, and a part of a job
/// reads an input block it clips (window: the clipped box) in one call,
/// reading the bytes of its neighbours' parts too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFile {
    pub shape: Vec<u64>,
    pub origin: Vec<u64>,
    /// The window (in the file's coordinates); None: the whole file.
    window: Option<Region>,
}

impl InFile {
    /// `region` inside the file holding `file_box` (same coordinates).
    pub fn of(region: &Region, file_box: &Region) -> InFile {
        InFile {
            shape: file_box.shape.clone(),
            origin: region.relative_to(file_box).origin,
            window: None,
        }
    }

    /// The same place, its segments grouped as they lie in `window` (a box
    /// of the file, in its coordinates, holding the region): see the type's
    /// doc. The whole file's box is no window.
    pub fn bridging(mut self, window: Region) -> InFile {
        let whole = window.origin.iter().all(|&o| o == 0) && window.shape == self.shape;
        self.window = (!whole).then_some(window);
        self
    }

    /// The place of `part`, a box inside `region` (same coordinates).
    pub fn of_part(&self, region: &Region, part: &Region) -> InFile {
        InFile {
            shape: self.shape.clone(),
            origin: (0..region.ndim())
                .map(|d| self.origin[d] + part.origin[d] - region.origin[d])
                .collect(),
            window: self.window.clone(),
        }
    }
}

/// Where each row of `region` lies in its file block and among the pieces
/// of a [`PieceGrid`]: per dimension and coordinate tables, so that a row
/// costs a few additions and no allocation.
pub struct RowLayout {
    elem: u64,
    /// The region's shape without its last dimension: the rows' grid.
    row_shape: Vec<u64>,
    row_bytes: u64,
    /// Per dimension but the last, per coordinate: element offset in the file.
    file_part: Vec<Vec<u64>>,
    /// Element offset in the file of a row's first element, within its row.
    file_column: u64,
    /// The same in the window ([`InFile`]), when it is not the whole file:
    /// rows that follow each other there are one segment.
    window_part: Option<(Vec<Vec<u64>>, u64)>,
    /// Per dimension but the last, per coordinate: what it adds to the
    /// piece's index (the piece interval it falls in, times its stride).
    piece_part: Vec<Vec<usize>>,
    /// Per dimension but the last, per coordinate: coordinate inside its piece.
    in_piece: Vec<Vec<u64>>,
    /// Per piece: its element strides.
    piece_strides: Vec<Vec<u64>>,
    /// The parts every row is cut into along the last dimension.
    columns: Vec<Column>,
    /// Whether the region is one segment: it spans the window in every
    /// dimension but the first.
    contiguous: bool,
    /// [`for_each_part`](Self::for_each_part)'s working space, kept so
    /// that a call makes no allocation: a baseline plan calls it once per
    /// row of W2 (49 million times).
    cursor: RefCell<Cursor>,
}

/// Where [`RowLayout::for_each_part`] is: the row's coordinates, and each
/// column's piece, element offset and stride in the current interval.
struct Cursor {
    row: Vec<usize>,
    placed: Vec<(usize, usize, usize)>,
}

/// One part of every row: the pieces of one interval along the last dimension.
struct Column {
    /// What it adds to the piece's index.
    piece_step: usize,
    /// Byte offset in the row.
    at: usize,
    /// Element offset in the piece's row.
    in_piece: u64,
    len: usize,
    /// Whether it is the piece's whole row, so that successive rows may
    /// continue each other in the piece.
    whole_row: bool,
}

impl Column {
    /// The parts every row of `region` is cut into along the last
    /// dimension by the piece intervals of `grid` (whose piece index moves
    /// by `piece_stride` from one interval to the next there).
    fn all(region: &Region, elem: u64, grid: &PieceGrid, piece_stride: usize) -> Vec<Column> {
        let last = region.ndim() - 1;
        let first = grid.interval_of(last, region.origin[last]);
        let end = grid.interval_of(last, region.end(last) - 1) + 1;
        (first..end)
            .map(|interval| {
                let (start, stop) = grid.intervals[last][interval];
                let from = start.max(region.origin[last]);
                let to = stop.min(region.end(last));
                Column {
                    piece_step: interval * piece_stride,
                    at: ((from - region.origin[last]) * elem) as usize,
                    in_piece: from - start,
                    len: ((to - from) * elem) as usize,
                    whole_row: from == start && to == stop,
                }
            })
            .collect()
    }
}

impl RowLayout {
    /// The layout of `region` (inside the file block `file_box`, a C-order
    /// array of elements of `elem` bytes) among the pieces of `grid`.
    pub fn new(region: &Region, file_box: &Region, elem: u64, grid: &PieceGrid) -> RowLayout {
        RowLayout::in_file(region, &InFile::of(region, file_box), elem, grid)
    }

    /// The layout of `region` (lying in its file as `place` says) among
    /// the pieces of `grid`.
    pub fn in_file(region: &Region, place: &InFile, elem: u64, grid: &PieceGrid) -> RowLayout {
        let n = region.ndim();
        let last = n - 1;
        let coordinates = |d: usize| region.origin[d]..region.end(d);
        // Element offsets of the rows in a C-order array of `shape` in
        // which the region starts at `origin`.
        let offsets = |shape: &[u64], origin: &[u64]| -> (Vec<Vec<u64>>, u64) {
            let steps = strides(shape);
            let parts = (0..last)
                .map(|d| {
                    coordinates(d)
                        .map(|x| (x - region.origin[d] + origin[d]) * steps[d])
                        .collect()
                })
                .collect();
            (parts, origin[last])
        };
        let (file_part, file_column) = offsets(&place.shape, &place.origin);
        let window_part = place.window.as_ref().map(|window| {
            let origin: Vec<u64> = (0..n).map(|d| place.origin[d] - window.origin[d]).collect();
            offsets(&window.shape, &origin)
        });
        let spanned = place.window.as_ref().map_or(&place.shape, |w| &w.shape);
        let grid_strides = grid.strides();
        let piece_part = (0..last)
            .map(|d| {
                coordinates(d)
                    .map(|x| grid.interval_of(d, x) * grid_strides[d])
                    .collect()
            })
            .collect();
        let in_piece = (0..last)
            .map(|d| {
                coordinates(d)
                    .map(|x| x - grid.intervals[d][grid.interval_of(d, x)].0)
                    .collect()
            })
            .collect();
        let piece_strides = (0..grid.count())
            .map(|local| strides(&grid.piece_box(local).shape))
            .collect();
        let columns = Column::all(region, elem, grid, grid_strides[last]);
        let columns_count = columns.len();
        RowLayout {
            elem,
            row_shape: region.shape[..last].to_vec(),
            row_bytes: region.shape[last] * elem,
            file_part,
            file_column,
            window_part,
            piece_part,
            in_piece,
            piece_strides,
            columns,
            contiguous: (1..n).all(|d| region.shape[d] == spanned[d]),
            cursor: RefCell::new(Cursor {
                row: vec![0; last],
                placed: Vec::with_capacity(columns_count),
            }),
        }
    }

    fn rows(&self) -> u64 {
        self.row_shape.iter().product()
    }

    /// Sets `row` to the coordinates of row `number` in the rows' grid.
    fn set_row(&self, row: &mut [usize], number: u64) {
        let mut rest = number;
        for d in (0..row.len()).rev() {
            row[d] = (rest % self.row_shape[d]) as usize;
            rest /= self.row_shape[d];
        }
    }

    /// Moves `row` to the next row in C order.
    fn advance(&self, row: &mut [usize]) {
        for d in (0..row.len()).rev() {
            row[d] += 1;
            if (row[d] as u64) < self.row_shape[d] {
                return;
            }
            row[d] = 0;
        }
    }

    /// Byte offset in the file's data of the row at `row`.
    fn file_offset(&self, row: &[usize]) -> u64 {
        offset_in(&self.file_part, self.file_column, row) * self.elem
    }

    /// Byte offset in the window of the row at `row` (the file's, when the
    /// window is the whole file).
    fn window_offset(&self, row: &[usize]) -> u64 {
        match &self.window_part {
            Some((parts, column)) => offset_in(parts, *column, row) * self.elem,
            None => self.file_offset(row),
        }
    }

    /// Bytes of the region's rows `rows` (a segment's bytes, but for the
    /// gaps it bridges).
    fn dense_len(&self, rows: &Range<u64>) -> u64 {
        (rows.end - rows.start) * self.row_bytes
    }

    /// Calls `visit` with the segments of the region's rows, in C order:
    /// the runs of rows that follow each other in the window, each spanning
    /// the file from its first row to its last. They are not collected: a
    /// baseline plan's region of a W2 block is 30,000 one-row runs.
    pub fn for_each_segment(&self, mut visit: impl FnMut(&Segment) -> Result<()>) -> Result<()> {
        let rows = self.rows();
        let mut row = vec![0usize; self.row_shape.len()];
        if self.contiguous {
            let offset = self.file_offset(&row);
            let last: Vec<usize> = self.row_shape.iter().map(|&n| n as usize - 1).collect();
            return visit(&Segment {
                offset,
                len: self.file_offset(&last) + self.row_bytes - offset,
                rows: 0..rows,
            });
        }
        // The segment so far, and where its last row ends in the window.
        let mut current: Option<(Segment, u64)> = None;
        for number in 0..rows {
            if number > 0 {
                self.advance(&mut row);
            }
            let offset = self.file_offset(&row);
            let in_window = self.window_offset(&row);
            match &mut current {
                Some((segment, window_end)) if *window_end == in_window => {
                    segment.len = offset + self.row_bytes - segment.offset;
                    segment.rows.end = number + 1;
                    *window_end += self.row_bytes;
                }
                _ => {
                    let next = Segment {
                        offset,
                        len: self.row_bytes,
                        rows: number..number + 1,
                    };
                    if let Some((done, _)) = current.replace((next, in_window + self.row_bytes)) {
                        visit(&done)?;
                    }
                }
            }
        }
        match current {
            Some((segment, _)) => visit(&segment),
            None => Ok(()),
        }
    }

    /// Calls `visit` with the parts of `segment`, in order, each part's
    /// `at` counting from the segment's first byte in the file: past the
    /// gaps between rows when the segment bridges any.
    fn for_each_part_in_file(
        &self,
        segment: &Segment,
        mut visit: impl FnMut(Part) -> Result<()>,
    ) -> Result<()> {
        if segment.len == self.dense_len(&segment.rows) {
            return self.for_each_part(segment.rows.clone(), visit);
        }
        let mut row = vec![0usize; self.row_shape.len()];
        self.set_row(&mut row, segment.rows.start);
        for number in segment.rows.clone() {
            if number > segment.rows.start {
                self.advance(&mut row);
            }
            let row_at = (self.file_offset(&row) - segment.offset) as usize;
            self.for_each_part(number..number + 1, |part| {
                visit(Part {
                    at: row_at + part.at,
                    ..part
                })
            })?;
        }
        Ok(())
    }

    /// Calls `visit` with the parts of `rows`, in order (`Part::at` counts
    /// from the first row's start), each part of a piece that continues the
    /// one before it in the rows and in the piece merged with it.
    pub fn for_each_part(
        &self,
        rows: Range<u64>,
        mut visit: impl FnMut(Part) -> Result<()>,
    ) -> Result<()> {
        let mut pending: Option<Part> = None;
        let mut emit = |part: Part| -> Result<()> {
            match &mut pending {
                Some(p)
                    if p.piece == part.piece
                        && p.offset + p.len == part.offset
                        && p.at + p.len == part.at =>
                {
                    p.len += part.len;
                    Ok(())
                }
                _ => match pending.replace(part) {
                    Some(done) => visit(done),
                    None => Ok(()),
                },
            }
        };
        let (elem, row_bytes) = (self.elem as usize, self.row_bytes as usize);
        self.for_each_interval_run(rows, |at, count, placed| {
            for k in 0..count {
                for (column, &(piece, base, stride)) in self.columns.iter().zip(placed) {
                    emit(Part {
                        at: at + k * row_bytes + column.at,
                        piece,
                        offset: (base + k * stride) * elem,
                        len: column.len,
                    })?;
                }
            }
            Ok(())
        })?;
        flush(pending, visit)
    }

    /// Calls `visit` with the parts of `rows` as [`Run`]s (`Run::at`
    /// counts from the first row's start): run of rows by run of rows, and
    /// within one, column by column. Every byte of the rows lies in one
    /// part of one run; the runs are not in the rows' order.
    pub fn for_each_run(
        &self,
        rows: Range<u64>,
        mut visit: impl FnMut(&Run) -> Result<()>,
    ) -> Result<()> {
        let (elem, row_bytes) = (self.elem as usize, self.row_bytes as usize);
        self.for_each_interval_run(rows, |at, count, placed| {
            for (column, &(piece, base, stride)) in self.columns.iter().zip(placed) {
                let run = Run {
                    at: at + column.at,
                    piece,
                    offset: base * elem,
                    len: column.len,
                    count,
                    at_step: row_bytes,
                    offset_step: stride * elem,
                };
                visit(&run.merged())?;
            }
            Ok(())
        })
    }

    /// Calls `visit(at, count, placed)` for each run of `rows` in order:
    /// `count` rows that differ only in the innermost row dimension and
    /// stay in one piece interval along it, the first `at` bytes from the
    /// first row's start; per column, `placed` holds the piece of the
    /// run's parts, the element offset of the first, and the elements from
    /// one to the next. So a row costs one multiply-add per column.
    ///
    /// One body, over 60 lines: the path of every row moved (W1's 26
    /// million parts; a baseline plan's call per row), left whole rather
    /// than split unmeasured.
    fn for_each_interval_run(
        &self,
        rows: Range<u64>,
        mut visit: impl FnMut(usize, usize, &[(usize, usize, usize)]) -> Result<()>,
    ) -> Result<()> {
        let mut cursor = self.cursor.borrow_mut();
        let Cursor { row, placed } = &mut *cursor;
        let Some(inner) = self.row_shape.len().checked_sub(1) else {
            // One dimension: a single row.
            if rows.contains(&0) {
                placed.clear();
                placed
                    .extend((self.columns.iter()).map(|c| (c.piece_step, c.in_piece as usize, 0)));
                visit(0, 1, placed)?;
            }
            return Ok(());
        };
        let row_bytes = self.row_bytes as usize;
        let inner_len = self.row_shape[inner] as usize;
        self.set_row(row, rows.start.min(self.rows()));
        let mut number = rows.start;
        let mut row_at = 0usize;
        while number < rows.end {
            let first = row[inner];
            let stop = inner_len.min(first + (rows.end - number) as usize);
            let outer = &row[..inner];
            let outer_base: usize = outer
                .iter()
                .zip(&self.piece_part)
                .map(|(&i, part)| part[i])
                .sum();
            let intervals = &self.piece_part[inner];
            let mut j = first;
            while j < stop {
                let interval = intervals[j];
                let end = j + intervals[j..stop]
                    .iter()
                    .take_while(|&&other| other == interval)
                    .count();
                let within = self.in_piece[inner][j];
                placed.clear();
                for column in &self.columns {
                    let piece = outer_base + interval + column.piece_step;
                    let piece_strides = &self.piece_strides[piece];
                    let base = column.in_piece
                        + outer
                            .iter()
                            .zip(&self.in_piece)
                            .zip(piece_strides)
                            .map(|((&i, within), stride)| within[i] * stride)
                            .sum::<u64>();
                    let stride = piece_strides[inner];
                    placed.push((piece, (base + within * stride) as usize, stride as usize));
                }
                visit(row_at + (j - first) * row_bytes, end - j, placed)?;
                j = end;
            }
            row_at += (stop - first) * row_bytes;
            number += (stop - first) as u64;
            row[inner] = stop - 1;
            self.advance(row);
        }
        Ok(())
    }

    /// The calls that move `segment` through a packing buffer of
    /// `capacity` bytes a whole number of rows at a time, by runs: each
    /// call's rows, their offset from the segment's start and their bytes.
    /// None when the segment bridges gaps or a row does not fit.
    fn packed_calls(
        &self,
        segment: &Segment,
        capacity: usize,
    ) -> Option<impl Iterator<Item = (Range<u64>, u64, usize)>> {
        let row_bytes = self.row_bytes;
        let dense = segment.len == self.dense_len(&segment.rows);
        if !dense || row_bytes == 0 || row_bytes > capacity as u64 {
            return None;
        }
        let per_call = capacity as u64 / row_bytes;
        let Range { start, end } = segment.rows;
        Some((start..end).step_by(per_call as usize).map(move |first| {
            let last = (first + per_call).min(end);
            let skip = (first - start) * row_bytes;
            (first..last, skip, ((last - first) * row_bytes) as usize)
        }))
    }

    /// `segment`'s parts, if they average [`PACK_BELOW_BYTES`] or more and
    /// so are better moved by one vectored call than packed; None if they
    /// are to be packed. Parts merge across rows only where a row is one
    /// whole row of its piece; only then are they counted first.
    fn vectored_parts(&self, segment: &Segment) -> Result<Option<Vec<Part>>> {
        if segment.len != self.dense_len(&segment.rows) {
            // Bridged gaps go through the packing buffer.
            return Ok(None);
        }
        let rows = segment.rows.end - segment.rows.start;
        let mut count = rows * self.columns.len() as u64;
        if count > 2 && self.columns.len() == 1 && self.columns[0].whole_row {
            let mut merged = 0u64;
            self.for_each_part(segment.rows.clone(), |_| {
                merged += 1;
                Ok(())
            })?;
            count = merged;
        }
        if segment.len / count < PACK_BELOW_BYTES {
            return Ok(None);
        }
        let mut parts = Vec::new();
        self.for_each_part(segment.rows.clone(), |part| {
            parts.push(part);
            Ok(())
        })?;
        Ok(Some(parts))
    }

    /// Reads `segment` from `file` (its data at `data_offset`) into the
    /// pieces `buffers`.
    pub fn read_segment(
        &self,
        file: &File,
        path: &Path,
        data_offset: u64,
        segment: &Segment,
        buffers: &mut (impl PieceTarget + ?Sized),
        packing: &mut PackingBuffer,
    ) -> Result<()> {
        let (scratch, capacity) = (&mut packing.bytes, packing.capacity);
        let at_file = data_offset + segment.offset;
        if let Some(parts) = self.vectored_parts(segment)? {
            let mut targets = buffers.slices(&parts)?;
            return seekio::read_exact_at(file, path, &mut targets, at_file);
        }
        if let Some(calls) = self.packed_calls(segment, capacity) {
            for (rows, skip, len) in calls {
                let chunk = first_bytes(scratch, len);
                seekio::read_exact_at(file, path, &mut [IoSliceMut::new(chunk)], at_file + skip)?;
                self.for_each_run(rows, |run| buffers.copy_run_from(run, chunk))?;
            }
            return Ok(());
        }
        let total = segment.len as usize;
        scratch.resize(capacity.min(total), 0);
        // The bytes of the segment in `scratch`: [chunk_at, chunk_at + chunk_len).
        // Every byte is read, in order, so each call continues the last.
        let (mut chunk_at, mut chunk_len) = (0usize, 0usize);
        self.for_each_part_in_file(segment, |part| {
            let mut done = 0;
            while done < part.len {
                let at = part.at + done;
                while at >= chunk_at + chunk_len {
                    chunk_at += chunk_len;
                    chunk_len = capacity.min(total - chunk_at);
                    let chunk = &mut scratch[..chunk_len];
                    seekio::read_exact_at(
                        file,
                        path,
                        &mut [IoSliceMut::new(chunk)],
                        at_file + chunk_at as u64,
                    )?;
                }
                let n = (part.len - done).min(chunk_at + chunk_len - at);
                let from = at - chunk_at;
                buffers
                    .bytes(part.piece, part.offset + done, n)?
                    .copy_from_slice(&scratch[from..from + n]);
                done += n;
            }
            Ok(())
        })
    }

    /// Reads every segment from `file` (its data at `data_offset`) into
    /// the pieces `buffers`, through this thread's packing buffer, telling
    /// `read` of each one read.
    pub fn read_segments(
        &self,
        (file, path, data_offset): (&File, &Path, u64),
        buffers: &mut (impl PieceTarget + ?Sized),
        mut read: impl FnMut(&Segment),
    ) -> Result<()> {
        PackingBuffer::of_this_thread(|packing| {
            self.for_each_segment(|segment| {
                self.read_segment(file, path, data_offset, segment, buffers, packing)?;
                read(segment);
                Ok(())
            })
        })
    }

    /// Writes `segment` to `file` (its data at `data_offset`) from the
    /// pieces `pieces`, zeros in the gaps it bridges, and after its last
    /// row up to its end when it was made longer than its rows (a slab of a
    /// padded edge chunk, to meet the next).
    pub fn write_segment(
        &self,
        file: &File,
        path: &Path,
        data_offset: u64,
        segment: &Segment,
        pieces: &[Vec<u8>],
        packing: &mut PackingBuffer,
    ) -> Result<()> {
        let (scratch, capacity) = (&mut packing.bytes, packing.capacity);
        let at_file = data_offset + segment.offset;
        if let Some(parts) = self.vectored_parts(segment)? {
            let mut sources: Vec<IoSlice> = parts
                .iter()
                .map(|p| IoSlice::new(&pieces[p.piece][p.offset..p.offset + p.len]))
                .collect();
            return seekio::write_all_at(file, path, &mut sources, at_file);
        }
        if let Some(calls) = self.packed_calls(segment, capacity) {
            for (rows, skip, len) in calls {
                let chunk = first_bytes(scratch, len);
                // Every byte of the rows lies in a run: none is left stale.
                self.for_each_run(rows, |run| run.gather_into(pieces, chunk))?;
                seekio::write_all_at(file, path, &mut [IoSlice::new(chunk)], at_file + skip)?;
            }
            return Ok(());
        }
        scratch.clear();
        scratch.reserve(capacity.min(segment.len as usize));
        let mut flushed = 0u64;
        // Fills `scratch` with `n` bytes from `source` (None: zeros, for a
        // bridged gap), writing it out each time it is full.
        let mut push = |scratch: &mut Vec<u8>, source: Option<&[u8]>, n: usize| -> Result<()> {
            let mut done = 0;
            while done < n {
                let take = (n - done).min(capacity - scratch.len());
                match source {
                    Some(bytes) => scratch.extend_from_slice(&bytes[done..done + take]),
                    None => scratch.resize(scratch.len() + take, 0),
                }
                done += take;
                if scratch.len() == capacity {
                    seekio::write_all_at(
                        file,
                        path,
                        &mut [IoSlice::new(scratch)],
                        at_file + flushed,
                    )?;
                    flushed += capacity as u64;
                    scratch.clear();
                }
            }
            Ok(())
        };
        let mut end = 0usize;
        self.for_each_part_in_file(segment, |part| {
            push(scratch, None, part.at - end)?;
            let bytes = &pieces[part.piece][part.offset..part.offset + part.len];
            push(scratch, Some(bytes), part.len)?;
            end = part.at + part.len;
            Ok(())
        })?;
        // Padding after the last row, when the segment was extended over it.
        push(scratch, None, segment.len as usize - end)?;
        if !scratch.is_empty() {
            seekio::write_all_at(file, path, &mut [IoSlice::new(scratch)], at_file + flushed)?;
            scratch.clear();
        }
        Ok(())
    }

    /// Copies `segment`'s bytes from `span`, which holds the file's data
    /// from byte `span_offset` on, into the pieces `buffers`.
    pub fn copy_segment_from(
        &self,
        span: &[u8],
        span_offset: u64,
        segment: &Segment,
        buffers: &mut (impl PieceTarget + ?Sized),
    ) -> Result<()> {
        let base = (segment.offset - span_offset) as usize;
        let bytes = span.get(base..base + segment.len as usize).ok_or_else(|| {
            crate::error::Error::Internal("plan error: a span shorter than its segment".into())
        })?;
        if segment.len == self.dense_len(&segment.rows) {
            return self.for_each_run(segment.rows.clone(), |run| {
                buffers.copy_run_from(run, bytes)
            });
        }
        self.for_each_part_in_file(segment, |part| {
            let source = bytes
                .get(part.at..part.at + part.len)
                .ok_or_else(beyond_rows)?;
            buffers
                .bytes(part.piece, part.offset, part.len)?
                .copy_from_slice(source);
            Ok(())
        })
    }

    /// Copies `segment`'s bytes from the `pieces` into `rows`, which holds
    /// the segment's bytes alone.
    pub fn gather_segment(
        &self,
        pieces: &[Vec<u8>],
        segment: &Segment,
        rows: &mut [u8],
    ) -> Result<()> {
        if segment.len != self.dense_len(&segment.rows) || rows.len() as u64 != segment.len {
            return Err(crate::error::Error::Internal(
                "plan error: a segment gathered into bytes not its size".into(),
            ));
        }
        self.for_each_run(segment.rows.clone(), |run| run.gather_into(pieces, rows))
    }

    /// Writes the element `fill` (its bytes) over `segment`'s parts of the
    /// pieces `buffers`.
    pub fn fill_segment(
        &self,
        segment: &Segment,
        buffers: &mut (impl PieceTarget + ?Sized),
        fill: &[u8],
    ) -> Result<()> {
        // Piece buffers may be reused ones (the executor's pool): zeros are
        // written too.
        self.for_each_part(segment.rows.clone(), |part| {
            let bytes = buffers.bytes(part.piece, part.offset, part.len)?;
            for element in bytes.chunks_exact_mut(fill.len()) {
                element.copy_from_slice(fill);
            }
            Ok(())
        })
    }
}

/// A step's pieces, filled by several threads at once, each copying
/// whole input blocks into them ([`claim`](Self::claim)): the blocks are
/// distinct cells of one partition, so their parts of the step are
/// disjoint boxes and no two threads write the same byte; a thread that
/// has read or decoded a block copies it at once, with no wait for the
/// others. That the cells are distinct, and that each is claimed once, is
/// checked, not assumed: it is what makes the writes sound.
pub struct SharedPieces<'b> {
    grid: &'b PieceGrid,
    /// Each piece's start and length, borrowed mutably for `'b`.
    pieces: Vec<(*mut u8, usize)>,
    regions: Vec<Region>,
    /// Whether each region has been claimed.
    claimed: Vec<std::sync::atomic::AtomicBool>,
    elem: u64,
    _buffers: std::marker::PhantomData<&'b mut [Vec<u8>]>,
}

// SAFETY: the pointers are to the buffers borrowed mutably for `'b`, so
// nothing else touches them meanwhile; threads write through them only
// within the regions they claimed, which are disjoint and claimed once.
unsafe impl Send for SharedPieces<'_> {}
// SAFETY: as for Send: `claim` takes `&self` and hands each region's
// parts to one caller only.
unsafe impl Sync for SharedPieces<'_> {}

impl<'b> SharedPieces<'b> {
    /// The pieces `buffers` of `grid`, to be filled with `cells` of
    /// `partition` (in C order, each once) where they meet the step the
    /// grid cuts.
    pub fn new(
        grid: &'b PieceGrid,
        buffers: &'b mut [Vec<u8>],
        (partition, cells): (&Partition, &[Vec<usize>]),
        elem: u64,
    ) -> Result<SharedPieces<'b>> {
        let plan_error =
            |what: String| crate::error::Error::Internal(format!("plan error: {what}"));
        if buffers.len() != grid.count() {
            return Err(plan_error(format!(
                "{} pieces for a grid of {}",
                buffers.len(),
                grid.count()
            )));
        }
        for (local, buffer) in buffers.iter().enumerate() {
            let volume = grid.piece_box(local).volume();
            if buffer.len() as u64 != volume * elem {
                return Err(plan_error(format!(
                    "a piece of {} bytes for a box of {volume} elements",
                    buffer.len()
                )));
            }
        }
        if cells.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(plan_error("input blocks not distinct, in C order".into()));
        }
        let step = grid.container();
        let regions = cells
            .iter()
            .map(|cell| {
                partition
                    .block(cell)
                    .intersect(&step)
                    .ok_or_else(|| plan_error(format!("input block {cell:?} outside its step")))
            })
            .collect::<Result<Vec<Region>>>()?;
        Ok(SharedPieces {
            grid,
            pieces: buffers
                .iter_mut()
                .map(|buffer| (buffer.as_mut_ptr(), buffer.len()))
                .collect(),
            claimed: regions.iter().map(|_| Default::default()).collect(),
            regions,
            elem,
            _buffers: std::marker::PhantomData,
        })
    }

    /// Region `index`, to be filled by the caller alone: each region is
    /// claimed once.
    pub fn claim(&self, index: usize) -> Result<ClaimedRegion<'_>> {
        let internal = |what: &str| crate::error::Error::Internal(format!("plan error: {what}"));
        let region = self
            .regions
            .get(index)
            .ok_or_else(|| internal("no such block"))?;
        if self.claimed[index].swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Err(internal("a block copied twice"));
        }
        Ok(ClaimedRegion {
            region,
            grid: self.grid,
            elem: self.elem,
            pieces: &self.pieces,
        })
    }
}

/// One region of [`SharedPieces`], claimed by one thread: the parts of the
/// pieces inside it, which no other thread touches.
pub struct ClaimedRegion<'s> {
    pub region: &'s Region,
    grid: &'s PieceGrid,
    elem: u64,
    pieces: &'s [(*mut u8, usize)],
}

impl ClaimedRegion<'_> {
    /// The region's rows as they lie in its file (`place`) and in the pieces.
    pub fn layout(&self, place: &InFile) -> RowLayout {
        RowLayout::in_file(self.region, place, self.elem, self.grid)
    }

    /// The `len` bytes at `offset` in piece `piece`, checked to lie in it.
    fn part_ptr(&self, piece: usize, offset: usize, len: usize) -> Result<*mut u8> {
        let &(start, piece_len) = self.pieces.get(piece).ok_or_else(beyond_piece)?;
        if offset.checked_add(len).is_none_or(|end| end > piece_len) {
            return Err(beyond_piece());
        }
        // SAFETY: offset is within the piece's allocation (checked above).
        Ok(unsafe { start.add(offset) })
    }
}

// The parts a region's layout names lie inside the region (the layout's
// tests hold it to that), and inside their pieces (checked): so the slices
// below are of bytes no other claimed region, and so no other thread,
// touches while this one is held.
impl PieceTarget for ClaimedRegion<'_> {
    fn bytes(&mut self, piece: usize, offset: usize, len: usize) -> Result<&mut [u8]> {
        let start = self.part_ptr(piece, offset, len)?;
        // SAFETY: see above; the slice lives no longer than `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(start, len) })
    }

    fn slices(&mut self, parts: &[Part]) -> Result<Vec<IoSliceMut<'_>>> {
        let mut ends: Vec<usize> = vec![0; self.pieces.len()];
        let mut targets = Vec::with_capacity(parts.len());
        for part in parts {
            // Each part after the last in its piece: the slices never overlap.
            let end = ends.get_mut(part.piece).ok_or_else(beyond_piece)?;
            if part.offset < *end {
                return Err(beyond_piece());
            }
            *end = part.offset + part.len;
            let start = self.part_ptr(part.piece, part.offset, part.len)?;
            // SAFETY: see above, and the slices are disjoint (checked).
            targets.push(IoSliceMut::new(unsafe {
                std::slice::from_raw_parts_mut(start, part.len)
            }));
        }
        Ok(targets)
    }

    fn copy_run_from(&mut self, run: &Run, rows: &[u8]) -> Result<()> {
        let rows = run_rows(run, rows)?;
        let start = self.part_ptr(run.piece, run.offset, run.piece_span())?;
        for k in 0..run.count {
            let from = &rows[k * run.at_step..k * run.at_step + run.len];
            // SAFETY: see above; the part lies inside the run's span of
            // the piece (checked), and `from` is another allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    from.as_ptr(),
                    start.add(k * run.offset_step),
                    run.len,
                )
            };
        }
        Ok(())
    }
}

/// The element offset of the row at `row`: the sum of its coordinates'
/// offsets in `parts`, plus `column`.
fn offset_in(parts: &[Vec<u64>], column: u64, row: &[usize]) -> u64 {
    row.iter().zip(parts).map(|(&i, part)| part[i]).sum::<u64>() + column
}

/// The first `len` bytes of `buffer`, grown to hold them: what an earlier
/// call left there stays, to be overwritten.
fn first_bytes(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    &mut buffer[..len]
}

/// Hands the last merged part, if any, to `visit`.
fn flush(pending: Option<Part>, mut visit: impl FnMut(Part) -> Result<()>) -> Result<()> {
    match pending {
        Some(part) => visit(part),
        None => Ok(()),
    }
}

/// Where a region's parts are copied: a step's own pieces, or one
/// region's parts of pieces several threads fill at once ([`ClaimedRegion`]).
pub trait PieceTarget {
    /// The `len` bytes at `offset` of piece `piece`.
    fn bytes(&mut self, piece: usize, offset: usize, len: usize) -> Result<&mut [u8]>;
    /// The bytes of `parts` (distinct, each after the last in its piece),
    /// for one vectored read.
    fn slices(&mut self, parts: &[Part]) -> Result<Vec<IoSliceMut<'_>>>;
    /// Copies `run`'s parts from `rows`, the bytes its `at` counts in.
    fn copy_run_from(&mut self, run: &Run, rows: &[u8]) -> Result<()>;
}

fn beyond_piece() -> crate::error::Error {
    crate::error::Error::Internal("plan error: a part beyond its piece".into())
}

fn beyond_rows() -> crate::error::Error {
    crate::error::Error::Internal("plan error: a part beyond its rows".into())
}

/// `run`'s bytes in `rows`, checked to lie there.
fn run_rows<'r>(run: &Run, rows: &'r [u8]) -> Result<&'r [u8]> {
    rows.get(run.at..run.at + run.rows_span())
        .ok_or_else(beyond_rows)
}

impl PieceTarget for [Vec<u8>] {
    fn bytes(&mut self, piece: usize, offset: usize, len: usize) -> Result<&mut [u8]> {
        self.get_mut(piece)
            .and_then(|buffer| buffer.get_mut(offset..offset + len))
            .ok_or_else(beyond_piece)
    }

    fn slices(&mut self, parts: &[Part]) -> Result<Vec<IoSliceMut<'_>>> {
        let mut rests: Vec<(usize, &mut [u8])> = self
            .iter_mut()
            .map(|b| (0usize, b.as_mut_slice()))
            .collect();
        let mut targets = Vec::with_capacity(parts.len());
        for part in parts {
            let (base, rest) = rests.get_mut(part.piece).ok_or_else(beyond_piece)?;
            let taken = std::mem::take(rest);
            let skip = part.offset.checked_sub(*base).ok_or_else(beyond_piece)?;
            if skip + part.len > taken.len() {
                return Err(beyond_piece());
            }
            let (_, from_offset) = taken.split_at_mut(skip);
            let (slice, after) = from_offset.split_at_mut(part.len);
            *rest = after;
            *base = part.offset + part.len;
            targets.push(IoSliceMut::new(slice));
        }
        Ok(targets)
    }

    fn copy_run_from(&mut self, run: &Run, rows: &[u8]) -> Result<()> {
        let rows = run_rows(run, rows)?;
        let piece = self
            .get_mut(run.piece)
            .and_then(|piece| piece.get_mut(run.offset..run.offset + run.piece_span()))
            .ok_or_else(beyond_piece)?;
        for k in 0..run.count {
            let (to, from) = (k * run.offset_step, k * run.at_step);
            piece[to..to + run.len].copy_from_slice(&rows[from..from + run.len]);
        }
        Ok(())
    }
}

impl PieceTarget for Vec<Vec<u8>> {
    fn bytes(&mut self, piece: usize, offset: usize, len: usize) -> Result<&mut [u8]> {
        self.as_mut_slice().bytes(piece, offset, len)
    }

    fn slices(&mut self, parts: &[Part]) -> Result<Vec<IoSliceMut<'_>>> {
        self.as_mut_slice().slices(parts)
    }

    fn copy_run_from(&mut self, run: &Run, rows: &[u8]) -> Result<()> {
        self.as_mut_slice().copy_run_from(run, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::geometry::{linear_offset, Axis, IndexBox};
    use crate::engine::workers::Workers;
    use proptest::prelude::*;
    use std::os::unix::fs::FileExt;

    /// One dimension of a case: the array's length, then numbers that
    /// place the region, the container (around the region), the file block
    /// (around the region, maybe past the array: a padded edge chunk) and
    /// the cutting step.
    type Dim = (u64, [u64; 7]);

    struct Case {
        region: Region,
        container: Region,
        file_box: Region,
        grid: PieceGrid,
    }

    fn case(dims: &[Dim]) -> Case {
        let (mut region, mut container, mut file_box, mut axes) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &(len, n) in dims {
            let lo = n[0] % len;
            let hi = lo + 1 + n[1] % (len - lo);
            region.push((lo, hi));
            container.push((n[2] % (lo + 1), hi + n[3] % (len - hi + 1)));
            file_box.push((n[4] % (lo + 1), hi + n[5] % (len - hi + 3)));
            axes.push(Axis::regular(len, 1 + n[6] % len));
        }
        let boxed = |b: Vec<(u64, u64)>| {
            Region::new(
                b.iter().map(|&(lo, _)| lo).collect(),
                b.iter().map(|&(lo, hi)| hi - lo).collect(),
            )
        };
        let container = boxed(container);
        Case {
            grid: PieceGrid::new(&Partition::new(axes), &container),
            region: boxed(region),
            container,
            file_box: boxed(file_box),
        }
    }

    fn segments(layout: &RowLayout) -> Vec<Segment> {
        let mut segments = Vec::new();
        layout
            .for_each_segment(|segment| {
                segments.push(segment.clone());
                Ok(())
            })
            .unwrap();
        segments
    }

    fn inside(region: &Region, point: &[u64]) -> bool {
        (0..region.ndim()).all(|d| region.origin[d] <= point[d] && point[d] < region.end(d))
    }

    /// A distinct 4-byte value per element of the array.
    fn value(point: &[u64]) -> [u8; 4] {
        let id = point.iter().fold(0u64, |acc, &x| acc * 64 + x + 1);
        (id as u32).to_le_bytes()
    }

    fn point_of(region: &Region, index: &[usize]) -> Vec<u64> {
        index
            .iter()
            .zip(&region.origin)
            .map(|(&i, o)| o + i as u64)
            .collect()
    }

    /// The file block's data: every element's value (also past the region).
    fn file_bytes(file_box: &Region) -> Vec<u8> {
        let mut bytes = Vec::new();
        for index in IndexBox::grid(
            &file_box
                .shape
                .iter()
                .map(|&s| s as usize)
                .collect::<Vec<_>>(),
        ) {
            bytes.extend_from_slice(&value(&point_of(file_box, &index)));
        }
        bytes
    }

    /// The pieces, 0xEE where the region does not reach, as a naive
    /// element-by-element copy fills them.
    fn expected_pieces(c: &Case) -> Vec<Vec<u8>> {
        (0..c.grid.count())
            .map(|local| {
                let piece = c.grid.piece_box(local);
                let mut bytes = vec![0xEE; piece.volume() as usize * 4];
                let shape: Vec<usize> = piece.shape.iter().map(|&s| s as usize).collect();
                for index in IndexBox::grid(&shape) {
                    let point = point_of(&piece, &index);
                    if inside(&c.region, &point) {
                        let local: Vec<u64> = index.iter().map(|&i| i as u64).collect();
                        let at = linear_offset(&local, &strides(&piece.shape)) as usize * 4;
                        bytes[at..at + 4].copy_from_slice(&value(&point));
                    }
                }
                bytes
            })
            .collect()
    }

    fn empty_pieces(c: &Case) -> Vec<Vec<u8>> {
        c.grid
            .volumes()
            .map(|v| vec![0xEE; v as usize * 4])
            .collect()
    }

    fn dims() -> impl Strategy<Value = Vec<Dim>> {
        prop::collection::vec((1u64..=9, prop::array::uniform7(0u64..64)), 1..=3)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Segments are the file's maximal runs of the region's rows, and
        /// their parts put every byte where a naive copy puts it.
        #[test]
        fn parts_put_every_byte_where_a_naive_copy_does(dims in dims()) {
            let c = case(&dims);
            prop_assert!(inside(&c.container, &c.region.origin));
            let layout = RowLayout::new(&c.region, &c.file_box, 4, &c.grid);
            let segments = segments(&layout);
            let row_bytes = c.region.shape[c.region.ndim() - 1] * 4;
            let mut next_row = 0;
            for pair in segments.windows(2) {
                prop_assert!(pair[0].offset + pair[0].len < pair[1].offset, "not maximal: {:?}", pair);
            }
            for segment in &segments {
                prop_assert_eq!(segment.rows.start, next_row);
                prop_assert_eq!(segment.len, (segment.rows.end - segment.rows.start) * row_bytes);
                next_row = segment.rows.end;
            }
            prop_assert_eq!(next_row, c.region.volume() / c.region.shape[c.region.ndim() - 1]);

            let span = file_bytes(&c.file_box);
            let mut pieces = empty_pieces(&c);
            for segment in &segments {
                layout.copy_segment_from(&span, 0, segment, &mut pieces).unwrap();
            }
            prop_assert_eq!(&pieces, &expected_pieces(&c));
        }

        /// Over any range of rows, the runs name each byte of the rows
        /// once, at the piece and offset the parts in the file's order do.
        #[test]
        fn runs_name_the_bytes_the_parts_do(dims in dims(), cut in (0u64..1000, 0u64..1000)) {
            let c = case(&dims);
            let layout = RowLayout::new(&c.region, &c.file_box, 4, &c.grid);
            let rows = layout.rows();
            let (a, b) = (cut.0 % (rows + 1), cut.1 % (rows + 1));
            let rows = a.min(b)..a.max(b);
            let mut by_parts = std::collections::BTreeMap::new();
            layout.for_each_part(rows.clone(), |part| {
                for i in 0..part.len {
                    by_parts.insert(part.at + i, (part.piece, part.offset + i));
                }
                Ok(())
            }).unwrap();
            let mut runs = Vec::new();
            layout.for_each_run(rows.clone(), |run| {
                runs.push(*run);
                Ok(())
            }).unwrap();
            let mut by_runs = std::collections::BTreeMap::new();
            for run in runs {
                prop_assert!(run.count >= 1);
                for k in 0..run.count {
                    for i in 0..run.len {
                        let named = (run.piece, run.offset + k * run.offset_step + i);
                        prop_assert!(by_runs.insert(run.at + k * run.at_step + i, named).is_none());
                    }
                }
            }
            prop_assert_eq!(by_runs.len() as u64, (rows.end - rows.start) * layout.row_bytes);
            prop_assert_eq!(by_runs, by_parts);
        }

        /// Reading from a file and writing to one, packed through buffers
        /// of any size or not, move exactly the region's bytes.
        #[test]
        fn reads_and_writes_through_any_buffer_move_exactly_the_region(
            dims in dims(),
            capacity in 1usize..40,
        ) {
            let c = case(&dims);
            let layout = RowLayout::new(&c.region, &c.file_box, 4, &c.grid);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("block");
            let file = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
            let data = file_bytes(&c.file_box);
            let data_offset = 3;
            file.write_all_at(&data, data_offset).unwrap();
            let expected = expected_pieces(&c);
            for capacity in [capacity, PACKED_BYTES] {
                let mut packing = PackingBuffer::with_capacity(capacity);
                let mut pieces = empty_pieces(&c);
                for segment in segments(&layout) {
                    layout
                        .read_segment(&file, &path, data_offset, &segment, &mut pieces, &mut packing)
                        .unwrap();
                }
                prop_assert_eq!(&pieces, &expected);

                let out_path = dir.path().join("out");
                let out = File::create(&out_path).unwrap();
                for segment in segments(&layout) {
                    layout
                        .write_segment(&out, &out_path, data_offset, &segment, &expected, &mut packing)
                        .unwrap();
                }
                let written = std::fs::read(&out_path).unwrap();
                // The region's elements, and nothing else, hold their values.
                for (k, index) in IndexBox::grid(
                    &c.file_box.shape.iter().map(|&s| s as usize).collect::<Vec<_>>(),
                )
                .enumerate()
                {
                    let point = point_of(&c.file_box, &index);
                    let at = data_offset as usize + k * 4;
                    let got = written.get(at..at + 4).unwrap_or(&[]);
                    if inside(&c.region, &point) {
                        prop_assert_eq!(got, &value(&point)[..]);
                    } else {
                        prop_assert!(got.iter().all(|&b| b == 0), "wrote outside the region at {:?}", point);
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Blocks copied into the pieces by any number of workers at once
        /// put every byte where one thread's copy puts it, and nothing
        /// else: here the case's region, cut along its first dimension
        /// into the cells of a partition, all in one file.
        #[test]
        fn blocks_copied_at_once_fill_the_pieces_as_one_thread_does(
            dims in dims(),
            cuts in prop::collection::vec(0u64..64, 0..4),
            workers in 1usize..=9,
        ) {
            let c = case(&dims);
            let len = |d: usize| dims[d].0;
            let (lo, hi) = (c.region.origin[0], c.region.end(0));
            let mut first: Vec<u64> = cuts.iter().map(|n| lo + n % (hi - lo)).collect();
            first.extend([0, lo, hi, len(0)]);
            first.sort_unstable();
            let mut axes = vec![Axis::from_bounds(first)];
            for d in 1..dims.len() {
                let mut bounds = vec![0, c.region.origin[d], c.region.end(d), len(d)];
                bounds.sort_unstable();
                axes.push(Axis::from_bounds(bounds));
            }
            let partition = Partition::new(axes);
            let cells: Vec<Vec<usize>> = IndexBox::new(partition.overlapping(&c.region)).collect();
            let bytes = file_bytes(&c.file_box);
            let mut pieces = empty_pieces(&c);
            let shared = SharedPieces::new(&c.grid, &mut pieces, (&partition, &cells), 4).unwrap();
            let pool = Workers::new(workers).unwrap();
            let copied = pool.map(0..cells.len(), |k| {
                let mut claimed = shared.claim(k)?;
                let place = InFile::of(claimed.region, &c.file_box);
                let layout = claimed.layout(&place);
                layout.for_each_segment(|s| layout.copy_segment_from(&bytes, 0, s, &mut claimed))
            });
            prop_assert!(copied.iter().all(Result::is_ok));
            prop_assert!(shared.claim(0).is_err(), "a block claimed twice");
            drop(shared);
            prop_assert_eq!(&pieces, &expected_pieces(&c));
        }
    }

    #[test]
    fn repeated_cells_or_cells_outside_the_step_are_refused() {
        let step = Region::new(vec![0, 0], vec![4, 4]);
        let grid = PieceGrid::new(&Partition::regular(&[8, 8], &[2, 2]), &step);
        let mut pieces: Vec<Vec<u8>> = grid.volumes().map(|v| vec![0; v as usize]).collect();
        let inputs = Partition::regular(&[8, 8], &[3, 3]);
        let twice = [vec![0, 0], vec![0, 1], vec![0, 1]];
        assert!(SharedPieces::new(&grid, &mut pieces, (&inputs, &twice), 1).is_err());
        let unordered = [vec![0, 1], vec![0, 0]];
        assert!(SharedPieces::new(&grid, &mut pieces, (&inputs, &unordered), 1).is_err());
        let outside = [vec![0, 0], vec![2, 2]];
        assert!(SharedPieces::new(&grid, &mut pieces, (&inputs, &outside), 1).is_err());
        let step_cells = [vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]];
        assert!(SharedPieces::new(&grid, &mut pieces, (&inputs, &step_cells), 1).is_ok());
        let mut short = pieces.clone();
        short[0].pop();
        assert!(SharedPieces::new(&grid, &mut short, (&inputs, &step_cells), 1).is_err());
    }

    /// A window between the region and the file block of `c`, from the
    /// numbers that placed the container.
    fn window_of(c: &Case, dims: &[Dim]) -> Region {
        let (origin, shape) = (0..c.region.ndim())
            .map(|d| {
                let n = dims[d].1;
                let (lo, hi) = (c.region.origin[d], c.region.end(d));
                let (file_lo, file_hi) = (c.file_box.origin[d], c.file_box.end(d));
                let start = lo - n[2] % (lo - file_lo + 1);
                let end = hi + n[3] % (file_hi - hi + 1);
                (start, end - start)
            })
            .unzip();
        Region::new(origin, shape)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Through a window, segments are the runs of rows the region makes
        /// in a file of the window's shape, each spanning the real file from
        /// its first row to its last; reads drop the bytes between, writes
        /// fill them with zeros, and both move the region's bytes exactly.
        #[test]
        fn bridged_segments_follow_the_window_and_move_exactly_the_region(
            dims in dims(),
            capacity in 1usize..40,
        ) {
            let c = case(&dims);
            let window = window_of(&c, &dims);
            let place = InFile::of(&c.region, &c.file_box)
                .bridging(window.relative_to(&c.file_box));
            let layout = RowLayout::in_file(&c.region, &place, 4, &c.grid);
            let as_file = RowLayout::new(&c.region, &window, 4, &c.grid);
            let (bridged, modelled) = (segments(&layout), segments(&as_file));
            prop_assert_eq!(
                bridged.iter().map(|s| s.rows.clone()).collect::<Vec<_>>(),
                modelled.iter().map(|s| s.rows.clone()).collect::<Vec<_>>()
            );
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("block");
            let file = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
            let data = file_bytes(&c.file_box);
            file.write_all_at(&data, 5).unwrap();
            let expected = expected_pieces(&c);
            for capacity in [capacity, PACKED_BYTES] {
                let mut packing = PackingBuffer::with_capacity(capacity);
                let mut pieces = empty_pieces(&c);
                for segment in &bridged {
                    layout
                        .read_segment(&file, &path, 5, segment, &mut pieces, &mut packing)
                        .unwrap();
                }
                prop_assert_eq!(&pieces, &expected);
                let mut copied = empty_pieces(&c);
                for segment in &bridged {
                    layout.copy_segment_from(&data, 0, segment, &mut copied).unwrap();
                }
                prop_assert_eq!(&copied, &expected);

                let out_path = dir.path().join("out");
                let out = File::create(&out_path).unwrap();
                out.write_all_at(&vec![0xAB; data.len()], 0).unwrap();
                for segment in &bridged {
                    layout
                        .write_segment(&out, &out_path, 0, segment, &expected, &mut packing)
                        .unwrap();
                }
                let written = std::fs::read(&out_path).unwrap();
                let starts: Vec<u64> = bridged.iter().map(|s| s.offset).collect();
                for (k, index) in IndexBox::grid(
                    &c.file_box.shape.iter().map(|&s| s as usize).collect::<Vec<_>>(),
                )
                .enumerate()
                {
                    let point = point_of(&c.file_box, &index);
                    let at = k * 4;
                    let got = &written[at..at + 4];
                    let spanned = bridged
                        .iter()
                        .any(|s| s.offset <= at as u64 && (at as u64) < s.offset + s.len);
                    if inside(&c.region, &point) {
                        prop_assert_eq!(got, &value(&point)[..]);
                    } else if spanned {
                        prop_assert!(got.iter().all(|&b| b == 0), "gap at {:?} not zeros ({:?})", point, starts);
                    } else {
                        prop_assert!(got.iter().all(|&b| b == 0xAB), "wrote outside the segments at {:?}", point);
                    }
                }
            }
        }
    }

    #[test]
    fn a_truncated_file_is_reported_not_read_as_zeros() {
        let c = case(&[(6, [0, 5, 0, 0, 0, 0, 2]), (6, [0, 5, 0, 0, 0, 0, 3])]);
        let layout = RowLayout::new(&c.region, &c.file_box, 4, &c.grid);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        std::fs::write(&path, &file_bytes(&c.file_box)[..100]).unwrap();
        let file = File::open(&path).unwrap();
        let mut pieces = empty_pieces(&c);
        let segment = &segments(&layout)[0];
        let err = layout
            .read_segment(
                &file,
                &path,
                0,
                segment,
                &mut pieces,
                &mut PackingBuffer::new(),
            )
            .unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
