//! The order read blocks are visited in: a permutation of the axes,
//! outermost first (C order is `0, 1, …`), and a closed-form upper bound
//! on the peak memory a plan holds in a given order (`docs/keep.md`,
//! "Read order" and "A memory bound"). Serpentine orders are measured
//! here (tests only), not planned: see `docs/keep.md`, "Serpentine order".
//!
//! Seeks barely depend on the order (a call continues the previous one only
//! across unit-thick read intervals), but memory does: the tails kept for
//! the next read interval along the outermost axis span the whole array
//! along every inner axis, so putting the axis with the smallest tails
//! outermost can free enough memory for a larger read shape.

use super::dims::DimOption;
use super::problem::Problem;

/// Most dimensions whose every permutation is tried (4! = 24 orders).
const MAX_PERMUTED_DIMS: usize = 4;

/// The orders worth trying for a grid of `counts` read intervals per
/// dimension: C order first, then every other permutation of the axes
/// (up to 4-D), two orders that differ only in where axes of a single
/// read interval go being the same order and tried once.
pub(super) fn orders(counts: &[usize]) -> Vec<Vec<usize>> {
    let n = counts.len();
    let c_order: Vec<usize> = (0..n).collect();
    if n > MAX_PERMUTED_DIMS {
        return vec![c_order];
    }
    let mut all = vec![c_order.clone()];
    let mut seen = vec![moving(&c_order, counts)];
    let mut current = c_order;
    while next_permutation(&mut current) {
        let key = moving(&current, counts);
        if !seen.contains(&key) {
            seen.push(key);
            all.push(current.clone());
        }
    }
    all
}

/// The axes of `order` that have more than one read interval, in order:
/// what decides the visiting sequence.
fn moving(order: &[usize], counts: &[usize]) -> Vec<usize> {
    order.iter().copied().filter(|&d| counts[d] > 1).collect()
}

/// Lexicographic successor of a permutation; false after the last.
fn next_permutation(p: &mut [usize]) -> bool {
    let Some(i) = (1..p.len()).rev().find(|&i| p[i - 1] < p[i]) else {
        return false;
    };
    let Some(j) = (i..p.len()).rev().find(|&j| p[j] > p[i - 1]) else {
        return false;
    };
    p.swap(i - 1, j);
    p[i..].reverse();
    true
}

/// The rank in `order` of read block `index`, in a grid of `counts`.
pub(crate) fn rank(order: &[usize], counts: &[usize], index: &[usize]) -> u64 {
    order
        .iter()
        .fold(0u64, |acc, &d| acc * counts[d] as u64 + index[d] as u64)
}

/// The read block of rank `rank` in `order`, in a grid of `counts`.
pub(crate) fn unravel(order: &[usize], counts: &[usize], mut rank: u64) -> Vec<usize> {
    let mut index = vec![0usize; counts.len()];
    for &d in order.iter().rev() {
        let n = counts[d].max(1) as u64;
        index[d] = (rank % n) as usize;
        rank /= n;
    }
    index
}

/// Every read block of a grid of `counts`, in `order`.
pub(crate) fn visit(order: &[usize], counts: &[usize]) -> impl Iterator<Item = Vec<usize>> {
    let permuted: Vec<usize> = order.iter().map(|&d| counts[d]).collect();
    let order = order.to_vec();
    crate::array::geometry::IndexBox::grid(&permuted).map(move |p| {
        let mut index = vec![0usize; p.len()];
        for (position, &d) in order.iter().enumerate() {
            index[d] = p[position];
        }
        index
    })
}

/// Per dimension, the lengths the bound multiplies (`docs/keep.md`, "A
/// memory bound"); `b` is the read interval being visited, `r(x)` and
/// `c(x)` the read interval holding coordinate `x` and the one completing
/// its write interval.
struct Lengths {
    /// `A`: the array's length.
    whole: u128,
    /// `R`: the longest read interval.
    read: u128,
    /// `W`: the longest write interval.
    write: u128,
    /// `Q`: most coordinates with `r(x) = c(x) = b`.
    own: u128,
    /// `T`: most coordinates with `r(x) ≤ b < c(x)` (the tail kept).
    tail: u128,
    /// `P`: most coordinates with `r(x) < b = c(x)` (the tail taken up).
    carried: u128,
}

