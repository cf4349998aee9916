#!/usr/bin/env python3
"""The disk's own limit for a rechunk, and plain file reading, measured in
one process for the bench harness (Python standard library only, so it runs
with any python3 and inside the benchmark's memory cgroup).

    limit.py physical --inputs LIST --out DIR --files N [--bytes B]
        Reads every file named in LIST (one path a line) to nowhere with
        large reads (8 MiB, posix_fadvise SEQUENTIAL), then writes B bytes
        (default: the bytes read) as N fresh files in DIR, as evenly as
        possible, with large writes, then syncs DIR's filesystem (syncfs).
        No copy can do less I/O: this is the floor a rechunk is held to.
    limit.py read --inputs LIST [--advice sequential|none]
        Reads every file named in LIST, as above (used to compare reading a
        mounted view with reading its staging files); with --advice none,
        without posix_fadvise, as most tools read (h5py, numpy, nibabel).

Prints one JSON line: bytes read/written, files, and seconds per phase.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import sys
import time

CHUNK = 8 << 20


def read_all(paths, advise=True):
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    for path in paths:
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
        finally:
            os.close(fd)
    return total


def write_files(out, files, nbytes):
    os.makedirs(out, exist_ok=True)
    data = memoryview(os.urandom(CHUNK))
    base, extra = divmod(nbytes, files)
    written = 0
    for i in range(files):
        size = base + (1 if i < extra else 0)
        fd = os.open(os.path.join(out, f"{i}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = size
            while left:
                n = os.write(fd, data[:min(left, CHUNK)])
                left -= n
                written += n
        finally:
            os.close(fd)
    return written


def syncfs(path):
    """syncfs(2) on path's filesystem; os.sync() where libc has none."""
    libc_name = ctypes.util.find_library("c")
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None
        if libc is not None and hasattr(libc, "syncfs"):
            if libc.syncfs(fd) == 0:
                return "syncfs"
        os.sync()
        return "sync"
    finally:
        os.close(fd)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["physical", "read"])
    p.add_argument("--inputs", required=True, help="a file listing the files to read, one a line")
    p.add_argument("--out")
    p.add_argument("--files", type=int)
    p.add_argument("--bytes", type=int)
    p.add_argument("--advice", choices=["sequential", "none"], default="sequential",
                   help="posix_fadvise each file SEQUENTIAL before reading it, or not (default sequential)")
    a = p.parse_args()
    with open(a.inputs) as f:
        paths = [line.rstrip("\n") for line in f if line.strip()]
    t0 = time.monotonic()
    nread = read_all(paths, advise=a.advice == "sequential")
    t1 = time.monotonic()
    report = {"mode": a.mode, "files_read": len(paths), "bytes_read": nread, "read_seconds": t1 - t0}
    if a.mode == "physical":
        if not a.out or not a.files:
            p.error("physical needs --out and --files")
        nbytes = a.bytes if a.bytes is not None else nread
        written = write_files(a.out, a.files, nbytes)
        t2 = time.monotonic()
        how = syncfs(a.out)
        t3 = time.monotonic()
        report.update(files_written=a.files, bytes_written=written, write_seconds=t2 - t1,
                      sync_seconds=t3 - t2, sync=how)
    report["seconds"] = time.monotonic() - t0
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
