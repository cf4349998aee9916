"""Blocks on demand, measured: a reader opens pending blocks of a filling
view in a random order, as a tiled viewer would.

Prints, from one run on the same data (page cache dropped before each mount):
- time to the first data byte of a random pending block, against the time
  the daemon spent extracting it directly (status: on_demand_seconds /
  on_demand_blocks); target: TTFB <= 2x extraction;
- total materialisation time with that reader running, against an
  undisturbed materialisation; target: <= 1.2x.

- a viewer's first screen: with `--levels auto` (OME-Zarr v2), the time to
  read one coarse tile right after the mount (level 2's first tile, then
  the coarsest), against h5py reading the same tile's region straight from
  the input blocks; target: about the same, however large the view.

    bench/run on-demand [--workdir bench-out] [--pause 0.05] [--rounds 5] [--quick]
                        [--first-screen-only]

Each round runs both, the undisturbed one first in odd rounds and second in
even ones; the table gives medians over the rounds, with their range.
Uses the W1 data of the benchmark (700^3 u16 in 35^3 blocks -> 50^3), made
with `rechunkfs sample` if missing.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "rechunkfs")
SHAPE = "50,50,50"


def run(*args, check=True):
    return subprocess.run([BIN, *args], check=check, capture_output=True, text=True)


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        print(f"note: cannot drop caches ({e}); timings include warm cache", file=sys.stderr)


def status(view):
    return json.loads(run("status", "--json", view).stdout)


def mount(data, view, staging, shape, extra=()):
    subprocess.run(["rm", "-rf", staging])
    os.makedirs(view, exist_ok=True)
    drop_caches()
    start = time.monotonic()
    run("mount", data, view, "--shape", shape, "--staging", staging, *extra)
    return start


def wait_complete(view, start):
    while status(view)["state"] != "complete":
        time.sleep(0.02)
    return time.monotonic() - start


class Setup:
    """Where a round's data, view and staging live, and the reader's pause."""

    def __init__(self, workdir, data, pause):
        self.data = data
        self.view = os.path.join(workdir, "od-view")
        self.staging = os.path.join(workdir, "od-staging")
        self.pause = pause


def undisturbed_run(s):
    start = mount(s.data, s.view, s.staging, SHAPE)
    seconds = wait_complete(s.view, start)
    run("umount", s.view)
    return seconds


def disturbed_run(s):
    """A materialisation with a reader opening pending blocks at random:
    (seconds, each read's time to first byte, the final status)."""
    start = mount(s.data, s.view, s.staging, SHAPE)
    names = sorted(n for n in os.listdir(s.view) if n.endswith(".h5"))
    random.Random(1).shuffle(names)
    ttfb = []
    for name in names:
        path = os.path.join(s.view, name)
        if os.getxattr(path, "user.rechunkfs.state") != b"pending":
            continue
        t = time.monotonic()
        with open(path, "rb", buffering=0) as f:
            f.seek(4096)
            f.read(1)
        ttfb.append(time.monotonic() - t)
        if status(s.view)["state"] == "complete":
            break
        time.sleep(s.pause)
    seconds = wait_complete(s.view, start)
    final = status(s.view)
    run("umount", s.view)
    return seconds, ttfb, final


def one_round(s, r, rounds):
    # Undisturbed and disturbed take turns going first: one run of each
    # swings by a third on this VM, so a ratio of single runs says little.
    if r % 2 == 0:
        undisturbed = undisturbed_run(s)
        disturbed, ttfb, final = disturbed_run(s)
    else:
        disturbed, ttfb, final = disturbed_run(s)
        undisturbed = undisturbed_run(s)
    blocks = max(final["on_demand_blocks"], 1)
    extraction = final["on_demand_seconds"] / blocks
    median_ttfb = statistics.median(ttfb) if ttfb else float("nan")
    print(f"round {r + 1}/{rounds}: undisturbed {undisturbed:.2f} s, random reader {disturbed:.2f} s "
          f"({disturbed / undisturbed:.2f}x); TTFB {median_ttfb * 1000:.1f} ms, extraction "
          f"{extraction * 1000:.1f} ms", file=sys.stderr)
    return {"read": len(ttfb), "extracted": final["on_demand_blocks"], "seeks": final["on_demand_seeks"],
            "ttfb": median_ttfb, "extraction": extraction, "undisturbed": undisturbed,
            "disturbed": disturbed}


def tile_region(level, factor, block):
    """Level 0's box under tile 0 of `level` (factor 2 per axis): its end
    along each axis (its origin is 0)."""
    return [block * factor ** level] * 3


READ_DIRECTLY = """
import os, sys, time
import h5py
data, end = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
start = time.monotonic()
got = 0
for i in range(-(-end[0] // 35)):
    for j in range(-(-end[1] // 35)):
        for k in range(-(-end[2] // 35)):
            with h5py.File(os.path.join(data, f"{i}_{j}_{k}.h5"), "r") as f:
                part = tuple(slice(0, min(35, e - 35 * n)) for e, n in zip(end, (i, j, k)))
                got += f["data"][part].nbytes
print(time.monotonic() - start, got)
"""


def read_inputs_directly(data, end, side):
    """Reads the box [0, end) of the input blocks (35^3 HDF5 files named by
    their grid index) with h5py (target/pyenv), as a program reading the
    inputs would; returns the seconds (timed inside that program, after
    its imports) and the bytes."""
    python = os.path.join(ROOT, "target", "pyenv", "bin", "python")
    end = ",".join(str(min(e, side)) for e in end)
    out = subprocess.run([python, "-c", READ_DIRECTLY, data, end], check=True, capture_output=True, text=True)
    seconds, got = out.stdout.split()
    return float(seconds), int(got)


def first_screen(s, side):
    """For level 2's first tile, then the coarsest, each on a fresh mount
    with --levels auto (page cache dropped first): the time to read the
    tile right after the mount, against reading its region's inputs
    directly (cold too)."""
    rows = []
    for which in ("level 2", "coarsest"):
        start = mount(s.data, s.view, s.staging, SHAPE, ("--levels", "auto", "--format", "zarr"))
        mounted = time.monotonic() - start
        levels = sorted(int(n) for n in os.listdir(s.view) if n.isdigit())
        level = 2 if which == "level 2" else levels[-1]
        t = time.monotonic()
        with open(os.path.join(s.view, str(level), "0.0.0"), "rb") as f:
            f.read()
        tile = time.monotonic() - t
        final = status(s.view)
        run("umount", s.view)
        drop_caches()
        direct, direct_bytes = read_inputs_directly(s.data, tile_region(level, 2, 50), side)
        rows.append((level, mounted, tile, direct, final["on_demand_bytes_read"], direct_bytes))
    print("| first screen: tile 0 of | mount | tile through the view | its region read by h5py | ratio "
          "| input bytes read for it (view / h5py) |")
    print("|---|---|---|---|---|---|")
    for level, mounted, tile, direct, read, direct_bytes in rows:
        print(f"| level {level} | {mounted:.2f} s | {tile * 1000:.0f} ms | {direct * 1000:.0f} ms "
              f"| {tile / direct:.2f}x | {read:,} / {direct_bytes:,} |")


def print_table(rows):
    def med(key):
        return statistics.median(row[key] for row in rows)
    ttfb_ratio = statistics.median(row["ttfb"] / row["extraction"] for row in rows)
    slowdown = statistics.median(row["disturbed"] / row["undisturbed"] for row in rows)
    print(f"| measure (median of {len(rows)} rounds) | value |")
    print("|---|---|")
    print(f"| pending blocks read at random | {med('read'):.0f} |")
    print(f"| blocks extracted on demand | {med('extracted'):.0f} ({med('seeks'):.0f} extra seeks) |")
    print(f"| time to first byte (median) | {med('ttfb') * 1000:.1f} ms |")
    print(f"| direct extraction time (mean) | {med('extraction') * 1000:.1f} ms |")
    print(f"| TTFB / extraction | {ttfb_ratio:.2f}x (rounds {min(r['ttfb'] / r['extraction'] for r in rows):.2f}-"
          f"{max(r['ttfb'] / r['extraction'] for r in rows):.2f}x; target <= 2x) |")
    print(f"| materialisation, undisturbed | {med('undisturbed'):.2f} s |")
    print(f"| materialisation, random reader | {med('disturbed'):.2f} s |")
    print(f"| disturbed / undisturbed | {slowdown:.2f}x (rounds {min(r['disturbed'] / r['undisturbed'] for r in rows):.2f}-"
          f"{max(r['disturbed'] / r['undisturbed'] for r in rows):.2f}x; target <= 1.2x) |")


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/run on-demand", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=os.path.join(ROOT, "bench-out"))
    p.add_argument("--quick", action="store_true", help="350^3 instead of 700^3")
    p.add_argument("--pause", type=float, default=0.05, help="seconds between the reader's block reads")
    p.add_argument("--rounds", type=int, default=5, help="undisturbed and disturbed runs, in turn (default 5)")
    p.add_argument("--first-screen-only", action="store_true", help="only the viewer's first screen")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    side = 350 if a.quick else 700
    data = os.path.join(a.workdir, f"data-{side}x{side}x{side}-in-35x35x35-u16-h5")
    if not os.path.isdir(data):
        run("sample", data, "--array", f"{side},{side},{side}", "--blocks", "35,35,35", "--dtype", "u16", "--format", "h5")
    s = Setup(a.workdir, data, a.pause)
    first_screen(s, side)
    if a.first_screen_only:
        return
    rows = [one_round(s, r, a.rounds) for r in range(a.rounds)]
    print_table(rows)
