"""
The gate: judge kernel.py (correctness in five stages, then timing and roofline), append one row to
results.tsv, and keep (git commit) or revert (git checkout HEAD -- kernel.py) the edit.

    uv run bench.py -m "BLOCK_N 2048"     # judge kernel.py, keep or revert it; -m: description
    uv run bench.py --quick               # smoke test + timing only, to iterate: recorded as
                                          #   "judged", never kept or reverted
    uv run bench.py --no-git              # judge and record (status "judged"), no git action
    uv run bench.py --kernel kernels/softmax.py   # any kernel file; implies --no-git
    uv run bench.py --timeout 60 --results /tmp/r.tsv --margin 0.02

Keep: correctness PASS and no kept row yet for this tag+shape+dtype+device, or a latency below the
best kept one x (1 - margin): kernel.py alone is committed ("bench: keep <tag> exp N: ..."). Else
revert: kernel.py is restored from HEAD. Nothing else in the repo is touched. --timeout limits the
kernel's part of the run (its clock starts once the harness has imported torch).

How it works. This process stays light (no torch): it runs this same file again as a CHILD with a
hidden flag, under a hard wall-clock limit in its own process group, so a hang becomes a TIMEOUT row
and an abort, segfault or illegal memory access a CRASH row instead of a dead harness. The child
imports torch once, checks the repo (refuses to judge when a harness file differs from HEAD or
results.tsv is malformed), loads the kernel and runs the stages:

    1 smoke        primary shape and dtype (BENCH_SHAPES[0] / BENCH_DTYPE, else the type's)
    2 sweep        the type's sweep shapes + BENCH_SHAPES, in every dtype
    3 stability    adversarial inputs (autokernel's per-type makers) in every dtype
    4 determinism  three runs on the same inputs, bitwise equal
    5 edge         non-power-of-two and vocabulary-sized shapes, in every dtype

then times the primary shape (triton.testing.do_bench median, L2 flushed) and reads the baselines
and ceilings that prepare.py cached. It reports to the parent through a JSON-lines file; the parent
writes the row and does the git action. The first failing stage stops the run and names why.

Honesty: fresh random inputs every run; two input sets per check (a cached result fails);
allocations made inside kernel_fn are poisoned (NaN, then a finite sentinel to name "elements left
unwritten"); torch compute ops called from kernel_fn are rejected; inputs must come back unmodified
and the output must be a new tensor that shares no memory with them.

Output: `key: value` lines, the verdict last. Exit 0 for a judgement (keep, revert or judged),
2 when it refuses to judge (usage, dirty harness, not a git repo, malformed results.tsv: no row is
written then), 1 when the harness itself fails.

In-process API for tests: bench.check(module, quick=False) -> {"correctness", "reason", "stages",
...} runs the five stages on an imported kernel module.
"""
import argparse
import ast
import csv
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent
STAGES = ("smoke", "sweep", "stability", "determinism", "edge")
DEFAULT_TIMEOUT_S = 180
STARTUP_LIMIT_S = 300      # importing torch and checking the repo, before the kernel's clock starts
BASELINE_LIMIT_S = 1800    # prepare.baseline_times may torch.compile (max-autotune) a new shape
CHILD_LOG = "bench_child.log"  # the child's stderr, kept in the workspace for debugging


class Refusal(Exception):
    """The gate will not judge (exit 2, no row): the one-line message says what to do."""


# =============================================================================================
# Parent: CLI, supervising the child, results.tsv, keep/revert
# =============================================================================================

