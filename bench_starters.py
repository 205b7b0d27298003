"""
The starter kernels (kernels/<type>.py) against PyTorch on this GPU, side by side, in one
command.

    python3 bench_starters.py                                  # every type
    python3 bench_starters.py --types softmax,matmul --out starters.md
    python3 bench_starters.py --compile-mode max-autotune      # with CUDA graphs (slower compile)
    python3 bench_starters.py --no-compile
    python3 bench_starters.py --backend cuda                   # the CUDA C++ starters (kernels/cuda/)

For each type, at its GPU primary shape (fp16) plus the extra rows of DESIGN.md's "bar to beat"
table (EXTRA_CASES below), one child process per type: checks the starter against the fp64 oracle
(a wrong kernel gets no speed number), then times the starter, eager PyTorch, the library baseline
and torch.compile with triton.testing.do_bench medians (L2 flushed). A crash, hang or failed
compile costs one row, never the run: the child reports each phase as it goes, the parent marks
the row that died and starts a new child for the rest.

Prints a markdown table (time, GB/s or TFLOP/s, % of the ceilings prepare.py measured, ratios vs
eager / compile / library, and the goal per row) and writes it to --out (.md) plus the same
data as JSON (.json beside it). On a CPU it runs the tiny CPU shapes through Triton's interpreter
without torch.compile: a test of the plumbing, not a benchmark.

--backend cuda times the CUDA C++ starters (kernels/cuda/<type>.py) instead, with the Triton
starter of each type as one more baseline column, and judges them by their own bar: at least
eager's speed, and memory-bound ones at >= 90% of the measured copy bandwidth. They need a GPU.
"""
import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from autokernel import CUDA, DEVICE, KERNEL_TYPES, baselines, reference
from autokernel.cli import ArgumentParser, describe, run_main
from autokernel.contract import KernelFileError, check_module, load_module

# DESIGN.md's "bar to beat" rows beyond each type's primary shape (GPU only): (shape, dtype).
EXTRA_CASES = {
    "softmax": [((4096, 50257), "fp16")],
    "cross_entropy": [((4096, 128256), "fp16")],
    "matmul": [((8192, 8192, 8192), "fp16"), ((8192, 8192, 8192), "bf16")],
    "flash_attention": [((1, 32, 4096, 64), "fp16")],
}
# The starter goals. Compute-bound types: (baseline, the speedup over it the starter must reach).
GOALS = {"matmul": ("library", 0.9), "flash_attention": ("library", 1.0),
         "fused_mlp": ("eager", 1.0)}
MEMORY_GOAL_PCT = 90.0  # memory-bound: >= this % of measured copy bandwidth and faster than compile
COMPILE_MODE = "max-autotune-no-cudagraphs"  # max-autotune's CUDA graphs add minutes of compile
BASELINES = ("eager", "library", "compile")
DEFAULT_OUT = autokernel.WORKSPACE / "bench_starters.md"
CUDA_EAGER_GOAL = 1.0  # --backend cuda: every starter at least as fast as eager PyTorch


def log(message):
    print(message, flush=True)


def bench_cases(ktype):
    """(shape, dtype name) rows for one type: the primary shape in fp16, then the extras."""
    cases = [(tuple(ktype.shapes("primary")), "fp16")]
    return cases + (EXTRA_CASES.get(ktype.name, []) if CUDA else [])


def new_row(ktype, shape, dtype, kernel_file):
    return {"kernel": ktype.name, "file": str(kernel_file), "shape": list(shape),
            "shape_str": ktype.shape_str(shape), "dtype": dtype, "phase": "queued",
            "status": None, "reason": "", "max_abs_err": None, "starter_us": None,
            **{f"{what}_us": None for what in BASELINES}, "library": None, "compile_mode": None,
            "compile_s": None, "copy_us": None, "triton_us": None}


# ---------------------------------------------------------------------------------------------
# The child: one kernel type, its rows in a JSON file it rewrites after every phase
# ---------------------------------------------------------------------------------------------

