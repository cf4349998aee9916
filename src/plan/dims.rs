//! One dimension at a time: the read intervals, the write intervals that
//! follow them, and the counts over them that the seek and memory formulas
//! multiply across dimensions (see `docs/keep.md`). Every plan is a product
//! of these per-dimension options, which is what keeps planning cheap.

use serde::Serialize;

use crate::array::geometry::Axis;

/// How write intervals follow read intervals along one dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// Write up to the last output boundary in the read interval; keep the
    /// tail in memory until the next read interval completes it.
    Keep,
    /// Write every read interval at once, cutting output blocks.
    Immediate,
}

/// One dimension's choice: read intervals, and how writes follow them.
#[derive(Clone, Debug)]
pub(super) struct DimOption {
    pub(super) read_step: u64,
    pub(super) mode: WriteMode,
    pub(super) read: Axis,
    pub(super) write: Axis,
    pub(super) completes: Vec<Option<usize>>,
    /// Per read interval: length of the write interval it completes (0: none).
    pub(super) completed_len: Vec<u64>,
    pub(super) reads: Overlap,
    /// What the bytes bridged reads read past their rows need.
    pub(super) read_gaps: Gaps,
    pub(super) writes: Overlap,
    /// What the padding a write fills between the rows of a padded edge
    /// chunk needs.
    pub(super) write_gaps: Gaps,
    /// Counts over read intervals for read-continuation prediction.
    pub(super) unit_reads: u64,
    pub(super) unit_reads_completing: u64,
    pub(super) inner_reads: u64,
    pub(super) inner_reads_completing: u64,
    pub(super) last_read_completes: bool,
    /// Read intervals that are exactly one input interval, its file no
    /// longer (a read block's piece spans its file whole here), and those
    /// of them that complete a write interval: where, with this axis
    /// visited outside the one that carries, a read can continue the
    /// previous read block's last (`cost::read_seeks`).
    pub(super) exact_reads: u64,
    pub(super) exact_reads_completing: u64,
    pub(super) max_read_extent: u64,
    /// Whether every read interval lies inside one input interval.
    pub(super) reads_within_one_input: bool,
    /// Whether every write interval lies inside one output interval.
    pub(super) writes_within_one_output: bool,
    /// Per read interval: the planes where, along the first dimension, a
    /// read block may be cut into steps ([`step_axis`]), with whether each
    /// is an input and an output boundary.
    ///
    /// [`step_axis`]: super::steps::step_axis
    pub(super) cuts: Vec<Vec<Cut>>,
    /// The longest step a read interval can be cut down to (a lower bound
    /// on the thickest step, for pruning the search).
    pub(super) min_step_extent: u64,
}

/// A plane inside a read interval where it may be cut into steps: an input
/// or output boundary inside the write interval the read interval completes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cut {
    pub(super) at: u64,
    pub(super) input_boundary: bool,
    pub(super) output_boundary: bool,
}

/// How the intervals of a moving axis (read or write) cut the intervals of a
/// file axis (input or output blocks) along one dimension.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Overlap {
    /// Non-empty (moving, file) interval pairs: pieces along this dimension.
    pub(super) pieces: u64,
    /// Pieces spanning their file interval whole.
    pub(super) whole: u64,
    /// Sum of piece extents (the axis length).
    pub(super) extent_sum: u64,
}

/// Sums over the (read interval, input interval) pairs along one
/// dimension, each pair with its extent `P`, its window's `W` and its
/// file's `F` ([`Problem::read_window`]): what the bytes a read reads
/// between the rows of a window smaller than its file add up to
/// (`cost::gap_elements`). Likewise over (write interval, output interval)
/// pairs, the window being the output block and the file its padded chunk.
///
/// [`Problem::read_window`]: super::Problem::read_window
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Gaps {
    /// Over the pairs spanning their window: Σ W, Σ (W − 1), Σ F.
    pub(super) whole_window: u128,
    pub(super) whole_window_less_one: u128,
    pub(super) whole_file: u128,
    /// Over the pairs not spanning their window: their count, Σ P, Σ (P − 1).
    pub(super) cut_count: u128,
    pub(super) cut_extent: u128,
    pub(super) cut_extent_less_one: u128,
    /// Over all pairs: Σ (P − 1).
    pub(super) extent_less_one: u128,
}

