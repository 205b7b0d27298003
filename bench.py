"""
The gate: judge kernel.py (five correctness stages, then timing and roofline), append one row to
results.tsv, and keep (git commit) or revert (git checkout HEAD -- kernel.py) the edit.

    uv run bench.py -m "BLOCK_N 2048"     # judge kernel.py, keep or revert it; -m: what you tried
    uv run bench.py --quick -m "idea"     # smoke test + timing only, to iterate: recorded as
                                          #   "judged", never kept or reverted
    uv run bench.py --no-git              # judge and record (status "judged"), no git action
    uv run bench.py --kernel kernels/softmax.py   # any kernel file; implies --no-git
    uv run bench.py --timeout 60 --results /tmp/r.tsv

Keep rule (autokernel/results.keep_rule): a candidate that passes all five stages is timed in paired
rounds against the best kept version of its tag, shape, dtype and device, in the same run, on this
process's clock; it is kept only when its median gain beats the rounds' spread (and 1%), and, where
the kept version read more than 10% above its recorded latency, that record by 5%
(autokernel/results.keep_rule_checked). The first correct version of a setting is kept. A keep
commits kernel.py alone and copies it to the kernel's file in workspace/ (its file of record in
plan.json); a revert restores kernel.py from HEAD.

Trust. This process is the judge. The kernel file is imported only by child processes
(autokernel/child.py), which it treats as hostile: they get inputs and output buffers, answer in
JSON, and decide nothing. Before they start, the kernel file is read (autokernel/source_check.py)
and refused by name if it reaches past its own code. Outputs are compared with the float64
oracle here (autokernel/gate.py), every timing round is measured by this process's own clock
(autokernel/timing.py), the repo's state is snapshotted before the children start and restored
after (autokernel/state.py), and no process they started outlives the verdict. README's "The
gate's trust model" says what is prevented, what is only detected and what remains possible.

Output: `key: value` lines, the verdict last. Exit 0 for a judgement (keep, revert or judged),
2 when it refuses to judge (usage, no -m for kernel.py, dirty harness, not a git repo, malformed
or unwritable results.tsv, another bench.py running, a CUDA C++ kernel on a machine without a
GPU, a kernel.py whose KERNEL_NAME, KERNEL_TYPE or BENCH_SHAPES disagree with the kernel the
night is on: no row is written then), 1 when the harness itself fails.

During a night (workspace/plan.json and orchestrate.py's current kernel) the tag, type and shapes
a run of kernel.py is recorded under, and its file of record, are the plan's for that kernel.
"""
import contextlib
import datetime
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)
import autokernel as ak
import torch
import torch.multiprocessing

from autokernel import child, contract, gate, results, source_check, state, timing, workspace
from autokernel import git as g
from autokernel.cli import ArgumentParser, UsageError, one_line, run_main

DEFAULT_TIMEOUT_S = 180
STARTUP_LIMIT_S = 60 if ak.CUDA else 180  # a child importing torch and the kernel file
COMPILE_LIMIT_S = 240  # the same for a CUDA C++ kernel file, whose import runs nvcc (uncached)
REQUEST_LIMIT_S = 30 if ak.CUDA else 90   # one call (compiling and autotuning included)
IDLE_LIFE_S = 3600  # the idle kernel's process: the timing's whole length, at most
REPLY_BYTES = 8 << 20  # a timing window describes up to timing.MAX_SETS outputs
CHILD_LOG = ak.WORKSPACE / "bench_child.log"  # the children's stdout and stderr
IDLE_KERNEL = ak.ROOT / "autokernel" / "idle_kernel.py"  # the window floor's (timing.py)
KEPT_NAME = ak.WORKSPACE / "kept_version.py"  # names the kept version's source (not a file)


