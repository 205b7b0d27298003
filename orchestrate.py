"""
The Amdahl scheduler: which kernel to work on now, when to move on, and what the night adds up
to for the whole model.

Usage:
    uv run orchestrate.py status          # per kernel: runs, kept, best, share, model projection
    uv run orchestrate.py next            # stay on the current kernel, or save it and install the next
    uv run orchestrate.py install NAME    # switch to NAME by hand (saves the current one first)
    flags: --max-reverts 5 --peak-pct 90 --max-hours 2 --target-speedup 2
           --now 2025-01-01T03:00:00  (or AUTOKERNEL_NOW=...: an injectable clock for tests)

Inputs: workspace/plan.json (extract.py: kernels in priority order, each with its share of model
time and its workspace file) and results.tsv (bench.py), which is the truth. The state file
workspace/orchestrate.json is only a cache of the visits, rebuilt from results.tsv and kernel.py
when missing, corrupt or stale:
    {"version": 1, "plan_created": str,
     "visits": [{"kernel": NAME, "start": ISO time, "first_row": index of the visit's first
                 results.tsv row, "left": null or why the agent moved on}]}
The current kernel is the last visit's.

Move on from the current kernel when any of these holds, counted within the current visit (the
paper's rules): 5 consecutive reverts (plateau), the best kept row at >= 90% of the attainable
peak, 2 hours since it was installed, or a 2x speedup. The 2x is measured from where the visit
started: on the first visit against eager PyTorch (speedup_vs_pytorch, the op the model runs
today) when the timing is valid, else against the kernel's first PASS row (the starter; CPU
mode); on a revisit against the best kept latency when the visit began.

Next kernel: the first never-visited one in plan order (extract.py sorts by share of model
time). Once all have been visited (all plateaued), revisit the one that still takes the most
model time, share / speedup, skipping kernels at the peak; never the one just left unless it is
the only one. `next` saves the current kernel's best (HEAD's kernel.py: bench.py commits every
keep) into its workspace file, copies the next one into kernel.py and commits that switch, so
bench.py's revert restores the right kernel.

Projected model speedup (Amdahl): 1 / (1 - sum(share_i) + sum(share_i / s_i)), with s_i each
kernel's best speedup (against eager where valid, else against its starter).
"""
import argparse
import ast
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

import autokernel as ak

NUMERIC_COLUMNS = ["experiment", "throughput_tflops", "latency_us", "pct_peak",
                   "speedup_vs_pytorch", "peak_vram_mb", "bandwidth_gb_s", "speedup_vs_compile"]
REQUIRED_COLUMNS = ["experiment", "tag", "kernel_type", "throughput_tflops", "latency_us",
                    "correctness"]
SETTING_COLUMNS = ["shape", "dtype", "device"]  # bench.py compares keeps within one setting


