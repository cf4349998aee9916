"""The machine under the runs: facts about it for the report, the memory
cgroups that cap a run, the tmpfs a fast-storage workload runs on,
dropping the page cache before a run, and syncing a filesystem after one."""
import ctypes
import ctypes.util
import datetime
import errno
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import BUILT, ROOT, read_text, say, show_bytes, write_text

# --------------------------------------------------------------------------
# Machine facts


def meminfo():
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    except OSError:
        pass
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def idle_wake():
    """How an idle CPU is woken: its cpuidle driver and, for a VM guest's
    haltpoll driver, how long it polls before halting. With 0 every wake of
    an idle virtual CPU (a thread handing work to another) is an exit to the
    hypervisor, which costs the tools with more hand-overs more."""
    try:
        driver = read_text("/sys/devices/system/cpu/cpuidle/current_driver").strip()
    except OSError:
        return "?"
    try:
        poll = int(read_text("/sys/module/haltpoll/parameters/guest_halt_poll_ns"))
    except (OSError, ValueError):
        return driver
    return f"{driver}, polling {poll:,} ns before halting{' (each wake exits to the hypervisor)' if poll == 0 else ''}"


def mount_of(path):
    """(mount point, device, fs type) of the filesystem holding path."""
    best = ("?", "?", "?")
    try:
        target = str(Path(path).resolve())
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                mnt = fields[4]
                sep = fields.index("-")
                inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
                if inside and (best[0] == "?" or len(mnt) >= len(best[0])):
                    best = (mnt, fields[sep + 2], fields[sep + 1])
    except (OSError, ValueError, IndexError):
        pass
    return best