def parse_args(argv=None):
    p = argparse.ArgumentParser(description="AutoKernel gate: correctness, timing, keep/revert.")
    p.add_argument("--quick", action="store_true", help="smoke test on the primary shape + timing")
    p.add_argument("--no-git", action="store_true", help="judge and record, no commit/restore")
    p.add_argument("--kernel", help="kernel file to judge (default kernel.py; others imply --no-git)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"wall-clock limit for the kernel's run in seconds (default {DEFAULT_TIMEOUT_S})")
    p.add_argument("-m", "--description", default="", help="what this experiment tries")
    p.add_argument("--results", help="results file (default results.tsv in the repo)")
    p.add_argument("--margin", type=float, default=0.02,
                   help="keep only when faster than the best kept by this fraction (default 0.02)")
    p.add_argument("--child", help=argparse.SUPPRESS)  # internal: the JSON-lines report path
    args = p.parse_args(argv)
    if not 0 <= args.margin < 1:
        p.error(f"--margin {args.margin} must be in [0, 1), e.g. 0.02 for 2%")
    if not args.timeout > 0:
        p.error(f"--timeout {args.timeout} must be positive (seconds)")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    try:
        return judge(args)
    except Refusal as e:
        print(f"bench.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench.py: interrupted; nothing recorded, kernel.py untouched", file=sys.stderr)
        return 130


def judge(args):
    started = time.monotonic()
    child = run_child(args)
    msgs = child["messages"]
    facts, plan = last(msgs, "facts"), last(msgs, "plan") or {}
    if last(msgs, "refuse"):
        raise Refusal(last(msgs, "refuse")["message"])
    if facts is None:
        why = "timed out" if child["timed_out"] else describe_exit(child["returncode"])
        print(f"bench.py: error: the gate's child process {why} before it started: "
              f"{child['stderr_line'] or 'no output'}", file=sys.stderr)
        return 1
    save_child_log(facts, child)
    result = last(msgs, "result") or died_result(child, msgs)

    kernel_path, results_path = Path(facts["kernel"]), Path(facts["results_tsv"])
    git_mode = facts["git_mode"]
    rows = read_results(results_path, facts["columns"])  # malformed -> Refusal, file untouched
    correctness, reason = result["correctness"], result.get("reason", "")

    # Something changed the harness or the kernel file while it was being judged.
    if git_mode:
        changed = porcelain(git("status", "--porcelain", "--", *facts["harness_files"]))
        if changed and correctness == "PASS":
            correctness = "FAIL"
            reason = f"harness files changed during the run: {', '.join(changed)}"
    kernel_changed = file_sha256(kernel_path) != facts["kernel_sha256"]

    key = (plan.get("tag", ""), plan.get("shape_str", ""), plan.get("dtype", ""), facts["device"])
    best = best_kept(rows, key)
    latency = result.get("latency_us")
    faster = latency is not None and (best is None or latency < best * (1 - args.margin))
    experiment = len(rows) + 1
    commit = ""
    if not git_mode or args.quick:  # a smoke test alone never keeps (nor reverts) a kernel
        status = "judged"
    elif kernel_changed:
        status = "judged"
        reason = reason or "kernel.py changed while it was being judged: neither kept nor reverted"
    elif correctness == "PASS" and faster:
        status = "keep"
        commit, error = git_keep(facts["kernel_rel"], plan, result, experiment,
                                 args.description)
        if error:
            status, reason = "judged", f"git commit failed: {error}"
    else:
        status = "revert"
        restored = git("checkout", "HEAD", "--", facts["kernel_rel"])
        if restored.returncode != 0:
            reason = (reason + "; " if reason else "") + \
                f"git restore failed: {one_line(restored.stderr)}"

    row = make_row(facts, plan, result, experiment, correctness, reason, status, commit,
                   args.description)
    append_row(results_path, facts["columns"], row)
    print_summary(row, result, facts, plan, best, args, child, time.monotonic() - started)
    return 1 if reason.startswith(("git commit failed", "git restore failed")) else 0


def run_child(args):
    """Run this file as the child; enforce the limits; collect its reports and stderr."""
    fd, report = tempfile.mkstemp(prefix="bench_", suffix=".jsonl")
    os.close(fd)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", report,
           "--timeout", str(args.timeout), "--margin", str(args.margin)]
    cmd += ["--quick"] * args.quick + ["--no-git"] * args.no_git
    if args.kernel:
        cmd += ["--kernel", str(Path(args.kernel).resolve())]
    if args.results:
        cmd += ["--results", str(Path(args.results).resolve())]
    with tempfile.TemporaryFile() as err:
        # Own session: on a timeout the whole group (compile workers included) is killed.
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=err, start_new_session=True)
        start = time.monotonic()
        deadline = start + STARTUP_LIMIT_S
        timed_out, clock_started, baselines = False, False, False
        try:
            while True:
                try:
                    proc.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                msgs = read_messages(report)
                if not clock_started and last(msgs, "plan"):
                    clock_started, deadline = True, time.monotonic() + args.timeout
                if not baselines and any(m.get("name") == "baselines" for m in msgs):
                    baselines, deadline = True, time.monotonic() + BASELINE_LIMIT_S
                if last(msgs, "result"):  # reported: a child stuck in teardown costs 10 s at most
                    deadline = min(deadline, time.monotonic() + 10)
                if time.monotonic() > deadline:
                    timed_out = True
                    kill_group(proc)
                    break
        except BaseException:  # Ctrl-C: take the child down with us, write nothing
            kill_group(proc)
            raise
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    msgs = read_messages(report)
    os.unlink(report)
    return {"messages": msgs, "returncode": proc.returncode, "timed_out": timed_out,
            "stderr": stderr, "stderr_line": crash_line(stderr),
            "elapsed_s": time.monotonic() - start, "limit_s": args.timeout}


def file_sha256(path):
    import hashlib
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def read_messages(path):
    messages = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    messages.append(json.loads(line))
                except json.JSONDecodeError:  # a line the child was still writing
                    pass
    except FileNotFoundError:
        pass
    return messages


def last(messages, kind):
    found = [m for m in messages if m.get("kind") == kind]
    return found[-1] if found else None


def describe_exit(returncode):
    if returncode is not None and returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def crash_line(stderr):
    """The most telling line of a dead child's stderr (faulthandler's header, else the last)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Fatal Python error") or "illegal memory access" in line:
            return line
    return lines[-1] if lines else ""


def died_result(child, msgs):
    """The result of a child that never reported one: TIMEOUT or CRASH, with where it was."""
    stage = last(msgs, "stage")
    where = f" during {stage['name']}" + (f" at {stage['where']}" if stage.get("where") else "") \
        if stage else " while loading the kernel"
    if child["timed_out"]:
        return {"correctness": "TIMEOUT",
                "reason": f"exceeded the {child['limit_s']:g} s wall-clock limit{where}"}
    line = child["stderr_line"]
    oom = child["returncode"] == -signal.SIGKILL and not line
    reason = f"child process {describe_exit(child['returncode'])}{where}" + \
        (" (out of host memory? the OOM killer sends SIGKILL)" if oom else "") + \
        (f": {line}" if line else "")
    return {"correctness": "CRASH", "reason": reason}


def save_child_log(facts, child):
    if not child["stderr"].strip():
        return
    try:
        path = Path(facts["workspace"]) / CHILD_LOG
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(child["stderr"])
        child["log_path"] = str(path)
    except OSError:
        pass


# ---- results.tsv ----------------------------------------------------------------------------

def read_results(path, columns):
    """Rows of an existing results.tsv as dicts ([] when missing or empty). Anything malformed is
    a Refusal: the file is never rewritten, only appended to."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return []
    try:
        with open(path, newline="") as f:
            table = list(csv.reader(f, delimiter="\t"))
    except (csv.Error, UnicodeDecodeError, OSError) as e:
        raise Refusal(f"{path} is malformed ({one_line(e)}); fix it or move it aside")
    if not table or table[0] != list(columns):
        got = table[0] if table else []
        diff = next((i for i, (a, b) in enumerate(zip(got, columns)) if a != b),
                    min(len(got), len(columns)))
        raise Refusal(f"{path} is malformed: its header differs from the expected columns at "
                      f"column {diff + 1} ({got[diff] if diff < len(got) else 'missing'!r} vs "
                      f"{columns[diff] if diff < len(columns) else 'nothing'!r}); "
                      f"fix it or move it aside")
    rows = []
    for number, fields in enumerate(table[1:], start=2):
        if len(fields) != len(columns):
            raise Refusal(f"{path} is malformed: line {number} has {len(fields)} fields, "
                          f"expected {len(columns)}; fix it or move it aside")
        rows.append(dict(zip(columns, fields)))
    return rows