class OrchestrateError(Exception):
    """A one-line message for the user; code 2 for bad input or a refused action, 1 for failures."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


@dataclass
class Limits:
    max_reverts: int = 5
    peak_pct: float = 90.0
    max_hours: float = 2.0
    target_speedup: float = 2.0


def rel(path):
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ak.ROOT.resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------
# Reading plan.json and results.tsv (analysis.py reads through these too)
# ---------------------------------------------------------------------------------------------

def read_plan(path=None):
    path = Path(path or ak.PLAN_JSON)
    if not path.exists():
        raise OrchestrateError(f"{rel(path)} not found: run `uv run profile.py` and "
                               f"`uv run extract.py --top 5` first")
    try:
        plan = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise OrchestrateError(f"{rel(path)} is not valid JSON ({e}): re-run "
                               f"`uv run extract.py`")
    kernels = plan.get("kernels") if isinstance(plan, dict) else None
    if not kernels or not isinstance(kernels, list):
        raise OrchestrateError(f"{rel(path)} lists no kernels: re-run `uv run extract.py`")
    seen = set()
    for i, k in enumerate(kernels):
        missing = [f for f in ("name", "kernel_type", "file", "share")
                   if not isinstance(k, dict) or f not in k]
        if missing:
            raise OrchestrateError(f"{rel(path)}: kernel #{i + 1} lacks {', '.join(missing)}: "
                                   f"re-run `uv run extract.py`")
        if k["kernel_type"] not in ak.KERNEL_TYPES:
            raise OrchestrateError(f"{rel(path)}: kernel {k['name']!r} has unknown type "
                                   f"{k['kernel_type']!r}")
        if not isinstance(k["share"], (int, float)) or not 0 <= k["share"] <= 1:
            raise OrchestrateError(f"{rel(path)}: kernel {k['name']!r} share {k['share']!r} "
                                   f"is not a fraction in [0, 1]")
        if k["name"] in seen:
            raise OrchestrateError(f"{rel(path)}: kernel name {k['name']!r} appears twice")
        seen.add(k["name"])
    if sum(k["share"] for k in kernels) > 1.0 + 1e-6:
        raise OrchestrateError(f"{rel(path)}: the kernels' shares add up to more than 1")
    return plan


def _truthy(value):
    return str(value).strip().lower() not in ("false", "0", "no", "n")


def read_results(path=None, must_exist=False):
    """results.tsv as a DataFrame: numeric columns as floats, plus `kept` and `timing_ok`
    booleans. A missing file is no experiments yet (unless must_exist); anything unreadable
    raises OrchestrateError with a one-line reason."""
    path = Path(path or ak.RESULTS_TSV)
    if not path.exists():
        if must_exist:
            raise OrchestrateError(f"{rel(path)} not found: run `uv run bench.py` first")
        return _add_derived(pd.DataFrame(columns=ak.RESULTS_COLUMNS))
    if path.stat().st_size == 0:
        raise OrchestrateError(f"{rel(path)} is empty (not even a header): delete it and let "
                               f"`uv run bench.py` write a new one")
    try:
        df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        reason = " ".join(str(e).split())
        raise OrchestrateError(f"{rel(path)} is malformed ({reason}): fix or move that line")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise OrchestrateError(f"{rel(path)} is malformed: missing column(s) "
                               f"{', '.join(missing)} (expected a bench.py results file)")
    df = df.apply(lambda col: col.str.strip())
    bad = df[~df.correctness.isin(ak.CORRECTNESS_VALUES)]
    if len(bad):
        raise OrchestrateError(f"{rel(path)} is malformed: data row {bad.index[0] + 1} has "
                               f"correctness {bad.correctness.iloc[0]!r}, not one of "
                               f"{'/'.join(ak.CORRECTNESS_VALUES)}")
    for col in NUMERIC_COLUMNS:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return _add_derived(df)


def _add_derived(df):
    df = df.reset_index(drop=True)
    for col in NUMERIC_COLUMNS:
        if col in df.columns:
            df[col] = df[col].astype(float)
    df["timing_ok"] = df["timing_valid"].map(_truthy) if "timing_valid" in df.columns else True
    if "status" in df.columns:
        df["kept"] = df.status.eq("keep")
    else:
        # The seed's ten-column format has no status: replay the gate (PASS and faster than
        # the best kept so far for this tag).
        kept, best = [], {}
        for tag, ok, lat in zip(df.tag, df.correctness.eq("PASS"), df.latency_us):
            keep = bool(ok) and lat == lat and lat < best.get(tag, math.inf)
            best[tag] = lat if keep else best.get(tag, math.inf)
            kept.append(keep)
        df["kept"] = pd.Series(kept, dtype=bool, index=df.index)
        df["status"] = df.kept.map({True: "keep", False: "revert"})
    df["kept"] = df["kept"].astype(bool)
    return df


# ---------------------------------------------------------------------------------------------
# Per-kernel statistics
# ---------------------------------------------------------------------------------------------

def throughput(rows, kernel_type):
    """(per-row throughput, unit): GB/s for memory-bound types, TFLOP/s for compute-bound ones,
    from latency_us and the type's byte/FLOP counts at the row's shape and dtype (bench.py
    rounds its columns, which leaves interpreter timings at 0.00). Rows without a shape or
    dtype (the seed's format) keep the recorded column."""
    ktype = ak.KERNEL_TYPES.get(kernel_type)
    memory = ktype is not None and ktype.bound == "memory"
    column, unit = ("bandwidth_gb_s", "GB/s") if memory else ("throughput_tflops", "TFLOP/s")
    if column not in rows.columns:
        column, unit = "throughput_tflops", "TFLOP/s"
    values = []
    for _, r in rows.iterrows():
        try:
            shape = tuple(int(d) for d in str(r["shape"]).split("x"))
            dtype = ak.DTYPES[r["dtype"]]
            # bytes / us / 1e3 = GB/s; FLOPs / us / 1e6 = TFLOP/s
            work = ktype.bytes(shape, dtype) / 1e3 if unit == "GB/s" else ktype.flops(shape) / 1e6
            values.append(work / r["latency_us"] if r["latency_us"] > 0 else math.nan)
        except (AttributeError, KeyError, ValueError, TypeError, IndexError):
            values.append(r[column])
    return pd.Series(values, index=rows.index, dtype=float), unit


def latest_setting(rows):
    """The last PASS row: its shape/dtype/device is what the kernel is benchmarked at now
    (a row that failed before the kernel file parsed has no shape)."""
    passed = rows[rows.correctness.eq("PASS")]
    return passed.iloc[-1] if len(passed) else None


def same_setting(rows, like=None):
    """The rows benchmarked at the same shape/dtype/device as `like` (default: the latest
    setting), because bench.py only compares latencies within one setting."""
    cols = [c for c in SETTING_COLUMNS if c in rows.columns]
    like = latest_setting(rows) if like is None else like
    if like is None or not cols:
        return rows
    mask = pd.Series(True, index=rows.index)
    for c in cols:
        mask &= rows[c] == like[c]
    return rows[mask]


def kernel_stats(rows, like=None):
    """Summary of one kernel's rows (in results.tsv order). speedup_basis says what the speedup
    is against: 'eager' (speedup_vs_pytorch, valid timing), 'starter' (first PASS row) or '-'."""
    setting = same_setting(rows, like)
    passed = setting[setting.correctness.eq("PASS") & setting.latency_us.gt(0)]
    kept = passed[passed.kept]
    stats = {"runs": len(rows), "kept": int(rows.kept.sum()),
             "failed": int((~rows.correctness.eq("PASS")).sum()),
             "best": None, "best_us": math.nan, "baseline_us": math.nan, "eager_us": math.nan,
             "pct_peak": math.nan, "speedup": 1.0, "speedup_basis": "-"}
    if len(passed):
        stats["baseline_us"] = float(passed.latency_us.iloc[0])
        eager = passed[passed.timing_ok & passed.speedup_vs_pytorch.gt(0)]
        if len(eager):
            stats["eager_us"] = float(eager.latency_us.iloc[-1] * eager.speedup_vs_pytorch.iloc[-1])
    if len(kept):
        best = kept.loc[kept.latency_us.idxmin()]
        stats.update(best=best, best_us=float(best.latency_us), pct_peak=float(best.pct_peak))
        if stats["eager_us"] == stats["eager_us"]:
            stats.update(speedup=stats["eager_us"] / stats["best_us"], speedup_basis="eager")
        else:
            stats.update(speedup=stats["baseline_us"] / stats["best_us"], speedup_basis="starter")
    return stats


def amdahl(shares_and_speedups):
    """Whole-model speedup when kernel i (share_i of model time) runs s_i times faster."""
    covered = sum(share for share, _ in shares_and_speedups)
    remaining = 1.0 - covered + sum(share / max(s, 1e-12) for share, s in shares_and_speedups)
    return 1.0 / remaining if remaining > 0 else math.inf


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
        raise OrchestrateError(f"--now/AUTOKERNEL_NOW {text!r} is not an ISO time such as "
                               f"2025-01-01T03:00:00")


def git(*args, check=True):
    proc = subprocess.run(["git", *args], cwd=ak.ROOT, capture_output=True, text=True)
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise OrchestrateError(f"git {' '.join(args[:2])} failed: {last}", code=1)
    return proc


def in_own_repo():
    """True when ROOT is the top of a git work tree (not a folder inside some other repo)."""
    proc = git("rev-parse", "--show-toplevel", check=False)
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == ak.ROOT.resolve()


def require_git():
    if not in_own_repo():
        raise OrchestrateError(f"{ak.ROOT} is not a git repository: do program.md's setup "
                               f"(a branch autokernel/<date>-<model>) first")


def head_kernel_source():
    """kernel.py as committed at HEAD (None before it is tracked)."""
    proc = git("show", "HEAD:kernel.py", check=False)
    return proc.stdout if proc.returncode == 0 else None


def kernel_name_of(source):
    """The results.tsv tag a kernel file gets: its last top-level KERNEL_NAME, else KERNEL_TYPE."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("KERNEL_NAME", "KERNEL_TYPE"):
                    names[target.id] = node.value.value
    return names.get("KERNEL_NAME") or names.get("KERNEL_TYPE")


def head_kernel_name(plan):
    if not in_own_repo():
        return None
    source = head_kernel_source()
    name = kernel_name_of(source) if source else None
    return name if name in plan_kernels(plan) else None


def require_clean_kernel_py():
    status = git("status", "--porcelain", "--", "kernel.py").stdout
    if status.startswith("??"):
        raise OrchestrateError("kernel.py is not committed: `git add kernel.py && git commit` "
                               "it (or delete it) before switching kernels")
    if status.strip():
        raise OrchestrateError("kernel.py has uncommitted edits: run `uv run bench.py` first "
                               "(it keeps or reverts them), then ask again")


def commit_kernel_py(message):
    git("add", "kernel.py")
    if git("diff", "--cached", "--quiet", "--", "kernel.py", check=False).returncode == 0:
        return None  # kernel.py already holds this kernel at HEAD: nothing to commit
    identity = []
    if not git("config", "user.email", check=False).stdout.strip():
        identity = ["-c", "user.name=autokernel", "-c", "user.email=autokernel@localhost"]
    git(*identity, "commit", "-q", "-m", message, "--", "kernel.py")
    return git("rev-parse", "--short", "HEAD").stdout.strip()


# ---------------------------------------------------------------------------------------------
# State: the visits (a cache; results.tsv and kernel.py are the truth)
# ---------------------------------------------------------------------------------------------

def plan_kernels(plan):
    return {k["name"]: k for k in plan["kernels"]}


def _check_state(state, plan, rows):
    if not isinstance(state, dict) or state.get("version") != 1:
        raise ValueError("unknown version")
    if state.get("plan_created") != plan.get("created"):
        raise ValueError("written for another plan.json")
    if not state["visits"] and rows.tag.isin(list(plan_kernels(plan))).any():
        raise ValueError("no visits, but results.tsv has rows of plan kernels")
    last_row = 0
    for v in state["visits"]:
        if v["kernel"] not in plan_kernels(plan):
            raise ValueError(f"kernel {v['kernel']!r} is not in plan.json")
        parse_time(v["start"])
        if not isinstance(v["first_row"], int) or not last_row <= v["first_row"] <= len(rows):
            raise ValueError("visit rows do not match results.tsv")
        last_row = v["first_row"]


def rebuild_state(plan, rows, head_name, now):
    """Visits = maximal runs of consecutive results.tsv rows of one plan kernel; a visit starts
    at its first row's timestamp. kernel.py (at HEAD) names the current kernel."""
    names, visits = plan_kernels(plan), []
    for i, tag in enumerate(rows.tag):
        if tag not in names or (visits and visits[-1]["kernel"] == tag):
            continue
        try:
            start = parse_time(rows.timestamp.iloc[i]).isoformat()
        except (AttributeError, ValueError, TypeError):
            start = now.isoformat()
        if visits:
            visits[-1]["left"] = "rebuilt from results.tsv"
        visits.append({"kernel": tag, "start": start, "first_row": i, "left": None})
    if head_name and (not visits or visits[-1]["kernel"] != head_name):
        if visits:
            visits[-1]["left"] = "rebuilt from results.tsv"
        visits.append({"kernel": head_name, "start": now.isoformat(), "first_row": len(rows),
                       "left": None})
    return {"version": 1, "plan_created": plan.get("created"), "visits": visits}


def save_state(state, path=None):
    path = Path(path or ak.ORCHESTRATE_JSON)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)  # atomic: a crash mid-write never leaves a half file