impl Gaps {
    fn of(moving: &Axis, file: &Axis, windows: &[u64], files: &[u64]) -> Gaps {
        let mut gaps = Gaps::default();
        for f in 0..file.count() {
            let (start, end) = (file.start(f), file.end(f));
            for m in moving.overlapping(start, end) {
                let extent = (moving.end(m).min(end) - moving.start(m).max(start)) as u128;
                gaps.extent_less_one += extent - 1;
                if moving.start(m) <= start && moving.end(m) >= end && windows[f] == end - start {
                    gaps.whole_window += windows[f] as u128;
                    gaps.whole_window_less_one += windows[f] as u128 - 1;
                    gaps.whole_file += files[f] as u128;
                } else {
                    gaps.cut_count += 1;
                    gaps.cut_extent += extent;
                    gaps.cut_extent_less_one += extent - 1;
                }
            }
        }
        gaps
    }
}

impl Overlap {
    /// `file_extent(f)`: the length of file interval `f`'s file along this
    /// dimension; a piece spans its file whole only when it covers the
    /// interval and the file is no longer than it (not padded).
    pub(super) fn of(moving: &Axis, file: &Axis, file_extent: impl Fn(usize) -> u64) -> Overlap {
        let mut overlap = Overlap {
            extent_sum: file.len(),
            ..Overlap::default()
        };
        for f in 0..file.count() {
            let (start, end) = (file.start(f), file.end(f));
            for m in moving.overlapping(start, end) {
                overlap.pieces += 1;
                if moving.start(m) <= start && moving.end(m) >= end && file_extent(f) == end - start
                {
                    overlap.whole += 1;
                }
            }
        }
        overlap
    }
}

impl DimOption {
    /// `read`: the read intervals, of `read_step` (clipped at the array's
    /// ends); `input` and `output`: the file axes along this dimension,
    /// the extents of the input files' read windows and of the files with
    /// them (per input interval; `Problem::read_window`), and the output
    /// files' extents (per output interval). Output files count as holding
    /// exactly their blocks: the writer fills a padded edge chunk's padding
    /// between the rows it writes, in the same calls.
    pub(super) fn new(
        read: Axis,
        (input, windows, files): (&Axis, &[u64], &[u64]),
        (output, output_files): (&Axis, &[u64]),
        read_step: u64,
        mode: WriteMode,
    ) -> DimOption {
        let (write, completes) = match mode {
            WriteMode::Immediate => (read.clone(), (0..read.count()).map(Some).collect()),
            WriteMode::Keep => keep_write_intervals(&read, output),
        };
        let blocks: Vec<u64> = (0..output.count()).map(|f| output.extent(f)).collect();
        let completed_len = completes
            .iter()
            .map(|c| c.map_or(0, |w| write.extent(w)))
            .collect::<Vec<_>>();
        let cuts: Vec<Vec<Cut>> = (0..read.count())
            .map(|k| cuts_inside(&read, &write, completes[k], input, output, k))
            .collect();
        let min_step_extent = thickest_step_with_every_cut(&read, &cuts);
        let mut option = DimOption {
            read_step,
            mode,
            reads: Overlap::of(&read, input, |f| windows[f]),
            read_gaps: Gaps::of(&read, input, windows, files),
            writes: Overlap::of(&write, output, |f| output.extent(f)),
            write_gaps: Gaps::of(&write, output, &blocks, output_files),
            unit_reads: 0,
            unit_reads_completing: 0,
            inner_reads: 0,
            inner_reads_completing: 0,
            last_read_completes: completes.last().copied().flatten().is_some(),
            exact_reads: 0,
            exact_reads_completing: 0,
            max_read_extent: (0..read.count()).map(|k| read.extent(k)).max().unwrap_or(0),
            reads_within_one_input: (0..read.count())
                .all(|k| input.overlapping(read.start(k), read.end(k)).len() == 1),
            writes_within_one_output: (0..write.count())
                .all(|w| output.overlapping(write.start(w), write.end(w)).len() == 1),
            cuts,
            min_step_extent,
            read,
            write,
            completes,
            completed_len,
        };
        option.count_read_continuations(input);
        option.count_exact_reads(input, files);
        option
    }

