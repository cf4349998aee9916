//! The command line: argument parsing, human and JSON reports, progress
//! bars. Each subcommand is a thin layer over the library; messages say
//! what is wrong and what to do.

pub mod sample;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use serde_json::json;

use crate::array::axes::{axis_order_help, AxisOrder, AXIS_ORDER_HELP};
use crate::array::dtype::DType;
use crate::array::geometry::show_shape;
use crate::array::units::{parse_bytes, parse_shape, show_bytes};
use crate::engine::RunStats;
use crate::format::BlockFormat;
use crate::input::{HeaderChecks, InputArray};
use crate::output::directory::{self, OutputSpec};
use crate::plan::{self, Plan, Problem, Strategy};

#[derive(Parser, Debug)]
#[command(
    name = "rechunkfs",
    version,
    about = "Rechunk arrays stored as grids of block files, with the fewest seeks in the memory allowed",
    long_about = "rechunkfs reads an array stored as a grid of block files ({i}_{j}_{k}.h5, .npy, \
.nii or .mnc, one file per block, edge blocks may be smaller; or an uncompressed Zarr v2/v3 array) \
and writes it as blocks of another shape (block files, or a Zarr array's chunks), \
following the keep plan: the read and write order with the fewest disk seeks that fits in \
--mem.\n\nExamples:\n  rechunkfs plan blocks/ --shape 256,256,256 --mem 4G\n  \
rechunkfs plan --array 8000,8000,8000 --blocks 200,200,200 --dtype f16 --shape 160,160,160 --mem 4G\n  \
rechunkfs rechunk blocks/ out/ --shape 256,256,256 --mem 4G\n  \
rechunkfs rechunk whole.h5 out/ --shape 100,100,100      (split one file)\n  \
rechunkfs rechunk blocks/ merged/ --shape 100000,100000,100000   (merge: a shape past the array means whole)",
    after_help = AXIS_ORDER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show what rechunking will do: read shape, seeks (keep, baseline, lower bound), peak memory.
    Plan(PlanArgs),
    /// Rechunk into real block files in a directory, with a progress bar.
    Rechunk(RechunkArgs),
    /// Mount a view: the new blocks appear at once as read-only files, filled in the background.
    Mount(MountArgs),
    /// Unmount a view (also when its daemon has died); parked reads get an error.
    Umount(UmountArgs),
    /// Show a view's progress: blocks done, bytes, seeks against the plan, rate, ETA, errors.
    Status(StatusArgs),
    /// Write a sample array (every voxel checkable) as block files, for trying things out.
    Sample(SampleArgs),
}

#[derive(Args, Debug)]
#[command(
    after_help = concat!("The view holds one file per output block, named {i}_{j}_{k}.{ext} by grid \
index, plus rechunkfs.json (the array, its dtype and the new grid) and .rechunkfs-status.json \
(live progress); a read of the unlisted .rechunkfs-wait.json returns the status once \
materialising has ended (what status --wait waits on). Sizes are exact from the first stat. Reading a block that is not done yet waits \
for that block only; its header bytes are served at once. Each block file carries the extended \
attribute user.rechunkfs.state (done or pending).\n\nBlocks are written into a staging directory \
(default: ~/.cache/rechunkfs/...). Mounting again with the same arguments resumes: completed \
blocks are kept, the rest are redone. If an input file changed after the view read it (its size \
or mtime, journaled as it was first read), the mount is refused; --rebuild starts over.\n\nInput headers are checked as in rechunk: a few at the mount, each \
other one when the materialiser first reads its block; a bad block fails the view (status says \
which and why), and reads of blocks not done get an error.\n\nNIfTI blocks (--format nii) carry the input's voxel sizes and an \
affine placing each block in the whole image (identity for HDF5 and npy input); raw blocks \
(--format raw) are data only, described by rechunkfs.json.\n\n", axis_order_help!())
)]
pub struct MountArgs {
    /// Input: a directory of block files, or one file.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// An empty directory to mount the view on.
    #[arg(value_name = "VIEW")]
    pub view: PathBuf,
    #[command(flatten)]
    pub planning: PlanningArgs,
    /// Where to write the blocks (default: under ~/.cache/rechunkfs, keyed by input, shape and format).
    #[arg(long, value_name = "DIR")]
    pub staging: Option<PathBuf>,
    /// Block file format: h5, npy, nii (NIfTI-1), raw, zarr (the view is a Zarr v2 array) or zarr3 (Zarr v3) (default: the input's; h5 for MINC2 input).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    #[command(flatten)]
    pub input_args: InputArgs,
    /// Stay in the foreground with a progress bar; Ctrl-C unmounts.
    #[arg(short, long)]
    pub foreground: bool,
    /// Discard what the staging area holds and start over.
    #[arg(long)]
    pub rebuild: bool,
    /// Let other users read the view (needs user_allow_other in /etc/fuse.conf unless root).
    #[arg(long)]
    pub allow_other: bool,
    /// Fill blocks strictly in the plan's order. By default a block a reader
    /// waits for is extracted ahead of the plan (reading just its part of the
    /// input, within --mem; the extra seeks are counted apart in status).
    #[arg(long)]
    pub in_order: bool,
}

