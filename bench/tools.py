"""The tools under test and how each one runs and is timed: building and
staging rechunkfs, `rechunkfs rechunk` (keep, baseline, keep with a
pyramid), the peers and the physical limit as processes in an optional
memory cgroup and on an optional set of cores, each from a dropped page
cache, with their CPU time, and checking an output voxel by voxel."""
import json
import os
import resource
import shutil
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .common import (BUILT, FORMAT, MIB, NUMPY_DTYPE, PEERS_DIR, PYTHON, ROOT, VERIFY, Binary, die, last_lines,
                     parse_json, say, shape_str, write_text)
from .system import timed_sync
from .workloads import file_overhead, input_files, out_block, storage_dir

# The tools a compressed workload (W1-zstd) runs, and why the others do not.
COMPRESSED_TOOLS = ("keep", "tensorstore", "zarrs")
NOT_COMPRESSED = {
    "baseline": "writes an output block in pieces; a compressed block is encoded whole",
    "view": "a view's sizes must be exact before its data exist; a compressed block's are not",
    "limit": "writes files the sizes of the output's, which a compressed output has only once written",
    "rechunker-python": "not set up for compressed Zarr v3",
    "rechunker-dask": "not set up for compressed Zarr v3",
    "h5repack": "reads HDF5, not Zarr",
    "h5repack-whole": "reads HDF5, not Zarr",
}

# Every tool, in table order: key -> (label, kind).
TOOLS = {
    "keep": ("rechunkfs keep", "rechunkfs"),
    "levels": ("rechunkfs keep, --levels auto", "rechunkfs"),
    "baseline": ("rechunkfs baseline", "rechunkfs"),
    "view": ("rechunkfs view (mount)", "rechunkfs"),
    "limit": ("physical limit", "limit"),
    "tensorstore": ("TensorStore", "peer"),
    "rechunker-python": ("rechunker (python)", "peer"),
    "rechunker-dask": ("rechunker (dask)", "peer"),
    "zarrs": ("zarrs_reencode", "peer"),
    "h5repack": ("h5repack", "peer"),
    "h5repack-whole": ("h5repack (whole-array buffer)", "peer"),
}
OPTIONAL = [k for k in TOOLS if k not in ("keep", "baseline", "levels")]
# The tools of a pyramid workload (W1-levels): level 0 alone against the pyramid.
LEVELS_TOOLS = ("keep", "levels")
ALIASES = {"rechunker": ["rechunker-python", "rechunker-dask"], "physical": ["limit"], "ts": ["tensorstore"],
           "zarrs_reencode": ["zarrs"], "zarrs_tools": ["zarrs"], "mount": ["view"]}
ZARR_TOOLS = ("tensorstore", "rechunker-python", "rechunker-dask", "zarrs")
H5REPACK_TOOLS = ("h5repack", "h5repack-whole")
MEM_KNOB = ZARR_TOOLS + ("h5repack",)    # peers with a memory budget to lower after an OOM
# The Python helpers, started warm (see start); the others are compiled and start cold from exec.
WARM = ("limit", "tensorstore", "rechunker-python", "rechunker-dask")

# What each tool does itself to make its output durable, stated beside its
# time: the harness adds one syncfs after every tool exits (in the time),
# but an fsync per file, as TensorStore's file store makes by default,
# costs more than rechunkfs's batched syncfs.
DURABILITY = {
    "keep": "syncfs per 256 MiB",
    "levels": "syncfs per 256 MiB",
    "baseline": "syncfs per 256 MiB",
    "view": "syncfs per batch + journal",
    "limit": "syncfs per 256 MiB",
    "tensorstore": "fsync per file",
    "rechunker-python": "none of its own",
    "rechunker-dask": "none of its own",
    "zarrs": "none of its own",
    "h5repack": "none of its own",
    "h5repack-whole": "none of its own",
}

