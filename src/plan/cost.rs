//! What a plan costs, predicted exactly before anything runs: seeks in
//! closed form, multiplied out of the per-dimension counts, and the peak
//! memory by stepping through the read blocks as the executor will. The
//! executor is held to these numbers (`tests/engine.rs`), so they model its
//! order of calls, not an estimate of it.

use super::dims::{DimOption, Gaps, Overlap};
use super::problem::Problem;
use crate::array::geometry::Axis;

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

/// Exact read seeks: all read segments, less those that continue the
/// previous call. Within a read block consecutive calls go to different
/// input files or are separated by a gap, and a completed write block moves
/// the head to the outputs; so a read block's first segment continues the
/// previous one only when (a) no write block completed in between, and
/// (b) the last element of the previous read block and the first of this
/// one are neighbours in one input file. With `j` the axis where the step
/// in `order` carries, (b) holds when the boundary crossed along `j` is
/// inside an input block, and along every other axis `d`:
///
/// - before `j` (in the file's C order) and visited outside it: the read
///   interval is one element thick (it stays);
/// - before `j` and visited inside it: likewise, and the only one;
/// - after `j` and visited inside it (it wraps from end to start): one
///   input file spans the axis exactly;
/// - after `j` and visited outside it (it stays): the read interval is
///   exactly its input file's extent.
///
/// The count of such steps is a product over the axes, as is the count of
/// those whose previous read block completes a write block.
fn read_seeks(dims: &[&DimOption], input_spans_exactly: &[bool], order: &[usize]) -> u128 {
    let overlaps: Vec<Overlap> = dims.iter().map(|o| o.reads).collect();
    let mut continued: u128 = 0;
    let n = dims.len();
    let mut position = vec![0usize; n];
    for (p, &d) in order.iter().enumerate() {
        position[d] = p;
    }
    for j in 0..n {
        let (mut steps, mut steps_with_write) = (
            dims[j].inner_reads as u128,
            dims[j].inner_reads_completing as u128,
        );
        for d in (0..n).filter(|&d| d != j) {
            let o = dims[d];
            let inside = position[d] > position[j];
            let (all, completing) = match (d < j, inside) {
                (true, false) => (o.unit_reads, o.unit_reads_completing),
                (true, true) if o.read.count() == 1 => (o.unit_reads, o.unit_reads_completing),
                (false, true) if input_spans_exactly[d] => (1, o.last_read_completes as u64),
                (false, false) => (o.exact_reads, o.exact_reads_completing),
                _ => (0, 0),
            };
            steps *= all as u128;
            steps_with_write *= completing as u128;
        }
        continued += steps - steps_with_write;
    }
    segments(&overlaps) - continued
}

/// Whether the plan `dims` can have a read continue the previous read
/// block's last in some order ([`read_seeks`]): if not, every order makes
/// the same seeks, and only one need be counted.
pub(super) fn order_can_change_seeks(problem: &Problem, dims: &[&DimOption]) -> bool {
    if problem.reads_whole_inputs() {
        return false;
    }
    let spans = problem.input_spans_exactly(&problem.input());
    (0..dims.len()).any(|j| {
        dims[j].inner_reads > 0
            && dims[..j].iter().all(|o| o.unit_reads > 0)
            && (j + 1..dims.len()).all(|d| spans[d] || dims[d].exact_reads > 0)
    })
}

/// Exact read seeks of the plan `dims` makes for `problem`. Encoded input
/// blocks are read whole, one call each at offset 0 of a file no other
/// call touches, so each (read block, input block) pair is one seek: the
/// product of the pairs per dimension, the read intervals being whole
/// numbers of input blocks.
pub(super) fn plan_read_seeks(problem: &Problem, dims: &[&DimOption], order: &[usize]) -> u128 {
    if problem.reads_whole_inputs() {
        return dims.iter().map(|o| o.reads.pieces as u128).product();
    }
    read_seeks(dims, &problem.input_spans_exactly(&problem.input()), order)
}