def load_starter(ktype, kernel_file):
    """(module, None) or (None, why not)."""
    if not Path(kernel_file).exists():
        return None, f"missing {kernel_file}"
    try:
        module = load_module(kernel_file)
        declared = check_module(module)["kernel_type"]
    except KernelFileError as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001  (a broken starter is a row, not a dead run)
        return None, f"import failed: {describe(exc)}"
    if declared != ktype.name:
        return None, f"KERNEL_TYPE is {declared!r}, not {ktype.name!r}"
    return module, None


def check_output(ktype, module, inputs):
    """(ok, reason, max_abs_err) of the starter's output against the fp64 oracle."""
    out = module.kernel_fn(**inputs)
    if CUDA:
        torch.cuda.synchronize()
    ref = ktype.reference(**inputs)
    if not isinstance(out, torch.Tensor):
        return False, f"kernel_fn returned {type(out).__name__}, not a tensor", None
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return False, (f"output {tuple(out.shape)} {out.dtype}, expected {tuple(ref.shape)} "
                       f"{ref.dtype}"), None
    dtype = inputs[ktype.args[0]].dtype
    mask, atol = ktype.mismatches(out, ref, inputs)  # the gate's own rule
    bad = int(mask.sum())
    err = float((out.double() - ref.double()).abs().max()) if out.numel() else 0.0
    if bad:
        return False, (f"{bad} of {out.numel()} elements off (rtol "
                       f"{autokernel.tolerance(dtype):g}, atol {atol:.3g}, max err {err:.3g})"), err
    return True, "", err


def cuda_alive():
    if not CUDA:
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def measure_row(ktype, module, why_not, row, compile_mode, save, triton_module=None):
    """Fill one row in place, phase by phase, calling save() at each step so a crash or hang
    leaves behind everything measured before it. triton_module: the type's Triton starter, timed
    as one more baseline (--backend cuda)."""
    def phase(name):
        row["phase"] = name
        save()

    label = f"[{ktype.name} {row['shape_str']} {row['dtype']}]"
    shape, dtype = tuple(row["shape"]), autokernel.DTYPES[row["dtype"]]
    phase("inputs")
    try:
        inputs = ktype.inputs(shape, dtype, DEVICE)
    except Exception as exc:  # noqa: BLE001  (out of memory, most likely)
        row.update(status="ERROR", reason=f"making inputs: {describe(exc)}")
        phase("done")
        return
    if module is None:
        row.update(status="MISSING", reason=why_not)
        log(f"{label} starter: {why_not}")
    else:
        phase("check")
        try:
            ok, reason, row["max_abs_err"] = check_output(ktype, module, inputs)
            row.update(status="PASS" if ok else "FAIL", reason=reason)
            log(f"{label} check {row['status']}" + (f": {reason}" if reason else
                                                    f" (max err {row['max_abs_err']:.3g})"))
            if ok:
                phase("starter")
                row["starter_us"] = baselines.time_us(lambda: module.kernel_fn(**inputs))
                log(f"{label} starter {row['starter_us']:,.1f} us")
        except Exception as exc:  # noqa: BLE001
            row.update(status="ERROR", reason=describe(exc), starter_us=None)
            log(f"{label} starter raised {row['reason']}")
            if not cuda_alive():  # e.g. an illegal address: nothing else can run in this process
                row["reason"] += " (CUDA context lost: this row's baselines not measured)"
                phase("done")
                os._exit(70)  # the parent starts a fresh child for the rows still queued
        if CUDA:
            torch.cuda.empty_cache()  # the fp64 oracle's buffers, before timing the baselines
    if triton_module is not None:
        phase("triton")
        try:
            row["triton_us"] = baselines.time_us(lambda: triton_module.kernel_fn(**inputs))
            log(f"{label} triton starter {row['triton_us']:,.1f} us")
        except Exception as exc:  # noqa: BLE001  (a baseline that fails costs its cell)
            row["triton_error"] = describe(exc)
            log(f"{label} triton starter failed: {row['triton_error']}")
    for what in BASELINES:
        if what == "library" and ktype.name not in reference.LIBRARY:
            continue
        if what == "compile" and not compile_mode:
            row["compile_error"] = "skipped" + ("" if CUDA else " on CPU")
            continue
        phase(what)
        if what == "compile":
            log(f"{label} torch.compile(mode={compile_mode!r}) ...")
        times, error = baselines.time_baseline(ktype, what, inputs, compile_mode)
        row.update(times)
        us = times[f"{what}_us"]
        if error:
            row[f"{what}_error"] = error
        extra = f" (compiled in {row['compile_s']:.0f} s)" if what == "compile" and us else ""
        log(f"{label} {what} " + (f"failed: {error}" if error else f"{us:,.1f} us{extra}"))
    del inputs
    if CUDA and ktype.bound == "memory":
        # The 1 GiB copy that sets the ceiling runs at full speed; a copy of only this kernel's
        # bytes pays the same start-up and tail as the kernel does (~5 us on the H100), so at
        # tens of MB it falls short of the ceiling too. Timed here so the table shows both.
        phase("copy")
        half = ktype.bytes(shape, dtype) // 2  # read + write = the kernel's bytes
        src = torch.empty(half, dtype=torch.uint8, device=DEVICE)
        dst = torch.empty_like(src)
        row["copy_us"] = baselines.time_us(lambda: dst.copy_(src))
        log(f"{label} copy of the same bytes {row['copy_us']:,.1f} us")
        del src, dst
    if CUDA:
        torch.cuda.empty_cache()
    phase("done")


