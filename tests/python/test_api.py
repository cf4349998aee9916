"""The Python API of the installed wheel, checked with readers rechunkfs
did not write (h5py, zarr-python, nibabel).

Run by ./scripts/test in a fresh venv holding only the wheel, pytest and
the readers: the package under test is the installed one, never the
checkout's python/ folder. Mount tests need /dev/fuse; with
RECHUNKFS_TEST_ALL=1 they fail instead of skipping without it.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import rechunkfs

ALL = os.environ.get("RECHUNKFS_TEST_ALL") == "1"


def make_h5_blocks(root: Path, shape, block, dtype="<u2", seed=1):
    """A grid of HDF5 block files written by h5py, and the whole array."""
    data = np.random.default_rng(seed).integers(0, 60000, size=shape).astype(dtype)
    root.mkdir()
    counts = [-(-s // b) for s, b in zip(shape, block)]
    for index in np.ndindex(*counts):
        box = tuple(slice(i * b, min((i + 1) * b, s)) for i, b, s in zip(index, block, shape))
        with h5py.File(root / ("_".join(map(str, index)) + ".h5"), "w") as f:
            f["data"] = data[box]
    return data


def test_the_installed_package_runs_the_installed_command():
    assert "site-packages" in rechunkfs.__file__, rechunkfs.__file__
    assert Path(rechunkfs.binary()).resolve().parent == Path(sys.executable).absolute().parent.resolve()
    version = subprocess.run(
        [sys.executable, "-m", "rechunkfs", "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.startswith("rechunkfs "), version


def test_plan_has_the_fields_of_plan_json(tmp_path):
    make_h5_blocks(tmp_path / "in", (70, 60, 50), (35, 30, 25))
    plan = rechunkfs.plan(tmp_path / "in", shape=(32, 32, 32), mem="1M")
    cli = json.loads(
        subprocess.run(
            [rechunkfs.binary(), "plan", "--json", str(tmp_path / "in"), "--shape", "32,32,32",
             "--mem", "1M"],
            capture_output=True, text=True, check=True,
        ).stdout
    )
    assert plan.array == [70, 60, 50] and plan.dtype == "<u2"
    assert plan.output_grid == [3, 2, 2] and plan.input_block == [35, 30, 25]
    assert plan.seeks.planned == cli["seeks"]["planned"] > 0
    assert plan.seeks.baseline == cli["seeks"]["baseline"]
    assert plan.peak_memory_bytes == cli["peak_memory_bytes"] <= 1 << 20
    assert plan.mem_limit_bytes == 1 << 20
    for key in cli:
        if key != "planning_seconds":
            assert plan[key] == cli[key], key


def test_plan_without_data():
    plan = rechunkfs.plan(None, shape="160,160,160", mem="4G", array=(8000,) * 3,
                          blocks=(200,) * 3, dtype="uint16")
    assert plan.array == [8000] * 3 and plan.output_block == [160] * 3
    assert plan.seeks.planned < plan.seeks.baseline


def test_an_error_carries_the_commands_message(tmp_path):
    make_h5_blocks(tmp_path / "in", (10, 10, 10), (5, 5, 5))
    with pytest.raises(rechunkfs.RechunkfsError) as caught:
        rechunkfs.plan(tmp_path / "in", shape="32,0,32")
    error = caught.value
    assert "'0' is not" in str(error) and "positive whole number" in str(error)
    assert not str(error).startswith("rechunkfs: error:")
    assert error.returncode == 1 and error.command[1] == "plan"
    with pytest.raises(rechunkfs.RechunkfsError, match="does-not-exist"):
        rechunkfs.rechunk(tmp_path / "does-not-exist", tmp_path / "out", shape=(4, 4, 4))
    # One the command line itself refuses: its words, not "try --help".
    with pytest.raises(rechunkfs.RechunkfsError) as caught:
        rechunkfs.plan(None, shape=(4, 4, 4))
    assert "required arguments were not provided: <IN>" in str(caught.value), str(caught.value)
    assert "--help" not in str(caught.value)
    with pytest.raises(rechunkfs.RechunkfsError, match="--threads"):
        rechunkfs.plan(tmp_path / "in", shape=(4, 4, 4), threads=0)


def test_rechunk_to_zarr_reads_back_exactly_with_zarr_python(tmp_path):
    import zarr

    data = make_h5_blocks(tmp_path / "in", (70, 60, 50), (35, 30, 25))
    seen = []
    report = rechunkfs.rechunk(tmp_path / "in", tmp_path / "out", shape=(32, 32, 32),
                               mem="2M", format="zarr", progress=seen.append, interval=0.01,
                               threads=2)
    assert report["output_blocks"] == 12
    assert report["seeks"]["made"] == report["seeks"]["planned"]
    out = zarr.open_array(str(tmp_path / "out"), mode="r")
    assert out.chunks == (32, 32, 32) and out.dtype == np.dtype("<u2")
    assert np.array_equal(out[...], data)
    assert seen and seen[-1] == {"state": "complete", "blocks_done": 12, "blocks_total": 12}
    assert all(0 <= s["blocks_done"] <= s["blocks_total"] == 12 for s in seen), seen


def test_rechunk_a_nifti_image_keeps_its_affine_for_nibabel(tmp_path):
    import nibabel as nib

    data = np.random.default_rng(2).integers(-3000, 3000, size=(21, 18, 13)).astype("<i2")
    affine = np.diag([0.5, 0.75, 2.0, 1.0])
    affine[:3, 3] = [-10.0, 4.5, 30.0]
    image = nib.Nifti1Image(data, affine)
    image.header.set_xyzt_units("mm", "sec")
    nib.save(image, tmp_path / "image.nii")
    rechunkfs.rechunk(tmp_path / "image.nii", tmp_path / "out", shape=(8, 8, 8), format="nii")
    block = nib.load(tmp_path / "out" / "1_1_0.nii")
    assert np.array_equal(np.asarray(block.dataobj), data[8:16, 8:16, 0:8])
    expected = affine.copy()
    expected[:3, 3] = (affine @ [8, 8, 0, 1])[:3]
    assert np.allclose(block.affine, expected)


def test_an_ome_zarr_pyramid_opens_with_its_window(tmp_path):
    import zarr

    data = make_h5_blocks(tmp_path / "in", (40, 30, 20), (20, 15, 10))
    rechunkfs.rechunk(tmp_path / "in", tmp_path / "ome", shape=(16, 16, 16), format="zarr",
                      levels="auto")
    group = zarr.open_group(str(tmp_path / "ome"), mode="r")
    window = group.attrs["omero"]["channels"][0]["window"]
    assert (window["start"], window["end"]) == (int(data.min()), int(data.max()))
    assert np.array_equal(group["0"][...], data)


def fuse_ready() -> bool:
    if os.path.exists("/dev/fuse") and (os.geteuid() == 0 or os.path.exists("/usr/bin/fusermount3")):
        return True
    if ALL:
        pytest.fail("mount tests need /dev/fuse and root or fusermount3 (package fuse3)")
    pytest.skip("no FUSE")


def test_mount_serves_exact_blocks_and_unmounts_on_exit(tmp_path):
    fuse_ready()
    data = make_h5_blocks(tmp_path / "in", (70, 60, 50), (35, 30, 25))
    view_dir = tmp_path / "view"
    view_dir.mkdir()
    with rechunkfs.mount(tmp_path / "in", view_dir, shape=(32, 32, 32), mem="2M",
                         staging=tmp_path / "staging") as view:
        assert os.path.ismount(view_dir) and view.pid
        first = view.status()
        assert first["blocks_total"] == 12
        # A block read before the view is complete waits for its data.
        with h5py.File(view_dir / "1_1_0.h5", "r") as f:
            assert np.array_equal(f["data"][...], data[32:64, 32:60, 0:32])
        final = view.wait(timeout=120)
        assert final["state"] == "complete" and final["blocks_done"] == 12
        assert final["seeks_made"] <= final["seeks_planned"] + final["on_demand_seeks"]
    assert not os.path.ismount(view_dir)
    view.unmount()  # a second unmount does nothing


def test_mount_unmounts_when_the_block_raises(tmp_path):
    fuse_ready()
    make_h5_blocks(tmp_path / "in", (20, 20, 20), (10, 10, 10))
    view_dir = tmp_path / "view"
    view_dir.mkdir()
    with pytest.raises(KeyError):
        with rechunkfs.mount(tmp_path / "in", view_dir, shape=(8, 8, 8),
                             staging=tmp_path / "staging"):
            assert os.path.ismount(view_dir)
            raise KeyError("the caller's own error")
    deadline = time.monotonic() + 30
    while os.path.ismount(view_dir):
        assert time.monotonic() < deadline, "the view stayed mounted after the exception"
        time.sleep(0.1)


def test_mount_refuses_a_view_that_is_not_empty_with_the_commands_message(tmp_path):
    fuse_ready()
    make_h5_blocks(tmp_path / "in", (20, 20, 20), (10, 10, 10))
    view_dir = tmp_path / "view"
    view_dir.mkdir()
    (view_dir / "something").write_text("x")
    with pytest.raises(rechunkfs.RechunkfsError) as caught:
        rechunkfs.mount(tmp_path / "in", view_dir, shape=(8, 8, 8))
    assert "view" in str(caught.value) and caught.value.returncode != 0
    assert not os.path.ismount(view_dir)


def test_mount_with_serve_gives_the_url_and_a_neuroglancer_link(tmp_path):
    import urllib.request

    fuse_ready()
    data = make_h5_blocks(tmp_path / "in", (20, 20, 20), (10, 10, 10))
    view_dir = tmp_path / "view"
    view_dir.mkdir()
    with rechunkfs.mount(tmp_path / "in", view_dir, shape=(8, 8, 8), format="zarr",
                         staging=tmp_path / "staging", serve=0) as view:
        assert view.url and view.url.startswith("http://127.0.0.1:"), view.announcement
        assert view.neuroglancer == "zarr://" + view.url
        assert view.state_link and "#!" in view.state_link
        with urllib.request.urlopen(view.url + "1.1.0", timeout=60) as response:
            chunk = np.frombuffer(response.read(), dtype="<u2").reshape(8, 8, 8)
        assert np.array_equal(chunk, data[8:16, 8:16, 0:8])
