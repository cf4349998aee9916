//! The command line: the arguments of every command, and which command
//! runs. Each command has its own file and is a thin layer over the
//! library; messages say what is wrong and what to do.

mod mount;
mod plan;
mod rechunk;
mod report;
pub mod sample;
mod status;

use std::path::PathBuf;

pub use rechunk::Interrupted;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::array::axes::{axis_order_help, AXIS_ORDER_HELP};
use crate::array::units::parse_bytes;

#[derive(Parser, Debug)]
#[command(
    name = "rechunkfs",
    version,
    about = "Rechunk arrays stored as grids of block files, with the fewest seeks in the memory allowed",
    long_about = "rechunkfs reads an array stored as a grid of block files ({i}_{j}_{k}.h5, .npy, \
.nii or .mnc, one file per block, edge blocks may be smaller; or a Zarr v2/v3 array, compressed or \
sharded too; or TIFF: a multi-page .tif, or a stack of 2-D slices as a directory or a quoted glob \
like 'stack/z*.tif', uncompressed or LZW, deflate, PackBits or zstd) \
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
    /// Input: a directory of block files, a Zarr array, TIFF slices (a directory or a quoted
    /// glob), or one file (a multi-page TIFF too).
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
    /// With IN a Zarr group: the array inside it to read, by its path in the group (e.g.
    /// raw/s0). (`plan` without IN takes the array's shape here instead.)
    #[arg(long, value_name = "PATH")]
    pub array: Option<String>,
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
    /// Input: a directory of block files, a Zarr array, TIFF slices (a directory or a quoted
    /// glob), or one file (a multi-page TIFF too). Omit it to plan from --array/--blocks/--dtype.
    #[arg(value_name = "IN", required_unless_present = "array")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub planning: PlanningArgs,
    /// Plan without data (with --array SHAPE): the input block shape.
    #[arg(
        long,
        value_name = "SHAPE",
        conflicts_with = "input",
        requires = "array"
    )]
    pub blocks: Option<String>,
    /// Plan without data (with --array SHAPE): the element type (uint16, u2, <u2, >f4, float16,
    /// u16, f64...).
    #[arg(
        long,
        value_name = "DTYPE",
        conflicts_with = "input",
        requires = "array"
    )]
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
first.\n\nStopping: each block is written under a hidden .NAME.partial name and renamed when \
complete and on disk, so a file with a block's name is always a whole, correct block. Ctrl-C \
(SIGINT), SIGTERM or SIGHUP stops the run between steps, removes every file it wrote (with \
OUT, if it created it) and ends non-zero; run the same command again to start over. A second \
signal, kill -9 or a crash stops it at once and leaves the blocks it finished and its .partial \
files: OUT is then refused as not empty, and --overwrite removes them and starts over. A full \
disk stops the run the same way as a bad block.\n\n", axis_order_help!())
)]
pub struct RechunkArgs {
    /// Input: a directory of block files, a Zarr array, TIFF slices (a directory or a quoted
    /// glob), or one file (to split it; a multi-page TIFF too).
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
        Command::Plan(mut args) => {
            if let Some(input) = &args.input {
                args.input = Some(chosen_array(input, &args.input_args)?);
            }
            plan::plan_command(args)
        }
        Command::Rechunk(mut args) => {
            args.input = chosen_array(&args.input, &args.input_args)?;
            rechunk::rechunk_command(args)
        }
        Command::Mount(mut args) => {
            args.input = chosen_array(&args.input, &args.input_args)?;
            mount::mount_command(args)
        }
        Command::Umount(args) => status::umount_command(args),
        Command::Status(args) => status::status_command(args),
        Command::Sample(args) => sample::sample_command(args),
    }
}

/// The input to read: IN, or with `--array` the array it names inside the
/// Zarr group IN.
fn chosen_array(input: &std::path::Path, args: &InputArgs) -> anyhow::Result<PathBuf> {
    Ok(match &args.array {
        Some(array) => crate::format::zarr::array_in_group(input, array)?,
        None => input.to_path_buf(),
    })
}

/// `--mem` in bytes, if given.
fn mem_of(planning: &PlanningArgs) -> anyhow::Result<Option<u64>> {
    planning
        .mem
        .as_deref()
        .map(parse_bytes)
        .transpose()
        .context("--mem")
}
