"""The workloads (W1, W1-tmpfs, W1-zstd, W1-image, W1-levels, W2, split,
merge, and their --quick variants), where each one's data live (the work
directory's disk, or a tmpfs the harness mounts for W1-tmpfs), and
rechunkfs's own input for each: generated with `rechunkfs sample` and
reused while its marker matches; for a compressed workload (W1-zstd,
W1-image), the peers' compressed Zarr v3 array, which every tool reads."""
import json
import shutil
import subprocess
import time

from .common import (DTYPE, FORMAT, ITEMSIZE, MARKER, Binary, cube, die, prod, read_text, say, shape_str,
                     show_bytes, write_text)


# The compressor of the compressed workload (W1-zstd), in and out, as
# rechunkfs --compress names it: zstd at Zarr's usual default level.
ZSTD = "zstd:3"

# The tmpfs W1-tmpfs runs on: a stand-in for storage faster than the disk.
# Its pages count against a memory cgroup, so its runs are uncapped.
TMPFS_SIZE = 3 << 30


class Workload:
    def __init__(self, name, array, blocks, shape, single_file, about, storage="disk", codec=None,
                 content="splitmix", levels=False):
        self.name = name
        self.array = array
        self.blocks = blocks          # input block shape (== array: one file)
        self.shape = shape            # output block shape
        self.single_file = single_file
        self.about = about
        self.storage = storage        # "disk" (the work directory's) or "tmpfs"
        self.codec = codec            # e.g. "zstd:3": a Zarr v3 array so compressed, in and out
        self.content = content        # "splitmix" (the sample's) or "image" (bench/peers/content.py)
        self.levels = levels          # level 0 alone (keep) against a pyramid (levels) into Zarr v2

    @property
    def nbytes(self):
        return prod(self.array) * ITEMSIZE

    @property
    def largest_block_bytes(self):
        """Bytes of the larger of an input and an output block."""
        return max(prod(min(b, n) for b, n in zip(shape, self.array))
                   for shape in (self.blocks, self.shape)) * ITEMSIZE

    @property
    def input_files(self):
        return prod(-(-n // b) for n, b in zip(self.array, self.blocks))

    @property
    def output_files(self):
        return prod(-(-n // min(s, n)) for n, s in zip(self.array, self.shape))

    def label(self):
        src = "1 file" if self.single_file else f"{cube(self.blocks)} blocks"
        dst = "1 file" if all(s >= n for s, n in zip(self.shape, self.array)) else f"{cube(self.shape)}"
        where = ", on tmpfs" if self.storage == "tmpfs" else ""
        if self.codec:
            src, where = f"{cube(self.blocks)} chunks", f", {self.codec} Zarr v3 in and out"
            if self.content == "image":
                where = f", image-like, {self.codec} Zarr v3 in and out"
        if self.levels:
            where = ", Zarr v2 out, level 0 alone against --levels auto"
        return f"{self.name} ({cube(self.array)} {DTYPE}, {src} → {dst}{where})"

    def output_sizes(self):
        """The output blocks' array bytes: {bytes: how many blocks}. Each
        side has full blocks and, when the block does not divide it, one
        shorter edge block."""
        sizes = {ITEMSIZE: 1}
        for n, s in zip(self.array, self.shape):
            s = min(s, n)
            side = {s: n // s}
            if n % s:
                side[n % s] = 1
            grown = {}
            for size, count in sizes.items():
                for length, times in side.items():
                    grown[size * length] = grown.get(size * length, 0) + count * times
            sizes = grown
        return sizes

    def data_name(self):
        return f"data-{shape_str(self.array, 'x')}-in-{shape_str(self.blocks, 'x')}-{DTYPE}-{FORMAT}"


def workloads(quick):
    if quick:
        return {
            "W1": Workload("W1", [350] * 3, [35] * 3, [50] * 3, False,
                           "quick variant of W1 (350³ in 35³ blocks → 50³)"),
            "W1-tmpfs": Workload("W1-tmpfs", [350] * 3, [35] * 3, [50] * 3, False,
                                 "quick W1 on a tmpfs", storage="tmpfs"),
            "W1-zstd": Workload("W1-zstd", [350] * 3, [35] * 3, [50] * 3, False,
                                "quick W1 as zstd Zarr v3 in and out", codec=ZSTD),
            "W1-image": Workload("W1-image", [350] * 3, [35] * 3, [50] * 3, False,
                                 "quick W1-image: image-like content, zstd Zarr v3 in and out", codec=ZSTD,
                                 content="image"),
            "W1-levels": Workload("W1-levels", [350] * 3, [35] * 3, [50] * 3, False,
                                  "quick W1 into Zarr v2, level 0 alone against --levels auto", levels=True),
            "W2": Workload("W2", [350] * 3, [70] * 3, [100] * 3, False,
                           "quick variant of W2 (350³ in 70³ blocks → 100³)"),
            "split": Workload("split", [250] * 3, [250] * 3, [50] * 3, True,
                              "one 250³ HDF5 file → 50³ blocks"),
            "merge": Workload("merge", [350] * 3, [35] * 3, [350] * 3, False,
                              "350³ in 35³ blocks → one file"),
        }
    return {
        "W1": Workload("W1", [700] * 3, [35] * 3, [50] * 3, False,
                       "keep paper configuration 4 (3500³ in 175³ → 250³) with every length / 5"),
        "W1-tmpfs": Workload("W1-tmpfs", [700] * 3, [35] * 3, [50] * 3, False,
                             "W1 with its input, output and staging on a tmpfs, for storage faster than"
                             " the disk", storage="tmpfs"),
        "W1-zstd": Workload("W1-zstd", [700] * 3, [35] * 3, [50] * 3, False,
                            "W1 as a zstd-compressed Zarr v3 array (written by TensorStore) into zstd Zarr v3"
                            " chunks", codec=ZSTD),
        "W1-image": Workload("W1-image", [700] * 3, [35] * 3, [50] * 3, False,
                             "W1's geometry with image-like content (smooth structure plus noise; zstd:3 keeps"
                             " about 0.6 of it), a zstd Zarr v3 array written by TensorStore, into zstd Zarr v3"
                             " chunks", codec=ZSTD, content="image"),
        "W1-levels": Workload("W1-levels", [700] * 3, [35] * 3, [50] * 3, False,
                              "W1 into 50³ Zarr v2 chunks: `rechunk` of level 0 alone against `rechunk --levels"
                              " auto` (5 levels)", levels=True),
        "W2": Workload("W2", [1750] * 3, [175] * 3, [250] * 3, False,
                       "keep paper configuration 4 (3500³ in 175³ → 250³) with every length / 2"),
        "split": Workload("split", [350] * 3, [350] * 3, [50] * 3, True,
                          "one 350³ HDF5 file → 50³ blocks"),
        "merge": Workload("merge", [350] * 3, [35] * 3, [350] * 3, False,
                          "350³ in 35³ blocks → one file"),
    }


def choose(text, quick):
    """The workloads named by --workload (comma-separated, or all), in order, once each."""
    table = workloads(quick)
    names = list(table) if text.strip().lower() == "all" else [x.strip() for x in text.split(",") if x.strip()]
    lookup = {k.lower(): k for k in table}
    bad = [n for n in names if n.lower() not in lookup]
    if bad or not names:
        die(f"unknown workload {', '.join(bad) or '(none)'}; choose from {', '.join(table)} or all")
    return [table[lookup[n.lower()]] for n in dict.fromkeys(names)]


def out_block(w):
    return [min(s, n) for s, n in zip(w.shape, w.array)]


def storage_dir(workdir, w):
    """Where w's input, outputs and staging live: the work directory, or
    the tmpfs mounted under it for a tmpfs workload."""
    return workdir / "tmpfs" if w.storage == "tmpfs" else workdir


def data_path(workdir, w):
    return storage_dir(workdir, w) / w.data_name()


def compressed_input(workdir, w):
    """A compressed workload's input, which every tool reads: the Zarr v3
    array the peers' setup writes (bench/peers/prepare.py zarr3)."""
    codec = w.codec.replace(":", "") + ("" if w.content == "splitmix" else "-" + w.content)
    return workdir / "peers-data" / f"zarr3-{codec}-{shape_str(w.array, 'x')}-in-{shape_str(w.blocks, 'x')}-u2.zarr"


def data_ready(workdir, w):
    if w.codec:
        return True     # the peers' input, made and checked by peer_setup.Peers
    d = data_path(workdir, w)
    try:
        marker = json.loads(read_text(d / MARKER))
    except (OSError, ValueError):
        return False
    want = {"array": w.array, "blocks": w.blocks, "dtype": DTYPE, "format": FORMAT}
    if any(marker.get(k) != v for k, v in want.items()):
        return False
    files = [p for p in d.iterdir() if p.suffix == "." + FORMAT]
    return len(files) == w.input_files


def input_arg(workdir, w):
    if w.codec:
        return compressed_input(workdir, w)
    d = data_path(workdir, w)
    if w.single_file:
        return d / ("_".join("0" for _ in w.array) + "." + FORMAT)
    return d


def input_files(workdir, w):
    d = data_path(workdir, w)
    return sorted(p for p in d.iterdir() if p.suffix == "." + FORMAT)


def file_overhead(workdir, w):
    """Bytes an input file holds beyond its array bytes (its header), on
    average: what an output block file of rechunkfs's format adds too."""
    files = input_files(workdir, w)
    return max(0, (sum(p.stat().st_size for p in files) - w.nbytes) // max(1, len(files)))


def generate(workdir, w):
    d = data_path(workdir, w)
    tmp = d.with_name(d.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)
    say(f"generating {d.name}: {cube(w.array)} {DTYPE} in {w.input_files:,} file{'s' if w.input_files != 1 else ''} ({show_bytes(w.nbytes)})...")
    t0 = time.monotonic()
    r = subprocess.run([str(Binary.path), "sample", str(tmp), "--array", shape_str(w.array), "--blocks",
                        shape_str(w.blocks), "--dtype", DTYPE, "--format", FORMAT],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        die(f"rechunkfs sample failed for {d.name}:\n{r.stderr.strip()}")
    write_text(tmp / MARKER, json.dumps({"array": w.array, "blocks": w.blocks, "dtype": DTYPE,
                                         "format": FORMAT, "generated": time.time()}) + "\n")
    tmp.rename(d)
    say(f"  done in {time.monotonic() - t0:.1f} s")


def disk_need(workdir, w, tools, peers):
    """Bytes still to write for w's inputs, and the largest output at a time."""
    per_file = 8 * 1024
    inputs = 0
    if not data_ready(workdir, w):
        inputs += w.nbytes + w.input_files * per_file
    for kind in peers.needs(w) if peers else ():
        if not peers.ready(w, kind):
            inputs += w.nbytes + w.input_files * per_file
    out = w.nbytes + w.output_files * per_file
    if any(t.startswith("rechunker") for t in tools):
        out = 2 * w.nbytes + w.output_files * per_file    # target + intermediate
    return inputs, out