def best_kept(rows, key):
    """Lowest latency among kept PASS rows for this (tag, shape, dtype, device), else None."""
    best = None
    for row in rows:
        if (row["status"], row["correctness"]) != ("keep", "PASS") or \
                (row["tag"], row["shape"], row["dtype"], row["device"]) != key:
            continue
        try:
            latency = float(row["latency_us"])
        except ValueError:
            raise Refusal(f"results.tsv is malformed: experiment {row['experiment']} is kept "
                          f"but its latency_us {row['latency_us']!r} is not a number")
        best = latency if best is None else min(best, latency)
    return best


def clean_text(text, limit=400):
    """One line, no tabs: safe in a TSV cell (quotes are escaped by the csv writer)."""
    text = re.sub(r"[\t\r\n\x00-\x1f]+", " ", str(text)).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def num(x, digits):
    return "" if x is None or x != x else f"{x:.{digits}f}"


def make_row(facts, plan, result, experiment, correctness, reason, status, commit, description):
    return {
        "experiment": experiment, "tag": plan.get("tag", ""),
        "kernel_type": plan.get("kernel_type", ""),
        "throughput_tflops": num(result.get("throughput_tflops"), 4),
        "latency_us": num(result.get("latency_us"), 3), "pct_peak": num(result.get("pct_peak"), 2),
        "speedup_vs_pytorch": num(result.get("speedup_vs_pytorch"), 4),
        "correctness": correctness, "peak_vram_mb": num(result.get("peak_vram_mb"), 1),
        "description": clean_text(description),
        "bandwidth_gb_s": num(result.get("bandwidth_gb_s"), 2),
        "speedup_vs_compile": num(result.get("speedup_vs_compile"), 4),
        "status": status, "commit": commit,
        "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "shape": plan.get("shape_str", ""), "dtype": plan.get("dtype", ""),
        "device": facts["device"],
        "timing_valid": "" if result.get("latency_us") is None else
        str(bool(result.get("timing_valid"))),
        "reason": clean_text(reason),
    }


def append_row(path, columns, row):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        if new:
            writer.writerow(columns)
        writer.writerow([row.get(c, "") for c in columns])


# ---- git ------------------------------------------------------------------------------------

def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def porcelain(status):
    """Paths out of `git status --porcelain` output."""
    return [line[3:] for line in status.stdout.splitlines() if line.strip()]


def one_line(text):
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def git_keep(kernel, plan, result, experiment, description):
    """Commit kernel.py alone; returns (short hash, error). A kernel identical to HEAD (the first
    run of a starter) is kept as the commit that already holds it."""
    if git("diff", "--quiet", "HEAD", "--", kernel).returncode != 0:
        speed = result.get("speedup_vs_pytorch")
        message = (f"bench: keep {plan['tag']} exp {experiment}: {result['latency_us']:.1f} us"
                   + (f" ({speed:.2f}x eager)" if speed else "")
                   + (f" - {clean_text(description, 200)}" if description else ""))
        add = git("add", "--", kernel)
        done = add if add.returncode else git("commit", "-q", "-m", message, "--", kernel)
        if done.returncode != 0:
            return "", one_line(done.stderr or done.stdout)
    head = git("rev-parse", "--short", "HEAD")
    return head.stdout.strip(), None if head.returncode == 0 else one_line(head.stderr)


# ---- printing -------------------------------------------------------------------------------

def fmt(x, digits=1, unit=""):
    return "n/a" if x is None or x != x else f"{x:.{digits}f}{unit}"


def print_summary(row, result, facts, plan, best, args, child, elapsed):
    print(f"correctness: {row['correctness']}")
    if row["reason"]:
        print(f"reason: {row['reason']}")
    if row["correctness"] in ("CRASH", "TIMEOUT") and child["stderr"].strip():
        lines = [line for line in child["stderr"].splitlines() if line.strip()]
        # faulthandler's report starts with the innermost frames: show those, else the tail.
        fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
        excerpt = lines[fatal[-1]:fatal[-1] + 8] if fatal else lines[-8:]
        print("child_stderr: |\n" + "\n".join("  " + line for line in excerpt))
    if child.get("log_path"):
        print(f"child_log: {child['log_path']}")
    if result.get("latency_us") is not None:
        for key, digits in (("latency_us", 2), ("throughput_tflops", 3), ("bandwidth_gb_s", 1),
                            ("pct_peak", 1), ("speedup_vs_pytorch", 3),
                            ("speedup_vs_compile", 3), ("peak_vram_mb", 1)):
            print(f"{key}: {fmt(result.get(key), digits)}")
        for key in ("bound", "ceiling_bandwidth_gb_s", "datasheet_bandwidth_gb_s",
                    "ceiling_tflops", "datasheet_tflops", "eager_us", "compile_us", "library",
                    "library_us"):
            if result.get(key) is not None:
                value = result[key]
                print(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}")
        print(f"timing_valid: {bool(result.get('timing_valid'))}")
        if not result.get("timing_valid"):
            print("timing_note: timings not meaningful (CPU interpreter)")
        if result.get("above_ceiling"):
            print("warning: faster than the measured ceiling allows (pct_peak capped at 100); "
                  "the cached ceiling may be stale (uv run prepare.py --force)")
    print(f"best_kept_us: {fmt(best, 2)}")
    print(f"status: {row['status']}")
    if row["commit"]:
        print(f"commit: {row['commit']}")
    print(f"experiment: {row['experiment']}")
    print(f"results: {facts['results_tsv']}")
    print(f"wall_s: {elapsed:.1f}")
    print("verdict: " + verdict(row, result, plan, best, args.margin, args.quick))


