"""What a run reports: one row per workload, tool, cap and core set from
the runs' records, the results table (with each tool's memory budget and
durability), keep against the physical limit, CPU time per GiB and the
parallel fraction measured across core sets, the view-read and targets
tables, results.md, the chart (chart.svg), and the printed summary. It
reads only the records, so a saved results.json renders again without
running anything."""
import statistics
from xml.sax.saxutils import escape

from .common import HEADROOM_RSS, ratio_text, say, show_bytes
from .tools import DURABILITY, REPEATS_FOR_SHORT_RUNS, TOOLS, label
from .view import READ_PATTERNS, READ_SECONDS_PER_SIDE
from .workloads import workloads

# A wall-time heading that says how every tool is timed: Python tools from
# a warm interpreter (imports done), compiled ones from exec, all to exit.
WALL_HEADING = "wall s (warm start → exit + syncfs)"


def cap_label(rec):
    """The cap and the run's memory budget (none: h5repack holding the
    whole array), and the cores it was pinned to, if it was."""
    cores = f", {cores_label((rec['cores'], rec.get('cpu_list')))}" if rec.get("cores") else ""
    if rec["cap_bytes"] is None:
        return ("none" if rec.get("mem_bytes") is None else f"none (budget {show_bytes(rec['mem_bytes'])})") + cores
    if rec.get("mem_bytes") is None:
        return show_bytes(rec["cap_bytes"]) + cores
    return f"{show_bytes(rec['cap_bytes'])} (--mem {show_bytes(rec['mem_bytes'])})" + cores


def cores_label(cores):
    """(count, CPU list) -> '1 core (taskset -c 0)'."""
    n, cpus = cores
    return f"{n} core{'s' if n != 1 else ''}" + (f" (taskset -c {cpus})" if cpus else "")


def storage_label(name):
    """A workload's name with the storage it ran on, for the limit table."""
    return f"{name[:-len('-tmpfs')]} (tmpfs)" if name.endswith("-tmpfs") else f"{name} (disk)"


def aggregate(records):
    """One row per (workload, tool, cap): the median wall time of its runs
    when all finished, else the first run that did not finish."""
    groups = {}
    for r in records:
        if not r.get("superseded"):
            groups.setdefault((r["workload"], r["tool"], r["cap_bytes"], r.get("cores")), []).append(r)
    rows = []
    for runs in groups.values():
        bad = [r for r in runs if r["status"] != "ok"]
        row = dict(bad[0] if bad else runs[0])
        walls = sorted(r["wall_seconds"] for r in runs if r["status"] == "ok")
        if not bad:
            row["wall_seconds"] = statistics.median(walls)
            rss = [r["peak_rss_bytes"] for r in runs if r.get("peak_rss_bytes")]
            row["peak_rss_bytes"] = max(rss) if rss else None
            cpu = [r["cpu_seconds"] for r in runs if r.get("cpu_seconds") is not None]
            row["cpu_seconds"] = statistics.median(cpu) if len(cpu) == len(runs) else None
        checks = [r.get("verified") for r in runs]
        row["verified"] = False if False in checks else (True if True in checks else None)
        texts = [r.get("verify_text") for r in runs if r.get("verify_text")]
        row["verify_text"] = texts[0] if texts else None
        for r in runs:
            if view_reads(r):
                row["reads"] = view_reads(r)
        row["walls"] = walls
        row["runs"] = len(runs)
        rows.append(row)
    order = {t: i for i, t in enumerate(TOOLS)}
    names = []
    for r in records:
        if r["workload"] not in names:
            names.append(r["workload"])
    rows.sort(key=lambda r: (names.index(r["workload"]), r["cap_bytes"] or 0, r.get("cores") or 0, order[r["tool"]]))
    return rows


def status_text(rec, timeout):
    s = rec["status"]
    if s == "timeout":
        return f"> {timeout:g} (timeout)"
    if s == "oom":
        return "OOM-killed"
    if s == "error":
        return "error"
    if s == "unavailable":
        return "—"
    walls = rec.get("walls") or []
    if len(walls) > 1:
        return f"{rec['wall_seconds']:.2f} ({walls[0]:.2f}–{walls[-1]:.2f})"
    return f"{rec['wall_seconds']:.2f}"