#[derive(Args, Debug)]
pub struct UmountArgs {
    /// The mounted view.
    #[arg(value_name = "VIEW")]
    pub view: PathBuf,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The mounted view.
    #[arg(value_name = "VIEW")]
    pub view: PathBuf,
    /// Print the status as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Wait (with a progress bar on a terminal) until every block is done, then print the
    /// status; exit non-zero if the view fails or stops first.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Args, Debug, Clone)]
pub struct InputArgs {
    /// HDF5 dataset holding the array in each block file.
    #[arg(long, default_value = crate::input::DEFAULT_DATASET, value_name = "PATH")]
    pub dataset: String,
}

#[derive(Args, Debug, Clone)]
pub struct PlanningArgs {
    /// Output block shape, comma-separated (e.g. 256,256,256); sides past the array mean "whole".
    #[arg(long, value_name = "SHAPE")]
    pub shape: String,
    /// Most array bytes to hold in memory (4G, 512M, 1.5GiB, bytes). Default: as much as keep(r̂) needs.
    /// Inside a memory cgroup, at most half its limit when a plan fits there (the page cache needs
    /// the rest).
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// keep (fewest seeks that fit) or baseline (read each input block, write its pieces at once).
    #[arg(long, default_value = "keep", value_name = "NAME")]
    pub strategy: String,
}

#[derive(Args, Debug)]
#[command(after_help = AXIS_ORDER_HELP)]
pub struct PlanArgs {
    /// Input: a directory of block files or one file. Omit it to plan from --array/--blocks/--dtype.
    #[arg(value_name = "IN", required_unless_present = "array")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub planning: PlanningArgs,
    /// Plan without data: the array shape.
    #[arg(long, value_name = "SHAPE", requires_all = ["blocks", "dtype"], conflicts_with = "input")]
    pub array: Option<String>,
    /// Plan without data: the input block shape.
    #[arg(long, value_name = "SHAPE")]
    pub blocks: Option<String>,
    /// Plan without data: the element type (uint16, u2, <u2, >f4, float16, u16, f64...).
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<String>,
    #[command(flatten)]
    pub input_args: InputArgs,
    /// The output format to plan for (default: the input's). Zarr pads edge chunks, so writing
    /// them costs more seeks.
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = concat!("NIfTI blocks (--format nii) carry the input's voxel sizes and an \
affine placing each block in the whole image (identity for HDF5 and npy input); raw blocks \
(--format raw) are data only, and OUT/rechunkfs.json describes them (shape, dtype, axis \
order).\n\nInput headers: two HDF5 or npy blocks of each kind (interior, or last along some \
dimensions) are read before the run; every other block's header is checked when the run first \
reads the file. A bad block stops the run with the file and the problem named, and every file \
the run wrote is removed (with OUT, if the run created it). `rechunkfs plan` reads every header \
first.\n\n", axis_order_help!())
)]
pub struct RechunkArgs {
    /// Input: a directory of block files, or one file (to split it).
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Output directory (created if missing; must be empty unless --overwrite).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    #[command(flatten)]
    pub planning: PlanningArgs,
    /// Output format: h5, npy, nii (NIfTI-1), raw, zarr (OUT becomes a Zarr v2 array) or zarr3 (Zarr v3) (default: the input's; h5 for MINC2 input).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    #[command(flatten)]
    pub input_args: InputArgs,
    /// Replace block files (and rechunkfs.json) already in OUT; other files there are left alone.
    #[arg(long)]
    pub overwrite: bool,
    /// Print the final report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct SampleArgs {
    /// Directory to write the blocks into (created if missing).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// Array shape, comma-separated.
    #[arg(long, value_name = "SHAPE")]
    pub array: String,
    /// Block shape, comma-separated (edge blocks are smaller where it does not divide).
    #[arg(long, value_name = "SHAPE")]
    pub blocks: String,
    /// Element type (uint16, <u2, >f4, float16, u16, ...).
    #[arg(long, default_value = "u16", value_name = "DTYPE")]
    pub dtype: String,
    /// h5, npy or nii (shapes for nii are in NIfTI's x, y, z order).
    #[arg(long, default_value = "h5", value_name = "FORMAT")]
    pub format: String,
    /// HDF5 dataset path to write.
    #[arg(long, default_value = crate::input::DEFAULT_DATASET, value_name = "PATH")]
    pub dataset: String,
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Plan(args) => plan_command(args),
        Command::Rechunk(args) => rechunk_command(args),
        Command::Mount(args) => mount_command(args),
        Command::Umount(args) => {
            crate::fuse::session::unmount(&args.view)?;
            eprintln!("unmounted {}", args.view.display());
            Ok(())
        }
        Command::Status(args) => status_command(args),
        Command::Sample(args) => sample_command(args),
    }
}

