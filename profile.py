"""
Profile a PyTorch model, attribute its GPU time to ops, classify each op as one of the kernel
types or a named group (elementwise, copy/cast, embedding, ...), and rank them.

    uv run profile.py                                    # the default: models/llama.py, compact
    uv run profile.py --model models/gpt2.py --input-shape 8x1024 --dtype bf16
    uv run profile.py --model models/llama.py --config 7b --input-shape 1x2048
    uv run profile.py --model my_model.py --class-name MyNet      # your own file
    uv run profile.py --model kernelbench_level1_23.py            # KernelBench format
    uv run profile.py --module transformers --hf-config tiny-llama   # or a local config.json/dir
    uv run profile.py --pretrained ~/models/Llama-3.2-1B --dtype bf16  # real weights, offline
    uv run profile.py --export-trace trace.json.gz   # also a trace for ui.perfetto.dev
    uv run profile.py --module transformers --hf-config tiny-llama --generate 64x32
                                                     # generation: the decode step's ops

How the time is attributed: every GPU kernel (on a CPU: every op's self time) belongs to the
innermost `autokernel::` scope it ran in -- the profiled forwards run the model's captured
graphs with every computation that IS a kernel type (an RMSNorm, a gated MLP, rotary, attention
written out, ... whoever wrote it) in such a scope (autokernel/graph_capture.py) -- or else to the
outermost aten op that launched it (aten::linear, not the aten::addmm inside it). Which kernel
type an op is: autokernel/recognize.py; the model flags: models/load.py. Wall time is
measured in a separate run without the profiler, so "GPU busy" = GPU kernel time / wall time is
not skewed by profiling overhead.

Writes workspace/profile.json (schema below) and prints a ranked table. On a CPU the times are
CPU op times (labelled so) and there is no roofline.

profile.json schema (times are per iteration, in microseconds):
  model            str    what was profiled ("models/llama.py LLaMA config=compact (162.4M params)")
  generate         str    "PROMPTxNEW" when the iterations were decode steps (--generate),
                          else null
  model_args       dict   the loader flags as given (model, class_name, config, module,
                          hf_config, pretrained, input_shape, dtype, device; null = default), so
                          verify.py can rebuild the same model
  input_shapes     list   shapes of the forward's tensor arguments, e.g. [[8, 1024]]
  dtype            str    fp16 | bf16 | fp32
  device           str    "cuda" or "cpu";  device_name: the GPU's name or "cpu"
  time_source      str    "gpu kernel time" or "cpu op time"
  warmup, iters    int
  wall_us          float  wall time of one forward (no profiler)
  total_op_us      float  summed kernel (op) time of one forward
  gpu_busy_pct     float  100 * total_op_us / wall_us (null on a CPU)
  peak_memory_mib  float  most GPU memory torch held allocated during the timed forwards
                          (torch.cuda.max_memory_allocated; null on a CPU)
  resident_memory_mib  float  allocated before them: weights, inputs, caches (null on a CPU)
  trace            str    the --export-trace file (Chrome trace JSON of the profiled forwards),
                          or null
  launch_bound     bool   gpu_busy_pct < 60 (null on a CPU)
  named_pct        float  share of op time in named groups (the kernel types or a named group)
  ceilings         {"tflops", "bandwidth_gb_s", "source"} for the roofline (null on a CPU)
  groups           [{"group", "time_us", "share"}] most time first
  entries          ranked list, most time first:
    name           op or scope: "aten::linear", "RMSNorm", "aten::scaled_dot_product_attention"
    group          one of the kernel types, a named group, or "other"
    kernel_type    one of autokernel.KERNEL_TYPE_NAMES, or null
    time_us, share (of total_op_us, 0..1), calls (per iteration)
    shapes         [[...], ...] in the kernel type's convention (matmul (M,N,K), attention
                   (B,H,S,D), ...), most time first; [] when the type's shape can't be derived
    shape_detail   [{"shape", "variant", "time_us", "calls"}] the same, with each shape's time
                   and the variant of the type's contract it runs ({} = the default; e.g.
                   {"causal": false, "kv_groups": 4} for attention, {"bias": true} for matmul)
    bound          "compute" | "memory" (roofline; for untyped groups: the group's nature) | "n/a"
    pct_of_roofline  100 * roofline floor / measured time (typed ops on a GPU), else null
    amdahl_ceiling 1 / (1 - share): the end-to-end speedup if this op took no time at all
    note           why shapes are missing, or "" (never a silent default)
    pluggable      typed entries: whether verify.py's swap reaches this type in this model (a
                   computation the model writes out as torch ops is plugged into the module's
                   captured graph, autokernel/swap_graph.py, where that works: extract.py skips
                   it where not); null if that check failed
    pluggable_note why not, when pluggable is false and the swap said (its fallbacks)
    region         region entries (group "region", name "<module class>:<id>": a piece of the
                   model's own code outside the kernel types, autokernel/regions.py; calls =
                   its instances per forward, shapes = its first input's):
                   {"id", "label", "ops" (its calls by name), "inputs" [{"shape", "dtype",
                   "parameter": the region's name for a model parameter, else null}],
                   "outputs" [{"shape", "dtype"}], "flops" (its GEMMs and convolutions),
                   "bytes" (inputs read and outputs written once), "instances" (module paths,
                   "" for the model's own forward), "plug" (where verify.py swaps it in, relative
                   to each instance: "" the module's forward, "dwconv" a child's; null where
                   no module's forward is only the region: into the graph of the forward it is
                   part of), "reference" (a standalone problem
                   file in KernelBench's format: the region's frozen code, the oracle; null when
                   it cannot be written), "note" (why not)}
  region_pct       float  share of op time in regions (0..100)
"""
import argparse
import os
import sys
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)
from autokernel import KERNEL_TYPES

