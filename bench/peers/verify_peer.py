#!/usr/bin/env python3
"""Check a peer's output against the sample array voxel by voxel (the
splitmix64 content of tests/fixtures/verify.py), for the bench harness.

    verify_peer.py zarr OUT_DIR --array 350,350,350 --chunks 50,50,50
    verify_peer.py h5 OUT.h5 --array 350,350,350 --chunks 50,50,50 [--dataset /data]
    verify_peer.py pyramid OUT --array 350,350,350 --chunks 50,50,50

zarr: a Zarr v2 (.zarray) or v3 (zarr.json) array. Its metadata must say
shape = --array, chunk shape = --chunks, dtype little-endian uint16; every
chunk file must exist with exactly the chunk's bytes. Uncompressed chunks
(v2: compressor and filters null; v3: the bytes codec alone, or a
sharding_indexed codec with one such chunk per shard) are read straight
from the files, so no Zarr library is trusted; any other encoding
is decoded with TensorStore when it is importable, and said so.
h5: one HDF5 file whose dataset has shape --array and dtype <u2, read with
h5py one output chunk at a time; its layout (chunk shape, or contiguous)
is reported and must match --chunks (contiguous when --chunks is the
whole array).

pyramid: an OME-Zarr image whose levels are the arrays OUT/0, OUT/1, ...:
level 0 checked as zarr above; each level k >= 1 read with TensorStore
and compared voxel by voxel with TensorStore's mean downsample (by 2 along
each axis that shrinks) of level k-1 as written, chunk by chunk of level
k, so every level is checked back to the source through the ones above.

--content image checks against the image-like content instead of the
sample array's (content.py).

Prints one line; exit status 0 when every voxel is exact, 1 otherwise.
"""
import argparse
import itertools
import json
import os
import sys

from content import grid_of, region_bytes

ITEMSIZE = 2


class Wrong(Exception):
    pass


def little_bytes(codecs):
    return (len(codecs) == 1 and codecs[0].get("name") == "bytes"
            and codecs[0].get("configuration", {}).get("endian", "little") == "little")


def unshard(data, size, index_bytes, name):
    """The one inner chunk of a shard whose index (offset, nbytes; + crc32c) is at the end."""
    import struct
    if len(data) < index_bytes:
        raise Wrong(f"{name}: {len(data)} bytes, too short for a shard index")
    offset, nbytes = struct.unpack("<QQ", data[len(data) - index_bytes:len(data) - index_bytes + 16])
    if offset == 2 ** 64 - 1 and nbytes == 2 ** 64 - 1:
        raise Wrong(f"{name}: the shard's only chunk is empty (fill value), not written")
    if nbytes != size or offset + nbytes > len(data) - index_bytes:
        raise Wrong(f"{name}: shard index says offset {offset} nbytes {nbytes}, expected {size} bytes of data")
    return data[offset:offset + nbytes]


