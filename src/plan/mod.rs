//! Planning: which read blocks to read, which write blocks to write, and
//! exactly what that costs in seeks and memory (the keep heuristic of
//! Guédon, Hayot-Sasson and Glatard, generalised; see `docs/keep.md`).
//!
//! A plan is two partitions of the array: read blocks, read in C order, and
//! write blocks, each written as soon as the last read block it needs has
//! been read. Both are product grids, one [`Axis`] per dimension, so every
//! count here (seeks, memory) is computed per dimension and multiplied:
//! planning a 64,000 × 125,000 block problem takes microseconds, not hours.
//!
//! Along each dimension the write intervals follow the read intervals in one
//! of two ways ([`WriteMode`]): *keep* (end each write interval at the last
//! output boundary inside the read interval; the tail waits in memory for the
//! next read block, so output blocks are written whole) or *immediate* (write
//! each read interval at once, cutting output blocks). Keep in every
//! dimension with read shape `r̂` is the paper's keep(r̂); immediate in every
//! dimension with read shape = input shape is the baseline. The planner
//! searches read shapes and modes for the fewest seeks that fit in memory.
//!
//! Seek convention (keep.md): a seek is an I/O call that does not start
//! exactly where the previous I/O call ended in the same file: a disk head
//! that moves. The executor issues, per read block, each input piece's
//! segments in C order, then each output piece of the completed write block;
//! the predictions below model exactly that order. (It overlaps the two in
//! time, a write block's slabs being written while the rest of its read
//! block is read; [`step_axis`] cuts read blocks only where counting in
//! this order cannot change a seek.)

use serde::Serialize;

use crate::array::geometry::{self, Axis, FileShape, IndexBox, Partition};
use crate::array::units::show_bytes;
use crate::error::{Error, Result};

/// Which plan to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// The keep heuristic: fewest seeks within the memory allowed.
    Keep,
    /// Read each input block whole, write its pieces at once.
    Baseline,
}

impl Strategy {
    /// The strategy's name as `--strategy` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Keep => "keep",
            Strategy::Baseline => "baseline",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = Error;
    fn from_str(text: &str) -> Result<Strategy> {
        match text {
            "keep" => Ok(Strategy::Keep),
            "baseline" => Ok(Strategy::Baseline),
            other => Err(Error::BadArgument(format!(
                "unknown strategy '{other}': use keep or baseline"
            ))),
        }
    }
}

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

/// The array and its two block shapes: what is to be rechunked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub array: Vec<u64>,
    pub input_block: Vec<u64>,
    pub output_block: Vec<u64>,
    /// Bytes per element.
    pub elem_size: u64,
    /// How input files are shaped around their blocks (Zarr pads edge chunks).
    pub input_files: FileShape,
    /// How output files are shaped around their blocks.
    pub output_files: FileShape,
}

impl Problem {
    /// Checks the shapes agree and are positive; block shapes larger than the
    /// array are clipped to it (`--shape` may exceed the array to mean "whole").
    pub fn new(
        array: Vec<u64>,
        input_block: Vec<u64>,
        output_block: Vec<u64>,
        elem_size: u64,
    ) -> Result<Problem> {
        let n = array.len();
        if n == 0 || n > geometry::MAX_DIMS {
            return Err(Error::BadArgument(format!(
                "the array has {n} dimensions; rechunkfs handles 1 to {}",
                geometry::MAX_DIMS
            )));
        }
        for (what, shape) in [
            ("input block", &input_block),
            ("output block", &output_block),
        ] {
            if shape.len() != n {
                return Err(Error::BadArgument(format!(
                    "the {what} shape {} has {} dimensions but the array {} has {n}",
                    geometry::show_shape(shape),
                    shape.len(),
                    geometry::show_shape(&array),
                )));
            }
        }
        if array.contains(&0) || input_block.contains(&0) || output_block.contains(&0) {
            return Err(Error::BadArgument(
                "shapes must be positive in every dimension (a 0 was given)".into(),
            ));
        }
        let clip = |block: Vec<u64>| -> Vec<u64> {
            block.iter().zip(&array).map(|(&b, &a)| b.min(a)).collect()
        };
        Ok(Problem {
            input_block: clip(input_block),
            output_block: clip(output_block),
            array,
            elem_size,
            input_files: FileShape::Exact,
            output_files: FileShape::Exact,
        })
    }

    /// The same problem with input and output files shaped as given: a
    /// padded file's rows are longer than its block's, which changes which
    /// pieces are contiguous, so the seek predictions depend on it.
    pub fn with_files(mut self, input_files: FileShape, output_files: FileShape) -> Problem {
        self.input_files = input_files;
        self.output_files = output_files;
        self
    }

