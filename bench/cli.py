"""The command line: the options of a run, their checks and defaults, the
render-only mode, and the run's clean-up (views unmounted, the tmpfs
unmounted, cgroups removed) however it ends."""
import argparse
import json
import os
import signal
import sys
from pathlib import Path

from .common import MIB, PUBLISH_DIR, ROOT, die, parse_size, show_bytes
from .report import published_suffix, saved_workloads, write_results
from .session import Session
from .system import MemoryCgroups
from .tools import OPTIONAL, Interrupted, cores_arg, parse_peers
from .view import umount
from .workloads import choose

HELP = """Benchmark rechunkfs against its peers and against the disk's own limit.

For each workload the same array is prepared once in the form each tool
reads (cached in the work directory), then every tool rechunks it with the
page cache dropped before each run, with no memory cap and inside a memory
cgroup smaller than the array, every tool with the same memory budget;
every run's output is checked voxel by voxel against the source, outside
its timed part; the tables (wall time, peak RSS, seeks where known, what
each tool does for durability, ratios against rechunkfs keep, keep against
the physical limit, and the targets of issue 5) are printed and written
with a chart.

Tools (--peers selects among all but the first two; default all):
  keep         rechunkfs rechunk --strategy keep (HDF5 blocks in, HDF5 blocks out)
  baseline     rechunkfs rechunk --strategy baseline
  view         `rechunkfs mount IN VIEW --staging WORKDIR/staging && rechunkfs
               status --wait --json VIEW`, one shell command, timed until the
               wait returns "complete";
               peak RSS = the daemon's VmHWM; then, once per workload and cap,
               view read throughput: every view block file read cold, against
               the same files read cold in the staging directory (after one
               unmeasured round of the staging files while the disk settles,
               in the order view, staging, staging, view, repeated until each
               side has read for 2 s, at most 20 times; throughput over all
               rounds), by two readers in turn: plain 8 MiB reads, as most
               tools read, and the same advised posix_fadvise SEQUENTIAL, as
               cp reads (advice that passthrough does not pass on)
  limit        the physical limit (bench/peers/limit.py, one Python process):
               8 reader threads read every input file, overlapped with 4
               writer threads writing files the sizes of the output's, then
               syncfs; write-back started per file, a syncfs every 256 MiB,
               and pages dropped as rechunkfs drops them (inputs once read,
               outputs once synced, when the page cache cannot hold the
               array: 4 x the array > the smaller of the cgroup's limit and
               MemAvailable); its buffers stay within MEM
  tensorstore  TensorStore: Zarr v2 -> Zarr v2 with the new chunks, dst.write(src)
               (bench/peers/ts_copy.py; cache_pool = MEM)
  rechunker-python, rechunker-dask (or: rechunker)
               rechunker.rechunk(zarr array, target_chunks, max_mem=MEM, ...)
               .execute() with its python or dask executor (rechunker_run.py)
  zarrs        zarrs_reencode --chunk-shape S --shard-shape S --cache-size MEM IN.zarr OUT.zarr
               (crate zarrs_tools, cargo-installed into WORKDIR/cargo-tools on first use;
               it ignores --chunk-shape unless it writes shards, so each output block is
               one shard holding one plain chunk: the same bytes plus a 20-byte index)
  h5repack     H5TOOLS_BUFSIZE=MEM h5repack -l data:CHUNK=AxBxC IN.h5 OUT.h5
               (data:CONTI for a merge), on one chunked HDF5 file holding the
               array with the input blocks as chunks (Debian hdf5-tools).
               H5TOOLS_BUFSIZE (MiB, rounded up) sizes the hyperslab it copies
               at a time; its default is 32 MiB
  h5repack-whole
               the same with H5TOOLS_BUFSIZE = the whole array: one read of all
               of it, then one write (issue 5's reference, "h5repack with a
               718 MB buffer"); it holds the array, so no MEM applies
MEM, the same for every tool in a workload and cap: in capped runs --mem =
cap minus --headroom; uncapped, --budget, or by default what rechunkfs
keep's plan holds without --mem (at least one input or output block), given
to rechunkfs as --mem too. A peer OOM-killed under the cap runs again with
half (--oom-retries), said in the notes.
Peers' Python packages go into a venv of the harness's own (WORKDIR/venv,
made on first use). A tool that cannot be installed or cannot read its
input is shown as such in the table; the others still run.

Inputs: rechunkfs's HDF5 blocks (`rechunkfs sample`); the peers' Zarr v2
array (uncompressed, chunks = input blocks) and chunked HDF5 file, written
by bench/peers/prepare.py from the same splitmix64 content.
Every run's output is checked, after its clock stopped, with
tests/fixtures/verify.py (rechunkfs, the view) and bench/peers/verify_peer.py
(peers); the limit's by its counts of files and bytes (--no-verify skips
the checks); a wrong output is shown as WRONG and makes the exit status 1.

Wall time, for every tool alike, runs from a warm start to its exit, plus a
syncfs of the output's filesystem after it exits, so that every output is
on disk when its clock stops. Warm: a Python tool (the limit, TensorStore,
rechunker) starts its interpreter and imports first, then the page cache is
dropped and its clock starts as the harness tells it to go; a compiled tool
(rechunkfs, zarrs_reencode, h5repack) starts after the drop, timed from
exec. What a tool does itself for durability is stated beside its time:
rechunkfs and the limit syncfs per 256 MiB, TensorStore fsyncs every file,
zarr-python, zarrs and h5repack do nothing of their own.

Workloads (--workload, comma-separated, or "all"; default W1):
  W1     700^3 uint16 in 35^3 blocks -> 50^3 blocks: the keep paper's
         configuration 4 (3500^3 in 175^3 -> 250^3) with every length / 5.
  W1-tmpfs
         W1 on a tmpfs (mount -t tmpfs -o size=3g, mounted by the harness
         under WORKDIR/tmpfs for its rounds and unmounted after): input,
         outputs and the view's staging; uncapped only (tmpfs pages count
         against a memory cgroup); rechunkfs and the limit only.
  W1-zstd
         W1 compressed: a zstd (level 3) Zarr v3 array written by TensorStore,
         35^3 chunks, into 50^3 zstd Zarr v3 chunks; every tool reads the same
         array (rechunkfs with --format zarr3 --compress zstd:3); keep,
         TensorStore and zarrs_reencode only (only when named or with "all").
  W1-image
         W1-zstd's geometry and codecs with image-like content: smooth
         structure plus noise (bench/peers/content.py), which zstd:3 stores in
         about 0.6 of its raw bytes, as it does real scans; a 700^3 uint16
         zstd Zarr v3 array in 35^3 chunks written by TensorStore, into 50^3
         zstd:3 Zarr v3 chunks; keep, TensorStore and zarrs_reencode only (only
         when named or with "all").
  W1-levels
         W1 into 50^3 Zarr v2 chunks, level 0 alone (keep: rechunk --format
         zarr) against the pyramid (rechunk --format zarr --levels auto, 5
         levels), side by side; rechunkfs only (only when named or with "all").
  W2     1750^3 uint16 in 175^3 blocks -> 250^3 blocks (10.7 GB; only when
         named or with "all"; skipped with a message if the disk cannot hold
         its inputs, the peers' copies and the largest output).
  split  one 350^3 HDF5 file -> 50^3 blocks.
  merge  a 350^3 array in 35^3 blocks -> one file (--shape = the array).
--quick shrinks them for a smoke run: W1, W1-tmpfs, W1-zstd, W1-image, W1-levels 350^3 in 35^3 -> 50^3, W2 350^3 in
70^3 -> 100^3, split one 250^3 file -> 50^3, merge 350^3 in 35^3 -> one file.

Memory cap: a child of this process's memory cgroup per capped run, limit
--cap (default 256 MiB; 64 MiB with --quick), page cache included; cgroup
v1 and v2. Before every run: the previous output is removed, then `sync`
and `echo 3 > /proc/sys/vm/drop_caches` (root only; said once if it fails).
A run slower than --timeout seconds (default 1800; 120 with --quick) is killed
and shown as "> timeout".
With --repeat N (default 2) every configuration runs N times, a run
shorter than 5 s makes it 3 times at least, one shorter than 1 s 5 times
and one shorter than 0.5 s 15 times; the table shows the median wall time with its range. The runs of a
workload and cap go in rounds: every tool once, then every tool again,
each round in its own order (seeded, so a rerun repeats it), so the
machine's drift over minutes and what one run leaves to the next fall on
all tools alike.

Cores (--cores 1,all): every tool runs once per core set, pinned with
taskset -c to the first N cores this process may use (1: taskset -c 0; all:
taskset -c 0-(n-1)), the core sets side by side in the same rounds. Each
run's CPU time (user + system, from wait4's rusage; a Python tool's from
its go, a view's from its daemon) is reported per GiB of the array, and for
each tool run on 1 and on n cores the parallel fraction measured with
Amdahl's law, p = (1 - Tn/T1) / (1 - 1/n), and the speed-ups it projects
for 16 and 64 cores, 1 / ((1 - p) + p/N). Without --cores nothing is pinned.

Results: printed, and written to WORKDIR/results.md with WORKDIR/chart.svg
(with --publish: docs/bench/results.md and docs/bench/chart.svg in the
repository, replacing the ones there; a run without W1 publishes under its
workloads' names, e.g. results-W2.md and chart-W2.svg); raw numbers and the exact commands to WORKDIR/results.json;
each tool's stdout/stderr under WORKDIR/logs/.

Examples:
  bench/run --quick                           # every tool on small data
  bench/run --quick --no-peers --repeat 1     # keep vs baseline only, fast
  bench/run --workload all --publish          # everything, for the README
  bench/run --workload W1 --peers limit,tensorstore,zarrs --cap 512M
  bench/run --workload W1-image --peers tensorstore,zarrs --cores 1,all --cap 0
  bench/run --workload W1-levels,W1-tmpfs --peers limit --cap 0   # pyramid vs level 0; tmpfs vs the limit

Blocks on demand are measured apart: bench/run on-demand --help.
"""


