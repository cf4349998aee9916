#!/usr/bin/env python3
"""Write the sample array (see content.py) in the peers' native forms, for
the bench harness. Runs in the harness's venv (numpy; h5py for --h5).

    prepare.py zarr OUT.zarr --array 700,700,700 --chunks 35,35,35
        a Zarr v2 array: uncompressed, no filters, '<u2', C order, fill 0,
        chunk keys "i.j.k"; every chunk written (edge chunks full size)
    prepare.py h5 OUT.h5 --array 700,700,700 --chunks 35,35,35
        one HDF5 file holding /data with chunked layout, chunks = --chunks,
        no filters; chunks written with H5Dwrite_chunk (no conversion)
    prepare.py zarr3 OUT.zarr --array 700,700,700 --chunks 35,35,35 --codec zstd:3
        a Zarr v3 array written by TensorStore: '<u2' (the bytes codec,
        little-endian) then zstd at that level (no checksum), fill 0, chunk
        keys "c/i/j/k"; written a chunk at a time
    prepare.py zarr3 OUT.zarr ... --content image
        the same with the image-like content (content.py), for any kind

The content is the sample array's (splitmix) unless --content says image.

Writes to OUT.partial and renames it to OUT when done, so an interrupted
run never leaves something that looks finished.
"""
import argparse
import itertools
import json
import os
import shutil
import sys
import time

from content import grid_of, padded_region_bytes

DTYPE = "<u2"
ITEMSIZE = 2


def write_zarr(out, array, chunks, content):
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    meta = {"zarr_format": 2, "shape": array, "chunks": chunks, "dtype": DTYPE, "compressor": None,
            "fill_value": 0, "order": "C", "filters": None, "dimension_separator": "."}
    with open(os.path.join(tmp, ".zarray"), "w") as f:
        json.dump(meta, f, indent=2)
    with open(os.path.join(tmp, ".zattrs"), "w") as f:
        f.write("{}\n")
    for index in itertools.product(*[range(g) for g in grid_of(array, chunks)]):
        origin = [i * c for i, c in zip(index, chunks)]
        data = padded_region_bytes(array, origin, chunks, ITEMSIZE, content)
        with open(os.path.join(tmp, ".".join(map(str, index))), "wb") as f:
            f.write(data)
    os.sync()
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def write_h5(out, array, chunks, content):
    import h5py
    import numpy as np
    tmp = out + ".partial"
    if os.path.exists(tmp):
        os.remove(tmp)
    with h5py.File(tmp, "w") as f:
        ds = f.create_dataset("data", shape=tuple(array), dtype=DTYPE, chunks=tuple(chunks),
                              fillvalue=0)
        for index in itertools.product(*[range(g) for g in grid_of(array, chunks)]):
            origin = [i * c for i, c in zip(index, chunks)]
            data = padded_region_bytes(array, origin, chunks, ITEMSIZE, content)
            ds.id.write_direct_chunk(tuple(origin), np.frombuffer(data, dtype=np.uint8))
    os.sync()
    os.replace(tmp, out)


def write_zarr3(out, array, chunks, content, codec):
    import numpy as np
    import tensorstore as ts
    name, _, level = codec.partition(":")
    if name != "zstd":
        raise SystemExit(f"prepare.py zarr3 writes zstd only, not {codec}")
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": tmp},
            "metadata": {"shape": array, "data_type": "uint16", "fill_value": 0,
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
                         "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                    {"name": "zstd", "configuration": {"level": int(level or 3),
                                                                       "checksum": False}}]}}
    arr = ts.open(spec, create=True, delete_existing=True).result()
    for index in itertools.product(*[range(g) for g in grid_of(array, chunks)]):
        origin = [i * c for i, c in zip(index, chunks)]
        shape = [min(c, n - o) for c, n, o in zip(chunks, array, origin)]
        data = np.frombuffer(padded_region_bytes(array, origin, chunks, ITEMSIZE, content), dtype=DTYPE)
        region = data.reshape(chunks)[tuple(slice(0, s) for s in shape)]
        arr[tuple(slice(o, o + s) for o, s in zip(origin, shape))].write(region).result()
    os.sync()
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["zarr", "zarr3", "h5"])
    p.add_argument("out")
    p.add_argument("--array", required=True)
    p.add_argument("--chunks", required=True)
    p.add_argument("--codec", default="zstd:3", help="zarr3: the compressor (zstd[:LEVEL])")
    p.add_argument("--content", choices=["splitmix", "image"], default="splitmix",
                   help="the array's values (content.py; default: the sample array's)")
    a = p.parse_args()
    array = [int(x) for x in a.array.split(",")]
    chunks = [min(int(x), n) for x, n in zip(a.chunks.split(","), array)]
    t0 = time.monotonic()
    if a.kind == "zarr3":
        write_zarr3(a.out, array, chunks, a.content, a.codec)
    else:
        (write_zarr if a.kind == "zarr" else write_h5)(a.out, array, chunks, a.content)
    print(json.dumps({"seconds": time.monotonic() - t0}))


if __name__ == "__main__":
    sys.exit(main())
