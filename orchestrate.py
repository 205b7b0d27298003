"""
The Amdahl scheduler: which kernel to work on now, when to move on, and what the night adds up
to for the whole model.

Usage:
    uv run orchestrate.py status          # per kernel: runs, kept, best, share, model projection
    uv run orchestrate.py next            # stay on the current kernel, or save it and install the next
    uv run orchestrate.py install NAME    # switch to NAME by hand (saves the current one first)
    uv run orchestrate.py rewrite         # the current kernel's CUDA C++ starter into kernel.py:
                                          #   a visit of its own (GPU only)
    flags: --max-reverts 5 --rewrite-reverts 10 --peak-pct 90 --max-hours 2 --target-speedup 2
           --now 2025-01-01T03:00:00  (or AUTOKERNEL_NOW=...: an injectable clock for tests)

Inputs: workspace/plan.json (extract.py: kernels in priority order, each with its share of model
time and its workspace file) and results.tsv (bench.py), which is the truth. The state file
workspace/orchestrate.json is only a cache of the visits, rebuilt from results.tsv and kernel.py
when missing, corrupt, stale or written for an earlier plan.json (a new plan is a new night):
    {"version": 1, "plan_created": str,
     "visits": [{"kernel": NAME, "start": ISO time, "first_row": index of the visit's first
                 results.tsv row, "left": null or why the agent moved on,
                 "rewrite": "cuda" on a rewrite visit only}]}
The current kernel is the last visit's. A rewrite visit is also recorded in git: its commit's
subject names the kernel and the row it starts at, so a rebuilt state has it too.

Move on from the current kernel when any of these holds, counted within the current visit:
5 consecutive reverts (plateau; 10 on a rewrite visit), the best kept row at >= 90% of the
attainable peak, 2 hours since the visit began, or a 2x speedup. The 2x is measured from where
the visit started: on the first visit against eager PyTorch (speedup_vs_pytorch, the op the
model runs today) when the timing is valid, else against the kernel's first PASS row (the
starter; CPU mode); on a revisit or a rewrite against the best kept latency when it began.

Next kernel: the first never-visited one in plan order (extract.py sorts by share of model
time). Once all have been visited (all plateaued), revisit the one that still takes the most
model time, share / speedup, skipping kernels at the peak; never the one just left unless it is
the only one. `next` saves the current kernel's best (kernel.py at its latest keep's commit in
results.tsv: bench.py commits every keep; HEAD's when it has none) into its workspace file,
copies the next one into kernel.py and commits that switch, so bench.py's revert restores the
right kernel. While kernel.py holds an edit no full bench.py run has judged (after `bench.py
--quick`), `next` answers `stay` and says to judge it first: a switch would lose the edit.

A CUDA C++ rewrite (`rewrite`, on a GPU) replaces kernel.py's code with kernels/cuda/<type>.py
under the same name, shapes, dtype and variant, commits it and opens a new visit of the same
kernel: its own 2 hours, its speedup measured from the best when it began, and a revert budget
of its own (--rewrite-reverts), since a rewrite takes several experiments before it beats the
kept Triton version. Its reverts restore the committed CUDA starter; bench.py keeps a version
only once it beats the kept one, and until then the workspace file keeps the Triton best.

The statistics and the Amdahl projection come from autokernel/night.py.
"""
import argparse
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone

import autokernel as ak
from autokernel import git, night
from autokernel.cli import ArgumentParser, UsageError, run_main
from autokernel.contract import kernel_source, read_attrs, tag_of_source
from autokernel.results import read_rows, rel
from autokernel.workspace import (plan_kernels, read_json, read_plan, write_json,
                                  write_kernel_file)

# Paths are read from `ak` at call time (ak.ROOT, ak.PLAN_JSON, ...), never bound at import, so
# the tests can point them at a temporary repo.


