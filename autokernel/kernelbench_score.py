"""
Scoring a folder of KernelBench solutions against a folder of problems (kernelbench.py score):
each solution matched to its problem by file name, judged by the gate (autokernel/kernelbench.py's
stages, autokernel/judge.py's untrusted child and timing) in a process of its own, and summed up as
KernelBench's fast_p. A score judges one dtype (--dtype, fp32 by default), as KernelBench judges
one precision; bench.py judges a kernel.py in every dtype the problem allows.

A row's verdict:
    correct    every stage passed; timed by the judge's clock against the problem's Model, eager
               and torch.compile'd (speedup = their time / the solution's)
    incorrect  refused by the source check before it ran (autokernel/source_check.py: torch
               doing the math, the dispatcher's internals, patching, ...), or it ran and was
               wrong or dishonest: wrong values, NaN, elements left unwritten, a torch compute
               op in forward (the heavy work handed to torch or to Model), a cached
               or aliased output, changed inputs, non-determinism, a timing contradiction,
               files changed during the run
    error      it could not be judged running: no ModelNew, an import error, ModelNew(...) or
               forward raised, out of memory, a crash or a hang (TIMEOUT), or the problem failed
    missing    no solution file of that name
fast_p (p = 0, 1, 1.5, 2) = the share of all problems that are correct and more than p times
faster than the baseline (fast_0: the correct share).

The JSON (--out) holds {"device", "dtype", "timing_valid", "compile_mode", "n", "fast_p":
{"eager": {"0": .., "1": .., "1.5": .., "2": ..}, "compile": {...}}, "problems": [{"name",
"verdict", "reason", "failed_stage", "stages", "log" (the gate's stage lines), "latency_us",
"eager_us", "compile_us", "speedup_vs_eager", "speedup_vs_compile", "oracle", "problem",
"solution", "seconds"}]}.
"""
import contextlib
import gc
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import autokernel as ak
from autokernel import gate, kernelbench, source_check, state, zygote
from autokernel.cli import UsageError, describe, one_line
from autokernel.contract import KernelFileError
from autokernel.judge import (CHILD_LOG, ChildGone, ChildRunner, left_running, measure,
                              tampered)

FAST_P = (0, 1, 1.5, 2)
# Reasons that mean the solution never produced an output to judge (see the verdicts above).
ERROR_MARKS = (" raised ", "out of memory", "device fault", kernelbench.JUDGE_FAILED)


def match(problems_dir, solutions_dir):
    """[(name, problem file, solution file or None)] in the problems' numeric order, and the
    solution files that match no problem."""
    problems = sorted(Path(problems_dir).glob("*.py"), key=natural)
    if not problems:
        raise UsageError(f"no problem files (*.py) in {problems_dir}: pass the folder of "
                         f"KernelBench problems, e.g. KernelBench/level1")
    names = {p.name for p in problems}
    pairs = [(p.stem, p, Path(solutions_dir) / p.name if (Path(solutions_dir) / p.name).is_file()
              else None) for p in problems]
    extra = sorted(s.name for s in Path(solutions_dir).glob("*.py") if s.name not in names)
    return pairs, extra


def natural(path):
    """1_x, 2_y, ..., 10_z: KernelBench's problem ids sort as numbers."""
    head = path.stem.split("_", 1)[0]
    return (int(head), path.stem) if head.isdigit() else (float("inf"), path.stem)


def score(problems_dir, solutions_dir, dtype="fp32", timeout=180.0, call_timeout=None,
          compile_mode=kernelbench.COMPILE_MODE, log=print):
    """Judge every problem's solution; returns the report (the JSON above)."""
    zygote.start()  # before any torch compute (CPU only: autokernel/zygote.py)
    pairs, extra = match(problems_dir, solutions_dir)
    for name in extra:
        log(f"note: {name} matches no problem file; not judged")
    rows = []
    with state.exclusive():  # no bench.py at the same time: timings and the repo stay honest
        for note in state.recover() or []:
            log(f"note: {note}")
        state.become_subreaper()
        for i, (name, problem, solution) in enumerate(pairs, start=1):
            started = time.monotonic()
            log(f"[{i}/{len(pairs)}] {name} ...")
            try:
                row = judge(name, problem, solution, dtype, timeout, call_timeout,
                            compile_mode)
            except Exception as e:  # a failure of the scorer itself costs this row only
                row = dict(blank_row(name, problem, solution), verdict="error",
                           reason=f"the scorer failed: {describe(e)}")
            row["seconds"] = round(time.monotonic() - started, 1)
            log(f"[{i}/{len(pairs)}] {line(row)}  ({row['seconds']:.0f} s)")
            rows.append(row)
    return {"device": torch.cuda.get_device_name() if ak.CUDA else "cpu-interpreter",
            "dtype": dtype, "timing_valid": ak.TIMING_MEANINGFUL, "compile_mode": compile_mode,
            "n": len(rows), "fast_p": {base: fast_p(rows, base) for base in ("eager", "compile")},
            "problems": rows}