def zarr_layout(path):
    """(shape, chunks, chunk file path function, raw?, description) of a Zarr array."""
    v2 = os.path.join(path, ".zarray")
    v3 = os.path.join(path, "zarr.json")
    if os.path.exists(v2):
        with open(v2) as f:
            m = json.load(f)
        if m.get("dtype") != "<u2":
            raise Wrong(f"dtype {m.get('dtype')!r}, expected '<u2'")
        if m.get("order", "C") != "C":
            raise Wrong(f"order {m.get('order')!r}: only C order is read directly")
        sep = m.get("dimension_separator") or "."
        raw = m.get("compressor") is None and not m.get("filters")

        def key(index):
            if sep == "/":
                return os.path.join(path, *map(str, index))
            return os.path.join(path, sep.join(map(str, index)))
        return m["shape"], m["chunks"], key, raw, f"zarr v2, compressor {m.get('compressor')}"
    if os.path.exists(v3):
        with open(v3) as f:
            m = json.load(f)
        dt = m.get("data_type")
        if dt != "uint16":
            raise Wrong(f"data_type {dt!r}, expected uint16")
        grid = m.get("chunk_grid", {})
        if grid.get("name") != "regular":
            raise Wrong(f"chunk grid {grid.get('name')!r}, expected regular")
        chunks = grid["configuration"]["chunk_shape"]
        enc = m.get("chunk_key_encoding", {"name": "default"})
        conf = enc.get("configuration", {})
        if enc.get("name") == "v2":
            sep = conf.get("separator", ".")
            prefix = []
        else:
            sep = conf.get("separator", "/")
            prefix = ["c"]

        def key(index):
            parts = prefix + [str(i) for i in index]
            return os.path.join(path, *parts) if sep == "/" else os.path.join(path, sep.join(parts))
        codecs = m.get("codecs", [])
        raw = little_bytes(codecs)
        names = "+".join(c.get("name", "?") for c in codecs)
        if not raw and len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed":
            # One inner chunk per shard, stored plain: read it through the shard index.
            conf = codecs[0].get("configuration", {})
            index = conf.get("index_codecs", [])
            if (conf.get("chunk_shape") == chunks and little_bytes(conf.get("codecs", []))
                    and conf.get("index_location", "end") == "end" and index and index[0].get("name") == "bytes"
                    and all(c.get("name") == "crc32c" for c in index[1:])):
                raw = ("shard", 16 + 4 * (len(index) - 1))
                names = "sharding_indexed (1 plain chunk per shard)"
        return m["shape"], chunks, key, raw, f"zarr v3, codecs {names}"
    raise Wrong(f"{path} holds neither .zarray nor zarr.json")


def check_zarr(path, array, chunks, content):
    shape, got_chunks, key, raw, what = zarr_layout(path)
    if list(shape) != array:
        raise Wrong(f"shape {shape}, expected {array}")
    if list(got_chunks) != chunks:
        raise Wrong(f"chunk shape {got_chunks}, expected {chunks} ({what})")
    n = 0
    if raw:
        size = ITEMSIZE
        for c in chunks:
            size *= c
        for index in itertools.product(*[range(g) for g in grid_of(array, chunks)]):
            name = key(index)
            origin = [i * c for i, c in zip(index, chunks)]
            try:
                with open(name, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                raise Wrong(f"chunk {index} missing ({name})")
            if isinstance(raw, tuple):
                data = unshard(data, size, raw[1], name)
            if len(data) != size:
                raise Wrong(f"chunk {index}: {len(data)} bytes, expected {size}")
            # Bytes past the array in an edge chunk are unspecified: compare the inside only.
            inside = [min(c, a - o) for c, a, o in zip(chunks, array, origin)]
            if inside == chunks:
                ok = data == region_bytes(array, origin, chunks, ITEMSIZE, content)
            else:
                import numpy as np
                got = np.frombuffer(data, dtype=np.uint8).reshape(chunks + [ITEMSIZE])
                got = got[tuple(slice(0, s) for s in inside)].tobytes()
                ok = got == region_bytes(array, origin, inside, ITEMSIZE, content)
            if not ok:
                raise Wrong(f"chunk {index} ({name}): bytes differ from the source array")
            n += 1
        return f"{n} chunks of {what} read from their files: every voxel exact"
    try:
        import tensorstore as ts
    except ImportError:
        raise Wrong(f"{what}: encoded chunks and no TensorStore to decode them; cannot verify")
    driver = "zarr" if os.path.exists(os.path.join(path, ".zarray")) else "zarr3"
    t = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": path}}, read=True).result()
    for index in itertools.product(*[range(g) for g in grid_of(array, chunks)]):
        origin = [i * c for i, c in zip(index, chunks)]
        inside = [min(c, a - o) for c, a, o in zip(chunks, array, origin)]
        got = t[tuple(slice(o, o + s) for o, s in zip(origin, inside))].read().result()
        if got.dtype.str != "<u2" or got.tobytes() != region_bytes(array, origin, inside, ITEMSIZE, content):
            raise Wrong(f"chunk {index}: values differ from the source array (read with TensorStore)")
        n += 1
    return f"{n} chunks of {what} decoded with TensorStore: every voxel exact"


def check_pyramid(path, array, chunks, content):
    levels = sorted(int(p) for p in os.listdir(path) if p.isdigit() and os.path.isdir(os.path.join(path, p)))
    if not levels or levels != list(range(len(levels))):
        raise Wrong(f"{path}: levels {levels}, expected the directories 0, 1, ...")
    first = check_zarr(os.path.join(path, "0"), array, chunks, content)
    try:
        import numpy as np
        import tensorstore as ts
    except ImportError:
        raise Wrong("levels above 0 need TensorStore to check them, and it is not importable")

    def level(k):
        return ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": os.path.join(path, str(k))}},
                       read=True).result()
    n = 0
    for k in levels[1:]:
        above, this = level(k - 1), level(k)
        factors = [2 if a > b else 1 for a, b in zip(above.shape, this.shape)]
        want = ts.downsample(above, factors, "mean")
        if list(want.shape) != list(this.shape) or this.dtype != above.dtype:
            raise Wrong(f"level {k}: shape {list(this.shape)} {this.dtype}, expected {list(want.shape)} "
                        f"{above.dtype} (level {k - 1} downsampled by {factors})")
        grid = this.chunk_layout.read_chunk.shape
        for index in itertools.product(*[range(g) for g in grid_of(list(this.shape), list(grid))]):
            box = tuple(slice(i * c, min((i + 1) * c, m)) for i, c, m in zip(index, grid, this.shape))
            if not np.array_equal(this[box].read().result(), want[box].read().result()):
                raise Wrong(f"level {k}, chunk {index}: differs from TensorStore's mean downsample of level {k - 1}")
            n += 1
    return f"level 0: {first}; levels 1-{levels[-1]}: {n} chunks equal to TensorStore's mean downsample of the level above"


