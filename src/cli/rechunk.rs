//! `rechunk`: the plan run into real block files in a directory, with a
//! progress bar. What the output format cannot hold, or an OUT that is
//! the input, is refused before OUT is touched; a failed run, or one
//! interrupted by SIGINT, SIGTERM or SIGHUP, leaves no file it wrote
//! behind and says so.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;
use nix::sys::signal::Signal;

use crate::array::axes::AxisOrder;
use crate::array::units::show_bytes;
use crate::cli::plan::{encoded_problem_of, Budget};
use crate::cli::pyramid;
use crate::cli::report::{progress_bar, report_run};
use crate::cli::{mem_of, RechunkArgs};
use crate::engine::RunStats;
use crate::error::Error;
use crate::format::ome::WorldAxis;
use crate::format::BlockFormat;
use crate::input::{HeaderChecks, InputArray};
use crate::output::directory::{self, DirectorySink, OutputSpec};
use crate::output::pyramid::{build_levels, level_dir, pyramid_axes, BuiltLevels, PyramidOutput};
use crate::plan::pyramid::{Pyramid, PyramidCost};
use crate::plan::{self, Plan, Problem, Strategy};
use crate::sys::{disk, signals};

pub(super) fn rechunk_command(args: RechunkArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    // Headers are checked as the run reads each block (see crate::input).
    let input = InputArray::scan_with(
        &args.input,
        Some(&args.input_args.dataset),
        HeaderChecks::BeforeUse,
    )?;
    log::debug!(
        "scanned {} input blocks in {:.3} s",
        input.blocks.len(),
        started.elapsed().as_secs_f64()
    );
    let format = match &args.format {
        Some(text) => text.parse::<BlockFormat>()?,
        None => input.format.default_output(),
    };
    let input = input.with_values(args.input_args.values()?, format)?;
    let (problem, encoding) = encoded_problem_of(&input, &args.planning, format)?;
    let (plan, mem) = plan_rechunk(&args, problem)?;
    let format = output_format(format, &plan);
    if same_directory(&args.input, &args.output) {
        bail!(
            "{}: OUT is the input directory; write the new blocks somewhere else",
            args.output.display()
        );
    }
    let spec = OutputSpec {
        format,
        dataset: args.input_args.dataset.clone(),
        dtype: input.dtype,
        space: input.space()?,
        axis_order: input.axis_order(),
        encoding,
    };
    let order = input.axis_order();
    let pyramid = pyramid::pyramid_of(
        &args.pyramid,
        &input.shape,
        &plan.problem.output_block,
        order,
        format,
    )?;
    if pyramid.is_some() && spec.encoding.is_encoded() {
        bail!(
            "--levels with --compress or --shard is not written: a pyramid's levels are \
             uncompressed chunks of --shape; leave out --levels, or --compress and --shard"
        );
    }
    let levels = pyramid
        .as_ref()
        .map(|pyramid| LevelsRequest::new(pyramid, &input, &spec, mem))
        .transpose()?;
    let (stats, built) = write_output(&args, &input, &plan, spec, levels.as_ref())?;
    let elapsed = started.elapsed();
    let extra = match (&levels, built) {
        (Some(levels), Some(built)) => Some(levels.report(&built, order, args.json)),
        _ => None,
    };
    report_run(&plan, &stats, order, elapsed, args.json, extra)
}

/// A pyramid to build after level 0, and what its metadata needs.
struct LevelsRequest<'a> {
    pyramid: &'a Pyramid,
    axes: Vec<WorldAxis>,
    mem: Option<u64>,
    cost: PyramidCost,
}

