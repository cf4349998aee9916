"""The sample array's content, as `rechunkfs sample` writes it and
tests/fixtures/verify.py checks it: the element at C-order linear index n holds the
first itemsize bytes of splitmix64(n), little-endian.

Shared by the peer helpers of the bench harness (they run in the harness's own
venv, which has numpy): `region_bytes` gives the C-order bytes of any box of
the array, computed slab by slab so that a large box never needs more than
a few hundred MiB of temporaries; `padded_region_bytes` gives a whole chunk
whose box may overhang the array (Zarr and HDF5 store edge chunks full
size), the overhang filled with zeros.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
from verify import splitmix64  # noqa: E402  (tests/fixtures/verify.py: the one definition)

SLAB_ELEMENTS = 1 << 22   # elements per slab of temporaries (~32 MiB of uint64 each)


def strides_of(array):
    out = [1] * len(array)
    for d in range(len(array) - 2, -1, -1):
        out[d] = out[d + 1] * array[d + 1]
    return out


def _linear(array, origin, shape):
    """uint64 C-order linear indices (into the array) of the box origin/shape."""
    strides = strides_of(array)
    n = len(shape)
    lin = np.zeros([1] * n, dtype=np.uint64)
    for d in range(n):
        axis = (np.arange(origin[d], origin[d] + shape[d], dtype=np.uint64) * np.uint64(strides[d]))
        lin = lin + axis.reshape([shape[d] if e == d else 1 for e in range(n)])
    return lin


def region_bytes(array, origin, shape, itemsize):
    """C-order bytes of the box (origin, shape) of the sample array."""
    if any(s == 0 for s in shape):
        return b""
    per_row = 1
    for s in shape[1:]:
        per_row *= s
    step = max(1, SLAB_ELEMENTS // max(per_row, 1))
    parts = []
    for start in range(0, shape[0], step):
        rows = min(step, shape[0] - start)
        o = [origin[0] + start] + list(origin[1:])
        s = [rows] + list(shape[1:])
        words = splitmix64(_linear(array, o, s)).astype("<u8")
        parts.append(words.view(np.uint8).reshape(-1, 8)[:, :itemsize].tobytes())
    return b"".join(parts)


def padded_region_bytes(array, origin, chunk, itemsize):
    """Bytes of a full chunk of shape `chunk` at `origin`; parts past the array are zero."""
    inside = [max(0, min(c, n - o)) for c, n, o in zip(chunk, array, origin)]
    if inside == list(chunk):
        return region_bytes(array, origin, chunk, itemsize)
    out = np.zeros(list(chunk) + [itemsize], dtype=np.uint8)
    data = np.frombuffer(region_bytes(array, origin, inside, itemsize), dtype=np.uint8)
    out[tuple(slice(0, s) for s in inside)] = data.reshape(inside + [itemsize])
    return out.tobytes()


def grid_of(array, chunk):
    return [-(-n // c) for n, c in zip(array, chunk)]