def output_text(rec):
    s = rec["status"]
    if s == "unavailable":
        return rec.get("reason", "unavailable")
    if s in ("error", "oom", "timeout"):
        why = (rec.get("stderr") or "").replace("|", "/").replace("\n", " ")
        return why[:160] if s == "error" else ("killed by the memory cap" if s == "oom" else "killed")
    if rec["tool"] == "limit":
        return limit_text(rec)
    v = rec.get("verified")
    if v is True:
        return "exact"
    if v is False:
        return "**WRONG**: " + (rec.get("verify_text") or "")[:120].replace("|", "/")
    return "not checked"


def limit_text(rec):
    """What the limit did: its threads, when reading and writing ended,
    whether it dropped pages, its counts (and whether they were right)."""
    t = rec.get("tool_report") or {}
    if "readers" not in t:
        return "the single-thread limit of an earlier harness" if "read_seconds" in t else "n/a (no array)"
    text = (f"{t['readers']} readers ∥ {t['writers']} writers: reads done at {t['read_ended']:.2f} s, writes at "
            f"{t['write_ended']:.2f} s, {t['syncs']} syncfs; pages {'dropped' if t['dropped_pages'] else 'kept'}; "
            f"{show_bytes(t['bytes_read'])} in {t['files_read']:,} files → {t['files_written']:,} files")
    if rec.get("verified") is False:
        text += f"; **WRONG COUNTS**: {rec.get('verify_text', '')}"
    return text


def keep_row(rows, r):
    for k in rows:
        if group_key(k) == group_key(r) and k["tool"] == "keep":
            return k
    return None


def vs_keep(rows, r):
    k = keep_row(rows, r)
    if not k or k["status"] != "ok":
        return None, ""
    if r["status"] == "ok":
        return r["wall_seconds"] / max(k["wall_seconds"], 1e-9), ""
    if r["status"] == "timeout":
        return r["wall_seconds"] / max(k["wall_seconds"], 1e-9), ">"
    return None, ""


def results_table(rows, timeout):
    out = [f"| workload | tool | cap (memory budget) | {WALL_HEADING} | × keep | durability of its own | peak RSS |"
           " seeks made / planned | output |",
           "|---|---|---|---:|---:|---|---:|---:|---|"]
    for r in rows:
        ratio, bound = vs_keep(rows, r)
        rt = ratio_text(ratio, bound) if ratio is not None else "—"
        if r["tool"] == "keep" and r["status"] == "ok":
            rt = "1"
        rss = show_bytes(r.get("peak_rss_bytes")) if r.get("peak_rss_bytes") else "—"
        if r.get("peak_held_bytes"):
            rss += f" (held {show_bytes(r['peak_held_bytes'])})"
        made, planned = r.get("seeks_made"), r.get("seeks_planned", r.get("planned_seeks"))
        seeks = "—" if made is None and planned is None else \
            f"{made:,}" if made is not None else "?"
        if made is not None or planned is not None:
            seeks += f" / {planned:,}" if planned is not None else " / ?"
        out.append(f"| {r['workload']} | {label(r['tool'])} | {cap_label(r)} | {status_text(r, timeout)} | {rt} | "
                   f"{DURABILITY.get(r['tool'], '?')} | {rss} | {seeks} | {output_text(r)} |")
    return out


def limit_table(rows):
    """keep against the physical limit, for every workload (named with its
    storage) and cap where both ran."""
    out = [f"| workload | cap (memory budget) | physical limit, {WALL_HEADING} | keep, {WALL_HEADING} | keep / limit |"
           " the limit's pages |",
           "|---|---|---:|---:|---:|---|"]
    for key in groups_of(rows):
        name = key[0]
        g = {r["tool"]: r for r in rows if group_key(r) == key}
        lim, keep = g.get("limit"), g.get("keep")
        if not lim or not keep:
            continue
        both = lim["status"] == "ok" and keep["status"] == "ok"
        ratio = ratio_text(wall_ratio(keep, lim)) if both else "—"
        t = lim.get("tool_report") or {}
        pages = ("dropped once used, as rechunkfs's" if t.get("dropped_pages") else "kept, as rechunkfs's") \
            if "dropped_pages" in t else "?"
        out.append(f"| {storage_label(name)} | {cap_label(keep)} | {status_text(lim, 0)} | {status_text(keep, 0)} |"
                   f" {ratio} | {pages} |")
    return out if len(out) > 2 else []