def parser():
    ap = argparse.ArgumentParser(prog="bench/run", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="W1",
                    help="W1, W1-tmpfs, W1-zstd, W1-image, W1-levels, W2, split, merge, a comma-separated list, or all"
                         " (default: W1)")
    ap.add_argument("--quick", action="store_true", help="smaller variants for a fast smoke run")
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out",
                    help="where data, outputs, the peers' venv and results go (default: bench-out/ in the repo)")
    ap.add_argument("--peers", default="all",
                    help=f"comma-separated: {', '.join(OPTIONAL)}, rechunker (both executors), all, none "
                         "(default: all); keep and baseline always run")
    ap.add_argument("--no-peers", action="store_true", help="only rechunkfs keep and baseline (= --peers none)")
    ap.add_argument("--cap", type=parse_size, default=None,
                    help="cgroup memory limit for the capped runs (default 256M; 64M with --quick); 0 = no capped runs")
    ap.add_argument("--headroom", type=parse_size, default=None,
                    help="capped runs pass --mem CAP-HEADROOM to every tool (default: min(64M, cap/2))")
    ap.add_argument("--budget", "--peer-mem", dest="budget", type=parse_size, default=None,
                    help="every tool's memory budget in uncapped runs: rechunkfs --mem, the peers' knobs, the"
                         " limit's buffers (default: what rechunkfs keep's plan holds without --mem, at least one"
                         " input or output block)")
    ap.add_argument("--oom-retries", type=int, default=1,
                    help="capped runs: a peer OOM-killed with the --mem budget runs again with half, this many "
                         "times (default 1; 0 = never)")
    ap.add_argument("--no-uncapped", action="store_true", help="skip the runs without a memory cap")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per run before it is killed and shown as '> timeout' (default 1800; 120 with "
                         "--quick, where a peer that thrashes under the small cap would otherwise hold the run up)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs per configuration, 5 at least when a run takes under 1 s, 15 under 0.5 s; the table shows the"
                         " median wall time (min–max) (default 2)")
    ap.add_argument("--cores", type=cores_arg, default=None, metavar="N,N|all",
                    help="run every tool on each of these core sets (taskset -c to the first N cores; all: every"
                         " core this process may use), side by side, e.g. 1,all; reports CPU s per GiB and keep's"
                         " parallel fraction (default: not pinned)")
    ap.add_argument("--no-verify", action="store_true", help="do not check outputs")
    ap.add_argument("--no-build", action="store_true",
                    help="use the existing release binary ($CARGO_TARGET_DIR/release/rechunkfs, else "
                         "target/release/rechunkfs)")
    ap.add_argument("--publish", action="store_true",
                    help="write the results and chart to docs/bench/ (results.md, chart.svg; a run without W1: "
                         "results-NAMES.md, chart-NAMES.svg) for the README, replacing the ones there")
    ap.add_argument("--keep-output", action="store_true", help="leave the last rechunkfs output in WORKDIR/out")
    ap.add_argument("--render", type=Path, metavar="RESULTS.json",
                    help="run nothing: write results.md and chart.svg again from a results.json of an earlier run "
                         "(into its directory, or docs/bench/ with --publish)")
    return ap


