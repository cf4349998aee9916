//! What a plan is: the [`Strategy`] it follows, the [`Orders`] it may
//! visit read blocks in, the [`Plan`] itself and its [`Prediction`], and
//! [`assemble`], which turns one option per dimension into a plan with its
//! costs. The planner (`mod.rs`) and the search (`search.rs`) both build
//! plans here.

use serde::Serialize;

use super::cost::{
    clamp, plan_bytes_read, plan_bytes_written, plan_peak, plan_read_seeks, write_seeks,
};
use super::dims::{DimOption, WriteMode};
use super::order::{self, peak_bound};
use super::problem::Problem;
use super::steps::step_axis;
use crate::array::geometry::{Partition, Region};
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

/// What a plan will cost, predicted exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Prediction {
    pub read_seeks: u64,
    pub write_seeks: u64,
    /// Most array bytes held at once: the step of a read block being read,
    /// the slab being written, every piece waiting for its write block, and
    /// with encoded outputs the block being encoded (see `cost`).
    pub peak_bytes: u64,
    /// Array bytes read from the input files: each element once, plus what
    /// bridged reads span between the rows they want (`Problem::bridged`);
    /// for encoded inputs, each decoded block once.
    pub bytes_read: u64,
    /// Array bytes written to the output files: each element once, plus
    /// the padding filled between the rows of padded edge chunks; for
    /// encoded outputs, the whole blocks gathered, padding included, before
    /// encoding.
    pub bytes_written: u64,
    /// A closed-form upper bound on `peak_bytes` (`order::peak_bound`).
    pub peak_bound: u64,
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
    /// Read blocks, visited in `order`.
    pub read: Partition,
    /// The order read blocks are visited in: the axes, outermost first
    /// (C order is `0, 1, …`).
    pub order: Vec<usize>,
    /// Memory simulations (of a read shape in an order) run to choose
    /// this plan.
    pub simulations: u64,
    /// The read blocks cut along the first dimension into the steps the
    /// executor takes, in order, within each read block
    /// (`steps::step_axis`).
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

    /// The rank of read block `index` in the plan's order.
    pub fn read_rank(&self, index: &[usize]) -> u64 {
        order::rank(&self.order, &self.read.grid_shape(), index)
    }

    /// The read block of rank `rank` in the plan's order.
    pub fn read_index_at(&self, rank: u64) -> Vec<usize> {
        order::unravel(&self.order, &self.read.grid_shape(), rank)
    }

    /// Every read block, in the plan's order.
    pub fn read_blocks_in_order(&self) -> impl Iterator<Item = Vec<usize>> {
        order::visit(&self.order, &self.read.grid_shape())
    }

    /// The rank of the first read block that overlaps `region`: in any
    /// order of the axes, the block at its lowest corner.
    pub fn first_read_of(&self, region: &Region) -> u64 {
        let index: Vec<usize> = (0..region.ndim())
            .map(|d| self.read.axis(d).locate(region.origin[d]))
            .collect();
        self.read_rank(&index)
    }

    /// The rank of the read block after which `region` (an output
    /// block) is completely written: per dimension, the read interval that
    /// completes the last write interval overlapping it.
    pub fn completion_step(&self, region: &Region) -> u64 {
        let index: Vec<usize> = (0..region.ndim())
            .map(|d| {
                let write = self.write.axis(d);
                let last_write = write.locate(region.end(d) - 1);
                self.read.axis(d).locate(write.end(last_write) - 1)
            })
            .collect();
        self.read_rank(&index)
    }
}

/// Which orders of the axes the planner may visit read blocks in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Orders {
    /// C order only, as the keep papers read.
    COnly,
    /// Every permutation of the axes (up to 4-D), the best chosen.
    Every,
    /// This permutation of the axes, outermost first (tests compare
    /// orders with it).
    Fixed(Vec<usize>),
}

impl Orders {
    /// Refuses a fixed order that is not a permutation of `ndim` axes.
    pub(super) fn check(&self, ndim: usize) -> Result<()> {
        if let Orders::Fixed(order) = self {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            if sorted != (0..ndim).collect::<Vec<_>>() {
                return Err(Error::BadArgument(format!(
                    "the order {order:?} is not a permutation of the array's {ndim} axes"
                )));
            }
        }
        Ok(())
    }
}

/// The plan that `dims` make, one option per dimension, visited in
/// `order`, with its costs; `simulations` ran to choose it (one more runs
/// here, for its peak).
pub(super) fn assemble(
    problem: &Problem,
    strategy: Strategy,
    dims: &[&DimOption],
    order: &[usize],
    simulations: u64,
) -> Plan {
    let input = problem.input();
    let steps = step_axis(dims, problem);
    let prediction = Prediction {
        read_seeks: clamp(plan_read_seeks(problem, dims, order)),
        write_seeks: clamp(write_seeks(problem, dims)),
        peak_bytes: clamp(plan_peak(problem, dims, &steps, order, u128::MAX)),
        bytes_read: clamp(plan_bytes_read(problem, dims)),
        bytes_written: clamp(plan_bytes_written(problem, dims)),
        peak_bound: clamp(peak_bound(problem, dims, order)),
    };
    Plan {
        strategy,
        problem: problem.clone(),
        input,
        output: problem.output(),
        read: Partition::new(dims.iter().map(|o| o.read.clone()).collect()),
        order: order.to_vec(),
        simulations: simulations + 1,
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
