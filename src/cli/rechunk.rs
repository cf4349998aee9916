//! `rechunk`: the plan run into real block files in a directory, with a
//! progress bar; the whole job, or one part of it (`--part K/N`, see
//! `plan::parts`). What the output format cannot hold, or an OUT that is
//! the input, is refused before OUT is touched. OUT records the job
//! (`output::job`), and a later part takes the input and the cuts from
//! that record instead of scanning and searching; a run that fails, is interrupted by SIGINT, SIGTERM or
//! SIGHUP, or is killed keeps every block it finished, and the same
//! command run again writes only the rest.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::bail;

use crate::cli::args::{format_note, RechunkArgs};
use crate::cli::failure::{explained_with, Left};
use crate::cli::levels::{write_levels, LevelsRequest};
use crate::cli::report::{progress_bar, report_run, run_progress};
use crate::cli::request::request_of;
use crate::cli::test_hooks::step_delay;
use crate::engine::RunStats;
use crate::error::Error;
use crate::format::BlockFormat;
use crate::input::{HeaderChecks, InputArray, Values};
use crate::output::directory::{self, OutputSpec, PartOutput};
use crate::output::filetree::FileTree;
use crate::output::inputs::InputFiles;
use crate::output::job::{self, JobRecord, JobSpec};
use crate::output::request::Request;
use crate::plan::parts::Parts;
use crate::plan::{self, Plan, Problem};
use crate::sys::{disk, signals};

pub(super) fn rechunk_command(args: RechunkArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let part = PartArg::of(&args)?;
    let request = request_of(
        &args.input,
        args.format.as_deref(),
        &args.planning,
        &args.input_args,
        &args.pyramid,
    )?;
    let recorded = recorded_job(&args, part);
    let input = match recorded.as_ref() {
        Some(record) => record.input(&args.output)?,
        None => None,
    };
    let from_record = input.is_some();
    let (input, space) = match input {
        Some((input, space)) => (input, Some(space)),
        // Headers are checked as the run reads each block (see crate::input).
        None => (request.scan(HeaderChecks::BeforeUse)?, None),
    };
    log::debug!(
        "{} {} input blocks in {:.3} s",
        if from_record {
            "took from the job record"
        } else {
            "scanned"
        },
        input.blocks.len(),
        started.elapsed().as_secs_f64()
    );
    let checked = request.check(input)?;
    let space = match space {
        Some(space) => space,
        None => checked.input.space()?,
    };
    let (input, problem) = (&checked.input, &checked.problem);
    let (parts, region) = match recorded
        .as_ref()
        .and_then(|r| recorded_parts(r, problem, part))
    {
        Some(parts) => {
            let region = parts.region(part.index);
            (parts, Some(region))
        }
        None => (plan::parts::cut(problem, part.count)?, None),
    };
    // Only the files this part reads, when it reads the part recorded; a
    // scan of the input looked at every one.
    let region = region.filter(|_| from_record);
    if let Some(record) = recorded.as_ref().filter(|_| from_record) {
        record.check_inputs_read(&args.output, input, region.as_ref())?;
    }
    let (plan, mem) = plan_rechunk(&args, &request, &parts.problem(part.index))?;
    let format = output_format(checked.format, &plan);
    if same_directory(&args.input, &args.output) {
        bail!(
            "{}: OUT is the input directory; write the new blocks somewhere else",
            args.output.display()
        );
    }
    let mut spec = checked.output(format, space.clone());
    spec.commit_batch_bytes = super::test_hooks::commit_batch_bytes();
    let order = input.axis_order();
    let pyramid = request.pyramid(&input.shape, &plan.problem.output_block, order, format)?;
    if let Some(pyramid) = &pyramid {
        if spec.encoding.is_encoded() {
            bail!(
                "--levels with --compress or --shard is not written: a pyramid's levels are \
                 uncompressed chunks of --shape; leave out --levels, or --compress and --shard"
            );
        }
        if part.count > 1 {
            bail!(
                "--levels with --part is not written: each level is built from the whole \
                 level above it; run the parts without --levels"
            );
        }
        let levels = LevelsRequest::new(pyramid, input, &plan, &spec, mem)?;
        let (stats, built) = write_levels(&args, input, &plan, spec, Some(&levels))?;
        let extra = built.map(|built| levels.report(&built, order, args.json));
        return report_run(&plan, &stats, order, started.elapsed(), args.json, extra);
    }
    let (identities, inputs) = match recorded.as_ref().filter(|_| from_record) {
        // Those read compared with the files a moment ago; --overwrite
        // keeps every input file from harm, a part those it reads.
        Some(record) if args.overwrite => (record.inputs.clone(), InputFiles::of(input)),
        Some(record) => (
            record.inputs.clone(),
            InputFiles::of_read(input, &job::read_blocks(input, region.as_ref())),
        ),
        // A run of the whole input: every file, one stat each for both.
        None => job::input_identity_and_files(input)?,
    };
    let record = JobRecord {
        inputs: identities,
        input_scan: input.record(&space),
        ..job_record(&args, input, &parts, &spec)?
    };
    let stats = write_output(
        &args,
        (input, &inputs),
        &plan,
        spec,
        (&parts, part),
        (&record, recorded.as_ref()),
    )?;
    let elapsed = started.elapsed();
    report_run(&plan, &stats, order, elapsed, args.json, None)
}