GIB = 1 << 30
# The core counts keep's measured parallel fraction is projected to.
PROJECT_TO = (16, 64)


def amdahl(t1, tn, n):
    """The parallel fraction p that Amdahl's law gives from the wall times
    on 1 core (t1) and on n cores (tn): tn = t1 * ((1 - p) + p / n)."""
    return (1 - tn / t1) / (1 - 1 / n)


def speedup(p, n):
    """The speed-up on n cores of work whose parallel fraction is p."""
    return 1 / ((1 - p) + p / n)


def cpu_table(rows, wl):
    """Per workload, cap and tool: wall time and CPU seconds (user + system)
    per GiB of the array on each core set; with 1 and n > 1 cores, the
    speed-up, the parallel fraction it measures and what that projects for
    PROJECT_TO cores. Empty when no row has CPU time."""
    if not any(r.get("cpu_seconds") is not None for r in rows):
        return []
    sets = sorted({r.get("cores") for r in rows}, key=lambda c: c or 0)
    nbytes = {w.name: w.nbytes for w in wl}
    head = ["workload", "cap (memory budget)", "tool"]
    for c in sets:
        name = "not pinned" if c is None else f"{c} core{'s' if c != 1 else ''}"
        head += [f"wall s, {name}", f"CPU s/GiB, {name}"]
    n = max((c for c in sets if c), default=None)
    scaling = 1 in sets and n and n > 1
    if scaling:
        head += [f"1 → {n} cores", "parallel fraction p"] + [f"p projects, {k} cores" for k in PROJECT_TO]
    out = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    table = {}
    for r in rows:
        table.setdefault((r["workload"], r["cap_bytes"], r["tool"]), {})[r.get("cores")] = r
    for (name, _, tool), by_cores in table.items():
        if not any(r["status"] == "ok" for r in by_cores.values()):
            continue        # never ran here: the results table says why
        first = next(iter(by_cores.values()))
        cells = [name, cap_label(dict(first, cores=None)), label(tool)]
        for c in sets:
            r = by_cores.get(c)
            ok = r is not None and r["status"] == "ok"
            cells.append(f"{r['wall_seconds']:.2f}" if ok else "—")
            cpu = r.get("cpu_seconds") if ok else None
            cells.append(f"{cpu / (nbytes[name] / GIB):.2f}" if cpu is not None and name in nbytes else "—")
        if scaling:
            one, many = by_cores.get(1), by_cores.get(n)
            if one and many and one["status"] == "ok" and many["status"] == "ok":
                t1, tn = one["wall_seconds"], many["wall_seconds"]
                p = amdahl(t1, tn, n)
                # Noise can put a measured p outside [0, 1]; the projections take the nearest possible p.
                q = min(1.0, max(0.0, p))
                clamp = "" if q == p else f" (from p = {q:.2f})"
                cells += [ratio_text(t1 / tn), f"{p:.2f}"] + [ratio_text(speedup(q, k)) + clamp for k in PROJECT_TO]
            else:
                cells += ["—"] * (2 + len(PROJECT_TO))
        out.append("| " + " | ".join(cells) + " |")
    return out


CPU_ABOUT = ("CPU s/GiB: the run's user plus system CPU seconds (wait4's rusage of the tool's process and the"
             " children it waited for; a Python tool's counted from its go, as its wall time is; the view's"
             " from its daemon, /proc/PID/stat), median over its runs, per GiB of the array (raw bytes, for a"
             " compressed workload too). With --cores every tool runs pinned with taskset -c to the first N"
             " cores, the core sets side by side in the same rounds. 1 → n cores: the wall time on 1 core over"
             " that on n. parallel fraction p: Amdahl's law solved for p from those two times, p = (1 - Tn/T1)"
             " / (1 - 1/n); p projects: the speed-up over 1 core that p gives on that many cores,"
             " 1 / ((1 - p) + p/N), a projection from 2 measured points, not a measurement.")