@dataclass
class Limits:
    max_reverts: int = 5
    rewrite_reverts: int = 10  # a CUDA C++ rewrite visit's budget
    peak_pct: float = 90.0
    max_hours: float = 2.0
    target_speedup: float = 2.0


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["status", "next", "install", "rewrite"])
    parser.add_argument("name", nargs="?", help="kernel name from plan.json (install only)")
    parser.add_argument("--max-reverts", type=int, default=Limits.max_reverts)
    parser.add_argument("--rewrite-reverts", type=int, default=Limits.rewrite_reverts,
                        help="consecutive reverts before a rewrite visit moves on")
    parser.add_argument("--peak-pct", type=float, default=Limits.peak_pct)
    parser.add_argument("--max-hours", type=float, default=Limits.max_hours)
    parser.add_argument("--target-speedup", type=float, default=Limits.target_speedup)
    parser.add_argument("--now", help="ISO time to use as now (default: AUTOKERNEL_NOW or the "
                                      "clock)")
    args = parser.parse_args(argv)
    if (args.command == "install") != (args.name is not None):
        parser.error("install takes a kernel NAME; status, next and rewrite take none")
    limits = Limits(args.max_reverts, args.rewrite_reverts, args.peak_pct, args.max_hours,
                    args.target_speedup)
    command = {"status": cmd_status, "next": cmd_next, "install": cmd_install,
               "rewrite": cmd_rewrite}[args.command]
    command(args, limits)


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def read_inputs(args):
    return read_plan(ak.PLAN_JSON), read_rows(ak.RESULTS_TSV), now_from(args)


def cmd_next(args, limits):
    plan, rows, now = read_inputs(args)
    require_git()
    state = load_state(plan, rows, now)
    if not state["visits"]:
        require_clean_kernel_py()  # installing the first kernel would overwrite the edit
        name = plan["kernels"][0]["name"]
        why = "start: the first kernel in plan priority order"
        report("switch", name, why, switch(plan, rows, state, name, why, now))
        return
    current = state["visits"][-1]["kernel"]
    if unjudged_edit():  # a switch would lose it, and a rule would judge without it
        report("stay", current, "kernel.py has an edit no full bench.py run has judged (a "
                                "--quick run keeps and reverts nothing): run `uv run bench.py "
                                "-m \"...\"` on it (it keeps or reverts it), then ask again")
        return
    p = visit_progress(rows, state["visits"][-1], now)
    reasons = move_on_reasons(p, limits)
    if not reasons:
        report("stay", p["kernel"], f"no move-on rule met: {progress_line(p, limits)}")
        return
    name, why = choose_next(plan, rows, state, p["kernel"], limits)
    left = f"leave {p['kernel']}: {'; '.join(reasons)}"
    if name is None:
        report("done", p["kernel"], left, [f"next: none, {why}: run `uv run verify.py`"])
        return
    lines = switch(plan, rows, state, name, "; ".join(reasons), now)
    report("switch", name, left, [f"next: {name}: {why}"] + lines)


def cmd_install(args, limits):
    plan, rows, now = read_inputs(args)
    require_git()
    state = load_state(plan, rows, now)
    lines = switch(plan, rows, state, args.name, "switched by hand (orchestrate.py install)", now)
    report("switch", args.name, "installed by hand", lines)


def cmd_rewrite(args, limits):
    plan, rows, now = read_inputs(args)
    require_git()
    state = load_state(plan, rows, now)
    if not state["visits"]:
        raise UsageError("no current kernel to rewrite: run `uv run orchestrate.py next` first")
    name = state["visits"][-1]["kernel"]
    require_clean_kernel_py()
    if read_attrs(head_kernel_source() or "")[0].get("BACKEND") == "cuda":
        raise UsageError(f"{name} in kernel.py is CUDA C++ already: go on editing it")
    if not ak.CUDA:
        raise UsageError("CUDA C++ kernels need an NVIDIA GPU and this machine has none: stay "
                         "in Triton")
    entry = plan_kernels(plan)[name]
    starter = ak.starters_dir("cuda") / f"{entry['kernel_type']}.py"
    if not starter.is_file():
        raise UsageError(f"{rel(starter)} is missing: no CUDA C++ starter for "
                         f"{entry['kernel_type']}, stay in Triton")
    # A CUDA kernel runs only on a GPU: the model's real shapes, as extract.py --backend cuda.
    ak.KERNEL_PY.write_text(kernel_source(
        starter.read_text(), name, entry["shapes"], entry["dtype"], plan.get("model", "?"),
        variant=entry.get("variant"), writer="orchestrate.py rewrite"))
    commit = git.commit_file("kernel.py", rewrite_subject(name, len(rows)), cwd=ak.ROOT)
    state["visits"][-1]["left"] = "rewrite in CUDA C++"
    state["visits"].append({"kernel": name, "start": now.isoformat(), "first_row": len(rows),
                            "left": None, "rewrite": "cuda"})
    write_json(ak.ORCHESTRATE_JSON, state, indent=2)
    report("rewrite", name, f"a visit of its own: {limits.rewrite_reverts} consecutive reverts "
                            f"before `next` moves on, {limits.max_hours:g} h",
           [f"installed: {rel(starter)} -> kernel.py (commit {commit})",
            "next: read kernel.py, then run `uv run bench.py -m \"baseline: CUDA starter\"`"])