def git_state():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "Cargo.toml"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{head or '?'}{' + uncommitted changes in src/' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return "?"


def shown_path(path):
    """path relative to the repository when inside it, else as it is."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def machine_lines(workdir):
    mem = meminfo()
    try:
        nproc_avail = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc_avail = os.cpu_count()
    du = shutil.disk_usage(workdir)
    mnt, dev, fstype = mount_of(workdir)
    own_limit = None
    cg = own_memory_cgroup_limit()
    if cg is not None:
        own_limit = cg
    lines = [
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- host: {platform.node()}; kernel: {platform.release()} ({platform.machine()})",
        f"- CPUs: nproc {nproc_avail} (os.cpu_count {os.cpu_count()}), {cpu_model()}; idle: {idle_wake()}",
        f"- memory: total {show_bytes(mem.get('MemTotal'))}, free {show_bytes(mem.get('MemFree'))}, "
        f"available {show_bytes(mem.get('MemAvailable'))}, page cache {show_bytes(mem.get('Cached'))}, "
        f"swap {show_bytes(mem.get('SwapTotal'))}",
        f"- this shell's memory cgroup limit: {show_bytes(own_limit) if own_limit and own_limit < (1 << 60) else 'none'}",
        f"- work directory: {workdir} on {dev} ({fstype}, mounted at {mnt}): "
        f"{show_bytes(du.free)} free of {show_bytes(du.total)}",
        f"- rechunkfs: {shown_path(BUILT)} built from commit {git_state()} (run from a copy in the work directory)",
    ]
    return lines


# --------------------------------------------------------------------------
# Memory cgroups


def proc_self_cgroup():
    try:
        return read_text("/proc/self/cgroup").splitlines()
    except OSError:
        return []


def own_memory_cgroup_limit():
    for line in proc_self_cgroup():
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            p = Path("/sys/fs/cgroup/memory") / parts[2].lstrip("/") / "memory.limit_in_bytes"
            try:
                return int(read_text(p))
            except (OSError, ValueError):
                return None
    for line in proc_self_cgroup():
        if line.startswith("0::"):
            p = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.max"
            try:
                text = read_text(p).strip()
                return None if text == "max" else int(text)
            except (OSError, ValueError):
                return None
    return None


class CgroupError(Exception):
    pass


class MemoryCgroups:
    """Makes one child memory cgroup per capped run, under the group this
    process sits in, and removes it afterwards (v1 or v2)."""

    def __init__(self):
        self.version = None
        self.parent = None
        self.live = set()
        self.counter = 0

    # -- detection
    def detect(self):
        """Sets version/parent or raises CgroupError saying why not."""
        lines = proc_self_cgroup()
        if not lines:
            raise CgroupError("cannot read /proc/self/cgroup")
        reasons = []
        if self._detect_v1(lines, reasons) or self._detect_v2(lines, reasons):
            return
        raise CgroupError("; ".join(reasons) or "no cgroup v1 memory hierarchy and no cgroup v2 line in /proc/self/cgroup")

    def _detect_v1(self, lines, reasons):
        """A hierarchy with the memory controller; only the first such line counts."""
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) == 3 and parts[0] != "0" and "memory" in parts[1].split(","):
                mount = Path("/sys/fs/cgroup/memory")
                if not (mount / "memory.limit_in_bytes").exists():
                    reasons.append(f"v1: /proc/self/cgroup has '{line}' but {mount} is not a memory cgroup mount")
                    return False
                parent = mount / parts[2].lstrip("/")
                if not parent.is_dir():
                    reasons.append(f"v1: our group {parent} does not exist (cgroup namespace?)")
                    return False
                self.version, self.parent = 1, parent
                return True
        return False

    def _detect_v2(self, lines, reasons):
        """The unified hierarchy, "0::/path", with memory enabled for children."""
        for line in lines:
            if not line.startswith("0::"):
                continue
            rel = line[3:].lstrip("/")
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if not (mount / "cgroup.controllers").exists():
                    continue
                parent = mount / rel
                if self._memory_for_children(parent, reasons):
                    self.version, self.parent = 2, parent
                    return True
        return False

    @staticmethod
    def _memory_for_children(parent, reasons):
        try:
            available = read_text(parent / "cgroup.controllers").split()
        except OSError as e:
            reasons.append(f"v2: cannot read {parent}/cgroup.controllers: {e.strerror}")
            return False
        if "memory" not in available:
            reasons.append(f"v2: the memory controller is not available in {parent} "
                           f"(cgroup.controllers: {' '.join(available) or 'empty'})")
            return False
        control = parent / "cgroup.subtree_control"
        enabled = read_text(control).split()
        if "memory" not in enabled:
            try:
                write_text(control, "+memory")
            except OSError as e:
                why = e.strerror
                if e.errno == errno.EBUSY:
                    why += (" — our group holds processes, and v2 lets a group with processes"
                            " enable controllers for children only at the root")
                reasons.append(f"v2: cannot enable memory for children in {control}: {why}")
                return False
        return True

    def probe(self, limit):
        """Make a group, move a trivial process into it, remove it."""
        group = self.create(limit)
        try:
            r = subprocess.run(self.wrap(group, ["true"]), capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise CgroupError(f"cannot move a process into {group}: {r.stderr.strip() or 'exit ' + str(r.returncode)}")
        finally:
            self.remove(group)

    # -- per-run groups
    def create(self, limit):
        self.counter += 1
        group = self.parent / f"rechunkfs-bench-{os.getpid()}-{self.counter}"
        try:
            group.mkdir()
        except OSError as e:
            raise CgroupError(f"cannot create {group}: {e.strerror}")
        self.live.add(group)
        try:
            got = self._set_limit(group, limit)
            if got is None or abs(got - limit) > 1 << 16:
                raise CgroupError(f"wrote limit {limit} to {group} but it reads back {got}")
        except OSError as e:
            self.remove(group)
            raise CgroupError(f"cannot set the memory limit of {group}: {e.strerror}")
        except CgroupError:
            self.remove(group)
            raise
        return group

    def _set_limit(self, group, limit):
        """Writes the limit (and no swap, where v2 allows it); returns what reads back."""
        if self.version == 1:
            write_text(group / "memory.limit_in_bytes", str(limit))
            return int(read_text(group / "memory.limit_in_bytes"))
        write_text(group / "memory.max", str(limit))
        try:
            write_text(group / "memory.swap.max", "0")
        except OSError:
            pass
        text = read_text(group / "memory.max").strip()
        return None if text == "max" else int(text)

    @staticmethod
    def wrap(group, cmd):
        return ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh"] + cmd

    def stats(self, group):
        """(peak usage incl. page cache, OOM kills) of a group, None where unknown."""
        peak = oom = None
        try:
            if self.version == 1:
                peak = int(read_text(group / "memory.max_usage_in_bytes"))
                for line in read_text(group / "memory.oom_control").splitlines():
                    if line.startswith("oom_kill "):
                        oom = int(line.split()[1])
            else:
                if (group / "memory.peak").exists():
                    peak = int(read_text(group / "memory.peak"))
                for line in read_text(group / "memory.events").splitlines():
                    if line.startswith("oom_kill "):
                        oom = int(line.split()[1])
        except (OSError, ValueError):
            pass
        return peak, oom

    def remove(self, group):
        deadline = time.monotonic() + 10
        while True:
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    print(f"bench: warning: could not remove cgroup {group}: {e.strerror}", file=sys.stderr)
                    return
                time.sleep(0.1)
        self.live.discard(group)

    def remove_all(self):
        for group in list(self.live):
            self.remove(group)


# --------------------------------------------------------------------------
# tmpfs


def mount_tmpfs(path, size):
    """A fresh tmpfs of size bytes at path (one left mounted there by an
    interrupted run is unmounted first); None, or why it could not."""
    if os.path.ismount(path):
        why = umount_tmpfs(path)
        if why:
            return why
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def umount_tmpfs(path):
    """Unmounts the tmpfs at path, which frees its pages, and removes the
    empty mount point; None, or why it could not."""
    if os.path.ismount(path):
        r = subprocess.run(["umount", str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            return r.stderr.strip() or f"umount exited {r.returncode}"
    try:
        path.rmdir()
    except OSError:
        pass
    return None


# --------------------------------------------------------------------------
# Page cache and sync


class CacheDropper:
    def __init__(self):
        self.failed = None   # reason, once it has failed

    def drop(self):
        os.sync()
        if self.failed:
            return False
        try:
            write_text("/proc/sys/vm/drop_caches", "3")
        except OSError as e:
            why = e.strerror
            if os.geteuid() != 0:
                why = f"not root (uid {os.geteuid()})"
            self.failed = why
            say(f"NOTE: cannot drop the page cache ({why}): every run below starts with "
                f"whatever the cache holds, not cold.")
            return False
        # The shell the harness starts capped runs and the view's two
        # commands with comes back warm, as a user's shell is: cold, it
        # cost those runs 10-17 ms of a 0.15 s merge (sh -c KEEP against
        # KEEP, 25 rounds), time no tool spends.
        subprocess.run(["sh", "-c", ":"], check=False)
        return True


def syncfs(path):
    """Flush the filesystem holding path (syncfs(2); os.sync() where libc lacks it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        os.sync()
        return
    try:
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name, use_errno=True) if name else None
        if libc is None or not hasattr(libc, "syncfs") or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def timed_sync(path):
    t0 = time.monotonic()
    syncfs(path)
    return time.monotonic() - t0