def mbps(d):
    return d["bytes"] / max(d["seconds"], 1e-9) / 1e6


def view_reads(rec):
    """A view record's read throughput, {reader: {"view": …, "staging": …}}.
    Results written before the plain reader was added read with the
    sequential advice only."""
    if rec.get("reads"):
        return rec["reads"]
    if rec.get("read_view"):
        return {"advised": {"view": rec["read_view"], "staging": rec["read_staging"]}}
    return None


READER_LABELS = {"plain": "plain", "advised": "advised sequential"}


def read_table(rows):
    out = ["| workload | cap | reads | view files MB/s | staging files MB/s | rounds a side | view / staging |",
           "|---|---|---|---:|---:|---:|---:|"]
    n = 0
    for r in rows:
        if r["tool"] == "view" and r.get("reads"):
            for reader, side in r["reads"].items():
                v, s = mbps(side["view"]), mbps(side["staging"])
                rounds = side["view"].get("rounds", 2)
                out.append(f"| {r['workload']} | {cap_label(r)} | {READER_LABELS.get(reader, reader)} | {v:,.0f} |"
                           f" {s:,.0f} | {rounds} | {ratio_text(v / max(s, 1e-9))} |")
                n += 1
    return out if n else []


def group_key(r):
    """What a row is compared within: (workload, cap, cores)."""
    return r["workload"], r["cap_bytes"], r.get("cores")


def groups_of(rows):
    """The (workload, cap, cores) groups of rows, in row order."""
    groups = []
    for r in rows:
        key = group_key(r)
        if key not in groups:
            groups.append(key)
    return groups


def wall_ratio(a, b):
    return a["wall_seconds"] / max(b["wall_seconds"], 1e-9)


def targets(rows, mems):
    """(workload, cap label, check, value text, target text, met: True/False/None)."""
    out = []
    for key in groups_of(rows):
        name, cap = key[0], key[1]
        g = {r["tool"]: r for r in rows if group_key(r) == key}
        keep = g.get("keep")
        cl = cap_label(keep) if keep else ("none" if cap is None else show_bytes(cap))

        def add(check, value, target, met):
            out.append((name, cl, check, value, target, met))
        if keep is not None and keep["status"] == "ok":
            time_targets(name, cap, g, keep, add)
            peer_targets(g, keep, add)
        memory_targets(name, g, mems, add)
        read_targets(g.get("view"), add)
    return out


def time_targets(name, cap, g, keep, add):
    """keep against the limit, baseline and the view against keep."""
    lim = g.get("limit")
    if lim and lim["status"] == "ok":
        x = wall_ratio(keep, lim)
        if "readers" in (lim.get("tool_report") or {}):
            add("keep / physical limit (wall)", ratio_text(x), "≤ 1.25×", x <= 1.25)
        else:
            # Saved results of the earlier, single-thread limit, which keep's
            # overlapped reads and writes beat: no target can be met against it.
            add("keep / single-thread limit of an earlier harness (not a limit)", ratio_text(x), "≤ 1.25×", None)
    base = g.get("baseline")
    if base and base["status"] in ("ok", "timeout"):
        x = wall_ratio(base, keep)
        tgt = "≥ 2.5×" if name == "W1" and cap is not None else "—"
        add("baseline / keep (wall)", ratio_text(x, ">" if base["status"] == "timeout" else ""), tgt,
            (x >= 2.5) if tgt != "—" else None)
    view = g.get("view")
    if view and view["status"] == "ok":
        x = wall_ratio(view, keep)
        add("view materialisation / keep (wall)", ratio_text(x), "≤ 1.1×", x <= 1.1)
    levels = g.get("levels")
    if levels and levels["status"] == "ok":
        add("rechunk --levels auto / level 0 alone (wall)", ratio_text(wall_ratio(levels, keep)), "—", None)


