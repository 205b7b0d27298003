"""
verify.py: plug the kept kernels back into the model, run it, and report whether it still computes
the same thing and how much faster it got end to end.

    uv run verify.py                      # plan.json's kernels, the model profile.json recorded
    uv run verify.py --model models/llama.py --config compact --input-shape 8x2048 --dtype bf16
    uv run verify.py --model models/gpt2.py --input-shape 8x1024 --dtype bf16 --starters
    uv run verify.py --model models/custom.py --kernels kernels/softmax.py,kernels/reduce.py
    uv run verify.py --module transformers --hf-config tiny-llama --starters
    uv run verify.py --pretrained ~/models/Llama-3.2-1B --dtype bf16   # real weights, offline
    uv run verify.py ... --diagnose       # each kernel alone: which one breaks the model?
    uv run verify.py ... --cuda-graphs    # time as CUDA graph replays (no launch overhead)

The model flags are profile.py's (models/load.py); with none given, the flags recorded in
workspace/profile.json are reused. Kernels come from
workspace/plan.json (extract.py's list; each file holds that kernel's best kept version), from
--kernels FILE[,FILE], or from --starters (every kernels/*.py, or kernels/cuda/*.py with --backend
cuda; a starter that finds nothing to replace in this model is listed as "unused", not as a
replacement and not as a failure). A kernel file whose type has no call site in the model
beside the other files' types (one forward with the references of the given types plugged in:
qkv_rotary, say, takes an attention layer's rotation from rotary_embedding) is neither re-gated
nor imported: a starter is then unused, a file named by --kernels or the plan never ran; a
file refused by its re-gate gives its call sites back. CUDA C++ kernel files need a GPU.
Before any kernel is imported here, each file goes through the gate again (autokernel/regate.py:
bench.py --no-git, fresh inputs, its own timing) and each plan kernel's file must be the bytes of
a kept row of results.tsv (the report names which: experiment, commit, latency; it warns when a
plan kernel has no kept version), and a kept row on this branch that no plan kernel is named
after is named on a line of its own. A file that fails is left out and the run fails.
--no-regate skips this for quick checks.

How kernels get in (patched torch entry points and module swaps, fallbacks outside the kernel
contract, the glue that stays torch): autokernel/swap.py. A kernel that never ran during the
forward is a FAILURE, not a replacement.

Correctness: the forward's logits (for a model that returns only a loss, the logits given to
F.cross_entropy, and the loss too) are compared with the original model's, in the same dtype:
max relative error within the dtype's tolerance and tie-aware top-1 agreement (definitions and
tolerances: autokernel/endtoend.py).

Timing: median of --repeat warm forwards (CUDA events on a GPU; perf_counter on a CPU, where the
Triton interpreter makes the numbers meaningless and they are labelled so) for the original
model in eager mode, torch.compile of the original (CUDA only unless --compile-backend is given;
--no-compile skips it), torch.compile of the model with the kernels inside (with the same
backend, whenever the original is compiled: each kernel is a torch custom op, autokernel/ops.py,
so inductor compiles the torch code around the kernels; its graph breaks, calls and outputs
against the original are reported, a failure there is noted but does not fail the run), and the
model with all kernels. Each kernel's share of the gain: the model
is timed with ONLY that kernel swapped in; gain_ms = eager_ms - alone_ms, share = gain_ms /
(eager_ms - kernels_ms), null when all kernels together lose. Shares need not add up to 100%
(kernels interact, timings are noisy).
When some kernels gain and others lose, the gainers are also timed together: what shipping only
them would give. The fastest variant whose outputs match (best_variant) is then built again
beside torch.compile of the original and both are timed in interleaved rounds (--paired-rounds,
15 on a GPU): the headline ratio against torch.compile is the median of the rounds' ratios, so
that drift between timings minutes apart does not decide it.
--cuda-graphs times all of these as replays of a CUDA graph of the forward. A starter's call costs
tens of microseconds of host time (on the H100 machine, 40-190 us against 15-30 for the torch op
it replaces), so a forward with many swapped calls can become host-bound and lose to eager even
when every kernel is faster on the GPU, and plain-launch timings swing with the host's load;
graphs remove launch overhead for every variant alike, as a serving engine would.

--diagnose runs each kernel alone against the original model and names every kernel that breaks
it, one line each; it skips the timings.

Writes workspace/verify.json (--out to change):
  {"model": str, "device": str, "dtype": "bf16", "timing_meaningful": bool, "passed": bool,
   "failures": [str],
   "kernels": [{"name", "kernel_type", "file", "calls": int (one forward, all kernels in),
                "shapes": ["8x2048x768", ...], "fallbacks": {reason: count},
                "skipped": {reason: modules not swapped}, "notes": [str],
                "status": "ok" | "never ran" | "crashed" | "mismatch" | "unused"
                          | "stopped" (another kernel crashed first),
                "error": str | null,
                "alone": {"calls", and the "correctness" keys below} | null,  (--diagnose)
                "alone_ms": float | null, "gain_ms": float | null, "share": float | null,
                "compile_alone_ms", "compile_gain_ms": float | null (the same inside
                                     torch.compile, against compile_ms; --compile-alone),
                "compile_alone_note": str | null (why that gain is null)}],
   "correctness": {"output": "logits" | "tensor" | "logits (the loss's input)", "shape": [..],
                   "max_abs_err", "rel_err", "tolerance", "top1", "top1_tie_aware", "top1_min",
                   "loss_rel_err" (models returning a loss), "passed", "error"},
   "timing": {"method", "cuda_graphs": bool, "warmup", "repeat", "eager_ms", "compile_ms",
              "compile_note", "compile_correctness": {the "correctness" keys: torch.compile
              of the original against the original} | null, "kernels_ms",
              "gainers": [names of kernels whose alone_ms beat eager],
              "gainers_ms": float | null (the gainers together, when some kernels lose),
              "gainers_correctness": {the "correctness" keys} | null (their outputs),
              "compile_kernels_ms": float | null (torch.compile of the model with the kernels
                                   inside, each a custom op; timed when compile_ms is),
              "graph_breaks": int | null (dynamo's graph breaks tracing it, from
                             torch._dynamo.explain: 0 expected),
              "compile_kernels_calls": {kernel: calls in one compiled forward},
              "compile_kernels_folded": {kernel: those of its calls with the model's add
                                        folded in (autokernel/fusion.py)},
              "compile_kernels_normed": {kernel: those with the norm before it folded in},
              "compile_kernels_correctness": {the "correctness" keys} | null,
              "compile_kernels_note": str | null (the backend, or why it failed),
              "compile_gainers": [kernels whose compile_alone_ms beat torch.compile] | null,
              "compile_gainers_ms", "compile_gainers_correctness": torch.compile with only
                                   them, when some kernels lose inside it,
              "paired": {"variant", "rounds", "compile_ms", "best_ms", "ratios", "ratio",
                         "note"} | null (the best variant against torch.compile again, in
                         interleaved rounds: pair_with_compile)} | null,
   "speedup_vs_eager": float | null, "speedup_vs_compile": float | null (both: the eager
   kernels), "best_variant": "kernels" | "gainers" | "compile_kernels" | "compile_gainers" |
   null (the fastest whose outputs were compared and match), "best_ms": float | null,
   "best_speedup_vs_compile": float | null (paired's ratio where the rounds ran, else
   compile_ms / best_ms), "best_speedup_vs_compile_single": float | null (compile_ms /
   best_ms, where the rounds ran),
   "regate": {file: {"passed", "gate": the gate's line, "version": which kept row of
              results.tsv, "version_ok"}} | null (--no-regate)}

Exit status: 0 all kernels ran and the outputs match; 1 a kernel never ran, crashed, or the
outputs mismatch; 2 usage errors (bad flags, missing files).
"""
import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)

