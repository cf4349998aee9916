"""rechunkfs from Python: plan, rechunk and mount block-file arrays.

Each function runs the ``rechunkfs`` command installed beside this package
(the same one the shell runs) and reads its ``--json`` output, so Python
sees exactly what the command does and says. A failure raises
:class:`RechunkfsError` carrying the command's own message.

>>> import rechunkfs
>>> plan = rechunkfs.plan("blocks/", shape=(256, 256, 256), mem="4G")
>>> plan.seeks.planned, plan.peak_memory_bytes
>>> rechunkfs.rechunk("blocks/", "out/", shape=(256, 256, 256), format="zarr")
>>> with rechunkfs.mount("blocks/", "view/", shape=(256, 256, 256)) as view:
...     view.wait()
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from rechunkfs._binary import binary

try:
    from importlib.metadata import version as _version

    __version__ = _version("rechunkfs")
except Exception:  # not installed (a checkout on sys.path)
    __version__ = "0+unknown"

__all__ = [
    "Plan",
    "Seeks",
    "RechunkfsError",
    "View",
    "binary",
    "mount",
    "plan",
    "rechunk",
]

PathLike = Union[str, "os.PathLike[str]"]
Shape = Union[str, Sequence[int]]
Size = Union[str, int]


class RechunkfsError(Exception):
    """A ``rechunkfs`` command failed.

    ``str(error)`` is the command's message (what is wrong, where, what to
    do), without its ``rechunkfs: error:`` prefix.
    """

    def __init__(self, message: str, command: Sequence[str], returncode: int, stderr: str):
        super().__init__(message)
        self.message = message
        #: The command line that failed.
        self.command = list(command)
        #: Its exit status.
        self.returncode = returncode
        #: Everything it printed on stderr.
        self.stderr = stderr


@dataclass(frozen=True)
class Seeks:
    """Seeks of a plan: the chosen strategy's, split into reads and writes,
    and those of keep, of the baseline and the lower bound."""

    planned: int
    read: int
    write: int
    keep: Optional[int]
    baseline: int
    lower_bound: int


@dataclass(frozen=True)
class Plan:
    """What ``rechunkfs plan --json`` says: shapes in the input's axis order,
    seeks and bytes. ``raw`` holds the whole JSON object (pyramid, parts and
    anything newer than this package)."""

    array: List[int]
    dtype: str
    elem_size: int
    axis_order: str
    input_block: List[int]
    output_block: List[int]
    input_grid: List[int]
    output_grid: List[int]
    strategy: str
    read_shape: List[int]
    read_grid: List[int]
    read_blocks: int
    read_steps: int
    write_blocks: int
    seeks: Seeks
    peak_memory_bytes: int
    mem_limit_bytes: Optional[int]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "Plan":
        seeks = value["seeks"]
        return cls(
            array=list(value["array"]),
            dtype=value["dtype"],
            elem_size=value["elem_size"],
            axis_order=value["axis_order"],
            input_block=list(value["input_block"]),
            output_block=list(value["output_block"]),
            input_grid=list(value["input_grid"]),
            output_grid=list(value["output_grid"]),
            strategy=value["strategy"],
            read_shape=list(value["read_shape"]),
            read_grid=list(value["read_grid"]),
            read_blocks=value["read_blocks"],
            read_steps=value["read_steps"],
            write_blocks=value["write_blocks"],
            seeks=Seeks(**{name: seeks.get(name) for name in Seeks.__dataclass_fields__}),
            peak_memory_bytes=value["peak_memory_bytes"],
            mem_limit_bytes=value.get("mem_limit_bytes"),
            raw=dict(value),
        )

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]


def _shape(shape: Shape) -> str:
    if isinstance(shape, str):
        return shape
    return ",".join(str(int(side)) for side in shape)


def _options(**options: Any) -> List[str]:
    """Command-line options from keyword arguments: None is left out, True
    is a flag, a sequence is a shape."""
    args: List[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            args += [flag, _shape(value)]
        else:
            args += [flag, str(value)]
    return args


def _error_of(command: Sequence[str], returncode: int, stderr: str) -> RechunkfsError:
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("rechunkfs: error: ")]
    # An argument the command line refuses: its paragraph, up to the usage.
    usage = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if errors:
        message = errors[-1][len("rechunkfs: error: ") :]
    elif usage:
        paragraph = []
        for line in lines[usage[0] :]:
            if line.startswith(("Usage:", "For more information")):
                break
            paragraph.append(line.strip())
        message = " ".join(paragraph)[len("error: ") :]
    elif lines:
        message = lines[-1]
    else:
        message = f"rechunkfs exited with status {returncode} and said nothing"
    return RechunkfsError(message, command, returncode, stderr)


def _run(args: Sequence[str], timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    command = [binary(), *args]
    done = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise _error_of(command, done.returncode, done.stderr)
    return done


def _json(args: Sequence[str], timeout: Optional[float] = None) -> Dict[str, Any]:
    done = _run(args, timeout)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as error:
        raise RechunkfsError(
            f"rechunkfs printed no JSON ({error}): {done.stdout[:200]!r}",
            [binary(), *args],
            done.returncode,
            done.stderr,
        ) from None


def _planning(
    shape: Shape,
    mem: Optional[Size],
    strategy: Optional[str],
    format: Optional[str],
    levels: Union[int, str, None],
    factors: Optional[Shape],
    downsample: Optional[str],
    compress: Optional[str],
    shard: Optional[Shape],
    dataset: Optional[str],
    array: Optional[str],
    values: Optional[str],
    threads: Optional[int] = None,
) -> List[str]:
    return ["--shape", _shape(shape)] + _options(
        mem=mem,
        strategy=strategy,
        format=format,
        levels=levels,
        factors=factors,
        downsample=downsample,
        compress=compress,
        shard=shard,
        dataset=dataset,
        array=array,
        values=values,
        threads=threads,
    )


def plan(
    input: Optional[PathLike],
    shape: Shape,
    mem: Optional[Size] = None,
    *,
    strategy: Optional[str] = None,
    format: Optional[str] = None,
    levels: Union[int, str, None] = None,
    factors: Optional[Shape] = None,
    downsample: Optional[str] = None,
    compress: Optional[str] = None,
    shard: Optional[Shape] = None,
    dataset: Optional[str] = None,
    values: Optional[str] = None,
    threads: Optional[int] = None,
    array: Optional[Shape] = None,
    blocks: Optional[Shape] = None,
    dtype: Optional[str] = None,
    parts: Optional[int] = None,
) -> Plan:
    """What rechunking ``input`` into blocks of ``shape`` within ``mem``
    bytes will do (``rechunkfs plan --json``).

    ``input`` is a directory of block files, a Zarr array, TIFF slices or
    one file; with ``input=None``, plan from ``array``, ``blocks`` and
    ``dtype`` instead. Shapes are sequences of ints or ``"256,256,256"``;
    sizes are bytes or ``"4G"``. ``threads`` is ``--threads``: the
    threads CPU work may use (default: the CPUs this process may use).
    Raises :class:`RechunkfsError`.
    """
    args = ["plan", "--json"]
    if input is not None:
        args.append(os.fspath(input))
    args += _planning(
        shape, mem, strategy, format, levels, factors, downsample, compress, shard,
        dataset, array if input is not None else None, values, threads,
    )
    if input is None:
        args += _options(array=array, blocks=blocks, dtype=dtype)
    args += _options(parts=parts)
    return Plan.from_json(_json(args))


def rechunk(
    input: PathLike,
    output: PathLike,
    shape: Shape,
    mem: Optional[Size] = None,
    *,
    strategy: Optional[str] = None,
    format: Optional[str] = None,
    levels: Union[int, str, None] = None,
    factors: Optional[Shape] = None,
    downsample: Optional[str] = None,
    compress: Optional[str] = None,
    shard: Optional[Shape] = None,
    dataset: Optional[str] = None,
    array: Optional[str] = None,
    values: Optional[str] = None,
    threads: Optional[int] = None,
    overwrite: bool = False,
    part: Optional[str] = None,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    interval: float = 0.5,
) -> Dict[str, Any]:
    """Rechunk ``input`` into real block files of ``shape`` in ``output``
    (``rechunkfs rechunk --json``) and return the final report.

    ``progress``, if given, is called every ``interval`` seconds while the
    run lasts with ``rechunkfs status --json output`` (``state``,
    ``blocks_done``, ``blocks_total``, per part), and once at the end with
    ``{"state": "complete", "blocks_done": n, "blocks_total": n}``. A
    failed run keeps its finished blocks; calling again resumes. Raises
    :class:`RechunkfsError`.
    """
    args = ["rechunk", "--json", "--quiet", os.fspath(input), os.fspath(output)]
    args += _planning(
        shape, mem, strategy, format, levels, factors, downsample, compress, shard,
        dataset, array, values, threads,
    )
    args += _options(overwrite=overwrite, part=part)
    if progress is None:
        return _json(args)
    stop = threading.Event()
    problems: List[BaseException] = []

    def poll() -> None:
        while not stop.wait(interval):
            try:
                progress(_json(["status", "--json", os.fspath(output)], timeout=30))
            except RechunkfsError:
                continue  # the job's record is not written yet
            except BaseException as error:  # the callback's own error ends the polling
                problems.append(error)
                return

    poller = threading.Thread(target=poll, name="rechunkfs-progress", daemon=True)
    poller.start()
    try:
        report = _json(args)
    finally:
        stop.set()
        poller.join()
    if problems:
        raise problems[0]
    blocks = report.get("output_blocks")
    progress({"state": "complete", "blocks_done": blocks, "blocks_total": blocks})
    return report


_SERVING = re.compile(r"^serving .* read-only at (\S+)$", re.MULTILINE)
_NEUROGLANCER = re.compile(r"^in Neuroglancer, open (?:the source )?(\S+)", re.MULTILINE)
_STATE_LINK = re.compile(r"^or the whole view: (\S+)", re.MULTILINE)
_DAEMON = re.compile(r"daemon pid (\d+)")


class View:
    """A mounted view (see :func:`mount`): a context manager that unmounts
    on exit, also when the block raised."""

    def __init__(self, path: Path, announcement: str):
        #: The mount point.
        self.path = path
        #: What ``mount`` printed.
        self.announcement = announcement
        serving = _SERVING.search(announcement)
        #: The HTTP URL with ``serve=``, else None.
        self.url: Optional[str] = serving.group(1) if serving else None
        source = _NEUROGLANCER.search(announcement)
        #: What to give Neuroglancer, with ``serve=``, else None.
        self.neuroglancer: Optional[str] = source.group(1) if source else None
        link = _STATE_LINK.search(announcement)
        #: A link opening the whole view in Neuroglancer, with ``serve=``, else None.
        self.state_link: Optional[str] = link.group(1) if link else None
        daemon = _DAEMON.search(announcement)
        #: The process id of the view's daemon.
        self.pid: Optional[int] = int(daemon.group(1)) if daemon else None
        self._mounted = True

    def status(self) -> Dict[str, Any]:
        """The view's progress now (``rechunkfs status --json``): blocks done,
        bytes, seeks against the plan, rate, errors."""
        return _json(["status", "--json", os.fspath(self.path)], timeout=60)

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Waits until every block is done and returns the final status.

        Raises :class:`RechunkfsError` if the view fails or stops first, and
        ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        return _json(["status", "--wait", "--json", os.fspath(self.path)], timeout=timeout)

    def unmount(self) -> None:
        """Unmounts the view (also when its daemon has died); a second call
        does nothing."""
        if self._mounted:
            _run(["umount", os.fspath(self.path)], timeout=120)
            self._mounted = False

    def __enter__(self) -> "View":
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def __repr__(self) -> str:
        state = "mounted" if self._mounted else "unmounted"
        return f"<rechunkfs.View {str(self.path)!r} {state}>"


def mount(
    input: PathLike,
    view: PathLike,
    shape: Shape,
    mem: Optional[Size] = None,
    *,
    strategy: Optional[str] = None,
    format: Optional[str] = None,
    levels: Union[int, str, None] = None,
    factors: Optional[Shape] = None,
    downsample: Optional[str] = None,
    shard: Optional[Shape] = None,
    dataset: Optional[str] = None,
    array: Optional[str] = None,
    values: Optional[str] = None,
    threads: Optional[int] = None,
    staging: Optional[PathLike] = None,
    rebuild: bool = False,
    allow_other: bool = False,
    in_order: bool = False,
    serve: Union[int, str, None] = None,
    cors_origin: Optional[str] = None,
) -> View:
    """Mounts a view of ``input`` in blocks of ``shape`` on the empty
    directory ``view``; the blocks fill in the background, by a daemon.

    Use it as ``with rechunkfs.mount(...) as view:``, which unmounts at the
    end. ``serve`` (a port, ``"HOST:PORT"``, or 0 for any free port) also
    serves it over HTTP: ``view.url``. Needs ``/dev/fuse``. Raises
    :class:`RechunkfsError`.
    """
    args = ["mount", os.fspath(input), os.fspath(view)]
    args += _planning(
        shape, mem, strategy, format, levels, factors, downsample, None, shard,
        dataset, array, values, threads,
    )
    args += _options(
        staging=os.fspath(staging) if staging is not None else None,
        rebuild=rebuild,
        allow_other=allow_other,
        in_order=in_order,
        serve=serve,
        cors_origin=cors_origin,
    )
    done = _run(args, timeout=600)
    return View(Path(view).absolute(), done.stderr)
