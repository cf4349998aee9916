#!/usr/bin/env python3
"""Check a Zarr array (a rechunkfs view or a `rechunk --format zarr|zarr3`
output) against the sample array with the readers people use: zarr-python
and TensorStore. Each reader opens the directory as an array, and must find
the expected shape, chunk shape and dtype, and read the whole array,
every edge chunk and random regions bit for bit equal to the source.

Also writes Zarr inputs with zarr-python (uncompressed, or not, or a group)
for rechunkfs to read.

The sample array's element at C-order linear index n holds the first
itemsize bytes of splitmix64(n), little-endian, whatever the dtype's byte
order (see src/sample.rs and scripts/verify.py): the bytes are the source,
the dtype says how to read them.

    check_zarr.py check VIEW --array 37,29,23 --chunks 16,9,11 --dtype '>u2' --zarr-format 3
    check_zarr.py write DIR --array 37,29,23 --chunks 10,8,7 --dtype '<u2' --zarr-format 2
"""
import argparse
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verify import expected_bytes  # noqa: E402


def shape_arg(text):
    return [int(x) for x in text.split(",")]


def canonical(a):
    """The array's bit patterns as native unsigned integers, so arrays in
    either byte order (TensorStore always returns native order) compare
    by value without float comparisons (NaN payloads stay exact)."""
    a = np.ascontiguousarray(a)
    if not a.dtype.isnative:
        a = a.byteswap().view(a.dtype.newbyteorder("="))
    return a.view(f"u{a.dtype.itemsize}")


def expected(array, dtype, origin, shape):
    raw = expected_bytes(array, origin, shape, dtype.itemsize)
    return canonical(np.frombuffer(raw, dtype=dtype).reshape(shape))


def regions(array, chunks, count, seed):
    """The whole array, the last chunk along each dimension and in the
    far corner (edge chunks, padded on disk), then random boxes."""
    yield [0] * len(array), list(array)
    last = [((n - 1) // c) * c for n, c in zip(array, chunks)]
    yield last, [n - o for n, o in zip(array, last)]
    for d in range(len(array)):
        origin = [0] * len(array)
        origin[d] = last[d]
        yield origin, [min(c, n - o) for c, n, o in zip(chunks, array, origin)]
    rng = random.Random(seed)
    for _ in range(count):
        origin = [rng.randrange(n) for n in array]
        yield origin, [rng.randint(1, n - o) for n, o in zip(array, origin)]


def check_reader(name, opened, array, chunks, dtype, count, seed):
    arr, read, found_chunks, found_dtype = opened
    if list(arr.shape) != array:
        sys.exit(f"{name}: shape {tuple(arr.shape)}, expected {tuple(array)}")
    if list(found_chunks) != chunks:
        sys.exit(f"{name}: chunks {tuple(found_chunks)}, expected {tuple(chunks)}")
    if (found_dtype.kind, found_dtype.itemsize) != (dtype.kind, dtype.itemsize):
        sys.exit(f"{name}: dtype {found_dtype.str}, expected {dtype.str}")
    checked = 0
    for origin, shape in regions(array, chunks, count, seed):
        box = tuple(slice(o, o + s) for o, s in zip(origin, shape))
        got = read(box)
        if list(got.shape) != shape:
            sys.exit(f"{name}: region at {origin} has shape {got.shape}, expected {shape}")
        if not np.array_equal(canonical(got), expected(array, dtype, origin, shape)):
            sys.exit(f"{name}: region at {origin} of shape {shape} differs from the source")
        checked += 1
    return checked


def open_zarr_python(path, zarr_format):
    import zarr

    arr = zarr.open_array(path, mode="r", zarr_format=zarr_format)
    return arr, (lambda box: arr[box]), arr.chunks, arr.dtype


def open_tensorstore(path, zarr_format):
    import tensorstore as ts

    driver = "zarr3" if zarr_format == 3 else "zarr"
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": os.path.abspath(path)}}
    arr = ts.open(spec, read=True, open=True).result()
    chunks = arr.chunk_layout.read_chunk.shape
    return arr, (lambda box: arr[box].read().result()), chunks, np.dtype(arr.dtype.numpy_dtype)


def check(a):
    array = shape_arg(a.array)
    chunks = [min(c, n) for c, n in zip(shape_arg(a.chunks), array)]
    dtype = np.dtype(a.dtype)
    readers = ["zarr-python", "tensorstore"] if a.reader == "both" else [a.reader]
    for reader in readers:
        opener = open_zarr_python if reader == "zarr-python" else open_tensorstore
        try:
            opened = opener(a.path, a.zarr_format)
        except Exception as error:  # the reader's own words say why
            sys.exit(f"{reader} cannot open {a.path} as a Zarr v{a.zarr_format} array: {error}")
        checked = check_reader(reader, opened, array, chunks, dtype, a.regions, a.seed)
        print(f"{reader}: {a.path} is a Zarr v{a.zarr_format} array {tuple(array)} {dtype.str} "
              f"in chunks {tuple(chunks)}; {checked} regions equal to the source")


def write(a):
    import zarr

    array = shape_arg(a.array)
    chunks = shape_arg(a.chunks)
    dtype = np.dtype(a.dtype)
    data = np.frombuffer(expected_bytes(array, [0] * len(array), array, dtype.itemsize),
                         dtype=dtype).reshape(array)
    if a.group:
        group = zarr.open_group(a.path, mode="w", zarr_format=a.zarr_format)
        group.create_array("data", shape=array, chunks=chunks, dtype=dtype,
                           compressors=None, fill_value=0)[...] = data
        return
    options = {} if a.compressed else {"compressors": None}
    z = zarr.create_array(a.path, shape=array, chunks=chunks, dtype=dtype,
                          zarr_format=a.zarr_format, fill_value=a.fill_value, **options)
    z[...] = data
    for index in a.drop or []:
        key = [str(i) for i in shape_arg(index)]
        name = os.path.join("c", *key) if a.zarr_format == 3 else ".".join(key)
        os.remove(os.path.join(a.path, name))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="read a Zarr array with zarr-python and TensorStore")
    c.add_argument("path")
    c.add_argument("--array", required=True)
    c.add_argument("--chunks", required=True)
    c.add_argument("--dtype", required=True, help="the source's numpy dtype, e.g. <u2, >f4, |u1")
    c.add_argument("--zarr-format", type=int, choices=[2, 3], required=True)
    c.add_argument("--reader", choices=["zarr-python", "tensorstore", "both"], default="both")
    c.add_argument("--regions", type=int, default=20, help="random regions to read")
    c.add_argument("--seed", type=int, default=1)
    w = sub.add_parser("write", help="write the sample array as a Zarr array with zarr-python")
    w.add_argument("path")
    w.add_argument("--array", required=True)
    w.add_argument("--chunks", required=True)
    w.add_argument("--dtype", required=True)
    w.add_argument("--zarr-format", type=int, choices=[2, 3], required=True)
    w.add_argument("--fill-value", type=int, default=0)
    w.add_argument("--compressed", action="store_true", help="keep zarr-python's default compressor")
    w.add_argument("--group", action="store_true", help="write a group holding the array as 'data'")
    w.add_argument("--drop", action="append", help="remove this chunk (i,j,k) afterwards")
    a = p.parse_args()
    check(a) if a.command == "check" else write(a)


if __name__ == "__main__":
    main()