def cmd_status(args, limits):
    plan, rows, now = read_inputs(args)
    state = load_state(plan, rows, now)
    current = state["visits"][-1] if state["visits"] else None
    print(f"plan: {plan.get('model', '?')} ({len(plan['kernels'])} kernels), "
          f"{len(rows)} experiments in results.tsv")
    print(night.table(status_table(plan, rows, state)))
    if current:
        p = visit_progress(rows, current, now)
        print(f"current: {current['kernel']}: {progress_line(p, limits)}")
        reasons = move_on_reasons(p, limits)
        if reasons:
            print(f"move on: yes ({'; '.join(reasons)}): run `uv run orchestrate.py next`")
    else:
        print("current: none: run `uv run orchestrate.py next` to install the first kernel")
    print(night.projection_line(plan, rows))
    if not all(map(night.timing_ok, rows)):
        print("timings: some rows are not meaningful (CPU interpreter)")


def report(action, kernel, reason, more=()):
    """Greppable `key: value` lines; `action` first, so an agent can read one line."""
    print(f"action: {action}")
    print(f"kernel: {kernel}")
    print(f"reason: {reason}")
    for line in more:
        print(line)


def status_table(plan, rows, state):
    """One record per plan kernel, in plan order; `*` marks the current one."""
    current = state["visits"][-1]["kernel"] if state["visits"] else None
    table = []
    for k in plan["kernels"]:
        line = night.summary(k["name"], k["kernel_type"], night.rows_of(rows, k["name"]),
                             k["share"])
        visits = sum(v["kernel"] == k["name"] for v in state["visits"])
        table.append({"": "*" if k["name"] == current else "", **line, "visits": visits})
    return table


# ---------------------------------------------------------------------------------------------
# Time, git and kernel files
# ---------------------------------------------------------------------------------------------

def parse_time(text):
    t = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    return t if t.tzinfo else t.astimezone()  # naive times are local, as bench.py writes them


def now_from(args):
    text = args.now or os.environ.get("AUTOKERNEL_NOW")
    if not text:
        return datetime.now(timezone.utc)
    try:
        return parse_time(text)
    except ValueError:
        raise UsageError(f"--now/AUTOKERNEL_NOW {text!r} is not an ISO time such as "
                         f"2025-01-01T03:00:00")


def require_git():
    if not git.is_own_repo(ak.ROOT):
        raise UsageError(f"{ak.ROOT} is not a git repository: do program.md's setup "
                         f"(it makes the night's branch) first")


def unjudged_edit():
    """True when kernel.py differs from HEAD but is tracked: an edit bench.py has not kept or
    reverted yet (after `bench.py --quick`, by design)."""
    return bool(git.changed_paths("kernel.py", cwd=ak.ROOT)) and \
        git.is_tracked("kernel.py", cwd=ak.ROOT)


def require_clean_kernel_py():
    if not git.changed_paths("kernel.py", cwd=ak.ROOT):
        return
    if not git.is_tracked("kernel.py", cwd=ak.ROOT):
        raise UsageError("kernel.py is not committed: `git add kernel.py && git commit` it (or "
                         "delete it) before switching kernels")
    raise UsageError("kernel.py has uncommitted edits: run `uv run bench.py -m \"...\"` first (it "
                     "keeps or reverts them), then ask again")