impl<'a> LevelsRequest<'a> {
    /// Checks the output format can hold the pyramid, and plans it within `mem`.
    fn new(
        pyramid: &'a Pyramid,
        input: &InputArray,
        spec: &OutputSpec,
        mem: Option<u64>,
    ) -> anyhow::Result<LevelsRequest<'a>> {
        let format = spec.format;
        let level0 = &pyramid.levels[0];
        let block: Vec<u64> = (0..level0.ndim())
            .map(|d| level0.axis(d).extent(0))
            .collect();
        let (axes, rotated) = pyramid_axes(
            format,
            input.format,
            &spec.space,
            &input.shape,
            &block,
            spec.dtype,
        )?;
        if rotated && (format.pads_edge_blocks() || format == BlockFormat::Precomputed) {
            eprintln!(
                "note: the input's affine rotates its axes, which {} cannot record: the \
                 pyramid's metadata gives its voxel sizes and origin only",
                format.name()
            );
        }
        let cost = pyramid::cost_of(pyramid, format, spec.dtype.size as u64, mem)?;
        Ok(LevelsRequest {
            pyramid,
            axes,
            mem,
            cost,
        })
    }

    /// Builds the levels below level 0 (in `sink`) and the pyramid's metadata.
    fn build(
        &self,
        out: &Path,
        input: &InputArray,
        spec: &OutputSpec,
        sink: &mut DirectorySink,
        stop: &std::sync::atomic::AtomicBool,
    ) -> crate::error::Result<Option<BuiltLevels>> {
        let output = PyramidOutput {
            pyramid: self.pyramid,
            spec,
            axes: &self.axes,
            mem: self.mem,
            input_block: &input.block_shape,
            source: &input.source,
        };
        build_levels(out, sink, &output, Some(stop)).map(Some)
    }

    /// The report's pyramid part; printed at once unless the report is JSON.
    fn report(&self, built: &BuiltLevels, order: AxisOrder, json: bool) -> serde_json::Value {
        let value = serde_json::json!({
            "planned": pyramid::cost_json(self.pyramid, &self.cost, order),
            "levels": built.stats,
        });
        if !json {
            let blocks: u64 = built.stats.iter().map(|s| s.blocks).sum();
            let bytes: u64 = built.stats.iter().map(|s| s.bytes_written).sum();
            println!(
                "pyramid: {} levels below level 0, {blocks} blocks ({})",
                built.stats.len(),
                show_bytes(bytes)
            );
        }
        value
    }
}

/// The format the output blocks of `plan` are written in: `asked`, or
/// NIfTI-2 where NIfTI-1 cannot hold them (said on stderr, also with
/// --json: the blocks are not what was asked for).
fn output_format(asked: BlockFormat, plan: &Plan) -> BlockFormat {
    // The first output block is the largest.
    let largest = plan.output.block(&vec![0; plan.output.ndim()]).shape;
    let format = asked.for_output_blocks(&largest);
    if let Some(note) = crate::cli::format_note(asked, format) {
        eprintln!("{note}");
    }
    format
}

/// The plan for rechunking `input` as `args` ask, in the memory allowed
/// (said on stderr when that is not `--mem`).
fn plan_rechunk(args: &RechunkArgs, problem: Problem) -> anyhow::Result<(Plan, Option<u64>)> {
    let strategy: Strategy = args.planning.strategy.parse()?;
    let requested = mem_of(&args.planning)?;
    let cgroup_limit = crate::sys::cgroup::memory_limit();
    let planning = Instant::now();
    let (plan, mem) = plan::plan_within(&problem, strategy, requested, cgroup_limit)?;
    log::debug!("planned in {:.3} s", planning.elapsed().as_secs_f64());
    let budget = Budget {
        used: mem,
        requested,
        cgroup_limit,
    };
    if budget.used != budget.requested && !args.json {
        eprintln!("planning{}", budget.describe());
    }
    Ok((plan, mem))
}