import argparse
import contextlib
import glob
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from autokernel import regate
from autokernel.cli import ArgumentParser, UsageError, describe, one_line, run_main
from autokernel.contract import (KernelFileError, check_module, is_cuda_kernel, load_module,
                                 read_file_attrs, tag_of)
from autokernel.endtoend import (GraphCaptureError, capture, checked_forward, compare_runs,
                                 forward, interleaved, model_dtype, sync, time_forward)
from autokernel.night import unplaced_keeps
from autokernel.results import read_rows, rel
from autokernel.swap import Kernel, KernelFailure, Swap, WeightCache, pluggable_types
from autokernel.workspace import plan_kernels, read_plan, recorded_model_args, write_json
from models.load import MODEL_FLAGS, ModelError, add_model_args, check_model_args, load_model


# ---------------------------------------------------------------------------------------------
# Kernels to plug in
# ---------------------------------------------------------------------------------------------

def load_kernel(path, name=None, kernel_type=None, shapes=None, optional=False):
    """A kernel file, imported and checked against the contract; its dispatch shapes are the
    plan's, else its BENCH_SHAPES, else none (it takes every shape of its type)."""
    path = kernel_path(path)
    try:
        module = load_module(path)
    except Exception as e:  # a kept kernel that no longer imports is a usage problem to fix first
        raise UsageError(f"cannot import kernel {path}: {describe(e)}") from None
    try:
        declared = check_module(module)["kernel_type"]
    except KernelFileError as e:
        raise UsageError(f"{path}: {e}") from None
    if kernel_type and kernel_type != declared:
        raise UsageError(f"{path}: KERNEL_TYPE {declared!r} but plan.json says {kernel_type!r}")
    shapes = shapes or getattr(module, "BENCH_SHAPES", None) or []
    name = name or getattr(module, "KERNEL_NAME", None) or declared
    return Kernel(name, declared, path, module.kernel_fn, [tuple(s) for s in shapes], optional)


def kernel_specs(args):
    """The kernel files to plug in, from --kernels, --starters or workspace/plan.json (in that
    order of precedence), none imported yet. -> ([(path, name, kernel_type, shapes, optional)],
    results.tsv's rows for the plan's kept-version check, or None)."""
    rows = None
    if args.kernels:
        specs = [(p.strip(), None, None, None, False) for p in args.kernels.split(",")
                 if p.strip()]
    elif args.starters:
        files = sorted(p for p in glob.glob(str(autokernel.starters_dir(args.backend) / "*.py"))
                       if not Path(p).name.startswith("_"))
        specs = [(p, None, None, None, True) for p in files]
    else:
        if not Path(args.plan).exists():
            raise UsageError(f"no {rel(args.plan)}: run extract.py first, or pass --kernels "
                             "FILE[,FILE] or --starters")
        plan = read_plan(args.plan)
        specs = [(k["file"], name, k["kernel_type"], k.get("shapes"), False)
                 for name, k in plan_kernels(plan).items()]
        rows = None if args.no_regate else read_rows(args.results)
        for line in unplaced_keeps(plan, rows or []):
            print(line)
    if not specs:
        raise UsageError("no kernels to verify")
    specs = [(kernel_path(spec[0]),) + spec[1:] for spec in specs]
    refuse_cuda_without_gpu([spec[0] for spec in specs])
    return specs, rows


def select_kernels(args, specs=None, rows=None):
    """kernel_specs' files (or those given), each re-gated first unless --no-regate, then
    imported. -> (kernels, {file: re-gate result})."""
    if specs is None:
        specs, rows = kernel_specs(args)
    checked = {}
    if not args.no_regate:
        checked = regate.check_all([(s[0], s[1] or tag_of(read_file_attrs(s[0])[0]))
                                    for s in specs], rows)
    kernels = [load_kernel(*spec) for spec in specs
               if checked.get(str(spec[0]), {}).get("passed", True)]
    seen = Counter()
    for k in kernels:  # two files with one name (two starters of one type): keep names unique
        seen[k.name] += 1
        if seen[k.name] > 1:
            k.name = f"{k.name}#{seen[k.name]}"
    return kernels, checked


def without_call_sites(specs, model, inputs, among=()):
    """The kernel files whose type has no call site in this model beside the other files' types
    (and `among`'s), found by one forward with the references of those types plugged in
    (swap.pluggable_types), the types read from the files' text. They are neither re-gated nor
    imported: a re-gate costs a minute or so on a GPU, and GPT-2 calls 3 of the 10 starters'
    types. An unknown type, or one that contradicts the plan, is kept for the re-gate and
    load_kernel to refuse; a model whose forward fails here keeps every file (verify() then
    reports the failure). -> (the specs to plug in, [(spec, name, type)] left out)."""
    attrs = {spec[0]: read_file_attrs(spec[0])[0] for spec in specs}
    types = {spec[0]: attrs[spec[0]].get("KERNEL_TYPE") for spec in specs}
    try:
        plugged = pluggable_types(model, lambda m: forward(m, inputs),
                                  set(types.values()) | set(among))
    except Exception as e:  # noqa: BLE001
        print(f"could not check which kernel types have call sites: {describe(e)}")
        return specs, []
    kept, idle = [], []
    for spec in specs:
        t = types[spec[0]]
        if t in plugged or t not in autokernel.KERNEL_TYPE_NAMES or spec[2] not in (None, t):
            kept.append(spec)
        else:
            idle.append((spec, spec[1] or tag_of(attrs[spec[0]]), t))
    return kept, idle