def load_state(plan, rows, now, path=None):
    path = Path(path or ak.ORCHESTRATE_JSON)
    head_name = head_kernel_name(plan)
    problem = None
    if not path.exists():
        problem = "missing" if len(rows) else None
    else:
        try:
            state = json.loads(path.read_text())
            _check_state(state, plan, rows)
            current = state["visits"][-1]["kernel"] if state["visits"] else None
            if head_name and current != head_name:
                problem = f"stale (it says {current}, kernel.py holds {head_name})"
            else:
                return state
        except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
            problem = f"corrupt ({e})"
    state = rebuild_state(plan, rows, head_name, now)
    if problem:
        print(f"note: {rel(path)} {problem}: rebuilt it from results.tsv and kernel.py",
              file=sys.stderr)
    save_state(state, path)
    return state


# ---------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------

def visit_progress(rows, visit, now):
    """Where the current visit stands: revert streak, hours, speedup since the visit began."""
    tag_rows = rows[rows.tag == visit["kernel"]]
    during = tag_rows[(tag_rows.index >= visit["first_row"]) & (tag_rows.status != "judged")]
    streak = 0
    for kept in reversed(list(during.kept)):
        if kept:
            break
        streak += 1
    stats = kernel_stats(tag_rows)
    before = tag_rows[tag_rows.index < visit["first_row"]]
    like = latest_setting(tag_rows)
    earlier = kernel_stats(before, like) if len(before) and like is not None else None
    if earlier is None or earlier["best"] is None:
        visit_speedup = stats["speedup"]  # first visit: against eager, or the starter
    else:
        visit_speedup = earlier["best_us"] / stats["best_us"]
    hours = (now - parse_time(visit["start"])).total_seconds() / 3600
    return {"kernel": visit["kernel"], "streak": streak, "hours": hours,
            "visit_speedup": visit_speedup, "pct_peak": stats["pct_peak"]}