def parse_args(argv=None):
    p = ArgumentParser(description="AutoKernel gate: correctness, timing, keep/revert.")
    p.add_argument("--quick", action="store_true", help="smoke test on the primary shape + timing")
    p.add_argument("--no-git", action="store_true", help="judge and record, no commit/restore")
    p.add_argument("--kernel", help="kernel file to judge (default kernel.py; others imply --no-git)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"wall-clock limit for the kernel's run in seconds (default "
                        f"{DEFAULT_TIMEOUT_S}); each call also has its own limit")
    p.add_argument("-m", "--description", default="",
                   help="what this experiment tries (required when judging kernel.py)")
    p.add_argument("--results", help="results file (default results.tsv in the repo)")
    args = p.parse_args(argv)
    if not args.timeout > 0:
        p.error(f"--timeout {args.timeout} must be positive (seconds)")
    return args


def main(argv=None):
    args = parse_args(argv)
    return run_main("bench.py", lambda _: judge(args))


# ---- the run --------------------------------------------------------------------------------

def judge(args):
    started = time.monotonic()
    refuse_cuda_without_gpu(args)
    with state.exclusive():
        recovered = state.recover()
        if recovered:
            print(f"note: a bench.py killed mid-run left changes; restored: "
                  f"{', '.join(recovered) or 'nothing'}")
        facts = preflight(args)
        print(f"kernel: {facts['kernel_rel']}")
        print(f"device: {facts['device']}")
        attrs, syntax_error = contract.read_file_attrs(facts["kernel"])
        attrs.update(facts["night"])
        rows = results.read_rows(facts["results_tsv"])
        snapshot = state.Snapshot.take(facts["results_tsv"])
        snapshot.save()
        state.become_subreaper()
        try:
            outcome = run_children(args, facts, attrs, syntax_error, rows, snapshot)
        finally:
            for runner in ChildRunner.started:
                runner.stop()
            state.kill_descendants()
            changed = snapshot.restore()
            state.SNAPSHOT_PATH.unlink(missing_ok=True)
        if changed:
            outcome.update(correctness="FAIL", reason=tampered(changed))
        add_baselines(outcome)
        row = decide(args, facts, outcome, rows)
        print_summary(row, outcome, facts, args, time.monotonic() - started)
    return 1 if row["reason"].startswith(("git ", "results.tsv")) else 0


def preflight(args):
    """What to judge and where to record it; UsageError (exit 2, no row) when the verdict could
    not be trusted or recorded."""
    kernel = Path(args.kernel).resolve() if args.kernel else ak.KERNEL_PY
    if not kernel.is_file():
        raise UsageError(f"kernel file {kernel} does not exist")
    if kernel.suffix != ".py":
        raise UsageError(f"{kernel} is not a kernel file: pass a .py file (kernel.py, "
                         f"workspace/<name>.py or kernels/<type>.py)")
    git_mode = not args.no_git and kernel == ak.KERNEL_PY.resolve()
    try:
        kernel_rel = str(kernel.relative_to(ak.ROOT))
    except ValueError:
        kernel_rel = str(kernel)
    results_tsv = Path(args.results).resolve() if args.results else ak.RESULTS_TSV
    if git_mode:
        if not g.is_own_repo():
            raise UsageError(f"{ak.ROOT} is not a git repository, so kept kernels cannot be "
                             f"committed; run git init and commit, or use --no-git")
        if not g.has_commit():
            raise UsageError("the repository has no commit yet; commit the harness and kernel.py "
                             "first, or use --no-git")
        for name in ak.HARNESS_FILES + (kernel_rel,):
            if not g.is_tracked(name):
                raise UsageError(f"{name} is not committed; commit it first (a revert restores "
                                 f"kernel.py from HEAD, and the harness must be the committed one)")
        dirty = [p for p in g.changed_paths(*ak.HARNESS_FILES) if not p.endswith(".pyc")]
        if dirty:
            raise UsageError(f"{', '.join(dirty)} differ{'s' if len(dirty) == 1 else ''} from "
                             f"HEAD; the gate only judges with the committed harness (git diff; "
                             f"restore or commit the change)")
    results.read_rows(results_tsv)  # malformed: a one-line refusal, nothing written
    results.check_writable(results_tsv)
    night = workspace.night_kernel() if kernel == ak.KERNEL_PY.resolve() else None
    if night:  # the night's record names the plan's kernel: kernel.py must agree with it
        attrs, syntax_error = contract.read_file_attrs(kernel)
        refused = contract.night_disagreement(attrs, night, shapes_read=syntax_error is None)
        if refused:
            raise UsageError(refused)
    device = torch.cuda.get_device_name() if ak.CUDA else "cpu-interpreter"
    if git_mode and not args.description.strip():
        raise UsageError('pass -m "what this version tries": the row\'s description, which '
                         'orchestrate.py and analysis.py show beside its verdict')
    return {"kernel": kernel, "kernel_rel": kernel_rel, "git_mode": git_mode,
            "results_tsv": results_tsv, "device": device, "night": contract.night_attrs(night),
            "sha256": state.digest(kernel.read_bytes())}