def verdict(row, result, plan, best, margin, quick=False):
    word = {"keep": "KEEP", "revert": "REVERT", "judged": "JUDGED"}[row["status"]]
    name = plan.get("tag") or "kernel"
    if row["correctness"] != "PASS":
        return f"{word} {name} {row['correctness']}: {row['reason']}"
    latency = result["latency_us"]
    parts = [f"{word} {name} {latency:.1f} us"]
    for key, label in (("speedup_vs_pytorch", "eager"), ("speedup_vs_compile", "compile")):
        if result.get(key):
            parts.append(f"{result[key]:.2f}x {label}")
    pct = result.get("pct_peak")
    if pct is not None and pct == pct:
        parts.append(f"{pct:.0f}% of attainable")
    text = ", ".join(parts)
    if row["status"] == "revert" and best is not None:
        text += f"; not faster than best kept {best:.1f} us by the {margin:.0%} margin"
    if row["reason"]:
        text += f"; {row['reason']}"
    if not result.get("timing_valid"):
        text += " (timings not meaningful: CPU interpreter)"
    if quick:
        text += " (--quick: smoke test only; a full run decides keep or revert)"
    return text


# =============================================================================================
# Child: imports torch once, checks the repo, runs the stages and the timing
# =============================================================================================

class Reporter:
    """JSON lines to the parent, one flushed write each (an abort loses nothing written)."""

    def __init__(self, path):
        self.path = path

    def emit(self, kind, **data):
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": kind, "t": round(time.time(), 3), **data},
                               default=str) + "\n")

    def stage(self, name, where=""):
        self.emit("stage", name=name, where=where)


def child_main(args):
    import faulthandler
    faulthandler.enable()  # a segfault/abort leaves a Python traceback on stderr for the parent
    report = Reporter(args.child)
    import autokernel as ak  # sets TRITON_INTERPRET on a CPU before triton is imported

    kernel = Path(args.kernel) if args.kernel else ak.KERNEL_PY
    git_mode = not args.no_git and kernel.resolve() == ak.KERNEL_PY.resolve()
    device = torch_device_name(ak)
    facts = {"columns": ak.RESULTS_COLUMNS, "harness_files": list(ak.HARNESS_FILES),
             "results_tsv": str(Path(args.results) if args.results else ak.RESULTS_TSV),
             "kernel": str(kernel), "kernel_rel": os.path.relpath(kernel, ROOT),
             "git_mode": git_mode, "device": device, "workspace": str(ak.WORKSPACE),
             "kernel_sha256": file_sha256(kernel)}  # the parent notices edits during the run
    report.emit("facts", **facts)
    try:
        preflight(facts, kernel)
    except Refusal as e:
        report.emit("refuse", message=str(e))
        return 2

    attrs, syntax_error = read_kernel_attrs(kernel)
    try:
        report.emit("plan", **make_plan(attrs))
    except KernelFileError:  # reported by check() below; record what we know for the row
        report.emit("plan", tag=str(attrs.get("KERNEL_NAME") or attrs.get("KERNEL_TYPE") or
                                    kernel.stem), kernel_type=str(attrs.get("KERNEL_TYPE") or ""))
    # The kernel's own prints go to stderr (the child log), so stdout carries only the gate's
    # key: value lines: a kernel cannot print a verdict of its own there.
    stdout, sys.stdout = sys.stdout, sys.stderr
    log = lambda line: print(line, file=stdout, flush=True)  # noqa: E731
    log(f"kernel: {facts['kernel_rel']}")
    log(f"device: {device}")
    if syntax_error:
        result = {"correctness": "FAIL", "reason": syntax_error}
    else:
        report.stage("import")
        try:
            module = ak.load_module(kernel)
        except BaseException as e:  # noqa: B036  (SystemExit from a kernel file is a failure too)
            if isinstance(e, KeyboardInterrupt):
                raise
            traceback.print_exc()
            kind = "import error" if isinstance(e, ImportError) else \
                f"{type(e).__name__} while importing the kernel file"
            result = {"correctness": "FAIL", "reason": f"{kind}: {short(e)}"}
        else:
            result = check(module, quick=args.quick, on_stage=report.stage, log=log)
            if result.get("plan"):
                report.emit("plan", **result["plan"])
            if result["correctness"] == "PASS":
                result.update(measure(module, result["plan"], report, log))
    report.emit("result", **{k: v for k, v in result.items() if k not in ("plan",)})
    return 0


def torch_device_name(ak):
    import torch
    return torch.cuda.get_device_name() if ak.CUDA else "cpu-interpreter"