    /// The options for dimension `d`: read intervals of `read_step`, writes following them in `mode`.
    fn dim_option(
        &self,
        d: usize,
        input: &Partition,
        output: &Partition,
        read_step: u64,
        mode: WriteMode,
    ) -> DimOption {
        DimOption::new(
            self.array[d],
            (input.axis(d), &self.input_files),
            (output.axis(d), &self.output_files),
            d,
            read_step,
            mode,
        )
    }

    /// Per dimension: whether one input file spans it exactly (a single
    /// block, not padded), so C-order neighbours across it are neighbours
    /// in that file too.
    fn input_spans_exactly(&self, input: &Partition) -> Vec<bool> {
        (0..self.ndim())
            .map(|d| {
                input.axis(d).count() == 1
                    && self.input_files.file_extent(d, self.array[d]) == self.array[d]
            })
            .collect()
    }

    pub fn ndim(&self) -> usize {
        self.array.len()
    }

    pub fn input(&self) -> Partition {
        Partition::regular(&self.array, &self.input_block)
    }

    pub fn output(&self) -> Partition {
        Partition::regular(&self.array, &self.output_block)
    }

    /// `r̂`: per dimension the smallest multiple of the input block that
    /// covers an output block, clipped to the array.
    pub fn rhat(&self) -> Vec<u64> {
        (0..self.ndim())
            .map(|d| {
                let i = self.input_block[d];
                (i * self.output_block[d].div_ceil(i)).min(self.array[d])
            })
            .collect()
    }

    /// `n_I + n_O`: every input block read whole and every output block
    /// written whole, once. (With padded files an edge block cannot be
    /// one segment, so no plan reaches it then.)
    pub fn lower_bound_seeks(&self) -> u64 {
        self.input().count() + self.output().count()
    }
}

/// What a plan will cost, predicted exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Prediction {
    pub read_seeks: u64,
    pub write_seeks: u64,
    /// Most array bytes held at once: the step of a read block being read,
    /// the slab being written, and every piece waiting for its write block.
    pub peak_bytes: u64,
}

impl Prediction {
    pub fn seeks(&self) -> u64 {
        self.read_seeks + self.write_seeks
    }
}

/// A complete plan: what to read, what to write, in what order, and its cost.
#[derive(Clone, Debug)]
pub struct Plan {
    pub strategy: Strategy,
    pub problem: Problem,
    pub input: Partition,
    pub output: Partition,
    /// Read blocks, visited in C order.
    pub read: Partition,
    /// The read blocks cut along the first dimension into the steps the
    /// executor takes, in order, within each read block ([`step_axis`]).
    pub steps: Partition,
    /// Write blocks: each is written when the last read block it needs is read.
    pub write: Partition,
    /// Nominal read block shape (edge read blocks may be smaller).
    pub read_shape: Vec<u64>,
    pub write_modes: Vec<WriteMode>,
    /// Per dimension, per read interval: the write interval it completes.
    completes: Vec<Vec<Option<usize>>>,
    pub prediction: Prediction,
}

impl Plan {
    /// The write block completed by reading the read block at `read_index`,
    /// if any (at most one completes per read block).
    pub fn completed_write_block(&self, read_index: &[usize]) -> Option<Vec<usize>> {
        read_index
            .iter()
            .enumerate()
            .map(|(d, &r)| self.completes[d][r])
            .collect()
    }
}

impl Plan {
    /// The C-order rank of the read block after which `region` (an output
    /// block) is completely written: per dimension, the read interval that
    /// completes the last write interval overlapping it.
    pub fn completion_step(&self, region: &crate::array::geometry::Region) -> u64 {
        let index: Vec<usize> = (0..region.ndim())
            .map(|d| {
                let write = self.write.axis(d);
                let last_write = write.locate(region.end(d) - 1);
                self.read.axis(d).locate(write.end(last_write) - 1)
            })
            .collect();
        self.read.linear(&index)
    }
}

/// One dimension's choice: read intervals, and how writes follow them.
#[derive(Clone, Debug)]
struct DimOption {
    read_step: u64,
    mode: WriteMode,
    read: Axis,
    write: Axis,
    completes: Vec<Option<usize>>,
    /// Per read interval: length of the write interval it completes (0: none).
    completed_len: Vec<u64>,
    reads: Overlap,
    writes: Overlap,
    /// Counts over read intervals for read-continuation prediction.
    unit_reads: u64,
    unit_reads_completing: u64,
    inner_reads: u64,
    inner_reads_completing: u64,
    last_read_completes: bool,
    max_read_extent: u64,
    /// Whether every read interval lies inside one input interval.
    reads_within_one_input: bool,
    /// Whether every write interval lies inside one output interval.
    writes_within_one_output: bool,
    /// Per read interval: the planes where, along the first dimension, a
    /// read block may be cut into steps ([`step_axis`]), with whether each
    /// is an input and an output boundary.
    cuts: Vec<Vec<Cut>>,
    /// The longest step a read interval can be cut down to (a lower bound
    /// on the thickest step, for pruning the search).
    min_step_extent: u64,
}