def move_on_reasons(p, limits):
    reasons = []
    if p["streak"] >= limits.max_reverts:
        reasons.append(f"{p['streak']} consecutive reverts (limit {limits.max_reverts}): "
                       f"plateaued")
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
    return (f"{p['streak']} of {limits.max_reverts} consecutive reverts, "
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
    stats = {name: kernel_stats(rows[rows.tag == name]) for name in plan_kernels(plan)}
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


def switch(plan, rows, state, name, why, now):
    """Save HEAD's kernel.py (the current kernel's best kept version: bench.py commits every
    keep) to its workspace file, copy `name`'s file into kernel.py, commit, open a new visit.
    Returns the lines to print."""
    kernels = plan_kernels(plan)
    if name not in kernels:
        raise OrchestrateError(f"no kernel {name!r} in plan.json: choose one of "
                               f"{', '.join(kernels)}")
    require_git()
    require_clean_kernel_py()
    target = ak.ROOT / kernels[name]["file"]
    if not target.exists():
        raise OrchestrateError(f"{kernels[name]['file']} (kernel {name}) is missing: re-run "
                               f"`uv run extract.py`")
    if kernel_name_of(target.read_text()) != name:
        raise OrchestrateError(f"{kernels[name]['file']} is tagged "
                               f"{kernel_name_of(target.read_text())!r}, not {name!r}: its "
                               f"KERNEL_NAME must match plan.json")
    lines = []
    head = head_kernel_source()
    head_name = kernel_name_of(head) if head else None
    if head_name in kernels:
        saved = ak.ROOT / kernels[head_name]["file"]
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(head)
        lines.append(f"saved: {head_name}'s best kept version -> {kernels[head_name]['file']}")
    ak.KERNEL_PY.write_text(target.read_text())
    commit = commit_kernel_py(f"orchestrate: switch to {name}")
    if state["visits"]:
        state["visits"][-1]["left"] = why
    state["visits"].append({"kernel": name, "start": now.isoformat(), "first_row": len(rows),
                            "left": None})
    save_state(state)
    lines.append(f"installed: {kernels[name]['file']} -> kernel.py"
                 f"{f' (commit {commit})' if commit else ' (already at HEAD)'}")
    return lines


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def report(action, kernel, reason, more=()):
    """Greppable `key: value` lines; `action` first, so an agent can read one line."""
    print(f"action: {action}")
    print(f"kernel: {kernel}")
    print(f"reason: {reason}")
    for line in more:
        print(line)


def cmd_next(args, limits):
    plan, rows, now = read_plan(), read_results(), now_from(args)
    require_git()
    require_clean_kernel_py()  # an unjudged edit would be lost by a switch, and skews a stay
    state = load_state(plan, rows, now)
    if not state["visits"]:
        name = plan["kernels"][0]["name"]
        why = "start: the first kernel in plan priority order"
        report("switch", name, why, switch(plan, rows, state, name, why, now))
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
    plan, rows, now = read_plan(), read_results(), now_from(args)
    require_git()
    state = load_state(plan, rows, now)
    lines = switch(plan, rows, state, args.name, "switched by hand (orchestrate.py install)", now)
    report("switch", args.name, "installed by hand", lines)


def status_table(plan, rows, state):
    """One row per plan kernel, in plan order; `*` marks the current one."""
    current = state["visits"][-1]["kernel"] if state["visits"] else None
    table = []
    for k in plan["kernels"]:
        tag_rows = rows[rows.tag == k["name"]]
        s = kernel_stats(tag_rows)
        values, unit = throughput(tag_rows, k["kernel_type"])
        best = s["best"]
        table.append({
            "": "*" if k["name"] == current else "",
            "kernel": k["name"], "type": k["kernel_type"], "share": f"{100 * k['share']:.1f}%",
            "visits": sum(v["kernel"] == k["name"] for v in state["visits"]),
            "runs": s["runs"], "kept": s["kept"], "failed": s["failed"],
            "best_us": "-" if s["best"] is None else f"{s['best_us']:.1f}",
            "throughput": "-" if best is None else f"{values[best.name]:.4g} {unit}",
            "peak": "-" if s["pct_peak"] != s["pct_peak"] else f"{s['pct_peak']:.0f}%",
            "speedup": "-" if s["speedup_basis"] == "-"
            else f"{s['speedup']:.2f}x {s['speedup_basis']}",
        })
    return pd.DataFrame(table)


def cmd_status(args, limits):
    plan, rows, now = read_plan(), read_results(), now_from(args)
    state = load_state(plan, rows, now)
    current = state["visits"][-1] if state["visits"] else None
    print(f"plan: {plan.get('model', '?')} ({len(plan['kernels'])} kernels), "
          f"{len(rows)} experiments in results.tsv")
    print(status_table(plan, rows, state).to_string(index=False))
    if current:
        p = visit_progress(rows, current, now)
        print(f"current: {current['kernel']}: {progress_line(p, limits)}")
        reasons = move_on_reasons(p, limits)
        if reasons:
            print(f"move on: yes ({'; '.join(reasons)}): run `uv run orchestrate.py next`")
    else:
        print("current: none: run `uv run orchestrate.py next` to install the first kernel")
    pairs = [(k["share"], kernel_stats(rows[rows.tag == k["name"]])["speedup"])
             for k in plan["kernels"]]
    ceiling = amdahl([(share, math.inf) for share, _ in pairs])
    print(f"projected model speedup: {amdahl(pairs):.3f}x (Amdahl over "
          f"{100 * sum(s for s, _ in pairs):.1f}% of model time; {ceiling:.2f}x if these "
          f"kernels took no time)")
    if len(rows) and not rows.timing_ok.all():
        print("timings: some rows are not meaningful (CPU interpreter)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["status", "next", "install"])
    parser.add_argument("name", nargs="?", help="kernel name from plan.json (install only)")
    parser.add_argument("--max-reverts", type=int, default=Limits.max_reverts)
    parser.add_argument("--peak-pct", type=float, default=Limits.peak_pct)
    parser.add_argument("--max-hours", type=float, default=Limits.max_hours)
    parser.add_argument("--target-speedup", type=float, default=Limits.target_speedup)
    parser.add_argument("--now", help="ISO time to use as now (default: AUTOKERNEL_NOW or the "
                                      "clock)")
    args = parser.parse_args(argv)
    if (args.command == "install") != (args.name is not None):
        parser.error("install takes a kernel NAME; status and next take none")
    limits = Limits(args.max_reverts, args.peak_pct, args.max_hours, args.target_speedup)
    try:
        {"status": cmd_status, "next": cmd_next, "install": cmd_install}[args.command](args,
                                                                                      limits)
    except OrchestrateError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.code)


if __name__ == "__main__":
    main()
