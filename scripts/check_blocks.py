#!/usr/bin/env python3
"""Check a directory of output blocks against the whole image they came
from, with the readers people use: nibabel for .nii, h5py for .h5, numpy
(numpy.fromfile and rechunkfs.json) for .raw.

    check_blocks.py OUT --reference whole.nii --block 5,5,5 --format nii [--vox-offset 4096]

The reference is one file holding the whole image: .nii (read by nibabel;
shapes and block indices are then NIfTI's x, y, z), .mnc (nibabel's MINC2
reader for positions and values, h5py for raw voxels), or .h5/.npy (C
order, identity voxel-to-world: the NIfTI voxel index is the world
position). --block is in the same order as the reference's.

For every block: the raw voxels equal the reference's region, the dtype
(byte order included) is the reference's, and for .nii blocks nibabel's
affine maps each corner voxel of the block to the world position of that
voxel in the whole image (so voxel (0, 0, 0) lands at whole_affine @ [i0,
j0, k0, 1]), the qform agrees with the sform, and the scaled values agree.
"""
import argparse
import itertools
import json
import os
import sys

import numpy as np


class Reference:
    def __init__(self, path, dataset):
        self.path = path
        ext = os.path.splitext(path)[1]
        self.kind = ext[1:]
        if ext == ".nii":
            import nibabel as nib
            self.image = nib.load(path)
            self.raw = np.asanyarray(self.image.dataobj.get_unscaled())
            self.dtype = self.image.get_data_dtype()
            self.affine = self.image.affine
            self.nifti_order = True
        elif ext == ".mnc":
            import h5py
            import nibabel as nib
            self.image = nib.load(path)
            with h5py.File(path, "r") as f:
                self.raw = f["/minc-2.0/image/0/image"][...]
            self.dtype = self.raw.dtype
            self.affine = self.image.affine
            self.nifti_order = False
        elif ext == ".h5":
            import h5py
            with h5py.File(path, "r") as f:
                self.raw = f[dataset][...]
            self.dtype = self.raw.dtype
            self.image = None
            self.nifti_order = False
        elif ext == ".npy":
            self.raw = np.load(path)
            self.dtype = self.raw.dtype
            self.image = None
            self.nifti_order = False
        else:
            sys.exit(f"{path}: unknown reference type")
        self.shape = list(self.raw.shape)

    def world(self, index):
        """World position of the reference voxel at `index` (its own order)."""
        index = np.asarray(index, dtype=np.float64)
        if self.kind in ("nii", "mnc"):
            return (self.affine @ np.append(index[:3], 1.0))[:3]
        # Identity in NIfTI order: x is the last C index.
        nifti = index[::-1][:3]
        return np.pad(nifti, (0, 3 - len(nifti)))

    def scaled(self, region):
        if self.image is None:
            return None
        return np.asanyarray(self.image.dataobj[region], dtype=np.float64)


def to_user(array, user_nifti_order, array_nifti_order):
    """`array` (in NIfTI order if array_nifti_order, else C order) in the user's order."""
    return array if user_nifti_order == array_nifti_order else array.T


def check_nifti(path, ref, origin, shape, vox_offset):
    import nibabel as nib
    image = nib.load(path)
    # nibabel resets the header it hands out; the proxy keeps the offset read.
    if vox_offset is not None and image.dataobj.offset != vox_offset:
        return f"vox_offset {image.dataobj.offset}, expected {vox_offset}"
    raw = np.asanyarray(image.dataobj.get_unscaled())
    if image.get_data_dtype().str != ref.dtype.str:
        return f"dtype {image.get_data_dtype().str}, expected {ref.dtype.str}"
    data = to_user(raw, ref.nifti_order, True)
    if list(data.shape) != shape:
        return f"shape {data.shape} in the reference's order, expected {tuple(shape)}"
    region = tuple(slice(o, o + s) for o, s in zip(origin, shape))
    if not np.array_equal(data, ref.raw[region]):
        return "voxels differ from the reference region"
    # Every corner of the block lands where that voxel is in the whole.
    nifti_shape = raw.shape
    for corner in itertools.product(*[(0, n - 1) for n in nifti_shape[:3]]):
        corner = list(corner)
        seen = (image.affine @ np.array(corner + [0] * (3 - len(corner)) + [1.0]))[:3]
        offset = corner + [0] * (len(nifti_shape) - len(corner))
        in_ref = np.array(origin) + np.array(offset if ref.nifti_order else offset[::-1])
        expected = ref.world(in_ref)
        if not np.allclose(seen, expected, atol=1e-3):
            return f"voxel {corner} maps to {seen}, but the whole image has it at {expected}"
    if image.header["sform_code"] != 1:
        return f"sform_code {image.header['sform_code']}"
    if image.header["qform_code"] and not np.allclose(image.header.get_qform(), image.affine, atol=1e-4):
        return "qform disagrees with sform"
    expected_scaled = ref.scaled(region)
    if expected_scaled is not None:
        got = to_user(np.asanyarray(image.dataobj, dtype=np.float64), ref.nifti_order, True)
        if not np.allclose(got, expected_scaled, rtol=1e-5, atol=1e-4):
            return "scaled values differ from the reference's"
    return None