def head_kernel_source():
    """kernel.py as committed at HEAD (None outside our repo or before it is tracked)."""
    return git.show("HEAD", "kernel.py", cwd=ak.ROOT) if git.is_own_repo(ak.ROOT) else None


def head_kernel_name(plan):
    """The plan kernel HEAD's kernel.py holds, else None."""
    source = head_kernel_source()
    name = tag_of_source(source) if source else None
    return name if name in plan_kernels(plan) else None


def best_source(name, rows, head):
    """The kernel's best kept version: kernel.py at the commit of its latest keep (each keep
    beats the one before; a rewrite's committed starter is no keep), else HEAD's (head)."""
    for r in reversed(rows):
        if r["tag"] == name and night.is_kept(r) and r["commit"]:
            source = git.show(r["commit"], "kernel.py", cwd=ak.ROOT)
            if source is not None and tag_of_source(source) == name:
                return source
    return head


def rewrite_subject(name, first_row):
    return f"orchestrate: rewrite {name} in CUDA C++ (from results.tsv row {first_row})"


REWRITE_SUBJECT = re.compile(r"orchestrate: rewrite (\S+) in CUDA C\+\+ \(from results\.tsv "
                             r"row (\d+)\)")


def rewrites_in_git():
    """(kernel, first_row) of each rewrite commit on the branch, oldest first."""
    log = git.git("log", "--reverse", "--format=%s", "--grep=^orchestrate: rewrite ",
                  cwd=ak.ROOT).stdout
    return [(m[1], int(m[2])) for m in map(REWRITE_SUBJECT.fullmatch, log.splitlines()) if m]


def switch(plan, rows, state, name, why, now):
    """Save the current kernel's best kept version (best_source) to its workspace file, copy
    `name`'s file into kernel.py, commit, open a new visit. Returns the lines to print."""
    kernels = plan_kernels(plan)
    if name not in kernels:
        raise UsageError(f"no kernel {name!r} in plan.json: choose one of {', '.join(kernels)}")
    require_git()
    require_clean_kernel_py()
    target = ak.ROOT / kernels[name]["file"]
    if not target.exists():
        raise UsageError(f"{kernels[name]['file']} (kernel {name}) is missing: re-run "
                         f"`uv run extract.py`")
    source = target.read_text()
    if tag_of_source(source) != name:
        raise UsageError(f"{kernels[name]['file']} is tagged {tag_of_source(source)!r}, not "
                         f"{name!r}: its KERNEL_NAME must match plan.json")
    lines = []
    head = head_kernel_source()
    head_name = tag_of_source(head) if head else None
    if head_name in kernels:
        write_kernel_file(ak.ROOT / kernels[head_name]["file"], best_source(head_name, rows, head))
        lines.append(f"saved: {head_name}'s best kept version -> {kernels[head_name]['file']}")
    ak.KERNEL_PY.write_text(source)
    commit = None if head == source else \
        git.commit_file("kernel.py", f"orchestrate: switch to {name}", cwd=ak.ROOT)
    if state["visits"]:
        state["visits"][-1]["left"] = why
    state["visits"].append({"kernel": name, "start": now.isoformat(), "first_row": len(rows),
                            "left": None})
    write_json(ak.ORCHESTRATE_JSON, state, indent=2)
    lines.append(f"installed: {kernels[name]['file']} -> kernel.py"
                 f"{f' (commit {commit})' if commit else ' (already at HEAD)'}")
    return lines


# ---------------------------------------------------------------------------------------------
# State: the visits (a cache; results.tsv and kernel.py are the truth)
# ---------------------------------------------------------------------------------------------

def load_state(plan, rows, now):
    """The visits from orchestrate.json, rebuilt from results.tsv and kernel.py when that file
    is missing, corrupt, stale or written for an earlier plan.json (a one-line note says so
    when there were rows to rebuild from, or the file was broken)."""
    state, note = read_state(plan, rows, head_kernel_name(plan))
    if state is not None:
        return state
    state = rebuild_state(plan, rows, head_kernel_name(plan), now)
    if note:
        print(f"note: {note}", file=sys.stderr)
    write_json(ak.ORCHESTRATE_JSON, state, indent=2)
    return state