# A tool whose run takes under this many seconds runs at least this many
# times. Runs under half a second (merge and split here) swing between two
# modes on this kind of VM: the same command takes 0.15 s or 0.3 s, and
# perf stat shows its CPU time double with it (139 against 339 ms of
# task-clock for one merge), so the slow mode is the machine's, not the
# tool's. With nine runs a tool's median still moved with how many of its
# runs fell into it; fifteen hold it better, at a few seconds a tool.
REPEATS_FOR_SHORT_RUNS = ((0.5, 15), (1.0, 5), (5.0, 3))


def label(tool):
    return TOOLS[tool][0]


def parse_peers(text, none):
    if none:
        return []
    chosen = []
    for item in [x.strip().lower() for x in text.split(",") if x.strip()]:
        if item == "all":
            chosen += OPTIONAL
        elif item == "none":
            continue
        elif item in ALIASES:
            chosen += ALIASES[item]
        elif item in OPTIONAL:
            chosen.append(item)
        else:
            die(f"unknown peer '{item}'; choose from {', '.join(OPTIONAL)}, rechunker, all or none")
    return [t for t in OPTIONAL if t in chosen]


# --------------------------------------------------------------------------
# rechunkfs itself, and checking outputs


def build(no_build):
    if no_build:
        if not BUILT.exists():
            die(f"--no-build given but {BUILT} does not exist")
        return
    say("building rechunkfs (cargo build --release --quiet)...")
    env = dict(os.environ)
    # The bundled libhdf5 needs CMake >= 3.26: scripts/setup puts one here.
    venv_cmake = ROOT / "target" / "pyenv" / "bin" / "cmake"
    if "CMAKE" not in env and venv_cmake.exists():
        env["CMAKE"] = str(venv_cmake)
    try:
        r = subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, env=env)
    except FileNotFoundError:
        die(f"cargo is not on PATH; install Rust, or pass --no-build to use an existing {BUILT}")
    if r.returncode != 0:
        die("cargo build --release failed (see above); fix the build or pass --no-build")
    if not BUILT.exists():
        die(f"cargo build succeeded but {BUILT} is missing")


def stage_binary(workdir):
    """Run from a private copy, so a rebuild by someone else mid-run cannot mix binaries."""
    d = workdir / "bin"
    d.mkdir(exist_ok=True)
    tmp = d / "rechunkfs.partial"
    shutil.copy2(BUILT, tmp)
    os.replace(tmp, d / "rechunkfs")
    Binary.path = d / "rechunkfs"


def ensure_python():
    if PYTHON.exists():
        r = subprocess.run([str(PYTHON), "-c", "import numpy, h5py"], capture_output=True)
        if r.returncode == 0:
            return
    say("verification needs numpy and h5py in target/pyenv: running scripts/setup...")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup")], cwd=ROOT)
    if r.returncode != 0 or not PYTHON.exists():
        die("scripts/setup failed, so outputs cannot be verified; fix it or pass --no-verify")


def verify(out, w):
    cmd = [str(PYTHON), str(VERIFY), str(out), "--array", shape_str(w.array), "--block", shape_str(out_block(w)),
           "--dtype", NUMPY_DTYPE, "--format", FORMAT]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr).strip(), time.monotonic() - t0


def output_args(w, tool="keep"):
    """rechunkfs's output options for w: a compressed workload writes Zarr v3
    compressed as its input is; a pyramid workload writes Zarr v2, level 0
    alone (keep) or with every level (levels)."""
    if w.codec:
        return ["--format", "zarr3", "--compress", w.codec]
    if w.levels:
        return ["--format", "zarr"] + (["--levels", "auto"] if tool == "levels" else [])
    return []


def strategy_of(tool):
    return "baseline" if tool == "baseline" else "keep"