/// Array bytes the plan `dims` makes for `problem` reads from its input
/// files: every element once, and the bytes between the rows that a read
/// through a window smaller than its file spans ([`gap_elements`]). Encoded
/// inputs are read a whole decoded block at a time instead: the input
/// blocks are a product of intervals, so their decoded volumes sum to the
/// product of each dimension's summed extents.
pub(super) fn plan_bytes_read(problem: &Problem, dims: &[&DimOption]) -> u128 {
    let elem = problem.elem_size as u128;
    let input = problem.input();
    if problem.reads_whole_inputs() {
        return (0..problem.ndim())
            .map(|d| {
                problem
                    .input_file_extents(d, input.axis(d))
                    .iter()
                    .map(|&e| e as u128)
                    .sum::<u128>()
            })
            .product::<u128>()
            * elem;
    }
    let volume: u128 = problem.array.iter().map(|&a| a as u128).product();
    let overlaps: Vec<Overlap> = dims.iter().map(|o| o.reads).collect();
    let gaps: Vec<Gaps> = dims.iter().map(|o| o.read_gaps).collect();
    (volume + gap_elements(&overlaps, &gaps)) * elem
}

/// Array bytes the plan `dims` makes for `problem` writes: every element
/// once, and the padding filled between the rows of padded edge chunks
/// ([`gap_elements`]). A slab of one that stops inside it along the first
/// dimension is written with the padding up to the next plane
/// (`engine::writer`), the same bytes its piece's one segment would span:
/// steps do not change the count. Encoded outputs are gathered whole
/// instead, padding included: the bytes they are encoded from.
pub(super) fn plan_bytes_written(problem: &Problem, dims: &[&DimOption]) -> u128 {
    let elem = problem.elem_size as u128;
    if problem.writes_whole_outputs() {
        let output = problem.output();
        return (0..problem.ndim())
            .map(|d| {
                let axis = output.axis(d);
                (0..axis.count())
                    .map(|f| problem.output_files.file_extent(d, axis.extent(f)) as u128)
                    .sum::<u128>()
            })
            .product::<u128>()
            * elem;
    }
    let volume: u128 = problem.array.iter().map(|&a| a as u128).product();
    let overlaps: Vec<Overlap> = dims.iter().map(|o| o.writes).collect();
    let gaps: Vec<Gaps> = dims.iter().map(|o| o.write_gaps).collect();
    (volume + gap_elements(&overlaps, &gaps)) * elem
}

/// Elements that calls span between the rows they move, summed over every
/// segment (`overlaps` and `gaps`: per dimension, of the reads or of the
/// writes). A segment of a piece (read block ∩ input block) whose
/// `q` ([`segments`]) is `q` holds one index of each dimension before `q`,
/// the piece's `P_q` in dimension `q` and the window whole after it; in
/// its file, whose strides are `S`, it spans
/// `(P_q − 1)·S_q + Σ_{d>q} (W_d − 1)·S_d + 1` elements of which it wants
/// `P_q · Π_{d>q} W_d`. The sums over the pieces factor by dimension, as
/// in [`segments`], the dimensions after `q` folded from the last.
fn gap_elements(overlaps: &[Overlap], gaps: &[Gaps]) -> u128 {
    let n = overlaps.len();
    let (mut spanned, mut wanted) = (0u128, 0u128);
    // Over the pieces whole in every dimension after q: their count, the
    // sums of Π_{d>q} F_d and of Π_{d>q} W_d, and the sum of
    // Σ_{d>q} (W_d − 1)·Π_{e>d} F_e.
    let (mut count, mut files, mut windows, mut inner) = (1u128, 1u128, 1u128, 0u128);
    for q in (0..n).rev() {
        let before: u128 = overlaps[..q].iter().map(|o| o.extent_sum as u128).product();
        let (pieces, extent, extent_less_one) = if q == 0 {
            let all = overlaps[0];
            (
                all.pieces as u128,
                all.extent_sum as u128,
                gaps[0].extent_less_one,
            )
        } else {
            (
                gaps[q].cut_count,
                gaps[q].cut_extent,
                gaps[q].cut_extent_less_one,
            )
        };
        spanned += before * (extent_less_one * files + pieces * (inner + count));
        wanted += before * extent * windows;
        let whole = overlaps[q].whole as u128;
        inner = gaps[q].whole_window_less_one * files + whole * inner;
        count *= whole;
        files *= gaps[q].whole_file;
        windows *= gaps[q].whole_window;
    }
    spanned - wanted
}

