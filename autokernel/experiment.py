"""
One experiment of bench.py: what to judge and where to record it (preflight), the kernel and its
kept version judged in child processes (autokernel/judge.py), keep or revert, the row in
results.tsv, and the summary printed as `key: value` lines, the verdict last. bench.py's
docstring says what a run does and what its exit codes mean.
"""
import datetime
import os
import time
from pathlib import Path

import torch

import autokernel as ak
from autokernel import (contract, gate, kinds, region_kind, results, sandbox, source_check, state,
                        workspace, zygote)
from autokernel import git as g
from autokernel.cli import UsageError, one_line
from autokernel.judge import (COMPILE_LIMIT_S, STARTUP_LIMIT_S, ChildGone,
                              ChildRunner, left_running, measure, tampered)

KEPT_NAME = ak.WORKSPACE / "kept_version.py"  # names the kept version's source (not a file)


# ---- the run --------------------------------------------------------------------------------

def run(args):
    started = time.monotonic()
    refuse_cuda_without_gpu(args)
    zygote.start()  # before any torch compute (CPU only: autokernel/zygote.py)
    # A re-gate records nothing, so re-gates may run side by side (verify.py runs them so):
    # each has its own child log and no crash record, and leaves any record of a killed run
    # that records to the next bench.py that does. Under the sandbox it puts nothing back
    # either (state.Untouched): the kernel cannot write the repo, and the user may commit
    # while verify.py re-gates.
    shared = args.correctness_only
    if shared:
        ChildRunner.log = ak.WORKSPACE / f"bench_child_{os.getpid()}.log"
    with state.exclusive(shared=shared):
        for line in [] if shared else state.recover() or []:
            print(f"note: {line}")
        facts = preflight(args)
        print(f"kernel: {facts['kernel_rel']}")
        print(f"device: {facts['device']}")
        sandbox.prune()
        confinement = sandbox.prepare(facts["kernel"].read_bytes())
        attrs, syntax_error = contract.read_file_attrs(facts["kernel"])
        attrs.update(facts["night"])
        rows = results.read_rows(facts["results_tsv"])
        confined = sandbox.seals_the_repo(confinement)
        snapshot = state.Untouched() if shared and confined \
            else state.Snapshot.take(facts["results_tsv"])
        if confined and not shared:  # the kernel cannot write the repo: edits are the user's
            snapshot = state.Confined(snapshot, own=[facts["results_tsv"]])
        if not shared:
            snapshot.save(results_path=facts["results_tsv"], candidate=facts["kernel"],
                          crash_row=killed_row(args, facts, attrs, rows))
        state.become_subreaper()
        helpers = set(state.descendants())  # the judge's own (none, from a shell)
        try:
            outcome = run_children(args, facts, attrs, syntax_error, rows, snapshot)
        finally:
            for runner in ChildRunner.started:
                runner.stop()
            strays = state.end_strays(helpers | {state.resource_tracker_pid()})
            changed = snapshot.restore()
            if not shared:
                state.SNAPSHOT_PATH.unlink(missing_ok=True)
        for line in others_changed(snapshot):
            print(f"note: {line}")
        if changed:
            outcome.update(correctness="FAIL",
                           reason=tampered(changed, isinstance(snapshot, state.Confined)))
        elif strays:  # the kernel's work is the call it is judged on, nothing that outlives it
            outcome.update(correctness="FAIL", reason=left_running(strays))
        outcome["sandbox"] = sandbox.describe(confinement)
        if confinement["abi"] is None:  # the row says its kernel could write anything
            outcome["reason"] = "; ".join(filter(None, [outcome.get("reason"),
                                                        f"unconfined ({confinement['why']})"]))
        add_baselines(outcome)
        row = decide(args, facts, outcome, rows)
        print_summary(row, outcome, facts, args, time.monotonic() - started)
    if shared and row["correctness"] == "PASS":
        ChildRunner.log.unlink(missing_ok=True)
    return 1 if row["reason"].startswith(("git ", "results.tsv")) else 0


def others_changed(snapshot):
    """A note naming what another process changed while the confined kernel ran (left as it
    is: the user's edit, not the kernel's)."""
    others = sorted(getattr(snapshot, "others", ()))
    if not others:
        return []
    return [f"changed during the run by another process, left as it is (the kernel's process "
            f"was confined): {', '.join(others[:8])}{' ...' if len(others) > 8 else ''}"]


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


