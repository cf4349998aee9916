#!/usr/bin/env python3
"""The storage's own limit for a rechunk, and plain file reading, for the
bench harness (Python standard library only, so it runs with any python3
and inside the benchmark's memory cgroup).

    limit.py physical --inputs LIST --out DIR --sizes SIZES --array-bytes A [--mem M]
        The I/O of a rechunk with nothing else in it. 8 reader threads read
        every file named in LIST (one path a line) to nowhere, overlapped
        with 4 writer threads writing fresh files into DIR, one per line
        "BYTES COUNT" of SIZES (the output's file sizes), then one syncfs.
        Page-cache handling mirrors rechunkfs (src/sys/pagecache.rs,
        src/output/directory.rs): each written file's write-back is started
        at once (sync_file_range WRITE); every 256 MiB of finished files
        the filesystem is synced (syncfs); and when the page cache cannot
        hold the array (src/sys/cgroup.rs page_cache_cannot_hold: 4 × A
        more than the smaller of the memory cgroup's limit and
        MemAvailable) each input's pages are dropped once read and each
        output's once synced (POSIX_FADV_DONTNEED). With --mem, the 8 read
        buffers and the one write source together stay within M.
    limit.py read --inputs LIST [--advice sequential|none]
        Reads every file named in LIST in one thread with 8 MiB reads
        (used to compare reading a mounted view with reading its staging
        files); with --advice none, without posix_fadvise SEQUENTIAL, as
        most tools read (h5py, numpy, nibabel).

Started by the harness, it imports and reads LIST, says it is ready and
waits for the harness's go (peers/warm.py) before any I/O. Prints one JSON
line: bytes and files read/written, and when each part ended (seconds from
the go; the harness keeps its own clock).
"""
import argparse
import ctypes
import json
import os
import sys
import threading
import time

from warm import ready

CHUNK = 8 << 20
MIN_CHUNK = 1 << 20
READERS = 8
WRITERS = 4
# rechunkfs's durability batch (src/output/directory.rs COMMIT_BATCH_BYTES).
SYNC_BATCH_BYTES = 256 << 20
SYNC_FILE_RANGE_WRITE = 2
# cgroup limits at or above this mean "no limit" (v1's huge default), as in src/sys/cgroup.rs.
NO_LIMIT = 1 << 60

# The process's own symbols, libc's among them: ctypes.util.find_library
# would start ldconfig, a cold process inside the limit's time.
LIBC = ctypes.CDLL(None, use_errno=True)


# --------------------------------------------------------------------------
# When rechunkfs drops pages: a mirror of src/sys/cgroup.rs


def cgroup_memory_limit():
    """The smallest memory limit on this process's cgroup and its ancestors (v1 or v2), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):
            base, name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        elif controllers == "":
            base, name = "/sys/fs/cgroup", "memory.max"
        else:
            continue
        dirs = [base]
        for part in (p for p in path.split("/") if p):
            dirs.append(os.path.join(dirs[-1], part))
        for d in dirs:
            try:
                with open(os.path.join(d, name)) as f:
                    value = int(f.read().strip())
            except (OSError, ValueError):
                continue      # absent, unreadable, or "max"
            if value < NO_LIMIT:
                limits.append(value)
    return min(limits) if limits else None


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def page_cache_cannot_hold(array_bytes):
    """rechunkfs's rule: input and output (2 × the array) would take more
    than half of the memory this process may use."""
    room = [x for x in (cgroup_memory_limit(), mem_available()) if x is not None]
    return bool(room) and array_bytes * 4 > min(room)


# --------------------------------------------------------------------------
# System calls Python's os module lacks


def syncfs(path):
    """syncfs(2) on path's filesystem; os.sync() where libc has none."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(LIBC, "syncfs") and LIBC.syncfs(fd) == 0:
            return "syncfs"
        os.sync()
        return "sync"
    finally:
        os.close(fd)


def start_writeback(fd):
    """sync_file_range(fd, 0, 0, WRITE), as rechunkfs's start_writeback: advice only."""
    if not hasattr(LIBC, "sync_file_range"):
        return
    f = LIBC.sync_file_range
    f.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    f(fd, 0, 0, SYNC_FILE_RANGE_WRITE)


def drop_pages(fd):
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        pass


# --------------------------------------------------------------------------
# Reading


def read_file(path, view, advise=True, drop=False):
    """Reads one file to nowhere through view; its byte count."""
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        if advise:
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except (AttributeError, OSError):
                pass
        while True:
            n = os.readv(fd, [view])
            if n == 0:
                break
            total += n
        if drop:
            drop_pages(fd)
    finally:
        os.close(fd)
    return total


def read_all(paths, advise=True):
    """One thread, every file in turn (the read mode)."""
    view = memoryview(bytearray(CHUNK))
    return sum(read_file(p, view, advise) for p in paths)


class Work:
    """A list of items handed out one at a time to threads, and their running totals."""

    def __init__(self, items):
        self.items = items
        self.next = 0
        self.lock = threading.Lock()
        self.bytes = 0
        self.error = None

    def take(self):
        with self.lock:
            if self.error is not None or self.next >= len(self.items):
                return None
            self.next += 1
            return self.items[self.next - 1]

    def add(self, n):
        with self.lock:
            self.bytes += n

    def fail(self, e):
        with self.lock:
            self.error = self.error or e


