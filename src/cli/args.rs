//! The arguments of every command, as clap parses them, and what several
//! commands read from them alike (`--mem`, the note on a format changed).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::array::axes::{axis_order_help, AXIS_ORDER_HELP};
use crate::array::units::parse_bytes;
use crate::format::BlockFormat;

/// `--format` of every command that writes or plans blocks (`rechunk`,
/// `plan`, `mount`, `slurm`): one text, so that no command lists fewer
/// formats than it writes.
pub const FORMAT_HELP: &str = "Block file format: h5, npy, nii (NIfTI-1), nii2 (NIfTI-2), raw, \
zarr (a Zarr v2 array), zarr3 (Zarr v3) or precomputed (Neuroglancer, raw chunks) (default: the \
input's; h5 for MINC2 input). Zarr pads edge chunks, so writing them costs more seeks.";

#[derive(Parser, Debug)]
#[command(
    name = "rechunkfs",
    version,
    about = "Rechunk arrays stored as grids of block files, with the fewest seeks in the memory allowed",
    long_about = "rechunkfs reads an array stored as a grid of block files ({i}_{j}_{k}.h5, .npy, \
.nii, .nii.gz (NIfTI-1 or -2) or .mnc, one file per block, edge blocks may be smaller; or a Zarr v2/v3 array, compressed or \
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
    /// Show a view's progress: blocks done, bytes, seeks against the plan, rate, ETA, errors; or a
    /// directory run's blocks done per part.
    Status(StatusArgs),
    /// End a job run in parts: check every block is in OUT, complete, then write the array's
    /// metadata (Zarr .zarray/zarr.json, rechunkfs.json) last.
    Finish(FinishArgs),
    /// Print (or --submit) a SLURM script running a job in N parts as a job array, then finish.
    Slurm(SlurmArgs),
    /// Write a sample array (every voxel checkable) as block files, for trying things out.
    Sample(SampleArgs),
    /// Serve a mounted view or an output directory over HTTP, read-only (for Neuroglancer, TensorStore).
    Serve(ServeArgs),
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
which and why), and reads of blocks not done get an error.\n\nNIfTI blocks (--format nii, or nii2 for NIfTI-2, which \
blocks with a side over 32,767 get anyway) carry the input's voxel sizes and an \
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
    #[command(flatten)]
    pub pyramid: PyramidArgs,
    /// Where to write the blocks (default: under ~/.cache/rechunkfs, keyed by input, shape and format).
    #[arg(long, value_name = "DIR")]
    pub staging: Option<PathBuf>,
    #[arg(long, value_name = "FORMAT", help = FORMAT_HELP)]
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
    /// Also serve the view over HTTP, read-only, on PORT of 127.0.0.1 (HOST:PORT to listen
    /// elsewhere; 0 picks a free port), straight from the view: a request for a pending block
    /// waits for it. Prints the URL to give Neuroglancer.
    #[arg(long, value_name = "[HOST:]PORT")]
    pub serve: Option<String>,
    /// With --serve: which web pages may read it (CORS): an origin such as
    /// https://neuroglancer-demo.appspot.com, '*', or none (default: '*' on loopback, none
    /// elsewhere).
    #[arg(long, value_name = "ORIGIN", requires = "serve")]
    pub cors_origin: Option<String>,
}

#[derive(Args, Debug)]
pub struct UmountArgs {
    /// The mounted view.
    #[arg(value_name = "VIEW")]
    pub view: PathBuf,
}

#[derive(Args, Debug)]
#[command(
    after_help = "The script submits a job array of N tasks, task K running `rechunkfs rechunk IN \
OUT ... --part K/N` (every part with the same arguments), and a job that runs `rechunkfs finish \
OUT` once every task has succeeded (afterok). Each task asks for --cpus-per-task=2 (one core \
reads while the other writes) and twice the largest part's planned peak memory plus 64 MiB: \
inside a memory cgroup rechunkfs plans within half of it, so every part plans as `plan --parts` \
shows. Run the script again with array indices (`bash job.sh 3,17`) to resubmit failed parts: \
each keeps the blocks it finished. See docs/cluster.md."
)]
pub struct SlurmArgs {
    /// Input: a directory of block files, or one file.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Output directory (on a filesystem every node sees).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    #[command(flatten)]
    pub planning: PlanningArgs,
    #[arg(long, value_name = "FORMAT", help = FORMAT_HELP)]
    pub format: Option<String>,
    #[command(flatten)]
    pub input_args: InputArgs,
    /// How many parts (array tasks); `plan --parts N` shows the cost of each choice.
    #[arg(long, value_name = "N")]
    pub parts: u64,
    /// Most tasks running at once (the array's %M).
    #[arg(long, value_name = "M")]
    pub max_running: Option<u64>,
    /// A line `#SBATCH ARG` for every job (e.g. --sbatch-arg=--partition=io --sbatch-arg=--time=2:00:00).
    #[arg(long = "sbatch-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub sbatch_args: Vec<String>,
    /// Submit the script (with sbatch) instead of printing it.
    #[arg(long)]
    pub submit: bool,
}