def render(a):
    """--render: the report of an earlier run again, from its results.json."""
    try:
        saved = json.loads(a.render.read_text())
    except (OSError, ValueError) as e:
        die(f"cannot read {a.render}: {e}")
    if a.publish:
        names = [w.name for w in saved_workloads(saved)]
        write_results(saved, PUBLISH_DIR, a.render, published_suffix(names))
    else:
        write_results(saved, a.render.resolve().parent, a.render)
    return 0


def memory_settings(a):
    """(cap, --mem under the cap) from --cap and --headroom and their defaults."""
    cap = a.cap if a.cap is not None else (64 * MIB if a.quick else 256 * MIB)
    headroom = a.headroom if a.headroom is not None else min(64 * MIB, cap // 2)
    if cap and headroom >= cap:
        die(f"--headroom ({show_bytes(headroom)}) must be smaller than --cap ({show_bytes(cap)})")
    return cap, (cap - headroom if cap else None)


def main(argv=None):
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"     # the peer helpers import tests/fixtures/verify.py: leave no __pycache__
    a = parser().parse_args(argv)
    if a.render:
        return render(a)
    if a.repeat < 1:
        die("--repeat must be at least 1")
    if a.timeout is None:
        a.timeout = 120.0 if a.quick else 1800.0
    wl = choose(a.workload, a.quick)
    optional = parse_peers(a.peers, a.no_peers)
    cap, mem = memory_settings(a)

    workdir = a.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)

    cgroups = MemoryCgroups()
    session = Session(a, wl, optional, cap, mem, workdir, cgroups, a.cores)

    def on_term(signum, frame):
        raise Interrupted(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    try:
        return session.run()
    except (KeyboardInterrupt, Interrupted):
        print("\nbench: interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        if session.ctx is not None:
            for view in list(session.ctx.mounted):
                umount(session.ctx, view)
        session.close_tmpfs()
        cgroups.remove_all()
