"""The harness's warm start, shared by its Python helpers (the limit,
TensorStore, rechunker): the interpreter starts and imports what it needs
before the harness drops the page cache and starts its clock, so that no
tool's time holds an interpreter's cold start-up. Standard library only."""
import os
import sys


def ready():
    """Says on the pipe the harness names in BENCH_READY_FD that the imports
    are done, then waits for the harness's go on stdin, which it sends once
    the page cache is dropped and its clock runs. Run by hand, without
    BENCH_READY_FD, it returns at once."""
    fd = os.environ.pop("BENCH_READY_FD", None)
    if fd is None:
        return
    os.write(int(fd), b"r")
    os.close(int(fd))
    sys.stdin.buffer.read(1)