def plugged_kernels(args, specs, rows, model, inputs):
    """The files with call sites in this model (without_call_sites), re-gated and imported
    (select_kernels). A file refused by its re-gate gives its call sites back: the files left
    out beside it are checked again. -> (kernels, {file: re-gate result}, [(spec, name, type)]
    left out)."""
    specs, idle = without_call_sites(specs, model, inputs)
    if idle:
        files = "starters" if args.starters else "kernel files"
        print(f"{len(idle)} of {len(specs) + len(idle)} {files} have no call site in this model "
              f"beside the others ({', '.join(t for _, _, t in idle)}): not run")
    if args.no_regate:
        print("re-gate: skipped (--no-regate): the kernel files are plugged in without being "
              "judged again")
    kernels, checked = select_kernels(args, specs, rows)
    refused = [f for f, c in checked.items() if not c["passed"]]
    if refused and idle:
        back, idle = without_call_sites([spec for spec, _, _ in idle], model, inputs,
                                        among={k.kernel_type for k in kernels})
        if back:
            print(f"with {len(refused)} file(s) refused, {len(back)} more have call sites: "
                  f"{', '.join(rel(spec[0]) for spec in back)}")
            more, more_checked = select_kernels(args, back, rows)
            kernels += more
            checked.update(more_checked)
    return kernels, checked, idle


def idle_entry(spec, name, kernel_type):
    """The report's entry for a file left out by without_call_sites: "unused" for a starter
    (spec's optional flag), else "never ran" (a file the user or the plan named: a failure)."""
    entry = blank_entry(name, kernel_type, rel(spec[0]))
    return dict(entry, status="unused") if spec[4] else entry


def refuse_cuda_without_gpu(paths):
    """CUDA C++ kernel files need an NVIDIA GPU: one line before anything is re-gated or run."""
    cuda = [] if autokernel.CUDA else [p for p in paths if is_cuda_kernel(p)]
    if cuda:
        more = f" (and {len(cuda) - 1} more)" if len(cuda) > 1 else ""
        raise UsageError(f"{rel(cuda[0])}{more} is a CUDA C++ kernel (BACKEND = \"cuda\"): it "
                         f"needs an NVIDIA GPU and this machine has none; nothing was re-gated "
                         f"or run (verify on a GPU machine)")


def kernel_path(path):
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = autokernel.ROOT / path
    if not path.exists():
        starter = autokernel.starters_dir() / f"{path.stem}.py"  # `--kernels softmax`
        hint = f": did you mean {rel(starter)}?" if starter.exists() else ""
        raise UsageError(f"kernel file {path} does not exist{hint}")
    return path


# ---------------------------------------------------------------------------------------------
# Running the model with kernels in, and the report
# ---------------------------------------------------------------------------------------------

def run_swapped(model, inputs, swap):
    """One forward with `swap` plugged in: (checked_forward's pair or None, error or None)."""
    swap.reset()
    try:
        with swap.installed(model):
            run = checked_forward(model, inputs)
        sync()
        return run, None
    except KernelFailure as e:
        return None, str(e)
    except Exception as e:  # glue or the model itself failed with the kernels in
        return None, f"the model with kernels raised {describe(e)}"


def blank_entry(name, kernel_type, file):
    """A kernel's report entry before anything is known of its run (the schema's keys)."""
    return {"name": name, "kernel_type": kernel_type, "file": file, "calls": 0, "shapes": [],
            "fallbacks": {}, "skipped": {}, "notes": [], "status": "never ran", "error": None,
            "alone": None, "alone_ms": None, "gain_ms": None, "share": None,
            "compile_alone_ms": None, "compile_gain_ms": None, "compile_alone_note": None}


def kernel_entry(kernel, swap, error=None):
    t = kernel.kernel_type
    calls = swap.calls[kernel.name]
    crashed = error is not None and error.startswith(f"{kernel.name} (")
    # After another kernel crashed the forward stopped: this one's count means nothing.
    status = "crashed" if crashed else "stopped" if error else "ok" if calls else "never ran"
    return dict(blank_entry(kernel.name, t, kernel.rel_file), calls=calls,
                shapes=sorted(swap.shapes[kernel.name]), fallbacks=dict(swap.fallbacks[t]),
                skipped=dict(swap.skipped[t]), notes=sorted(swap.notes[t]), status=status,
                error=error if status == "crashed" else None)


def why_not(entry):
    """Why a kernel never ran, from its fallbacks and skipped modules."""
    reasons = [f"{n}x {r}" for r, n in entry["fallbacks"].items()] + \
              [f"{n} module(s) {r}" for r, n in entry["skipped"].items()]
    return "; ".join(reasons) if reasons else "no matching op in the model"


