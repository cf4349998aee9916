//! `rechunk --levels`: level 0 written as a plain rechunk, each coarser
//! level built from the one above it (`output::pyramid`: as level 0 is
//! written when the plan streams it, else after), and the pyramid's
//! metadata last. A pyramid's levels stand or fall together: a
//! run that fails or is interrupted removes every file it wrote.

use std::path::{Path, PathBuf};

use crate::array::axes::AxisOrder;
use crate::array::units::show_bytes;
use crate::cli::args::RechunkArgs;
use crate::cli::failure::{explained_with, Left};
use crate::cli::pyramid;
use crate::cli::report::{progress_bar, run_progress};
use crate::cli::test_hooks::step_delay;
use crate::engine::RunStats;
use crate::error::Error;
use crate::format::ome::WorldAxis;
use crate::format::BlockFormat;
use crate::input::InputArray;
use crate::output::directory::{self, DirectorySink, OutputSpec};
use crate::output::inputs::InputFiles;
use crate::output::job;
use crate::output::pyramid::{
    build_levels, level_dir, pyramid_axes, rechunk_streaming_levels, BuiltLevels, PyramidOutput,
};
use crate::plan::pyramid::{Pyramid, PyramidCost};
use crate::plan::Plan;
use crate::sys::{disk, signals};

/// A pyramid to build after level 0, and what its metadata needs.
pub(super) struct LevelsRequest<'a> {
    pyramid: &'a Pyramid,
    axes: Vec<WorldAxis>,
    mem: Option<u64>,
    cost: PyramidCost,
}

impl<'a> LevelsRequest<'a> {
    /// Checks the output format can hold the pyramid, and plans it within `mem`.
    pub(super) fn new(
        pyramid: &'a Pyramid,
        input: &InputArray,
        plan: &Plan,
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
        if rotated && format.describes_pyramids() {
            eprintln!(
                "note: the input's affine rotates its axes, which {} cannot record: the \
                 pyramid's metadata gives its voxel sizes and origin only",
                format.name()
            );
        }
        let cost = pyramid::cost_of(plan, pyramid, format, spec.dtype.size as u64, mem)?;
        Ok(LevelsRequest {
            pyramid,
            axes,
            mem,
            cost,
        })
    }

    /// What the pyramid's metadata needs.
    fn output<'b>(&'b self, input: &'b InputArray, spec: &'b OutputSpec) -> PyramidOutput<'b> {
        PyramidOutput {
            pyramid: self.pyramid,
            spec,
            axes: &self.axes,
            mem: self.mem,
            input_block: &input.block_shape,
            source: &input.source,
        }
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
        build_levels(out, sink, &self.output(input, spec), Some(stop)).map(Some)
    }

    /// The report's pyramid part; printed at once unless the report is JSON.
    pub(super) fn report(
        &self,
        built: &BuiltLevels,
        order: AxisOrder,
        json: bool,
    ) -> serde_json::Value {
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

/// Runs `plan` into OUT, with a progress bar. A run that fails, or that a
/// stopping signal (SIGINT, SIGTERM, SIGHUP) interrupts between steps,
/// removes every file it wrote, and OUT if it made it, and says so.
pub(super) fn write_levels(
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
    let inputs = InputFiles::of(input);
    let stop = signals::catch_stopping_signals()?;
    if !args.overwrite && args.output.join(job::JOB_NAME).exists() {
        return Err(Error::BadOutput {
            path: args.output.clone(),
            problem: "holds the blocks of an unfinished job run without --levels: run that \
                      command again to finish it, or pass --overwrite to replace them with the \
                      pyramid"
                .into(),
        }
        .into());
    }
    let created_output = directory::prepare_output_for(&args.output, args.overwrite, &inputs)?;
    let free_at_start = disk::free_bytes(&args.output);
    let level0_dir = make_level0_dir(&args.output, spec.format, levels)?;
    let level0 = level0_dir.clone().unwrap_or_else(|| args.output.clone());
    let bar = progress_bar(input.nbytes(), args.quiet || args.json);
    let delay = step_delay();
    let pyramid_spec = spec.clone();
    let then = |sink: &mut DirectorySink| match levels {
        Some(levels) => levels.build(&args.output, input, &pyramid_spec, sink, stop),
        None => Ok(None),
    };
    let progress = run_progress(&bar, delay);
    let run = match levels.filter(|levels| levels.cost.streamed) {
        Some(levels) => rechunk_streaming_levels(
            input,
            plan,
            (&args.output, &level0),
            &levels.output(input, &pyramid_spec),
            Some(stop),
            progress,
        )
        .map(|(stats, built)| (stats, Some(built))),
        None => directory::rechunk_then(input, plan, &level0, spec, Some(stop), progress, then),
    };
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
    let removed = if created_output {
        format!("removed every file it wrote, and {out}, which it had made")
    } else if args.overwrite {
        format!(
            "removed every file it wrote in {out} (the old blocks --overwrite replaced are gone too)"
        )
    } else {
        format!("removed every file it wrote in {out}")
    };
    let left = Left {
        what: format!("{removed}; run the same command again to start over"),
        with_no_space: " once there is space (free some, or choose another OUT)",
    };
    explained_with(args, &left, free_at_start, input, error)
}