def preflight(facts, kernel):
    """Refuse to judge (Refusal -> exit 2, no row) when the verdict could not be trusted or
    recorded: a missing kernel file, a repo whose harness differs from HEAD, a bad results.tsv."""
    if not kernel.is_file():
        raise Refusal(f"kernel file {kernel} does not exist")
    if facts["git_mode"]:
        inside = git("rev-parse", "--is-inside-work-tree")
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            raise Refusal(f"{ROOT} is not a git repository, so kept kernels cannot be committed; "
                          f"run git init and commit, or use --no-git")
        if git("rev-parse", "--verify", "-q", "HEAD").returncode != 0:
            raise Refusal("the repository has no commit yet; commit the harness and kernel.py "
                          "first, or use --no-git")
        for name in facts["harness_files"] + [facts["kernel_rel"]]:
            if git("ls-files", "--error-unmatch", "--", name).returncode != 0:
                raise Refusal(f"{name} is not committed; commit it first (a revert restores "
                              f"kernel.py from HEAD, and the harness must be the committed one)")
        dirty = porcelain(git("status", "--porcelain", "--", *facts["harness_files"]))
        if dirty:
            raise Refusal(f"{', '.join(dirty)} differ{'s' if len(dirty) == 1 else ''} from HEAD; "
                          f"the gate only judges with the committed harness (git diff; restore "
                          f"or commit the change)")
    read_results(facts["results_tsv"], facts["columns"])


# ---- the kernel file ------------------------------------------------------------------------

class KernelFileError(Exception):
    """The kernel file breaks the contract (the message is the row's reason)."""


class CheckFailure(Exception):
    """A stage failed (FAIL)."""


class CheckCrash(Exception):
    """The device is gone (illegal memory access, device-side assert): CRASH, stop at once."""


CONTRACT_NAMES = ("KERNEL_TYPE", "KERNEL_NAME", "BENCH_SHAPES", "BENCH_DTYPE", "BACKEND")


def read_kernel_attrs(path):
    """Literal contract assignments read WITHOUT running the file (the last assignment wins),
    so a row can be tagged even when importing the file crashes. -> (attrs, syntax error)."""
    source = Path(path).read_text(errors="replace")
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as e:
        attrs = dict(re.findall(r"^(KERNEL_TYPE|KERNEL_NAME)\s*=\s*['\"]([\w.-]+)['\"]",
                                source, re.M))
        return attrs, f"syntax error in {Path(path).name} line {e.lineno}: {e.msg}"
    attrs = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in CONTRACT_NAMES:
                    try:
                        attrs[target.id] = ast.literal_eval(node.value)
                    except Exception:  # computed at import time: check() reads the real value
                        pass
    return attrs, None


def make_plan(attrs):
    """What to judge, from the kernel file's contract names: type, tag, shapes, primary dtype."""
    import autokernel as ak
    name = attrs.get("KERNEL_TYPE")
    if name is None:
        raise KernelFileError(f"kernel file defines no KERNEL_TYPE; set it to one of "
                              f"{', '.join(ak.KERNEL_TYPE_NAMES)}")
    if name not in ak.KERNEL_TYPES:
        raise KernelFileError(f"unknown KERNEL_TYPE {name!r}: use one of "
                              f"{', '.join(ak.KERNEL_TYPE_NAMES)}")
    ktype = ak.KERNEL_TYPES[name]
    shapes = attrs.get("BENCH_SHAPES") or [ktype.shapes("primary")]
    try:
        shapes = [tuple(int(d) for d in s) for s in shapes]
    except (TypeError, ValueError):
        raise KernelFileError(f"BENCH_SHAPES must be a list of shape tuples, got {shapes!r}")
    for s in shapes:
        if len(s) != len(ktype.shape_names) or min(s) < 1:
            raise KernelFileError(f"BENCH_SHAPES entry {s} is not a {name} shape "
                                  f"({', '.join(ktype.shape_names)}, all >= 1)")
    try:
        dtype = ak.parse_dtype(str(attrs.get("BENCH_DTYPE") or "fp16"))
    except ValueError as e:
        raise KernelFileError(f"BENCH_DTYPE: {e}")
    if dtype not in ktype.dtypes():  # bf16 tl.dot is wrong in the CPU interpreter
        dtype = ktype.dtypes()[0]
    tag = str(attrs.get("KERNEL_NAME") or name)
    return {"kernel_type": name, "tag": tag, "shape": list(shapes[0]),
            "shape_str": ktype.shape_str(shapes[0]), "bench_shapes": [list(s) for s in shapes],
            "dtype": ak.DTYPE_NAMES[dtype]}