def plan(inp, w, tool, mem):
    cmd = [str(Binary.path), "plan", str(inp), "--shape", shape_str(w.shape), "--strategy", strategy_of(tool),
           "--json", *output_args(w, tool)]
    if mem is not None:
        cmd += ["--mem", str(mem)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    try:
        return json.loads(r.stdout), None
    except ValueError:
        return None, "plan printed no JSON"


# --------------------------------------------------------------------------
# Running


class Interrupted(Exception):
    pass


class Context:
    """What every run needs: the work directory, cgroups, the cache dropper, options."""

    def __init__(self, workdir, cgroups, dropper, timeout, peers):
        self.workdir = workdir
        self.cgroups = cgroups
        self.dropper = dropper
        self.timeout = timeout
        self.peers = peers
        self.mounted = set()      # views to unmount on the way out
        self.cores = None         # (count, CPU list for taskset -c) the runs are pinned to, or None

    def pin(self, cmd):
        """cmd on the cores of the runs (taskset -c LIST), or as it is when they are not pinned."""
        return ["taskset", "-c", self.cores[1], *cmd] if self.cores else cmd


def cores_arg(text):
    """--cores: a list of core counts (1, 2, ..., or all), each a set of the
    first cores this process may use; [(count, taskset CPU list)], once each."""
    mine = sorted(os.sched_getaffinity(0))
    out = []
    for item in [x.strip().lower() for x in text.split(",") if x.strip()]:
        if item == "all":
            n = len(mine)
        else:
            try:
                n = int(item)
            except ValueError:
                die(f"--cores: '{item}' is neither a number of cores nor all")
            if not 1 <= n <= len(mine):
                die(f"--cores: {n} cores asked for, this process may use {len(mine)} ({cpu_list(mine)})")
        if n not in [c for c, _ in out]:
            out.append((n, cpu_list(mine[:n])))
    if not out:
        die("--cores: no core count given (e.g. --cores 1,all)")
    return out


def cpu_list(cpus):
    """[0, 1, 2, 5] -> '0-2,5', as taskset -c takes it."""
    runs = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def children_cpu():
    """User plus system CPU seconds of this process's waited-for children so far."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def process_cpu(pid):
    """User plus system CPU seconds a live process has used so far (all its threads), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def new_record(w, tool, cap, mem, cores=None):
    rec = {"workload": w.name, "tool": tool, "cap_bytes": cap, "mem_bytes": mem, "status": None,
           "wall_seconds": None, "peak_rss_bytes": None, "verified": None}
    if cores:
        rec["cores"], rec["cpu_list"] = cores
    return rec


def oom_or_error(rec, group, returncode):
    """A failed run's status: killed inside a cgroup, or by it, is an OOM."""
    oom = rec.get("cgroup_oom_kills")
    return "oom" if (oom or (group is not None and returncode == -signal.SIGKILL)) else "error"


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_one(inp, out, w, tool, cap, mem, ctx):
    """One timed `rechunkfs rechunk` run of keep, baseline or levels; returns a record dict."""
    rec = new_record(w, tool, cap, mem, ctx.cores)
    note_plan(rec, inp, w, tool, mem)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(Binary.path), "rechunk", str(inp), str(out), "--shape", shape_str(w.shape), "--strategy",
           strategy_of(tool), "--json", "--quiet", *output_args(w, tool)]
    if mem is not None:
        cmd += ["--mem", str(mem)]
    cmd = ctx.pin(cmd)
    rec["command"] = " ".join(cmd)
    group = None
    proc = None
    try:
        if cap is not None:
            group = ctx.cgroups.create(cap)
            cmd = ctx.cgroups.wrap(group, cmd)
            rec["cgroup"] = str(group)
        rec["cache_dropped"] = ctx.dropper.drop()
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        # Until it is reaped the harness waits for no other child, so the
        # children's CPU time grows by this run's alone (taken after Popen,
        # which may reap an earlier child itself).
        cpu0 = children_cpu()
        try:
            stdout, stderr = proc.communicate(timeout=ctx.timeout)
            wall = time.monotonic() - t0
            rec["cpu_seconds"] = children_cpu() - cpu0
        except subprocess.TimeoutExpired:
            wall = time.monotonic() - t0
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            rec.update(status="timeout", wall_seconds=wall)
            return rec
        rec["returncode"] = proc.returncode
        if group is not None:
            rec["cgroup_peak_bytes"], rec["cgroup_oom_kills"] = ctx.cgroups.stats(group)
        if proc.returncode != 0:
            rec["wall_seconds"] = wall
            rec["status"] = oom_or_error(rec, group, proc.returncode)
            rec["stderr"] = stderr.strip()[-2000:]
            return rec
        rec["sync_seconds"] = timed_sync(out)
        rec["wall_seconds"] = wall + rec["sync_seconds"]
        take_report(rec, stdout, stderr)
        return rec
    finally:
        if proc is not None and proc.poll() is None:
            kill_group(proc)
            proc.wait()
        if group is not None:
            ctx.cgroups.remove(group)