/// The peak of [`simulate_peak`]: while a step is read, plus the decoded
/// input blocks held beside it (encoded inputs); and from the first slab
/// handed to the writer on, plus the encoders' reserve (encoded outputs).
pub(super) fn plan_peak(
    problem: &Problem,
    dims: &[&DimOption],
    steps: &Axis,
    order: &[usize],
    give_up_above: u128,
) -> u128 {
    let decoded = problem
        .reads_whole_inputs()
        .then(|| DecodedExtents::of(problem, dims, steps));
    let encoders = problem.encoders_bytes() as u128;
    let beside = Beside {
        decoded: decoded.as_ref(),
        encoders,
        problem,
    };
    simulate_peak(dims, steps, order, problem.elem_size, beside, give_up_above)
}

/// What is held beside the pieces: the decoded input blocks a step reads
/// (encoded inputs), one per worker at most, and the output blocks the
/// encoders hold (encoded outputs, [`Problem::encoder_slots`]).
#[derive(Clone, Copy)]
struct Beside<'a> {
    decoded: Option<&'a DecodedExtents>,
    /// Bytes the encoders may hold from the first slab handed over on
    /// ([`Problem::encoders_bytes`]): they work on across slabs, so any
    /// slab may find them all busy.
    encoders: u128,
    problem: &'a Problem,
}

impl Beside<'_> {
    /// Bytes of the decoded input blocks held while step `j` of read block
    /// `index` is read: a batch of its blocks, each counted at the largest.
    fn decoded(&self, index: &[usize], j: usize) -> u128 {
        self.decoded.map_or(0, |d| {
            let (largest, count) = d.step(index, j);
            largest * self.problem.batch(count as u64) as u128
        })
    }
}

/// The longest decoded input block extent each step reads, per
/// dimension, and how many blocks it reads: the executor decodes the input
/// blocks a step overlaps in batches of up to `workers` (C order), holding
/// a batch beside the step while it copies from it. Those blocks are a
/// product of input intervals, so the largest is the product of the
/// longest along each dimension. Padded files (Zarr) decode to the full
/// chunk everywhere; exact ones (gzipped NIfTI) to their block, smaller
/// at the edges.
struct DecodedExtents {
    /// Along the first dimension, per step.
    first: Vec<u64>,
    /// Along each later dimension `d`, per read interval: `rest[d - 1]`.
    rest: Vec<Vec<u64>>,
    /// Input intervals overlapping each step, along the first dimension.
    first_count: Vec<u64>,
    /// Input intervals overlapping each read interval, along each later
    /// dimension `d`: `rest_count[d - 1]`.
    rest_count: Vec<Vec<u64>>,
}

impl DecodedExtents {
    fn of(problem: &Problem, dims: &[&DimOption], steps: &Axis) -> DecodedExtents {
        let input = problem.input();
        let longest = |d: usize, moving: &Axis| -> Vec<u64> {
            let files = input.axis(d);
            (0..moving.count())
                .map(|k| {
                    files
                        .overlapping(moving.start(k), moving.end(k))
                        .map(|f| problem.input_files.file_extent(d, files.extent(f)))
                        .max()
                        .unwrap_or(0)
                })
                .collect()
        };
        let count = |d: usize, moving: &Axis| -> Vec<u64> {
            let files = input.axis(d);
            (0..moving.count())
                .map(|k| files.overlapping(moving.start(k), moving.end(k)).len() as u64)
                .collect()
        };
        DecodedExtents {
            first: longest(0, steps),
            rest: (1..dims.len()).map(|d| longest(d, &dims[d].read)).collect(),
            first_count: count(0, steps),
            rest_count: (1..dims.len()).map(|d| count(d, &dims[d].read)).collect(),
        }
    }

