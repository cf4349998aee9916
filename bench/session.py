"""One benchmark run, step by step: build and stage rechunkfs, describe the
machine, install the peers, check the disk, prepare every input, set up the
memory cgroups and every tool's memory budget, run every tool in seeded
rounds per workload and cap, on each set of cores asked for (a tmpfs
workload inside a tmpfs mounted for its rounds alone), check every run's
output, and save and report the results."""
import json
import os
import random
import shutil

from .common import MARKER, MIB, PUBLISH_DIR, die, remove_path, say, show_bytes
from .peer_setup import Peers
from .report import READER_LABELS, aggregate, cap_label, cores_label, mbps, published_suffix, write_results
from .system import CacheDropper, CgroupError, machine_lines, mount_tmpfs, umount_tmpfs
from .tools import (COMPRESSED_TOOLS, H5REPACK_TOOLS, LEVELS_TOOLS, MEM_KNOB, NOT_COMPRESSED, REPEATS_FOR_SHORT_RUNS, TOOLS,
                    Context, build, check_limit, ensure_python, label, new_record, plan, run_one, run_peer,
                    stage_binary, verify)
from .view import run_view
from .workloads import TMPFS_SIZE, data_path, data_ready, disk_need, generate, input_arg, storage_dir


class Session:
    """A run's options, its state between steps, and the steps themselves."""

    def __init__(self, a, wl, optional, cap, mem, workdir, cgroups, cores=None):
        self.a = a
        self.cores = cores or [None]      # the core sets each tool runs on: None = not pinned
        self.wl = wl
        self.optional = optional
        self.tools = ["keep", "baseline"] + optional
        self.cap = cap
        self.mem = mem
        self.workdir = workdir
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
        self.mems = {}            # workload -> every tool's memory budget without a cap
        self.tmpfs = None         # the tmpfs mounted for a tmpfs workload's rounds
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
        self.total = sum(len(self.caps_of(w, caps)) * len(self.tools_of(w)) for w in self.wl) * len(self.cores)
        n = 0
        for w in self.wl:
            if not self.caps_of(w, caps):
                self.notes.append(f"{w.name} skipped: it runs uncapped only, and --no-uncapped was given")
                continue
            if not self.enter_storage(w):
                continue
            try:
                inp = input_arg(self.workdir, w)
                for c in self.caps_of(w, caps):
                    n = self.run_rounds(w, inp, c, n)
            finally:
                self.leave_storage(w)
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
        self.peers = Peers(self.workdir, self.optional, compressed=any(w.codec or w.levels for w in self.wl))
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
            if w.storage == "tmpfs":
                kept.append(w)      # its own tmpfs: enter_storage checks it
                continue
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
        """The inputs on disk, made or reused; a tmpfs workload's are made in enter_storage."""
        for w in self.wl:
            if w.storage == "tmpfs":
                continue
            if w.codec:
                pass        # its input is the peers' compressed Zarr v3 array, for every tool
            elif not data_ready(self.workdir, w):
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

    def enter_storage(self, w):
        """Mounts a tmpfs workload's tmpfs and writes its input there; False
        (said in the notes) when it cannot. Disk workloads are ready."""
        if w.storage != "tmpfs":
            return True
        need = 2 * (w.nbytes + w.input_files * 8192)      # input + one output or staging
        why = None if need <= TMPFS_SIZE else f"needs about {show_bytes(need)}, more than the tmpfs's " \
                                               f"{show_bytes(TMPFS_SIZE)}"
        path = storage_dir(self.workdir, w)
        why = why or mount_tmpfs(path, TMPFS_SIZE)
        if why:
            say(f"SKIPPED {w.name}: cannot use a tmpfs at {path}: {why}")
            self.notes.append(f"{w.name} skipped: no tmpfs at {path} ({why})")
            return False
        self.tmpfs = path
        say(f"tmpfs of {show_bytes(TMPFS_SIZE)} mounted at {path} for {w.name}")
        generate(self.workdir, w)
        self.budget_of(w)
        return True

    def leave_storage(self, w):
        """Unmounts a tmpfs workload's tmpfs, which frees its pages before the next workload."""
        if w.storage == "tmpfs":
            self.close_tmpfs()

    def close_tmpfs(self):
        if self.tmpfs is not None:
            why = umount_tmpfs(self.tmpfs)
            if why:
                say(f"warning: could not unmount the tmpfs at {self.tmpfs}: {why}")
            self.tmpfs = None

    def tools_of(self, w):
        """The tools w runs: a pyramid workload, level 0 alone against the pyramid; the others, every tool."""
        return list(LEVELS_TOOLS) if w.levels else self.tools

    def caps_of(self, w, caps):
        """The caps w runs under: a tmpfs workload runs uncapped only, since
        its files' pages would count against the cgroup."""
        return [c for c in caps if c is None] if w.storage == "tmpfs" else caps

    def caps(self):
        """The caps each workload runs under: None (uncapped) and/or the cgroup limit."""
        caps = ([] if self.a.no_uncapped else [None]) + ([self.cap] if self.cap and self.cgroups.version else [])
        if not caps:
            die("nothing to run: --no-uncapped and no capped runs")
        return caps

    def memory_budgets(self, caps):
        """Every tool's memory budget in the uncapped runs of each disk
        workload (a tmpfs workload's once its input exists)."""
        for w in self.wl:
            if w.storage != "tmpfs":
                self.budget_of(w)
        if caps[0] is None:
            say("uncapped runs: every tool's memory budget is --budget, or what rechunkfs keep's plan holds"
                " without one (at least one input or output block)")

    def budget_of(self, w):
        # What rechunkfs keep's own plan holds without --mem, but never less
        # than one input or output block, which rechunker refuses to go
        # below (keep reads a split or merge in steps and holds less than
        # that). rechunkfs then gets it as --mem too, so that no tool has
        # more memory to work in than another.
        if self.a.budget:
            self.mems[w.name] = self.a.budget
            return
        # A pyramid workload plans the pyramid: level 0 alone then gets
        # the memory the levels run holds, which its own plan leaves unused.
        p, _ = plan(input_arg(self.workdir, w), w, "levels" if w.levels else "keep", None)
        held = (p or {}).get("peak_memory_bytes") or 1 << 30
        held += ((p or {}).get("pyramid") or {}).get("peak_memory_bytes") or 0
        self.mems[w.name] = max(held, w.largest_block_bytes)

    # -- the runs

    def run_rounds(self, w, inp, c, n):
        """Every tool's runs for one workload and cap, on every core set;
        returns the running configuration count."""
        capname = "no cap" if c is None else f"cap {show_bytes(c)}"
        # Every tool's first run, then every tool's second, and so
        # on, each round in its own order: the machine's drift over
        # minutes (other guests, the host's memory) and whatever a
        # run leaves to the next fall on all tools alike, not on one.
        # A tool on each core set is one more tool of the round, so a
        # 1-core run and an all-core run are measured side by side.
        pinned = self.cores != [None]
        order = random.Random(f"{w.name} {c}" + (f" cores {self.cores}" if pinned else ""))
        states = []
        for cores in self.cores:
            for tool in self.tools_of(w):
                n += 1
                states.append(dict(self.new_state(tool, n, w, c), cores=cores))
        while True:
            due = [st for st in states if not st["stopped"] and st["done"] < st["runs"]]
            if not due:
                break
            order.shuffle(due)
            for st in due:
                self.run_next(w, inp, c, capname, st)
        return n

    def new_state(self, tool, n, w, c):
        """A tool's state across the rounds of one workload and cap, with its
        memory budget: the same for every tool (--mem under the cap, else
        the workload's budget), but for h5repack holding the whole array."""
        if tool == "h5repack-whole":
            m = None        # it holds the array by design: no budget applies
        else:
            m = self.mem if c is not None else self.mems[w.name]
        return {"tool": tool, "n": n, "m": m, "runs": self.a.repeat, "done": 0, "stopped": False,
                "retries": self.a.oom_retries if (c is not None and tool in MEM_KNOB) else 0}

    def run_next(self, w, inp, c, capname, st):
        """The next run of one tool in one workload, cap and core set (st: its state)."""
        tool, repeat = st["tool"], st["done"]
        self.ctx.cores = st["cores"]
        found = self.attempt(w, inp, c, capname, st)
        if found is None:
            return
        rec, target = found
        if rec["status"] == "ok":
            self.after_success(w, c, st, rec, target)
        elif rec["status"] == "timeout":
            say(f"    killed after {self.a.timeout:g} s (timeout)")
        else:
            say(f"    {rec['status'].upper()} (exit {rec.get('returncode')}): {rec.get('stderr', '')}")
        if target is not None and not (tool in ("keep", "baseline", "levels") and self.a.keep_output):
            remove_path(target)
            if tool not in ("keep", "baseline", "levels"):
                shutil.rmtree(storage_dir(self.workdir, w) / "out-peer", ignore_errors=True)
        if rec["status"] != "ok":
            st["stopped"] = True    # no point repeating a timeout or a failure
        st["done"] = repeat + 1

    def attempt(self, w, inp, c, capname, st):
        """Runs the tool once, again with half the budget after an OOM kill
        where it may; (record, output), or None when the tool is unavailable."""
        tool, repeat = st["tool"], st["done"]
        while True:
            runs = st["runs"]
            m = st["m"]
            tag = f" (run {repeat + 1})" if runs > 1 else ""
            cores = f", {cores_label(st['cores'])}" if st["cores"] else ""
            say(f"[{st['n']}/{self.total}] {w.label()}: {label(tool)}, {capname}{cores}{tag} ...")
            runtag = f"{'nocap' if c is None else 'cap'}-{repeat + 1}" + \
                (f"-budget{m >> 20}M" if m is not None and tool in MEM_KNOB else "") + \
                (f"-cores{st['cores'][0]}" if st["cores"] else "")
            rec, target = self.run_tool(w, inp, c, m, tool, runtag, repeat)
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
            return rec, target

    def run_tool(self, w, inp, c, m, tool, runtag, repeat):
        """One timed run of any tool; (record, output to check and remove, or None).
        The view's output is checked here, while it is mounted."""
        if w.codec and tool not in COMPRESSED_TOOLS:
            rec = new_record(w, tool, c, m, self.ctx.cores)
            rec.update(status="unavailable", reason=f"not for a compressed workload: {NOT_COMPRESSED[tool]}")
            return rec, None
        if tool in ("keep", "baseline", "levels"):
            out = storage_dir(self.workdir, w) / "out"
            return run_one(inp, out, w, tool, c, m, self.ctx), out
        if tool == "view":
            check = not self.a.no_verify
            return run_view(w, c, m, self.ctx, runtag, measure_read=(repeat == 0), check=check), None
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

    def after_success(self, w, c, st, rec, target):
        """Asks for more runs of a short tool, prints the run, checks its output."""
        # A median of two is their mean: one slow run moves it by half
        # its excess. Short runs, the noisiest, get more.
        for seconds, at_least in REPEATS_FOR_SHORT_RUNS:
            if rec["wall_seconds"] < seconds:
                st["runs"] = max(st["runs"], at_least)
                break
        extra = ""
        if rec.get("cpu_seconds") is not None:
            extra += f", CPU {rec['cpu_seconds']:.2f} s"
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
        if not self.a.no_verify:
            self.check(w, st["tool"], rec, target)
        if rec.get("verified") is not None:
            say(f"    {'verified' if rec['verified'] else 'VERIFY FAILED'}: {rec.get('verify_text')}")

    def check(self, w, tool, rec, target):
        """Checks one run's output, after its clock stopped (the view's was
        checked while mounted): voxel by voxel, or for the limit, which
        writes no array, its byte and file counts."""
        if tool == "limit":
            check_limit(rec, w, self.workdir)
            return
        if target is None:
            return
        if tool == "levels":
            ok, text, secs = self.peers.verify("pyramid", target, w)
        elif w.levels:
            ok, text, secs = self.peers.verify("zarr", target, w)
        elif tool in ("keep", "baseline") and not w.codec:
            ok, text, secs = verify(target, w)
        elif w.codec:
            ok, text, secs = self.peers.verify("zarr", target, w)
        else:
            ok, text, secs = self.peers.verify("h5" if tool in H5REPACK_TOOLS else "zarr", target, w)
        rec["verified"] = ok
        rec["verify_text"] = text.splitlines()[-1] if text else ""
        rec["verify_seconds"] = secs

    # -- after the runs

    def final_notes(self):
        notes = self.notes
        notes += self.budget_notes
        finished = [r for r in self.records if r["status"] == "ok"]
        unchecked = sorted({f"{r['workload']} {label(r['tool'])}" for r in finished if r.get("verified") is None})
        if self.a.no_verify:
            notes.append("outputs NOT verified (--no-verify)")
        elif unchecked:
            notes.append(f"not verified: {', '.join(unchecked)}")
        else:
            notes.append(f"every finished run's output verified, outside its timed part ({len(finished)} checks):"
                         " voxel by voxel, rechunkfs outputs and the view with tests/fixtures/verify.py, peers (and"
                         " rechunkfs's compressed Zarr outputs) with bench/peers/verify_peer.py; the physical limit,"
                         " which writes no array, by its counts of files and bytes read and written")
        if self.mems:
            notes.append("memory budget in uncapped runs, the same for every tool (rechunkfs --mem, the peers' knobs,"
                         " the limit's buffers; not h5repack holding the whole array): "
                         + ", ".join(f"{k} {show_bytes(v)}" for k, v in self.mems.items())
                         + ("" if self.a.budget else " (what rechunkfs keep's plan holds without --mem, or one"
                            " input or output block if that is more)"))
        if self.cores != [None]:
            notes.append("every tool ran on each core set, pinned with taskset, the core sets side by side in the same"
                         " rounds: " + ", ".join(cores_label(c) for c in self.cores)
                         + f" (this machine: {os.cpu_count()} CPUs)")
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