def note_plan(rec, inp, w, tool, mem):
    """What rechunkfs's plan predicts for the run, or why it could not say."""
    p, err = plan(inp, w, tool, mem)
    if p:
        rec["planned_seeks"] = p.get("seeks", {}).get("planned")
        rec["planned_peak_memory_bytes"] = p.get("peak_memory_bytes")
        rec["read_shape"] = p.get("read_shape")
    else:
        rec["plan_error"] = err


def take_report(rec, stdout, stderr):
    """Fills a finished rechunk run's record from its --json report."""
    report = parse_json(stdout)
    if report is None:
        rec["status"] = "error"
        rec["stderr"] = ("no JSON on stdout: " + stdout.strip()[-500:] + "\n" + stderr.strip()[-1500:]).strip()
        return
    rec["status"] = "ok"
    rec["report"] = report
    rec["peak_rss_bytes"] = report.get("peak_rss_bytes")
    rec["peak_held_bytes"] = report.get("peak_memory_bytes")
    seeks = report.get("seeks", {})
    rec["seeks_made"], rec["seeks_planned"] = seeks.get("made"), seeks.get("planned", rec.get("planned_seeks"))


def run_process(rec, cmd, cap, ctx, log_stem, keep_group=False, warm=False):
    """Runs cmd from a dropped page cache (in a fresh memory cgroup when
    cap), stdout/stderr to log_stem.out/.err, warm or not (see start);
    fills rec: status, wall (process only), CPU time and peak RSS (wait4's
    rusage of the process and the children it waited for; CPU from the go
    for a warm one), cgroup peak and OOM kills. With keep_group the cgroup outlives the process (for a daemon
    it leaves behind): the caller removes it."""
    cmd = ctx.pin(cmd)
    rec["command"] = " ".join(str(c) for c in cmd)
    group = None
    proc = None
    out_log, err_log = Path(str(log_stem) + ".out"), Path(str(log_stem) + ".err")
    rec["logs"] = str(log_stem) + ".{out,err}"
    try:
        if cap is not None:
            group = ctx.cgroups.create(cap)
            cmd = ctx.cgroups.wrap(group, cmd)
            rec["cgroup"] = str(group)
        with open(out_log, "w") as fo, open(err_log, "w") as fe:
            proc, t0 = start(rec, cmd, fo, fe, ctx, warm)
            result = reap_within(proc, ctx.timeout)
            if result is None:
                proc.returncode = -signal.SIGKILL
                rec.update(status="timeout", wall_seconds=time.monotonic() - t0)
                return rec
        _, status, usage = result["wait"]
        proc.returncode = os.waitstatus_to_exitcode(status)
        rec["wall_seconds"] = result["t"] - t0
        rec["returncode"] = proc.returncode
        rec["peak_rss_bytes"] = usage.ru_maxrss * 1024
        rec["cpu_seconds"] = usage.ru_utime + usage.ru_stime - rec.pop("cpu_before_go", 0.0)
        if group is not None:
            rec["cgroup_peak_bytes"], rec["cgroup_oom_kills"] = ctx.cgroups.stats(group)
        if proc.returncode != 0 or rec.get("not_ready"):
            rec["status"] = "error" if rec.get("not_ready") else oom_or_error(rec, group, proc.returncode)
            rec["stderr"] = last_lines(err_log, 1) or last_lines(out_log, 1) or f"exit {proc.returncode}"
        else:
            rec["status"] = "ok"
            rec["stdout_json"] = parse_json(last_lines(out_log, 1)) if out_log.stat().st_size else None
        return rec
    finally:
        if proc is not None and proc.returncode is None:
            kill_group(proc)
            try:
                os.waitpid(proc.pid, 0)
            except ChildProcessError:
                pass
            proc.returncode = -signal.SIGKILL
        if group is not None and not keep_group:
            ctx.cgroups.remove(group)
            rec.pop("cgroup", None)


