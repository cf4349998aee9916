//! `plan`: what rechunking will do, from block files or from shapes alone,
//! as a report or JSON, and a job cut into parts planned as each part's
//! `rechunk` plans it. What an input and `--shape` ask is checked and
//! planned by [`crate::output::request::Request`], as for `rechunk` and
//! `mount`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry::{show_shape, Partition, Region};
use crate::array::units::{parse_shape, show_bytes};
use crate::cli::args::{mem_of, PlanArgs};
use crate::cli::pyramid;
use crate::cli::report::thousands;
use crate::cli::request::request_of;
use crate::format::BlockFormat;
use crate::input::HeaderChecks;
use crate::output::request::{self, encoded, encoding_of, Budget};
use crate::plan::parts::Parts;
use crate::plan::{self, Plan, Problem, Strategy};

/// The plans a `plan` command reports: the chosen one, keep's and the
/// baseline's for comparison, and keep(r̂) (keep with no memory limit).
struct Plans {
    chosen: Plan,
    keep: Option<Plan>,
    baseline: Plan,
    rhat: Plan,
    /// The same strategy and budget, read blocks visited in C order only:
    /// what the chosen order gains over.
    c_order: Option<Plan>,
    budget: Budget,
}

pub(super) fn plan_command(args: PlanArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let format = args
        .format
        .as_deref()
        .map(str::parse::<BlockFormat>)
        .transpose()?;
    let (problem, dtype, order, format) = problem_of_args(&args, format)?;
    let plans = make_plans(&args, &problem)?;
    let pyramid = pyramid::pyramid_of(
        &args.pyramid,
        &problem.array,
        &problem.output_block,
        order,
        format,
    )?;
    let cost = pyramid
        .as_ref()
        .map(|p| {
            pyramid::cost_of(
                &plans.chosen,
                p,
                format,
                dtype.size as u64,
                plans.budget.used,
            )
        })
        .transpose()?;
    let job = match args.parts {
        Some(count) => Some(plan_job(&problem, count, &plans)?),
        None => None,
    };
    let elapsed = started.elapsed();
    if args.json {
        let mut report = plan_json(&plans, dtype, order, elapsed);
        if let (Some(pyramid), Some(cost)) = (&pyramid, &cost) {
            report["pyramid"] = pyramid::cost_json(pyramid, cost, order);
        }
        if let Some(job) = &job {
            report["parts"] = job.json(order);
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_plan(&plans, dtype, order, elapsed);
        if let (Some(pyramid), Some(cost)) = (&pyramid, &cost) {
            pyramid::print_cost(pyramid, cost, order);
        }
        if let Some(job) = &job {
            job.print(order);
        }
    }
    Ok(())
}

/// Parts listed one per line in the human report; `--json` lists all.
const PARTS_SHOWN: usize = 64;

/// A part of a job, planned: its box, its plan and the bytes it reads.
pub(super) struct PartPlan {
    pub(super) region: Region,
    pub(super) plan: Plan,
    pub(super) bytes_read: u64,
}

/// A job cut into parts, each planned as its own rechunk would plan it,
/// beside the plan of one machine doing it all.
pub(super) struct JobPlan {
    pub(super) parts: Parts,
    pub(super) plans: Vec<PartPlan>,
    single_seeks: u64,
    single_bytes: u64,
}

/// `problem` cut into `count` parts, each planned in the memory `plans`
/// (one machine's) was planned in.
fn plan_job(problem: &Problem, count: u64, plans: &Plans) -> anyhow::Result<JobPlan> {
    let budget = (plans.budget.requested, plans.budget.cgroup_limit);
    plan_job_within(problem, count, plans.chosen.strategy, budget, &plans.chosen)
}

/// `problem` cut into `count` parts, each planned with `strategy` within
/// `requested` bytes (`--mem`), whatever cgroup this process is in.
pub(super) fn plan_job_of(
    problem: &Problem,
    count: u64,
    strategy: Strategy,
    requested: Option<u64>,
) -> anyhow::Result<JobPlan> {
    let single = plan::plan(problem, strategy, requested)?;
    plan_job_within(problem, count, strategy, (requested, None), &single)
}

/// `problem` cut into `count` parts, each planned within `(requested,
/// cgroup_limit)` as `rechunk` would; against `single`, one machine's plan.
fn plan_job_within(
    problem: &Problem,
    count: u64,
    strategy: Strategy,
    (requested, cgroup_limit): (Option<u64>, Option<u64>),
    single: &Plan,
) -> anyhow::Result<JobPlan> {
    let parts = plan::parts::cut(problem, count)?;
    let plans_of_parts = (0..parts.count())
        .map(|k| {
            let part = parts.problem(k);
            let (chosen, _) = plan::plan_within(&part, strategy, requested, cgroup_limit)
                .with_context(|| format!("planning part {k} of {count}"))?;
            Ok(PartPlan {
                region: parts.region(k),
                bytes_read: chosen.prediction.bytes_read,
                plan: chosen,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(JobPlan {
        parts,
        plans: plans_of_parts,
        single_seeks: single.prediction.seeks(),
        single_bytes: single.prediction.bytes_read,
    })
}

impl JobPlan {
    fn total_seeks(&self) -> u64 {
        self.plans.iter().map(|p| p.plan.prediction.seeks()).sum()
    }

    fn total_bytes(&self) -> u64 {
        self.plans.iter().map(|p| p.bytes_read).sum()
    }

    /// The largest part's bytes read over the mean.
    fn balance(&self) -> f64 {
        let largest = self.plans.iter().map(|p| p.bytes_read).max().unwrap_or(0);
        let mean = self.total_bytes() as f64 / self.plans.len().max(1) as f64;
        largest as f64 / mean.max(1.0)
    }

    /// The most memory any part plans to hold.
    pub(super) fn peak_bytes(&self) -> u64 {
        self.plans
            .iter()
            .map(|p| p.plan.prediction.peak_bytes)
            .max()
            .unwrap_or(0)
    }

    fn json(&self, order: AxisOrder) -> serde_json::Value {
        let list: Vec<serde_json::Value> = self
            .plans
            .iter()
            .enumerate()
            .map(|(k, part)| {
                json!({
                    "part": k,
                    "origin": order.to_user(&part.region.origin),
                    "shape": order.to_user(&part.region.shape),
                    "output_blocks": part.plan.output.count(),
                    "bytes_read": part.bytes_read,
                    "seeks": part.plan.prediction.seeks(),
                    "read_seeks": part.plan.prediction.read_seeks,
                    "write_seeks": part.plan.prediction.write_seeks,
                    "peak_memory_bytes": part.plan.prediction.peak_bytes,
                })
            })
            .collect();
        let cuts: Vec<&[u64]> = self.parts.grid.axes().iter().map(|a| a.bounds()).collect();
        json!({
            "count": self.plans.len(),
            "grid": grid_of(&self.parts.grid, order),
            "cuts": order.to_user(&cuts),
            "seeks": self.total_seeks(),
            "extra_seeks": self.total_seeks() as i64 - self.single_seeks as i64,
            "bytes_read": self.total_bytes(),
            "extra_bytes_read": self.total_bytes() as i64 - self.single_bytes as i64,
            "balance": self.balance(),
            "bridged": order.to_user(&self.parts.bridged),
            "peak_memory_bytes": self.peak_bytes(),
            "list": list,
        })
    }

    fn print(&self, order: AxisOrder) {
        println!(
            "parts         {} (grid {}), cut at {}",
            self.plans.len(),
            show_grid(&self.parts.grid, order),
            order
                .to_user(self.parts.grid.axes())
                .iter()
                .map(|axis| {
                    let inner = &axis.bounds()[1..axis.count()];
                    if inner.is_empty() {
                        "-".to_string()
                    } else {
                        inner
                            .iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                })
                .collect::<Vec<_>>()
                .join(" × ")
        );
        println!("  part  origin           shape            blocks  bytes read   seeks      peak");
        for (k, part) in self.plans.iter().enumerate().take(PARTS_SHOWN) {
            println!(
                "  {k:<5} {:<16} {:<16} {:>6}  {:>10}  {:>9}  {:>9}",
                show_shape(&order.to_user(&part.region.origin)),
                show_shape(&order.to_user(&part.region.shape)),
                thousands(part.plan.output.count()),
                show_bytes(part.bytes_read),
                thousands(part.plan.prediction.seeks()),
                show_bytes(part.plan.prediction.peak_bytes),
            );
        }
        if self.plans.len() > PARTS_SHOWN {
            println!(
                "  ...   and {} more parts (--json lists every one)",
                self.plans.len() - PARTS_SHOWN
            );
        }
        let percent = |more: u64, of: u64| 100.0 * (more as f64 - of as f64) / of.max(1) as f64;
        println!(
            "  overhead    {} extra seeks ({:+.1}%), {} extra bytes read ({:+.1}%), against one machine",
            self.total_seeks() as i64 - self.single_seeks as i64,
            percent(self.total_seeks(), self.single_seeks),
            self.total_bytes() as i64 - self.single_bytes as i64,
            percent(self.total_bytes(), self.single_bytes),
        );
        println!("  balance     {:.2} (largest part / mean)", self.balance());
        let bridged = order.to_user(&self.parts.bridged);
        if bridged.contains(&true) {
            let dims: Vec<String> = (0..bridged.len())
                .filter(|&d| bridged[d])
                .map(|d| d.to_string())
                .collect();
            let noun = if dims.len() == 1 {
                "dimension"
            } else {
                "dimensions"
            };
            println!(
                "  bridged     {noun} {}: each input block a part clips there is read in one \
                 call, with the other parts' rows between (the extra bytes above)",
                dims.join(", ")
            );
        }
        if self.total_seeks() > 2 * self.single_seeks || self.total_bytes() > 2 * self.single_bytes
        {
            println!(
                "  note        cuts across input blocks along inner dimensions cost a seek per \
                 row of each block they clip, or its other parts' bytes; fewer parts, or a count \
                 the first dimension's output blocks allow, cost far less (docs/cluster.md)"
            );
        }
    }
}

/// The problem to plan, its dtype, axis order and output format: from IN's block files,
/// or from `--array`, `--blocks` and `--dtype` alone.
fn problem_of_args(
    args: &PlanArgs,
    format: Option<BlockFormat>,
) -> anyhow::Result<(Problem, DType, AxisOrder, BlockFormat)> {
    Ok(match (&args.input, &args.input_args.array) {
        (Some(input), _) => {
            let request = request_of(
                input,
                args.format.as_deref(),
                &args.planning,
                &args.input_args,
                &args.pyramid,
            )?;
            let checked = request.check(request.scan(HeaderChecks::AtScan)?)?;
            let order = checked.input.axis_order();
            (checked.problem, checked.input.dtype, order, checked.format)
        }
        (None, Some(array)) => {
            if args.input_args.values.is_some() {
                bail!("--values chooses an input's values; planning without data takes --dtype");
            }
            if args.blocks.is_none() || args.dtype.is_none() {
                bail!("planning without data needs --array SHAPE, --blocks and --dtype");
            }
            let dtype: DType = args.dtype.as_deref().unwrap_or("u1").parse()?;
            let array = parse_shape(array).context("--array")?;
            let blocks = parse_shape(args.blocks.as_deref().unwrap_or("")).context("--blocks")?;
            let format = format.unwrap_or_default();
            let planning = &args.planning;
            let encoding = encoding_of(
                &planning.shape,
                planning.shard.as_deref(),
                planning.compress.as_deref(),
                (&array, AxisOrder::C),
                format,
            )?;
            let written = planning.shard.as_deref().unwrap_or(&planning.shape);
            let output = parse_shape(written).context("--shape")?;
            let problem = Problem::new(array, blocks, output, dtype.size as u64)?;
            let output_files =
                crate::output::filetree::output_file_shape(format, &problem.output());
            let input_files = crate::array::geometry::FileShape::Exact;
            let problem = problem
                .with_files(input_files, output_files)
                .with_workers(crate::engine::workers::threads());
            (encoded(problem, &encoding), dtype, AxisOrder::C, format)
        }
        (None, None) => bail!("give IN (block files) or --array, --blocks and --dtype"),
    })
}

fn make_plans(args: &PlanArgs, problem: &Problem) -> anyhow::Result<Plans> {
    let strategy: Strategy = args.planning.strategy.parse()?;
    let requested = mem_of(&args.planning)?;
    let (chosen, budget) = request::plan_in_budget(problem, strategy, requested)?;
    let mem = budget.used;
    let keep = match strategy {
        Strategy::Keep => Some(chosen.clone()),
        Strategy::Baseline => plan::plan(problem, Strategy::Keep, mem).ok(),
    };
    let c_order = plan::plan_in(problem, strategy, mem, &plan::Orders::COnly).ok();
    Ok(Plans {
        c_order,
        chosen,
        keep,
        baseline: plan::baseline(problem),
        rhat: plan::keep_rhat(problem),
        budget,
    })
}

fn grid_of(partition: &Partition, order: AxisOrder) -> Vec<usize> {
    order.to_user(&partition.grid_shape())
}

fn show_grid(partition: &Partition, order: AxisOrder) -> String {
    grid_of(partition, order)
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join("×")
}

fn plan_json(
    plans: &Plans,
    dtype: DType,
    order: AxisOrder,
    elapsed: Duration,
) -> serde_json::Value {
    let Plans {
        chosen,
        keep,
        baseline,
        rhat,
        c_order,
        budget,
    } = plans;
    let problem = &chosen.problem;
    let user = |shape: &[u64]| order.to_user(shape);
    json!({
        "array": user(&problem.array),
        "dtype": dtype.numpy_descr(),
        "elem_size": problem.elem_size,
        "axis_order": order,
        "input_block": user(&problem.input_block),
        "output_block": user(&problem.output_block),
        "input_grid": grid_of(&chosen.input, order),
        "output_grid": grid_of(&chosen.output, order),
        "strategy": chosen.strategy,
        "read_shape": user(&chosen.read_shape),
        "read_grid": grid_of(&chosen.read, order),
        "read_blocks": chosen.read.count(),
        "read_steps": chosen.steps.count(),
        "write_blocks": chosen.write.count(),
        "write_modes": order.to_user(&chosen.write_modes),
        "seeks": {
            "planned": chosen.prediction.seeks(),
            "read": chosen.prediction.read_seeks,
            "write": chosen.prediction.write_seeks,
            "keep": keep.as_ref().map(|p| p.prediction.seeks()),
            "baseline": baseline.prediction.seeks(),
            "lower_bound": problem.lower_bound_seeks(),
        },
        "peak_memory_bytes": chosen.prediction.peak_bytes,
        "threads": chosen.problem.workers,
        "peak_memory_bound_bytes": chosen.prediction.peak_bound,
        "read_order": user_axes(&chosen.order, order),
        "c_order": c_order.as_ref().map(|p| json!({
            "seeks": p.prediction.seeks(),
            "peak_memory_bytes": p.prediction.peak_bytes,
        })),
        "mem_limit_bytes": budget.used,
        "mem_requested_bytes": budget.requested,
        "cgroup_memory_limit_bytes": budget.cgroup_limit,
        "keep_rhat": {
            "read_shape": user(&rhat.read_shape),
            "seeks": rhat.prediction.seeks(),
            "peak_memory_bytes": rhat.prediction.peak_bytes,
        },
        "baseline_peak_memory_bytes": baseline.prediction.peak_bytes,
        "planning_seconds": elapsed.as_secs_f64(),
    })
}

fn print_plan(plans: &Plans, dtype: DType, order: AxisOrder, elapsed: Duration) {
    let chosen = &plans.chosen;
    print_grids(chosen, dtype, order);
    let strategy = chosen.strategy.name();
    println!("strategy      {strategy}{}", plans.budget.describe());
    print_reads(chosen, order);
    print_seeks(plans);
    println!(
        "peak memory   {} ({} bytes)",
        show_bytes(chosen.prediction.peak_bytes),
        thousands(chosen.prediction.peak_bytes)
    );
    println!(
        "  bound       {} ({} bytes, closed form; the peak is {:.0}% of it)",
        show_bytes(chosen.prediction.peak_bound),
        thousands(chosen.prediction.peak_bound),
        100.0 * chosen.prediction.peak_bytes as f64 / chosen.prediction.peak_bound.max(1) as f64
    );
    print_order(plans, order);
    let workers = chosen.problem.workers;
    println!(
        "threads       {workers} decoding and encoding blocks (the peak counts what they hold)"
    );
    let encoding = chosen.problem.encoding_bytes();
    if encoding > 0 {
        let slots = chosen.problem.encoder_slots();
        let waiting = match slots.waiting {
            0 => String::new(),
            n => format!(
                ", and {} for each of up to {n} encodings waiting to be written",
                show_bytes(encoding / 2)
            ),
        };
        println!(
            "encoded       each output block gathered whole, encoded and written in one call; \
             the peak includes {} for each of up to {} blocks being encoded (the block and its encoding){waiting}",
            show_bytes(encoding),
            slots.encoding
        );
    }
    println!("planned in    {:.3} s", elapsed.as_secs_f64());
}

/// The array, and the input and output blocks and grids.
fn print_grids(chosen: &Plan, dtype: DType, order: AxisOrder) {
    let problem = &chosen.problem;
    let user = |shape: &[u64]| show_shape(&order.to_user(shape));
    let nbytes = crate::array::geometry::volume(&problem.array) * problem.elem_size;
    println!(
        "array         {} {dtype} ({}){}",
        user(&problem.array),
        show_bytes(nbytes),
        match order {
            AxisOrder::C => "",
            AxisOrder::Nifti => ", shapes in NIfTI (x, y, z) order",
        }
    );
    println!(
        "input blocks  {}, grid {} ({} blocks)",
        user(&problem.input_block),
        show_grid(&chosen.input, order),
        thousands(chosen.input.count())
    );
    println!(
        "output blocks {}, grid {} ({} blocks)",
        user(&problem.output_block),
        show_grid(&chosen.output, order),
        thousands(chosen.output.count())
    );
}

/// What the plan reads and how it writes.
fn print_reads(chosen: &Plan, order: AxisOrder) {
    let steps = if chosen.steps.count() > chosen.read.count() {
        format!(" in {} steps", thousands(chosen.steps.count()))
    } else {
        String::new()
    };
    println!(
        "read shape    {} ({} read blocks{steps}), {} write blocks, writes per dimension: {}",
        show_shape(&order.to_user(&chosen.read_shape)),
        thousands(chosen.read.count()),
        thousands(chosen.write.count()),
        order
            .to_user(&chosen.write_modes)
            .iter()
            .map(|m| match m {
                plan::WriteMode::Keep => "keep",
                plan::WriteMode::Immediate => "immediate",
            })
            .collect::<Vec<_>>()
            .join(",")
    );
}

/// The axes of `axes` (array axes, outermost first) as the user numbers them.
fn user_axes(axes: &[usize], order: AxisOrder) -> Vec<usize> {
    let n = axes.len();
    axes.iter()
        .map(|&d| match order {
            AxisOrder::C => d,
            AxisOrder::Nifti => n - 1 - d,
        })
        .collect()
}

/// The order read blocks are visited in, and what it gains over C order.
fn print_order(plans: &Plans, order: AxisOrder) {
    let chosen = &plans.chosen;
    let axes = user_axes(&chosen.order, order)
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let gain = match &plans.c_order {
        Some(c) if c.order == chosen.order && c.read_shape == chosen.read_shape => {
            "; C order is as good".to_string()
        }
        Some(c) => format!(
            "; C order: {} seeks, peak {}",
            thousands(c.prediction.seeks()),
            show_bytes(c.prediction.peak_bytes)
        ),
        None => "; in C order no plan fits".to_string(),
    };
    println!("read order    axes {axes}, outermost first{gain}");
}

/// The plan's seeks beside keep's, the baseline's and the lower bound.
fn print_seeks(plans: &Plans) {
    let chosen = &plans.chosen;
    println!(
        "seeks         {} (reads {} + writes {})",
        thousands(chosen.prediction.seeks()),
        thousands(chosen.prediction.read_seeks),
        thousands(chosen.prediction.write_seeks)
    );
    if let Some(keep) = &plans.keep {
        println!("  keep        {}", thousands(keep.prediction.seeks()));
    }
    let base = plans.baseline.prediction.seeks();
    println!(
        "  baseline    {}{}",
        thousands(base),
        if chosen.prediction.seeks() > 0 {
            format!(
                " ({:.1}× the planned seeks)",
                base as f64 / chosen.prediction.seeks() as f64
            )
        } else {
            String::new()
        }
    );
    println!(
        "  lower bound {} (n_I + n_O)",
        thousands(chosen.problem.lower_bound_seeks())
    );
}