#[derive(Args, Debug)]
pub struct FinishArgs {
    /// The output directory every part wrote into.
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// Print what was found and written as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The mounted view, or an output directory of `rechunk` (a job, whole or in parts).
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
    /// Which values of a MINC2 image to write: stored (its stored integers, moved as they are)
    /// or scaled (its physical values, as nibabel's get_fdata computes them from image-min,
    /// image-max and valid_range, written as float32). Default: stored, where the output keeps
    /// the image's scaling (none to keep, or one scaling in NIfTI's scl_slope/scl_inter);
    /// otherwise (per-slice scaling in NIfTI, any scaling in HDF5, npy, raw or Zarr) the run
    /// asks for one.
    #[arg(long, value_name = "stored|scaled")]
    pub values: Option<String>,
}

impl InputArgs {
    /// `--values`, if given.
    pub fn values(&self) -> anyhow::Result<Option<crate::input::Values>> {
        Ok(self.values.as_deref().map(str::parse).transpose()?)
    }
}

/// A multiscale pyramid below the rechunked array (docs/pyramids.md).
#[derive(Args, Debug, Clone, Default)]
pub struct PyramidArgs {
    /// Make a multiscale pyramid of N levels in all (level 0, the full resolution, included), or
    /// auto: until a level fits in one block. Each level is the one before downsampled by
    /// --factors. With zarr or zarr3, OUT is an OME-Zarr image (levels in 0/, 1/, ...); with
    /// block files, level k is in k/; with precomputed, one scale per level.
    #[arg(long, value_name = "N|auto")]
    pub levels: Option<String>,
    /// Downsampling factors per spatial axis (the last three in C order; NIfTI's x, y, z) in the
    /// input's axis order, e.g. 2,2,1 (default: 2 along each). Other axes are kept whole.
    #[arg(long, value_name = "F,F,F")]
    pub factors: Option<String>,
    /// How a cell of voxels becomes one, as TensorStore's downsample: mean (intensities;
    /// integers round to nearest, ties to even), mode (labels: the most frequent, the smallest
    /// of ties) or nearest (the cell's first voxel). A cell cut short by the array's edge uses
    /// the voxels it has.
    #[arg(long, default_value = "mean", value_name = "RULE")]
    pub downsample: String,
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
    /// Compress each block: zstd[:LEVEL] (1-22, default 3; each frame checksummed, so damage is
    /// caught on read; zstd:LEVEL:nochecksum leaves that out), gzip[:LEVEL] (1-9, default 5) or
    /// blosc[:CNAME[:LEVEL]] (lz4, lz4hc, blosclz, zstd or zlib; 0-9; default lz4:5) for
    /// --format zarr or zarr3; gzip[:LEVEL] for h5 (each block one deflated HDF5 chunk).
    /// Not for views, whose sizes must be exact before the data exist.
    #[arg(long, value_name = "CODEC")]
    pub compress: Option<String>,
    /// With --format zarr3: write shards of this shape, each a whole number of chunks of
    /// --shape on every side, indexed as zarr-python indexes them (views: uncompressed only).
    #[arg(long, value_name = "SHAPE")]
    pub shard: Option<String>,
    /// Threads for the work on blocks: opening, reading and decoding input blocks, copying
    /// them into place, encoding and writing output blocks, downsampling pyramid levels; and
    /// for stat'ing every input file before the first read. Default: the
    /// CPUs this process may use, from its affinity mask and its cgroup's CPU quota, so
    /// taskset and SLURM's --cpus-per-task are honoured. The seeks counted do not depend on
    /// it (the calls are counted in the plan's order); each worker decoding or encoding holds
    /// a block, which the plan counts (fewer are used when they do not fit --mem).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
}

impl PlanningArgs {
    /// Sets the process's worker threads from `--threads`.
    pub(super) fn set_threads(&self) {
        crate::engine::workers::set_threads(self.threads.map(usize::from));
    }
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
    #[command(flatten)]
    pub pyramid: PyramidArgs,
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
    #[arg(long, value_name = "FORMAT", help = FORMAT_HELP)]
    pub format: Option<String>,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
    /// Cut the job into N parts (boxes of whole output blocks, each run by `rechunk --part K/N`)
    /// and show each part's blocks, bytes read, seeks and peak memory, and the overhead against
    /// one machine. See docs/cluster.md.
    #[arg(long, value_name = "N")]
    pub parts: Option<u64>,
}

