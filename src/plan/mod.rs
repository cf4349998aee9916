//! Planning: which read blocks to read, which write blocks to write, and
//! exactly what that costs in seeks and memory (the keep heuristic of
//! Guédon, Hayot-Sasson and Glatard, generalised; see `docs/keep.md`).
//!
//! A plan is two partitions of the array: read blocks, visited in an order
//! of the axes (`order`: C order, or a permutation that holds less), and
//! write blocks, each written as soon as the last read block it needs has
//! been read. Both are product grids, one [`Axis`] per dimension, so every
//! count (seeks, memory) is computed per dimension and multiplied:
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
//! the predictions (`cost`) model exactly that order. (It overlaps the two in
//! time, a write block's slabs being written while the rest of its read
//! block is read; `steps::step_axis` cuts read blocks only where counting
//! in this order cannot change a seek.)
//!
//! [`Axis`]: crate::array::geometry::Axis

mod cost;
mod dims;
mod model;
mod order;
pub mod parts;
mod problem;
pub mod pyramid;
mod search;
mod steps;

use crate::array::units::show_bytes;
use crate::error::{Error, Result};
use cost::{plan_bytes_read, plan_read_seeks, write_seeks};
use dims::DimOption;
pub use dims::WriteMode;
use model::assemble;
pub use model::{Orders, Plan, Prediction, Strategy};
pub use problem::{EncoderSlots, Problem};

/// The plan for `strategy` within `mem` bytes (None: unlimited): the
/// fewest seeks with one worker, then as many of `problem.workers` as fit
/// in `mem` without a seek more (fewer than asked are logged).
pub fn plan(problem: &Problem, strategy: Strategy, mem: Option<u64>) -> Result<Plan> {
    let asked = problem.workers;
    if asked <= 1 || !(problem.reads_whole_inputs() || problem.writes_whole_outputs()) {
        // Workers hold nothing of their own: blocks are not encoded.
        return plan_with(problem, strategy, mem);
    }
    let single = plan_with(&problem.clone().with_workers(1), strategy, mem)?;
    let mut workers = asked;
    while workers > 1 {
        let wider = problem.clone().with_workers(workers);
        if let Ok(chosen) = plan_with(&wider, strategy, mem) {
            if chosen.prediction.seeks() == single.prediction.seeks() {
                if workers < asked {
                    log::info!(
                        "{workers} threads decode and encode blocks, not {asked}: more do not \
                         fit in --mem without more seeks"
                    );
                }
                return Ok(chosen);
            }
        }
        workers /= 2;
    }
    if asked > 1 {
        log::info!(
            "one thread decodes and encodes blocks, not {asked}: more do not fit in --mem \
             without more seeks"
        );
    }
    Ok(single)
}

/// The plan for `strategy` within `mem` bytes with `problem.workers`, its
/// read blocks visited in the best order of the axes.
fn plan_with(problem: &Problem, strategy: Strategy, mem: Option<u64>) -> Result<Plan> {
    plan_in(problem, strategy, mem, &Orders::Every)
}