fn mount_command(args: MountArgs) -> anyhow::Result<()> {
    use crate::fuse::session;
    use crate::view::MountRequest;
    session::check_mount_point(&args.view)?;
    session::check_fuse()?;
    // The daemon outlives this command; absolute paths keep status and
    // logs unambiguous.
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let request = MountRequest {
        input: absolute(&args.input),
        view: absolute(&args.view),
        output_block: parse_shape(&args.planning.shape).context("--shape")?,
        mem: mem_of(&args.planning)?,
        strategy: args.planning.strategy.parse()?,
        staging: args.staging.as_deref().map(absolute),
        format: args
            .format
            .as_deref()
            .map(str::parse::<BlockFormat>)
            .transpose()?,
        dataset: args.input_args.dataset.clone(),
        rebuild: args.rebuild,
        allow_other: args.allow_other,
        in_order: args.in_order,
    };
    let prepared = crate::view::prepare(&request)?;
    let status = prepared.core.status();
    let summary = format!(
        "{} blocks of {} ({} done already), staging in {}",
        thousands(status.blocks_total),
        show_shape(
            &prepared
                .core
                .layout()
                .axis_order
                .to_user(&prepared.core.layout().output_block)
        ),
        thousands(status.blocks_done),
        status.staging.display()
    );
    if args.foreground {
        let core = prepared.core.clone();
        let view = args.view.clone();
        session::serve(prepared, move |ready| match ready {
            Ok(()) => {
                eprintln!("mounted {}: {summary}; Ctrl-C unmounts", view.display());
                spawn_progress(core);
            }
            Err(e) => eprintln!("rechunkfs: error: {e}"),
        })?;
        eprintln!("unmounted {}", args.view.display());
    } else {
        let log = session::log_path(&prepared);
        let pid = session::serve_in_background(prepared)?;
        eprintln!(
            "mounted {}: {summary}; daemon pid {pid}, log {}",
            args.view.display(),
            log.display()
        );
    }
    Ok(())
}