import torch
from torch.profiler import ProfilerActivity

from autokernel.baselines import roofline_ceilings
from autokernel.cli import ArgumentParser, UsageError, describe, run_main
from autokernel.decode import Step, decoder_for, parse_generate
from autokernel.graph_capture import recognized_forward
from autokernel.recognize import (GROUP_BOUND, OTHER, REGION, SCOPE_PREFIX, classify_event,
                                  module_scopes)
from autokernel.swap import pluggable_types
from autokernel.workspace import write_json
from models.load import (ModelError, add_model_args, device_and_dtype,
                         load_model_in_a_dtype_it_runs, model_args)

LAUNCH_BOUND_PCT = 60.0    # below: launch-bound, fix that before kernels
PARTLY_IDLE_PCT = 85.0     # below: worth saying how much of the wall time kernels can't touch


def main(argv=None):
    return run_main("profile.py", _profile, argv)


def _profile(argv):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed forwards first (default: 3 on a GPU, 1 on a CPU)")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed and profiled forwards (default: 10 on a GPU, 2 on a CPU)")
    parser.add_argument("--generate", metavar="PROMPTxNEW",
                        help="profile generation's decode steps instead of a forward: a "
                             "PROMPT-token prompt (batch from --input-shape) prefilled, then "
                             "each iteration one step over a static KV cache of PROMPT+NEW, e.g. "
                             "512x256")
    parser.add_argument("--top", type=int, default=20, help="rows of the printed table")
    parser.add_argument("--output", default=str(autokernel.PROFILE_JSON),
                        help="where to write the JSON (default: workspace/profile.json)")
    parser.add_argument("--export-trace", metavar="FILE",
                        help="also write the profiled forwards as a Chrome trace (JSON; a .gz "
                        "name compresses it) to open in ui.perfetto.dev or chrome://tracing")
    args = parser.parse_args(argv)
    if (args.warmup is not None and args.warmup < 0) or (args.iters is not None
                                                         and args.iters < 1):
        raise UsageError("--warmup must be >= 0 and --iters >= 1")
    if args.export_trace:
        try:  # before the model loads: a bad path fails in a second, not after the profile
            os.makedirs(os.path.dirname(os.path.abspath(args.export_trace)), exist_ok=True)
        except OSError as e:
            raise UsageError(f"--export-trace {args.export_trace}: {describe(e)}") from None
    generate = parse_generate(args.generate) if args.generate else None
    model, inputs, description = load_model_in_a_dtype_it_runs(
        args, _run_forward, log=lambda line: print(f"profile: {line}", file=sys.stderr))
    workload = DecodeSteps(model, inputs[0].shape[0], *generate) if generate else None
    default_device, dtype = device_and_dtype(args)
    device = next((t.device for t in inputs if torch.is_tensor(t)), default_device)
    on_gpu = device.type == "cuda"
    warmup = args.warmup if args.warmup is not None else (3 if on_gpu else 1)
    iters = args.iters if args.iters is not None else (10 if on_gpu else 2)
    print(f"profiling {description} ...", flush=True)
    result = {"model": description, "model_args": model_args(args), "trace": args.export_trace,
              "generate": args.generate and "x".join(map(str, generate))}
    try:
        result.update(profile_model(model, inputs, device, dtype, warmup, iters,
                                    trace=args.export_trace, description=description,
                                    workload=workload))
    except torch.cuda.OutOfMemoryError:
        raise ModelError("CUDA out of memory: use a smaller --input-shape or --config") from None
    write_json(args.output, result)
    print_report(result, args.top)
    print(f"\nwrote {args.output}")
    if args.export_trace:
        print(f"wrote {args.export_trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    out = Path(args.output)
    moved = "" if out.resolve() == autokernel.PROFILE_JSON.resolve() else f" --profile {out}"
    if moved and out.parent.resolve() not in (Path.cwd(), autokernel.ROOT):
        moved += f" --workspace {out.parent}"  # the kernel files beside their profile
    print(f"next: uv run extract.py --top 5{moved}   (the top bottlenecks as kernel files + "
          f"plan.json)")
    return 0


# ---------------------------------------------------------------------------------------------
# Profiling and attribution
# ---------------------------------------------------------------------------------------------

@contextmanager
def _quiet_kineto(quiet):
    """Kineto prints start/stop lines and, without a GPU, a "gpuGetDeviceCount failed" error
    straight to fd 2; on a CPU run they are noise, so fd 2 is muted while it starts and stops."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_forward(model, inputs):
    try:
        return model(*inputs)
    except Exception as e:
        raise ModelError(f"the model's forward raised {describe(e)}") from None


def _anchor(evt):
    """The event a kernel's time belongs to: the innermost autokernel scope around it, else
    the outermost op (a name with '::' that is not a user annotation) it ran in."""
    outermost = None
    e = evt
    while e is not None:
        if e.name.startswith(SCOPE_PREFIX):
            return e
        if "::" in e.name and not e.is_user_annotation:
            outermost = e
        e = e.cpu_parent
    return outermost


def attribute(events, on_gpu):
    """Sum kernel time (GPU) or self CPU time (CPU) per anchor event.
    Returns ([(anchor, time_us)], Counter(kernel name -> unattributed us), total_us)."""
    per_anchor, unattributed, total = {}, Counter(), 0.0
    cpu = torch.autograd.DeviceType.CPU
    for evt in events:
        if evt.device_type != cpu or getattr(evt, "is_async", False):
            continue
        t = sum(k.duration for k in evt.kernels) if on_gpu else evt.self_cpu_time_total
        if t <= 0:
            continue
        anchor = _anchor(evt)
        if anchor is None:
            if on_gpu:  # GPU time launched outside any op; CPU self time of Python glue is not
                unattributed[evt.name] += t  # op time at all, so it is left out on a CPU
                total += t
            continue
        total += t
        slot = per_anchor.setdefault(id(anchor), [anchor, 0.0])
        slot[1] += t
    if on_gpu:
        # Device work the profiler could not link to a CPU op (a library's own launches):
        # every device event not matched by a linked kernel (GPU-side copies of our annotation
        # scopes are not work and are left out).
        linked = Counter((k.name, round(k.duration, 3)) for evt in events
                         if evt.device_type == cpu for k in evt.kernels)
        for e in events:
            if (e.device_type == cpu or getattr(e, "is_user_annotation", False)
                    or e.name.startswith(SCOPE_PREFIX)):
                continue
            key = (e.name, round(e.time_range.elapsed_us(), 3))
            if linked[key] > 0:
                linked[key] -= 1
            elif key[1] > 0:
                unattributed[e.name] += key[1]
                total += key[1]
    return list(per_anchor.values()), unattributed, total


def _roofline(ktype_name, shape_detail, dtype, time_us, ceilings):
    """(bound, pct_of_roofline) from the summed FLOPs and bytes of an op's calls."""
    if ceilings is None:
        return "n/a", None
    ktype = KERNEL_TYPES[ktype_name]
    flops = sum(ktype.flops(d["shape"], **d["variant"]) * d["calls"] for d in shape_detail)
    nbytes = sum(ktype.bytes(d["shape"], dtype) * d["calls"] for d in shape_detail)
    floor_us = sum(autokernel.roofline(ktype, d["shape"], dtype, d["time_us"] / d["calls"],
                                       ceilings, d["variant"])["floor_us"] * d["calls"]
                   for d in shape_detail)
    return _bound(flops, nbytes, ceilings), (100.0 * floor_us / time_us if time_us > 0 else None)


def _bound(flops, nbytes, ceilings):
    """"compute" when the FLOPs per byte reach the ceilings' ridge point, else "memory"."""
    ridge = ceilings["tflops"] * 1e12 / (ceilings["bandwidth_gb_s"] * 1e9)  # FLOP per byte
    return "compute" if nbytes and flops / nbytes >= ridge else "memory"


def add_region(entry, record, ceilings):
    """A region's entry: its record (what it computes, its reference) and, on a GPU, its bound
    and roofline from its GEMM/convolution FLOPs and the bytes it must move once."""
    entry["region"] = record
    entry["shapes"] = [i["shape"] for i in record["inputs"][:1] if i]
    if ceilings is None:
        return
    entry["bound"] = _bound(record["flops"], record["bytes"], ceilings)
    floor_us = max(record["flops"] / (ceilings["tflops"] * 1e6),
                   record["bytes"] / (ceilings["bandwidth_gb_s"] * 1e3)) * entry["calls"]
    entry["pct_of_roofline"] = 100.0 * floor_us / entry["time_us"] if entry["time_us"] else None


def build_entries(anchors, iters, total_us, dtype, ceilings):
    """Aggregate anchors into ranked entries (one per name, group and kernel type)."""
    rows = defaultdict(lambda: {"time": 0.0, "calls": 0, "shapes": defaultdict(lambda: [0.0, 0]),
                                "notes": set()})
    for anchor, t in anchors:
        name, group, ktype, shape, note, variant = classify_event(anchor)
        row = rows[(name, group, ktype)]
        row["time"] += t
        row["calls"] += 1
        if shape is not None:
            key = (shape, tuple(sorted(variant.items())))
            row["shapes"][key][0] += t
            row["shapes"][key][1] += 1
        elif note:
            row["notes"].add(note)
    entries = []
    for (name, group, ktype), row in rows.items():
        time_us = row["time"] / iters
        share = row["time"] / total_us if total_us else 0.0
        detail = sorted(({"shape": list(s), "variant": dict(v), "time_us": t / iters,
                          "calls": c / iters} for (s, v), (t, c) in row["shapes"].items()),
                        key=lambda d: -d["time_us"])
        if ktype and detail:  # the roofline of the calls whose shape is known
            bound, pct = _roofline(ktype, detail, dtype, sum(d["time_us"] for d in detail),
                                   ceilings)
        else:
            bound = ("n/a" if ceilings is None else
                     KERNEL_TYPES[ktype].bound if ktype else GROUP_BOUND.get(group, "unknown"))
            pct = None
        entries.append({
            "name": name, "group": group, "kernel_type": ktype, "time_us": time_us,
            "share": share, "calls": row["calls"] / iters,
            "shapes": [d["shape"] for d in detail], "shape_detail": detail,
            "bound": bound, "pct_of_roofline": pct,
            "amdahl_ceiling": 1.0 / (1.0 - share) if share < 1.0 else None,
            "note": "; ".join(sorted(row["notes"])) + (" (calls without a shape are left out)"
                                                        if row["notes"] and detail else ""),
        })
    entries.sort(key=lambda e: -e["time_us"])
    return entries


class DecodeSteps:
    """--generate: an iteration is one decode step of the model's generation (a random prompt
    prefilled first, then steps at advancing positions over the static KV cache, refilled when
    full), run inside the module classes' scopes: capturing the graph of a step is not tried."""

    def __init__(self, model, batch, prompt_len, new):
        device = next(model.parameters()).device
        self.decoder = decoder_for(model, batch, prompt_len + new)
        self.step = Step(self.decoder, batch)
        vocab = self.decoder.model.config.vocab_size
        self.prompt = torch.randint(0, vocab, (batch, prompt_len), device=device)
        self.tokens = torch.randint(0, vocab, (new, batch), device=device)
        self.prompt_len, self.new, self.done = prompt_len, new, new

    def __call__(self, model=None, inputs=None):
        if self.done == self.new:
            self.step.prefill(self.prompt)
            self.done = 0
        self.step(self.tokens[self.done], self.prompt_len + self.done)
        self.done += 1

    @contextmanager
    def scoped(self, model, *args, **kwargs):
        with module_scopes(model):
            yield model


def profile_model(model, inputs, device, dtype, warmup, iters, trace=None, description=None,
                  workload=None):
    """Time the forward without the profiler (and, on a GPU, take its peak memory), then profile
    it; trace: a path to write the profiled forwards to as a Chrome trace; description: the
    model's, for the regions' reference files; workload: what an iteration runs instead of a
    forward (DecodeSteps). Returns the result dict (profile.json's fields other than
    model/model_args/trace)."""
    on_gpu = device.type == "cuda"
    began = time.perf_counter()
    run_forward = workload or _run_forward

    def step(what):  # a long profile shows where it is
        print(f"  {what} ({time.perf_counter() - began:.1f} s elapsed)", flush=True)

    with torch.inference_mode():
        for _ in range(warmup):
            run_forward(model, inputs)
        _sync(device)
        step(f"1/3 {warmup} warm-up forward{'' if warmup == 1 else 's'} done")
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
            resident = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        for _ in range(iters):
            run_forward(model, inputs)
        _sync(device)
        wall_us = (time.perf_counter() - start) * 1e6 / iters
        peak = torch.cuda.max_memory_allocated(device) if on_gpu else None
        step(f"2/3 {iters} timed forwards done; profiling {iters} more")

        unplugged = {}  # type -> why the swap did not plug it where the model runs it
        try:
            plugged = pluggable_types(model, lambda m: run_forward(m, inputs), reasons=unplugged)
        except Exception as e:  # noqa: BLE001  (unknown then: nothing is marked)
            print(f"  could not check which kernel types verify.py can plug in: {describe(e)}")
            plugged = None
        # q/k/v + rotary that no swap reaches in this model: its rotaries, which one may, instead
        skip = ("qkv_rotary",) if plugged is not None and "qkv_rotary" not in plugged else ()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        prof = torch.profiler.profile(activities=activities, record_shapes=True)
        regions = {}
        recognized = workload.scoped if workload else recognized_forward
        with recognized(model, inputs, skip=skip, regions=regions,
                        origin=description) as forward:
            with _quiet_kineto(not on_gpu):
                prof.start()
            try:
                for _ in range(iters):
                    run_forward(forward, inputs)
                _sync(device)
            finally:
                with _quiet_kineto(not on_gpu):
                    prof.stop()
    step("3/3 profiled; attributing op time")
    if trace:
        prof.export_chrome_trace(str(trace))
    anchors, unattributed, total = attribute(prof.events(), on_gpu)
    ceilings = roofline_ceilings(dtype) if on_gpu else None
    entries = build_entries(anchors, iters, total, dtype, ceilings)
    for e in entries:
        if e["kernel_type"]:
            e["pluggable"] = None if plugged is None else e["kernel_type"] in plugged
            if e["pluggable"] is False and unplugged.get(e["kernel_type"]):
                e["pluggable_note"] = "; ".join(unplugged[e["kernel_type"]])
        elif e["group"] == REGION:
            add_region(e, regions[e["name"].rsplit(":", 1)[1]], ceilings)
    lost = sum(unattributed.values())
    if lost > 0:
        names = ", ".join(f"{n[:40]} {_us(t / iters)}" for n, t in unattributed.most_common(3))
        entries.append({"name": "(kernels outside any op)", "group": OTHER, "kernel_type": None,
                        "time_us": lost / iters, "share": lost / total, "calls": 0,
                        "shapes": [], "shape_detail": [], "bound": "unknown",
                        "pct_of_roofline": None,
                        "amdahl_ceiling": 1 / (1 - lost / total) if lost < total else None,
                        "note": f"GPU time not linked to a CPU op; largest: {names}"})
        entries.sort(key=lambda e: -e["time_us"])
    total_op_us = total / iters
    groups = defaultdict(float)
    for e in entries:
        groups[e["group"]] += e["time_us"]
    busy = 100.0 * min(total_op_us / wall_us, 1.0) if on_gpu and wall_us > 0 else None
    return {
        "input_shapes": [list(t.shape) for t in inputs if torch.is_tensor(t)],
        "dtype": autokernel.DTYPE_NAMES[dtype],
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "time_source": "gpu kernel time" if on_gpu else "cpu op time",
        "warmup": warmup, "iters": iters,
        "wall_us": wall_us, "total_op_us": total_op_us,
        "gpu_busy_pct": busy, "launch_bound": (busy < LAUNCH_BOUND_PCT) if on_gpu else None,
        "peak_memory_mib": peak / 2 ** 20 if on_gpu else None,
        "resident_memory_mib": resident / 2 ** 20 if on_gpu else None,
        "named_pct": 100.0 * (1 - groups.get(OTHER, 0.0) / total_op_us) if total_op_us else 0.0,
        "region_pct": 100.0 * groups.get(REGION, 0.0) / total_op_us if total_op_us else 0.0,
        "ceilings": ceilings,
        "groups": [{"group": g, "time_us": t, "share": t / total_op_us if total_op_us else 0.0}
                   for g, t in sorted(groups.items(), key=lambda kv: -kv[1])],
        "entries": entries,
    }


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def _cell(name, width):
    """name cut to width, a region's id kept whole: the id is what its kernel file names."""
    if len(name) <= width or ":r" not in name:
        return name[:width]
    label, rid = name.rsplit(":", 1)
    return f"{label[:width - len(rid) - 2]}~:{rid}"


def _us(t):
    return f"{t / 1000:.2f} ms" if t >= 1000 else f"{t:.1f} us"


def print_report(result, top):
    r = result
    unit = "GPU" if r["device"] == "cuda" else "CPU op"
    shapes = ", ".join("x".join(map(str, s)) for s in r["input_shapes"])
    print(f"model:        {r['model']}")
    print(f"input:        {shapes}  {r['dtype']}  on {r['device_name']}")
    print(f"wall time:    {_us(r['wall_us'])} per forward ({r['iters']} iters after "
          f"{r['warmup']} warmup)")
    print(f"{unit + ' time:':<14}{_us(r['total_op_us'])} per forward"
          + (" (the ops' times summed: nested and threaded ops overlap, so it can exceed the"
             " wall time)" if r["device"] != "cuda" else ""))
    if r["gpu_busy_pct"] is None:
        print("gpu busy:     n/a (CPU run: the times below are CPU op times, they rank "
              "nothing a GPU would do)")
    else:
        print(f"gpu busy:     {r['gpu_busy_pct']:.1f}% of wall time")
    if r.get("peak_memory_mib") is None:
        print("peak memory:  n/a (CPU run: torch counts allocations only on a GPU)")
    else:
        print(f"peak memory:  {r['peak_memory_mib']:,.0f} MiB allocated "
              f"({r['resident_memory_mib']:,.0f} MiB before the forward: weights, inputs)")
    print(f"named groups: {r['named_pct']:.1f}% of {unit} time "
          f"(other: {100 - r['named_pct']:.1f}%)")
    regions = [e for e in r["entries"] if e["group"] == REGION]
    if regions:
        print(f"regions:      {r['region_pct']:.1f}% of {unit} time in {len(regions)} regions "
              f"(the model's own code outside the kernel types, one row per distinct piece)")
    if r["ceilings"]:
        c = r["ceilings"]
        print(f"roofline:     {c['tflops']:.0f} TFLOP/s, {c['bandwidth_gb_s']:.0f} GB/s, "
              f"{c['source']}")
    print()
    header = (f"{'#':>3}  {'op':<34} {'group':<16} {'type':<17} {'time':>10} {'share':>6} "
              f"{'calls':>6} {'bound':<8} {'roofline':>8} {'amdahl':>7}  top shape")
    print(header)
    print("-" * len(header))
    for i, e in enumerate(r["entries"][:top], 1):
        roof = f"{e['pct_of_roofline']:.0f}%" if e["pct_of_roofline"] is not None else "-"
        amdahl = f"{e['amdahl_ceiling']:.2f}x" if e["amdahl_ceiling"] else "inf"
        shape = "x".join(map(str, e["shapes"][0])) if e["shapes"] else (
            "(none: " + e["note"][:70] + ")" if e["note"] else "-")
        more = f" (+{len(e['shapes']) - 1})" if len(e["shapes"]) > 1 else ""
        if e.get("region"):  # what it computes, after its first input's shape
            ops = e["region"]["ops"]
            more = ": " + " ".join(ops[:6]) + (f" (+{len(ops) - 6} ops)" if len(ops) > 6 else "")
        print(f"{i:>3}  {_cell(e['name'], 34):<34} {e['group']:<16} {e['kernel_type'] or '-':<17} "
              f"{_us(e['time_us']):>10} {100 * e['share']:>5.1f}% {e['calls']:>6g} "
              f"{e['bound']:<8} {roof:>8} {amdahl:>7}  {shape}{more}")
    if len(r["entries"]) > top:
        rest = r["entries"][top:]
        print(f"     ... {len(rest)} more ops, {100 * sum(e['share'] for e in rest):.1f}% "
              f"of {unit} time (--top to show them)")
    shown = dict.fromkeys(e["kernel_type"] for e in r["entries"][:top] if e["kernel_type"])
    print("     amdahl: the model's speedup if the op took no time")
    if shown:
        print("     shapes: " + ", ".join(f"{t} {'x'.join(KERNEL_TYPES[t].shape_names)}"
                                         for t in shown))
    print()
    print("by group: " + ", ".join(f"{g['group']} {100 * g['share']:.1f}%" for g in r["groups"]))
    if r["launch_bound"]:
        print(f"launch-bound: the GPU is busy only {r['gpu_busy_pct']:.0f}% of the time; faster "
              "kernels can't fix the idle gaps. Use a larger batch or sequence, CUDA graphs, or "
              "torch.compile (mode='reduce-overhead') before optimizing kernels; the Amdahl "
              "ceilings above assume a busy GPU.")
    elif r["gpu_busy_pct"] is not None and r["gpu_busy_pct"] < PARTLY_IDLE_PCT:  # GPU only
        print(f"partly launch-bound: the GPU idles {100 - r['gpu_busy_pct']:.0f}% of the wall "
              "time; faster kernels shrink only the busy part (CUDA graphs or a larger batch "
              "shrink the rest).")


if __name__ == "__main__":
    sys.exit(main())