/// [`plan`], visiting read blocks only in the `orders` allowed (what
/// `plan` compares its choice with).
pub fn plan_in(
    problem: &Problem,
    strategy: Strategy,
    mem: Option<u64>,
    orders: &Orders,
) -> Result<Plan> {
    orders.check(problem.ndim())?;
    if strategy == Strategy::Baseline && problem.writes_whole_outputs() {
        return Err(Error::BadArgument(
            "the baseline writes each input block's pieces of an output block at once, but a \
             compressed or sharded output block is encoded whole; use --strategy keep"
                .into(),
        ));
    }
    let chosen = match (strategy, mem) {
        (Strategy::Baseline, _) => baseline(problem),
        (Strategy::Keep, mem) => match keep_rhat_within(problem, orders, mem) {
            Some(rhat_plan) => rhat_plan,
            None => search::fewest_seeks_within(problem, mem.unwrap_or(u64::MAX), orders)?,
        },
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
    // Nothing waits in memory between read blocks: the order changes
    // nothing, C order is kept.
    let c_order: Vec<usize> = (0..problem.ndim()).collect();
    assemble(
        problem,
        Strategy::Baseline,
        &dims.iter().collect::<Vec<_>>(),
        &c_order,
        0,
    )
}

/// keep(r̂): read blocks of shape `r̂`, keep mode in every dimension; costs
/// exactly `n_I + n_O` seeks, whatever its memory, when no input file is
/// padded. Visited in the order of fewest seeks and then least memory
/// (`search::best_order`).
pub fn keep_rhat(problem: &Problem) -> Plan {
    keep_rhat_in(problem, &Orders::Every)
}

fn keep_rhat_in(problem: &Problem, orders: &Orders) -> Plan {
    let dims = rhat_dims(problem);
    let dims: Vec<&DimOption> = dims.iter().collect();
    let mut simulations = 0;
    // Unlimited, the first order simulated fits.
    let order = search::best_order(problem, &dims, (None, None), orders, &mut simulations)
        .unwrap_or_else(|| (0..problem.ndim()).collect());
    assemble(problem, Strategy::Keep, &dims, &order, simulations)
}

/// keep(r̂) in the best of `orders` whose peak fits in `mem` (None:
/// unlimited), or None if none does: simulations give up past `mem`.
fn keep_rhat_within(problem: &Problem, orders: &Orders, mem: Option<u64>) -> Option<Plan> {
    let dims = rhat_dims(problem);
    let dims: Vec<&DimOption> = dims.iter().collect();
    let mut simulations = 0;
    let order = search::best_order(problem, &dims, (mem, None), orders, &mut simulations)?;
    Some(assemble(
        problem,
        Strategy::Keep,
        &dims,
        &order,
        simulations,
    ))
}

/// keep(r̂)'s option along each dimension.
fn rhat_dims(problem: &Problem) -> Vec<DimOption> {
    let (input, output) = (problem.input(), problem.output());
    let rhat = problem.rhat();
    (0..problem.ndim())
        .map(|d| problem.dim_option(d, &input, &output, rhat[d], WriteMode::Keep))
        .collect()
}

/// keep(r̂)'s seeks and bytes read, without simulating its memory: what
/// cutting a job into parts compares.
pub(crate) fn keep_rhat_io(problem: &Problem) -> (u128, u128) {
    let (input, output) = (problem.input(), problem.output());
    let rhat = problem.rhat();
    let dims: Vec<DimOption> = (0..problem.ndim())
        .map(|d| problem.dim_option(d, &input, &output, rhat[d], WriteMode::Keep))
        .collect();
    let dims: Vec<&DimOption> = dims.iter().collect();
    let c_order: Vec<usize> = (0..problem.ndim()).collect();
    (
        plan_read_seeks(problem, &dims, &c_order) + write_seeks(problem, &dims),
        plan_bytes_read(problem, &dims),
    )
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

    /// 55³ u16 in 10³ blocks -> 25³, as plain files and as encoded chunks
    /// (edge chunks padded to 10³).
    fn chunks_of_55_encoded() -> (Problem, Problem) {
        use crate::array::geometry::FileShape;
        let plain = Problem::new(vec![55; 3], vec![10; 3], vec![25; 3], 2).unwrap();
        let encoded = plain.clone().with_files(
            FileShape::Encoded {
                padded_to: Some(vec![10; 3]),
            },
            FileShape::Exact,
        );
        (plain, encoded)
    }

    #[test]
    fn encoded_inputs_are_read_whole_one_seek_each() {
        // 55³ u16 in 10³ encoded chunks (edge chunks padded) -> 25³.
        let (plain, problem) = chunks_of_55_encoded();
        let decoded = 10 * 10 * 10 * 2;
        let rhat = keep_rhat(&problem);
        assert_eq!(rhat.prediction.read_seeks, 216, "one seek per chunk");
        assert_eq!(
            rhat.prediction.peak_bytes,
            keep_rhat(&plain).prediction.peak_bytes + decoded
        );
        assert_eq!(baseline(&problem).prediction.read_seeks, 216);
        let whole_chunks = |axis: &crate::array::geometry::Axis| {
            axis.bounds().iter().all(|&b| b % 10 == 0 || b == 55)
        };
        for mem in [rhat.prediction.peak_bytes / 2, 60_000, 20_000] {
            let tight = plan(&problem, Strategy::Keep, Some(mem)).unwrap();
            assert!(tight.prediction.peak_bytes <= mem);
            assert_eq!(tight.prediction.read_seeks, 216, "within {mem}");
            assert!((0..3).all(|d| whole_chunks(tight.read.axis(d))));
            assert!(whole_chunks(tight.steps.axis(0)));
        }
        // A chunk and its decoded copy must fit: below that, the refusal
        // names the least a plan needs, and that much fits.
        let Err(Error::DoesNotFit { needed, .. }) = plan(&problem, Strategy::Keep, Some(3000))
        else {
            panic!("3000 bytes cannot hold a 2000-byte chunk twice");
        };
        assert!(needed > 2 * decoded);
        assert!(plan(&problem, Strategy::Keep, Some(needed)).is_ok());
    }

    #[test]
    fn exact_encoded_edge_blocks_are_held_at_their_own_size() {
        use crate::array::geometry::FileShape;
        // 15 elements in encoded blocks of 10 into one: read in two steps,
        // [0, 10) and [10, 15). The second holds 10 + 5 elements and its
        // decoded block: 5 when files hold exactly their block (gzipped
        // NIfTI), a padded 10 when they hold full chunks (Zarr).
        let plain = Problem::new(vec![15], vec![10], vec![15], 1).unwrap();
        let exact = plain
            .clone()
            .with_files(FileShape::Encoded { padded_to: None }, FileShape::Exact);
        let padded = plain.with_files(
            FileShape::Encoded {
                padded_to: Some(vec![10]),
            },
            FileShape::Exact,
        );
        assert_eq!(keep_rhat(&exact).steps.axis(0).bounds(), &[0, 10, 15]);
        assert_eq!(keep_rhat(&exact).prediction.peak_bytes, 20);
        assert_eq!(keep_rhat(&padded).prediction.peak_bytes, 25);
    }

    #[test]
    fn encoded_outputs_are_written_whole_one_seek_each() {
        use crate::array::geometry::FileShape;
        // 55³ u16 in 10³ blocks -> 25³ chunks (edge chunks padded), encoded.
        let plain = Problem::new(vec![55; 3], vec![10; 3], vec![25; 3], 2).unwrap();
        let padded = plain
            .clone()
            .with_files(FileShape::Exact, FileShape::Padded(vec![25; 3]));
        let problem = padded.clone().with_encoded_outputs();
        let encoding = 2 * 25 * 25 * 25 * 2;
        assert_eq!(problem.encoding_bytes(), encoding);
        let output_planes = |plan: &Plan| -> bool {
            let (steps, read) = (plan.steps.axis(0), plan.read.axis(0));
            steps
                .bounds()
                .iter()
                .all(|&b| b % 25 == 0 || b == 55 || read.bounds().contains(&b))
        };
        let rhat = keep_rhat(&problem);
        assert_eq!(rhat.prediction.write_seeks, 27, "one seek per block");
        assert_eq!(
            rhat.prediction.read_seeks,
            keep_rhat(&padded).prediction.read_seeks
        );
        assert!(rhat.prediction.peak_bytes <= keep_rhat(&padded).prediction.peak_bytes + encoding);
        assert!(rhat.prediction.peak_bytes > keep_rhat(&padded).prediction.peak_bytes);
        assert!(output_planes(&rhat));
        for mem in [rhat.prediction.peak_bytes * 9 / 10, 131_750] {
            let tight = plan(&problem, Strategy::Keep, Some(mem)).unwrap();
            assert!(tight.prediction.peak_bytes <= mem);
            assert_eq!(tight.prediction.write_seeks, 27, "within {mem}");
            assert!(tight.write_modes.iter().all(|&m| m == WriteMode::Keep));
            assert!(output_planes(&tight));
        }
        let refused = plan(&problem, Strategy::Baseline, None).unwrap_err();
        assert!(refused.to_string().contains("--strategy keep"), "{refused}");
        // Blocks written in place plan as before.
        assert_eq!(padded.encoding_bytes(), 0);
    }

    #[test]
    fn workers_hold_a_block_each_and_never_cost_a_seek() {
        use crate::array::geometry::FileShape;
        // 55³ u16 in 10³ padded encoded chunks -> 25³: every step reads
        // more than 8 chunks, so w workers hold w decoded chunks.
        let (plain, problem) = chunks_of_55_encoded();
        let decoded = 10 * 10 * 10 * 2;
        let alone = keep_rhat(&problem);
        for workers in [1, 2, 3, 8] {
            let wide = keep_rhat(&problem.clone().with_workers(workers));
            assert_eq!(
                wide.prediction.peak_bytes,
                keep_rhat(&plain).prediction.peak_bytes + workers as u64 * decoded,
                "{workers} workers"
            );
            assert_eq!(wide.prediction.seeks(), alone.prediction.seeks());
        }
        // Within memory for one worker and a little: as many as fit
        // without a seek more, and no fewer than one.
        let eight = problem.clone().with_workers(8);
        let mem = alone.prediction.peak_bytes + decoded;
        let chosen = plan(&eight, Strategy::Keep, Some(mem)).unwrap();
        assert!(chosen.prediction.peak_bytes <= mem);
        assert!(chosen.problem.workers >= 2, "a smaller step makes room");
        assert_eq!(chosen.prediction.seeks(), alone.prediction.seeks());
        let Err(Error::DoesNotFit { needed, .. }) = plan(&eight, Strategy::Keep, Some(3000)) else {
            panic!("3000 bytes cannot hold a 2000-byte chunk twice");
        };
        let least = plan(&eight, Strategy::Keep, Some(needed)).unwrap();
        let least_alone = plan(&problem, Strategy::Keep, Some(needed)).unwrap();
        assert!(least.prediction.peak_bytes <= needed);
        assert_eq!(least.prediction.seeks(), least_alone.prediction.seeks());
        // Encoded outputs: a slab's blocks are encoded a batch at a time.
        let padded = plain.with_files(FileShape::Exact, FileShape::Padded(vec![25; 3]));
        let encoded = padded.with_encoded_outputs();
        let one = keep_rhat(&encoded).prediction;
        let three = keep_rhat(&encoded.clone().with_workers(3)).prediction;
        assert_eq!(three.seeks(), one.seeks());
        assert!(three.peak_bytes > one.peak_bytes);
        // One worker encodes one block at a time and writes it before the
        // next; three encode three, and three more wait to be written.
        let encoded_three = encoded.clone().with_workers(3);
        let slots = |p: &Problem| (p.encoder_slots().encoding, p.encoder_slots().waiting);
        assert_eq!((slots(&encoded), slots(&encoded_three)), ((1, 0), (3, 3)));
        let block = encoded.encoding_bytes();
        assert_eq!(encoded_three.encoders_bytes(), 3 * block + 3 * block / 2);
        let more_encoding = encoded_three.encoders_bytes() - encoded.encoders_bytes();
        assert!(three.peak_bytes <= one.peak_bytes + more_encoding + 2 * decoded);
        // Never more blocks than the output has: 8 here, for 6 workers.
        let eight_blocks = Problem::new(vec![30; 3], vec![10; 3], vec![25; 3], 2)
            .unwrap()
            .with_encoded_outputs()
            .with_workers(6);
        assert_eq!(slots(&eight_blocks), (6, 2));
    }

    #[test]
    fn the_order_search_simulates_few_plans() {
        // 8000³ u16 in 200³ chunks into 160³ blocks (the 954 GiB view):
        // every order of every read shape has its seeks counted in closed
        // form; memory is simulated only for the orders of fewest seeks of
        // the read shapes that can fit, and once more for the chosen plan.
        let problem = Problem::new(vec![8000; 3], vec![200; 3], vec![160; 3], 2).unwrap();
        let unlimited = plan(&problem, Strategy::Keep, None).unwrap();
        assert_eq!(unlimited.simulations, 7, "6 orders tried, then the plan");
        // Within --mem, keep(r̂) does not fit; the search's simulations.
        for (mem, simulations) in [(256u64 << 20, 45), (1 << 30, 39), (4 << 30, 39)] {
            let chosen = plan(&problem, Strategy::Keep, Some(mem)).unwrap();
            assert!(chosen.prediction.peak_bytes <= mem);
            assert!(chosen.prediction.peak_bytes <= chosen.prediction.peak_bound);
            assert_eq!(
                chosen.simulations,
                simulations,
                "within {mem}: {} seeks",
                chosen.prediction.seeks()
            );
        }
    }

    #[test]
    fn write_intervals_of_the_f0_split() {
        let problem = cube(12, 4, 3);
        let plan = keep_rhat(&problem);
        assert_eq!(plan.write.axis(0).bounds(), &[0, 3, 6, 12]);
        assert_eq!(plan.completed_write_block(&[0, 0, 0]), Some(vec![0, 0, 0]));
    }
}
