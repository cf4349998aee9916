//! A job cut into parts: boxes of whole output blocks, each rechunked on
//! its own (the parts of a cluster's job array), each reading only the
//! input inside its box. A part is a [`Problem::part`], so the planner
//! plans it and the executor runs it as any other problem, and its
//! predictions are as exact.
//!
//! Where to cut a dimension, from the cheapest: at multiples of
//! lcm(input block, output block), where no input block is shared and
//! nothing costs more; at output block boundaries, where an input block
//! straddling the cut is read by both parts, each reading only its own
//! box: along the first (slowest) dimension that is one more seek per
//! such block and no byte more; along inner dimensions a straddling block
//! costs a seek per row, or, read *bridged* (`Problem::bridged`), a seek
//! per run of its clipped box's rows and the bytes of the other parts'
//! rows between them. Every way of writing N as a product of part counts
//! per dimension is tried, each dimension cut either way and each inner
//! dimension bridged or not, and the one with the least overhead (extra
//! seeks and extra bytes, as fractions of one machine's) plus imbalance
//! (largest part over the mean) is chosen.

use super::{keep_rhat_io, Problem};
use crate::array::geometry::{Axis, IndexBox, Partition, Region};
use crate::error::{Error, Result};

/// A job cut into parts: a grid over the array whose cells are the parts,
/// numbered in C order.
#[derive(Clone, Debug)]
pub struct Parts {
    pub problem: Problem,
    pub grid: Partition,
    /// Per dimension: whether the parts read the input blocks they clip
    /// there bridged (`Problem::bridged`).
    pub bridged: Vec<bool>,
}

impl Parts {
    /// How many parts.
    pub fn count(&self) -> u64 {
        self.grid.count()
    }

    /// Part `k`'s box (0-based, C order over the grid of parts).
    pub fn region(&self, k: u64) -> Region {
        self.grid.block(&self.grid.unravel(k))
    }

    /// Part `k` as a problem of its own.
    pub fn problem(&self, k: u64) -> Problem {
        self.problem
            .part(&self.region(k))
            .with_bridged(self.bridged.clone())
    }
}

/// `problem` cut as a job's record says it was (`cuts`: per dimension the
/// parts' bounds; `bridged`), so that a part does not search again; `None`
/// unless those are `parts` boxes of whole output blocks over the array.
pub fn recorded(
    problem: &Problem,
    parts: u64,
    cuts: &[Vec<u64>],
    bridged: &[bool],
) -> Option<Parts> {
    let ndim = problem.ndim();
    if cuts.len() != ndim || bridged.len() != ndim {
        return None;
    }
    let mut count = 1u64;
    for (d, bounds) in cuts.iter().enumerate() {
        let whole = bounds.first() == Some(&0)
            && bounds.last() == Some(&problem.array[d])
            && bounds.windows(2).all(|w| w[0] < w[1])
            && bounds[1..bounds.len() - 1]
                .iter()
                .all(|b| b % problem.output_block[d] == 0);
        if !whole {
            return None;
        }
        count = count.checked_mul(bounds.len() as u64 - 1)?;
    }
    (count == parts).then(|| Parts {
        problem: problem.clone(),
        grid: Partition::new(cuts.iter().map(|b| Axis::from_bounds(b.clone())).collect()),
        bridged: bridged.to_vec(),
    })
}

/// `problem` cut into `parts` boxes of whole output blocks, the cheapest
/// way (see the module's doc).
pub fn cut(problem: &Problem, parts: u64) -> Result<Parts> {
    let most = problem.output().count();
    if parts == 0 || parts > most {
        return Err(Error::BadArgument(format!(
            "--parts {parts}: a job has 1 to {most} parts here (one output block each at most)"
        )));
    }
    let base = Cost::of(std::slice::from_ref(problem));
    let mut best: Option<(f64, Partition, Vec<bool>)> = None;
    for counts in factorizations(parts, problem.ndim()) {
        for grid in grids(problem, &counts) {
            let (score, bridged) = least_bridges(problem, &grid, &base);
            if best
                .as_ref()
                .is_none_or(|(least, ..)| score < *least - 1e-9)
            {
                best = Some((score, grid, bridged));
            }
        }
    }
    let (_, grid, bridged) = best.ok_or_else(|| {
        Error::BadArgument(format!(
            "--parts {parts}: the output grid cannot be cut into {parts} boxes of whole blocks; \
             try a number that divides its block counts"
        ))
    })?;
    Ok(Parts {
        problem: problem.clone(),
        grid,
        bridged,
    })
}

