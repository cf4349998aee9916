//! `rechunk`: the plan run into real block files in a directory, with a
//! progress bar. What the output format cannot hold, or an OUT that is
//! the input, is refused before OUT is touched; a failed run leaves no
//! file it wrote behind.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;

use crate::cli::plan::{problem_of, Budget};
use crate::cli::report::{progress_bar, report_run};
use crate::cli::{mem_of, RechunkArgs};
use crate::engine::RunStats;
use crate::format::BlockFormat;
use crate::input::{HeaderChecks, InputArray};
use crate::output::directory::{self, OutputSpec};
use crate::plan::{self, Plan, Strategy};

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
    let plan = plan_rechunk(&args, &input, format)?;
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
    };
    let stats = write_output(&args, &input, &plan, spec)?;
    let elapsed = started.elapsed();
    report_run(&plan, &stats, input.axis_order(), elapsed, args.json)
}

/// The plan for rechunking `input` as `args` ask, in the memory allowed
/// (said on stderr when that is not `--mem`).
fn plan_rechunk(
    args: &RechunkArgs,
    input: &InputArray,
    format: BlockFormat,
) -> anyhow::Result<Plan> {
    let problem = problem_of(input, &args.planning.shape, format)?;
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
    Ok(plan)
}

/// Runs `plan` into OUT, with a progress bar; a failed run removes OUT
/// if it made it.
fn write_output(
    args: &RechunkArgs,
    input: &InputArray,
    plan: &Plan,
    spec: OutputSpec,
) -> anyhow::Result<RunStats> {
    // The first output block is the largest: if the format can hold it
    // (NIfTI's limits, MINC2 scaling), it can hold them all. Refuse before
    // OUT is touched.
    spec.template(&plan.output.block(&vec![0; plan.output.ndim()]).shape)?;
    let created_output = directory::prepare_output_dir(&args.output, args.overwrite)?;
    let format = spec.format;
    let metadata = directory::metadata_json(
        &input.shape,
        input.dtype,
        &input.block_shape,
        &plan.output,
        format,
        &spec.dataset,
        spec.axis_order,
        &input.source,
    );
    let bar = progress_bar(input.nbytes(), args.quiet || args.json);
    let cancel = Arc::new(AtomicBool::new(false));
    let run = directory::rechunk(input, plan, &args.output, spec, Some(&cancel), |stats| {
        bar.set_position(stats.bytes_written);
        bar.set_message(format!(
            "blocks {}/{}",
            stats.output_blocks_done, stats.output_blocks_total
        ));
    });
    if created_output && matches!(&run, Err(e) if !matches!(e, crate::error::Error::Cancelled)) {
        // Failed: rechunk removed what it wrote, and OUT goes too.
        let _ = std::fs::remove_dir(&args.output);
    }
    let stats = run?;
    bar.finish_and_clear();
    if format == BlockFormat::Raw {
        directory::write_metadata(&args.output, &metadata)?;
    }
    Ok(stats)
}

fn same_directory(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