/// A plane inside a read interval where it may be cut into steps: an input
/// or output boundary inside the write interval the read interval completes.
#[derive(Clone, Copy, Debug)]
struct Cut {
    at: u64,
    input_boundary: bool,
    output_boundary: bool,
}

/// How the intervals of a moving axis (read or write) cut the intervals of a
/// file axis (input or output blocks) along one dimension.
#[derive(Clone, Copy, Debug, Default)]
struct Overlap {
    /// Non-empty (moving, file) interval pairs: pieces along this dimension.
    pieces: u64,
    /// Pieces spanning their file interval whole.
    whole: u64,
    /// Sum of piece extents (the axis length).
    extent_sum: u64,
}

impl Overlap {
    /// `file_extent(f)`: the length of file interval `f`'s file along this
    /// dimension; a piece spans its file whole only when it covers the
    /// interval and the file is no longer than it (not padded).
    fn of(moving: &Axis, file: &Axis, file_extent: impl Fn(usize) -> u64) -> Overlap {
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

/// Sum over all pieces (moving block ∩ file block) of the contiguous
/// segments each occupies in its file (`geometry::runs`). A piece's `q` is
/// the first dimension after which it spans its file whole, so group pieces
/// by `q`: dimensions after `q` whole, dimension `q` not whole (or `q = 0`),
/// dimensions before `q` anything, contributing the product of their extents.
fn segments(overlaps: &[Overlap]) -> u128 {
    let whole_after = |q: usize| -> u128 {
        overlaps[q + 1..]
            .iter()
            .map(|o| o.whole as u128)
            .product::<u128>()
    };
    let mut total = overlaps[0].pieces as u128 * whole_after(0);
    let mut extent_before: u128 = overlaps[0].extent_sum as u128;
    for (q, overlap) in overlaps.iter().enumerate().skip(1) {
        let cut = (overlap.pieces - overlap.whole) as u128;
        total += extent_before * cut * whole_after(q);
        extent_before *= overlap.extent_sum as u128;
    }
    total
}

impl DimOption {
    /// `input` and `output`: the file axes along dimension `d`, with how
    /// their files are shaped.
    fn new(
        array_len: u64,
        (input, input_files): (&Axis, &FileShape),
        (output, output_files): (&Axis, &FileShape),
        d: usize,
        read_step: u64,
        mode: WriteMode,
    ) -> DimOption {
        let read = Axis::regular(array_len, read_step);
        let (write, completes) = match mode {
            WriteMode::Immediate => (read.clone(), (0..read.count()).map(Some).collect()),
            WriteMode::Keep => {
                // L_k: the last output boundary at or before the end of read
                // interval k; write interval k is [L_{k-1}, L_k), empty when
                // the read interval holds no output boundary.
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
        };
        let completed_len = completes
            .iter()
            .map(|c| c.map_or(0, |w| write.extent(w)))
            .collect::<Vec<_>>();
        let cuts: Vec<Vec<Cut>> = (0..read.count())
            .map(|k| cuts_inside(&read, &write, completes[k], input, output, k))
            .collect();
        let min_step_extent = cuts
            .iter()
            .enumerate()
            .map(|(k, inside)| {
                let mut bounds = vec![read.start(k)];
                bounds.extend(inside.iter().map(|c| c.at));
                bounds.push(read.end(k));
                bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let mut option = DimOption {
            read_step,
            mode,
            reads: Overlap::of(&read, input, |f| {
                input_files.file_extent(d, input.extent(f))
            }),
            writes: Overlap::of(&write, output, |f| {
                output_files.file_extent(d, output.extent(f))
            }),
            unit_reads: 0,
            unit_reads_completing: 0,
            inner_reads: 0,
            inner_reads_completing: 0,
            last_read_completes: completes.last().copied().flatten().is_some(),
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
        for k in 0..option.read.count() {
            let completing = option.completes[k].is_some() as u64;
            if option.read.extent(k) == 1 {
                option.unit_reads += 1;
                option.unit_reads_completing += completing;
            }
            if k + 1 < option.read.count() && !input.is_boundary(option.read.end(k)) {
                option.inner_reads += 1;
                option.inner_reads_completing += completing;
            }
        }
        option
    }
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

/// Most steps one read block is cut into.
const MAX_STEPS_PER_READ: u64 = 16;

/// The read blocks cut, along the first dimension, into the *steps* the
/// executor takes: after each step it writes the part of the completed write
/// block before the step's end, so writing overlaps reading even when the
/// plan has one huge read block (a split or merge reads the whole array as
/// one). A read block is cut only where no seek can change, the seeks being
/// counted in the plan's order (a read block's reads, then its write block's
/// writes): at an input boundary, or anywhere when every read interval of
/// the other dimensions lies inside one input (so the cut splits one file's
/// segment into two that continue each other); and likewise at an output
/// boundary, or anywhere when every write interval of the other dimensions
/// lies inside one output. Cuts closer than 1/16 of the read block are
/// skipped, so each step moves enough bytes to pay for its hand-over.
fn step_axis(dims: &[&DimOption]) -> Axis {
    let first = dims[0];
    let reads_in_one_input = dims[1..].iter().all(|o| o.reads_within_one_input);
    let writes_in_one_output = dims[1..].iter().all(|o| o.writes_within_one_output);
    let mut bounds = Vec::with_capacity(first.read.count() + 1);
    for k in 0..first.read.count() {
        let start = first.read.start(k);
        bounds.push(start);
        let spacing = first.read.extent(k).div_ceil(MAX_STEPS_PER_READ).max(1);
        let mut last = start;
        for cut in &first.cuts[k] {
            let neutral = (cut.input_boundary || reads_in_one_input)
                && (cut.output_boundary || writes_in_one_output);
            if neutral && cut.at - last >= spacing {
                bounds.push(cut.at);
                last = cut.at;
            }
        }
    }
    bounds.push(first.read.len());
    Axis::from_bounds(bounds)
}

/// Exact read seeks: all read segments, less those that continue the
/// previous call. Within a read block consecutive calls go to different
/// input files or are separated by a gap, and a completed write block moves
/// the head to the outputs; so a read block's first segment continues the
/// previous one only when (a) no write block completed in between, and
/// (b) the last element of the previous read block and the first of this
/// one are neighbours in one input file. With `j` the dimension where the
/// C-order step carries, (b) holds when the dimensions after `j` are each
/// spanned exactly by one input file (one block, not padded), the boundary
/// crossed in `j` is inside an input block, and the read intervals before
/// `j` are one element thick.
fn read_seeks(dims: &[&DimOption], input_spans_exactly: &[bool]) -> u128 {
    let overlaps: Vec<Overlap> = dims.iter().map(|o| o.reads).collect();
    let mut continued: u128 = 0;
    let n = dims.len();
    for j in 0..n {
        if (j + 1..n).any(|d| !input_spans_exactly[d]) {
            continue;
        }
        let steps: u128 = dims[..j]
            .iter()
            .map(|o| o.unit_reads as u128)
            .product::<u128>()
            * dims[j].inner_reads as u128;
        let steps_with_write: u128 = dims[..j]
            .iter()
            .map(|o| o.unit_reads_completing as u128)
            .product::<u128>()
            * dims[j].inner_reads_completing as u128
            * dims[j + 1..].iter().all(|o| o.last_read_completes) as u128;
        continued += steps - steps_with_write;
    }
    segments(&overlaps) - continued
}

/// Write seeks: at most one write block completes per read block, each of
/// its pieces goes to a different output file, and reads separate
/// successive write blocks, so no write call continues another.
fn write_seeks(dims: &[&DimOption]) -> u128 {
    let overlaps: Vec<Overlap> = dims.iter().map(|o| o.writes).collect();
    segments(&overlaps)
}

/// Most bytes held at once, by stepping through the read blocks, and each
/// read block's steps ([`step_axis`]), as the executor does: each step adds
/// its volume while the slab of a write block handed over after the
/// previous step is still being written (by the writer thread) and held;
/// then that slab is freed, and the slab this step completes (the part of
/// the read block's completed write block, if any, up to the step's end)
/// goes in flight. Volumes are products of per-dimension lengths, so a step
/// costs O(dimensions).
///
/// `steps` is [`step_axis`]`(dims)`. The search only asks whether a plan
/// fits: once the peak passes `give_up_above` bytes the rest is not
/// simulated, and what is returned is just some number above it.
fn simulate_peak(dims: &[&DimOption], steps: &Axis, elem_size: u64, give_up_above: u128) -> u128 {
    let first = dims[0];
    let grid: Vec<usize> = dims.iter().map(|o| o.read.count()).collect();
    let mut held: u128 = 0;
    let mut peak: u128 = 0;
    let mut in_flight: u128 = 0;
    for index in IndexBox::grid(&grid) {
        let mut rest_volume: u128 = 1;
        let mut rest_completed: u128 = 1;
        for (d, &k) in index.iter().enumerate().skip(1) {
            rest_volume *= dims[d].read.extent(k) as u128;
            rest_completed *= dims[d].completed_len[k] as u128;
        }
        let k = index[0];
        let written = first.completes[k].map(|w| (first.write.start(w), first.write.end(w)));
        let range = steps.overlapping(first.read.start(k), first.read.end(k));
        for j in range.clone() {
            held += steps.extent(j) as u128 * rest_volume;
            peak = peak.max(held);
            if peak * elem_size as u128 > give_up_above {
                return peak * elem_size as u128;
            }
            held -= in_flight;
            let from = if j == range.start { 0 } else { steps.start(j) };
            let slab = written.map_or(0, |(start, end)| {
                end.min(steps.end(j)).saturating_sub(start.max(from))
            });
            in_flight = slab as u128 * rest_completed;
        }
    }
    held -= in_flight;
    debug_assert_eq!(held, 0, "every byte read is written");
    peak * elem_size as u128
}

/// A read shape and write modes, with predicted seeks (cheap) and optionally peak (simulated).
struct Candidate {
    choice: Vec<usize>,
    seeks: u128,
    read_blocks: u128,
    min_bytes: u128,
}

/// More read blocks than this are not simulated (nor worth executing): a
/// plan with that many steps is dominated by per-call overhead.
const MAX_SIMULATED_READ_BLOCKS: u128 = 200_000_000;

/// Above this many combinations, per-dimension option lists are thinned.
const MAX_CANDIDATES: usize = 400_000;

fn assemble(problem: &Problem, strategy: Strategy, dims: &[&DimOption]) -> Plan {
    let input = problem.input();
    let steps = step_axis(dims);
    let prediction = Prediction {
        read_seeks: clamp(read_seeks(dims, &problem.input_spans_exactly(&input))),
        write_seeks: clamp(write_seeks(dims)),
        peak_bytes: clamp(simulate_peak(dims, &steps, problem.elem_size, u128::MAX)),
    };
    Plan {
        strategy,
        problem: problem.clone(),
        input,
        output: problem.output(),
        read: Partition::new(dims.iter().map(|o| o.read.clone()).collect()),
        steps: Partition::new(
            std::iter::once(steps)
                .chain(dims[1..].iter().map(|o| o.read.clone()))
                .collect(),
        ),
        write: Partition::new(dims.iter().map(|o| o.write.clone()).collect()),
        read_shape: dims.iter().map(|o| o.read_step.min(o.read.len())).collect(),
        write_modes: dims.iter().map(|o| o.mode).collect(),
        completes: dims.iter().map(|o| o.completes.clone()).collect(),
        prediction,
    }
}

fn clamp(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// The baseline: read every input block whole, write its pieces at once.
pub fn baseline(problem: &Problem) -> Plan {
    let (input, output) = (problem.input(), problem.output());
    let dims: Vec<DimOption> = (0..problem.ndim())
        .map(|d| {
            problem.dim_option(
                d,
                &input,
                &output,
                problem.input_block[d],
                WriteMode::Immediate,
            )
        })
        .collect();
    assemble(
        problem,
        Strategy::Baseline,
        &dims.iter().collect::<Vec<_>>(),
    )
}

/// keep(r̂): read blocks of shape `r̂`, keep mode in every dimension; costs
/// exactly `n_I + n_O` seeks, whatever its memory, when no file is padded.
pub fn keep_rhat(problem: &Problem) -> Plan {
    let (input, output) = (problem.input(), problem.output());
    let rhat = problem.rhat();
    let dims: Vec<DimOption> = (0..problem.ndim())
        .map(|d| problem.dim_option(d, &input, &output, rhat[d], WriteMode::Keep))
        .collect();
    assemble(problem, Strategy::Keep, &dims.iter().collect::<Vec<_>>())
}

/// Read steps worth trying along one dimension: multiples of the input
/// block up to `r̂` (whole input blocks per read), and divisors of the input
/// block (for when even one input block does not fit).
fn read_steps(problem: &Problem, d: usize) -> Vec<u64> {
    let i = problem.input_block[d];
    let rhat = problem.rhat()[d];
    let mut steps: Vec<u64> = (1..=rhat.div_ceil(i))
        .map(|j| (j * i).min(problem.array[d]))
        .collect();
    let mut divisor = 1;
    while divisor * divisor <= i {
        if i % divisor == 0 {
            steps.push(divisor);
            steps.push(i / divisor);
        }
        divisor += 1;
    }
    steps.sort_unstable();
    steps.dedup();
    steps
}

/// The plan for `strategy` within `mem` bytes (None: unlimited).
pub fn plan(problem: &Problem, strategy: Strategy, mem: Option<u64>) -> Result<Plan> {
    let chosen = match (strategy, mem) {
        (Strategy::Baseline, _) => baseline(problem),
        (Strategy::Keep, None) => keep_rhat(problem),
        (Strategy::Keep, Some(mem)) => {
            let rhat_plan = keep_rhat(problem);
            if rhat_plan.prediction.peak_bytes <= mem {
                rhat_plan
            } else {
                search(problem, mem)?
            }
        }
    };
    if let Some(mem) = mem {
        if chosen.prediction.peak_bytes > mem {
            let (peak, allowed) = (chosen.prediction.peak_bytes, mem);
            let hint = match strategy {
                Strategy::Keep => "",
                Strategy::Baseline => " (or use --strategy keep, which can work in less)",
            };
            return Err(Error::DoesNotFit {
                needed: peak,
                allowed,
                message: format!(
                    "the {} plan holds {} at its peak but --mem allows {}; raise --mem to at \
                     least {}{hint}",
                    strategy.name(),
                    show_bytes(peak),
                    show_bytes(allowed),
                    show_bytes(peak),
                ),
            });
        }
    }
    Ok(chosen)
}

/// The memory budget a plan gets: `requested` (`--mem`; None: unlimited),
/// and, inside a memory cgroup of `cgroup_limit` bytes, at most half of it.
///
/// A cgroup's limit counts the page cache as well as the process, and a
/// rechunk needs page cache too: input read ahead and output awaiting
/// writeback. Squeezed, the kernel reclaims and throttles writers, which
/// costs more than seeks do: W2 (10 GB) inside a 256 MiB cgroup took
/// 25.7–27.7 s holding 172 MiB (1,784 seeks) and 22.7–23.5 s holding
/// 40 MiB (7,744 seeks).
pub fn budget(requested: Option<u64>, cgroup_limit: Option<u64>) -> Option<u64> {
    match (requested, cgroup_limit.map(|limit| limit / 2)) {
        (Some(mem), Some(half)) => Some(mem.min(half)),
        (mem, half) => mem.or(half),
    }
}

/// The plan for `strategy` within [`budget`]`(requested, cgroup_limit)`,
/// or within `requested` alone when nothing fits in the smaller budget; and
/// the budget it was planned in.
pub fn plan_within(
    problem: &Problem,
    strategy: Strategy,
    requested: Option<u64>,
    cgroup_limit: Option<u64>,
) -> Result<(Plan, Option<u64>)> {
    let budget = budget(requested, cgroup_limit);
    if budget != requested {
        if let Ok(chosen) = plan(problem, strategy, budget) {
            return Ok((chosen, budget));
        }
    }
    Ok((plan(problem, strategy, requested)?, requested))
}

/// Fewest-seek plan whose simulated peak fits in `mem`: evaluate the seeks
/// of every (read step, write mode) combination in closed form, then
/// simulate memory in order of increasing seeks until one fits.
fn search(problem: &Problem, mem: u64) -> Result<Plan> {
    let (input, output) = (problem.input(), problem.output());
    let input_spans_exactly = problem.input_spans_exactly(&input);
    let mut options: Vec<Vec<DimOption>> = (0..problem.ndim())
        .map(|d| {
            let mut list = Vec::new();
            for step in read_steps(problem, d) {
                let keep = problem.dim_option(d, &input, &output, step, WriteMode::Keep);
                let keeps_differ = keep.write != keep.read;
                list.push(keep);
                if keeps_differ {
                    list.push(problem.dim_option(d, &input, &output, step, WriteMode::Immediate));
                }
            }
            list
        })
        .collect();
    // Thin the longest lists (dropping their smallest read steps) until the
    // combinations are few enough to enumerate.
    while options.iter().map(Vec::len).product::<usize>() > MAX_CANDIDATES {
        let longest = (0..options.len())
            .max_by_key(|&d| options[d].len())
            .unwrap_or(0);
        if options[longest].len() <= 2 {
            break;
        }
        options[longest].remove(0);
    }

    let counts: Vec<usize> = options.iter().map(Vec::len).collect();
    let mut candidates: Vec<Candidate> = IndexBox::grid(&counts)
        .map(|choice| {
            let dims: Vec<&DimOption> = choice
                .iter()
                .enumerate()
                .map(|(d, &c)| &options[d][c])
                .collect();
            Candidate {
                seeks: read_seeks(&dims, &input_spans_exactly) + write_seeks(&dims),
                read_blocks: dims.iter().map(|o| o.read.count() as u128).product(),
                // A lower bound on the peak: the thickest step.
                min_bytes: dims[0].min_step_extent as u128
                    * dims[1..]
                        .iter()
                        .map(|o| o.max_read_extent as u128)
                        .product::<u128>()
                    * problem.elem_size as u128,
                choice,
            }
        })
        .collect();
    candidates.sort_by_key(|c| (c.seeks, c.read_blocks));

    for candidate in &candidates {
        if candidate.min_bytes > mem as u128 || candidate.read_blocks > MAX_SIMULATED_READ_BLOCKS {
            continue;
        }
        let dims: Vec<&DimOption> = candidate
            .choice
            .iter()
            .enumerate()
            .map(|(d, &c)| &options[d][c])
            .collect();
        if simulate_peak(&dims, &step_axis(&dims), problem.elem_size, mem as u128) <= mem as u128 {
            return Ok(assemble(problem, Strategy::Keep, &dims));
        }
    }
    // Nothing fits: find the least memory any plan needs, to say so.
    let mut smallest: Option<(u128, Vec<usize>)> = None;
    candidates.sort_by_key(|c| c.min_bytes);
    for candidate in &candidates {
        if smallest
            .as_ref()
            .is_some_and(|(p, _)| candidate.min_bytes >= *p)
            || candidate.read_blocks > MAX_SIMULATED_READ_BLOCKS
        {
            continue;
        }
        let dims: Vec<&DimOption> = candidate
            .choice
            .iter()
            .enumerate()
            .map(|(d, &c)| &options[d][c])
            .collect();
        let peak = simulate_peak(&dims, &step_axis(&dims), problem.elem_size, u128::MAX);
        if smallest.as_ref().is_none_or(|(p, _)| peak < *p) {
            smallest = Some((peak, candidate.choice.clone()));
        }
    }
    let need = smallest.map_or(u64::MAX, |(p, _)| clamp(p));
    Err(Error::DoesNotFit {
        needed: need,
        allowed: mem,
        message: format!(
            "no plan fits in --mem {}: the least any plan needs is {}; raise --mem",
            show_bytes(mem),
            show_bytes(need)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cube(a: u64, i: u64, o: u64) -> Problem {
        Problem::new(vec![a; 3], vec![i; 3], vec![o; 3], 1).unwrap()
    }

    #[test]
    fn a_cgroup_leaves_half_its_limit_to_the_page_cache() {
        const MIB: u64 = 1 << 20;
        assert_eq!(budget(None, None), None);
        assert_eq!(budget(Some(192 * MIB), None), Some(192 * MIB));
        assert_eq!(budget(None, Some(256 * MIB)), Some(128 * MIB));
        assert_eq!(budget(Some(192 * MIB), Some(256 * MIB)), Some(128 * MIB));
        assert_eq!(budget(Some(64 * MIB), Some(256 * MIB)), Some(64 * MIB));

        // W2's shapes, 1/5 in each length (u16): keep(r̂) holds 2 × 35 × 350²
        // elements; within half the cgroup the plan holds less and seeks more.
        let problem = Problem::new(vec![350; 3], vec![35; 3], vec![50; 3], 2).unwrap();
        let unlimited = plan(&problem, Strategy::Keep, None).unwrap();
        let limit = unlimited.prediction.peak_bytes;
        let (chosen, used) = plan_within(&problem, Strategy::Keep, None, Some(limit)).unwrap();
        assert_eq!(used, Some(limit / 2));
        assert!(chosen.prediction.peak_bytes <= limit / 2);
        assert!(chosen.prediction.seeks() > unlimited.prediction.seeks());

        // When nothing fits in half, the request alone decides.
        let least = plan(&problem, Strategy::Baseline, None)
            .unwrap()
            .prediction
            .peak_bytes;
        let (chosen, used) =
            plan_within(&problem, Strategy::Baseline, Some(least), Some(least)).unwrap();
        assert_eq!(used, Some(least));
        assert_eq!(chosen.prediction.peak_bytes, least);
    }

    #[test]
    fn known_numbers_of_keep_md() {
        for (a, i, o, rhat, keep, base) in [
            (12, 4, 3, 4, 91, 723),
            (50, 5, 10, 10, 1125, 26000),
            (60, 6, 4, 6, 4375, 45000),
            (30, 10, 30, 30, 28, 2727),
        ] {
            let problem = cube(a, i, o);
            let plan = keep_rhat(&problem);
            assert_eq!(plan.read_shape, vec![rhat; 3]);
            assert_eq!(plan.prediction.seeks(), keep, "keep {a} {i} {o}");
            assert_eq!(
                baseline(&problem).prediction.seeks(),
                base,
                "baseline {a} {i} {o}"
            );
        }
        let small = Problem::new(vec![2, 2, 2], vec![2, 2, 2], vec![2, 1, 2], 1).unwrap();
        assert_eq!(keep_rhat(&small).prediction.seeks(), 3);
        let reverse = Problem::new(vec![2, 2, 2], vec![2, 1, 2], vec![2, 2, 2], 1).unwrap();
        assert_eq!(baseline(&reverse).prediction.seeks(), 6);
    }

    #[test]
    fn paper_configurations_reach_the_lower_bound() {
        let configs: [([u64; 3], [u64; 3]); 7] = [
            ([875, 875, 875], [875, 1750, 875]),
            ([875, 875, 875], [700, 875, 700]),
            ([350; 3], [500; 3]),
            ([350; 3], [250; 3]),
            ([175; 3], [250; 3]),
            ([350, 875, 350], [500, 875, 500]),
            ([350, 875, 350], [350, 500, 350]),
        ];
        for (i, o) in configs {
            let problem = Problem::new(vec![3500; 3], i.to_vec(), o.to_vec(), 2).unwrap();
            assert_eq!(
                keep_rhat(&problem).prediction.seeks(),
                problem.lower_bound_seeks(),
                "{i:?} -> {o:?}"
            );
        }
        let config4 = Problem::new(vec![3500; 3], vec![175; 3], vec![250; 3], 2).unwrap();
        assert_eq!(baseline(&config4).prediction.seeks(), 392_008_000);
        assert_eq!(keep_rhat(&config4).prediction.seeks(), 10_744);
    }

    #[test]
    fn completion_steps_follow_write_completion() {
        let problem = cube(12, 4, 3);
        let plan = keep_rhat(&problem);
        // Output block (0,0,0) = [0,3)³ is in write block 0, done after read block 0.
        let first = plan.output.block(&[0, 0, 0]);
        assert_eq!(plan.completion_step(&first), 0);
        // Output block (1,1,1) = [3,6)³ is in write block 1, done after read block (1,1,1).
        let middle = plan.output.block(&[1, 1, 1]);
        assert_eq!(plan.completion_step(&middle), plan.read.linear(&[1, 1, 1]));
        let last = plan.output.block(&[3, 3, 3]);
        assert_eq!(plan.completion_step(&last), plan.read.count() - 1);
    }

    #[test]
    fn write_intervals_of_the_f0_split() {
        let problem = cube(12, 4, 3);
        let plan = keep_rhat(&problem);
        assert_eq!(plan.write.axis(0).bounds(), &[0, 3, 6, 12]);
        assert_eq!(plan.completed_write_block(&[0, 0, 0]), Some(vec![0, 0, 0]));
    }

    #[test]
    fn search_fits_memory_and_never_beats_the_lower_bound() {
        let problem = Problem::new(vec![60, 50, 40], vec![6, 5, 8], vec![10, 7, 9], 2).unwrap();
        let rhat = keep_rhat(&problem);
        let mem = rhat.prediction.peak_bytes / 3;
        let plan = plan(&problem, Strategy::Keep, Some(mem)).unwrap();
        assert!(plan.prediction.peak_bytes <= mem);
        assert!(plan.prediction.seeks() >= problem.lower_bound_seeks());
        assert!(plan.prediction.seeks() <= baseline(&problem).prediction.seeks());
    }

    #[test]
    fn a_split_is_read_in_steps_at_output_boundaries() {
        // One 350³ u16 file into 50³ blocks: one read block, cut where each
        // row of output blocks ends, so writing starts after 1/7 of it.
        let problem = Problem::new(vec![350; 3], vec![350; 3], vec![50; 3], 2).unwrap();
        let plan = keep_rhat(&problem);
        assert_eq!(plan.read.count(), 1);
        assert_eq!(
            plan.steps.axis(0).bounds(),
            &[0, 50, 100, 150, 200, 250, 300, 350]
        );
        assert_eq!(plan.steps.axis(1).bounds(), &[0, 350]);
        // A step being read beside the slab the last one completed.
        assert_eq!(plan.prediction.peak_bytes, 2 * 50 * 350 * 350 * 2);
        assert_eq!(plan.prediction.seeks(), 344);
        // So the fewest seeks now fit in 30 MB, where reading the whole file
        // at once needed 82 MB and read blocks of one slab cost 350 seeks.
        let tight = super::plan(&problem, Strategy::Keep, Some(30_000_000)).unwrap();
        assert_eq!(tight.prediction.seeks(), 344);
    }

    #[test]
    fn a_merge_is_read_in_steps_at_input_boundaries() {
        // 350³ in 35³ blocks into one file: cut at every input boundary of
        // the first dimension (the one output spans the rest).
        let problem = Problem::new(vec![350; 3], vec![35; 3], vec![350; 3], 2).unwrap();
        let plan = keep_rhat(&problem);
        let cuts: Vec<u64> = (0..=10).map(|k| k * 35).collect();
        assert_eq!(plan.steps.axis(0).bounds(), &cuts[..]);
        assert_eq!(plan.prediction.peak_bytes, 2 * 35 * 350 * 350 * 2);
        assert_eq!(plan.prediction.seeks(), 1001);
    }

    #[test]
    fn steps_never_cut_where_a_seek_would_change() {
        // W1's shapes: a read interval of 70 holds an input boundary (35)
        // but write intervals span several outputs and read intervals
        // several inputs, so a cut at 35 would interleave output files.
        let problem = Problem::new(vec![700; 3], vec![35; 3], vec![50; 3], 2).unwrap();
        let plan = keep_rhat(&problem);
        assert_eq!(plan.steps.axis(0), plan.read.axis(0));
        // Output blocks one element thick: cuts at most every 1/16 of the
        // read block.
        let problem = Problem::new(vec![64, 8], vec![64, 8], vec![1, 8], 1).unwrap();
        let plan = keep_rhat(&problem);
        assert_eq!(plan.steps.axis(0).count(), 16);
    }
}