def check_h5(path, array, chunks, dataset, content):
    import h5py
    with h5py.File(path, "r") as f:
        if dataset not in f:
            raise Wrong(f"{path} has no dataset {dataset}")
        ds = f[dataset]
        if list(ds.shape) != array:
            raise Wrong(f"shape {ds.shape}, expected {tuple(array)}")
        if ds.dtype.str != "<u2":
            raise Wrong(f"dtype {ds.dtype.str}, expected <u2")
        whole = chunks == array
        layout = f"chunked {'x'.join(map(str, ds.chunks))}" if ds.chunks else "contiguous"
        if ds.chunks is not None and list(ds.chunks) != chunks:
            raise Wrong(f"layout {layout}, expected chunks {'x'.join(map(str, chunks))}")
        if ds.chunks is None and not whole:
            raise Wrong(f"layout contiguous, expected chunks {'x'.join(map(str, chunks))}")
        n = 0
        for index in itertools.product(*[range(g) for g in grid_of(array, chunks)]):
            origin = [i * c for i, c in zip(index, chunks)]
            inside = [min(c, a - o) for c, a, o in zip(chunks, array, origin)]
            got = ds[tuple(slice(o, o + s) for o, s in zip(origin, inside))]
            if got.tobytes() != region_bytes(array, origin, inside, ITEMSIZE, content):
                raise Wrong(f"region at {origin} shape {inside}: values differ from the source array")
            n += 1
    return f"{n} regions of HDF5 {dataset} ({layout}) read with h5py: every voxel exact"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["zarr", "h5", "pyramid"])
    p.add_argument("path")
    p.add_argument("--array", required=True)
    p.add_argument("--chunks", required=True)
    p.add_argument("--dataset", default="/data")
    p.add_argument("--content", choices=["splitmix", "image"], default="splitmix",
                   help="the values expected (content.py; default: the sample array's)")
    a = p.parse_args()
    array = [int(x) for x in a.array.split(",")]
    chunks = [min(int(x), n) for x, n in zip(a.chunks.split(","), array)]
    try:
        if a.kind == "pyramid":
            text = check_pyramid(a.path, array, chunks, a.content)
        elif a.kind == "zarr":
            text = check_zarr(a.path, array, chunks, a.content)
        else:
            text = check_h5(a.path, array, chunks, a.dataset, a.content)
    except Wrong as e:
        print(f"WRONG: {e}")
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