impl Lengths {
    fn of(option: &DimOption) -> Lengths {
        let (read, write) = (&option.read, &option.write);
        let (mut own, mut tail, mut carried) = (0u64, 0u64, 0u64);
        let mut written_to = 0u64;
        for k in 0..read.count() {
            if let Some(w) = option.completes[k] {
                let (start, end) = (write.start(w), write.end(w));
                own = own.max(
                    read.end(k)
                        .min(end)
                        .saturating_sub(read.start(k).max(start)),
                );
                carried = carried.max(read.start(k).saturating_sub(start));
                written_to = end;
            }
            tail = tail.max(read.end(k).saturating_sub(written_to));
        }
        let longest = |axis: &crate::array::geometry::Axis| {
            (0..axis.count()).map(|k| axis.extent(k)).max().unwrap_or(0) as u128
        };
        Lengths {
            whole: read.len() as u128,
            read: longest(read),
            write: longest(write),
            own: own as u128,
            tail: tail as u128,
            carried: carried as u128,
        }
    }
}

/// An upper bound on the bytes the plan `dims` holds at its peak when its
/// read blocks are visited in `order`, in closed form: never below
/// `cost::plan_peak` (`tests/property.rs`). With π the order and the
/// lengths of [`Lengths`], the elements read but not yet written after a
/// read block are at most
///
/// `Σ_p Π_{q<p} Q_{π_q} · (T_{π_p} + P_{π_p}·[p < n−1]) · Π_{q>p} A_{π_q}`,
///
/// and while the next one is read it is held beside them (`Π R`), with at
/// most a write block's slab in flight (`Π W`), the largest decoded input
/// block and the output blocks the encoders hold.
pub(super) fn peak_bound(problem: &Problem, dims: &[&DimOption], order: &[usize]) -> u128 {
    let lengths: Vec<Lengths> = order.iter().map(|&d| Lengths::of(dims[d])).collect();
    let n = lengths.len();
    let mut pending: u128 = 0;
    for p in 0..n {
        let before: u128 = lengths[..p].iter().map(|l| l.own).product();
        let after: u128 = lengths[p + 1..].iter().map(|l| l.whole).product();
        let carried = if p + 1 < n { lengths[p].carried } else { 0 };
        pending = pending.saturating_add(
            before
                .saturating_mul(lengths[p].tail + carried)
                .saturating_mul(after),
        );
    }
    let read: u128 = lengths.iter().map(|l| l.read).product();
    let write: u128 = lengths.iter().map(|l| l.write).product();
    pending
        .saturating_add(read)
        .saturating_add(write)
        .saturating_mul(problem.elem_size as u128)
        .saturating_add(problem.largest_decoded_block_bytes())
        .saturating_add(problem.encoders_bytes() as u128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_permutations_tried_once() {
        assert_eq!(orders(&[2, 3, 4]).len(), 6);
        assert_eq!(orders(&[2, 3, 4, 5]).len(), 24);
        assert_eq!(orders(&[2, 1, 4]), vec![vec![0, 1, 2], vec![1, 2, 0]]);
        assert_eq!(orders(&[2, 3, 4])[0], vec![0, 1, 2]);
        assert_eq!(orders(&[2; 5]).len(), 1);
    }

    #[test]
    fn ranks_follow_the_order() {
        let counts = [2, 3, 4];
        for order in orders(&counts) {
            for (k, index) in visit(&order, &counts).enumerate() {
                assert_eq!(rank(&order, &counts, &index), k as u64);
                assert_eq!(unravel(&order, &counts, k as u64), index);
            }
        }
        let order = [2, 0, 1];
        let first: Vec<Vec<usize>> = visit(&order, &counts).take(2).collect();
        assert_eq!(first, vec![vec![0, 0, 0], vec![0, 1, 0]]);
    }
}

/// Serpentine (boustrophedon) order, measured but not planned: each inner
/// axis reverses on alternate passes of the axis outside it, so the read
/// block after the end of a row is its neighbour. Keep mode's write
/// intervals are cut for forward passes: along a reversed axis a write
/// interval completes at the LOWEST read interval it overlaps, and a read
/// interval holding an output boundary at its start and one inside (read
/// interval 0, whenever it holds an output boundary) then completes two,
/// which one write block per read block (`Plan::completed_write_block`, the
/// executor, `cost::simulate_peak`) cannot express. This module holds the
/// exact order (rank, unravel, visit, the last and first block of a box)
/// and a read-block-level model of the bytes held, to measure whether it
/// would pay (`docs/keep.md`, "Read order").
#[cfg(test)]
mod serpentine {
    use crate::plan::{plan_in, Orders, Plan, Problem, Strategy};

    /// Rank of read block `index` when the axes of `order` (outermost
    /// first) are visited serpentine: the digit of an axis is reversed
    /// when the indices of the axes outside it sum to an odd number (the
    /// parity of that sum is the parity of the passes made so far, so
    /// consecutive ranks differ by one along one axis).
    pub(super) fn rank(order: &[usize], counts: &[usize], index: &[usize]) -> u64 {
        let mut parity = 0;
        order.iter().fold(0u64, |acc, &d| {
            let digit = if parity == 1 {
                counts[d] - 1 - index[d]
            } else {
                index[d]
            };
            parity ^= index[d] & 1;
            acc * counts[d] as u64 + digit as u64
        })
    }

    /// The read block of serpentine rank `rank`.
    pub(super) fn unravel(order: &[usize], counts: &[usize], mut rank: u64) -> Vec<usize> {
        let mut digits = vec![0usize; order.len()];
        for (p, &d) in order.iter().enumerate().rev() {
            let n = counts[d].max(1) as u64;
            digits[p] = (rank % n) as usize;
            rank /= n;
        }
        let mut index = vec![0usize; counts.len()];
        let mut parity = 0;
        for (p, &d) in order.iter().enumerate() {
            index[d] = if parity == 1 {
                counts[d] - 1 - digits[p]
            } else {
                digits[p]
            };
            parity ^= index[d] & 1;
        }
        index
    }

    /// Every read block in serpentine order.
    pub(super) fn visit(order: &[usize], counts: &[usize]) -> impl Iterator<Item = Vec<usize>> {
        let total: u64 = counts.iter().map(|&n| n as u64).product();
        let (order, counts) = (order.to_vec(), counts.to_vec());
        (0..total).map(move |r| unravel(&order, &counts, r))
    }

    /// The read block of the box `[lo, hi]` (per axis, inclusive) visited
    /// last (`last`) or first. Rank is lexicographic in the digits,
    /// outermost first, and an axis's direction depends only on the axes
    /// outside it, so the axes are chosen outermost first, each at the end
    /// its direction reaches last (first): exact, and only the corners of
    /// the box are candidates.
    pub(super) fn extreme_in_box(
        order: &[usize],
        lo: &[usize],
        hi: &[usize],
        last: bool,
    ) -> Vec<usize> {
        let mut index = lo.to_vec();
        let mut parity = 0;
        for &d in order {
            index[d] = if (parity == 0) == last { hi[d] } else { lo[d] };
            parity ^= index[d] & 1;
        }
        index
    }

    /// Elements held at most by `plan`'s read and write blocks visited in
    /// `order`, plain or serpentine, counted a read block at a time as
    /// `cost::simulate_peak` counts a step: while read block `t` is read,
    /// everything read up to it is held but the write blocks completed
    /// before `t - 1` (the one completed by `t - 1` is still being
    /// written). Each piece (write interval ∩ output interval, per axis)
    /// completes at the last read block of the box it overlaps: in a plain
    /// order all pieces of a write block together, where
    /// `Plan::completed_write_block` says; along a reversed axis grouped
    /// as keep would cut for that direction.
    pub(super) fn held(plan: &Plan, order: &[usize], serpentine: bool) -> u128 {
        let counts = plan.read.grid_shape();
        let total: usize = counts.iter().product();
        let rank_of = |index: &[usize]| {
            if serpentine {
                rank(order, &counts, index)
            } else {
                super::rank(order, &counts, index)
            }
        };
        let mut read = vec![0u128; total];
        for index in crate::array::geometry::IndexBox::grid(&counts) {
            read[rank_of(&index) as usize] = plan.read.block(&index).volume() as u128;
        }
        // Pieces: write intervals cut at every output boundary. In a plain
        // order all pieces of a write block complete together; along a
        // reversed axis each completes at the lowest read interval it
        // overlaps, which groups them as keep would cut for that direction.
        let pieces = crate::array::geometry::Partition::new(
            (0..counts.len())
                .map(|d| {
                    let mut bounds = plan.write.axis(d).bounds().to_vec();
                    bounds.extend_from_slice(plan.output.axis(d).bounds());
                    bounds.sort_unstable();
                    crate::array::geometry::Axis::from_bounds(bounds)
                })
                .collect(),
        );
        let mut written = vec![0u128; total];
        for w in crate::array::geometry::IndexBox::grid(&pieces.grid_shape()) {
            let region = pieces.block(&w);
            let (lo, hi): (Vec<usize>, Vec<usize>) = (0..counts.len())
                .map(|d| {
                    let axis = plan.read.axis(d);
                    (
                        axis.locate(region.origin[d]),
                        axis.locate(region.end(d) - 1),
                    )
                })
                .unzip();
            let index = if serpentine {
                extreme_in_box(order, &lo, &hi, true)
            } else {
                hi
            };
            written[rank_of(&index) as usize] += region.volume() as u128;
        }
        let (mut held, mut peak, mut in_flight) = (0u128, 0u128, 0u128);
        for t in 0..total {
            held += read[t];
            peak = peak.max(held);
            held -= in_flight;
            in_flight = written[t];
        }
        peak
    }

    /// The least the model holds for `plan` in any plain order and in any
    /// serpentine order, with the orders.
    fn least_held(plan: &Plan) -> ((u128, Vec<usize>), (u128, Vec<usize>)) {
        let orders = super::orders(&plan.read.grid_shape());
        let best = |serpentine: bool| {
            orders
                .iter()
                .map(|o| {
                    (
                        held(plan, o, serpentine) * plan.problem.elem_size as u128,
                        o.clone(),
                    )
                })
                .min_by_key(|(h, _)| *h)
                .unwrap()
        };
        (best(false), best(true))
    }

    /// Where the tables of `docs/keep.md` say serpentine is not chosen:
    /// on the plans chosen for BigBrain 40 µm within 4 GiB and for the
    /// paper's (350,875,350) → (350,500,350) within 1 GiB, the best
    /// serpentine order holds at least what the best plain order does.
    #[test]
    fn serpentine_holds_no_less_where_the_tables_say() {
        const GIB: u64 = 1 << 30;
        let bigbrain =
            Problem::new(vec![3850, 3025, 3500], vec![770, 605, 700], vec![256; 3], 2).unwrap();
        let paper =
            Problem::new(vec![3500; 3], vec![350, 875, 350], vec![350, 500, 350], 2).unwrap();
        for (problem, mem, plain, serpentine) in [
            (bigbrain, 4 * GIB, 2_535_362_080, 2_548_099_504),
            (paper, GIB, 520_625_000, 520_625_000),
        ] {
            let chosen = plan_in(&problem, Strategy::Keep, Some(mem), &Orders::Every).unwrap();
            let ((p, _), (s, _)) = least_held(&chosen);
            assert_eq!((p, s), (plain, serpentine));
        }
    }

    #[test]
    fn serpentine_ranks_are_exact_and_neighbours() {
        for counts in [
            vec![2, 3, 4],
            vec![3, 3, 2],
            vec![1, 4, 3],
            vec![3, 2, 2, 3],
        ] {
            for order in super::orders(&vec![2; counts.len()]) {
                let mut previous: Option<Vec<usize>> = None;
                for (k, index) in visit(&order, &counts).enumerate() {
                    assert_eq!(rank(&order, &counts, &index), k as u64);
                    if let Some(p) = previous {
                        let moved: usize = p.iter().zip(&index).map(|(a, b)| a.abs_diff(*b)).sum();
                        assert_eq!(moved, 1, "{order:?} {counts:?}: {p:?} -> {index:?}");
                    }
                    previous = Some(index);
                }
                let total: usize = counts.iter().product();
                let mut seen: Vec<Vec<usize>> = visit(&order, &counts).collect();
                seen.sort();
                seen.dedup();
                assert_eq!(seen.len(), total);
            }
        }
    }

    #[test]
    fn the_last_and_first_of_a_box_are_found_exactly() {
        let counts = [3usize, 4, 3];
        let boxes = crate::array::geometry::IndexBox::grid(&[3, 4, 3, 3, 4, 3]);
        for corners in boxes {
            let (lo, hi) = (&corners[..3], &corners[3..]);
            if (0..3).any(|d| lo[d] > hi[d]) {
                continue;
            }
            for order in super::orders(&counts) {
                let ranks: Vec<u64> = crate::array::geometry::IndexBox::grid(&[3, 4, 3])
                    .filter(|i| (0..3).all(|d| lo[d] <= i[d] && i[d] <= hi[d]))
                    .map(|i| rank(&order, &counts, &i))
                    .collect();
                let last = rank(&order, &counts, &extreme_in_box(&order, lo, hi, true));
                let first = rank(&order, &counts, &extreme_in_box(&order, lo, hi, false));
                assert_eq!(Some(&last), ranks.iter().max());
                assert_eq!(Some(&first), ranks.iter().min());
            }
        }
    }

    /// The model counts as `cost::simulate_peak` does where a read block
    /// is one step: in every plain order it gives the plan's peak.
    #[test]
    fn the_model_agrees_with_the_simulation_in_plain_orders() {
        let problem = Problem::new(vec![24, 20, 18], vec![6, 5, 4], vec![8, 7, 9], 2).unwrap();
        let mut checked = 0;
        for order in super::orders(&[2, 2, 2]) {
            let plan = plan_in(
                &problem,
                Strategy::Keep,
                None,
                &Orders::Fixed(order.clone()),
            )
            .unwrap();
            if plan.steps != plan.read {
                continue;
            }
            checked += 1;
            assert_eq!(
                held(&plan, &order, false) * 2,
                plan.prediction.peak_bytes as u128
            );
        }
        assert!(checked > 0);
    }
}

/// Rows of the tables in `docs/keep.md` ("Read order"), exactly; every
/// row is `rechunkfs plan --array ... --blocks ... --shape ... --mem M
/// --json` (`seeks`, `read_order`, `c_order`).
#[cfg(test)]
mod tables {
    use crate::plan::{plan_in, Orders, Problem, Strategy};

    const MIB: u64 = 1 << 20;

    fn seeks(problem: &Problem, mem: u64, orders: &Orders) -> u64 {
        plan_in(problem, Strategy::Keep, Some(mem), orders)
            .unwrap()
            .prediction
            .seeks()
    }

    #[test]
    fn the_chosen_order_beats_c_order_where_the_tables_say() {
        let paper = |i: [u64; 3], o: [u64; 3]| {
            Problem::new(vec![3500; 3], i.to_vec(), o.to_vec(), 2).unwrap()
        };
        // (350,875,350) → (350,500,350): 7,700 → 2,200 within 256 MiB,
        // 2,200 → 1,100 within 1 GiB.
        let config = paper([350, 875, 350], [350, 500, 350]);
        assert_eq!(seeks(&config, 256 * MIB, &Orders::COnly), 7_700);
        assert_eq!(seeks(&config, 256 * MIB, &Orders::Every), 2_200);
        assert_eq!(seeks(&config, 1024 * MIB, &Orders::COnly), 2_200);
        assert_eq!(seeks(&config, 1024 * MIB, &Orders::Every), 1_100);
        // 875³ → (875,1750,875) within 4 GiB: 480 → 96.
        let config = paper([875; 3], [875, 1750, 875]);
        assert_eq!(seeks(&config, 4096 * MIB, &Orders::COnly), 480);
        assert_eq!(seeks(&config, 4096 * MIB, &Orders::Every), 96);
        // BigBrain 40 µm within 4 GiB: C order is already the best.
        let bigbrain =
            Problem::new(vec![3850, 3025, 3500], vec![770, 605, 700], vec![256; 3], 2).unwrap();
        assert_eq!(seeks(&bigbrain, 4096 * MIB, &Orders::COnly), 2_813);
        assert_eq!(seeks(&bigbrain, 4096 * MIB, &Orders::Every), 2_813);
    }
}