def worker(type_name, rows_path, kernels_dir, compile_mode, backend="triton"):
    ktype = KERNEL_TYPES[type_name]
    rows = json.loads(Path(rows_path).read_text())

    def save():
        tmp = Path(f"{rows_path}.tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        os.replace(tmp, rows_path)

    module, why_not = load_starter(ktype, Path(kernels_dir) / f"{type_name}.py")
    triton_module = None
    if backend == "cuda":
        triton_module, triton_why = load_starter(ktype, autokernel.KERNELS_DIR / f"{type_name}.py")
        if triton_module is None:
            log(f"[{type_name}] no Triton starter to compare with: {triton_why}")
    for row in rows:
        if row["phase"] == "queued":
            measure_row(ktype, module, why_not, row, compile_mode, save, triton_module)
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: one child per type, restarted after a crash for the rows still queued
# ---------------------------------------------------------------------------------------------

def run_child(cmd, timeout_s, stderr_path):
    """Run cmd in its own process group; returns (None, None) when it exits 0, else
    ("CRASH" or "TIMEOUT", why). On timeout the whole group goes (inductor's compile workers
    included)."""
    with open(stderr_path, "w") as err:
        child = subprocess.Popen(cmd, stderr=err, start_new_session=True)
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return "TIMEOUT", f"TIMEOUT: no result after {timeout_s:.0f} s"
    if child.returncode == 0:
        return None, None
    tail = [line for line in Path(stderr_path).read_text(errors="replace").splitlines()
            if line.strip()]
    if child.returncode < 0:
        why = f"killed by {signal.Signals(-child.returncode).name}"
    else:
        why = f"exit code {child.returncode}"
    return "CRASH", f"CRASH: child {why}" + (f": {tail[-1].strip()[:200]}" if tail else "")


def bury(row, status, why):
    """A row whose child died mid-way: keep what was measured, say where it died."""
    died_in = row["phase"]
    row["phase"] = "done"
    if died_in in (*BASELINES, "copy", "triton") and row["status"] is not None:  # judged
        row[f"{died_in}_error"] = why
    else:
        row.update(status=status, reason=f"{why} (during {died_in})", starter_us=None)


def bench_type(ktype, kernels_dir, compile_mode, timeout_s, workdir, backend="triton"):
    kernel_file = Path(kernels_dir) / f"{ktype.name}.py"
    rows = [new_row(ktype, shape, dtype, kernel_file) for shape, dtype in bench_cases(ktype)]
    rows_path = Path(workdir) / f"{ktype.name}.json"

    def queued():
        return sum(row["phase"] == "queued" for row in rows)

    while queued():
        before = queued()
        rows_path.write_text(json.dumps(rows, indent=1))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", ktype.name,
               "--rows", str(rows_path), "--kernels-dir", str(kernels_dir),
               "--compile-mode", compile_mode or "none", "--backend", backend]
        status, why = run_child(cmd, timeout_s * before, Path(workdir) / f"{ktype.name}.stderr")
        try:
            rows = json.loads(rows_path.read_text())
        except (OSError, ValueError):
            pass  # the child died before writing: rows stay as they were
        for row in rows:
            if row["phase"] not in ("queued", "done"):  # the row it died in
                bury(row, status or "CRASH", why or "CRASH: child stopped mid-row")
        if queued() == before:  # died before starting a row (an import error?): no progress
            for row in rows:
                if row["phase"] == "queued":
                    bury(row, status or "CRASH", why or "CRASH: child skipped the row")
        if why:
            log(f"[{ktype.name}] {why}")
    return rows