    /// Counts the read intervals that are exactly an input interval
    /// whose file is no longer ([`exact_reads`](Self::exact_reads)).
    fn count_exact_reads(&mut self, input: &Axis, files: &[u64]) {
        for k in 0..self.read.count() {
            let (start, end) = (self.read.start(k), self.read.end(k));
            let f = input.locate(start);
            if input.start(f) == start && input.end(f) == end && files[f] == end - start {
                self.exact_reads += 1;
                self.exact_reads_completing += self.completes[k].is_some() as u64;
            }
        }
    }

    /// Counts the read intervals one element thick, and those that end
    /// inside an input block (not the last), each with how many of them
    /// complete a write interval: what [`read_seeks`]
    /// needs to tell which reads continue the previous one.
    ///
    /// [`read_seeks`]: super::cost::read_seeks
    fn count_read_continuations(&mut self, input: &Axis) {
        for k in 0..self.read.count() {
            let completing = self.completes[k].is_some() as u64;
            if self.read.extent(k) == 1 {
                self.unit_reads += 1;
                self.unit_reads_completing += completing;
            }
            if k + 1 < self.read.count() && !input.is_boundary(self.read.end(k)) {
                self.inner_reads += 1;
                self.inner_reads_completing += completing;
            }
        }
    }
}

/// Keep mode's write intervals over `read`, and per read interval the write
/// interval it completes. With L_k the last output boundary at or before
/// the end of read interval k, write interval k is [L_{k-1}, L_k), empty
/// (and so completed by no read) when the read interval holds no output
/// boundary.
fn keep_write_intervals(read: &Axis, output: &Axis) -> (Axis, Vec<Option<usize>>) {
    let mut bounds = vec![0u64];
    let mut completes = Vec::with_capacity(read.count());
    for k in 0..read.count() {
        let end = read.end(k);
        let last_output_boundary = output.start(output.locate(end - 1));
        let l = if output.is_boundary(end) {
            end
        } else {
            last_output_boundary
        };
        if l > *bounds.last().unwrap_or(&0) {
            bounds.push(l);
            completes.push(Some(bounds.len() - 2));
        } else {
            completes.push(None);
        }
    }
    (Axis::from_bounds(bounds), completes)
}

/// The longest step a read interval of `read` can be cut down to at its
/// `cuts`: the thickest step any plan with these reads takes.
fn thickest_step_with_every_cut(read: &Axis, cuts: &[Vec<Cut>]) -> u64 {
    cuts.iter()
        .enumerate()
        .map(|(k, inside)| {
            let mut bounds = vec![read.start(k)];
            bounds.extend(inside.iter().map(|c| c.at));
            bounds.push(read.end(k));
            bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// The planes inside read interval `k` where it may be cut into steps:
/// input and output boundaries strictly inside both the read interval and
/// the write interval it completes (`completed`). Elsewhere a cut would
/// only split reads, with nothing to write early.
fn cuts_inside(
    read: &Axis,
    write: &Axis,
    completed: Option<usize>,
    input: &Axis,
    output: &Axis,
    k: usize,
) -> Vec<Cut> {
    let Some(w) = completed else {
        return Vec::new();
    };
    let (low, high) = (read.start(k).max(write.start(w)), write.end(w));
    let inner = |axis: &Axis| -> Vec<u64> {
        axis.overlapping(low, high)
            .map(|i| axis.start(i))
            .filter(|&at| at > low && at < high)
            .collect()
    };
    let mut planes = inner(input);
    planes.extend(inner(output));
    planes.sort_unstable();
    planes.dedup();
    planes
        .into_iter()
        .map(|at| Cut {
            at,
            input_boundary: input.is_boundary(at),
            output_boundary: output.is_boundary(at),
        })
        .collect()
}