/// The format the output blocks of `plan` are written in: `asked`, or
/// NIfTI-2 where NIfTI-1 cannot hold them (said on stderr, also with
/// --json: the blocks are not what was asked for).
fn output_format(asked: BlockFormat, plan: &Plan) -> BlockFormat {
    // The first output block is the largest.
    let largest = plan.output.block(&vec![0; plan.output.ndim()]).shape;
    let format = asked.for_output_blocks(&largest);
    if let Some(note) = format_note(asked, format) {
        eprintln!("{note}");
    }
    format
}

/// `--part K/N`: which part of how many this run is (0/1: the whole job).
#[derive(Clone, Copy, Debug)]
struct PartArg {
    index: u64,
    count: u64,
}

impl PartArg {
    fn of(args: &RechunkArgs) -> anyhow::Result<PartArg> {
        let Some(text) = &args.part else {
            return Ok(PartArg { index: 0, count: 1 });
        };
        let parsed = text.split_once('/').and_then(|(k, n)| {
            Some((k.trim().parse::<u64>().ok()?, n.trim().parse::<u64>().ok()?))
        });
        let Some((index, count)) = parsed.filter(|&(k, n)| n > 0 && k < n) else {
            bail!(
                "--part {text}: give K/N with 0 <= K < N (part K of N, counted from 0, as \
                 SLURM_ARRAY_TASK_ID counts)"
            );
        };
        if args.overwrite && count > 1 {
            bail!(
                "--overwrite cannot go with --part: the parts of a job share OUT; empty OUT \
                 first, then run every part"
            );
        }
        Ok(PartArg { index, count })
    }
}

/// The record of `args`'s job in OUT, when there is one for this input
/// and number of parts (and `--overwrite` does not start the job over):
/// its input and cuts stand for a scan and a search. Whatever else
/// differs is refused when the run records its job.
fn recorded_job(args: &RechunkArgs, part: PartArg) -> Option<JobRecord> {
    if args.overwrite {
        return None;
    }
    // An OUT that cannot be read is said so when the run prepares it.
    let record = job::read_job(&args.output).ok()??;
    let input = args.input.canonicalize().ok()?;
    let same = record.spec.input == input
        && record.spec.dataset == args.input_args.dataset
        && record.spec.parts == part.count;
    same.then_some(record)
}

/// The parts `record` cut `problem` into, if it is the problem recorded.
fn recorded_parts(record: &JobRecord, problem: &Problem, part: PartArg) -> Option<Parts> {
    let spec = &record.spec;
    let same = spec.array == problem.array
        && spec.input_block == problem.input_block
        && spec.output_block == problem.output_block;
    same.then(|| plan::parts::recorded(problem, part.count, &spec.cuts, &record.bridged))?
}

