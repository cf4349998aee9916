"""The peers' side of a run: installing them on first use (a venv of the
harness's own, zarrs_tools with cargo install, h5repack from Debian),
writing their inputs from the same content, checking their outputs, and
remembering why a tool is unavailable."""
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import (MARKER, NUMPY_DTYPE, PEERS_DIR, cube, last_lines, read_text, say, shape_str, show_bytes,
                     write_text)
from .tools import H5REPACK_TOOLS, ZARR_TOOLS
from .workloads import compressed_input, input_arg, out_block

# pip packages per tool (into WORKDIR/venv) and the import that proves them.
PIP = {
    "base": (["numpy", "h5py"], "import numpy, h5py"),
    "tensorstore": (["tensorstore"], "import tensorstore"),
    "rechunker-python": (["rechunker"], "import rechunker, zarr"),
    "rechunker-dask": (["rechunker", "dask[array]"], "import rechunker, zarr, dask.array"),
}


class Peers:
    """Installs the peers on first use and prepares their inputs; remembers
    why a tool is unavailable."""

    def __init__(self, workdir, wanted, compressed=False):
        self.workdir = workdir
        self.wanted = wanted
        # A compressed workload's input is written by TensorStore, for every
        # tool; a pyramid's levels are checked with TensorStore's downsample.
        self.compressed = compressed
        self.venv = workdir / "venv"
        self.vpy = self.venv / "bin" / "python"
        self.cargo_root = workdir / "cargo-tools"
        self.zarrs_bin = self.cargo_root / "bin" / "zarrs_reencode"
        self.h5repack = None
        self.unavailable = {}     # tool -> reason
        self.versions = {}        # label -> version text
        self.prepared = {}        # (workload name, kind) -> path or reason (str starting "!")

    # -- the venv
    def _pip(self, group):
        pkgs, probe = PIP[group]
        if subprocess.run([str(self.vpy), "-c", probe], capture_output=True).returncode == 0:
            return None
        say(f"installing {' '.join(pkgs)} into {self.venv} (pip)...")
        log = self.workdir / "logs" / f"pip-{group}.log"
        with open(log, "w") as f:
            r = subprocess.run([str(self.vpy), "-m", "pip", "install", "--disable-pip-version-check", *pkgs],
                               stdout=f, stderr=subprocess.STDOUT)
        if r.returncode != 0 or subprocess.run([str(self.vpy), "-c", probe], capture_output=True).returncode:
            return f"pip install {' '.join(pkgs)} failed: {last_lines(log, 1)} (log: {log})"
        return None

    def setup_venv(self):
        needs_venv = [t for t in self.wanted if t in PIP or t in ZARR_TOOLS or t in H5REPACK_TOOLS]
        if not needs_venv and not self.compressed:
            return
        if not self.vpy.exists():
            say(f"creating the harness's venv {self.venv} ...")
            r = subprocess.run([sys.executable, "-m", "venv", str(self.venv)], capture_output=True, text=True)
            if r.returncode != 0:
                why = f"cannot create a venv with {sys.executable}: {(r.stderr or r.stdout).strip()[-300:]}"
                for t in needs_venv:
                    self.unavailable[t] = f"not installable: {why}"
                return
        why = self._pip("base")
        if why:
            for t in needs_venv:
                self.unavailable[t] = (f"not installable: {why}" if t not in H5REPACK_TOOLS else
                                       f"cannot prepare its input or check its output without h5py: {why}")
            return
        for t in self.wanted:
            if t in PIP:
                why = self._pip(t)
                if why:
                    self.unavailable[t] = f"not installable: {why}"
        if self.compressed and "tensorstore" not in self.wanted:
            why = self._pip("tensorstore")
            if why:
                say(f"NOTE: the compressed workload's input cannot be written without TensorStore: {why}")
        self.note_versions()

    def note_versions(self):
        """The versions of the venv's packages, for the report's machine lines."""
        code = ("import json, importlib.metadata as m\n"
                "out = {}\n"
                "for p in ['numpy', 'h5py', 'tensorstore', 'rechunker', 'zarr', 'dask']:\n"
                "    try:\n        out[p] = m.version(p)\n    except Exception:\n        pass\n"
                "print(json.dumps(out))")
        r = subprocess.run([str(self.vpy), "-c", code], capture_output=True, text=True)
        try:
            v = json.loads(r.stdout)
        except ValueError:
            v = {}
        if "tensorstore" in self.wanted and "tensorstore" in v:
            self.versions["TensorStore"] = v["tensorstore"]
        if any(t.startswith("rechunker") for t in self.wanted) and "rechunker" in v:
            extra = f" (zarr {v.get('zarr', '?')}" + (f", dask {v['dask']})" if "dask" in v else ")")
            self.versions["rechunker"] = v["rechunker"] + extra
        self.versions["venv"] = f"{self.venv} ({platform.python_version()}; numpy {v.get('numpy', '?')}, h5py {v.get('h5py', '?')})"

    # -- zarrs_tools
    def setup_zarrs(self):
        if "zarrs" not in self.wanted:
            return
        if not self.zarrs_bin.exists():
            # nice: a build of minutes on a machine that may be shared.
            cmd = ["nice", "cargo", "install", "zarrs_tools", "--root", str(self.cargo_root), "--bin",
                   "zarrs_reencode", "--locked"]
            say(f"installing zarrs_reencode: {' '.join(cmd)} (takes minutes on 2 cores)...")
            log = self.workdir / "logs" / "cargo-install-zarrs_tools.log"
            env = dict(os.environ)
            env.pop("CARGO_TARGET_DIR", None)     # cargo install builds in a temporary dir of its own
            try:
                with open(log, "w") as f:
                    r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
            except FileNotFoundError:
                self.unavailable["zarrs"] = "not installable: cargo is not on PATH"
                return
            if r.returncode != 0 or not self.zarrs_bin.exists():
                errs = [x for x in Path(log).read_text(errors="replace").splitlines() if x.startswith("error")]
                self.unavailable["zarrs"] = (f"not installable: cargo install zarrs_tools failed: "
                                             f"{errs[0] if errs else last_lines(log, 1)} (log: {log})")
                return
        r = subprocess.run([str(self.zarrs_bin), "--version"], capture_output=True, text=True)
        self.versions["zarrs_reencode"] = (r.stdout.strip().split(" ", 1)[-1] or "?") if r.returncode == 0 else "?"

    # -- h5repack
    def setup_h5repack(self):
        if not any(t in self.wanted for t in H5REPACK_TOOLS):
            return
        self.h5repack = shutil.which("h5repack")
        if not self.h5repack and os.geteuid() == 0 and shutil.which("apt-get"):
            say("h5repack missing: apt-get install -y hdf5-tools ...")
            subprocess.run(["apt-get", "install", "-y", "-q", "hdf5-tools"], capture_output=True)
            self.h5repack = shutil.which("h5repack")
        if not self.h5repack:
            for t in H5REPACK_TOOLS:
                self.unavailable[t] = "not installed: h5repack is not on PATH (Debian package hdf5-tools)"
            return
        r = subprocess.run([self.h5repack, "-V"], capture_output=True, text=True)
        self.versions["h5repack"] = (r.stdout.strip().split()[-1] if r.stdout.strip() else "?")

    def setup(self):
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.setup_venv()
        self.setup_zarrs()
        self.setup_h5repack()

    # -- inputs
    def zarr_path(self, w):
        if w.codec:
            return compressed_input(self.workdir, w)
        return self.workdir / "peers-data" / f"zarr-{shape_str(w.array, 'x')}-in-{shape_str(w.blocks, 'x')}-u2.zarr"

    def h5_path(self, w):
        if w.single_file:
            return None     # the sample's own file: one contiguous /data, chunk = the whole array
        return self.workdir / "peers-data" / f"h5-{shape_str(w.array, 'x')}-chunks-{shape_str(w.blocks, 'x')}-u2.h5"

    def zarr_kind(self, w):
        """The kind of Zarr input w's Zarr tools read: 'zarr3' (compressed) or 'zarr'."""
        return "zarr3" if w.codec else "zarr"

    def needs(self, w):
        """Which peer inputs this workload needs: subset of {'zarr', 'zarr3', 'h5'}.
        A compressed workload's Zarr v3 input is every tool's, rechunkfs's too;
        a pyramid workload runs rechunkfs alone."""
        if w.codec:
            return {"zarr3"}
        if w.levels:
            return set()
        out = set()
        if any(t in self.wanted and t not in self.unavailable for t in ZARR_TOOLS):
            out.add("zarr")
        if any(t in self.wanted and t not in self.unavailable for t in H5REPACK_TOOLS) and not w.single_file:
            out.add("h5")
        return out

    def _marker(self, path):
        return path.parent / (path.name + MARKER)

    def ready(self, w, kind):
        path = self.h5_path(w) if kind == "h5" else self.zarr_path(w)
        try:
            m = json.loads(read_text(self._marker(path)))
        except (OSError, ValueError):
            return False
        return (m.get("array") == w.array and m.get("chunks") == w.blocks and m.get("codec") == w.codec
                and m.get("content", "splitmix") == w.content and path.exists())

    def prepare(self, w):
        for kind in sorted(self.needs(w)):
            path = self.h5_path(w) if kind == "h5" else self.zarr_path(w)
            if self.ready(w, kind):
                say(f"reusing {path.name} (marker matches)")
                self.prepared[(w.name, kind)] = path
                continue
            path.parent.mkdir(exist_ok=True)
            what = {"zarr": "Zarr v2 array", "h5": "chunked HDF5 file",
                    "zarr3": f"{w.codec} Zarr v3 array written by TensorStore"}[kind]
            if w.content != "splitmix":
                what += f", {w.content} content"
            say(f"writing the peers' input {path.name}: a {what}, chunks {cube(w.blocks)} ({show_bytes(w.nbytes)})...")
            t0 = time.monotonic()
            log = self.workdir / "logs" / f"prepare-{path.name}.log"
            codec = ["--codec", w.codec] if w.codec else []
            with open(log, "w") as f:
                r = subprocess.run([str(self.vpy), str(PEERS_DIR / "prepare.py"), kind, str(path),
                                    "--array", shape_str(w.array), "--chunks", shape_str(w.blocks), *codec,
                                    "--content", w.content],
                                   stdout=f, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                self.prepared[(w.name, kind)] = f"!input not prepared: {last_lines(log, 1)} (log: {log})"
                say(f"  FAILED: {last_lines(log, 2)}")
                continue
            write_text(self._marker(path), json.dumps({"array": w.array, "chunks": w.blocks, "dtype": NUMPY_DTYPE,
                                                       "codec": w.codec, "content": w.content,
                                                       "made": time.time()}) + "\n")
            self.prepared[(w.name, kind)] = path
            say(f"  done in {time.monotonic() - t0:.1f} s")
            if w.codec:
                say(f"  {stored_ratio(path, w.nbytes)}")

    def input_of(self, w, tool):
        """(path, None) or (None, reason)."""
        if tool in self.unavailable:
            return None, self.unavailable[tool]
        if tool in ZARR_TOOLS:
            got = self.prepared.get((w.name, self.zarr_kind(w)))
        elif tool in H5REPACK_TOOLS:
            if w.single_file:
                return input_arg(self.workdir, w), None
            got = self.prepared.get((w.name, "h5"))
        else:
            return None, None
        if got is None:
            return None, "input not prepared"
        if isinstance(got, str):
            return None, got[1:]
        return got, None

    def verify(self, kind, path, w):
        cmd = [str(self.vpy), str(PEERS_DIR / "verify_peer.py"), kind, str(path), "--array", shape_str(w.array),
               "--chunks", shape_str(out_block(w)), "--content", w.content]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        return r.returncode == 0, (r.stdout + r.stderr).strip(), time.monotonic() - t0



def stored_ratio(path, nbytes):
    """How much of the array's raw bytes a compressed array's chunk files hold."""
    stored = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return f"stored in {show_bytes(stored)}, {stored / max(nbytes, 1):.2f} of the raw {show_bytes(nbytes)}"