/// A progress bar for a foreground mount, until every block is done.
fn spawn_progress(core: std::sync::Arc<crate::view::ViewCore>) {
    let status = core.status();
    let bar = progress_bar(status.bytes_total, false);
    let _ = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || loop {
            let status = core.status();
            bar.set_position(status.bytes_done);
            bar.set_message(format!(
                "blocks {}/{}",
                status.blocks_done, status.blocks_total
            ));
            if status.state != "materialising" {
                bar.finish_with_message(format!(
                    "{} ({} blocks)",
                    status.state, status.blocks_done
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        });
}

/// How often `status --wait` moves its progress bar. The wait itself ends
/// when the daemon answers (see [`crate::fuse::session::wait_status`]), not on a tick.
const PROGRESS_TICK: Duration = Duration::from_millis(200);

fn status_command(args: StatusArgs) -> anyhow::Result<()> {
    let mut status = crate::fuse::session::read_status(&args.view)?;
    if args.wait && status.state == "materialising" {
        let bar = progress_bar(status.bytes_total, args.json);
        let (ended, end) = std::sync::mpsc::channel();
        let view = args.view.clone();
        std::thread::Builder::new()
            .name("wait".into())
            .spawn(move || {
                let _ = ended.send(crate::fuse::session::wait_status(&view));
            })?;
        status = loop {
            match end.recv_timeout(PROGRESS_TICK) {
                Ok(result) => break result?,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if !bar.is_hidden() {
                        bar.set_position(crate::fuse::session::read_status(&args.view)?.bytes_done);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    bail!(
                        "{}: the wait for the view ended without an answer",
                        args.view.display()
                    )
                }
            }
        };
        bar.finish_and_clear();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_status(&args.view, &status);
    }
    if args.wait && status.state != "complete" {
        bail!(
            "{}: the view is {} before every block was done{}",
            args.view.display(),
            status.state,
            status
                .error
                .as_deref()
                .map_or(String::new(), |e| format!(": {e}"))
        );
    }
    Ok(())
}

fn print_status(view: &Path, status: &crate::view::Status) {
    let percent = |done: u64, total: u64| {
        if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        }
    };
    println!("view      {}", view.display());
    println!("state     {}", status.state);
    println!(
        "blocks    {} / {} done ({:.1}%), {} resumed from staging",
        thousands(status.blocks_done),
        thousands(status.blocks_total),
        percent(status.blocks_done, status.blocks_total),
        thousands(status.blocks_resumed)
    );
    println!(
        "bytes     {} / {}",
        show_bytes(status.bytes_done),
        show_bytes(status.bytes_total)
    );
    println!(
        "seeks     {} so far; the plan makes {}",
        thousands(status.seeks_made),
        thousands(status.seeks_planned)
    );
    let eta = status
        .eta_seconds
        .map_or("-".to_string(), |s| format!("{:.0} s", s));
    println!(
        "rate      {}/s, ETA {eta}, running {:.0} s",
        show_bytes(status.rate_bytes_per_second as u64),
        status.elapsed_seconds
    );
    println!(
        "waiting   {} reads parked on pending blocks",
        status.waiting_reads
    );
    println!(
        "on demand {} blocks extracted ahead of the plan for waiting readers ({} extra seeks, {:.2} s)",
        thousands(status.on_demand_blocks),
        thousands(status.on_demand_seeks),
        status.on_demand_seconds
    );
    println!(
        "read ahead {} done blocks for readers opening the blocks in order",
        thousands(status.read_ahead_blocks)
    );
    println!("error     {}", status.error.as_deref().unwrap_or("none"));
    println!("staging   {}", status.staging.display());
    println!("daemon    pid {}", status.pid);
}

/// The problem of rechunking `input` into blocks of `shape` (in the
/// input's user-facing order) written as `format` (which says how its files
/// are shaped: Zarr pads edge chunks).
fn problem_of(input: &InputArray, shape: &str, format: BlockFormat) -> anyhow::Result<Problem> {
    let order = input.axis_order();
    let output = order.to_internal(&parse_shape(shape)?);
    if output.len() != input.ndim() {
        bail!(
            "--shape {} has {} dimensions but the input array {} has {}",
            shape,
            output.len(),
            show_shape(&order.to_user(&input.shape)),
            input.ndim()
        );
    }
    let problem = Problem::new(
        input.shape.clone(),
        input.block_shape.clone(),
        output,
        input.dtype.size as u64,
    )?;
    let output_files = crate::output::filetree::output_file_shape(format, &problem.output());
    Ok(problem.with_files(input.files.clone(), output_files))
}

fn mem_of(planning: &PlanningArgs) -> anyhow::Result<Option<u64>> {
    planning
        .mem
        .as_deref()
        .map(parse_bytes)
        .transpose()
        .context("--mem")
}

fn plan_command(args: PlanArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let format = args
        .format
        .as_deref()
        .map(str::parse::<BlockFormat>)
        .transpose()?;
    let (problem, dtype, order) = match (&args.input, &args.array) {
        (Some(input), _) => {
            let input = InputArray::scan(input, Some(&args.input_args.dataset))?;
            let format = format.unwrap_or_else(|| input.format.default_output());
            let problem = problem_of(&input, &args.planning.shape, format)?;
            (problem, input.dtype, input.axis_order())
        }
        (None, Some(array)) => {
            let dtype: DType = args.dtype.as_deref().unwrap_or("u1").parse()?;
            let array = parse_shape(array).context("--array")?;
            let blocks = parse_shape(args.blocks.as_deref().unwrap_or("")).context("--blocks")?;
            let output = parse_shape(&args.planning.shape).context("--shape")?;
            let problem = Problem::new(array, blocks, output, dtype.size as u64)?;
            let output_files = crate::output::filetree::output_file_shape(
                format.unwrap_or(BlockFormat::Hdf5),
                &problem.output(),
            );
            let input_files = crate::array::geometry::FileShape::Exact;
            (
                problem.with_files(input_files, output_files),
                dtype,
                AxisOrder::C,
            )
        }
        (None, None) => bail!("give IN (block files) or --array, --blocks and --dtype"),
    };
    let strategy: Strategy = args.planning.strategy.parse()?;
    let requested = mem_of(&args.planning)?;
    let cgroup_limit = crate::sys::cgroup::memory_limit();
    let (chosen, mem) = plan::plan_within(&problem, strategy, requested, cgroup_limit)?;
    let keep = match strategy {
        Strategy::Keep => Some(chosen.clone()),
        Strategy::Baseline => plan::plan(&problem, Strategy::Keep, mem).ok(),
    };
    let budget = Budget {
        used: mem,
        requested,
        cgroup_limit,
    };
    let baseline = plan::baseline(&problem);
    let rhat = plan::keep_rhat(&problem);
    let elapsed = started.elapsed();
    let report = plan_json(
        &chosen,
        dtype,
        order,
        &budget,
        keep.as_ref(),
        &baseline,
        &rhat,
        elapsed,
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_plan(
            &chosen,
            dtype,
            order,
            &budget,
            keep.as_ref(),
            &baseline,
            elapsed,
        );
    }
    Ok(())
}

fn grid_of(partition: &crate::array::geometry::Partition, order: AxisOrder) -> Vec<usize> {
    order.to_user(&partition.grid_shape())
}

/// The memory a plan was made in, and why.
struct Budget {
    /// What the plan was given (None: unlimited).
    used: Option<u64>,
    /// `--mem` (None: not given).
    requested: Option<u64>,
    /// The memory cgroup's limit, which caps `used` at half of it.
    cgroup_limit: Option<u64>,
}

impl Budget {
    /// " within 128 MiB (--mem 192 MiB, capped at half of the 256 MiB memory cgroup)".
    fn describe(&self) -> String {
        let Some(used) = self.used else {
            return " (no memory limit)".into();
        };
        let mut text = format!(" within {}", show_bytes(used));
        if self.used != self.requested {
            if let Some(limit) = self.cgroup_limit {
                text += &format!(
                    " ({}half of the {} memory cgroup: the rest is page cache for reading ahead and writing back)",
                    self.requested
                        .map_or(String::new(), |mem| format!("--mem {}, capped at ", show_bytes(mem))),
                    show_bytes(limit)
                );
            }
        }
        text
    }
}

#[allow(clippy::too_many_arguments)]
fn plan_json(
    chosen: &Plan,
    dtype: DType,
    order: AxisOrder,
    budget: &Budget,
    keep: Option<&Plan>,
    baseline: &Plan,
    rhat: &Plan,
    elapsed: Duration,
) -> serde_json::Value {
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
            "keep": keep.map(|p| p.prediction.seeks()),
            "baseline": baseline.prediction.seeks(),
            "lower_bound": problem.lower_bound_seeks(),
        },
        "peak_memory_bytes": chosen.prediction.peak_bytes,
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

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_plan(
    chosen: &Plan,
    dtype: DType,
    order: AxisOrder,
    budget: &Budget,
    keep: Option<&Plan>,
    baseline: &Plan,
    elapsed: Duration,
) {
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
    let strategy = chosen.strategy.name();
    println!("strategy      {strategy}{}", budget.describe());
    let steps = if chosen.steps.count() > chosen.read.count() {
        format!(" in {} steps", thousands(chosen.steps.count()))
    } else {
        String::new()
    };
    println!(
        "read shape    {} ({} read blocks{steps}), {} write blocks, writes per dimension: {}",
        user(&chosen.read_shape),
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
    println!(
        "seeks         {} (reads {} + writes {})",
        thousands(chosen.prediction.seeks()),
        thousands(chosen.prediction.read_seeks),
        thousands(chosen.prediction.write_seeks)
    );
    if let Some(keep) = keep {
        println!("  keep        {}", thousands(keep.prediction.seeks()));
    }
    let base = baseline.prediction.seeks();
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
        thousands(problem.lower_bound_seeks())
    );
    println!(
        "peak memory   {} ({} bytes)",
        show_bytes(chosen.prediction.peak_bytes),
        thousands(chosen.prediction.peak_bytes)
    );
    println!("planned in    {:.3} s", elapsed.as_secs_f64());
}

fn show_grid(partition: &crate::array::geometry::Partition, order: AxisOrder) -> String {
    grid_of(partition, order)
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join("×")
}

/// A progress bar on a terminal, nothing elsewhere.
pub fn progress_bar(total_bytes: u64, quiet: bool) -> indicatif::ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total_bytes);
    let style = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

