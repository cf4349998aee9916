"""A job in parts, run one part after another on this machine, against
one run of the whole job: what cutting a job costs beyond the extra reads
`plan --parts` predicts (issue 20's target: at most 1.1x the single run).

    bench/run parts [--workdir bench-out] [--workload W1,W2] [--parts 4] [--rounds 3] [--quick]

Each round runs the whole job (`rechunk IN OUT`), then the N parts
(`rechunk IN OUT --part K/N`, the page cache dropped before each, as each
part would start cold on its own node) and `finish`; the order alternates
between rounds. Prints per workload the medians, their ratio, and
`plan --parts`' predicted extra seeks and bytes. Uses the benchmark's
data (made with `rechunkfs sample` if missing).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .common import Binary, ROOT, shape_str
from .system import CacheDropper
from .workloads import choose, data_ready, generate, input_arg, out_block


def rechunkfs(*args):
    return subprocess.run([str(Binary.path), *args], check=True, capture_output=True, text=True)


def timed_single(source, out, shape, drop):
    shutil.rmtree(out, ignore_errors=True)
    drop()
    start = time.monotonic()
    rechunkfs("rechunk", source, out, "--shape", shape, "-q")
    return time.monotonic() - start


def timed_parts(source, out, shape, parts, drop):
    """The parts one after another, each from a cold page cache (the drops
    are not timed), then finish."""
    shutil.rmtree(out, ignore_errors=True)
    seconds = 0.0
    for k in range(parts):
        drop()
        start = time.monotonic()
        rechunkfs("rechunk", source, out, "--shape", shape, "-q", "--part", f"{k}/{parts}")
        seconds += time.monotonic() - start
    start = time.monotonic()
    rechunkfs("finish", out)
    return seconds + time.monotonic() - start


def measure(w, workdir, parts, rounds, drop):
    source, shape = str(input_arg(workdir, w)), shape_str(out_block(w))
    out = str(workdir / "parts-out")
    predicted = json.loads(rechunkfs("plan", source, "--shape", shape, "--parts", str(parts),
                                     "--json").stdout)["parts"]
    singles, cut = [], []
    for r in range(rounds):
        if r % 2 == 0:
            singles.append(timed_single(source, out, shape, drop))
            cut.append(timed_parts(source, out, shape, parts, drop))
        else:
            cut.append(timed_parts(source, out, shape, parts, drop))
            singles.append(timed_single(source, out, shape, drop))
        print(f"{w.name} round {r + 1}/{rounds}: single {singles[-1]:.2f} s, {parts} parts "
              f"{cut[-1]:.2f} s", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    single, total = statistics.median(singles), statistics.median(cut)
    return (f"| {w.label()} | {parts} | {single:.2f} s | {total:.2f} s | {total / single:.2f}x | "
            f"{predicted['extra_seeks']:+,} | {predicted['extra_bytes_read']:+,} | {predicted['balance']:.2f} |")


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/run parts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=os.path.join(ROOT, "bench-out"))
    p.add_argument("--workload", default="W1,W2", help="comma-separated (default W1,W2)")
    p.add_argument("--parts", type=int, default=4, help="parts per job (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="single and parted runs, in turn (default 3)")
    p.add_argument("--quick", action="store_true", help="the workloads' quick variants")
    p.add_argument("--warm", action="store_true",
                   help="leave the page cache alone (a smoke run of the harness, not a measurement)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.parts < 1:
        p.error("--rounds and --parts must be at least 1")
    if "RECHUNKFS_BIN" in os.environ:
        Binary.path = os.environ["RECHUNKFS_BIN"]
    else:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    workdir = Path(a.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    drop = (lambda: None) if a.warm else CacheDropper().drop
    rows = []
    for w in choose(a.workload, a.quick):
        if not data_ready(workdir, w):
            generate(workdir, w)
        rows.append(measure(w, workdir, a.parts, a.rounds, drop))
    print(f"| workload | parts | single run | parts in turn + finish | ratio (target <= 1.1x + extra reads) | "
          f"extra seeks (plan) | extra bytes (plan) | balance |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row)
