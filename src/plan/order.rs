//! The order read blocks are visited in: a permutation of the axes,
//! outermost first (C order is `0, 1, …`), and a closed-form upper bound
//! on the peak memory a plan holds in a given order (`docs/keep.md`,
//! "Read order" and "A memory bound").
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
/// block and the output block being encoded.
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
        .saturating_add(problem.encoding_bytes() as u128)
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