# ---------------------------------------------------------------------------------------------
# Judging and the table
# ---------------------------------------------------------------------------------------------

def _ratio(baseline_us, starter_us):
    return baseline_us / starter_us if baseline_us and starter_us else None


def judge(ktype, row, ceilings, backend="triton"):
    """Derived numbers and the goal for one finished row (added to the row)."""
    shape, dtype = tuple(row["shape"]), row["dtype"]
    row.update({f"x_{what}": _ratio(row[f"{what}_us"], row["starter_us"])
                for what in (*BASELINES, "triton")})
    same_copy = _ratio(row["copy_us"], row["starter_us"])  # copy time / starter time
    row.update(gb_s=None, tflops=None, pct_ceiling=None, goal_met=None,
               pct_same_copy=None if same_copy is None else 100 * same_copy)
    if row["starter_us"] is None:
        row["goal"] = f"NOT met ({row['status'] or 'no result'})"
        row["goal_met"] = False
        return row
    tflops = ceilings.get("tflops") or {}
    roof = autokernel.roofline(ktype, shape, autokernel.DTYPES[dtype], row["starter_us"],
                               {"bandwidth_gb_s": ceilings.get("bandwidth_gb_s"),
                                "tflops": tflops.get(dtype)})
    row.update(gb_s=roof["bandwidth_gb_s"], tflops=roof["throughput_tflops"],
               pct_ceiling=None if math.isnan(roof["pct_peak"]) else roof["pct_peak"],
               above_ceiling=roof["above_ceiling"])
    if not autokernel.TIMING_MEANINGFUL:
        row["goal"] = "n/a (CPU timings)"
        return row
    if backend == "cuda":
        return cuda_goal(ktype, row, ceilings)
    if ktype.name in GOALS:
        baseline, target = GOALS[ktype.name]
        ratio = row[f"x_{baseline}"]
        if ratio is None:
            row["goal"] = f"unknown (no {baseline} time)"
            return row
        row["goal_met"] = ratio >= target
        row["goal"] = (f"{'met' if row['goal_met'] else 'NOT met'}: {ratio:.2f}x {baseline} "
                       f"(>= {target})")
        return row
    bandwidth = ceilings.get("bandwidth_gb_s")
    pct_bw = 100 * row["gb_s"] / bandwidth if bandwidth else None
    if pct_bw is None or row["x_compile"] is None:
        row["goal"] = f"unknown (no {'copy bandwidth' if pct_bw is None else 'compile time'})"
        return row
    row["goal_met"] = pct_bw >= MEMORY_GOAL_PCT and row["x_compile"] > 1.0
    row["goal"] = (f"{'met' if row['goal_met'] else 'NOT met'}: {pct_bw:.0f}% of copy "
                   f"(>= {MEMORY_GOAL_PCT:.0f}), {row['x_compile']:.2f}x compile (> 1)")
    return row


def cuda_goal(ktype, row, ceilings):
    """The CUDA starters' bar: at least eager's speed; memory-bound ones also at >= 90% of the
    measured copy bandwidth."""
    bandwidth = ceilings.get("bandwidth_gb_s")
    if row["x_eager"] is None or (ktype.bound == "memory" and not bandwidth):
        row["goal"] = f"unknown (no {'eager time' if row['x_eager'] is None else 'copy bandwidth'})"
        return row
    parts = [f"{row['x_eager']:.2f}x eager (>= {CUDA_EAGER_GOAL:g})"]
    met = row["x_eager"] >= CUDA_EAGER_GOAL
    if ktype.bound == "memory":
        pct_bw = 100 * row["gb_s"] / bandwidth
        parts.append(f"{pct_bw:.0f}% of copy (>= {MEMORY_GOAL_PCT:.0f})")
        met = met and pct_bw >= MEMORY_GOAL_PCT
    row["goal_met"] = met
    row["goal"] = f"{'met' if met else 'NOT met'}: {', '.join(parts)}"
    return row


