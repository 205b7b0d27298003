"""
verify.py --generate PROMPTxNEW: the kept kernels in a language model's generation, checked step by
step against the original and timed in tokens per second.

The workload (autokernel/decode.py): a random prompt of PROMPT tokens per sequence (batch from
--input-shape) prefilled once, then NEW decode steps over a static KV cache. The original
generates greedily; every variant is then fed the same tokens (teacher forcing) and each step's
logits are compared with the original's (the model's tolerance; the greedy token must match
wherever the original's top-1 margin exceeds it).

Variants, each checked, then timed over the NEW decode steps (the prefill untimed; median of
--repeat runs):
  eager                      the original, op by op
  eager, CUDA graph          the original, each step one CUDA graph replay (GPU)
  torch.compile              the original compiled (inductor) and each step a CUDA graph replay:
                             PyTorch's gpt-fast recipe ("reduce-overhead" with a static cache), the
                             graph captured here around the compiled step (transformers' own
                             compiled generation fails on the H100 with torch 2.11)
  torch.compile, grouped-query SDPA
                             a grouped-query transformers model only: the same, with SDPA given
                             the cache's own KV heads (enable_gqa) where transformers would copy
                             the cache to every query head (swap_hf.decode_gqa). The faster of
                             the two is torch.compile's decode, which the kernels are held to
  kernels                    the kernels plugged in, each step a CUDA graph replay (GPU)
  torch.compile + kernels    the kernels as custom ops inside the compiled step, a CUDA graph
On a CPU nothing is captured and torch.compile runs only with --compile-backend.
tokens/s = batch * NEW / seconds of the decode steps; roofline = the step's floor (the weights
and the live cache read once, at the measured copy bandwidth) as a share of the time taken.
"""
import contextlib
import time

import torch

import autokernel
from autokernel.baselines import roofline_ceilings
from autokernel.cli import describe
from autokernel.decode import (Step, decoder_for, greedy, step_bytes, teacher_forced,
                               time_decode)
from autokernel.endtoend import model_dtype, sync
from autokernel.patching import applying
from autokernel.swap import Swap
from autokernel.swap_hf import decode_gqa
from autokernel.verify_report import Steps
from autokernel.verify_run import device_name, kernel_entry
from autokernel.weight_cache import WeightCache


def probe(model, batch):
    """A two-token prompt and one decode step (the kernel types' call sites in generation)."""
    def run(m):
        decoder = decoder_for(m, batch, 3)
        prompt = torch.zeros(batch, 2, dtype=torch.long, device=_device(m))
        greedy(decoder, prompt, 1)
    return run


def _device(model):
    return next(model.parameters()).device


GQA_COMPILE = "torch.compile, grouped-query SDPA"  # the baseline's second run (docstring)