def start(rec, cmd, fo, fe, ctx, warm):
    """Starts cmd and its clock; (process, clock start).

    Cold, the page cache is dropped and the clock started before the
    process. Warm (the Python helpers: the limit, TensorStore, rechunker),
    the interpreter first starts and imports what it needs, says so on a
    pipe (peers/warm.py), and only then is the cache dropped and the clock
    started, as the harness tells it to go: no tool's time then holds an
    interpreter's cold start-up, which would make the limit no limit on
    fast storage. A helper that never gets ready is marked not_ready."""
    cmd = [str(c) for c in cmd]
    if not warm:
        rec["cache_dropped"] = ctx.dropper.drop()
        t0 = time.monotonic()
        return subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True), t0
    r, w = os.pipe()
    proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.PIPE, start_new_session=True,
                            pass_fds=(w,), env=dict(os.environ, BENCH_READY_FD=str(w)))
    os.close(w)
    try:
        readable, _, _ = select.select([r], [], [], ctx.timeout)
        ok = bool(readable) and os.read(r, 1) == b"r"
    finally:
        os.close(r)
    if not ok:
        rec["not_ready"] = True
        kill_group(proc)
        return proc, time.monotonic()
    # The interpreter's start-up and imports are no more in its CPU time than in its wall time.
    rec["cpu_before_go"] = process_cpu(proc.pid) or 0.0
    rec["cache_dropped"] = ctx.dropper.drop()
    t0 = time.monotonic()
    try:
        proc.stdin.write(b"g")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return proc, t0


def reap_within(proc, timeout):
    """Waits for proc with wait4 (for its rusage) and notes when it ended:
    {"wait": (pid, status, rusage), "t": monotonic time}; after timeout
    seconds kills its process group and returns None."""
    result = {}

    def reap():
        result["wait"] = os.wait4(proc.pid, 0)
        result["t"] = time.monotonic()
    waiter = threading.Thread(target=reap, daemon=True)
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        os.killpg(proc.pid, signal.SIGKILL)
        waiter.join()
        return None
    return result


def peer_command(tool, w, src, out, tmp, mem, peers):
    s = shape_str(out_block(w))
    vpy = str(peers.vpy)
    if tool == "tensorstore":
        codec = ["--zarr3-codec", w.codec] if w.codec else []
        return [vpy, PEERS_DIR / "ts_copy.py", src, out, "--chunks", s, "--mem", str(mem), *codec]
    if tool.startswith("rechunker-"):
        return [vpy, PEERS_DIR / "rechunker_run.py", src, out, tmp, "--chunks", s, "--mem", str(mem),
                "--executor", tool.split("-", 1)[1]]
    if tool == "zarrs":
        # zarrs_tools (0.6 to 0.8.1 at least) sets the chunk shape only when it writes shards: without
        # --shard-shape, --chunk-shape is silently ignored. One shard per output block holding one
        # plain chunk of that shape is the same file layout with a 20-byte index at its end.
        codecs = []
        if w.codec:
            # Inside each shard, as rechunkfs and TensorStore compress each chunk.
            name, _, level = w.codec.partition(":")
            codecs = ["--bytes-to-bytes-codecs",
                      json.dumps([{"name": name, "configuration": {"level": int(level or 3), "checksum": False}}])]
        return [peers.zarrs_bin, "--chunk-shape", s, "--shard-shape", s, "--cache-size", str(mem), *codecs, src, out]
    if tool in H5REPACK_TOOLS:
        whole = out_block(w) == w.array
        layout = "data:CONTI" if whole else "data:CHUNK=" + shape_str(out_block(w), "x")
        # Without H5TOOLS_BUFSIZE h5repack copies 32 MiB hyperslabs; given less
        # than the array it copies strips that cut across output chunks
        # (W1: ~20 s for any buffer from 32 to 192 MiB, ~1-3 s for the whole array).
        buffer = w.nbytes if tool == "h5repack-whole" else mem
        return ["env", f"H5TOOLS_BUFSIZE={max(1, -(-buffer // MIB))}", peers.h5repack, "-l", layout, src, out]
    raise ValueError(tool)


