"""One benchmark run, step by step: build and stage rechunkfs, describe the
machine, install the peers, check the disk, prepare every input, set up the
memory cgroups, run every tool in seeded rounds per workload and cap
(checking each output once), and save and report the results."""
import json
import random
import shutil

from .common import MARKER, MIB, PUBLISH_DIR, die, remove_path, say, show_bytes
from .peer_setup import Peers
from .report import READER_LABELS, aggregate, cap_label, mbps, published_suffix, write_results
from .system import CacheDropper, CgroupError, machine_lines
from .tools import (H5REPACK_TOOLS, MEM_KNOB, REPEATS_FOR_SHORT_RUNS, TOOLS, Context, build, ensure_python, label,
                    plan, run_one, run_peer, stage_binary, verify)
from .view import run_view
from .workloads import data_path, data_ready, disk_need, generate, input_arg


class Session:
    """A run's options, its state between steps, and the steps themselves."""

    def __init__(self, a, wl, optional, cap, mem, workdir, cgroups):
        self.a = a
        self.wl = wl
        self.optional = optional
        self.tools = ["keep", "baseline"] + optional
        self.cap = cap
        self.mem = mem
        self.workdir = workdir
        self.out = workdir / "out"
        self.cgroups = cgroups
        self.ctx = None           # set once runs can start; views to unmount live in it
        self.peers = None
        self.dropper = None
        self.mode = "quick: smoke-test sizes" if a.quick else "full"
        self.header = f"# rechunkfs bench: rechunkfs against its peers and the disk ({self.mode})"
        self.machine = []
        self.notes = []
        self.budget_notes = []
        self.records = []
        self.checked = set()      # (workload, tool, cap) whose output was checked
        self.mems = {}            # workload -> the peers' memory budget without a cap
        self.total = 0

    def run(self):
        """Every step in order; the exit status."""
        build(self.a.no_build)
        stage_binary(self.workdir)
        self.describe_machine()
        self.setup_peers()
        self.fit_on_disk()
        self.prepare_inputs()
        self.setup_cgroups()
        for n in self.notes:
            say(f"NOTE: {n}")
        caps = self.caps()
        if not self.a.no_verify:
            ensure_python()
        self.dropper = CacheDropper()
        self.ctx = Context(self.workdir, self.cgroups, self.dropper, self.a.timeout, self.peers)
        self.memory_budgets(caps)
        self.total = len(self.wl) * len(caps) * len(self.tools)
        n = 0
        for w in self.wl:
            inp = input_arg(self.workdir, w)
            for c in caps:
                n = self.run_rounds(w, inp, c, n)
        self.final_notes()
        return self.save()

    # -- before the runs

    def describe_machine(self):
        self.machine = machine_lines(self.workdir)
        say(self.header)
        say("")
        say("Machine:")
        for line in self.machine:
            say(line)
        say("")

    def setup_peers(self):
        self.peers = Peers(self.workdir, self.optional)
        self.peers.setup()
        for t, why in self.peers.unavailable.items():
            say(f"NOTE: {label(t)}: {why}")
        if self.peers.versions:
            self.machine.append("- peers: " + "; ".join(f"{k} {v}" for k, v in self.peers.versions.items()))
            say(self.machine[-1])

    def fit_on_disk(self):
        """Keeps the workloads the disk can hold, one by one: inputs stay (cached), one output at a time."""
        free = shutil.disk_usage(self.workdir).free - 64 * MIB
        kept = []
        for w in self.wl:
            inputs, largest = disk_need(self.workdir, w, self.optional, self.peers)
            need = int((inputs + largest) * 1.05)
            msg = (f"disk for {w.name}: about {show_bytes(need)} (inputs to write {show_bytes(inputs)}, largest output"
                   f" {show_bytes(largest)}), {show_bytes(free)} free")
            if need > free:
                say(f"SKIPPED {w.name}: {msg} — NOT ENOUGH; free some space or pass --workdir on a larger disk")
                self.notes.append(f"{w.name} skipped: {msg}")
                continue
            say(msg)
            free -= inputs
            kept.append(w)
        if not kept:
            die("no workload fits on the disk (see above)")
        self.wl = kept

    def prepare_inputs(self):
        for w in self.wl:
            if not data_ready(self.workdir, w):
                generate(self.workdir, w)
            else:
                say(f"reusing {data_path(self.workdir, w).name} (marker {MARKER} matches)")
            self.peers.prepare(w)

    def setup_cgroups(self):
        if not self.cap:
            self.notes.append("capped runs skipped: --cap 0")
            return
        cap = self.cap
        try:
            self.cgroups.detect()
            self.cgroups.probe(cap)
            say(f"memory cgroup: v{self.cgroups.version}, one child of {self.cgroups.parent} per capped run, "
                f"limit {show_bytes(cap)}, --mem {show_bytes(self.mem)}")
            for w in self.wl:
                if w.nbytes <= cap:
                    self.notes.append(f"{w.name}: the array ({show_bytes(w.nbytes)}) is not larger than the cap "
                                      f"({show_bytes(cap)}), so the page cache can still hold all of it")
        except CgroupError as e:
            self.notes.append(f"capped runs SKIPPED: no usable memory cgroup ({e})")
            self.cgroups.version = None

    def caps(self):
        """The caps each workload runs under: None (uncapped) and/or the cgroup limit."""
        caps = ([] if self.a.no_uncapped else [None]) + ([self.cap] if self.cap and self.cgroups.version else [])
        if not caps:
            die("nothing to run: --no-uncapped and no capped runs")
        return caps

    def memory_budgets(self, caps):
        # What "--mem" means for a peer without a cap: what rechunkfs keep's
        # own plan holds, but never less than one input or output block,
        # which rechunker refuses to go below (keep reads a split or merge
        # in steps and holds less than that).
        for w in self.wl:
            p, _ = plan(input_arg(self.workdir, w), w, "keep", None)
            self.mems[w.name] = max((p or {}).get("peak_memory_bytes") or 1 << 30, w.largest_block_bytes)
        if caps[0] is None and self.optional:
            self.notes.append("uncapped runs: rechunkfs runs without --mem; the peers get what its keep plan holds,"
                              " or one input or output block if that is more, as their memory budget ("
                              + ", ".join(f"{k} {show_bytes(v)}" for k, v in self.mems.items()) + ")")

    # -- the runs

    def run_rounds(self, w, inp, c, n):
        """Every tool's runs for one workload and cap; returns the running configuration count."""
        capname = "no cap" if c is None else f"cap {show_bytes(c)}"
        # Every tool's first run, then every tool's second, and so
        # on, each round in its own order: the machine's drift over
        # minutes (other guests, the host's memory) and whatever a
        # run leaves to the next fall on all tools alike, not on one.
        order = random.Random(f"{w.name} {c}")
        states = []
        for tool in self.tools:
            n += 1
            states.append(self.new_state(tool, n, w, c))
        while True:
            due = [st for st in states if not st["stopped"] and st["done"] < st["runs"]]
            if not due:
                break
            order.shuffle(due)
            for st in due:
                self.run_next(w, inp, c, capname, st)
        return n

    def new_state(self, tool, n, w, c):
        """A tool's state across the rounds of one workload and cap, with its memory budget."""
        if tool in ("limit", "h5repack-whole"):
            m = None        # no memory knob: the cap alone applies
        elif c is not None:
            m = self.mem
        else:
            m = None if TOOLS[tool][1] == "rechunkfs" else (self.a.peer_mem or self.mems[w.name])
        return {"tool": tool, "n": n, "m": m, "runs": self.a.repeat, "done": 0, "stopped": False,
                "retries": self.a.oom_retries if (c is not None and tool in MEM_KNOB) else 0}

    def run_next(self, w, inp, c, capname, st):
        """The next run of one tool in one workload and cap (st: its state)."""
        tool, repeat = st["tool"], st["done"]
        found = self.attempt(w, inp, c, capname, st)
        if found is None:
            return
        rec, target, key, do_check = found
        if rec["status"] == "ok":
            self.after_success(w, c, st, rec, target, key, do_check)
        elif rec["status"] == "timeout":
            say(f"    killed after {self.a.timeout:g} s (timeout)")
        else:
            say(f"    {rec['status'].upper()} (exit {rec.get('returncode')}): {rec.get('stderr', '')}")
        if target is not None and not (tool in ("keep", "baseline") and self.a.keep_output):
            remove_path(target)
            if tool not in ("keep", "baseline"):
                shutil.rmtree(self.workdir / "out-peer", ignore_errors=True)
        if rec["status"] != "ok":
            st["stopped"] = True    # no point repeating a timeout or a failure
        st["done"] = repeat + 1

    def attempt(self, w, inp, c, capname, st):
        """Runs the tool once, again with half the budget after an OOM kill
        where it may; (record, output, check key, check now?), or None when
        the tool is unavailable."""
        tool, repeat = st["tool"], st["done"]
        while True:
            runs = st["runs"]
            m = st["m"]
            tag = f" (run {repeat + 1})" if runs > 1 else ""
            say(f"[{st['n']}/{self.total}] {w.label()}: {label(tool)}, {capname}{tag} ...")
            runtag = f"{'nocap' if c is None else 'cap'}-{repeat + 1}" + \
                (f"-budget{m >> 20}M" if m is not None and tool in MEM_KNOB else "")
            key = (w.name, tool, c)
            do_check = not self.a.no_verify and key not in self.checked
            rec, target = self.run_tool(w, inp, c, m, tool, runtag, repeat, do_check)
            rec["repeat"] = repeat
            if self.dropper.failed and "drop_caches" not in " ".join(self.notes):
                self.notes.append(f"page cache NOT dropped before runs (echo 3 > /proc/sys/vm/drop_caches "
                                  f"failed: {self.dropper.failed})")
            self.records.append(rec)
            if rec["status"] == "unavailable":
                say(f"    skipped: {rec['reason']}")
                st["stopped"] = True
                return None
            if rec["status"] == "oom" and st["retries"] and repeat == 0:
                self.lower_budget(w, c, st, rec, m, tool)
                continue
            return rec, target, key, do_check

    def run_tool(self, w, inp, c, m, tool, runtag, repeat, do_check):
        """One timed run of any tool; (record, output to check and remove, or None)."""
        if tool in ("keep", "baseline"):
            return run_one(inp, self.out, w, tool, c, m, self.ctx), self.out
        if tool == "view":
            return run_view(w, c, m, self.ctx, runtag, measure_read=(repeat == 0), check=do_check), None
        return run_peer(tool, w, c, m, self.ctx, runtag)

    def lower_budget(self, w, c, st, rec, m, tool):
        # A peer's budget is the rechunkfs --mem; if the tool needs more than
        # that on top of its interpreter, try once more with half (said in the notes).
        st["retries"] -= 1
        rec["superseded"] = True
        lower = m // 2
        say(f"    OOM-killed with a budget of {show_bytes(m)}; again with {show_bytes(lower)}")
        self.budget_notes.append(f"{w.name}, {label(tool)}, cap {show_bytes(c)}: OOM-killed with a memory budget of "
                                 f"{show_bytes(m)}, run again with {show_bytes(lower)}")
        st["m"] = lower

    def after_success(self, w, c, st, rec, target, key, do_check):
        """Asks for more runs of a short tool, prints the run, checks its output once."""
        tool = st["tool"]
        # A median of two is their mean: one slow run moves it by half
        # its excess. Short runs, the noisiest, get more.
        for seconds, at_least in REPEATS_FOR_SHORT_RUNS:
            if rec["wall_seconds"] < seconds:
                st["runs"] = max(st["runs"], at_least)
                break
        extra = ""
        if rec.get("seeks_made") is not None:
            extra += f", {rec['seeks_made']:,} seeks (planned {rec.get('seeks_planned') or 0:,})"
        if rec.get("peak_held_bytes"):
            extra += f", held {show_bytes(rec['peak_held_bytes'])}"
        if c is not None and rec.get("cgroup_peak_bytes"):
            extra += f", cgroup peak {show_bytes(rec['cgroup_peak_bytes'])}"
        say(f"    {rec['wall_seconds']:.2f} s, RSS {show_bytes(rec.get('peak_rss_bytes'))}{extra}")
        for reader, side in (rec.get("reads") or {}).items():
            say(f"    read cold ({READER_LABELS[reader]}): view {mbps(side['view']):,.0f} MB/s, staging "
                f"{mbps(side['staging']):,.0f} MB/s")
        if do_check and tool != "limit" and target is not None:
            if tool in ("keep", "baseline"):
                ok, text, secs = verify(target, w)
            else:
                ok, text, secs = self.peers.verify("h5" if tool in H5REPACK_TOOLS else "zarr", target, w)
            rec["verified"] = ok
            rec["verify_text"] = text.splitlines()[-1] if text else ""
        if rec.get("verified") is not None:
            self.checked.add(key)
            say(f"    {'verified' if rec['verified'] else 'VERIFY FAILED'}: {rec.get('verify_text')}")

    # -- after the runs

    def final_notes(self):
        notes = self.notes
        notes += self.budget_notes
        tried = {(r["workload"], r["tool"], r["cap_bytes"]) for r in self.records
                 if r["status"] == "ok" and r["tool"] != "limit"}
        unchecked = sorted({f"{k[0]} {label(k[1])}" for k in tried - self.checked})
        if self.a.no_verify:
            notes.append("outputs NOT verified (--no-verify)")
        elif unchecked:
            notes.append(f"not verified: {', '.join(unchecked)}")
        else:
            notes.append(f"every finished tool's output verified voxel by voxel ({len(self.checked)} checks: the first"
                         " finished run of each workload+tool+cap; rechunkfs outputs and the view with"
                         " tests/fixtures/verify.py, peers with bench/peers/verify_peer.py)")
        if not self.dropper.failed:
            notes.append("page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before every run")
        for r in aggregate(self.records):
            if r["status"] in ("error", "oom", "timeout", "unavailable"):
                why = r.get("reason") or r.get("stderr") or r["status"]
                notes.append(f"{r['workload']}, {label(r['tool'])}, cap {cap_label(r)}: {r['status']}: {why}"
                             + (f" (logs: {r['logs']})" if r.get("logs") else ""))

    def save(self):
        """Writes results.json, results.md and the chart; the exit status."""
        saved = {"mode": self.mode, "quick": self.a.quick, "workloads": [w.name for w in self.wl],
                 "header": self.header, "machine": self.machine, "notes": self.notes, "timeout": self.a.timeout,
                 "memory_budgets": self.mems, "runs": self.records}
        (self.workdir / "results.json").write_text(json.dumps(saved, indent=2, default=str) + "\n")
        if self.a.publish:
            write_results(saved, PUBLISH_DIR, self.workdir / "results.json", published_suffix(saved["workloads"]))
        else:
            write_results(saved, self.workdir, self.workdir / "results.json")
        wrong = [r for r in self.records if r.get("verified") is False]
        failed = [r for r in self.records if r["status"] in ("error", "oom") and TOOLS[r["tool"]][1] == "rechunkfs"
                  and r["cap_bytes"] is None]
        return 1 if wrong or failed else 0