/// What this job makes, for OUT's record (but the input files'
/// identities): every part computes the same.
fn job_record(
    args: &RechunkArgs,
    input: &InputArray,
    parts: &Parts,
    spec: &OutputSpec,
) -> anyhow::Result<JobRecord> {
    let problem = &parts.problem;
    let output = problem.output();
    let tree = FileTree::for_output(spec.format, output.clone(), spec.axis_order);
    // An encoded block's size is known only once it is written: its final
    // name alone says it is complete.
    let block_sizes = if spec.encoding.is_encoded() {
        Default::default()
    } else {
        job::block_sizes(&tree, |shape| Ok(spec.template(shape)?.file_len()))?
    };
    let metadata_files = directory::array_metadata(
        &input.block_shape,
        &input.source,
        &problem.array,
        &tree.block_shape(),
        spec,
        &output,
    )?
    .into_iter()
    .map(|(name, bytes)| (name, String::from_utf8_lossy(&bytes).into_owned()))
    .collect();
    Ok(JobRecord {
        spec: JobSpec {
            input: args
                .input
                .canonicalize()
                .unwrap_or_else(|_| args.input.clone()),
            dataset: spec.dataset.clone(),
            format: spec.format,
            dtype: spec.dtype.numpy_descr(),
            axis_order: spec.axis_order,
            array: problem.array.clone(),
            input_block: problem.input_block.clone(),
            output_block: problem.output_block.clone(),
            parts: parts.count(),
            cuts: parts
                .grid
                .axes()
                .iter()
                .map(|axis| axis.bounds().to_vec())
                .collect(),
            compress: spec.encoding.compressor.as_ref().map(|c| c.name()),
            shard_chunks: spec.encoding.shard_chunks.clone(),
            values: match args.input_args.values()? {
                Some(Values::Scaled) => "scaled",
                Some(Values::Stored) | None => "stored",
            }
            .into(),
        },
        inputs: Vec::new(),
        block_sizes,
        metadata_files,
        bridged: parts.bridged.clone(),
        input_scan: None,
    })
}

/// The plan for rechunking `problem` (the job, or one part of it) as
/// `args` ask, in the memory allowed (said on stderr when that is not
/// `--mem`).
fn plan_rechunk(
    args: &RechunkArgs,
    request: &Request,
    problem: &Problem,
) -> anyhow::Result<(Plan, Option<u64>)> {
    let planning = Instant::now();
    let (plan, budget) = request.plan(problem, 0)?;
    log::debug!("planned in {:.3} s", planning.elapsed().as_secs_f64());
    if budget.used != budget.requested && !args.json {
        eprintln!("planning{}", budget.describe());
    }
    Ok((plan, budget.used))
}

/// Runs `plan` (part `part` of `parts`) into OUT, with a progress bar,
/// after recording the job there or checking it is the one recorded;
/// blocks already complete in OUT are kept. The whole job (one part) ends
/// with [`job::finish`]. A run that fails, or that a stopping signal
/// (SIGINT, SIGTERM, SIGHUP) interrupts between steps, keeps every block
/// it finished, removes its temporaries, and says so.
fn write_output(
    args: &RechunkArgs,
    (input, inputs): (&InputArray, &InputFiles),
    plan: &Plan,
    spec: OutputSpec,
    (parts, part): (&Parts, PartArg),
    (record, found): (&JobRecord, Option<&JobRecord>),
) -> anyhow::Result<RunStats> {
    // The first output block is the largest: if the format can hold it
    // (NIfTI's limits, MINC2 scaling), it can hold them all. Refuse before
    // OUT is touched.
    spec.template(&plan.output.block(&vec![0; plan.output.ndim()]).shape)?;
    spec.encoder(&plan.output)?;
    // Caught from before OUT is touched: a signal until then ends the
    // process at once, with nothing of this run on disk yet.
    let stop = signals::catch_stopping_signals()?;
    let prepared = directory::prepare_output_for(&args.output, args.overwrite, inputs)
        .and_then(|_| job::record_job(&args.output, record, &job::run_tag(part.index), found))
        .and_then(|()| part_output(&args.output, plan, part.index, record, stop));
    let output = match prepared {
        Ok(output) => output,
        Err(Error::Cancelled) => return Err(explained(args, None, input, Error::Cancelled)),
        Err(error) => return Err(error.into()),
    };
    let kept_before = output.done.len();
    let free_at_start = disk::free_bytes(&args.output);
    let bar = progress_bar(input.nbytes(), args.quiet || args.json);
    let delay = step_delay();
    let run = directory::rechunk_part(
        input,
        plan,
        (&args.output, parts.problem.output()),
        spec,
        output,
        Some(stop),
        run_progress(&bar, delay),
    );
    bar.finish_and_clear();
    let stats = match run {
        Ok(stats) => stats,
        Err(error) => return Err(explained(args, free_at_start, input, error)),
    };
    end_of_run(args, part, kept_before)?;
    Ok(stats)
}

