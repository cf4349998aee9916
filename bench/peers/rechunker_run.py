#!/usr/bin/env python3
"""rechunker peer for the bench harness: rechunk a Zarr v2 array into a new Zarr
v2 array with other chunks, with rechunker's python or dask executor.

    rechunker_run.py IN.zarr OUT.zarr TMP.zarr --chunks 50,50,50 --mem BYTES --executor python|dask

What it does:
  src = zarr.open(IN, mode="r")
  plan = rechunker.rechunk(src, target_chunks=CHUNKS, max_mem=MEM, target_store=OUT,
                           temp_store=TMP, target_options={"compressor": None},
                           temp_options={"compressor": None}, executor=EXECUTOR)
  plan.execute()       # dask: the default threaded scheduler, one worker per core
rechunker picks its read/write chunks (and an intermediate array in TMP when
one copy does not fit in max_mem) itself. Started by the harness, it waits
after its imports (dask's too) for the harness's go (peers/warm.py), so its
time holds no interpreter start-up. Prints one JSON line with the
versions and rechunker's plan (read, intermediate and write chunks).
"""
import argparse
import json
import sys

import rechunker
import zarr
from warm import ready


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("tmp")
    p.add_argument("--chunks", required=True)
    p.add_argument("--mem", type=int, required=True, help="rechunker max_mem in bytes")
    p.add_argument("--executor", choices=["python", "dask"], required=True)
    a = p.parse_args()
    info = {"tool": f"rechunker-{a.executor}", "rechunker": rechunker.__version__, "zarr": zarr.__version__}
    if a.executor == "dask":
        # Imported before the warm start's go, as the other imports are.
        import dask
        import dask.array  # noqa: F401
        info["dask"] = dask.__version__
    ready()
    src = zarr.open(a.src, mode="r")
    chunks = tuple(min(int(x), n) for x, n in zip(a.chunks.split(","), src.shape))
    plan = rechunker.rechunk(src, target_chunks=chunks, max_mem=a.mem, target_store=a.dst,
                             temp_store=a.tmp, target_options={"compressor": None},
                             temp_options={"compressor": None}, executor=a.executor)
    try:
        from rechunker.algorithm import rechunking_plan
        read, inter, write = rechunking_plan(src.shape, src.chunks, chunks, src.dtype.itemsize, a.mem)
        info["plan"] = {"read_chunks": list(read), "intermediate_chunks": list(inter),
                        "write_chunks": list(write)}
    except Exception as e:  # the plan is informative only
        info["plan"] = f"unavailable: {e}"
    plan.execute()
    print(json.dumps(info))


if __name__ == "__main__":
    sys.exit(main())