def blank_row(name, problem, solution):
    return {"name": name, "verdict": "missing", "reason": "", "failed_stage": None,
            "stages": None, "log": [], "latency_us": None, "eager_us": None, "compile_us": None,
            "speedup_vs_eager": None, "speedup_vs_compile": None, "oracle": None,
            "problem": str(problem), "solution": str(solution) if solution else None}


def judge(name, problem, solution, dtype, timeout, call_timeout, compile_mode):
    """One problem's row; nothing a solution does costs more than its own row."""
    row = blank_row(name, problem, solution)
    if solution is None:
        return row
    attrs = {"KERNEL_TYPE": "kernelbench", "KERNEL_NAME": name, "BENCH_DTYPE": dtype,
             "KERNELBENCH_PROBLEM": str(Path(problem).resolve()),
             "KERNELBENCH_SHA256": state.digest(Path(problem).read_bytes())}
    try:
        plan = kernelbench.plan(attrs, dtypes=[dtype])
    except KernelFileError as e:  # the problem itself fails
        return dict(row, verdict="error", reason=str(e))
    row["oracle"] = plan["oracles"][plan["dtype"]]["note"]
    try:
        with wall_limit(timeout + GRACE_S):
            outcome = run_solution(solution, plan, timeout, call_timeout)
    except RowTimeout:
        outcome = {"correctness": "TIMEOUT", "reason": f"exceeded the {timeout:g} s wall-clock "
                   "limit (the judge's work on its inputs and oracle included)"}
    finally:
        # What reference cycles still hold of the row's inputs and oracle: GBs at KernelBench
        # sizes (the H100 judge held 14.5 GiB after problem 36) that the next row may need.
        gc.collect()
        if ak.CUDA:
            torch.cuda.empty_cache()
    row.update(verdict=verdict(outcome), reason=outcome.get("reason", ""),
               failed_stage=outcome.get("failed_stage"), stages=outcome.get("stages"),
               log=outcome.get("log", []))
    if row["verdict"] == "correct":
        row["latency_us"] = outcome["latency_us"]
        base = kernelbench.speedups(plan, outcome["latency_us"], compile_mode)
        row.update(eager_us=base["eager_us"], compile_us=base["compile_us"],
                   speedup_vs_eager=base["speedup_vs_pytorch"],
                   speedup_vs_compile=base["speedup_vs_compile"])
    return row


class RowTimeout(Exception):
    """A solution's judgement ran past its wall-clock limit."""


# The child's waits end at the limit with the stage named; the alarm is the backstop for the
# judge's own work between two replies (a 9 GB problem's inputs and float64 oracle, the checks).
GRACE_S = 15.0


@contextlib.contextmanager
def wall_limit(seconds):
    """Raise RowTimeout in this (main) thread after `seconds`, wherever it is; elsewhere, or
    without setitimer, no limit."""
    if threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return

    def ring(signum, frame):
        raise RowTimeout()
    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_solution(solution, plan, timeout, call_timeout):
    """bench.py's judgement of one kernel file, with the plan fixed by the scorer (a solution
    cannot name another problem or type): the source check, the untrusted child, the stages,
    the timing; the repo snapshotted before and restored after, every process it started
    killed."""
    refused = source_check.refusal(solution)  # read before anything runs it
    if refused:
        return {"correctness": "FAIL", "reason": refused}
    # The judge's own helpers outlive each solution: inductor's compile workers (started by the
    # torch.compile baseline; killing them hangs the next problem's compile) and
    # multiprocessing's resource tracker (started with the first child; it tracks shared memory).
    helpers = set(state.descendants())
    with tempfile.TemporaryDirectory(prefix="autokernel_kbscore_") as scratch:
        snapshot = state.Snapshot.take(Path(scratch) / "results.tsv")
    snapshot.save(candidate=solution)
    try:
        outcome = in_child(solution, plan, timeout, call_timeout, snapshot)
    except ChildGone as e:
        outcome = {"correctness": e.correctness, "reason": e.reason(CHILD_LOG)}
    finally:
        for child in ChildRunner.started:
            child.stop()
        ChildRunner.started.clear()  # the next solution's log starts empty
        strays = state.end_strays(helpers | {state.resource_tracker_pid()})
        changed = snapshot.restore()
        state.SNAPSHOT_PATH.unlink(missing_ok=True)
    if changed:
        outcome.update(correctness="FAIL", reason=tampered(changed), unjudged=False)
    elif strays:
        outcome.update(correctness="FAIL", reason=left_running(strays), unjudged=False)
    return outcome


