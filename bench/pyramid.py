"""A multiscale pyramid through the view against level 0 alone (issue 21):
`rechunkfs mount IN VIEW --shape 50,50,50 --mem 39.2M --format zarr`
with and without `--levels auto`, each timed from the mount to the end of
`status --wait`, with the page cache dropped before (as root), the
daemon's input bytes read (/proc/PID/io read_bytes, taken before the
unmount), its peak RSS (VmHWM), and the time to first pixel: a reader that
opens the coarsest level's only chunk just after the mount, as a viewer
asking for the coarsest level first does.

    python3 -m bench.pyramid W1_INPUT_DIR [--binary target/release/rechunkfs]
        [--runs 3] [--workdir DIR] [--shape 50,50,50] [--no-drop]

W1_INPUT_DIR holds W1's blocks (`./bench/run` makes them under its work
directory; `rechunkfs sample DIR --array 700,700,700 --blocks 35,35,35
--dtype uint16` makes the same). Prints one JSON object: per variant the
median seconds, input bytes, peak RSS, and the ratio of the pyramid's time
to level 0's (target: at most 1.3, no more input bytes read).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

SHAPE = "50,50,50"
MEM = "39.2M"


def drop_caches(allowed):
    if allowed and os.geteuid() == 0:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def proc_value(pid, path, key):
    try:
        for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * (1024 if path == "status" else 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def daemon_pid(binary, view):
    status = subprocess.run([binary, "status", "--json", str(view)], capture_output=True, text=True)
    return json.loads(status.stdout)["pid"] if status.returncode == 0 else None


def first_pixel(view, started, result):
    """Opens and reads the coarsest level's chunk `0.0.0` as soon as it is
    listed; records the seconds from the mount to its bytes."""
    levels = sorted(int(p.name) for p in Path(view).iterdir() if p.name.isdigit())
    if not levels:
        return
    with open(Path(view) / str(levels[-1]) / "0.0.0", "rb") as f:
        f.read()
    result["first_pixel_seconds"] = time.monotonic() - started


def one_run(binary, input_dir, workdir, levels, drop, shape):
    view = Path(tempfile.mkdtemp(dir=workdir, prefix="view-"))
    staging = Path(tempfile.mkdtemp(dir=workdir, prefix="staging-"))
    args = [binary, "mount", str(input_dir), str(view), "--shape", shape, "--mem", MEM,
            "--format", "zarr", "--staging", str(staging), "--rebuild"]
    if levels:
        args += ["--levels", "auto"]
    drop_caches(drop)
    result = {}
    started = time.monotonic()
    subprocess.run(args, check=True, capture_output=True)
    reader = None
    if levels:
        reader = threading.Thread(target=first_pixel, args=(view, started, result))
        reader.start()
    subprocess.run([binary, "status", "--wait", str(view)], check=True, capture_output=True)
    result["seconds"] = time.monotonic() - started
    if reader:
        reader.join()
    pid = daemon_pid(binary, view)
    result["input_read_bytes"] = proc_value(pid, "io", "read_bytes")
    result["peak_rss_bytes"] = proc_value(pid, "status", "VmHWM")
    subprocess.run([binary, "umount", str(view)], check=True, capture_output=True)
    shutil.rmtree(staging, ignore_errors=True)
    view.rmdir()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("--binary", default="target/release/rechunkfs")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--shape", default=SHAPE)
    parser.add_argument("--no-drop", action="store_true", help="keep the page cache (smoke runs)")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="rechunkfs-pyramid-")
    os.makedirs(workdir, exist_ok=True)
    report = {}
    for name, levels in (("level 0", False), ("pyramid", True)):
        runs = [one_run(args.binary, args.input, workdir, levels, not args.no_drop, args.shape) for _ in range(args.runs)]
        summary = {"runs": runs, "median_seconds": statistics.median(r["seconds"] for r in runs)}
        first = [r["first_pixel_seconds"] for r in runs if "first_pixel_seconds" in r]
        if first:
            summary["median_first_pixel_seconds"] = statistics.median(first)
        report[name] = summary
    report["time_ratio"] = report["pyramid"]["median_seconds"] / report["level 0"]["median_seconds"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
