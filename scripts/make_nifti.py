#!/usr/bin/env python3
"""Write a NIfTI-1 test image with nibabel: the whole image as OUT/whole.nii
and, with --blocks, the same image as a grid of blocks OUT/blocks/{i}_{j}_{k}.nii
whose affines place each block in the whole (as the blocks of a real data
set are). Shapes are nibabel's (x, y, z, ...).

    make_nifti.py OUT --shape 11,9,7 --dtype '>i2' [--blocks 4,4,4] [--scale 2,-3]

The voxel values are deterministic and distinct enough that a misplaced
voxel shows; the affine rotates, scales (unequal voxel sizes) and shifts,
so a transposed or misplaced block shows too.
"""
import argparse
import itertools
import os
import struct

import nibabel as nib
import numpy as np


def values(shape, dtype):
    n = int(np.prod(shape))
    k = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = (k * np.uint64(2654435761) + np.uint64(12345)) % np.uint64(1 << 31)
    if dtype.kind == "f":
        data = (mixed.astype(np.float64) / 1000.0 - 700.0).astype(dtype)
    else:
        info = np.iinfo(dtype)
        span = int(info.max) - int(info.min) + 1
        data = (mixed.astype(object) % span + int(info.min)).astype(dtype)
    # nibabel reads NIfTI as x fastest: order 'F' makes the first axis fastest here too.
    return data.reshape(shape, order="F")


def whole_affine(ndim):
    angle = np.deg2rad(20.0)
    rotation = np.array([[np.cos(angle), -np.sin(angle), 0.0],
                         [np.sin(angle), np.cos(angle), 0.0],
                         [0.0, 0.0, 1.0]])
    zooms = np.array([0.5, 0.75, 1.25])
    affine = np.eye(4)
    affine[:3, :3] = rotation * zooms
    affine[:3, 3] = [-40.0, 12.5, 7.25]
    return affine, zooms


def save(path, data, affine, zooms, dtype, scale):
    header = nib.Nifti1Header(endianness=dtype.byteorder if dtype.byteorder in "<>" else "=")
    header.set_data_dtype(dtype)
    image = nib.Nifti1Image(data, affine, header)
    image.header.set_zooms(tuple(zooms[: data.ndim]) + (1.0,) * max(0, data.ndim - 3))
    image.set_sform(affine, code=1)
    image.set_qform(affine, code=1)
    nib.save(image, path)
    if scale is not None:
        # nibabel recomputes scaling on save; patch the two fields after it.
        big = open(path, "rb").read(4) == struct.pack(">i", 348)
        with open(path, "r+b") as f:
            f.seek(112)
            f.write(struct.pack(">ff" if big else "<ff", *scale))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--shape", required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--blocks")
    p.add_argument("--scale", help="scl_slope,scl_inter to record")
    a = p.parse_args()
    shape = [int(x) for x in a.shape.split(",")]
    dtype = np.dtype(a.dtype)
    scale = [float(x) for x in a.scale.split(",")] if a.scale else None
    os.makedirs(a.out, exist_ok=True)
    data = values(shape, dtype)
    affine, zooms = whole_affine(len(shape))
    save(os.path.join(a.out, "whole.nii"), data, affine, zooms, dtype, scale)
    if a.blocks:
        block = [int(x) for x in a.blocks.split(",")]
        directory = os.path.join(a.out, "blocks")
        os.makedirs(directory, exist_ok=True)
        grid = [-(-n // b) for n, b in zip(shape, block)]
        for index in itertools.product(*[range(g) for g in grid]):
            origin = [i * b for i, b in zip(index, block)]
            region = tuple(slice(o, min(o + b, n)) for o, b, n in zip(origin, block, shape))
            moved = affine.copy()
            moved[:3, 3] = (affine @ np.array(list(origin[:3]) + [0] * (3 - min(3, len(origin))) + [1]))[:3]
            name = "_".join(map(str, index)) + ".nii"
            save(os.path.join(directory, name), np.asarray(data[region]), moved, zooms, dtype, scale)


if __name__ == "__main__":
    main()