def refuse_cuda_without_gpu(args):
    """A CUDA C++ kernel file cannot run without a GPU: one line, before anything is locked,
    snapshotted or recorded."""
    kernel = Path(args.kernel).resolve() if args.kernel else ak.KERNEL_PY
    if ak.CUDA or not kernel.is_file():
        return
    if contract.is_cuda_kernel(kernel):
        raise UsageError(f"{kernel.name} is a CUDA C++ kernel (BACKEND = \"cuda\"): running it "
                         f"needs an NVIDIA GPU and this machine has none; nothing was judged or "
                         f"recorded (judge it on a GPU machine)")


def tampered(changed):
    return (f"the kernel's process changed {', '.join(changed[:5])}"
            f"{' ...' if len(changed) > 5 else ''} during the run (restored; never kept)")


def run_children(args, facts, attrs, syntax_error, rows, snapshot):
    """The stages and the timing, with the kernel (and the kept version) in child processes.
    Returns the outcome: correctness, reason, plan, stages and, on PASS, the timings."""
    outcome = {"correctness": "FAIL", "reason": "", "plan": fallback_plan(attrs, facts)}
    refused = syntax_error or source_check.refusal(facts["kernel"])  # read before it runs
    if refused:
        return dict(outcome, reason=refused)
    deadline = time.monotonic() + args.timeout
    kept_source, best = kept_version(args, facts, attrs, rows)
    kept, unpaired = None, None if kept_source or not best else "its source is not in git"
    if args.quick:
        unpaired = "--quick: never paired, never kept"
    try:
        startup_s = COMPILE_LIMIT_S if attrs.get("BACKEND") == "cuda" else STARTUP_LIMIT_S
        candidate = ChildRunner(facts["kernel"], deadline, args.timeout)
        hello = candidate.start(startup_s)
        changed = snapshot.restore()  # most tampering happens at import: no stage runs then
        if changed:
            return dict(outcome, reason=tampered(changed))
        if hello["status"] == "import_failed":
            return dict(outcome, reason=hello["error"])
        try:
            plan = contract.plan({**attrs, **hello.get("attrs", {}), **facts["night"]})
            if plan["kernel_type"] == "kernelbench":
                if not hello.get("has_model_new"):
                    raise contract.KernelFileError("kernel file defines no ModelNew class; it "
                                                   "must take Model's init arguments and "
                                                   "compute Model's forward")
            elif not hello.get("has_kernel_fn"):
                raise contract.KernelFileError("kernel file defines no kernel_fn(...); it must "
                                               "take the reference's tensors by name and return "
                                               "a new tensor")
        except contract.KernelFileError as e:
            return dict(outcome, reason=str(e))
        outcome["plan"] = plan
        for key in ("kernel_type", "tag", "shape_str", "dtype"):
            print(f"{'shape' if key == 'shape_str' else key}: {plan[key]}", flush=True)
        def on_stage(stage, where=""):
            nonlocal kept  # the kept version's process starts once the smoke test passed:
            if kept_source and kept is None and stage != "smoke":  # most failures cost less
                kept = ChildRunner(KEPT_NAME, deadline, args.timeout, source=kept_source)
            candidate.at(stage, where)
        checked = gate.check(candidate, plan, quick=args.quick, on_stage=on_stage,
                             log=lambda line: print(line, flush=True))
        outcome.update(checked)
        if checked["correctness"] == "PASS":
            if kept is not None and (kept_hello := kept.start(startup_s))["status"] != "loaded":
                kept, unpaired = None, f"it does not import: {kept_hello.get('error')}"
            outcome.update(measure(candidate, kept, plan, best, unpaired))
    except ChildGone as e:
        outcome.update(correctness=e.correctness, reason=e.reason(CHILD_LOG))
    return outcome