def verify(model, inputs, kernels, *, diagnose=False, timing=True, warmup=None, repeat=None,
           compile_backend=None, weight_layout="copy", cuda_graphs=False, description="model",
           compile_alone=None, paired_rounds=None, left_out=()):
    """Everything but the printing: returns the verify.json dict. compile_alone (default: on a
    GPU) times each kernel alone inside torch.compile too (a compile each); paired_rounds
    (default: PAIRED_ROUNDS on a GPU, none on a CPU) times the best variant against
    torch.compile again in that many interleaved rounds (pair_with_compile). left_out: the
    entries of files never plugged in (idle_entry), judged like the kernels' own."""
    model.eval()
    dtype = model_dtype(model)
    weights = WeightCache()
    try:
        run_ref = checked_forward(model, inputs)
        sync()
    except torch.cuda.OutOfMemoryError:
        raise ModelError("CUDA out of memory running the original model: use a smaller "
                         "--input-shape or --config") from None
    except Exception as e:
        raise ModelError(f"the original model raised {describe(e)}") from None

    swap = Swap(kernels, weights, weight_layout)
    run, error = run_swapped(model, inputs, swap)
    entries = [kernel_entry(k, swap, error) for k in kernels]
    for k, e in zip(kernels, entries):
        if k.optional and e["status"] == "never ran":
            e["status"] = "unused"  # a starter with nothing to replace here: not a replacement
    used = [(k, e) for k, e in zip(kernels, entries) if e["status"] != "unused"]
    entries += left_out
    correctness = {"passed": False, "error": error} if run is None else \
        compare_runs(run, run_ref)
    del run

    failures = failures_of(entries, used, error, correctness)
    if diagnose:
        diagnose_alone(model, inputs, used, run_ref, weights, weight_layout)

    report = {"model": description, "device": device_name(), "dtype": autokernel.DTYPE_NAMES.get(
        dtype, str(dtype)), "timing_meaningful": autokernel.TIMING_MEANINGFUL,
        "kernels": entries, "correctness": correctness, "timing": None,
        "speedup_vs_eager": None, "speedup_vs_compile": None, "best_variant": None,
        "best_ms": None, "best_speedup_vs_compile": None,
        "best_speedup_vs_compile_single": None}
    if timing and not diagnose and not failures:
        backend = compile_backend or ("inductor" if autokernel.CUDA else None)
        report["timing"] = measure(model, inputs, used, weights, weight_layout, warmup, repeat,
                                   backend, cuda_graphs, run_ref,
                                   autokernel.CUDA if compile_alone is None else compile_alone)
        t = report["timing"]
        report["speedup_vs_eager"] = t["eager_ms"] / t["kernels_ms"]
        if t["compile_ms"] is not None:
            report["speedup_vs_compile"] = t["compile_ms"] / t["kernels_ms"]
        best_variant(report)
        rounds = (PAIRED_ROUNDS if autokernel.CUDA else 0) if paired_rounds is None \
            else paired_rounds
        if rounds and t["compile_ms"] is not None and report["best_variant"]:
            pair_with_compile(report, model, inputs, used, weights, weight_layout, backend,
                              t["warmup"], t["repeat"], cuda_graphs, rounds)
    report["failures"] = failures
    report["passed"] = not failures and all(e["status"] in ("ok", "unused") for e in entries)
    return report


def failures_of(entries, used, error, correctness):
    """One line per reason the run fails: a kernel crashed or never ran, the forward raised, no
    kernel ran at all, or the outputs mismatch (then a lone used kernel is marked "mismatch")."""
    failures = []
    for e in entries:
        if e["status"] == "crashed":
            failures.append(f"{e['name']} ({e['file']}): crashed: {e['error']}")
        elif e["status"] == "never ran":
            failures.append(f"{e['name']} ({e['file']}): never ran ({why_not(e)})")
    if error and not any(e["status"] == "crashed" for e in entries):
        failures.append(error)
    if not used:
        failures.append("no kernel ran: none of them matches an op of this model")
    if not error and not correctness["passed"]:
        failures.append(f"outputs mismatch: {describe_mismatch(correctness)}")
        if len(used) == 1 and used[0][1]["status"] == "ok":
            used[0][1]["status"] = "mismatch"
    return failures


def diagnose_alone(model, inputs, used, run_ref, weights, weight_layout):
    """--diagnose: each used kernel alone in the model, compared with the original; a kernel
    that fails alone is marked "mismatch"."""
    for k, e in used:
        alone = Swap([k], weights, weight_layout)
        run_k, err_k = run_swapped(model, inputs, alone)
        c = compare_runs(run_k, run_ref) if run_k is not None else \
            {"passed": False, "error": err_k}
        e["alone"] = dict(c, calls=alone.calls[k.name],
                          passed=bool(c["passed"] and alone.calls[k.name] > 0))
        if not e["alone"]["passed"] and e["status"] == "ok":
            e["status"] = "mismatch"
        del run_k


def capture_breakers(model, inputs, kernels, weights, weight_layout):
    """The kernels whose swap alone cannot be captured in a CUDA graph (a host sync, an
    allocation or a capture-unsafe call in kernel_fn or its glue)."""
    if len(kernels) < 2:
        return [k.name for k in kernels]
    culprits = []
    for k in kernels:
        try:
            with Swap([k], weights, weight_layout).installed(model):
                capture(model, inputs, 1)
        except GraphCaptureError:
            culprits.append(k.name)
    return culprits