def killed_row(args, facts, attrs, rows):
    """The row the next bench.py appends if this one is killed before its verdict
    (autokernel/state.recover): a CRASH, reverted as any CRASH is in a run that keeps."""
    row = make_row(facts, fallback_plan(attrs, facts), {"correctness": "CRASH"}, len(rows) + 1,
                   args.description)
    return dict(row, status="revert" if facts["git_mode"] and not args.quick else "judged")


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
            return dict(outcome, reason=tampered(changed, isinstance(snapshot, state.Confined)))
        if hello["status"] == "import_failed":
            return dict(outcome, reason=hello["error"])
        try:
            plan = kinds.plan({**attrs, **hello.get("attrs", {}), **facts["night"]})
            kind = kinds.of(plan["kernel_type"])
            missing = kind.missing_entry(hello)
            if missing:
                raise contract.KernelFileError(missing)
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
                             log=lambda line: print(line, flush=True), judge_class=kind.judge)
        outcome.update(checked)
        if checked["correctness"] == "PASS" and not args.correctness_only:
            if kept is not None and (kept_hello := kept.start(startup_s))["status"] != "loaded":
                kept, unpaired = None, f"it does not import: {kept_hello.get('error')}"
            outcome.update(measure(candidate, kept, plan, best, unpaired))
    except ChildGone as e:
        outcome.update(correctness=e.correctness, reason=e.reason(ChildRunner.log))
    return outcome


def fallback_plan(attrs, facts):
    """What a row can say about a kernel that never got as far as its plan."""
    try:
        return kinds.plan(attrs)
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
        plan = kinds.plan(attrs)
    except contract.KernelFileError:
        return None, None
    best = results.best_kept(rows, (plan["tag"], plan["shape_str"], plan["dtype"],
                                    facts["device"]))
    source = g.show(best["commit"], facts["kernel_rel"]) if best and best["commit"] else None
    return source, best


def add_baselines(outcome):
    """Roofline and speedups, from the plan's kind (read after the children are gone: a new
    shape's baseline is timed here and cached)."""
    if outcome.get("correctness") != "PASS" or outcome.get("latency_us") is None:
        return
    plan = outcome["plan"]
    outcome.update(kinds.of(plan["kernel_type"]).baselines(plan, outcome["latency_us"]))


# ---- keep or revert, and the row ------------------------------------------------------------

def decide(args, facts, outcome, rows):
    """keep / revert / judged; the row is on disk before the commit is final."""
    plan = outcome["plan"]
    passed = outcome["correctness"] == "PASS"
    row = make_row(facts, plan, outcome, len(rows) + 1, args.description)
    if args.correctness_only:  # a verdict for verify.py, never a row
        return row
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
        workspace.write_kernel_file(of_record, facts["kernel"].read_bytes())
        outcome["file_of_record"] = results.rel(of_record)
    return row


def file_of_record(tag):
    """The workspace file plan.json names for this tag (None outside a planned night)."""
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
    log = ChildRunner.log
    if row["correctness"] in ("CRASH", "TIMEOUT") and log.exists():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        # faulthandler's report starts with the innermost frames: show those, else the tail.
        fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
        excerpt = lines[fatal[-1]:fatal[-1] + 8] if fatal else lines[-8:]
        print("child_stderr: |\n" + "\n".join("  " + line for line in excerpt))
        print(f"child_log: {results.rel(log)}")
    print(f"sandbox: {outcome['sandbox']}")
    if args.correctness_only:
        print(f"wall_s: {elapsed:.1f}")
        print(f"verdict: CHECKED {outcome['plan'].get('tag') or 'kernel'} {row['correctness']}"
              + (f": {row['reason']}" if row["reason"] else " (not timed, nothing recorded)"))
        return
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
    if outcome.get("library_calls"):
        text += f"; library calls a forward: {region_kind.describe_calls(outcome['library_calls'])}"
    if not outcome.get("timing_valid"):
        text += " (timings not meaningful: CPU interpreter)"
    if quick:
        text += " (--quick: smoke test only; a full run decides keep or revert)"
    return text