def verify_generation(model, kernels, prompt_len, new, batch, *, timing=True, repeat=None,
                      compile_backend=None, description="model", seed=0, steps=None):
    """Everything but the printing: the report dict (verify_decode's schema, print_generation)."""
    steps = steps or Steps([])
    model.eval()
    device, dtype = _device(model), model_dtype(model)
    gen = torch.Generator(device=device).manual_seed(seed)
    vocab = _vocab(model)
    prompt = torch.randint(0, vocab, (batch, prompt_len), device=device, generator=gen)
    decoder = decoder_for(model, batch, prompt_len + new)
    repeat = (3 if autokernel.CUDA else 1) if repeat is None else repeat
    backend = None if compile_backend == "none" else \
        compile_backend or ("inductor" if autokernel.CUDA else None)  # verify.py --no-compile
    graphs = autokernel.CUDA

    steps.start("generate with the original", f"{batch} x ({prompt_len} prompt + {new} new) "
                "tokens, greedy: the tokens every variant is fed and its logits")
    with torch.no_grad(), steps.heartbeat("generating", lambda: f"{done[0]}/{new} steps"):
        done = [0]
        ref = greedy(decoder, prompt, new, lambda i, n: done.__setitem__(0, i))
        sync()
    floor = step_bytes(decoder, prompt_len, new)
    ceilings = roofline_ceilings(dtype) if autokernel.CUDA else None
    bandwidth = ceilings["bandwidth_gb_s"] if ceilings else None
    report = {"model": description, "device": device_name(), "dtype": autokernel.DTYPE_NAMES.get(
        dtype, str(dtype)), "timing_meaningful": autokernel.TIMING_MEANINGFUL,
        "workload": {"batch": batch, "prompt": prompt_len, "new": new, "seed": seed},
        "step_bytes": floor, "bandwidth_gb_s": bandwidth,
        "bandwidth_source": ceilings["source"] if ceilings else None,
        "roofline_tokens_per_s": batch * bandwidth * 1e9 / floor if bandwidth else None,
        "variants": {}, "kernels": [], "failures": []}

    gqa = decode_gqa(lambda: True) if any(getattr(m, "num_key_value_groups", 1) > 1
                                          for m in model.modules()) else []
    plan = [("eager", None, False, False, []), ("eager, CUDA graph", None, False, True, []),
            ("torch.compile", None, True, True, [])] \
        + [(GQA_COMPILE, None, True, True, gqa)] * bool(gqa) \
        + [("kernels", kernels, False, True, []),
           ("torch.compile + kernels", kernels, True, True, [])]
    plan = [p for p in plan if (graphs or p[0] != "eager, CUDA graph")
            and (backend or not p[2]) and (kernels or p[1] is None)]
    weights = WeightCache()  # the kernels' weight copies, made once for every variant
    for i, (name, ks, compiled, graph, patches) in enumerate(plan, 1):
        steps.start(f"variant {i}/{len(plan)}: {name}")
        began = time.monotonic()
        swap = Swap(ks, weights, compiled=compiled) if ks else None
        with applying(patches):
            entry = run_variant(decoder, prompt, ref, swap, compiled, graph and graphs, backend,
                                timing, repeat, batch, new, report["roofline_tokens_per_s"])
        report["variants"][name] = entry
        if name == "kernels":
            report["kernels"] = [kernel_entry(k, swap, entry["error"]) for k in ks]
        print(f"  {name}: " + _line(entry) + f" ({time.monotonic() - began:.0f} s)", flush=True)
        torch._dynamo.reset()
        if autokernel.CUDA:
            torch.cuda.empty_cache()

    v = report["variants"]
    report["baseline_notes"] = [f"{name}: {e['correctness']['error']}" for name, e in v.items()
                                if "kernels" not in name and not e["correctness"]["passed"]]
    report["failures"] += [f"{name}: {e['correctness']['error']}" for name, e in v.items()
                           if "kernels" in name and not e["correctness"]["passed"]]
    for e in report["kernels"]:
        if e["status"] != "ok":
            report["failures"].append(f"{e['name']}: {e['status']}"
                                      + (f" ({e['error']})" if e["error"] else ""))
    best = max((n for n in ("kernels", "torch.compile + kernels") if n in v
                and v[n]["correctness"]["passed"] and v[n]["tokens_per_s"]),
               key=lambda n: v[n]["tokens_per_s"], default=None)
    report["best_variant"] = best
    baseline = max((n for n in ("torch.compile", GQA_COMPILE) if n in v
                    and v[n]["correctness"]["passed"] and v[n]["tokens_per_s"]),
                   key=lambda n: v[n]["tokens_per_s"], default=None)
    report["compile_variant"] = baseline  # torch.compile's decode: the faster way it ran
    compiled = v[baseline]["tokens_per_s"] if baseline else None
    report["best_speedup_vs_compile"] = v[best]["tokens_per_s"] / compiled \
        if best and compiled else None
    report["passed"] = not report["failures"]
    return report