def short(exc, limit=300):
    """An exception as one line: its first line, and its last when they differ (Triton's
    CompilationError puts the source excerpt between them)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = type(exc).__name__ if not lines else \
        lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return clean_text(text, limit)


# ---- the dispatch guard: poison allocations, reject torch compute ---------------------------

# Ops kernel_fn may call: allocate and initialise outputs, views and metadata. Everything else in
# aten/prims is math that must happen in the kernel's own Triton (or CUDA) code.
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
               "empty_permuted"}
ALLOWED_OPS = ALLOCATIONS | {
    "zeros", "zeros_like", "new_zeros", "full", "full_like", "new_full", "fill_", "zero_",
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "t",
    "transpose", "permute", "squeeze", "unsqueeze", "select", "slice", "alias", "detach",
    "unbind", "split", "split_with_sizes", "chunk", "narrow", "unflatten", "view_as",
    "expand_as", "lift_fresh", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "size", "stride", "dim", "numel", "storage_offset", "is_contiguous", "is_same_size",
    "is_non_overlapping_and_dense", "_local_scalar_dense", "record_stream",
}
SENTINEL = 7777.0  # second poison: finite and far from any softmax/norm/sum output here


def make_guard():
    """A TorchDispatchMode class (built lazily: the parent never imports torch)."""
    import torch
    import triton
    from torch.utils._python_dispatch import TorchDispatchMode
    triton_dir = os.path.dirname(triton.__file__) + os.sep

    def from_triton():
        # Triton's interpreter and autotuner issue torch ops themselves (host copies, do_bench).
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.startswith(triton_dir):
                return True
            frame = frame.f_back
        return False

    class Guard(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            # Otherwise torch wraps __torch_dispatch__ in torch._dynamo.disable, and the first
            # call imports all of dynamo (~900 modules, seconds). Nothing here is compiled.
            return False

        def __init__(self, poison):
            super().__init__()
            self.poison, self.violation = poison, None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if func.namespace in ("aten", "prims") and name not in ALLOWED_OPS \
                    and not from_triton():
                # Remember it: a kernel that swallows the exception is still caught.
                self.violation = self.violation or f"{func.namespace}.{name}"
                raise ForbiddenOp(self.violation)
            out = func(*args, **(kwargs or {}))
            if name in ALLOCATIONS and isinstance(out, torch.Tensor) and out.is_floating_point():
                out.fill_(self.poison)  # unwritten elements will show
            return out

    return Guard


class ForbiddenOp(Exception):
    pass


# ---- the stages -----------------------------------------------------------------------------

def check(module, quick=False, on_stage=None, log=None):
    """Run the correctness stages on an imported kernel module. Returns {"correctness": "PASS" |
    "FAIL" | "CRASH", "reason", "stages": {name: "PASS" | "FAIL" | "skipped"}, "failed_stage",
    "checks", "plan"}. quick: the smoke stage only."""
    log = log or (lambda line: None)
    result = {"correctness": "FAIL", "reason": "", "stages": {s: "skipped" for s in STAGES},
              "failed_stage": None, "checks": 0, "plan": None}
    try:
        attrs = {k: getattr(module, k) for k in CONTRACT_NAMES if hasattr(module, k)}
        result["plan"] = plan = make_plan(attrs)
        if not callable(getattr(module, "kernel_fn", None)):
            raise KernelFileError("kernel file defines no kernel_fn(...); it must take the "
                                  "reference's tensors by name and return a new tensor")
    except KernelFileError as e:
        result["reason"] = str(e)
        log(f"kernel_file: FAIL {e}")
        return result
    for key in ("kernel_type", "tag", "shape_str", "dtype"):
        log(f"{'shape' if key == 'shape_str' else key}: {plan[key]}")
    gate = Gate(module.kernel_fn, plan, on_stage or (lambda name, where="": None))
    for number, stage in enumerate(STAGES, start=1):
        if result["failed_stage"] or (quick and number > 1):
            why = f"{result['failed_stage']} failed" if result["failed_stage"] else "--quick"
            log(f"stage_{number}_{stage}: skipped ({why})")
            continue
        started, before = time.perf_counter(), gate.checks
        try:
            getattr(gate, stage)()
        except (CheckFailure, CheckCrash) as e:
            crash = isinstance(e, CheckCrash)
            result.update(correctness="CRASH" if crash else "FAIL", failed_stage=stage,
                          reason=f"{stage}: {e}")
            result["stages"][stage] = "FAIL"
            log(f"stage_{number}_{stage}: FAIL {e}")
            if crash:  # the device is unusable: nothing more can run in this process
                break
            continue
        result["stages"][stage] = "PASS"
        log(f"stage_{number}_{stage}: PASS ({gate.checks - before} checks, "
            f"{time.perf_counter() - started:.2f} s)")
    result["checks"] = gate.checks
    if not result["failed_stage"]:
        result["correctness"] = "PASS"
    return result


class Gate:
    """Runs kernel_fn under the guard on fresh inputs and judges each output."""

    def __init__(self, fn, plan, on_stage):
        import torch
        import autokernel as ak
        self.torch, self.ak, self.fn, self.on_stage = torch, ak, fn, on_stage
        self.ktype = ak.KERNEL_TYPES[plan["kernel_type"]]
        self.primary = tuple(plan["shape"])
        self.bench_shapes = [tuple(s) for s in plan["bench_shapes"]]
        self.dtype = ak.DTYPES[plan["dtype"]]
        self.Guard = make_guard()
        # Fresh inputs every run: nothing to memorise. Never a fixed seed.
        self.gen = torch.Generator(device=ak.DEVICE)
        self.gen.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self.checks = 0

    # The five stages, in order. Each raises CheckFailure naming what is wrong.
    def smoke(self):
        self.random_case("smoke", self.primary, self.dtype)

    def sweep(self):
        for shape in unique(list(self.ktype.shapes("sweep")) + self.bench_shapes):
            for dtype in self.ktype.dtypes():
                self.random_case("sweep", shape, dtype)

    def stability(self):
        for shape in self.ktype.shapes("stability"):
            for dtype in self.ktype.dtypes():
                cases = self.ktype.adversarial(tuple(shape), dtype, self.ak.DEVICE, self.gen)
                for label, inputs in cases:
                    self.judge("stability", [inputs], f"{self.where(shape, dtype)}, {label}")

    def determinism(self):
        shape, dtype = self.primary, self.dtype
        where = self.where(shape, dtype)
        self.on_stage("determinism", where)
        inputs = self.ktype.inputs(shape, dtype, self.ak.DEVICE, self.gen)
        pristine = {k: v.clone() for k, v in inputs.items()}
        ref = self.ktype.reference(**pristine)
        outs = [self.call(inputs, float("nan"), where) for _ in range(3)]
        self.checks += 1
        for out in outs:
            self.check_output(out, inputs, pristine, ref, where)
        first = bits(outs[0])
        for out in outs[1:]:
            differ = int((bits(out) != first).sum())
            if differ:
                raise CheckFailure(f"non-deterministic: 3 runs on the same inputs differ in "
                                   f"{differ} of {out.numel()} elements at {where}")
        self.compare(outs[0], ref, pristine, where)

    def edge(self):
        for shape in self.ktype.shapes("edge"):
            for dtype in self.ktype.dtypes():
                self.random_case("edge", shape, dtype)

    # ---- helpers ----
    def where(self, shape, dtype):
        return f"{self.ktype.shape_str(shape)} {self.ak.DTYPE_NAMES[dtype]}"

    def random_case(self, stage, shape, dtype):
        # Two different input sets at the same shape: a result cached from the first call, or
        # an output buffer reused across calls, fails on the second.
        sets = [self.ktype.inputs(tuple(shape), dtype, self.ak.DEVICE, self.gen) for _ in range(2)]
        self.judge(stage, sets, self.where(shape, dtype))

    def judge(self, stage, sets, where):
        torch = self.torch
        self.on_stage(stage, where)
        pristine = [{k: v.clone() for k, v in inputs.items()} for inputs in sets]
        refs = [self.ktype.reference(**inputs) for inputs in pristine]
        outs = [self.call(inputs, float("nan"), where) for inputs in sets]
        self.checks += len(sets)
        for i, (inputs, clean, out, ref) in enumerate(zip(sets, pristine, outs, refs)):
            self.check_output(out, inputs, clean, ref, where)
            for earlier, earlier_ref in zip(outs[:i], refs[:i]):
                if overlaps(out, earlier):
                    raise CheckFailure(f"returned the same output buffer for two different "
                                       f"inputs (a result cached from an earlier call) at {where}")
                # Identical outputs for different inputs are a cache only if they are wrong
                # for these inputs: a correct single bf16 sum can equal another draw's.
                if torch.equal(bits(out), bits(earlier)) and not torch.equal(ref, earlier_ref) \
                        and bool(self.ktype.mismatches(out, ref, clean)[0].any()):
                    raise CheckFailure(f"returned a result cached from an earlier call "
                                       f"(identical output for different inputs) at {where}")
            self.compare(out, ref, clean, where)

    def call(self, inputs, poison, where):
        torch = self.torch
        guard = self.Guard(poison)
        try:
            with guard:
                out = self.fn(**inputs)
            if self.ak.CUDA:
                torch.cuda.synchronize()  # surface asynchronous device errors here
        except ForbiddenOp:
            pass
        except BaseException as e:  # noqa: B036  (SystemExit from kernel_fn is a failure too)
            if isinstance(e, KeyboardInterrupt):
                raise
            if guard.violation is None:
                traceback.print_exc()
                text = f"{type(e).__name__}: {short(e)}"
                if is_oom(torch, e):
                    raise CheckFailure(f"out of memory at {where}: {short(e)}")
                if is_device_fault(e):
                    raise CheckCrash(f"device fault at {where}: {text}")
                raise CheckFailure(f"kernel_fn raised {text} at {where}")
        if guard.violation:
            raise CheckFailure(f"kernel_fn called torch compute op {guard.violation}; do the "
                               f"math in a Triton kernel")
        return out

    def check_output(self, out, inputs, pristine, ref, where):
        """Everything but the values: type, aliasing, shape, dtype, inputs left unmodified."""
        torch = self.torch
        if not isinstance(out, torch.Tensor):
            raise CheckFailure(f"kernel_fn returned {type(out).__name__}, expected a new "
                               f"torch.Tensor at {where}")
        for name, tensor in inputs.items():
            if out is tensor:
                raise CheckFailure(f"kernel_fn returned its input {name}; return a new tensor")
            if overlaps(out, tensor):
                raise CheckFailure(f"the output shares memory with input {name}; return a new "
                                   f"tensor")
        ref_shape = tuple(ref.shape)
        if tuple(out.shape) != ref_shape:
            raise CheckFailure(f"wrong output shape {tuple(out.shape)}, expected {ref_shape} "
                               f"at {where}")
        expected = self.ak.out_dtype(self.ktype, inputs)
        if out.dtype != expected:
            raise CheckFailure(f"wrong output dtype {str(out.dtype).replace('torch.', '')}, "
                               f"expected {str(expected).replace('torch.', '')} at {where}")
        if out.device != inputs[self.ktype.args[0]].device:
            raise CheckFailure(f"output on {out.device}, expected "
                               f"{inputs[self.ktype.args[0]].device}")
        for name, tensor in inputs.items():
            changed = int((bits(tensor) != bits(pristine[name])).sum())
            if changed:
                raise CheckFailure(f"kernel_fn modified its input {name} ({changed} of "
                                   f"{tensor.numel()} elements changed) at {where}")

    def compare(self, out, ref, pristine, where):
        """Values against the fp64 oracle (autokernel.mismatches: the input dtype's tolerance,
        atol in units of the output's RMS or the type's error_scale). A mismatch is
        re-run with a finite poison: outputs that differ exactly where the poison differs were
        never written."""
        torch = self.torch
        dtype = pristine[self.ktype.args[0]].dtype
        tol = self.ak.tolerance(dtype)
        got, want = out.double(), ref.double()
        bad, atol = self.ktype.mismatches(got, want, pristine)
        if not bool(bad.any()):
            return
        total = out.numel()
        again = self.call({k: v.clone() for k, v in pristine.items()}, SENTINEL, where)
        if isinstance(again, torch.Tensor) and again.shape == out.shape \
                and again.dtype == out.dtype:
            differ = bits(again) != bits(out)
            sentinel = torch.tensor(SENTINEL, dtype=out.dtype, device=out.device)
            unwritten = differ & torch.isnan(out.reshape(-1)) & (again.reshape(-1) == sentinel)
            n = int(differ.sum())
            if n and int(unwritten.sum()) == n:
                raise CheckFailure(f"elements left unwritten ({n} of {total}) at {where}")
        finite_ref = torch.isfinite(want)
        for label, mask in (("NaN", torch.isnan(got)), ("Inf", torch.isinf(got))):
            count = int((mask & finite_ref).sum())
            if count:
                raise CheckFailure(f"output has {label} ({count} of {total} elements) at {where}")
        n = int(bad.sum())
        err = (got - want).abs().masked_fill(~bad, 0)
        worst = int(err.reshape(-1).argmax())
        index = list(int(i) for i in unravel(worst, out.shape))
        raise CheckFailure(
            f"wrong values at {where}: {n} of {total} elements outside rtol={tol:g}, "
            f"atol={atol:.3g} "
            f"(worst at {index}: got {got.reshape(-1)[worst].item():.6g}, expected "
            f"{want.reshape(-1)[worst].item():.6g})")


def unique(shapes):
    seen, out = set(), []
    for s in shapes:
        if tuple(s) not in seen:
            seen.add(tuple(s))
            out.append(tuple(s))
    return out


def unravel(flat, shape):
    index = []
    for size in reversed(tuple(shape)):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))


def bits(t):
    """The raw bits of a tensor, flat (bitwise equality, NaN included)."""
    import torch
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = t.detach().reshape(-1)
    return flat.view(ints[flat.element_size()]) if flat.is_floating_point() else flat


def overlaps(a, b):
    """True when two tensors' storages share any byte."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


