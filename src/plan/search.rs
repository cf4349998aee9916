//! Choosing read shapes and write modes when keep(r̂) does not fit in
//! memory: seeks are cheap to count for every combination, memory is not,
//! so combinations are simulated fewest seeks first until one fits; each
//! in every order of the axes (`order`), the fewest seeks and then the least
//! memory chosen.

use super::cost::{clamp, order_can_change_seeks, plan_peak, plan_read_seeks, write_seeks};
use super::dims::{DimOption, WriteMode};
use super::model::{assemble, Orders, Plan, Strategy};
use super::order::{orders, peak_bound};
use super::problem::Problem;
use super::steps::step_axis;
use crate::array::geometry::{IndexBox, Partition};
use crate::array::units::show_bytes;
use crate::error::{Error, Result};

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

/// Fewest-seek plan whose simulated peak fits in `mem`: evaluate the seeks
/// of every (read step, write mode) combination in closed form, then
/// simulate memory in order of increasing seeks until one fits.
/// A candidate's seeks are the fewest any order makes ([`fewest_seeks`]),
/// and only its orders that make them are tried, so the first candidate
/// that fits is the plan.
pub(super) fn fewest_seeks_within(problem: &Problem, mem: u64, allowed: &Orders) -> Result<Plan> {
    let (input, output) = (problem.input(), problem.output());
    let options = options_per_dim(problem, &input, &output);
    let mut candidates = candidates(problem, &options, allowed);
    candidates.sort_by_key(|c| (c.seeks, c.read_blocks));
    let mut simulations = 0;
    for candidate in &candidates {
        if candidate.min_bytes > mem as u128 || candidate.read_blocks > MAX_SIMULATED_READ_BLOCKS {
            continue;
        }
        let dims = chosen(&options, &candidate.choice);
        let fits = best_order(
            problem,
            &dims,
            (Some(mem), Some(candidate.seeks)),
            allowed,
            &mut simulations,
        );
        if let Some(order) = fits {
            return Ok(assemble(
                problem,
                Strategy::Keep,
                &dims,
                &order,
                simulations,
            ));
        }
    }
    let need = least_memory_needed(problem, &options, &mut candidates, allowed);
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

/// Of the orders `allowed` for the plan `dims` that make at most
/// `most_seeks` seeks (None: any), the one with the fewest seeks whose
/// peak fits in `mem` (None: unlimited), fewer bytes held
/// breaking ties and C order ties of those; None if none fits. Each
/// simulation run is counted in `simulations`. Seeks are counted in closed
/// form; memory is simulated only for orders of the fewest seeks, each
/// giving up once past the least peak found so far. An order whose bound
/// (`order::peak_bound`) is within `mem` is known to fit without simulating
/// it; with a single order that settles it.
pub(super) fn best_order(
    problem: &Problem,
    dims: &[&DimOption],
    (mem, most_seeks): (Option<u64>, Option<u128>),
    allowed: &Orders,
    simulations: &mut u64,
) -> Option<Vec<usize>> {
    let tried = allowed_orders(dims, allowed);
    let limit = mem.map_or(u128::MAX, |m| m as u128);
    let mut by_seeks: Vec<(u128, Vec<usize>)> = tried
        .into_iter()
        .map(|order| (plan_read_seeks(problem, dims, &order), order))
        .filter(|(seeks, _)| most_seeks.is_none_or(|most| *seeks <= most))
        .collect();
    if by_seeks.len() == 1 && peak_bound(problem, dims, &by_seeks[0].1) <= limit {
        return by_seeks.pop().map(|(_, order)| order);
    }
    by_seeks.sort_by_key(|(seeks, _)| *seeks);
    let steps = step_axis(dims, problem);
    let mut best: Option<(u128, u128, Vec<usize>)> = None;
    for (seeks, order) in by_seeks {
        let give_up_above = match &best {
            Some((best_seeks, _, _)) if seeks > *best_seeks => break,
            Some((_, best_peak, _)) => best_peak.saturating_sub(1),
            None => limit,
        };
        *simulations += 1;
        let peak = plan_peak(problem, dims, &steps, &order, give_up_above);
        if peak <= give_up_above {
            best = Some((seeks, peak, order));
        }
    }
    best.map(|(_, _, order)| order)
}

/// The orders `allowed` for the plan `dims`.
fn allowed_orders(dims: &[&DimOption], allowed: &Orders) -> Vec<Vec<usize>> {
    match allowed {
        Orders::COnly => vec![(0..dims.len()).collect()],
        Orders::Every => orders(&dims.iter().map(|o| o.read.count()).collect::<Vec<_>>()),
        Orders::Fixed(order) => vec![order.clone()],
    }
}

/// The fewest read and write seeks the plan `dims` makes in any order
/// `allowed`. Orders differ only where a read can continue the previous
/// read block's last (`cost::order_can_change_seeks`); elsewhere C
/// order's count is every order's.
fn fewest_seeks(problem: &Problem, dims: &[&DimOption], allowed: &Orders) -> u128 {
    let writes = write_seeks(problem, dims);
    let c_order: Vec<usize> = (0..dims.len()).collect();
    if matches!(allowed, Orders::Every) && !order_can_change_seeks(problem, dims) {
        return plan_read_seeks(problem, dims, &c_order) + writes;
    }
    allowed_orders(dims, allowed)
        .iter()
        .map(|order| plan_read_seeks(problem, dims, order))
        .min()
        .unwrap_or(0)
        + writes
}

/// Per dimension, the options worth trying: every read step of
/// [`read_steps`] in keep mode, and in immediate mode where that writes
/// otherwise. The longest lists are thinned (their smallest read steps
/// dropped) until the combinations are few enough to enumerate.
fn options_per_dim(
    problem: &Problem,
    input: &Partition,
    output: &Partition,
) -> Vec<Vec<DimOption>> {
    let mut options: Vec<Vec<DimOption>> = (0..problem.ndim())
        .map(|d| {
            let mut list = Vec::new();
            for step in read_steps(problem, d) {
                let keep = problem.dim_option(d, input, output, step, WriteMode::Keep);
                // Immediate mode cuts output blocks, which encoded
                // outputs cannot be written in.
                let keeps_differ = keep.write != keep.read && !problem.writes_whole_outputs();
                list.push(keep);
                if keeps_differ {
                    list.push(problem.dim_option(d, input, output, step, WriteMode::Immediate));
                }
            }
            list
        })
        .collect();
    while options.iter().map(Vec::len).product::<usize>() > MAX_CANDIDATES {
        let longest = (0..options.len())
            .max_by_key(|&d| options[d].len())
            .unwrap_or(0);
        if options[longest].len() <= 2 {
            break;
        }
        options[longest].remove(0);
    }
    options
}

/// Every combination of one option per dimension, with its seeks (exact)
/// and a lower bound on its peak; not yet simulated.
fn candidates(problem: &Problem, options: &[Vec<DimOption>], allowed: &Orders) -> Vec<Candidate> {
    let counts: Vec<usize> = options.iter().map(Vec::len).collect();
    IndexBox::grid(&counts)
        .map(|choice| {
            let dims = chosen(options, &choice);
            Candidate {
                seeks: fewest_seeks(problem, &dims, allowed),
                read_blocks: dims.iter().map(|o| o.read.count() as u128).product(),
                // A lower bound on the peak: the thickest step, and the least
                // decoded input block beside it.
                min_bytes: dims[0].min_step_extent as u128
                    * dims[1..]
                        .iter()
                        .map(|o| o.max_read_extent as u128)
                        .product::<u128>()
                    * problem.elem_size as u128
                    + problem.least_decoded_block_bytes(),
                choice,
            }
        })
        .collect()
}

/// The options `choice` picks, one per dimension.
fn chosen<'o>(options: &'o [Vec<DimOption>], choice: &[usize]) -> Vec<&'o DimOption> {
    choice
        .iter()
        .enumerate()
        .map(|(d, &c)| &options[d][c])
        .collect()
}

