"""The view as a tool: `rechunkfs mount && rechunkfs status --wait`, timed
as one shell command until every block is complete; the daemon's peak RSS;
the read throughput of the view's files against the staging files; and
unmounting it again."""
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import FORMAT, PEERS_DIR, Binary, last_lines, parse_json, read_text, say, shape_str, write_text
from .system import timed_sync
from .tools import new_record, process_cpu, run_process, verify
from .workloads import input_arg, storage_dir

# View reads: repeat (view, staging, staging, view) for each reader until
# each side has read this long, at most this many times.
READ_SECONDS_PER_SIDE = 2.0
READ_PATTERNS = 20

# The readers the view's files are read with (name, limit.py --advice):
# plainly, as most tools read (h5py, numpy, nibabel), and advised
# sequential, as cp does. The advice is the reader's own: through FUSE
# passthrough it reaches the view's file, not the staging file the kernel
# reads, which keeps the disk's default read-ahead (on this VM 8 MiB reads
# against an 8 MiB window, where the kernel now and then stops reading
# ahead: 0.11 s for the merge block instead of 0.04 s). Reading the staging
# file directly, the advice doubles the window and that never happens.
READERS = (("plain", "none"), ("advised", "sequential"))


def vm_hwm(pid):
    try:
        for line in read_text(f"/proc/{pid}/status").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def umount(ctx, view, pid=None):
    r = subprocess.run([str(Binary.path), "umount", str(view)], capture_output=True, text=True, timeout=120)
    if pid:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            try:
                if read_text(f"/proc/{pid}/stat").split(")")[-1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.05)
    if r.returncode == 0:
        ctx.mounted.discard(view)
    return r.returncode == 0, (r.stderr or r.stdout).strip()


def read_files(ctx, files, label, advice):
    """Reads files cold with limit.py read; (bytes, seconds) or None."""
    listing = ctx.workdir / "logs" / f"read-{label}.txt"
    write_text(listing, "".join(f"{p}\n" for p in files))
    ctx.dropper.drop()
    r = subprocess.run([sys.executable, str(PEERS_DIR / "limit.py"), "read", "--inputs", str(listing),
                        "--advice", advice],
                       capture_output=True, text=True, timeout=ctx.timeout)
    rep = parse_json(r.stdout) if r.returncode == 0 else None
    if not rep:
        return None
    return rep["bytes_read"], rep["read_seconds"]


def run_view(w, cap, mem, ctx, tag, measure_read, check):
    """Mount a view, time it until complete, read it, check it, unmount it."""
    rec = new_record(w, "view", cap, mem, ctx.cores)
    view = ctx.workdir / "view"
    staging = storage_dir(ctx.workdir, w) / "staging"
    if view in ctx.mounted or os.path.ismount(view):
        umount(ctx, view)
    shutil.rmtree(staging, ignore_errors=True)
    view.mkdir(exist_ok=True)
    if any(view.iterdir()):
        rec.update(status="error", stderr=f"{view} is not empty")
        return rec
    log_stem = ctx.workdir / "logs" / f"{w.name}-view-{tag}"
    pid = None
    mount_and_wait(rec, w, view, staging, cap, mem, ctx, log_stem)
    try:
        st, pid = view_status(log_stem)
        if rec["status"] == "timeout":
            return rec
        if rec["status"] != "ok" or not st or st.get("state") != "complete":
            note_failure(rec, st, pid, view, staging, cap, ctx)
            return rec
        note_complete(rec, st, pid, staging, ctx)
        # The daemon's, before the reads below add to it; the shell's is not the view's.
        rec["cpu_seconds"] = process_cpu(pid) if pid else None
        if measure_read:
            reads = measure_reads(ctx, w, view, staging)
            if reads:
                rec["reads"] = reads
        if check:
            ok, text, secs = verify(view, w)
            rec["verified"] = ok
            rec["verify_text"] = text.splitlines()[-1] if text else ""
            rec["verify_seconds"] = secs
        return rec
    finally:
        if view in ctx.mounted:
            ok, text = umount(ctx, view, pid)
            if not ok:
                say(f"    warning: rechunkfs umount {view} failed: {text}")
        if rec.get("cgroup"):
            # run_process made the group for the mount command; the daemon lived in it too.
            ctx.cgroups.remove(Path(rec["cgroup"]))
        shutil.rmtree(staging, ignore_errors=True)


