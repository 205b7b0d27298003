"""
verify.py's report: the schema of workspace/verify.json, and its printing.

workspace/verify.json (verify.py --out to change):
  {"model": str, "device": str, "dtype": "bf16", "timing_meaningful": bool, "passed": bool,
   "failures": [str],
   "kernels": [{"name", "kernel_type", "file", "calls": int (one forward, all kernels in),
                "shapes": ["8x2048x768", ...], "fallbacks": {reason: count},
                "skipped": {reason: modules not swapped}, "notes": [str],
                "status": "ok" | "never ran" | "crashed" | "mismatch" | "unused"
                          | "stopped" (another kernel crashed first)
                          | "not plugged" (a region kernel whose instances all kept their
                            own forward: the region is part of it; reasons in fallbacks),
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
"""
import contextlib
import threading
import time

from autokernel.regate import HEARTBEAT_S


class Steps:
    """verify.py's progress: before each long step, one line with its number, the time since
    the run began, what it runs and the steps left after it (the steps that print their own
    progress, the re-gates and the timings, go on from there)."""

    def __init__(self, names):
        self.names, self.started = list(names), time.monotonic()

    def start(self, name, what=""):
        i = self.names.index(name) + 1 if name in self.names else None
        left = self.names[i:] if i else []
        print(f"[{time.monotonic() - self.started:.0f} s] "
              + (f"step {i}/{len(self.names)}: " if i else "") + name
              + (f": {what}" if what else "") + (f" (then: {', '.join(left)})" if left else ""),
              flush=True)

    @contextlib.contextmanager
    def heartbeat(self, what, progress=lambda: "", every_s=HEARTBEAT_S):
        """A line every `every_s` seconds while the block runs (a forward through Triton's
        interpreter takes minutes), so that no stretch of the run is silent. progress: a few
        words on how far it got, read from the running step (the kernel calls so far)."""
        done, began = threading.Event(), time.monotonic()

        def beat():
            while not done.wait(every_s):
                more = progress()
                print(f"[{time.monotonic() - self.started:.0f} s] ... still {what}: "
                      f"{time.monotonic() - began:.0f} s" + (f", {more}" if more else ""),
                      flush=True)
        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


def blank_entry(name, kernel_type, file):
    """A kernel's report entry before anything is known of its run (the schema's keys)."""
    return {"name": name, "kernel_type": kernel_type, "file": file, "calls": 0, "shapes": [],
            "fallbacks": {}, "skipped": {}, "notes": [], "status": "never ran", "error": None,
            "alone": None, "alone_ms": None, "gain_ms": None, "share": None,
            "compile_alone_ms": None, "compile_gain_ms": None, "compile_alone_note": None}



def why_not(entry):
    """Why a kernel never ran, from its fallbacks and skipped modules."""
    reasons = [f"{n}x {r}" for r, n in entry["fallbacks"].items()] + \
              [f"{n} module(s) {r}" for r, n in entry["skipped"].items()]
    return "; ".join(reasons) if reasons else "no matching op in the model"


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
    w = max([22] + [len(e["name"]) for e in r["kernels"]])  # a region's name can be long
    print(f"{'kernel':<{w}} {'type':<17} {'calls':>6}  {'status':<10} shapes / file")
    for e in r["kernels"]:
        shapes = ", ".join(e["shapes"][:4]) + (" ..." if len(e["shapes"]) > 4 else "")
        print(f"{e['name']:<{w}} {e['kernel_type']:<17} {e['calls']:>6}  {e['status']:<10} "
              f"{shapes or '-'}  [{e['file']}]")
        extra = [f"fallback {n}x: {why}" for why, n in e["fallbacks"].items()] + \
                [f"{n} module(s) {why}" for why, n in e["skipped"].items()] + e["notes"]
        for line in extra:
            print(f"{'':<{w + 2}}{line}")
    c = r["correctness"]
    if c.get("rel_err") is not None:
        print(f"correctness: {c['output']} {tuple(c['shape'])} max abs err {_g(c['max_abs_err'])}, "
              f"rel err {_g(c['rel_err'])} (tol {c['tolerance']:.0e}), top-1 {_g(c['top1'], '.1%')}"
              f", tie-aware {_g(c['top1_tie_aware'], '.1%')} (min {c['top1_min']:.0%}): "
              f"{'PASS' if c['passed'] else 'FAIL'}")
    else:
        print(f"correctness: FAIL ({c.get('error')})")
    if c.get("note"):
        print(f"warning: {c['note']}")
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