def read_state(plan, rows, head_name):
    """(state, None) when orchestrate.json can be used as it is, else (None, the note to print
    or None). A plan.json newer than the state is a new night, not damage: no note unless
    results.tsv already has rows of the new plan's kernels."""
    path, rebuilt = ak.ORCHESTRATE_JSON, "rebuilt it from results.tsv and kernel.py"
    planned = any(r["tag"] in plan_kernels(plan) for r in rows)
    if not path.exists():
        return None, f"{rel(path)} missing: {rebuilt}" if planned else None
    try:
        state = read_json(path, rebuilt, "a visits file")
        if state.get("plan_created") != plan.get("created"):
            return None, (f"plan.json was rewritten after {rel(path)}: {rebuilt}" if planned
                          else None)
        check_state(state, plan, rows)
    except UsageError as e:  # not JSON, or not an object
        return None, str(e)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return None, f"{rel(path)} corrupt ({e}): {rebuilt}"
    current = state["visits"][-1]["kernel"] if state["visits"] else None
    if head_name and current != head_name:
        return None, f"{rel(path)} stale (it says {current}, kernel.py holds {head_name}): " \
                     f"{rebuilt}"
    return state, None


def check_state(state, plan, rows):
    if state.get("version") != 1:
        raise ValueError("unknown version")
    names = plan_kernels(plan)
    if not state["visits"] and any(r["tag"] in names for r in rows):
        raise ValueError("no visits, but results.tsv has rows of plan kernels")
    last_row = 0
    for v in state["visits"]:
        if v["kernel"] not in names:
            raise ValueError(f"kernel {v['kernel']!r} is not in plan.json")
        parse_time(v["start"])
        if not isinstance(v["first_row"], int) or not last_row <= v["first_row"] <= len(rows):
            raise ValueError("visit rows do not match results.tsv")
        last_row = v["first_row"]


def rebuild_state(plan, rows, head_name, now):
    """Visits = maximal runs of consecutive results.tsv rows of one plan kernel; a visit starts
    at its first row's timestamp. kernel.py (at HEAD) names the current kernel."""
    names, visits = plan_kernels(plan), []
    for i, r in enumerate(rows):
        if r["tag"] not in names or (visits and visits[-1]["kernel"] == r["tag"]):
            continue
        try:
            start = parse_time(r["timestamp"]).isoformat()
        except ValueError:
            start = now.isoformat()
        if visits:
            visits[-1]["left"] = "rebuilt from results.tsv"
        visits.append({"kernel": r["tag"], "start": start, "first_row": i, "left": None})
    if head_name and (not visits or visits[-1]["kernel"] != head_name):
        if visits:
            visits[-1]["left"] = "rebuilt from results.tsv"
        visits.append({"kernel": head_name, "start": now.isoformat(), "first_row": len(rows),
                       "left": None})
    if git.is_own_repo(ak.ROOT):
        for name, first in rewrites_in_git():
            split_rewrite(visits, rows, name, first, now)
    return {"version": 1, "plan_created": plan.get("created"), "visits": visits}


def split_rewrite(visits, rows, name, first, now):
    """Mark the rewrite of `name` from row `first` on: a visit of its own, split off the visit
    of `name` that holds that row (nothing when no visit of `name` does)."""
    for i, v in enumerate(visits):
        end = visits[i + 1]["first_row"] if i + 1 < len(visits) else len(rows) + 1
        if v["kernel"] != name or not v["first_row"] <= first < end:
            continue
        if first == v["first_row"]:
            v["rewrite"] = "cuda"
            return
        try:
            start = parse_time(rows[first]["timestamp"]).isoformat()
        except (IndexError, ValueError):
            start = now.isoformat()
        v["left"] = "rewrite in CUDA C++"
        visits.insert(i + 1, {"kernel": name, "start": start, "first_row": first, "left": None,
                              "rewrite": "cuda"})
        return


# ---------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------