def measure(model, inputs, used, weights, weight_layout, warmup, repeat, backend,
            graphs=False, run_ref=None, compile_alone=False):
    """Eager, torch.compile (with `backend`; None or "none": not timed), torch.compile with the
    kernels inside, all kernels, and each kernel alone (for its share of the gain;
    compile_alone: inside torch.compile too). graphs: every one of them timed as CUDA graph
    replays (no launch overhead). run_ref: the original's checked_forward, which the compiled
    models with kernels are compared against."""
    kernels = [k for k, _ in used]
    warmup = (5 if autokernel.CUDA else 1) if warmup is None else warmup
    repeat = (20 if autokernel.CUDA else 3) if repeat is None else repeat
    method = "CUDA graph replays, CUDA events, median" if graphs else "CUDA events, median"
    timing = {"method": method if autokernel.CUDA else
              "perf_counter, median (CPU interpreter: not meaningful)", "cuda_graphs": graphs,
              "warmup": warmup, "repeat": repeat, "compile_ms": None, "compile_note": None,
              "compile_correctness": None,
              "compile_kernels_ms": None, "graph_breaks": None, "compile_kernels_calls": None,
              "compile_kernels_folded": None, "compile_kernels_normed": None,
              "compile_kernels_correctness": None, "compile_kernels_note": None,
              "compile_gainers": None, "compile_gainers_ms": None,
              "compile_gainers_correctness": None, "paired": None}

    steps = {"done": 0, "total": 3 + (len(kernels) if len(kernels) > 1 else 0),
             "start": time.monotonic()}
    if not autokernel.CUDA:
        print(f"timing {steps['total']}+ variants in the interpreter at the model's shapes: "
              "minutes each, and the numbers mean nothing on a CPU (--no-timing: correctness "
              "only)", flush=True)

    def progress(what, ms):
        steps["done"] += 1
        print(f"timed {steps['done']}/{steps['total']}: {what}: "
              + (f"{ms:.3f} ms" if ms is not None else "skipped")
              + f" ({time.monotonic() - steps['start']:.0f} s elapsed)", flush=True)
        return ms

    def timed(swap=None, what="the model with kernels"):
        try:
            if swap is None:
                return progress(what, time_forward(model, inputs, warmup, repeat, graphs))
            with swap.installed(model):
                return progress(what, time_forward(model, inputs, warmup, repeat, graphs))
        except GraphCaptureError as e:
            culprits = capture_breakers(model, inputs, swap.kernels if swap else [], weights,
                                        weight_layout)
            blame = f"{', '.join(culprits)} breaks the capture alone; " if culprits else ""
            raise GraphCaptureError(f"capturing {what} in a CUDA graph failed ({e}): {blame}"
                                    "run without --cuda-graphs") from None

    if backend in (None, "none"):  # known before the first step, so the count never shrinks
        steps["total"] -= 1
    timing["eager_ms"] = timed(what="the original model")
    if backend is None:
        timing["compile_note"] = "skipped on CPU (pass --compile-backend to force)"
    elif backend == "none":
        timing["compile_note"] = "skipped (--no-compile)"
    else:
        try:
            compiled = torch.compile(model, backend=backend)
            forward(compiled, inputs)  # compile outside the timed runs
            if run_ref is not None:  # the baseline is only a baseline if its outputs are right
                timing["compile_correctness"] = compare_runs(checked_forward(compiled, inputs),
                                                             run_ref)
            timing["compile_ms"] = progress("torch.compile of the original model", time_forward(
                compiled, inputs, warmup, repeat, graphs))
            timing["compile_note"] = f"torch.compile(backend={backend!r})"
        except Exception as e:  # report it, keep the eager comparison
            timing["compile_note"] = f"torch.compile(backend={backend!r}) failed: " \
                                     f"{describe(e)}"
        compiled = None
        torch._dynamo.reset()
        steps["total"] += 1

        def compiled_run(subset, what, breaks=False):
            return compile_with_kernels(model, inputs, subset, weights, weight_layout, backend,
                                        run_ref, lambda m: progress(what, time_forward(
                                            m, inputs, warmup, repeat, graphs)), breaks)
        run = compiled_run(kernels, "torch.compile of the model with kernels", breaks=True)
        timing.update({f"compile_kernels_{k}" if k != "graph_breaks" else k: v
                       for k, v in run.items()})
        if compile_alone and run["ms"] is not None and timing["compile_ms"] is not None:
            attribute_compiled(used, timing, compiled_run, steps)
    timing["kernels_ms"] = timed(Swap(kernels, weights, weight_layout))
    total_gain = timing["eager_ms"] - timing["kernels_ms"]
    for k, e in used:
        if len(kernels) == 1:
            e["alone_ms"] = timing["kernels_ms"]
        else:
            e["alone_ms"] = timed(Swap([k], weights, weight_layout), f"the model with {k.name}")
        e["gain_ms"] = timing["eager_ms"] - e["alone_ms"]
        e["share"] = e["gain_ms"] / total_gain if total_gain > 0 else None  # of a loss: n/a
    # The morning's question: which kernels to ship. When some kernels gain and some lose,
    # time the gainers together too.
    gainers = [k for k, e in used if e["gain_ms"] > 0]
    timing["gainers"] = [k.name for k in gainers]
    timing["gainers_ms"] = timing["gainers_correctness"] = None
    if gainers and len(gainers) < len(kernels):
        steps["total"] += 1
        timing["gainers_ms"] = timed(Swap(gainers, weights, weight_layout), "the gainers together")
        if run_ref is not None:  # a shippable variant only if its outputs match too
            run, error = run_swapped(model, inputs, Swap(gainers, weights, weight_layout))
            timing["gainers_correctness"] = {"passed": False, "error": error} if run is None \
                else compare_runs(run, run_ref)
    return timing


def compile_with_kernels(model, inputs, kernels, weights, weight_layout, backend, run_ref,
                         time_it, breaks=True):
    """torch.compile of the model inside a compiled swap of `kernels` (each kernel a custom op:
    one node in the graph). One eager forward first: the swap's host-side checks (cross_entropy's
    ignore_index) keep the verdict it reads, since a traced forward cannot read one, and the
    matmul weight copies exist before tracing (else the graph would rebuild them). Then the
    compiled forward's graph breaks (when `breaks`), its calls per kernel (counted as the ops
    run; "folded": those with an add folded in; "normed": those with a norm folded in), its
    outputs against the original's, and time_it(compiled model) in ms: {"ms", "graph_breaks",
    "calls", "folded", "normed", "correctness", "note"}. A failure is noted, not fatal: the
    eager kernels are the verdict."""
    out = {"ms": None, "graph_breaks": None, "calls": None, "folded": None, "normed": None,
           "correctness": None, "note": f"torch.compile(backend={backend!r}) with kernels as ops"}
    swap = Swap(kernels, weights, weight_layout, compiled=True)
    try:
        with swap.installed(model):
            forward(model, inputs)
            if breaks:
                out["graph_breaks"] = graph_breaks(model, inputs)
            compiled = torch.compile(model, backend=backend)
            # Compile outside the timed runs: the plain forward that is timed, and the one under
            # checked_forward's loss-input recorder (a mode: dynamo traces that one apart).
            forward(compiled, inputs)
            checked_forward(compiled, inputs)
            swap.reset()
            run = checked_forward(compiled, inputs)
            out["calls"] = dict(swap.calls)
            out["folded"] = {k: n for k, n in swap.folded.items() if n}
            out["normed"] = {k: n for k, n in swap.normed.items() if n}
            out["correctness"] = compare_runs(run, run_ref) if run_ref is not None else None
            del run
            out["ms"] = time_it(compiled)
    except Exception as e:  # report it, keep the other timings
        out["note"] += f" failed: {describe(e)}"
    compiled = None
    torch._dynamo.reset()
    return out


def attribute_compiled(used, timing, compiled_run, steps):
    """Each kernel alone inside torch.compile: compile_alone_ms and compile_gain_ms (against
    torch.compile of the original) per kernel, so the report says which kernels help inside
    compile and which hurt; the kernels that help are then compiled together (compile_gainers),
    the variant that ships only them. A kernel alone whose compiled outputs mismatch counts as
    no gain."""
    if len(used) > 1:
        steps["total"] += len(used)
        runs = [compiled_run([k], f"torch.compile of the model with {k.name}") for k, _ in used]
    else:  # alone is all of them: the run already made
        runs = [{"ms": timing["compile_kernels_ms"], "note": timing["compile_kernels_note"],
                 "correctness": timing["compile_kernels_correctness"]}]
    for (k, e), run in zip(used, runs):
        c = run["correctness"]
        e["compile_alone_ms"] = run["ms"]
        if run["ms"] is not None and (c is None or c["passed"]):
            e["compile_gain_ms"] = timing["compile_ms"] - run["ms"]
        else:
            e["compile_alone_note"] = run["note"] if run["ms"] is None else \
                f"outputs mismatch: {describe_mismatch(c)}"
    gainers = [k for k, e in used if (e["compile_gain_ms"] or 0) > 0]
    timing["compile_gainers"] = [k.name for k in gainers]
    if gainers and len(gainers) < len(used):
        steps["total"] += 1
        run = compiled_run(gainers, "torch.compile of the model with the gainers")
        timing["compile_gainers_ms"] = run["ms"]
        timing["compile_gainers_correctness"] = run["correctness"]