/// Runs `plan` into OUT, with a progress bar. A run that fails, or that a
/// stopping signal (SIGINT, SIGTERM, SIGHUP) interrupts between steps,
/// removes every file it wrote, and OUT if it made it, and says so.
fn write_output(
    args: &RechunkArgs,
    input: &InputArray,
    plan: &Plan,
    spec: OutputSpec,
    levels: Option<&LevelsRequest>,
) -> anyhow::Result<(RunStats, Option<BuiltLevels>)> {
    // The first output block is the largest: if the format can hold it
    // (NIfTI's limits, MINC2 scaling), it can hold them all. Refuse before
    // OUT is touched.
    spec.template(&plan.output.block(&vec![0; plan.output.ndim()]).shape)?;
    spec.encoder(&plan.output)?;
    // Caught from before OUT is touched: a signal until then ends the
    // process at once, with nothing of this run on disk yet.
    let stop = signals::catch_stopping_signals()?;
    let created_output = directory::prepare_output_dir(&args.output, args.overwrite)?;
    let free_at_start = disk::free_bytes(&args.output);
    let level0_dir = make_level0_dir(&args.output, spec.format, levels)?;
    let level0 = level0_dir.clone().unwrap_or_else(|| args.output.clone());
    let bar = progress_bar(input.nbytes(), args.quiet || args.json);
    let delay = step_delay();
    let mut read_blocks_done = 0;
    let pyramid_spec = spec.clone();
    let then = |sink: &mut DirectorySink| match levels {
        Some(levels) => levels.build(&args.output, input, &pyramid_spec, sink, stop),
        None => Ok(None),
    };
    let run = directory::rechunk_then(
        input,
        plan,
        &level0,
        spec,
        Some(stop),
        |stats| {
            bar.set_position(stats.bytes_written);
            bar.set_message(format!(
                "blocks {}/{}",
                stats.output_blocks_done, stats.output_blocks_total
            ));
            if let Some(delay) = delay.filter(|_| stats.read_blocks_done > read_blocks_done) {
                std::thread::sleep(delay);
            }
            read_blocks_done = stats.read_blocks_done;
        },
        then,
    );
    bar.finish_and_clear();
    let Err(error) = run else {
        if let Some(signal) = signals::caught() {
            eprintln!(
                "{signal} came after every block was written: {} is complete",
                args.output.display()
            );
        }
        return run.map_err(Into::into);
    };
    // Failed: rechunk removed what it wrote, and OUT goes too.
    if let Some(dir) = level0_dir {
        let _ = std::fs::remove_dir(dir);
    }
    if created_output {
        let _ = std::fs::remove_dir(&args.output);
    }
    Err(explained(args, created_output, free_at_start, input, error))
}

/// Makes the directory level 0 goes in when it is not OUT itself (an
/// OME-Zarr image's `0/`, a precomputed scale's), and says which it is.
fn make_level0_dir(
    out: &Path,
    format: BlockFormat,
    levels: Option<&LevelsRequest>,
) -> anyhow::Result<Option<PathBuf>> {
    let count = levels.map_or(1, |l| l.pyramid.levels.len());
    let Some(dir) = level_dir(format, count, 0) else {
        return Ok(None);
    };
    let dir = out.join(dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(&dir, "creating level 0's directory", e))?;
    Ok(Some(dir))
}

/// The error of a failed run, said in terms of OUT: what is left there and
/// what to do.
fn explained(
    args: &RechunkArgs,
    created_output: bool,
    free_at_start: Option<u64>,
    input: &InputArray,
    error: Error,
) -> anyhow::Error {
    let out = args.output.display();
    let left = if created_output {
        format!("removed every file it wrote, and {out}, which it had made")
    } else if args.overwrite {
        format!(
            "removed every file it wrote in {out} (the old blocks --overwrite replaced are gone too)"
        )
    } else {
        format!("removed every file it wrote in {out}")
    };
    match error {
        Error::Cancelled => match signals::caught() {
            Some(signal) => Interrupted {
                signal,
                message: format!(
                    "interrupted by {signal} before {out} was complete: {left}; run the same \
                     command again to start over"
                ),
            }
            .into(),
            None => anyhow::anyhow!("cancelled: {left}"),
        },
        ref error if error.is_no_space() => {
            let free = free_at_start.map_or(String::new(), |free| {
                format!(", and {} were free when it started", show_bytes(free))
            });
            anyhow::anyhow!(
                "{out}: no space left on the output's filesystem: the array needs about {}{free}; \
                 {left}. Free some space there, or choose another OUT, and run the same command \
                 again. ({error})",
                show_bytes(input.nbytes())
            )
        }
        // The cause says it all; OUT is as the run found it.
        other => other.into(),
    }
}

/// A run stopped by a signal: the command's message, and the signal the
/// process then ends by (see [`signals::end_by`]).
#[derive(Debug)]
pub struct Interrupted {
    pub signal: Signal,
    pub message: String,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Interrupted {}

/// `RECHUNKFS_STEP_DELAY_MS`: a pause after every read block, as the
/// view's materialiser makes, so that tests can interrupt a run of a
/// small array at a point of their choosing.
fn step_delay() -> Option<Duration> {
    std::env::var("RECHUNKFS_STEP_DELAY_MS")
        .ok()
        .and_then(|text| text.parse().ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

fn same_directory(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