fn rechunk_command(args: RechunkArgs) -> anyhow::Result<()> {
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
    let problem = problem_of(&input, &args.planning.shape, format)?;
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
    // The first output block is the largest: if the format can hold it
    // (NIfTI's limits, MINC2 scaling), it can hold them all. Refuse before
    // OUT is touched.
    spec.template(&plan.output.block(&vec![0; plan.output.ndim()]).shape)?;
    let created_output = directory::prepare_output_dir(&args.output, args.overwrite)?;
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
    let run = directory::rechunk(&input, &plan, &args.output, spec, Some(&cancel), |stats| {
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
    let elapsed = started.elapsed();
    report_run(&plan, &stats, input.axis_order(), elapsed, args.json)
}

fn same_directory(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn report_run(
    plan: &Plan,
    stats: &RunStats,
    order: AxisOrder,
    elapsed: Duration,
    as_json: bool,
) -> anyhow::Result<()> {
    let seconds = elapsed.as_secs_f64();
    if as_json {
        let report = json!({
            "strategy": plan.strategy,
            "read_shape": order.to_user(&plan.read_shape),
            "seeks": {
                "made": stats.seeks(),
                "read": stats.read_seeks,
                "write": stats.write_seeks,
                "planned": plan.prediction.seeks(),
            },
            "bytes_read": stats.bytes_read,
            "fill_bytes": stats.fill_bytes,
            "bytes_written": stats.bytes_written,
            "peak_memory_bytes": stats.peak_held_bytes,
            "planned_peak_memory_bytes": plan.prediction.peak_bytes,
            "output_blocks": stats.output_blocks_done,
            "peak_rss_bytes": peak_rss_bytes(),
            "seconds": seconds,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "wrote {} blocks ({}) in {:.2} s, {}/s",
            thousands(stats.output_blocks_done),
            show_bytes(stats.bytes_written),
            seconds,
            show_bytes((stats.bytes_written as f64 / seconds.max(1e-9)) as u64)
        );
        println!(
            "seeks {} (reads {} + writes {}; planned {})",
            thousands(stats.seeks()),
            thousands(stats.read_seeks),
            thousands(stats.write_seeks),
            thousands(plan.prediction.seeks())
        );
        if stats.fill_bytes > 0 {
            println!(
                "{} came from absent Zarr chunks' fill value, read without I/O \
                 (counted in the seeks as if read)",
                show_bytes(stats.fill_bytes)
            );
        }
        println!(
            "peak memory held {} (planned {}); peak RSS {}",
            show_bytes(stats.peak_held_bytes),
            show_bytes(plan.prediction.peak_bytes),
            peak_rss_bytes().map_or("unknown".into(), show_bytes)
        );
    }
    Ok(())
}

/// This process's peak resident set size, from `getrusage`.
pub fn peak_rss_bytes() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid rusage.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if status != 0 {
        return None;
    }
    // SAFETY: initialised by the successful call above.
    let usage = unsafe { usage.assume_init() };
    Some(usage.ru_maxrss as u64 * 1024)
}

fn sample_command(args: SampleArgs) -> anyhow::Result<()> {
    let dtype: DType = args.dtype.parse()?;
    let format: BlockFormat = args.format.parse()?;
    // Written as the format's readers will address it (see crate::array::axes).
    let order = format.axis_order();
    let array = order.to_internal(&parse_shape(&args.array).context("--array")?);
    let blocks = order.to_internal(&parse_shape(&args.blocks).context("--blocks")?);
    crate::cli::sample::write_sample(&args.output, &array, &blocks, dtype, format, &args.dataset)?;
    eprintln!(
        "wrote a {} {} array as {} blocks of {} into {}",
        show_shape(&order.to_user(&array)),
        dtype,
        format.name(),
        show_shape(&order.to_user(&blocks)),
        args.output.display()
    );
    Ok(())
}