def mount_and_wait(rec, w, view, staging, cap, mem, ctx, log_stem):
    """Runs mount, then a wait until every block is done, as one timed shell command."""
    inp = input_arg(ctx.workdir, w)
    mount = [Binary.path, "mount", inp, view, "--shape", shape_str(w.shape), "--staging", staging]
    if mem is not None:
        mount += ["--mem", str(mem)]
    wait = [Binary.path, "status", "--wait", "--json", view]
    # What a user types: mount, then wait until every block is done, as
    # one shell command; the clock runs from its start (after the cache
    # was dropped) to its end. The harness stays idle meanwhile, as it
    # does for every other tool: work of its own between the two commands
    # would take one of the two cores from the daemon's reader and writer.
    script = " ".join(shlex.quote(str(c)) for c in mount) + " && exec " + " ".join(shlex.quote(str(c)) for c in wait)
    run_process(rec, ["sh", "-c", script], cap, ctx, log_stem, keep_group=True)
    # The shell's RSS and exit are not the daemon's: those come from the daemon itself.
    for key in ("peak_rss_bytes", "cgroup_peak_bytes", "cgroup_oom_kills", "stdout_json", "cpu_seconds"):
        rec.pop(key, None)
    if os.path.ismount(view):
        ctx.mounted.add(view)


def view_status(log_stem):
    """The final status the wait printed, and the daemon's pid (from the status or the mount's message)."""
    try:
        st = parse_json(read_text(str(log_stem) + ".out"))
    except OSError:
        st = None
    try:
        found = re.search(r"daemon pid (\d+)", read_text(str(log_stem) + ".err"))
    except OSError:
        found = None
    pid = (st or {}).get("pid") or (int(found.group(1)) if found else None)
    return st, pid


def note_failure(rec, st, pid, view, staging, cap, ctx):
    """Names why a view did not complete: the mount failed, the daemon died, or the view says why."""
    if view not in ctx.mounted:
        # The mount command failed: its status and message are the record's.
        if rec["status"] == "ok":
            rec["status"] = "error"
    elif pid and not Path(f"/proc/{pid}").exists():
        rec.update(status="oom" if cap else "error",
                   stderr=f"daemon {pid} died ({last_lines(staging / 'daemon.log', 2)})")
    else:
        why = (st or {}).get("error") or rec.get("stderr") or "no status"
        rec.update(status="error", stderr=f"view {(st or {}).get('state')}: {why}")


def note_complete(rec, st, pid, staging, ctx):
    """A complete view's record: its staging synced into the wall time, the daemon's figures."""
    rec["sync_seconds"] = timed_sync(staging)
    rec["wall_seconds"] += rec["sync_seconds"]
    rec["status"] = "ok"
    rec["daemon_pid"] = pid
    rec["daemon_elapsed_seconds"] = st.get("elapsed_seconds")
    rec["peak_rss_bytes"] = vm_hwm(pid)
    rec["seeks_made"], rec["seeks_planned"] = st.get("seeks_made"), st.get("seeks_planned")
    if rec.get("cgroup"):
        rec["cgroup_peak_bytes"], rec["cgroup_oom_kills"] = ctx.cgroups.stats(Path(rec["cgroup"]))


def measure_reads(ctx, w, view, staging):
    """Read throughput of the view's block files and the same files in
    staging, cold, by each reader: {reader: {"view": …, "staging": …}}, or
    None when a read failed."""
    names = sorted(p.name for p in view.iterdir() if p.suffix == "." + FORMAT)
    view_files = [view / n for n in names]
    staging_files = [staging / "blocks" / n for n in names]
    # On this VM the first cold read after a run's writes is up to
    # 2x slower (W2: 338 MB/s, then 522-740), the disk still
    # settling: one unmeasured round of the staging files first,
    # then view, staging, staging, view, so that neither side
    # gains from the order.
    read_files(ctx, staging_files, f"{w.name}-settle", "sequential")
    # A small workload's round takes 0.1 s, where the VM's noise
    # decides a ratio: repeat the pattern until each side of each
    # reader has read for READ_SECONDS_PER_SIDE (at most
    # READ_PATTERNS times). The readers take turns, pattern by
    # pattern, so that the machine's drift falls on both.
    sides = {reader: {"view": [], "staging": []} for reader, _ in READERS}
    for _ in range(READ_PATTERNS):
        if not read_pattern(ctx, w, sides, view_files, staging_files):
            return None
        if min(sum(s for _, s in rounds) for side in sides.values()
               for rounds in side.values()) >= READ_SECONDS_PER_SIDE:
            break

    def total(rounds):
        return {"bytes": sum(b for b, _ in rounds), "seconds": sum(s for _, s in rounds),
                "rounds": len(rounds), "round_seconds": [s for _, s in rounds]}
    return {reader: {label: total(rounds) for label, rounds in side.items()}
            for reader, side in sides.items()}


def read_pattern(ctx, w, sides, view_files, staging_files):
    """One pattern (view, staging, staging, view) by every reader in turn; False when a read failed."""
    for reader, advice in READERS:
        for label, files in (("view", view_files), ("staging", staging_files),
                             ("staging", staging_files), ("view", view_files)):
            done = read_files(ctx, files, f"{w.name}-{label}-{reader}", advice)
            if done is None:
                return False
            sides[reader][label].append(done)
    return True
