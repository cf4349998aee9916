"""``python -m rechunkfs ARGS``: the ``rechunkfs`` command itself."""

import os
import sys

from rechunkfs._binary import binary

if __name__ == "__main__":
    path = binary()
    os.execv(path, [path, *sys.argv[1:]])