/// When nothing fits: the least memory any plan needs, to say so. The
/// candidates are simulated in order of their lower bounds, skipping those
/// whose bound cannot beat the least found so far.
fn least_memory_needed(
    problem: &Problem,
    options: &[Vec<DimOption>],
    candidates: &mut [Candidate],
    allowed: &Orders,
) -> u64 {
    let mut smallest: Option<u128> = None;
    candidates.sort_by_key(|c| c.min_bytes);
    for candidate in candidates.iter() {
        if smallest.is_some_and(|p| candidate.min_bytes >= p)
            || candidate.read_blocks > MAX_SIMULATED_READ_BLOCKS
        {
            continue;
        }
        let dims = chosen(options, &candidate.choice);
        let steps = step_axis(&dims, problem);
        for order in allowed_orders(&dims, allowed) {
            let peak = plan_peak(problem, &dims, &steps, &order, u128::MAX);
            if smallest.is_none_or(|p| peak < p) {
                smallest = Some(peak);
            }
        }
    }
    smallest.map_or(u64::MAX, clamp)
}

/// Read steps worth trying along one dimension: multiples of the input
/// block up to `r̂` (whole input blocks per read), and divisors of the input
/// block (for when even one input block does not fit), unless input blocks
/// can only be read whole.
fn read_steps(problem: &Problem, d: usize) -> Vec<u64> {
    let i = problem.input_block[d];
    let rhat = problem.rhat()[d];
    let mut steps: Vec<u64> = (1..=rhat.div_ceil(i))
        .map(|j| (j * i).min(problem.whole[d]))
        .collect();
    let mut divisor = 1;
    while divisor * divisor <= i && !problem.reads_whole_inputs() {
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

#[cfg(test)]
mod tests {
    use crate::plan::{baseline, keep_rhat, plan, Problem, Strategy};

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
}