def graph_breaks(model, inputs):
    """Dynamo's graph breaks in one traced forward, from torch._dynamo.explain (a trace of its
    own, no backend compile). Its counters["graph_break"] alone misses data-dependent breaks."""
    torch._dynamo.reset()
    explain = torch._dynamo.explain(model)
    with torch.no_grad():
        if isinstance(inputs, dict):
            result = explain(**inputs)
        else:
            result = explain(*inputs) if isinstance(inputs, (tuple, list)) else explain(inputs)
    torch._dynamo.reset()
    return result.graph_break_count


def best_variant(report):
    """The fastest of the eager kernels, the eager gainers, torch.compile with the kernels and
    torch.compile with only the kernels that gain inside it (the last three when their outputs
    were compared and match; the eager kernels' are the report's verdict):
    report keys best_variant, best_ms and best_speedup_vs_compile (null without a torch.compile
    timing)."""
    t = report["timing"]

    def checked(variant):  # a run whose outputs mismatch (or were not compared) is no candidate
        c = t.get(f"{variant}_correctness")
        return t.get(f"{variant}_ms") if c is not None and c["passed"] else None
    times = {"kernels": t["kernels_ms"], "gainers": checked("gainers"),
             "compile_kernels": checked("compile_kernels"),
             "compile_gainers": checked("compile_gainers")}
    name = min((n for n, ms in times.items() if ms is not None), key=times.get)
    report.update(best_variant=name, best_ms=times[name], best_speedup_vs_compile=None
                  if t["compile_ms"] is None else t["compile_ms"] / times[name])


PAIRED_ROUNDS = 15  # interleaved rounds of the best variant against torch.compile


def pair_with_compile(report, model, inputs, used, weights, weight_layout, backend, warmup,
                      repeat, graphs, rounds):
    """The best variant and torch.compile of the original, built again and timed in `rounds`
    interleaved rounds of `repeat` forwards each (endtoend.interleaved): the one-shot timings
    above run minutes apart, and the drift between them moved their ratio by ~3% from run to
    run on an H100, while the rounds' median held within 1-2%. Which variant is best is still
    the one-shot timings' choice; only its ratio to torch.compile is timed again. Adds
    timing["paired"] = {"variant", "rounds", "compile_ms", "best_ms" (medians of the rounds'
    medians), "ratios" (compile over best, each round), "ratio" (their median), "note"}; the
    ratio becomes best_speedup_vs_compile, the one-shot one stays as
    best_speedup_vs_compile_single. A failure is noted and leaves the one-shot figures.
    Without CUDA graphs each round enters the swap again, whose fresh wrappers dynamo compiles
    once more: at least one warm-up forward takes that compile out of the rounds."""
    t, name = report["timing"], report["best_variant"]
    chosen = {"gainers": t["gainers"], "compile_gainers": t["compile_gainers"]}.get(name)
    kernels = [k for k, _ in used if chosen is None or k.name in chosen]
    compiled = name.startswith("compile")
    swap = Swap(kernels, weights, weight_layout, compiled=compiled)
    paired = t["paired"] = {"variant": name, "rounds": rounds, "compile_ms": None,
                            "best_ms": None, "ratios": None, "ratio": None, "note": None}
    print(f"pairing: {name} and torch.compile, {rounds} interleaved rounds", flush=True)
    started = time.monotonic()
    try:
        baseline = torch.compile(model, backend=backend)
        forward(baseline, inputs)
        runners = [(contextlib.nullcontext, capture(baseline, inputs, warmup).replay if graphs
                    else lambda: forward(baseline, inputs))]
        with swap.installed(model):
            forward(model, inputs)  # the matmul weight copies exist before tracing
            best = torch.compile(model, backend=backend) if compiled else model
            forward(best, inputs)
            if graphs:  # a replay needs no swap around it
                runners.append((contextlib.nullcontext, capture(best, inputs, warmup).replay))
            else:
                runners.append((lambda: swap.installed(model), lambda: forward(best, inputs)))
        for context, run in runners:
            with context():
                for _ in range(max(warmup, 1)):
                    run()
        sync()
        base_ms, best_ms = interleaved(runners, rounds, repeat)
    except Exception as e:  # report it, keep the one-shot figures
        paired["note"] = f"failed: {describe(e)}"
        return
    finally:
        baseline = best = runners = None
        torch._dynamo.reset()
    ratios = [a / b for a, b in zip(base_ms, best_ms)]
    paired.update(compile_ms=statistics.median(base_ms), best_ms=statistics.median(best_ms),
                  ratios=ratios, ratio=statistics.median(ratios))
    report["best_speedup_vs_compile_single"] = report["best_speedup_vs_compile"]
    report["best_speedup_vs_compile"] = paired["ratio"]
    print(f"paired: {rounds} rounds in {time.monotonic() - started:.0f} s", flush=True)


def device_name():
    return torch.cuda.get_device_name() if autokernel.CUDA else "cpu (Triton interpreter)"


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------

def _g(x, fmt=".2e"):
    return "n/a" if x is None else format(x, fmt)


def describe_mismatch(c):
    if c.get("error"):
        return c["error"]
    text = f"{c['output']} max rel err {_g(c['rel_err'], '.1e')} (tol {_g(c['tolerance'], '.0e')})"
    if c.get("top1_tie_aware") is not None:
        text += f", top-1 agreement {c['top1_tie_aware']:.1%} (min {c['top1_min']:.0%})"
    return text


def outputs_verdict(c):
    return "not compared" if c is None else "PASS" if c["passed"] else \
        f"FAIL ({describe_mismatch(c)})"


