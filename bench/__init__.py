"""The rechunkfs benchmark harness: rechunkfs against its peers and the
disk's own limit, on the same data, from a cold page cache, with and
without a memory cap, every output checked. Run it with bench/run; the
method and the latest results are in docs/benchmarks.md.

Modules: cli (options), session (a run's steps), workloads, tools (how each
tool runs and is timed), view (the mounted view as a tool), peer_setup
(installing the peers, their inputs and checks), system (cgroups, page
cache, sync, machine facts), report (tables, results.md, the chart),
on_demand (blocks on demand), common (shared helpers). peers/ holds the
helper scripts that run as separate processes in the harness's venv."""