/// The dimensions the parts of `grid` read bridged: of every set of the
/// dimensions `grid` cuts (but the first, whose rows are whole anyway),
/// the one with the least score against `base`; and the score. Bridging
/// one dimension can pay only once another is bridged too, so every set
/// is tried (at most 2^(N-1) of them).
fn least_bridges(problem: &Problem, grid: &Partition, base: &Cost) -> (f64, Vec<bool>) {
    let score_of = |bridged: &[bool]| -> f64 {
        let pieces: Vec<Problem> = IndexBox::grid(&grid.grid_shape())
            .map(|index| {
                problem
                    .part(&grid.block(&index))
                    .with_bridged(bridged.to_vec())
            })
            .collect();
        Cost::of(&pieces).score(base)
    };
    let cut: Vec<usize> = (1..problem.ndim())
        .filter(|&d| grid.axis(d).count() > 1 && !problem.reads_whole_inputs())
        .collect();
    let mut best: Option<(f64, Vec<bool>)> = None;
    for set in 0..1u64 << cut.len() {
        let mut bridged = vec![false; problem.ndim()];
        for (bit, &d) in cut.iter().enumerate() {
            bridged[d] = set >> bit & 1 == 1;
        }
        let score = score_of(&bridged);
        if best.as_ref().is_none_or(|(least, _)| score < *least - 1e-9) {
            best = Some((score, bridged));
        }
    }
    best.unwrap_or((f64::INFINITY, vec![false; problem.ndim()]))
}

/// What a set of parts costs, as keep(r̂) plans them: the measure the cuts
/// are chosen by.
struct Cost {
    seeks: u128,
    bytes: u128,
    largest: u128,
    parts: u128,
}

impl Cost {
    fn of(parts: &[Problem]) -> Cost {
        let (seeks, bytes): (Vec<u128>, Vec<u128>) = parts.iter().map(keep_rhat_io).unzip();
        Cost {
            seeks: seeks.iter().sum(),
            bytes: bytes.iter().sum(),
            largest: bytes.iter().copied().max().unwrap_or(0),
            parts: parts.len() as u128,
        }
    }

    /// Extra seeks and bytes against `base` (one machine), as fractions,
    /// plus the largest part's excess over the mean.
    fn score(&self, base: &Cost) -> f64 {
        let fraction = |more: u128, of: u128| (more.saturating_sub(of)) as f64 / of.max(1) as f64;
        let mean = self.bytes as f64 / self.parts as f64;
        fraction(self.seeks, base.seeks)
            + fraction(self.bytes, base.bytes)
            + (self.largest as f64 / mean.max(1.0) - 1.0)
    }
}

/// Every way of writing `n` as a product of `ndim` counts, the first
/// dimension's largest first (so that of equal costs, cuts along slower
/// dimensions win).
fn factorizations(n: u64, ndim: usize) -> Vec<Vec<u64>> {
    if ndim == 1 {
        return vec![vec![n]];
    }
    let mut all = Vec::new();
    for first in (1..=n).rev().filter(|f| n % f == 0) {
        for mut rest in factorizations(n / first, ndim - 1) {
            rest.insert(0, first);
            all.push(rest);
        }
    }
    all
}

