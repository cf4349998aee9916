#!/usr/bin/env python3
"""Write a MINC2 test image with h5py, laid out as libminc lays it out
(so nibabel's MINC2 reader, the ground truth, loads it): the whole image as
OUT/whole.mnc and, with --blocks, the same image as a grid of blocks
OUT/blocks/{i}_{j}_{k}.mnc whose dimension starts place each block in the
whole (as BigBrain's blocks are). Shapes are C order, following the
image's dimorder zspace,yspace,xspace.

    make_minc2.py OUT --shape 7,9,11 --dtype '<u2' [--blocks 4,4,4] [--scaling global|per-slice|none]

Steps are unequal and one is negative, and the direction cosines rotate, so
a transposed or misplaced block shows.
"""
import argparse
import itertools
import os

import h5py
import numpy as np

DIMORDER = ["zspace", "yspace", "xspace"]
ANGLE = np.deg2rad(10.0)
COSINES = {
    "xspace": [np.cos(ANGLE), np.sin(ANGLE), 0.0],
    "yspace": [-np.sin(ANGLE), np.cos(ANGLE), 0.0],
    "zspace": [0.0, 0.0, 1.0],
}
STEPS = {"zspace": 1.25, "yspace": -0.75, "xspace": 0.5}
STARTS = {"zspace": -20.0, "yspace": 30.0, "xspace": -15.5}


def values(shape, dtype):
    n = int(np.prod(shape))
    k = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = (k * np.uint64(2246822519) + np.uint64(777)) % np.uint64(1 << 31)
    if dtype.kind == "f":
        return (mixed.astype(np.float64) / 100.0 - 900.0).astype(dtype).reshape(shape)
    info = np.iinfo(dtype)
    span = int(info.max) - int(info.min) + 1
    return (mixed.astype(object) % span + int(info.min)).astype(dtype).reshape(shape)


def text(value):
    # libminc writes fixed-length strings; nibabel decodes them as bytes.
    return np.bytes_(value)


def write(path, data, origin, scaling):
    with h5py.File(path, "w") as f:
        root = f.create_group("minc-2.0")
        root.attrs["ident"] = text("rechunkfs test")
        root.attrs["minc_version"] = text("2.0.0")
        dims = root.create_group("dimensions")
        for axis, name in enumerate(DIMORDER):
            var = dims.create_dataset(name, data=np.int32(0))
            var.attrs["varid"] = text("MINC standard variable")
            var.attrs["vartype"] = text("dimension____")
            var.attrs["version"] = text("MINC Version    1.0")
            var.attrs["length"] = np.int32(data.shape[axis])
            var.attrs["step"] = np.float64(STEPS[name])
            var.attrs["start"] = np.float64(STARTS[name] + STEPS[name] * origin[axis])
            var.attrs["units"] = text("mm")
            var.attrs["spacing"] = text("regular__")
            var.attrs["alignment"] = text("centre")
            var.attrs["direction_cosines"] = np.array(COSINES[name], dtype=np.float64)
        root.create_group("info")
        image_group = root.create_group("image").create_group("0")
        image = image_group.create_dataset("image", data=data)
        image.attrs["dimorder"] = text(",".join(DIMORDER))
        image.attrs["complete"] = text("true_")
        image.attrs["varid"] = text("MINC standard variable")
        image.attrs["vartype"] = text("group________")
        if data.dtype.kind != "f":
            info = np.iinfo(data.dtype)
            image.attrs["valid_range"] = np.array([info.min, info.max], dtype=np.float64)
            image.attrs["signtype"] = text("signed__" if data.dtype.kind == "i" else "unsigned")
        if scaling == "global":
            image_group.create_dataset("image-min", data=np.float64(-100.0))
            image_group.create_dataset("image-max", data=np.float64(250.0))
        elif scaling == "per-slice":
            nz = data.shape[0]
            lows = image_group.create_dataset("image-min", data=-100.0 - np.arange(nz, dtype=np.float64))
            highs = image_group.create_dataset("image-max", data=250.0 + np.arange(nz, dtype=np.float64))
            lows.attrs["dimorder"] = text("zspace")
            highs.attrs["dimorder"] = text("zspace")
        else:
            # nibabel needs the variables; the valid range itself scales by 1.
            low, high = (0.0, 1.0) if data.dtype.kind == "f" else (np.iinfo(data.dtype).min, np.iinfo(data.dtype).max)
            image_group.create_dataset("image-min", data=np.float64(low))
            image_group.create_dataset("image-max", data=np.float64(high))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--shape", required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--blocks")
    p.add_argument("--scaling", choices=["global", "per-slice", "none"], default="global")
    a = p.parse_args()
    shape = [int(x) for x in a.shape.split(",")]
    dtype = np.dtype(a.dtype)
    os.makedirs(a.out, exist_ok=True)
    data = values(shape, dtype)
    write(os.path.join(a.out, "whole.mnc"), data, [0, 0, 0], a.scaling)
    if a.blocks:
        block = [int(x) for x in a.blocks.split(",")]
        directory = os.path.join(a.out, "blocks")
        os.makedirs(directory, exist_ok=True)
        grid = [-(-n // b) for n, b in zip(shape, block)]
        for index in itertools.product(*[range(g) for g in grid]):
            origin = [i * b for i, b in zip(index, block)]
            region = tuple(slice(o, min(o + b, n)) for o, b, n in zip(origin, block, shape))
            name = "_".join(map(str, index)) + ".mnc"
            write(os.path.join(directory, name), data[region], origin, a.scaling)


if __name__ == "__main__":
    main()