def fallback_plan(attrs, facts):
    """What a row can say about a kernel that never got as far as its plan."""
    try:
        return contract.plan(attrs)
    except contract.KernelFileError:
        return {"tag": contract.tag_of(attrs) or Path(facts["kernel"]).stem,
                "kernel_type": str(attrs.get("KERNEL_TYPE") or ""), "shape_str": "", "dtype": ""}


def kept_version(args, facts, attrs, rows):
    """(the source of the best kept version of this setting, from git, its row): (None, None)
    when there is none or the run cannot keep; (None, row) when its source is gone. The source
    goes to the kept version's process in memory: a file on disk, the candidate could rewrite
    (a slower kept version makes any candidate look faster)."""
    if not facts["git_mode"] or args.quick:
        return None, None
    try:
        plan = contract.plan(attrs)
    except contract.KernelFileError:
        return None, None
    best = results.best_kept(rows, (plan["tag"], plan["shape_str"], plan["dtype"],
                                    facts["device"]))
    source = g.show(best["commit"], facts["kernel_rel"]) if best and best["commit"] else None
    return source, best


# ---- the untrusted child, seen from here ----------------------------------------------------

class ChildGone(Exception):
    """The child timed out or died: the row is TIMEOUT or CRASH."""

    def __init__(self, correctness, why):
        super().__init__(why)
        self.correctness, self.why = correctness, why

    def reason(self, log_path):
        line = crash_line(log_path) if self.correctness == "CRASH" else ""
        return self.why + (f": {line}" if line else "")


