#!/usr/bin/env python3
"""Check block files against the sample array with the readers people use
(numpy for .npy, h5py for .h5): every voxel, every block, exact bytes.

The sample array's element at C-order linear index n holds the first
itemsize bytes of splitmix64(n), little-endian (see src/sample.rs).

    verify.py DIR --array 700,700,700 --block 50,50,50 --dtype '<u2' --format h5
"""
import argparse
import itertools
import os
import sys

import numpy as np

MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(n):
    with np.errstate(over="ignore"):
        z = n + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def expected_bytes(array, origin, shape, itemsize):
    grids = np.meshgrid(*[np.arange(o, o + s, dtype=np.uint64) for o, s in zip(origin, shape)], indexing="ij")
    strides = [int(np.prod(array[d + 1:])) for d in range(len(array))]
    linear = sum(g * np.uint64(st) for g, st in zip(grids, strides))
    words = splitmix64(linear.astype(np.uint64)).astype("<u8")
    return words.view(np.uint8).reshape(-1, 8)[:, :itemsize].tobytes()


def load(path, fmt, dataset):
    if fmt == "npy":
        return np.load(path, allow_pickle=False)
    import h5py
    with h5py.File(path, "r") as f:
        return f[dataset][...]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--array", required=True)
    p.add_argument("--block", required=True)
    p.add_argument("--dtype", required=True, help="numpy dtype string, e.g. <u2, >f4, |u1")
    p.add_argument("--format", choices=["h5", "npy"], required=True)
    p.add_argument("--dataset", default="/data")
    a = p.parse_args()
    array = [int(x) for x in a.array.split(",")]
    block = [min(int(x), n) for x, n in zip(a.block.split(","), array)]
    dtype = np.dtype(a.dtype)
    grid = [-(-n // b) for n, b in zip(array, block)]
    checked = 0
    for index in itertools.product(*[range(g) for g in grid]):
        origin = [i * b for i, b in zip(index, block)]
        shape = [min(b, n - o) for b, n, o in zip(block, array, origin)]
        name = "_".join(map(str, index)) + "." + a.format
        data = load(os.path.join(a.dir, name), a.format, a.dataset)
        if list(data.shape) != shape:
            sys.exit(f"{name}: shape {data.shape}, expected {tuple(shape)}")
        if data.dtype != dtype:
            sys.exit(f"{name}: dtype {data.dtype.str}, expected {dtype.str}")
        if data.tobytes() != expected_bytes(array, origin, shape, dtype.itemsize):
            sys.exit(f"{name}: bytes differ from the source array")
        checked += 1
    print(f"verified {checked} blocks in {a.dir} with {'numpy' if a.format == 'npy' else 'h5py'}: every voxel exact")


if __name__ == "__main__":
    main()
