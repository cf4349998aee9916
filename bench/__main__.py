"""Entry point of `python3 -m bench` (what bench/run starts): the benchmark,
or with `on-demand` first, the blocks-on-demand measurement, or with
`parts` first, a job in parts against one run."""
import sys

if sys.argv[1:2] == ["on-demand"]:
    from .on_demand import main as on_demand
    sys.exit(on_demand(sys.argv[2:]))
if sys.argv[1:2] == ["parts"]:
    from .parts import main as parts
    sys.exit(parts(sys.argv[2:]))

from .cli import main  # noqa: E402  (only the benchmark needs it)

sys.exit(main())