def peer_targets(g, keep, add):
    """Every peer against keep, then the fastest one that finished with a right output."""
    finished = []
    for t in TOOLS:
        if TOOLS[t][1] != "peer" or t not in g:
            continue
        p = g[t]
        if p["status"] == "ok" and p.get("verified") is not False:
            x = wall_ratio(p, keep)
            finished.append((x, t))
            add(f"{label(t)} / keep (wall)", ratio_text(x), "> 1×", x > 1)
        elif p["status"] == "timeout":
            add(f"{label(t)} / keep (wall)", ratio_text(wall_ratio(p, keep), ">"), "> 1×", True)
        else:
            add(f"{label(t)} / keep (wall)", f"n/a ({status_text(p, 0) if p['status'] != 'unavailable' else 'unavailable'})",
                "> 1×", None)
    if finished:
        x, t = min(finished)
        add(f"fastest peer ({label(t)}) / keep (wall)", ratio_text(x), "> 1×", x > 1)


def memory_targets(name, g, mems, add):
    """keep's and the view's peak RSS against their memory budget plus the headroom."""
    for t in ("keep", "view"):
        r = g.get(t)
        if r and r["status"] == "ok" and r.get("peak_rss_bytes"):
            m = r["mem_bytes"] if r["mem_bytes"] is not None else mems.get(name)
            if m:
                x = r["peak_rss_bytes"] / (m + HEADROOM_RSS)
                add(f"{label(t)} peak RSS / (mem {show_bytes(m)} + 64 MiB)", ratio_text(x), "≤ 1×", x <= 1)


def read_targets(view, add):
    for reader, side in ((view or {}).get("reads") or {}).items():
        # The target is the plain reader's: an advised reader's advice
        # does not reach the staging file through passthrough (view.READERS).
        x = mbps(side["view"]) / max(mbps(side["staging"]), 1e-9)
        add(f"view read throughput / staging read throughput ({READER_LABELS.get(reader, reader)} reads)",
            ratio_text(x), "≥ 0.9×" if reader == "plain" else "—", x >= 0.9 if reader == "plain" else None)


def targets_table(items):
    out = ["| workload | cap (--mem) | check | value | target | met |", "|---|---|---|---:|---:|:---:|"]
    for name, cl, check, value, target, met in items:
        mark = "—" if met is None else ("yes" if met else "**no**")
        out.append(f"| {name} | {cl} | {check} | {value} | {target} | {mark} |")
    return out


def commands_section(records):
    seen = {}
    for r in records:
        if r.get("command") and (r["workload"], r["tool"]) not in seen:
            seen[(r["workload"], r["tool"])] = r["command"]
    lines = []
    for (name, tool), cmd in seen.items():
        lines.append(f"- {name}, {label(tool)}: `{cmd}`")
    return lines


LIMIT_ABOUT = ("The physical limit is the rechunk's I/O with nothing else: 8 threads read every input file"
               " while 4 threads write files the sizes of the output's, then syncfs; write-back is started"
               " per file and the filesystem synced every 256 MiB, as rechunkfs does, and pages are dropped"
               " (inputs once read, outputs once synced) exactly when rechunkfs drops them: when 4 × the"
               " array exceeds the smaller of the memory cgroup's limit and MemAvailable. Both are timed"
               " alike: the limit from the go of its warm interpreter, keep from exec, both to exit plus the"
               " syncfs.")


def results_notes():
    """What the results table's columns mean."""
    return ("wall s: measured by bench/run for every tool alike, from a warm start to its exit, plus a syncfs"
            " of the output's filesystem after it exits: a Python tool (TensorStore, rechunker, the limit)"
            " starts its interpreter and imports first, then the page cache is dropped and its clock starts"
            " as it is told to go; a compiled tool (rechunkfs, zarrs_reencode, h5repack) is started cold"
            " after the drop, its clock from exec; with several runs the median (min–max); "
            + "; ".join(f"a tool whose run takes under {s:g} s runs at least {k} times"
                        for s, k in REPEATS_FOR_SHORT_RUNS)
            + "; the runs go in rounds, every tool once per round, each round in its own (seeded) order."
            " × keep: wall time over rechunkfs keep's in the same workload and cap. cap (memory budget):"
            " every tool in a workload and cap gets the same budget (rechunkfs --mem, rechunker max_mem,"
            " TensorStore cache_pool, zarrs --cache-size, h5repack H5TOOLS_BUFSIZE, the limit's buffers),"
            " but h5repack given the whole array. durability of its own: what the tool does itself to put"
            " its output on disk, before the harness's syncfs (an fsync per file costs more than a"
            " syncfs per batch). peak RSS: rechunkfs's own getrusage (keep, baseline), the view daemon's"
            " VmHWM, or wait4's ru_maxrss (peers, limit); held: array bytes rechunkfs held. seeks: counted"
            " by rechunkfs (made) and predicted by its plan (planned). output: every run's output checked"
            " voxel by voxel against the source, after its clock stopped.")


