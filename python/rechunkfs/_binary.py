"""Where the ``rechunkfs`` command is: installed with this package (the
wheel puts it in the environment's scripts directory), or named by
``$RECHUNKFS_BIN`` (a checkout's ``target/release/rechunkfs``)."""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import lru_cache


@lru_cache(maxsize=None)
def binary() -> str:
    """The path of the ``rechunkfs`` command this package runs."""
    named = os.environ.get("RECHUNKFS_BIN")
    if named:
        return named
    # The scripts directory of the scheme this package was installed by
    # (a venv, the system, or `pip install --user`), then beside Python.
    candidates = [
        os.path.join(path, "rechunkfs")
        for path in (
            sysconfig.get_path("scripts"),
            sysconfig.get_path("scripts", f"{os.name}_user"),
            os.path.dirname(sys.executable),
        )
    ]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "the rechunkfs command is not installed beside this Python package (looked in "
        + ", ".join(candidates)
        + "): reinstall the wheel, or set RECHUNKFS_BIN to the binary"
    )