/// The grids of parts with `counts` parts per dimension: each dimension
/// cut at multiples of lcm(input, output block) or of the output block.
fn grids(problem: &Problem, counts: &[u64]) -> Vec<Partition> {
    let per_dim: Vec<Vec<Axis>> = (0..problem.ndim())
        .map(|d| axis_cuts(problem, d, counts[d]))
        .collect();
    if per_dim.iter().any(Vec::is_empty) {
        return Vec::new();
    }
    let shape: Vec<usize> = per_dim.iter().map(Vec::len).collect();
    IndexBox::grid(&shape)
        .map(|choice| {
            Partition::new(
                choice
                    .iter()
                    .enumerate()
                    .map(|(d, &c)| per_dim[d][c].clone())
                    .collect(),
            )
        })
        .collect()
}

/// Dimension `d` cut into `count` intervals as even as whole units allow,
/// the units being lcm(input, output block), then the output block.
fn axis_cuts(problem: &Problem, d: usize, count: u64) -> Vec<Axis> {
    let len = problem.array[d];
    if count == 1 {
        return vec![Axis::from_bounds(vec![0, len])];
    }
    let (input, output) = (problem.input_block[d], problem.output_block[d]);
    let lcm = (input / gcd(input, output)).checked_mul(output);
    let mut units: Vec<u64> = lcm.into_iter().filter(|&l| l < len).collect();
    units.push(output);
    units.dedup();
    units
        .into_iter()
        .filter_map(|unit| even_cuts(len, unit, count))
        .collect()
}