def _cell(value, fmt="{:,.1f}", missing="-"):
    return missing if value is None else fmt.format(value)


def markdown(rows, meta):
    ceilings = meta["ceilings"]
    cuda = meta.get("backend") == "cuda"  # one more column: the Triton starter of each type
    title = ("CUDA C++ starter kernels vs the Triton starters and PyTorch" if cuda
             else "Starter kernels vs PyTorch")
    lines = [f"# {title} on {meta['gpu']}", ""]
    if not meta["timing_meaningful"]:
        lines += ["**CPU mode (Triton interpreter): timings are NOT meaningful; this run tests the "
                  "plumbing only.**", ""]
    tflops = ceilings.get("tflops") or {}
    timer = ("do_bench medians in us (L2 flushed)" if meta["timing_meaningful"]
             else "CPU wall-clock medians in us")
    lines += [f"torch {meta['torch']}, triton {meta['triton']}; times are {timer}; "
              f"torch.compile mode={meta['compile_mode'] or 'not run'} (static shapes).",
              "Measured ceilings (prepare.py): copy "
              f"{_cell(ceilings.get('bandwidth_gb_s'), '{:,.0f}')} GB/s; matmul TFLOP/s "
              + (", ".join(f"{k} {v:,.1f}" for k, v in tflops.items()) or "-")
              + f". Datasheet ({ceilings['spec']['name']}): "
              f"{_cell(ceilings['spec']['fp16_tflops'])} TFLOP/s fp16, "
              f"{_cell(ceilings['spec']['bandwidth_gb_s'], '{:,.0f}')} GB/s.",
              "Ratios are baseline time / starter time (> 1: the starter is faster). The starter "
              + (f"goal: at least eager's speed, memory-bound also >= {MEMORY_GOAL_PCT:.0f}% of "
                 "copy bandwidth." if cuda else
                 f"goals: memory-bound >= {MEMORY_GOAL_PCT:.0f}% of copy bandwidth and faster than "
                 "compile; " + "; ".join(f"{k} >= {t}x {b}" for k, (b, t) in GOALS.items()) + "."),
              "",
              "Same-bytes copy: `dst.copy_(src)` moving the row's bytes, timed in the same run; "
              "the starter's speed as a % of that copy's (small kernels pay a start-up and tail "
              "that the 1 GiB ceiling copy does not).", "",
              "| kernel | shape | dtype | starter us | " + ("triton us | " if cuda else "")
              + "eager us | compile us | library us | achieved | % ceiling | % same-bytes copy | "
              + ("vs triton | " if cuda else "") + "vs eager | vs compile | vs library | goal |",
              "|---|---|---|--:|" + ("--:|" if cuda else "") + "--:|--:|--:|--:|--:|--:|"
              + ("--:|" if cuda else "") + "--:|--:|--:|---|"]
    notes = []
    for row in rows:
        starter = _cell(row["starter_us"], missing=row["status"] or "-")
        memory_bound = KERNEL_TYPES[row["kernel"]].bound == "memory"
        achieved = (_cell(row["gb_s"], "{:,.0f} GB/s") if memory_bound
                    else _cell(row["tflops"], "{:,.1f} TFLOP/s"))
        library = (f"{_cell(row['library_us'])} ({row['library']})" if row["library"] else "-")
        pct = _cell(row["pct_ceiling"], "{:.0f}%") + (" (beats it)" if row.get("above_ceiling")
                                                       else "")
        lines.append("| " + " | ".join([
            row["kernel"], row["shape_str"], row["dtype"], starter,
            *([_cell(row.get("triton_us"))] if cuda else []), _cell(row["eager_us"]),
            _cell(row["compile_us"]), library, achieved, pct,
            _cell(row["pct_same_copy"], "{:.0f}%") + _cell(row["copy_us"], " ({:,.1f} us)", ""),
            *(_cell(row.get(f"x_{what}"), "{:.2f}x") for what in
              ((("triton",) if cuda else ()) + ("eager", "compile", "library"))),
            row["goal"]]) + " |")
        label = f"{row['kernel']} {row['shape_str']} {row['dtype']}"
        if row["reason"]:
            notes.append(f"- {label}: {row['status']}: {row['reason']}")
        notes += [f"- {label}: {what}: {row[f'{what}_error']}" for what in (*BASELINES, "triton")
                  if row.get(f"{what}_error") and not row[f"{what}_error"].startswith("skipped")]
    if notes:
        lines += ["", "Notes:", *notes]
    lines += ["", f"Total time {meta['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default="", help="comma-separated kernel types (default all)")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help="markdown file to write (the JSON goes beside it, .json)")
    parser.add_argument("--compile-mode", default=COMPILE_MODE,
                        help=f"torch.compile mode (default {COMPILE_MODE}; 'none' skips it)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds allowed per row before its child is killed (default 300)")
    parser.add_argument("--backend", choices=("triton", "cuda"), default="triton",
                        help="which starters: triton (kernels/) or cuda (kernels/cuda/, CUDA C++, "
                             "with the Triton starter as a baseline; needs a GPU)")
    parser.add_argument("--kernels-dir", default=None,
                        help="where <type>.py starters live (default kernels/, or kernels/cuda/ "
                             "with --backend cuda)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: the child process
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.kernels_dir = args.kernels_dir or str(autokernel.starters_dir(args.backend))
    compile_mode = None if args.no_compile or args.compile_mode == "none" or not CUDA \
        else args.compile_mode
    if args.worker:
        return worker(args.worker, args.rows, args.kernels_dir, compile_mode, args.backend)
    if args.backend == "cuda" and not CUDA:
        parser.exit(2, "bench_starters.py: error: the CUDA C++ starters need an NVIDIA GPU and "
                       "this machine has none; run it on a GPU machine\n")
    try:
        types = baselines.parse_types(args.types)
    except ValueError as exc:
        parser.exit(2, f"bench_starters.py: error: {exc}\n")
    if not Path(args.kernels_dir).is_dir():
        parser.exit(2, f"bench_starters.py: error: {args.kernels_dir} is not a directory\n")

    start = time.perf_counter()
    try:
        ceilings = baselines.ensure_ceilings(log=log)
    except Exception as exc:  # noqa: BLE001  (the table is still worth having without them)
        log(f"bench_starters: measuring the ceilings failed ({describe(exc)}); "
            "the % ceiling column stays empty")
        ceilings = baselines.load_ceilings()
    device = baselines.device_identity()
    meta = {"gpu": device["name"] if CUDA else f"CPU ({device['cpu_model']})",
            "torch": device["torch"], "triton": device["triton"], "compile_mode": compile_mode,
            "timing_meaningful": autokernel.TIMING_MEANINGFUL, "ceilings": ceilings,
            "timestamp": baselines.now(), "backend": args.backend}
    log(f"bench_starters: {', '.join(types)} on {meta['gpu']}; torch.compile "
        f"mode={compile_mode or 'not run'}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_starters_") as workdir:
        for name in types:
            ktype = KERNEL_TYPES[name]
            type_start = time.perf_counter()
            rows += [judge(ktype, row, ceilings, args.backend) for row in
                     bench_type(ktype, args.kernels_dir, compile_mode, args.timeout, workdir,
                                args.backend)]
            log(f"[{name}] done in {time.perf_counter() - type_start:.0f} s")
    meta["seconds"] = time.perf_counter() - start
    table = markdown(rows, meta)
    print("\n" + table, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(table)
    out.with_suffix(".json").write_text(json.dumps(_jsonable({"meta": meta, "rows": rows}),
                                                   indent=2) + "\n")
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
    return 0 if all(row["status"] == "PASS" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(run_main("bench_starters.py", main))
