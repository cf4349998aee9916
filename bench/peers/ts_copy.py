#!/usr/bin/env python3
"""TensorStore peer for the bench harness: copy a Zarr v2 array into a new Zarr
v2 array with other chunks (uncompressed, same dtype and fill value); or,
with --zarr3-codec, a Zarr v3 array into a Zarr v3 array compressed so.

    ts_copy.py IN.zarr OUT.zarr --chunks 50,50,50 --mem BYTES
    ts_copy.py IN.zarr OUT.zarr --chunks 50,50,50 --mem BYTES --zarr3-codec zstd:3

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
    p.add_argument("--zarr3-codec", help="Zarr v3 in and out, compressed with zstd[:LEVEL]")
    a = p.parse_args()
    ready()
    ctx = ts.Context({"cache_pool": {"total_bytes_limit": a.mem}})
    if a.zarr3_codec:
        copy_zarr3(a, ctx)
    else:
        copy_zarr2(a, ctx)
    try:
        from importlib.metadata import version
        v = version("tensorstore")
    except Exception:
        v = "?"
    print(json.dumps({"tool": "tensorstore", "version": v}))


def copy_zarr3(a, ctx):
    name, _, level = a.zarr3_codec.partition(":")
    if name != "zstd":
        raise SystemExit(f"--zarr3-codec: zstd only, not {a.zarr3_codec}")
    src = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": a.src}},
                  read=True, context=ctx).result()
    shape = list(src.shape)
    chunks = [min(int(x), n) for x, n in zip(a.chunks.split(","), shape)]
    codecs = [{"name": "bytes", "configuration": {"endian": "little"}},
              {"name": "zstd", "configuration": {"level": int(level or 3), "checksum": False}}]
    dst = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": a.dst},
                   "metadata": {"shape": shape, "data_type": src.dtype.name, "fill_value": 0,
                                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
                                "codecs": codecs}},
                  create=True, delete_existing=True, context=ctx).result()
    dst.write(src).result()


def copy_zarr2(a, ctx):
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


if __name__ == "__main__":
    sys.exit(main())