def print_report(r):
    print(f"model: {r['model']}")
    print(f"device: {r['device']}  dtype: {r['dtype']}")
    print(f"{'kernel':<22} {'type':<17} {'calls':>6}  {'status':<10} shapes / file")
    for e in r["kernels"]:
        shapes = ", ".join(e["shapes"][:4]) + (" ..." if len(e["shapes"]) > 4 else "")
        print(f"{e['name']:<22} {e['kernel_type']:<17} {e['calls']:>6}  {e['status']:<10} "
              f"{shapes or '-'}  [{e['file']}]")
        extra = [f"fallback {n}x: {why}" for why, n in e["fallbacks"].items()] + \
                [f"{n} module(s) {why}" for why, n in e["skipped"].items()] + e["notes"]
        for line in extra:
            print(f"{'':<24}{line}")
    c = r["correctness"]
    if c.get("rel_err") is not None:
        print(f"correctness: {c['output']} {tuple(c['shape'])} max abs err {_g(c['max_abs_err'])}, "
              f"rel err {_g(c['rel_err'])} (tol {c['tolerance']:.0e}), top-1 {_g(c['top1'], '.1%')}"
              f", tie-aware {_g(c['top1_tie_aware'], '.1%')} (min {c['top1_min']:.0%}): "
              f"{'PASS' if c['passed'] else 'FAIL'}")
    else:
        print(f"correctness: FAIL ({c.get('error')})")
    for e in r["kernels"]:
        a = e["alone"]
        if a is None:
            continue
        if a["passed"]:
            print(f"diagnose: {e['name']} ({e['file']}): ok alone, {a['calls']} calls, "
                  f"rel err {_g(a['rel_err'])}")
        elif a["calls"] == 0 and not a["error"]:
            print(f"diagnose: FAIL {e['name']} ({e['file']}): never ran ({why_not(e)})")
        else:
            print(f"diagnose: FAIL {e['name']} ({e['file']}): {describe_mismatch(a)}")
    alone = [e["alone"] for e in r["kernels"] if e["alone"] is not None]
    if alone and all(a["passed"] for a in alone) and not r["correctness"].get("passed"):
        print("diagnose: every kernel passes alone: the failure comes from their combination")
    t = r["timing"]
    if t:
        note = "" if r["timing_meaningful"] else "  (CPU interpreter: NOT meaningful)"
        print(f"timing ({t['method']}, {t['repeat']} runs after {t['warmup']} warm-up): "
              f"eager {t['eager_ms']:.3f} ms, torch.compile {_g(t['compile_ms'], '.3f')} ms, "
              f"kernels {t['kernels_ms']:.3f} ms{note}")
        if t["compile_ms"] is None:
            print(f"torch.compile: {t['compile_note']}")
        elif t.get("compile_correctness") and not t["compile_correctness"]["passed"]:
            print("warning: torch.compile of the original model does not match the original: "
                  f"{describe_mismatch(t['compile_correctness'])}")
        print_compile_kernels(t)
        vs_compile = "n/a" if r["speedup_vs_compile"] is None else \
            f"{r['speedup_vs_compile']:.3f}x"
        best = f"; best: {r['best_variant']} {r['best_ms']:.3f} ms" \
            + ("" if r["best_speedup_vs_compile"] is None else
               f", {r['best_speedup_vs_compile']:.3f}x vs torch.compile")
        paired = t.get("paired")
        if paired and paired["ratio"] is not None:
            best = f"; best: {r['best_variant']} {r['best_ms']:.3f} ms, " \
                f"{r['best_speedup_vs_compile_single']:.3f}x vs torch.compile (one-shot); " \
                f"in {paired['rounds']} interleaved rounds {paired['best_ms']:.3f} ms against " \
                f"{paired['compile_ms']:.3f}, {paired['ratio']:.3f}x (rounds " \
                f"{min(paired['ratios']):.3f}-{max(paired['ratios']):.3f})"
        print(f"speedup: {r['speedup_vs_eager']:.3f}x vs eager, {vs_compile} vs torch.compile"
              f"{best}")
        if paired and paired["note"]:
            print(f"pairing with torch.compile {paired['note']}")
        for e in (e for e in r["kernels"] if e["alone_ms"] is not None):
            print(f"share of gain: {e['name']:<22} alone {e['alone_ms']:.3f} ms, gain "
                  f"{e['gain_ms']:+.3f} ms, share {_g(e['share'], '.0%')}")
        for e in (e for e in r["kernels"] if e.get("compile_alone_ms") is not None):
            print(f"inside torch.compile: {e['name']:<22} alone {e['compile_alone_ms']:.3f} ms, "
                  f"gain {_g(e['compile_gain_ms'], '+.3f')} ms vs torch.compile"
                  + (f" ({e['compile_alone_note']})" if e.get("compile_alone_note") else ""))
        if t.get("compile_gainers_ms"):
            print(f"torch.compile with only the kernels that gain inside it "
                  f"({', '.join(t['compile_gainers'])}): {t['compile_gainers_ms']:.3f} ms, "
                  f"{t['compile_ms'] / t['compile_gainers_ms']:.3f}x vs torch.compile; outputs "
                  f"{outputs_verdict(t['compile_gainers_correctness'])}")
        if t.get("gainers_ms"):
            vs_compile = "" if t["compile_ms"] is None else \
                f", {t['compile_ms'] / t['gainers_ms']:.3f}x vs torch.compile"
            print(f"only the kernels that gain ({', '.join(t['gainers'])}): "
                  f"{t['gainers_ms']:.3f} ms, {t['eager_ms'] / t['gainers_ms']:.3f}x vs eager"
                  f"{vs_compile}; outputs {outputs_verdict(t.get('gainers_correctness'))}")
    for f in r["failures"]:
        print(f"FAIL {f}")
    broken = not c["passed"] or any(e["status"] in ("crashed", "mismatch") for e in r["kernels"])
    if broken and not any(e["alone"] for e in r["kernels"]):
        print("hint: run again with --diagnose to find the kernel that breaks the model")
    elif any(e["status"] == "never ran" for e in r["kernels"]):
        print("hint: a kernel that never ran replaced nothing in this model (the reason is "
              "above): leave it out of --kernels, or out of plan.json (extract.py --types)")
    print(f"verdict: {'PASS' if r['passed'] else 'FAIL'}"
          + (f" {r['speedup_vs_eager']:.3f}x vs eager" if r["speedup_vs_eager"] else ""))


