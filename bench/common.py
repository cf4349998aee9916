"""Paths, units and the small helpers every part of the harness shares:
printing, sizes, shapes, ratios, files, and the rechunkfs binary in use."""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where `cargo build --release` puts the binary: under CARGO_TARGET_DIR when
# set (relative to the repository, where the build runs), else target/.
BUILT = ROOT / os.environ.get("CARGO_TARGET_DIR", "target") / "release" / "rechunkfs"
PYTHON = ROOT / "target" / "pyenv" / "bin" / "python"
VERIFY = ROOT / "tests" / "fixtures" / "verify.py"
PEERS_DIR = ROOT / "bench" / "peers"
PUBLISH_DIR = ROOT / "docs" / "bench"

DTYPE = "u16"          # as rechunkfs spells it
NUMPY_DTYPE = "<u2"    # as verify.py / numpy spell it
ITEMSIZE = 2
FORMAT = "h5"
MARKER = ".bench-data.json"
MIB = 1 << 20
HEADROOM_RSS = 64 * MIB   # the target: peak RSS <= --mem + 64 MiB


class Binary:
    """The rechunkfs executable the runs start. It is the build until
    tools.stage_binary points it at a private copy, so that a rebuild by
    someone else mid-run cannot mix binaries."""
    path = BUILT


def say(*parts):
    print(*parts, flush=True)


def die(message, code=1):
    print(f"bench: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_size(text):
    """'256M', '256MiB', '1.5G', '1048576' -> bytes (K/M/G/T are powers of 1024)."""
    t = text.strip().lower().rstrip("b").rstrip("i")
    mult = 1
    if t and t[-1] in "kmgt":
        mult = 1 << (10 * ("kmgt".index(t[-1]) + 1))
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 256M, 1G, 1048576)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is negative")
    return int(round(value * mult))


def show_bytes(n):
    if n is None:
        return "?"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} B"


def shape_str(shape, sep=","):
    return sep.join(str(x) for x in shape)


def cube(shape):
    if len(set(shape)) == 1:
        return f"{shape[0]}³"
    return shape_str(shape, "×")


def prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def ratio_text(r, bound=""):
    if r is None:
        return "?"
    if r >= 100:
        return f"{bound}{r:,.0f}×"
    if r >= 10:
        return f"{bound}{r:.1f}×"
    return f"{bound}{r:.2f}×"


def read_text(path):
    with open(path) as f:
        return f.read()


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def remove_path(p):
    p = Path(p)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def last_lines(path, n=3):
    try:
        lines = [x.strip() for x in Path(path).read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    # Progress bars redraw with \r: keep what follows the last one.
    lines = [x.split("\r")[-1] for x in lines]
    return " | ".join(lines[-n:])


def parse_json(text):
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        start = text.rfind("\n{")
        try:
            return json.loads(text[start + 1:] if start >= 0 else text[text.find("{"):])
        except ValueError:
            return None