def reader(work, chunk, drop):
    view = memoryview(bytearray(chunk))
    try:
        while (path := work.take()) is not None:
            work.add(read_file(path, view, True, drop))
    except OSError as e:
        work.fail(e)


# --------------------------------------------------------------------------
# Writing


class Batches:
    """Finished output files waiting for the next syncfs, as rechunkfs's
    durability batches: every SYNC_BATCH_BYTES, one syncfs, then (when
    dropping) each file's pages dropped."""

    def __init__(self, out, drop):
        self.out = out
        self.drop = drop
        self.lock = threading.Lock()
        self.files = []
        self.bytes = 0
        self.syncs = 0

    def finished(self, path, size):
        with self.lock:
            self.files.append(path)
            self.bytes += size
            if self.bytes < SYNC_BATCH_BYTES:
                return
            batch, self.files, self.bytes = self.files, [], 0
        self.commit(batch)

    def commit(self, batch):
        how = syncfs(self.out)
        with self.lock:
            self.syncs += 1
        if self.drop:
            for path in batch:
                fd = os.open(path, os.O_RDONLY)
                try:
                    drop_pages(fd)
                finally:
                    os.close(fd)
        return how

    def rest(self):
        """The last batch, however small: the final syncfs; how it synced."""
        with self.lock:
            batch, self.files, self.bytes = self.files, [], 0
        return self.commit(batch)


def write_file(path, size, source):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left:
            left -= os.write(fd, source[:min(left, len(source))])
        start_writeback(fd)
    finally:
        os.close(fd)


def writer(work, out, source, batches):
    try:
        while (item := work.take()) is not None:
            index, size = item
            path = os.path.join(out, f"{index}.bin")
            write_file(path, size, source)
            work.add(size)
            batches.finished(path, size)
    except OSError as e:
        work.fail(e)


def output_sizes(listing):
    """The output's file sizes from lines "BYTES COUNT", one item per file."""
    sizes = []
    with open(listing) as f:
        for line in f:
            if line.strip():
                size, count = (int(x) for x in line.split())
                sizes += [size] * count
    return list(enumerate(sizes))


# --------------------------------------------------------------------------
# The two modes


def chunk_within(mem):
    """The read and write buffer size: 8 MiB, or less so that the 8 read
    buffers and the one write source fit in mem (never under 1 MiB)."""
    if mem is None:
        return CHUNK
    return max(MIN_CHUNK, min(CHUNK, mem // (READERS + 1) // 4096 * 4096))


def physical(a, paths):
    """8 readers overlapped with 4 writers, then syncfs; the report."""
    t0 = time.monotonic()
    drop = page_cache_cannot_hold(a.array_bytes)
    chunk = chunk_within(a.mem)
    os.makedirs(a.out, exist_ok=True)
    reads, writes = Work(paths), Work(output_sizes(a.sizes))
    batches = Batches(a.out, drop)
    source = memoryview(bytes(range(256)) * (chunk // 256))
    ended = {}

    def timed(name, fn, *args):
        fn(*args)
        with reads.lock:
            ended[name] = max(ended.get(name, 0.0), time.monotonic() - t0)
    threads = [threading.Thread(target=timed, args=("read", reader, reads, chunk, drop)) for _ in range(READERS)]
    threads += [threading.Thread(target=timed, args=("write", writer, writes, a.out, source, batches))
                for _ in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if reads.error or writes.error:
        raise reads.error or writes.error
    how = batches.rest()
    return {"mode": "physical", "readers": READERS, "writers": WRITERS, "chunk_bytes": chunk,
            "files_read": len(paths), "bytes_read": reads.bytes, "files_written": len(writes.items),
            "bytes_written": writes.bytes, "dropped_pages": drop, "syncs": batches.syncs, "sync": how,
            "read_ended": ended.get("read", 0.0), "write_ended": ended.get("write", 0.0),
            "seconds": time.monotonic() - t0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["physical", "read"])
    p.add_argument("--inputs", required=True, help="a file listing the files to read, one a line")
    p.add_argument("--out", help="physical: the directory to write into")
    p.add_argument("--sizes", help='physical: a file of lines "BYTES COUNT", the output files to write')
    p.add_argument("--array-bytes", type=int, help="physical: the array's bytes (whether pages are dropped)")
    p.add_argument("--mem", type=int, help="physical: the memory budget the buffers stay within")
    p.add_argument("--advice", choices=["sequential", "none"], default="sequential",
                   help="read: posix_fadvise each file SEQUENTIAL before reading it, or not (default sequential)")
    a = p.parse_args()
    with open(a.inputs) as f:
        paths = [line.rstrip("\n") for line in f if line.strip()]
    ready()
    if a.mode == "physical":
        if not a.out or not a.sizes or a.array_bytes is None:
            p.error("physical needs --out, --sizes and --array-bytes")
        report = physical(a, paths)
    else:
        t0 = time.monotonic()
        nread = read_all(paths, advise=a.advice == "sequential")
        report = {"mode": "read", "files_read": len(paths), "bytes_read": nread,
                  "read_seconds": time.monotonic() - t0}
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