#[derive(Args, Debug)]
#[command(
    after_help = concat!("NIfTI blocks (--format nii, or nii2 for NIfTI-2, which \
blocks with a side over 32,767 get anyway) carry the input's voxel sizes and an \
affine placing each block in the whole image (identity for HDF5 and npy input); raw blocks \
(--format raw) are data only, and OUT/rechunkfs.json describes them (shape, dtype, axis \
order).\n\nInput headers: two HDF5 or npy blocks of each kind (interior, or last along some \
dimensions) are read before the run; every other block's header is checked when the run first \
reads the file. A bad block stops the run with the file and the problem named. `rechunkfs plan` reads every header \
first.\n\nStopping and resuming: each block is written under a hidden .NAME.<part>-<host>-<pid>.partial \
name and renamed when complete and on disk, so a file with a block's name is always a whole, \
correct block. OUT/.rechunkfs-job.json records the job (input, shapes, format, parts, each input \
file's size and mtime). A run that fails (a bad block, a full disk), is stopped by Ctrl-C \
(SIGINT), SIGTERM or SIGHUP (between steps), or is killed outright keeps every block it \
finished; a stopped run removes its temporaries. The same command run again keeps those blocks \
(it does not write them again), removes a killed run's temporaries and writes the rest; it is \
refused if an input file changed since, or if OUT holds another job. --overwrite starts over. \
The whole job ends by writing the array's metadata (Zarr, rechunkfs.json) and removing the \
record; a job in parts (--part K/N) ends with `rechunkfs finish OUT`.\n\n", axis_order_help!())
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
    #[command(flatten)]
    pub pyramid: PyramidArgs,
    #[arg(long, value_name = "FORMAT", help = FORMAT_HELP)]
    pub format: Option<String>,
    #[command(flatten)]
    pub input_args: InputArgs,
    /// Replace block files (and rechunkfs.json) already in OUT; other files there are left alone.
    #[arg(long)]
    pub overwrite: bool,
    /// Run part K of N (0 <= K < N) of the job `plan --parts N` shows: every part is given the
    /// same arguments; `rechunkfs finish OUT` ends the job once all are done. See docs/cluster.md.
    #[arg(long, value_name = "K/N")]
    pub part: Option<String>,
    /// Print the final report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Files are answered to GET and HEAD, with one byte range (start-end, start- \
or -suffix; a request for several ranges gets the whole file), exact Content-Length, and CORS \
headers; OPTIONS answers CORS preflights. Everything else is refused: other methods (405), paths \
with . or .. (plain or %-encoded) or an encoded slash, symbolic links leading out of the \
directory and absolute ones (403), directories (404), several Host headers (400). On loopback, \
only requests naming localhost are answered (a defence against DNS rebinding). Serving a mounted \
view through its directory, a request for a pending block waits for it like any read; `mount \
--serve` serves straight from the view. At most 512 connections and 384 requests waiting for \
data at once (more are answered 503); a connection is closed after 30 s sending headers or idle.\n\n\
Examples:\n  rechunkfs serve out/                       (http://127.0.0.1:8000/)\n  \
rechunkfs serve view/ --bind 127.0.0.1:0   (any free port; the URL is printed)\n  \
rechunkfs serve out/ --bind 0.0.0.0:8000 --cors-origin https://neuroglancer-demo.appspot.com"
)]
pub struct ServeArgs {
    /// A mounted view, or a directory of output blocks (a Zarr array, a precomputed volume...).
    #[arg(value_name = "VIEW|DIR")]
    pub path: PathBuf,
    /// Where to listen: HOST:PORT, or PORT on 127.0.0.1; 0 picks a free port. Anything but
    /// loopback opens the files to the network.
    #[arg(long, default_value = crate::http::DEFAULT_BIND, value_name = "[HOST:]PORT")]
    pub bind: String,
    /// Which web pages may read it (CORS): an origin, '*', or none (default: '*' on loopback,
    /// none elsewhere).
    #[arg(long, value_name = "ORIGIN")]
    pub cors_origin: Option<String>,
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

/// What to tell the user when the blocks are written in `used` where
/// `asked` was asked for: NIfTI-2, for blocks NIfTI-1 cannot hold.
pub(super) fn format_note(asked: BlockFormat, used: BlockFormat) -> Option<String> {
    (asked != used).then(|| {
        format!(
            "writing {} blocks, not {}: a block side is longer than the 32,767 voxels \
             NIfTI-1 can hold",
            used.name(),
            asked.name()
        )
    })
}

/// `--mem` in bytes, if given.
pub(super) fn mem_of(planning: &PlanningArgs) -> anyhow::Result<Option<u64>> {
    planning
        .mem
        .as_deref()
        .map(parse_bytes)
        .transpose()
        .context("--mem")
}