def visit_progress(rows, visit, now):
    """Where the current visit stands: revert streak, hours, speedup since the visit began."""
    numbered = [(i, r) for i, r in enumerate(rows) if r["tag"] == visit["kernel"]]
    tag_rows = [r for _, r in numbered]
    before = [r for i, r in numbered if i < visit["first_row"]]
    during = [r for i, r in numbered if i >= visit["first_row"] and r["status"] != "judged"]
    streak = 0
    for r in reversed(during):
        if night.is_kept(r):
            break
        streak += 1
    stats = night.kernel_stats(tag_rows)
    like = night.latest_setting(tag_rows)
    earlier = night.kernel_stats(before, like) if before and like is not None else None
    if earlier is None or earlier["best"] is None:
        visit_speedup = stats["speedup"]  # first visit: against eager, or the starter
    else:
        visit_speedup = earlier["best_us"] / stats["best_us"]
    hours = (now - parse_time(visit["start"])).total_seconds() / 3600
    return {"kernel": visit["kernel"], "streak": streak, "hours": hours,
            "visit_speedup": visit_speedup, "pct_peak": stats["pct_peak"],
            "rewrite": bool(visit.get("rewrite"))}


def revert_limit(p, limits):
    return limits.rewrite_reverts if p["rewrite"] else limits.max_reverts


def move_on_reasons(p, limits):
    reasons, most = [], revert_limit(p, limits)
    if p["streak"] >= most:
        reasons.append(f"{p['streak']} consecutive reverts (limit {most}"
                       f"{', a CUDA rewrite' if p['rewrite'] else ''}): plateaued")
    if p["pct_peak"] >= limits.peak_pct:
        reasons.append(f"best at {p['pct_peak']:.0f}% of attainable peak "
                       f"(limit {limits.peak_pct:g}%)")
    if p["hours"] >= limits.max_hours:
        reasons.append(f"{p['hours']:.1f} h on it (limit {limits.max_hours:g} h)")
    if p["visit_speedup"] >= limits.target_speedup:
        reasons.append(f"{p['visit_speedup']:.2f}x this visit (target "
                       f"{limits.target_speedup:g}x)")
    return reasons


def progress_line(p, limits):
    peak = "n/a" if p["pct_peak"] != p["pct_peak"] else f"{p['pct_peak']:.0f}%"
    rewrite = " (a CUDA rewrite)" if p["rewrite"] else ""
    return (f"{p['streak']} of {revert_limit(p, limits)} consecutive reverts{rewrite}, "
            f"{p['hours']:.1f} of {limits.max_hours:g} h, "
            f"{p['visit_speedup']:.2f}x of {limits.target_speedup:g}x this visit, "
            f"{peak} of {limits.peak_pct:g}% peak")


def choose_next(plan, rows, state, leaving, limits):
    """(name, why), or (None, why) when every kernel is at its peak."""
    visited = {v["kernel"] for v in state["visits"]}
    for k in plan["kernels"]:
        if k["name"] not in visited:
            return k["name"], (f"first visit, next in plan priority order "
                               f"({100 * k['share']:.1f}% of model time)")
    stats = {name: night.kernel_stats(night.rows_of(rows, name)) for name in plan_kernels(plan)}
    open_ = [k for k in plan["kernels"] if not stats[k["name"]]["pct_peak"] >= limits.peak_pct]
    if not open_:
        return None, f"every kernel is at >= {limits.peak_pct:g}% of its attainable peak"
    if len(open_) > 1:
        open_ = [k for k in open_ if k["name"] != leaving]
    visits = {name: sum(v["kernel"] == name for v in state["visits"]) for name in stats}
    # Amdahl: the kernel that still takes the largest slice of model time has the most to give.
    order = sorted(range(len(open_)), key=lambda i: (
        -open_[i]["share"] / stats[open_[i]["name"]]["speedup"], visits[open_[i]["name"]], i))
    k = open_[order[0]]
    s = stats[k["name"]]
    return k["name"], (f"all kernels visited; revisit the one still taking the most model time: "
                       f"{100 * k['share'] / s['speedup']:.1f}% (share "
                       f"{100 * k['share']:.1f}% / {s['speedup']:.2f}x)")


if __name__ == "__main__":
    sys.exit(run_main("orchestrate.py", main))