    /// Elements of the largest decoded block step `j` of the read block at
    /// `index` reads, and how many blocks it reads.
    fn step(&self, index: &[usize], j: usize) -> (u128, u128) {
        let rest = |of: &Vec<Vec<u64>>| -> u128 {
            of.iter()
                .zip(&index[1..])
                .map(|(per, &k)| per[k] as u128)
                .product()
        };
        (
            self.first[j] as u128 * rest(&self.rest),
            self.first_count[j] as u128 * rest(&self.rest_count),
        )
    }
}

/// Write seeks: at most one write block completes per read block, each of
/// its pieces goes to a different output file, and reads separate
/// successive write blocks, so no write call continues another. An encoded
/// output block is written whole, in one call: one seek per output block,
/// the write intervals being whole numbers of output blocks.
pub(super) fn write_seeks(problem: &Problem, dims: &[&DimOption]) -> u128 {
    if problem.writes_whole_outputs() {
        return dims.iter().map(|o| o.writes.pieces as u128).product();
    }
    let overlaps: Vec<Overlap> = dims.iter().map(|o| o.writes).collect();
    segments(&overlaps)
}

/// Most bytes held at once, by stepping through the read blocks in
/// `order` (axes outermost first), and each
/// read block's steps ([`step_axis`]), as the executor does: each step adds
/// its volume while the slab of a write block handed over after the
/// previous step is still being written (by the writer thread) and held;
/// then that slab is freed, and the slab this step completes (the part of
/// the read block's completed write block, if any, up to the step's end)
/// goes in flight. Volumes are products of per-dimension lengths, so a step
/// costs O(dimensions). With encoded inputs (`beside.decoded`), a batch of
/// the step's decoded input blocks is held beside it while it is read.
///
/// With encoded outputs, the encoders hold their reserve
/// (`Beside::encoders`) from the first slab handed over on: on top of
/// every later step read, and of each slab once handed over.
///
/// `steps` is [`step_axis`]`(dims)`. The search only asks whether a plan
/// fits: once the peak passes `give_up_above` bytes the rest is not
/// simulated, and what is returned is just some number above it.
///
/// [`step_axis`]: super::steps::step_axis
fn simulate_peak(
    dims: &[&DimOption],
    steps: &Axis,
    order: &[usize],
    elem_size: u64,
    beside: Beside,
    give_up_above: u128,
) -> u128 {
    let first = dims[0];
    let elem = elem_size as u128;
    let grid: Vec<usize> = dims.iter().map(|o| o.read.count()).collect();
    let mut held: u128 = 0;
    let mut peak: u128 = 0;
    let mut in_flight: u128 = 0;
    // Bytes the encoders may hold: their reserve once a slab is handed over.
    let mut writing: u128 = 0;
    for index in super::order::visit(order, &grid) {
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
            let decoded_here = beside.decoded(&index, j);
            peak = peak.max(held * elem + decoded_here * elem + writing);
            if peak > give_up_above {
                return peak;
            }
            held -= in_flight;
            let from = if j == range.start { 0 } else { steps.start(j) };
            let slab = written.map_or(0, |(start, end)| {
                end.min(steps.end(j)).saturating_sub(start.max(from))
            });
            in_flight = slab as u128 * rest_completed;
            if in_flight > 0 {
                writing = beside.encoders;
            }
            peak = peak.max(held * elem + writing);
        }
    }
    held -= in_flight;
    debug_assert_eq!(held, 0, "every byte read is written");
    peak
}

/// A count, as the `u64` a [`Prediction`] holds (saturated).
///
/// [`Prediction`]: super::Prediction
pub(super) fn clamp(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
