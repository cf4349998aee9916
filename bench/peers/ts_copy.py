#!/usr/bin/env python3
"""TensorStore peer for the bench harness: copy a Zarr v2 array into a new Zarr
v2 array with other chunks (uncompressed, same dtype and fill value).

    ts_copy.py IN.zarr OUT.zarr --chunks 50,50,50 --mem BYTES

What it does, in TensorStore's own terms:
  ctx = Context({cache_pool: {total_bytes_limit: MEM}})
  src = open({driver: zarr, kvstore: file IN}, read)
  dst = open({driver: zarr, kvstore: file OUT, metadata: {chunks, compressor null, ...}},
             create, delete_existing)
  dst.write(src).result()      # TensorStore's streaming copy, chunk by chunk
The file kvstore syncs each file it writes (file_io_sync, its default).
Started by the harness, it waits after its imports for the harness's go
(peers/warm.py), so its time holds no interpreter start-up.
Prints one JSON line with TensorStore's version.
"""
import argparse
import json
import sys

import tensorstore as ts
from warm import ready


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--chunks", required=True)
    p.add_argument("--mem", type=int, required=True, help="cache_pool total_bytes_limit")
    a = p.parse_args()
    ready()
    ctx = ts.Context({"cache_pool": {"total_bytes_limit": a.mem}})
    src = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": a.src}},
                  read=True, context=ctx).result()
    shape = list(src.shape)
    chunks = [min(int(x), n) for x, n in zip(a.chunks.split(","), shape)]
    dst = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": a.dst},
                   "metadata": {"shape": shape, "chunks": chunks, "dtype": src.dtype.numpy_dtype.str,
                                "compressor": None, "filters": None, "fill_value": 0, "order": "C",
                                "dimension_separator": "."}},
                  create=True, delete_existing=True, context=ctx).result()
    dst.write(src).result()
    try:
        from importlib.metadata import version
        v = version("tensorstore")
    except Exception:
        v = "?"
    print(json.dumps({"tool": "tensorstore", "version": v}))


if __name__ == "__main__":
    sys.exit(main())