def run_variant(decoder, prompt, ref, swap, compiled, graph, backend, timing, repeat, batch,
                new, roofline):
    """One variant: built, its logits checked on every step, then timed."""
    entry = {"correctness": {"passed": False, "error": None}, "seconds": None,
             "tokens_per_s": None, "roofline_pct": None, "error": None,
             "how": ("torch.compile(backend=%r)" % backend if compiled else "eager")
             + (", a CUDA graph a step" if graph else "")}
    fn = torch.compile(decoder, backend=backend) if compiled else None
    context = swap.installed(decoder.model) if swap else contextlib.nullcontext()
    per_step = {}  # a replayed step runs the kernel calls its capture recorded
    try:
        with torch.no_grad(), context:
            step = Step(decoder, batch, fn)
            if graph:
                step.capture(prompt, before=swap.reset if swap else None)
                per_step = dict(swap.calls) if swap else {}
            if swap:
                swap.reset()
            entry["correctness"] = teacher_forced(step, prompt, ref)
            if swap:
                swap.calls.update({k: n * (ref.logits.shape[0] - 1) for k, n in per_step.items()})
                entry["calls"] = dict(swap.calls)
            if timing and entry["correctness"]["passed"]:
                entry["seconds"] = time_decode(step, prompt, ref, repeat)
                entry["tokens_per_s"] = batch * new / entry["seconds"]
                if roofline:
                    entry["roofline_pct"] = 100 * entry["tokens_per_s"] / roofline
    except Exception as e:  # noqa: BLE001  (reported; the other variants still run)
        entry["error"] = describe(e)
        entry["correctness"]["error"] = entry["correctness"].get("error") or entry["error"]
    return entry


def _vocab(model):
    config = getattr(getattr(model, "model", None), "config", None) \
        or getattr(model, "config", None)
    return getattr(config, "vocab_size", None) or 2


def _line(entry):
    c = entry["correctness"]
    if not c["passed"]:
        return f"FAIL: {c['error'] or entry['error']}"
    text = f"logits ok over {c['steps']} steps (worst {c['worst_rel_err']:.1e})"
    if entry["tokens_per_s"]:
        text += f", {entry['tokens_per_s']:,.0f} tokens/s"
    if entry["roofline_pct"]:
        text += f", {entry['roofline_pct']:.0f}% of the roofline"
    return text


def print_generation(report):
    """The table: one line per variant, then the verdict."""
    w = report["workload"]
    print(f"\n{report['model']} on {report['device']} ({report['dtype']}), generation: batch "
          f"{w['batch']}, {w['prompt']}-token prompt, {w['new']} new tokens")
    if report["roofline_tokens_per_s"]:
        print(f"roofline: {report['step_bytes'] / 1e9:.3f} GB a step at "
              f"{report['bandwidth_gb_s']:,.0f} GB/s ({report['bandwidth_source']}) -> "
              f"{report['roofline_tokens_per_s']:,.0f} tokens/s")
    if not report["timing_meaningful"]:
        print("(CPU: Triton's interpreter; the timings mean nothing)")
    print(f"{'variant':34} {'logits':>8} {'worst err':>10} {'tokens/s':>10} {'roofline':>9}")
    for name, e in report["variants"].items():
        c = e["correctness"]
        print(f"{name:34} {'ok' if c['passed'] else 'FAIL':>8} "
              f"{c.get('worst_rel_err') or 0:>10.1e} "
              + (f"{e['tokens_per_s']:>10,.0f}" if e["tokens_per_s"] else f"{'-':>10}")
              + (f" {e['roofline_pct']:>8.0f}%" if e["roofline_pct"] else f" {'-':>9}"))
    for k in report["kernels"]:
        print(f"  {k['name']} ({k['kernel_type']}): {k['status']}, {k['calls']} calls"
              + (f", fallbacks: {k['fallbacks']}" if k["fallbacks"] else ""))
    if report["best_speedup_vs_compile"]:
        print(f"best with kernels: {report['best_variant']}, "
              f"{report['best_speedup_vs_compile']:.3f}x torch.compile "
              f"(its faster variant: {report['compile_variant']})")
    for f in report["failures"]:
        print(f"FAIL: {f}")
    print("PASS" if report["passed"] else "FAIL")