def report_text(header, machine, notes, records, timeout, wl, mems, chart_name):
    rows = aggregate(records)
    lines = [header, "", "Machine:", ""] + machine + [""]
    lines += ["Workloads:", ""] + [f"- {w.label()}: {w.about}; array {show_bytes(w.nbytes)}, "
                                   f"{w.input_files:,} input / {w.output_files:,} output files" for w in wl] + [""]
    if chart_name:
        lines += [f"![wall time per tool]({chart_name})", ""]
    lines += ["## Results", ""] + results_table(rows, timeout) + [""]
    lines += [results_notes(), ""]
    lt = limit_table(rows)
    if lt:
        lines += ["## keep against the physical limit", "", LIMIT_ABOUT, ""] + lt + [""]
    ct = cpu_table(rows, wl)
    if ct:
        lines += ["## CPU time and cores", "", CPU_ABOUT, ""] + ct + [""]
    rt = read_table(rows)
    if rt:
        lines += ["## View read throughput", "",
                  "Once the view is complete, the page cache dropped before each round: the staging files"
                  " read once unmeasured (the first cold read after a run's writes is up to 2x slower on"
                  " this VM), then every view block file read with 8 MiB reads through the mount, the same"
                  " files in the staging directory, the staging files again, the view again (view, staging,"
                  f" staging, view), repeated until each side has read for {READ_SECONDS_PER_SIDE:g} s (at most"
                  f" {READ_PATTERNS} times). Throughput over all rounds of each. Two readers take turns, pattern"
                  " by pattern: plain reads, as most tools read (h5py, numpy, nibabel), and reads advised"
                  " posix_fadvise SEQUENTIAL first, as cp reads. Through FUSE passthrough that advice reaches"
                  " the view's file but not the staging file the kernel reads, so the view's reads keep the"
                  " disk's default read-ahead window while the staging side's doubles; the target is checked"
                  " on the plain reads.",
                  ""] + rt + [""]
    lines += ["## Targets (issue 5)", ""] + targets_table(targets(rows, mems)) + [""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    cmds = commands_section(records)
    if cmds:
        lines += ["## Commands (first run of each)", ""] + cmds + [""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Chart


COLOURS = {"keep": "#1f5fa8", "baseline": "#9dbde0", "view": "#2a9d8f", "limit": "#6c6c6c",
           "tensorstore": "#e07b39", "rechunker-python": "#c9a227", "rechunker-dask": "#a67c00",
           "zarrs": "#b5485d", "h5repack": "#7b5ea7", "h5repack-whole": "#b39ddb"}


def chart_svg(rows, title, wl):
    """Horizontal bars of wall time, one panel per workload and cap."""
    width, left, right, bar_h, gap = 860, 190, 150, 16, 4
    plot_w = width - left - right
    y = 46
    parts = []
    for key in groups_of(rows):
        name, cap = key[0], key[1]
        g = [r for r in rows if group_key(r) == key]
        # Scale to the runs that finished; a run killed at the timeout is drawn clipped at the right edge.
        top = max([r["wall_seconds"] for r in g if r["status"] == "ok" and r["wall_seconds"]] or
                  [r["wall_seconds"] for r in g if r["status"] == "timeout" and r["wall_seconds"]] or [1])
        capt = "no memory cap" if cap is None else f"memory cap {show_bytes(cap)} (page cache included)"
        if key[2]:
            capt += f", {cores_label((key[2], g[0].get('cpu_list')))}"
        about = next((x.label() for x in wl if x.name == name), name)
        parts.append(f'<text x="10" y="{y}" font-weight="bold">{escape(about)}, {escape(capt)}</text>')
        y += 10
        for r in g:
            parts += chart_bar(r, y, top, left, plot_w, bar_h)
            y += bar_h + gap
        y += 24
    height = y
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']
    return "\n".join(head + parts + ["</svg>"]) + "\n"


def chart_bar(r, y, top, left, plot_w, bar_h):
    """One row's label and bar (or why it has none), its top edge at y."""
    cy = y + bar_h / 2 + 4
    parts = [f'<text x="{left - 8}" y="{cy}" text-anchor="end">{escape(label(r["tool"]))}</text>']
    if r["status"] in ("ok", "timeout") and r["wall_seconds"]:
        w = max(1.0, min(plot_w, plot_w * r["wall_seconds"] / top))
        colour = COLOURS.get(r["tool"], "#888")
        dash = ' stroke="#000" stroke-dasharray="3,2"' if r["status"] == "timeout" else ""
        parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colour}"{dash}/>')
        text = f'{r["wall_seconds"]:.2f} s' if r["status"] == "ok" else \
            f'killed at {r["wall_seconds"]:.0f} s (timeout)'
        if r["status"] == "ok" and r.get("verified") is False:
            text += " WRONG"
        if r["status"] == "timeout":     # clipped at the right edge: say so inside the bar
            parts.append(f'<text x="{left + 6}" y="{cy}" fill="white">{escape(text)} →</text>')
        else:
            parts.append(f'<text x="{left + w + 6:.1f}" y="{cy}">{escape(text)}</text>')
    else:
        detail = (r.get("reason") or r.get("stderr") or "").split(" (log")[0]
        if r["status"] == "oom":
            why = "OOM-killed by the cap" + (f" (budget {show_bytes(r['mem_bytes'])})" if r.get("mem_bytes") else "")
        elif r["status"] == "error":
            why = "error: " + detail[:90]
        else:
            why = detail[:100] or r["status"]
        parts.append(f'<text x="{left + 6}" y="{cy}" fill="#888" font-style="italic">{escape(why)}</text>')
    return parts


# --------------------------------------------------------------------------
# Writing


def published_suffix(names):
    """What tells published results apart in docs/bench: none for a run
    with W1, the headline workload (results.md, chart.svg); otherwise the
    workloads' names (a W2 run: results-W2.md, chart-W2.svg). A new run of
    the same workloads replaces the files it published before."""
    return "" if "W1" in names else "-" + "-".join(names)


def saved_workloads(saved):
    """The workloads of saved results, in the run's order."""
    table = workloads(saved_quick(saved))
    names = saved.get("workloads") or list(dict.fromkeys(r["workload"] for r in saved["runs"]))
    return [table[n] for n in names if n in table]


def saved_quick(saved):
    return saved.get("quick", "quick" in saved.get("mode", ""))


def write_results(saved, dest, json_path, suffix=""):
    """Write results.md and chart.svg (with suffix before the extension)
    into dest from the saved results, and print the tables."""
    quick = saved_quick(saved)
    records = saved["runs"]
    wl = saved_workloads(saved)
    mems, timeout, notes = saved.get("memory_budgets", {}), saved.get("timeout", 0), saved.get("notes", [])
    header = saved.get("header") or f"# rechunkfs bench ({saved.get('mode', '?')})"
    dest.mkdir(parents=True, exist_ok=True)
    rows = aggregate(records)
    results_name, chart_name = f"results{suffix}.md", f"chart{suffix}.svg"
    chart = chart_svg(rows, f"rechunkfs vs peers ({'quick sizes' if quick else 'full sizes'}): wall time from a cold"
                            f" page cache, shorter is better", wl)
    (dest / chart_name).write_text(chart)
    (dest / results_name).write_text(report_text(header, saved.get("machine", []), notes, records, timeout, wl,
                                                 mems, chart_name))
    say("")
    say("\n".join(results_table(rows, timeout)))
    lt = limit_table(rows)
    if lt:
        say("")
        say("\n".join(lt))
    ct = cpu_table(rows, wl)
    if ct:
        say("")
        say("\n".join(ct))
    rt = read_table(rows)
    if rt:
        say("")
        say("\n".join(rt))
    say("")
    say("\n".join(targets_table(targets(rows, mems))))
    say("")
    for note in notes:
        say(f"NOTE: {note}")
    say(f"\nwritten: {dest / results_name}, {dest / chart_name} (from {json_path})")
