"""The arrays' contents. `splitmix` is the sample array's, as `rechunkfs
sample` writes it and tests/fixtures/verify.py checks it: the element at
C-order linear index n holds the first itemsize bytes of splitmix64(n),
little-endian. zstd cannot compress it, which hides what coding costs, so
`image` is like a scan instead (uint16 only): smooth structure (a body
whose intensity falls off from its centre, two inner objects with sharp
edges, a slow ramp, a dark background) plus noise from splitmix64(n),
made with integer arithmetic alone so that every platform and numpy
computes the same values; zstd at level 3 stores the 700³ array's 35³
chunks in 0.60 of their raw bytes (0.63 at 350³), about what it does
with real scans.

Shared by the peer helpers of the bench harness (they run in the harness's own
venv, which has numpy): `region_bytes` gives the C-order bytes of any box of
the array (splitmix computed slab by slab, so that a large box never needs
more than a few hundred MiB of temporaries; image a box at once, about 100
bytes of temporaries a voxel, for boxes of a chunk's size); `padded_region_bytes` gives a whole chunk
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


def region_bytes(array, origin, shape, itemsize, content="splitmix"):
    """C-order bytes of the box (origin, shape) of the array with that content."""
    if content == "image":
        if itemsize != 2:
            raise ValueError("the image content is uint16")
        return image_region(array, origin, shape).astype("<u2").tobytes()
    if content != "splitmix":
        raise ValueError(f"unknown content {content!r}")
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


# The image: intensities of the background, the body's centre and edge, and
# the inner objects' offsets; the noise's amplitude (a triangular
# distribution of +-NOISE, from the sum of two 8-bit fields of splitmix64(n)).
BACKGROUND, CENTRE, EDGE, RAMP = 1200, 24000, 15000, 3000
INNER = (9000, -6000)
NOISE = 52


def image_region(array, origin, shape):
    """The `image` content of the box (origin, shape): uint16, C order, of a 3-D array."""
    if len(array) != 3:
        raise ValueError("the image content is 3-D")
    grids = np.meshgrid(*[np.arange(o, o + s, dtype=np.int64) for o, s in zip(origin, shape)], indexing="ij")
    n = [np.int64(x) for x in array]
    scale = np.int64(1 << 16)
    # Squared distance from the centre over the body's radii (0.45, 0.40, 0.42 of each side), in 1/65536.
    radii = [(n[0] * 45) // 100, (n[1] * 40) // 100, (n[2] * 42) // 100]
    d = sum(((2 * g - (m - 1)) ** 2 * scale) // np.maximum(4 * r * r, 1) for g, m, r in zip(grids, n, radii))
    inside = d < scale
    body = np.int64(CENTRE) - (d * np.int64(CENTRE - EDGE)) // scale
    ramp = ((grids[0] + 2 * grids[1] + 3 * grids[2]) * np.int64(RAMP)) // (n[0] + 2 * n[1] + 3 * n[2])
    value = np.where(inside, body + ramp, np.int64(BACKGROUND) + ramp // 4)
    # Two inner objects: spheres of radius 0.12 and 0.08 of the first side, off centre.
    for (fz, fy, fx, fr), delta in zip(((40, 45, 55, 12), (62, 58, 40, 8)), INNER):
        c = [(m * f) // 100 for m, f in zip(n, (fz, fy, fx))]
        r = (n[0] * fr) // 100
        d2 = sum((g - cc) ** 2 for g, cc in zip(grids, c))
        value = value + np.where(d2 < r * r, np.int64(delta), np.int64(0))
    h = splitmix64(_linear(array, origin, shape))
    a = (h & np.uint64(0xFF)).astype(np.int64)
    b = ((h >> np.uint64(8)) & np.uint64(0xFF)).astype(np.int64)
    noise = ((a + b - 255) * NOISE) // 255
    return np.clip(value + noise, 0, 0xFFFF).astype(np.uint16)


def padded_region_bytes(array, origin, chunk, itemsize, content="splitmix"):
    """Bytes of a full chunk of shape `chunk` at `origin`; parts past the array are zero."""
    inside = [max(0, min(c, n - o)) for c, n, o in zip(chunk, array, origin)]
    if inside == list(chunk):
        return region_bytes(array, origin, chunk, itemsize, content)
    out = np.zeros(list(chunk) + [itemsize], dtype=np.uint8)
    data = np.frombuffer(region_bytes(array, origin, inside, itemsize, content), dtype=np.uint8)
    out[tuple(slice(0, s) for s in inside)] = data.reshape(inside + [itemsize])
    return out.tobytes()


def grid_of(array, chunk):
    return [-(-n // c) for n, c in zip(array, chunk)]