class ChildRunner:
    """A kernel file in its own process, driven over a pipe; the same calls as child.Runner.
    Replies are JSON (bytes), never unpickled: the child cannot run code in this process."""
    started = []

    def __init__(self, kernel_path, deadline, total_limit, source=None):
        self.kernel_path, self.deadline, self.total_limit = str(kernel_path), deadline, total_limit
        self.stage, self.proc, self.conn = "loading the kernel", None, None
        ctx = torch.multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        CHILD_LOG.parent.mkdir(parents=True, exist_ok=True)
        if not ChildRunner.started:
            CHILD_LOG.write_text("")
        self.proc = ctx.Process(target=child.serve, daemon=False,
                                args=(child_conn, self.kernel_path, str(CHILD_LOG), source))
        self.proc.start()
        child_conn.close()
        ChildRunner.started.append(self)
        self.hello = None
        self.request_limit = REQUEST_LIMIT_S  # what one call may take before it is a hang

    def start(self, limit_s=STARTUP_LIMIT_S):
        """The child's first message (loaded or import_failed), once."""
        if self.hello is None:
            self.hello = self.receive(limit_s)
        return self.hello

    def at(self, stage, where=""):
        self.stage = f"{stage}" + (f" at {where}" if where else "")

    def call(self, inputs, poison, buffer):
        return self.request(("call", inputs, poison, buffer))

    def time(self, inputs, buffer):
        self.at("timing")
        return self.request(("time", inputs, buffer))

    def arm(self, sets, slots):
        return self.request(("arm", sets, slots))

    def window(self):
        return self.request(("window",), spin=ak.CUDA)

    def alone(self):
        """Every other process below the judge stopped while this child's window is timed."""
        return state.others_stopped(self.proc.pid)

    def ping(self):
        return self.request(("ping",))

    def build(self, init_args, seed, dtype):
        self.at("building ModelNew")
        return self.request(("build", init_args, seed, dtype))

    def request(self, message, spin=False):
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self.gone()
        return self.receive(self.request_limit, spin)

    def receive(self, limit_s, spin=False):
        left = self.deadline - time.monotonic()
        # The judge's own work (inputs, the oracle) counts against the limit too: once it is
        # spent, a reply already waiting does not stretch it.
        if left <= 0:
            raise ChildGone("TIMEOUT", f"exceeded the {self.total_limit:g} s wall-clock limit "
                                       f"during {self.stage}")
        wait = min(limit_s, left)
        try:
            if spin:  # a timed window: no wake-up latency of this process on the clock
                until = time.monotonic() + wait
                while not self.conn.poll(0) and time.monotonic() < until:
                    pass
            ready = self.conn.poll(0 if spin else wait)
            data = self.conn.recv_bytes(maxlength=REPLY_BYTES) if ready else None
        except (EOFError, OSError):
            raise self.gone()
        if data is None:
            limit = self.total_limit if left <= limit_s else limit_s
            what = "wall-clock limit" if left <= limit_s else "limit for one call"
            raise ChildGone("TIMEOUT", f"exceeded the {limit:g} s {what} during {self.stage}")
        try:
            reply = json.loads(data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ChildGone("FAIL", f"the kernel's process sent a malformed reply during "
                                    f"{self.stage}")
        return reply

    def gone(self):
        self.proc.join(timeout=2)
        code = self.proc.exitcode
        how = describe_exit(code) if code is not None else "stopped answering"
        return ChildGone("CRASH", f"child process {how} during {self.stage}")

    def stop(self):
        """Ask the child to exit (it drops its handles on the judge's shared tensors), then kill
        its process group whatever it does."""
        if self.proc is None or not self.proc.is_alive():
            return
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(("stop",))
            self.proc.join(timeout=1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.join(timeout=5)


def describe_exit(code):
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def crash_line(log_path):
    """The most telling line of the children's log (faulthandler's header, else the last)."""
    try:
        lines = [ln.strip() for ln in Path(log_path).read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return ""
    for line in lines:
        if line.startswith("Fatal Python error") or "illegal memory access" in line:
            return one_line(line)
    return one_line(lines[-1]) if lines else ""


# ---- timing ---------------------------------------------------------------------------------

def measure(candidate, kept, plan, best=None, unpaired=None):
    """Paired rounds against the kept version on the judge's clock (autokernel/timing.py), every
    timed output judged; the child's own report cross-checked against that clock. best: the kept
    row, when there is one; unpaired: why its version is not running beside the candidate."""
    windows = f"{timing.WINDOWS_PER_ROUND} window{'s' * (timing.WINDOWS_PER_ROUND > 1)}"
    print(f"timing: {timing.ROUNDS} rounds of {windows}, "
          + ("paired with the kept version" if kept
             else f"alone ({unpaired or 'no kept version to pair with'})"),
          flush=True)
    try:
        rounds = timing.paired_rounds(candidate, kept, timing_case(candidate, kept, plan),
                                      start_idle if ak.CUDA else None)
        claimed = statistics.median(rounds["claimed"])
        judged = statistics.median(rounds["candidate"])
        contradiction = timing.crosscheck(claimed, judged)
        if contradiction:
            raise timing.TimingError(contradiction)
    except timing.TimingError as e:
        return {"correctness": "FAIL", "reason": str(e)}
    if rounds["graph"] is True:
        how = "replayed as a CUDA graph"
    else:
        how = f"plain launches ({rounds['graph'] or 'a CPU: no CUDA graphs'})"
    if rounds["floor_us"]:
        how += f", {rounds['floor_us']:.0f} us a window subtracted (the floor: the judge's idle " \
               "kernel's windows in the same rounds)"
    elif ak.CUDA:
        how += f", nothing subtracted ({rounds['floor_why']})"
    print(f"timing_windows: {rounds['sets']} calls a window, {how}", flush=True)
    if rounds["kept_dropped"]:
        print(f"note: the kept version left the pairing: {rounds['kept_dropped']}", flush=True)
    recorded = float(best["latency_us"]) if best is not None else None
    if rounds["kept"] is None and recorded is not None:  # a kept version, but not timed here
        keep, gain, noise, why = results.keep_rule_against_record(
            rounds["candidate"], recorded,
            f"could not be timed ({unpaired or rounds['kept_dropped']})")
    else:  # the record is only a check where timings mean something (not the interpreter)
        keep, gain, noise, why = results.keep_rule_checked(
            rounds["candidate"], rounds["kept"], recorded if ak.TIMING_MEANINGFUL else None)
    # The row records the judge's clock: the number the keep rule used, and one the kernel's
    # process cannot touch. The child's do_bench median is shown beside it.
    return {"latency_us": judged, "reported_us": claimed, "rounds": rounds["candidate"],
            "kept_rounds": rounds["kept"], "best_us": timing.median(rounds["kept"] or []),
            "faster": keep, "gain": gain, "noise": noise, "keep_why": why,
            "peak_vram_mb": rounds["reply"].get("peak_vram_mb"),
            "timing_valid": ak.TIMING_MEANINGFUL}


def start_idle():
    """The judge's idle kernel (autokernel/idle_kernel.py) in a child, for the window floor. It
    lives through the timing; each of its requests still has REQUEST_LIMIT_S."""
    runner = ChildRunner(IDLE_KERNEL, time.monotonic() + IDLE_LIFE_S, IDLE_LIFE_S)
    try:
        hello = runner.start()
    except ChildGone as e:
        raise timing.TimingError(f"the idle kernel's process: {e.why}") from None
    if hello["status"] != "loaded":
        runner.stop()
        raise timing.TimingError(f"the idle kernel did not load: {hello.get('error')}")
    return runner


def timing_case(candidate, kept, plan):
    """What the timing runs on (a timing.Case): fresh inputs of the plan's primary shape and
    dtype from any seed, the oracle, and the tolerance test."""
    if plan["kernel_type"] == "kernelbench":
        from autokernel import kernelbench
        return kernelbench.timing_case(plan, [r for r in (candidate, kept) if r is not None])
    return timing.kernel_case(ak.KERNEL_TYPES[plan["kernel_type"]], tuple(plan["shape"]),
                              ak.DTYPES[plan["dtype"]], plan.get("variant"))


def add_baselines(outcome):
    """Roofline and speedups from prepare.py's measured ceilings and baseline times (read after
    the children are gone: a new shape's baseline is timed here and cached)."""
    if outcome.get("correctness") != "PASS" or outcome.get("latency_us") is None:
        return
    plan = outcome["plan"]
    if plan["kernel_type"] == "kernelbench":  # the problem's Model, eager and compiled
        from autokernel import kernelbench
        outcome.update(kernelbench.speedups(plan, outcome["latency_us"]))
        return
    ktype, shape, dtype = ak.KERNEL_TYPES[plan["kernel_type"]], tuple(plan["shape"]), \
        ak.DTYPES[plan["dtype"]]
    ceilings, baselines = {}, {}
    try:
        from autokernel import baselines as base
        ceilings = base.load_ceilings()
        # Where timings mean little (the CPU), eager is timed again now, beside the kernel: a
        # cached CPU time may come from a busy moment and would skew every later speedup.
        fresh = not ak.TIMING_MEANINGFUL
        baselines = base.baseline_times(ktype, shape, dtype, variant=plan.get("variant"),
                                        force=fresh, log=(lambda m: None) if fresh else None)
    except Exception as e:  # a broken cache costs the speedups, not the verdict
        print(f"note: baselines unavailable ({one_line(e)})", file=sys.stderr)
    tflops = (ceilings.get("tflops") or {}).get(plan["dtype"])
    latency = outcome["latency_us"]
    roof = ak.roofline(ktype, shape, dtype, latency,
                       {"bandwidth_gb_s": ceilings.get("bandwidth_gb_s"), "tflops": tflops},
                       plan.get("variant"))
    spec = ceilings.get("spec") or {}
    eager, compiled = baselines.get("eager_us"), baselines.get("compile_us")
    outcome.update(roof, bound=ktype.bound, ceiling_bandwidth_gb_s=ceilings.get("bandwidth_gb_s"),
                   ceiling_tflops=tflops, datasheet_bandwidth_gb_s=spec.get("bandwidth_gb_s"),
                   datasheet_tflops=spec.get("fp16_tflops") if plan["dtype"] != "fp32" else None,
                   eager_us=eager, compile_us=compiled, library=baselines.get("library"),
                   library_us=baselines.get("library_us"),
                   speedup_vs_pytorch=eager / latency if eager else None,
                   speedup_vs_compile=compiled / latency if compiled else None)
    if outcome["pct_peak"] != outcome["pct_peak"]:  # NaN: no ceilings (CPU, or no prepare.py)
        outcome["pct_peak"] = None


# ---- keep or revert, and the row ------------------------------------------------------------

def decide(args, facts, outcome, rows):
    """keep / revert / judged; the row is on disk before the commit is final."""
    plan = outcome["plan"]
    passed = outcome["correctness"] == "PASS"
    row = make_row(facts, plan, outcome, len(rows) + 1, args.description)
    if not facts["git_mode"] or args.quick:  # a smoke test alone never keeps (nor reverts)
        record(row, facts)
        return row
    if passed and outcome.get("faster"):
        return keep(row, facts, plan, outcome, args.description)
    row["status"] = "revert"
    try:
        g.restore_file(facts["kernel_rel"])
    except UsageError as e:
        row["reason"] = "; ".join(filter(None, [row["reason"], f"git restore failed: {e}"]))
    record(row, facts)
    return row


def record(row, facts):
    try:
        results.append_row(row, facts["results_tsv"])
    except OSError as e:
        raise UsageError(f"results.tsv could not be written ({one_line(e)}): this run is not "
                         f"recorded", code=1)


def keep(row, facts, plan, outcome, description):
    """Commit kernel.py alone, record the row (undoing the commit if the row cannot be written),
    then make this version the kernel's file of record in workspace/."""
    speed = outcome.get("speedup_vs_pytorch")
    message = (f"bench: keep {plan['tag']} exp {row['experiment']}: {outcome['latency_us']:.1f} us"
               + (f" ({speed:.2f}x eager)" if speed else "")
               + (f" - {results.clean_text(description, 200)}" if description else ""))
    before = g.out("rev-parse", "HEAD")
    try:
        row["commit"] = g.commit_file(facts["kernel_rel"], message)
    except UsageError as e:
        row.update(status="judged", reason=f"git commit failed: {e}")
        record(row, facts)
        return row
    row["status"] = "keep"
    try:
        results.append_row(row, facts["results_tsv"])
    except OSError as e:
        g.git("reset", "-q", "--soft", before)  # no row, no keep: kernel.py stays as edited
        raise UsageError(f"results.tsv could not be written ({one_line(e)}): nothing kept, "
                         f"kernel.py left as it was", code=1)
    of_record = file_of_record(plan["tag"])
    if of_record is not None:
        of_record.write_bytes(facts["kernel"].read_bytes())
        outcome["file_of_record"] = results.rel(of_record)
    return row


def file_of_record(tag):
    """The workspace file plan.json names for this tag (None outside a planned night)."""
    from autokernel import workspace
    try:
        entry = workspace.plan_kernels(workspace.read_plan()).get(tag)
    except UsageError:
        return None
    return ak.ROOT / entry["file"] if entry else None


def make_row(facts, plan, outcome, experiment, description):
    n = results.number
    return {
        "experiment": experiment, "tag": plan.get("tag", ""),
        "kernel_type": plan.get("kernel_type", ""),
        "throughput_tflops": n(outcome.get("throughput_tflops"), 4),
        "latency_us": n(outcome.get("latency_us"), 3), "pct_peak": n(outcome.get("pct_peak"), 2),
        "speedup_vs_pytorch": n(outcome.get("speedup_vs_pytorch"), 4),
        "correctness": outcome["correctness"], "peak_vram_mb": n(outcome.get("peak_vram_mb"), 1),
        "description": description, "bandwidth_gb_s": n(outcome.get("bandwidth_gb_s"), 2),
        "speedup_vs_compile": n(outcome.get("speedup_vs_compile"), 4),
        "status": "judged", "commit": "",
        "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "shape": plan.get("shape_str", ""), "dtype": plan.get("dtype", ""),
        "device": facts["device"],
        "timing_valid": "" if outcome.get("latency_us") is None else
        str(bool(outcome.get("timing_valid"))),
        "reason": outcome.get("reason", ""), "kernel_sha256": facts["sha256"],
        "best_us": n(outcome.get("best_us"), 3),
        "noise_pct": n(100 * outcome["noise"] if outcome.get("noise") else None, 2),
    }


# ---- printing -------------------------------------------------------------------------------

def fmt(x, digits=1):
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


QUICK_NOTE = ("not compared (--quick times the candidate alone; a full run pairs it with the "
              "kept version)")


def print_summary(row, outcome, facts, args, elapsed):
    print(f"correctness: {row['correctness']}")
    if row["reason"]:
        print(f"reason: {row['reason']}")
    if row["correctness"] in ("CRASH", "TIMEOUT") and CHILD_LOG.exists():
        lines = [ln for ln in CHILD_LOG.read_text(errors="replace").splitlines() if ln.strip()]
        # faulthandler's report starts with the innermost frames: show those, else the tail.
        fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
        excerpt = lines[fatal[-1]:fatal[-1] + 8] if fatal else lines[-8:]
        print("child_stderr: |\n" + "\n".join("  " + line for line in excerpt))
        print(f"child_log: {results.rel(CHILD_LOG)}")
    if outcome.get("latency_us") is not None:
        for key, digits in (("latency_us", 2), ("reported_us", 2), ("throughput_tflops", 3),
                            ("bandwidth_gb_s", 1), ("pct_peak", 1), ("speedup_vs_pytorch", 3),
                            ("speedup_vs_compile", 3), ("peak_vram_mb", 1)):
            print(f"{key}: {fmt(outcome.get(key), digits)}")
        for key in ("bound", "ceiling_bandwidth_gb_s", "datasheet_bandwidth_gb_s",
                    "ceiling_tflops", "datasheet_tflops", "eager_us", "compile_us", "library",
                    "library_us"):
            if outcome.get(key) is not None:
                value = outcome[key]
                print(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}")
        print(f"rounds_us: {' '.join(f'{t:.1f}' for t in outcome['rounds'])}")
        if outcome.get("kept_rounds"):
            print(f"kept_rounds_us: {' '.join(f'{t:.1f}' for t in outcome['kept_rounds'])}")
        print(f"keep_rule: {QUICK_NOTE if args.quick else outcome['keep_why']}")
        print(f"timing_valid: {bool(outcome.get('timing_valid'))}")
        if not outcome.get("timing_valid"):
            print("timing_note: interpreter wall-clock on a CPU: a keep here rests on that alone "
                  "and says nothing about GPU speed")
        if outcome.get("above_ceiling"):
            print("warning: faster than the measured ceiling allows (pct_peak capped at 100); "
                  "the cached ceiling may be stale (uv run prepare.py --force)")
    print(f"best_kept_us: {QUICK_NOTE if args.quick else fmt(outcome.get('best_us'), 2)}")
    print(f"status: {row['status']}")
    if row["commit"]:
        print(f"commit: {row['commit']}")
    if outcome.get("file_of_record"):
        print(f"file_of_record: {outcome['file_of_record']}")
    print(f"experiment: {row['experiment']}")
    print(f"results: {facts['results_tsv']}")
    print(f"wall_s: {elapsed:.1f}")
    print("verdict: " + verdict(row, outcome, args.quick))


def verdict(row, outcome, quick=False):
    word = {"keep": "KEEP", "revert": "REVERT", "judged": "JUDGED"}[row["status"]]
    name = outcome["plan"].get("tag") or "kernel"
    if row["correctness"] != "PASS":
        return f"{word} {name} {row['correctness']}: {row['reason']}"
    parts = [f"{word} {name} {outcome['latency_us']:.1f} us"]
    for key, label in (("speedup_vs_pytorch", "eager"), ("speedup_vs_compile", "compile")):
        if outcome.get(key):
            parts.append(f"{outcome[key]:.2f}x {label}")
    pct = outcome.get("pct_peak")
    if pct is not None and pct == pct:
        parts.append(f"{pct:.0f}% of attainable")
    text = ", ".join(parts)
    if row["status"] in ("keep", "revert") and outcome.get("keep_why"):
        text += f"; {outcome['keep_why']}"
    if row["reason"]:
        text += f"; {row['reason']}"
    if not outcome.get("timing_valid"):
        text += " (timings not meaningful: CPU interpreter)"
    if quick:
        text += " (--quick: smoke test only; a full run decides keep or revert)"
    return text


if __name__ == "__main__":
    sys.exit(main())