def is_oom(torch, e):
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None), MemoryError) if t)
    text = str(e).lower()
    return isinstance(e, oom_types) or "out of memory" in text or "can't allocate memory" in text


def is_device_fault(e):
    text = str(e).lower()
    return any(s in text for s in ("illegal memory access", "device-side assert",
                                   "unspecified launch failure", "illegal instruction",
                                   "misaligned address", "cuda error"))


# ---- timing and roofline --------------------------------------------------------------------

def measure(module, plan, report, log):
    """Time the primary shape and dtype; roofline against prepare.py's measured ceilings."""
    import torch
    import autokernel as ak
    ktype, shape, dtype = ak.KERNEL_TYPES[plan["kernel_type"]], tuple(plan["shape"]), \
        ak.DTYPES[plan["dtype"]]
    report.stage("timing", plan["shape_str"] + " " + plan["dtype"])
    gen = torch.Generator(device=ak.DEVICE)
    gen.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    inputs = ktype.inputs(shape, dtype, ak.DEVICE, gen)
    fn = lambda: module.kernel_fn(**inputs)  # noqa: E731  (no guard: it would cost time)
    out = {"timing_valid": ak.TIMING_MEANINGFUL, "peak_vram_mb": None}
    try:
        if ak.CUDA:
            import triton.testing
            out["latency_us"] = triton.testing.do_bench(fn, return_mode="median") * 1e3
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            result = fn()
            torch.cuda.synchronize()
            # Peak of everything resident during one call (inputs + output + scratch).
            out["peak_vram_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
        else:  # the interpreter: a median of a few wall-clock calls, labelled meaningless
            times = []
            for _ in range(3):
                start = time.perf_counter()
                result = fn()
                times.append(time.perf_counter() - start)
            out["latency_us"] = statistics.median(times) * 1e6
    except Exception as e:
        traceback.print_exc()
        kind = "CRASH" if is_device_fault(e) else "FAIL"
        return {"correctness": kind, "reason": f"timing: kernel_fn raised {type(e).__name__}: "
                                               f"{short(e)}", "timing_valid": None}
    # The timed calls ran without the guard: their output must still be right.
    ref = ktype.reference(**inputs)
    if not isinstance(result, torch.Tensor) or result.shape != ref.shape or \
            bool(ktype.mismatches(result, ref, inputs)[0].any()):
        return {"correctness": "FAIL", "latency_us": None,
                "reason": "timing: output outside the guard differs from the oracle"}

    ceilings, baselines = {}, {}
    try:
        import prepare
        ceilings = prepare.load_ceilings()
        report.stage("baselines")  # may time eager/compile once for a new shape: own limit
        baselines = prepare.baseline_times(ktype, shape, dtype)
    except Exception as e:  # a broken or missing prepare.py costs the speedups, not the verdict
        print(f"bench: baselines unavailable ({type(e).__name__}: {short(e)})", file=sys.stderr)
    tflops = (ceilings.get("tflops") or {}).get(plan["dtype"])
    roof = ak.roofline(ktype, shape, dtype, out["latency_us"],
                       {"bandwidth_gb_s": ceilings.get("bandwidth_gb_s"), "tflops": tflops})
    spec = ceilings.get("spec") or {}
    eager, compiled = baselines.get("eager_us"), baselines.get("compile_us")
    out.update(roof, bound=ktype.bound, ceiling_bandwidth_gb_s=ceilings.get("bandwidth_gb_s"),
               ceiling_tflops=tflops, datasheet_bandwidth_gb_s=spec.get("bandwidth_gb_s"),
               datasheet_tflops=spec.get("fp16_tflops") if plan["dtype"] != "fp32" else None,
               eager_us=eager, compile_us=compiled, library=baselines.get("library"),
               library_us=baselines.get("library_us"),
               speedup_vs_pytorch=eager / out["latency_us"] if eager else None,
               speedup_vs_compile=compiled / out["latency_us"] if compiled else None)
    if out["pct_peak"] != out["pct_peak"]:  # NaN: no ceilings (CPU, or prepare.py never ran)
        out["pct_peak"] = None
    return out


if __name__ == "__main__":
    code = main()
    if "--child" in sys.argv:
        # Skip interpreter and CUDA teardown: everything is reported, and a kernel that broke
        # the device can hang or abort there.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