/// The blocks part `index` of the job `record` writes with `plan`, those
/// complete in `out` already marked done: OUT's directories are read,
/// never each name stat'ed, and a new OUT needs no look at its blocks.
/// `stop`, set, ends it ([`Error::Cancelled`]).
fn part_output(
    out: &Path,
    plan: &Plan,
    index: u64,
    record: &JobRecord,
    stop: &AtomicBool,
) -> crate::error::Result<PartOutput> {
    let mut output = PartOutput::of_plan(plan, index);
    let grid = record.spec.output();
    let mine: Vec<std::ops::Range<usize>> = (0..output.blocks.ndim())
        .map(|d| output.first[d]..output.first[d] + output.blocks.axis(d).count())
        .collect();
    let done = job::done_blocks_of(out, record, Some(stop), |rank| {
        grid.unravel(rank)
            .iter()
            .zip(&mine)
            .all(|(i, range)| range.contains(i))
    })?;
    if done.count() == 0 {
        return Ok(output);
    }
    for rank in 0..output.blocks.count() {
        if rank % directory::CANCEL_EVERY == 0 && stop.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        if done.contains(output.whole_rank(&grid, rank)) {
            output.done.insert(rank);
        }
    }
    Ok(output)
}

/// After a run that wrote every block of its part (`kept_before` of them
/// there already): the whole job (one part) is finished; a part says what
/// is next.
fn end_of_run(args: &RechunkArgs, part: PartArg, kept_before: usize) -> anyhow::Result<()> {
    if let Some(signal) = signals::caught() {
        eprintln!("{signal} came after every block of this run was written: they are complete");
    }
    if kept_before > 0 && !args.json {
        eprintln!(
            "{kept_before} block(s) were complete in {} already: kept, not written again",
            args.output.display()
        );
    }
    if part.count == 1 {
        job::finish(&args.output)?;
    } else if !args.json {
        eprintln!(
            "part {}/{} is complete; once every part is, run `rechunkfs finish {}`",
            part.index,
            part.count,
            args.output.display()
        );
    }
    Ok(())
}

/// The error of a failed run, said in terms of OUT: what is kept there
/// and what to do.
fn explained(
    args: &RechunkArgs,
    free_at_start: Option<u64>,
    input: &InputArray,
    error: Error,
) -> anyhow::Error {
    let out = args.output.display();
    if let Error::InputChanged { path, change } = error {
        // The job's record holds the input as it was: a rerun refuses it.
        return anyhow::anyhow!(
            "{}: the input changed while it was being read ({change}); no block made from what \
             was read of it since was completed. {out} keeps the blocks finished before, made \
             from its earlier version, and a rerun refuses them: once nothing writes to the \
             input, start over ({})",
            path.display(),
            start_over(args)
        );
    }
    let left = Left {
        what: format!(
            "kept every block it finished in {out} and removed its temporary files; run the \
             same command again to write the rest"
        ),
        with_no_space: " once there is space (free some, or move OUT with its hidden \
                        .rechunkfs-job.json)",
    };
    explained_with(args, &left, free_at_start, input, error)
}

/// How to run `args`'s job again from nothing, in the OUT it wrote.
fn start_over(args: &RechunkArgs) -> String {
    if args.part.is_some() {
        let out = args.output.display();
        format!("empty {out}, then run every part again")
    } else {
        "the same command with --overwrite".to_string()
    }
}

fn same_directory(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