def print_compile_kernels(t):
    """The torch.compile-with-kernels line: time, graph breaks, calls, outputs (or why none)."""
    if t.get("compile_kernels_ms") is None:
        if t["compile_ms"] is not None:
            print(f"torch.compile with kernels: {t['compile_kernels_note']}")
        return
    verdict = outputs_verdict(t["compile_kernels_correctness"])
    folded = t.get("compile_kernels_folded") or {}
    normed = t.get("compile_kernels_normed") or {}

    def fused(n):  # what the fusion pass folded into a kernel's calls
        parts = [f"{folded[n]} with the add after it folded in"] if folded.get(n) else []
        parts += [f"{normed[n]} with the norm before it"] if normed.get(n) else []
        return f" ({', '.join(parts)})" if parts else ""
    calls = ", ".join(f"{n} {k}{fused(n)}"
                      for n, k in t["compile_kernels_calls"].items()) or "none"
    print(f"torch.compile with kernels: {t['compile_kernels_ms']:.3f} ms, "
          f"{t['graph_breaks']} graph break(s), calls per forward: {calls}; outputs {verdict}")


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def main(argv=None):
    return run_main("verify.py", _verify, argv)


def _verify(argv):
    args = build_parser().parse_args(argv)
    if args.kernels and args.starters:
        raise UsageError("pass either --kernels or --starters, not both")
    if args.warmup is not None and args.warmup < 0 or args.repeat is not None \
            and args.repeat < 1 or args.paired_rounds is not None and args.paired_rounds < 0:
        raise UsageError("--warmup and --paired-rounds must be >= 0, --repeat >= 1")
    if args.cuda_graphs and not autokernel.CUDA:
        raise UsageError("--cuda-graphs needs a CUDA GPU: drop it on this machine")
    check_model_args(args)  # a typo in the model flags: before minutes of re-gating
    specs, rows = kernel_specs(args)
    if reuse_profile_flags(args):
        given = " ".join(f"--{f.replace('_', '-')} {getattr(args, f)}" for f in MODEL_FLAGS
                         if getattr(args, f, None) is not None)
        print(f"model flags from {autokernel.PROFILE_JSON}: {given or 'none (the defaults)'}")
    model, inputs, description = load_model(args)  # before re-gating: its call sites decide
    kernels, checked, idle = plugged_kernels(args, specs, rows, model, inputs)
    refused = {f: c for f, c in checked.items() if not c["passed"]}
    if refused and not kernels:
        first = next(iter(refused.values()))
        raise UsageError(f"every kernel failed its re-gate: {one_line(first['gate'])}", code=1)
    backend = "none" if args.no_compile else args.compile_backend
    try:
        report = verify(model, inputs, kernels, diagnose=args.diagnose,
                        timing=not args.no_timing, warmup=args.warmup, repeat=args.repeat,
                        compile_backend=backend, weight_layout=args.weight_layout,
                        cuda_graphs=args.cuda_graphs, description=description,
                        compile_alone=args.compile_alone, paired_rounds=args.paired_rounds,
                        left_out=[idle_entry(*i) for i in idle])
    except GraphCaptureError as e:
        raise UsageError(str(e), code=1) from None
    report["regate"] = None if args.no_regate else checked
    for path, c in refused.items():
        report["failures"].append(f"{rel(path)} left out: it failed its re-gate "
                                  f"({c['version'] if c['version_ok'] is False else c['gate']})")
        report["passed"] = False
    print_report(report)
    write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")
    return 0 if report["passed"] else 1


def build_parser():
    parser = ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]).strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser, "model (none of these given: the model profile.json recorded, with "
                           "its flags; the defaults below apply without one)")
    src = parser.add_argument_group("kernels (default: workspace/plan.json)")
    src.add_argument("--plan", default=str(autokernel.PLAN_JSON), help="extract.py's plan")
    src.add_argument("--kernels", help="explicit kernel files, comma-separated")
    src.add_argument("--starters", action="store_true",
                     help="the kernels/*.py starters (kernels/cuda/*.py with --backend cuda) "
                          "whose kernel type this model calls")
    src.add_argument("--backend", choices=("triton", "cuda"), default="triton",
                     help="which starters --starters takes: triton or cuda (CUDA C++, GPU only)")
    src.add_argument("--results", default=str(autokernel.RESULTS_TSV),
                     help="results.tsv whose kept rows the plan's kernel files must match")
    src.add_argument("--no-regate", action="store_true",
                     help="plug kernels in without judging each through bench.py first (quick "
                          "checks only: the morning report should re-gate)")
    parser.add_argument("--diagnose", action="store_true",
                        help="run each kernel alone and name the ones that break the model")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile timing")
    parser.add_argument("--compile-backend", help="torch.compile backend (default: inductor on "
                        "CUDA; on CPU compile is skipped unless this is given)")
    parser.add_argument("--compile-alone", action=argparse.BooleanOptionalAction,
                        help="time each kernel alone inside torch.compile too, a compile each "
                             "(default: on a GPU)")
    parser.add_argument("--paired-rounds", type=int,
                        help="time the best variant against torch.compile again in this many "
                             "interleaved rounds, the headline ratio their median (default "
                             f"{PAIRED_ROUNDS} on a GPU, 0 on a CPU; 0: off)")
    parser.add_argument("--no-timing", action="store_true", help="check correctness only")
    parser.add_argument("--warmup", type=int, help="untimed forwards (default 5 CUDA, 1 CPU)")
    parser.add_argument("--repeat", type=int, help="timed forwards (default 20 CUDA, 3 CPU)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="time every variant as CUDA graph replays: kernels without the "
                        "per-launch host cost that makes small forwards launch-bound")
    parser.add_argument("--weight-layout", choices=("copy", "view"), default="copy",
                        help="matmul B operand: contiguous W.t() copy (default) or strided view")
    parser.add_argument("--out", default=str(autokernel.VERIFY_JSON), help="report JSON path")
    return parser


def reuse_profile_flags(args):
    """No model flags given: rebuild the model profile.py profiled (its profile.json records the
    flags), since plan.json's kernels were extracted from that model."""
    if any(getattr(args, f, None) is not None for f in MODEL_FLAGS):
        return False
    recorded = recorded_model_args(autokernel.PROFILE_JSON)
    for f in MODEL_FLAGS:
        if recorded.get(f) is not None:
            setattr(args, f, recorded[f])
    return bool(recorded)


if __name__ == "__main__":
    sys.exit(main())