def in_child(solution, plan, timeout, call_timeout, snapshot):
    runner = ChildRunner(solution, time.monotonic() + timeout, timeout)
    if call_timeout:
        runner.request_limit = call_timeout
    hello = runner.start()
    outcome = {"correctness": "FAIL", "reason": "", "log": []}
    changed = snapshot.restore()  # most tampering happens at import
    if changed:
        return dict(outcome, reason=tampered(changed))
    if hello["status"] == "import_failed":
        return dict(outcome, reason=hello["error"], unjudged=True)
    if not hello.get("has_model_new"):
        return dict(outcome, reason="the solution defines no ModelNew class", unjudged=True)
    outcome.update(gate.check(runner, plan, on_stage=runner.at, log=outcome["log"].append,
                              judge_class=kernelbench.ProblemJudge))
    if outcome["correctness"] == "PASS":
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the table's
            outcome.update(measure(runner, None, plan))
    return outcome


def verdict(outcome):
    if outcome["correctness"] == "PASS" and outcome.get("latency_us") is not None:
        return "correct"
    if outcome["correctness"] in ("CRASH", "TIMEOUT") or outcome.get("unjudged") or \
            any(mark in outcome.get("reason", "") for mark in ERROR_MARKS):
        return "error"
    return "incorrect"


def fast_p(rows, baseline):
    """{p: share of all rows correct and more than p times faster than the baseline} (p = 0:
    correct at all); None where no row has a time for that baseline."""
    key = f"speedup_vs_{baseline}"
    timed = any(r[key] is not None for r in rows)
    out = {}
    for p in FAST_P:
        if p and not timed:
            out[str(p)] = None
            continue
        hits = sum(1 for r in rows if r["verdict"] == "correct"
                   and (p == 0 or (r[key] is not None and r[key] > p)))
        out[str(p)] = hits / len(rows) if rows else 0.0
    return out


# ---- printing -------------------------------------------------------------------------------

def line(row):
    """NAME: verdict, the speedups vs eager and vs torch.compile, then the times (or why the
    solution is not correct)."""
    head = (f"{row['name']}: {row['verdict']}  {speed(row['speedup_vs_eager'])} eager, "
            f"{speed(row['speedup_vs_compile'])} compile")
    if row["verdict"] == "correct":
        return (f"{head}  ({row['latency_us']:.1f} us; eager {us(row['eager_us'])}, compile "
                f"{us(row['compile_us'])})")
    return f"{head}  ({one_line(row['reason'], 200)})" if row["reason"] else head


def speed(x):
    return "n/a" if x is None else f"{x:.2f}x"


def us(x):
    return "n/a" if x is None else f"{x:.1f} us"


def table(report):
    """The per-problem lines, then fast_p against both baselines."""
    lines = [line(row) for row in report["problems"]]
    counts = {v: sum(1 for r in report["problems"] if r["verdict"] == v)
              for v in ("correct", "incorrect", "error", "missing")}
    lines.append(f"problems: {report['n']} ({', '.join(f'{n} {v}' for v, n in counts.items())}); "
                 f"dtype {report['dtype']}, {report['device']}")
    lines.append("fast_p: share of all problems correct and more than p times faster")
    lines.append(f"  {'baseline':<10}" + "".join(f"{'fast_' + str(p):>10}" for p in FAST_P))
    for base in ("eager", "compile"):
        shares = report["fast_p"][base]
        lines.append(f"  {base:<10}" + "".join(
            f"{'n/a' if shares[str(p)] is None else format(shares[str(p)], '.2f'):>10}"
            for p in FAST_P))
    if not report["timing_valid"]:
        lines.append("timings: not meaningful (CPU interpreter; no torch.compile here)")
    return lines