def check_h5(path, ref, origin, shape, dataset):
    import h5py
    with h5py.File(path, "r") as f:
        data = f[dataset][...]
    if data.dtype.str != ref.dtype.str:
        return f"dtype {data.dtype.str}, expected {ref.dtype.str}"
    data = to_user(data, ref.nifti_order, False)
    region = tuple(slice(o, o + s) for o, s in zip(origin, shape))
    if list(data.shape) != shape or not np.array_equal(data, ref.raw[region]):
        return "voxels differ from the reference region"
    return None


def check_raw(path, ref, origin, shape, meta):
    data = np.fromfile(path, dtype=np.dtype(meta["dtype"]))
    if data.size != int(np.prod(shape)):
        return f"{data.size} voxels, expected {int(np.prod(shape))}"
    data = data.reshape(shape, order=meta["numpy_order"])
    region = tuple(slice(o, o + s) for o, s in zip(origin, shape))
    if data.dtype.str != ref.dtype.str or not np.array_equal(data, ref.raw[region]):
        return "voxels differ from the reference region"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--reference", required=True)
    p.add_argument("--block", help="block shape; for raw, rechunkfs.json's is used")
    p.add_argument("--format", choices=["nii", "h5", "raw"], required=True)
    p.add_argument("--dataset", default="/data")
    p.add_argument("--vox-offset", type=int)
    a = p.parse_args()
    ref = Reference(a.reference, a.dataset)
    meta = None
    if a.format == "raw" or os.path.exists(os.path.join(a.dir, "rechunkfs.json")):
        with open(os.path.join(a.dir, "rechunkfs.json")) as f:
            meta = json.load(f)
        if meta["array_shape"] != ref.shape:
            sys.exit(f"rechunkfs.json: array_shape {meta['array_shape']}, expected {ref.shape}")
        if meta["dtype"] != ref.dtype.str:
            sys.exit(f"rechunkfs.json: dtype {meta['dtype']}, expected {ref.dtype.str}")
        expected_order = "nifti" if ref.nifti_order else "c"
        if meta["axis_order"] != expected_order:
            sys.exit(f"rechunkfs.json: axis_order {meta['axis_order']}, expected {expected_order}")
    block = [int(x) for x in a.block.split(",")] if a.block else meta["block_shape"]
    block = [min(b, n) for b, n in zip(block, ref.shape)]
    grid = [-(-n // b) for n, b in zip(ref.shape, block)]
    expected_names = set()
    for index in itertools.product(*[range(g) for g in grid]):
        origin = [i * b for i, b in zip(index, block)]
        shape = [min(b, n - o) for b, n, o in zip(block, ref.shape, origin)]
        name = "_".join(map(str, index)) + "." + a.format
        expected_names.add(name)
        path = os.path.join(a.dir, name)
        if a.format == "nii":
            problem = check_nifti(path, ref, origin, shape, a.vox_offset)
        elif a.format == "h5":
            problem = check_h5(path, ref, origin, shape, a.dataset)
        else:
            problem = check_raw(path, ref, origin, shape, meta)
        if problem:
            sys.exit(f"{path}: {problem}")
    present = {n for n in os.listdir(a.dir) if not n.startswith(".") and n != "rechunkfs.json"}
    if present != expected_names:
        sys.exit(f"{a.dir}: holds {sorted(present ^ expected_names)} unexpectedly (or lacks them)")
    reader = {"nii": "nibabel", "h5": "h5py", "raw": "numpy.fromfile"}[a.format]
    print(f"checked {len(expected_names)} blocks in {a.dir} with {reader}: voxels exact, placed right")


if __name__ == "__main__":
    main()