/// `[0, len)` cut into `count` intervals at multiples of `unit`, as even
/// as that allows; None if there are fewer units than intervals.
fn even_cuts(len: u64, unit: u64, count: u64) -> Option<Axis> {
    let units = len.div_ceil(unit);
    if units < count {
        return None;
    }
    let mut bounds: Vec<u64> = (0..count)
        .map(|j| ((j as u128 * units as u128 + count as u128 / 2) / count as u128) as u64 * unit)
        .collect();
    bounds.push(len);
    bounds
        .windows(2)
        .all(|w| w[0] < w[1])
        .then(|| Axis::from_bounds(bounds))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{baseline, keep_rhat, plan, Strategy};

    fn config4() -> Problem {
        Problem::new(vec![3500; 3], vec![175; 3], vec![250; 3], 2).unwrap()
    }

    #[test]
    fn four_parts_of_config_4_cut_at_the_lcm_for_nothing() {
        let problem = config4();
        let parts = cut(&problem, 4).unwrap();
        assert_eq!(parts.grid.axis(0).bounds(), &[0, 1750, 3500]);
        assert_eq!(parts.grid.axis(1).bounds(), &[0, 1750, 3500]);
        assert_eq!(parts.grid.axis(2).count(), 1);
        let seeks: u64 = (0..4)
            .map(|k| keep_rhat(&parts.problem(k)).prediction.seeks())
            .sum();
        assert_eq!(seeks, keep_rhat(&problem).prediction.seeks());
        let bytes: u64 = (0..4)
            .map(|k| keep_rhat(&parts.problem(k)).prediction.bytes_read)
            .sum();
        assert_eq!(bytes, keep_rhat(&problem).prediction.bytes_read);
    }

    /// The jobs of docs/cluster.md's table, each part planned in 4 GiB as
    /// `rechunk --part` plans it: seeks and bytes read, summed.
    fn job_in_parts(problem: &Problem, count: u64) -> (u64, u64) {
        let parts = cut(problem, count).unwrap();
        (0..count)
            .map(|k| {
                let chosen = plan(&parts.problem(k), Strategy::Keep, Some(4 << 30)).unwrap();
                (chosen.prediction.seeks(), chosen.prediction.bytes_read)
            })
            .fold((0, 0), |(s, b), (ps, pb)| (s + ps, b + pb))
    }

    #[test]
    fn bigbrain_and_config_4_in_64_and_256_parts() {
        // BigBrain (u16) into 256³: one machine makes n_I + n_O = 2,813
        // seeks. 64 and 256 parts must cut inner dimensions (16 output
        // blocks along the first), and each part meets at least one more
        // input block per cut: 16 × 4 × 4 parts meet 20 × 8 × 8 = 1,280.
        // Their clipped blocks are read bridged, one seek each, for the
        // rows of the other parts between.
        let bigbrain =
            Problem::new(vec![3850, 3025, 3500], vec![770, 605, 700], vec![256; 3], 2).unwrap();
        assert_eq!(job_in_parts(&bigbrain, 1), (2_813, 81_523_750_000));
        assert_eq!(job_in_parts(&bigbrain, 16), (3_188, 81_523_750_000));
        assert_eq!(job_in_parts(&bigbrain, 64), (3_408, 117_292_392_000));
        assert_eq!(job_in_parts(&bigbrain, 256), (3_968, 208_293_568_000));
        // Configuration 4: one machine in 4 GiB makes 12,312 seeks.
        let config4 = config4();
        assert_eq!(job_in_parts(&config4, 1), (12_312, 85_750_000_000));
        assert_eq!(job_in_parts(&config4, 64), (14_184, 94_261_300_000));
        assert_eq!(job_in_parts(&config4, 256), (17_616, 122_411_816_800));
    }

    /// The fewest seeks `count` parts of `problem` can make: each part
    /// reads each input block it meets at least once, and writes each of
    /// its output blocks. Along dimension `d`, `c` parts meet the `n`
    /// input intervals `n + c - 1` times, less one for each cut at a
    /// multiple of lcm(input, output block), the only input boundaries a
    /// part's box can end at. The least over every grid of `count`.
    fn seek_floor(problem: &Problem, count: u64) -> u64 {
        let reads = factorizations(count, problem.ndim())
            .into_iter()
            .filter(|counts| {
                (0..problem.ndim()).all(|d| counts[d] <= problem.output().axis(d).count() as u64)
            })
            .map(|counts| {
                (0..problem.ndim())
                    .map(|d| {
                        let (len, i, o) = (
                            problem.array[d],
                            problem.input_block[d],
                            problem.output_block[d],
                        );
                        let shared = (len - 1) / (i / gcd(i, o) * o);
                        let cuts = counts[d] - 1;
                        len.div_ceil(i) + cuts - cuts.min(shared)
                    })
                    .product::<u64>()
            })
            .min()
            .unwrap();
        reads + problem.output().count()
    }

    /// What the chosen cuts cost as planned, against [`seek_floor`] and
    /// against one grid's own floor (the input blocks its parts meet,
    /// each once, plus the output blocks).
    fn grid_floor(parts: &Parts) -> u64 {
        let problem = &parts.problem;
        let reads: u64 = (0..problem.ndim())
            .map(|d| {
                let axis = parts.grid.axis(d);
                (0..axis.count())
                    .map(|j| {
                        let step = problem.input_block[d];
                        axis.end(j).div_ceil(step) - axis.start(j) / step
                    })
                    .sum::<u64>()
            })
            .product();
        reads + problem.output().count()
    }

    #[test]
    fn the_cuts_reach_the_seek_floor_of_their_grid_and_config_4_the_floor_of_any() {
        // Every part reads each input block it meets in one call (bridged
        // where clipped in an inner dimension): no chosen grid costs a
        // seek more than its own floor.
        let bigbrain =
            Problem::new(vec![3850, 3025, 3500], vec![770, 605, 700], vec![256; 3], 2).unwrap();
        let config4 = config4();
        for (problem, count) in [
            (&bigbrain, 64),
            (&bigbrain, 256),
            (&config4, 64),
            (&config4, 256),
        ] {
            let parts = cut(problem, count).unwrap();
            assert_eq!(
                job_in_parts(problem, count).0,
                grid_floor(&parts),
                "{count} parts"
            );
        }
        // The least any grid allows. BigBrain (5 input blocks along each
        // dimension, no lcm multiple inside): 4×4×4 parts meet 8³ input
        // blocks, 4×8×8 parts 8 × 12 × 12. Configuration 4 (20 input and
        // 14 output blocks, and one lcm multiple, 1750, per dimension):
        // 4×4×4 parts meet 22³, 8×8×4 parts 26 × 26 × 22.
        assert_eq!(seek_floor(&bigbrain, 64), 8 * 8 * 8 + 2_688);
        assert_eq!(seek_floor(&bigbrain, 256), 8 * 12 * 12 + 2_688);
        assert_eq!(seek_floor(&config4, 64), 22 * 22 * 22 + 2_744);
        assert_eq!(seek_floor(&config4, 256), 26 * 26 * 22 + 2_744);
        // At 256 parts configuration 4's cuts are at that floor. At 64
        // they are not: the floor's grid, 4×4×4, cuts both inner
        // dimensions through input blocks, and bridged reads them again
        // (+20.9% bytes); 8×4×2 cuts one (+9.9%) for 792 seeks more.
        assert_eq!(job_in_parts(&config4, 256).0, seek_floor(&config4, 256));
        let floor_grid = Parts {
            problem: config4.clone(),
            grid: Partition::new(
                (0..3)
                    .map(|_| Axis::from_bounds(vec![0, 1000, 1750, 2750, 3500]))
                    .collect(),
            ),
            bridged: vec![false, true, true],
        };
        let (seeks, bytes) = (0..64)
            .map(|k| {
                let chosen = plan(&floor_grid.problem(k), Strategy::Keep, Some(4 << 30)).unwrap();
                (chosen.prediction.seeks(), chosen.prediction.bytes_read)
            })
            .fold((0, 0), |(s, b), (ps, pb)| (s + ps, b + pb));
        assert_eq!(seeks, seek_floor(&config4, 64));
        assert_eq!(bytes, 103_697_871_200);
        assert_eq!(job_in_parts(&config4, 64), (14_184, 94_261_300_000));
    }

    #[test]
    fn a_part_clips_the_input_blocks_it_straddles() {
        // 12 along each axis in 4-blocks -> 3-blocks; a part from 3 to 9.
        let problem = Problem::new(vec![12, 12], vec![4, 12], vec![3, 12], 1).unwrap();
        let part = problem.part(&Region::new(vec![3, 0], vec![6, 12]));
        assert_eq!(part.input().axis(0).bounds(), &[0, 1, 5, 6]);
        assert_eq!(part.output().axis(0).bounds(), &[0, 3, 6]);
        // Rows 3, 4-7 and 8 of three input files, each file one segment
        // (its rows are whole), then two output blocks.
        let chosen = keep_rhat(&part);
        assert_eq!(chosen.prediction.seeks(), 3 + 2);
        assert_eq!(baseline(&part).prediction.read_seeks, 3);
        // Cut along the inner dimension: a segment per row of each clipped
        // block; the whole one between is one.
        let inner = Problem::new(vec![12, 12], vec![12, 4], vec![12, 3], 1).unwrap();
        let part = inner.part(&Region::new(vec![0, 3], vec![12, 6]));
        assert_eq!(keep_rhat(&part).prediction.read_seeks, 12 + 1 + 12);
    }

    #[test]
    fn every_output_block_has_one_part() {
        let problem = Problem::new(vec![50, 40, 30], vec![7, 6, 5], vec![10, 8, 9], 2).unwrap();
        for n in [1, 2, 3, 5, 6, 8, 12] {
            let parts = cut(&problem, n).unwrap();
            assert_eq!(parts.count(), n);
            let blocks: u64 = (0..n).map(|k| parts.problem(k).output().count()).sum();
            assert_eq!(blocks, problem.output().count(), "{n} parts");
            for k in 0..n {
                let part = parts.problem(k);
                let mem = keep_rhat(&part).prediction.peak_bytes;
                assert!(plan(&part, Strategy::Keep, Some(mem)).is_ok());
            }
        }
        assert!(cut(&problem, 0).is_err());
        assert!(cut(&problem, 7 * 5 * 4 + 1).is_err());
    }
}