def run_peer(tool, w, cap, mem, ctx, tag):
    """One timed run of a peer (or of the physical limit); the output stays for verification."""
    rec = new_record(w, tool, cap, mem, ctx.cores)
    outdir = storage_dir(ctx.workdir, w) / "out-peer"
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir()
    log_stem = ctx.workdir / "logs" / f"{w.name}-{tool}-{tag}"
    if tool == "limit":
        out = outdir / "limit"
        cmd = limit_command(ctx, w, out, mem)
    else:
        if w.storage == "tmpfs":
            src, why = None, ("peers run on disk only: the tmpfs would not hold rechunkfs's input, the peers' two"
                              " copies of it and rechunker's output and intermediate at once")
        else:
            src, why = ctx.peers.input_of(w, tool)
        if src is None:
            rec.update(status="unavailable", reason=why)
            return rec, None
        out = outdir / ("out.h5" if tool in H5REPACK_TOOLS else "out.zarr")
        cmd = peer_command(tool, w, src, out, outdir / "tmp.zarr", mem, ctx.peers)
    run_process(rec, cmd, cap, ctx, log_stem, warm=tool in WARM)
    if rec["status"] == "ok":
        info = rec.pop("stdout_json", None)
        if info:
            rec["tool_report"] = info
        # Timed as every other tool: to its exit, plus the syncfs.
        rec["sync_seconds"] = timed_sync(outdir)
        rec["wall_seconds"] += rec["sync_seconds"]
    return rec, out


def limit_command(ctx, w, out, mem):
    """bench/peers/limit.py physical over w's input files, writing files
    the sizes of the output's (array bytes plus the input files' header),
    within mem."""
    listing = ctx.workdir / "logs" / f"{w.name}-input-files.txt"
    write_text(listing, "".join(f"{p}\n" for p in input_files(ctx.workdir, w)))
    sizes = ctx.workdir / "logs" / f"{w.name}-output-sizes.txt"
    header = file_overhead(ctx.workdir, w)
    write_text(sizes, "".join(f"{n + header} {k}\n" for n, k in w.output_sizes().items()))
    cmd = [sys.executable, PEERS_DIR / "limit.py", "physical", "--inputs", listing, "--out", out,
           "--sizes", sizes, "--array-bytes", str(w.nbytes)]
    return cmd + (["--mem", str(mem)] if mem is not None else [])


def check_limit(rec, w, workdir):
    """The limit's output, checked as far as it has one: every input file
    read whole, and as many files and bytes written as it was asked for."""
    t = rec.get("tool_report") or {}
    files = input_files(workdir, w)
    want_read = sum(p.stat().st_size for p in files)
    header = file_overhead(workdir, w)
    want_written = sum((n + header) * k for n, k in w.output_sizes().items())
    got = (t.get("files_read"), t.get("bytes_read"), t.get("files_written"), t.get("bytes_written"))
    want = (len(files), want_read, w.output_files, want_written)
    rec["verified"] = got == want
    rec["verify_text"] = (f"read {got[0]} files ({got[1]} bytes), wrote {got[2]} files ({got[3]} bytes)"
                          + ("" if got == want else f"; expected {want}"))
