"""
Turn the model's top ops (from workspace/profile.json) into standalone kernel files the agent can
optimize, and write the plan orchestrate.py follows.

    uv run profile.py                       # first: rank the model's ops
    uv run extract.py --top 5               # the 5 kernel types with the most time
    uv run extract.py --top 3 --types softmax,matmul
    uv run extract.py --top 5 --backend cuda  # the CUDA C++ starters (kernels/cuda/<type>.py)

For each kernel type among the profile's entries (entries of the same type are merged: all of the
model's linear layers are one matmul kernel, with all their shapes), extract.py copies the starter
kernels/<type>.py to workspace/<type>_<rank>.py and appends a block that sets

    KERNEL_NAME  = "<type>_<rank>"        the results.tsv tag
    BENCH_SHAPES = [(...), ...]            the model's real shapes in the type's convention, most
                                           time first: bench.py times the first, sweeps them all
    BENCH_DTYPE  = "fp16"                  the dtype the model ran in
    BENCH_VARIANT = {"kv_groups": 4}       the model's variant of the type's contract, when it is
                                           not the default (timed: bidirectional or grouped-query
                                           attention, a matmul with a bias, a sum over another dim)

CPU mode (no CUDA GPU): Triton's interpreter would take minutes to judge a model's real shapes,
so BENCH_SHAPES holds them scaled down (`cpu_shape`): no dimension beyond what the type's own CPU
primary and sweep shapes use, and each shrunk dimension keeps its remainder modulo 16, so odd
sizes stay odd, multiples of 16 stay multiples of 16 and a vocabulary of 50257 stays 1 mod 16.
A comment above BENCH_SHAPES says so and lists the real shapes; plan.json keeps both. CUDA C++
starters (--backend cuda) only run on a GPU, so they always get the real shapes.

Entries whose shapes could not be derived are skipped with the reason (never a default shape).
An existing workspace file with different content is kept unless --force: the agent may have
worked on it.

workspace/plan.json schema (orchestrate.py, verify.py and analysis.py read it):
  model        str   the profiled model's description (profile.json "model")
  created      str   ISO-8601 time this plan was written (a new plan starts a new night)
  profile      str   the profile.json it was built from
  device, dtype, input_shapes   as in profile.json
  total_op_us  float the model's summed op time per forward (the Amdahl denominator)
  cpu_scaled   bool  true when extracted in CPU mode for Triton: bench_shapes are scaled down
  backend      str   "triton" or "cuda": which starters the kernel files came from
  kernels      list  priority order (highest share first):
    rank           int    1, 2, ...
    name           str    KERNEL_NAME, e.g. "matmul_1"
    kernel_type    str    one of autokernel.KERNEL_TYPE_NAMES, or "region"
    file           str    workspace/<name>.py, relative to the repo root
    shapes         list   the model's real shapes as lists, most time first (verify.py runs the
                          model at these)
    bench_shapes   list   the file's BENCH_SHAPES as lists: `shapes` on a GPU, scaled in CPU mode
    dtype          str    BENCH_DTYPE
    variant        dict   BENCH_VARIANT ({} = the type's default): the top shape's variant
    share          float  fraction (0..1) of the model's op time spent in this type's ops
    time_us        float  that time per forward
    amdahl_ceiling float  1 / (1 - share): end-to-end speedup if the kernel took no time
    bound          str    "compute" | "memory" (roofline of the model's calls) | "n/a" (CPU)
    ops            list   the profile entries merged into it, e.g. ["aten::linear", "aten::matmul"]
                          (a region: its calls, e.g. ["conv2d", "batch_norm", "relu"])
    region         dict   a region's: id, label (its module's class), instances (module paths),
                          plug (where verify.py swaps it in, relative to each instance:
                          "" the module, "dwconv" a child; null: into the graph of the
                          forward it is part of),
                          problem (its reference, workspace/regions/<label>_<id>.py)

Regions (profile.py's rows of the model's own code outside the kernel types) rank beside the
types by share. A region's kernel file is a ModelNew for its reference (autokernel/
region_kind.py), started from autokernel/region_starter.py's code: the library convolutions and
GEMMs, one fused Triton kernel per run of elementwise ops. A region with calls that have no
generated code yet is skipped with the reason (its reference is still written), and the next
candidate takes its place: --top N writes N kernel files where the profile has N candidates.
"""
import argparse
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import autokernel
from autokernel import KERNEL_TYPES, region_starter, state
from autokernel.cli import ArgumentParser, UsageError, fail, run_main
from autokernel.contract import kernel_source, read_attrs, shape_list
from autokernel.results import rel
from autokernel.workspace import read_profile, write_json, write_kernel_file


class WorkExists(UsageError):
    """A workspace kernel file differs from what extract would write: the night's work."""


def parse_types(text):
    if not text:
        return None
    types = [t.strip() for t in text.split(",") if t.strip()]
    for t in types:
        if t not in KERNEL_TYPES:
            raise UsageError(f"unknown kernel type {t!r} in --types: use any of "
                             f"{', '.join(KERNEL_TYPES)}")
    return set(types)


def merge_by_type(entries, types=None):
    """One candidate per kernel type: times and shares summed, shapes merged (same shape from
    several ops adds up), most time first. Also returns [(entry name, reason)] for typed entries
    that have no usable shape."""
    merged, skipped = {}, []
    for e in entries:
        ktype = e.get("kernel_type")
        if not ktype or (types and ktype not in types):
            continue
        if not e.get("shape_detail"):
            skipped.append((e["name"], ktype, e.get("note") or "no shapes recorded"))
            continue
        if e.get("pluggable") is False:
            why = e.get("pluggable_note") or "no swap rule reaches it and its module's graph " \
                "holds no computation the graph swap rewrites"
            skipped.append((e["name"], ktype, f"verify.py cannot plug a kernel in where the "
                            f"model computes it: {why}"))
            continue
        m = merged.setdefault(ktype, {"kernel_type": ktype, "time_us": 0.0, "share": 0.0,
                                      "ops": [], "shapes": {}, "variants": {}, "bounds": []})
        m["time_us"] += e["time_us"]
        m["share"] += e["share"]
        m["ops"].append(e["name"])
        m["bounds"].append((e["time_us"], e.get("bound", "n/a")))
        for d in e["shape_detail"]:
            shape = tuple(d["shape"])
            m["shapes"][shape] = m["shapes"].get(shape, 0.0) + d["time_us"]
            m["variants"].setdefault(shape, d.get("variant") or {})
    for m in merged.values():
        m["shapes"] = [list(s) for s, _ in sorted(m["shapes"].items(), key=lambda kv: -kv[1])]
        # the timed variant: the one the shape with the most time runs
        m["variant"] = m.pop("variants")[tuple(m["shapes"][0])]
        m["bound"] = max(m.pop("bounds"))[1]  # the bound of the op with the most time
    return sorted(merged.values(), key=lambda m: -m["time_us"]), skipped


CPU_ALIGN = 16  # a shrunk dimension keeps its remainder modulo this: alignment is what matters


def cpu_caps(ktype):
    """Per dimension, the largest size the type's own CPU primary and sweep shapes use: sizes the
    interpreter is known to judge in seconds."""
    shapes = [ktype.cpu_shapes["primary"], *ktype.cpu_shapes["sweep"]]
    return [max(s[i] for s in shapes) for i in range(len(ktype.shape_names))]


def shrink(size, cap):
    """size when it fits under cap, else the largest number <= cap with the same remainder
    modulo 16 (modulo the largest power of two <= cap when cap < 16): alignment and parity are
    what change a kernel's code path (masked tails, vector loads), not the size itself."""
    if size <= cap:
        return size
    align = min(CPU_ALIGN, 1 << (cap.bit_length() - 1))
    return cap - (cap - size) % align


def cpu_shape(ktype, shape):
    """A model shape scaled down for Triton's interpreter (see the module docstring)."""
    scaled = [shrink(d, cap) for d, cap in zip(shape, cpu_caps(ktype))]
    if ktype.name == "decode_attention":  # as many query heads per key/value head as the model
        scaled[1] = scaled[2] * (shape[1] // shape[2])
    return scaled


def bench_shapes(ktype, shapes, cpu):
    """BENCH_SHAPES for the file: the real shapes, or in CPU mode their scaled-down versions in
    the same order (duplicates dropped: two real shapes can shrink to one)."""
    if not cpu:
        return [list(s) for s in shapes]
    out = []
    for s in shapes:
        scaled = cpu_shape(ktype, s)
        if scaled not in out:
            out.append(scaled)
    return out


def write_unless_worked_on(path, source, force):
    """Write a plan kernel's file, unless one there holds other content (the agent's work) and
    --force was not given (WorkExists)."""
    if path.exists() and path.read_text() != source and not force:
        raise WorkExists(f"{path} exists with other content (the agent's work?): pass --force "
                         "to overwrite, skipped")
    write_kernel_file(path, source)


def write_kernel(candidate, rank, profile, kernels_dir, workspace, force, cpu=False,
                 backend="triton"):
    """Write workspace/<type>_<rank>.py (cpu: with CPU-scaled BENCH_SHAPES); returns the plan
    row. Raises UsageError (one line)."""
    ktype = candidate["kernel_type"]
    starter = Path(kernels_dir) / f"{ktype}.py"
    if not starter.is_file():
        raise UsageError(f"{starter} is missing: no starter kernel for {ktype}, skipped")
    text = starter.read_text()
    attrs = read_attrs(text, starter)[0]
    if attrs.get("KERNEL_TYPE") != ktype:
        raise UsageError(f"{starter} does not set KERNEL_TYPE = {ktype!r}, skipped")
    if attrs.get("BACKEND", "triton") != backend:
        raise UsageError(f"{starter} is a {attrs.get('BACKEND', 'triton')} kernel, not "
                         f"{backend}: pass the matching --backend or --kernels-dir, skipped")
    name = f"{ktype}_{rank}"
    path = Path(workspace) / f"{name}.py"
    shapes = bench_shapes(KERNEL_TYPES[ktype], candidate["shapes"], cpu)
    source = kernel_source(text, name, shapes, profile["dtype"], profile["model"],
                           candidate["shapes"] if cpu else None, candidate.get("variant"))
    write_unless_worked_on(path, source, force)
    share = candidate["share"]
    return {"rank": rank, "name": name, "kernel_type": ktype, "file": rel(path),
            "shapes": candidate["shapes"], "bench_shapes": shapes, "dtype": profile["dtype"],
            "variant": candidate.get("variant") or {},
            "share": share,
            "time_us": candidate["time_us"],
            "amdahl_ceiling": 1.0 / (1.0 - share) if share < 1.0 else None,
            "bound": candidate["bound"], "ops": candidate["ops"], "backend": backend}


def region_candidates(entries):
    """The profile's regions as candidates beside the merged kernel types (one without a
    reference, a standalone problem file, is skipped with its reason when its turn comes)."""
    return [{"region": e["region"], "name": e["name"], "time_us": e["time_us"],
             "share": e["share"], "bound": e.get("bound", "n/a"), "shapes": e.get("shapes", [])}
            for e in entries if e.get("group") == "region" and e.get("region")]


def write_region(candidate, rank, profile, workspace, force):
    """Write the region's reference (workspace/regions/<label>_<id>.py, the oracle) and its
    kernel file (workspace/<label>_<rank>.py: region_starter's starter, under the region
    kind's contract); returns the plan row. Raises UsageError (one line), StarterError."""
    region = candidate["region"]
    if not region.get("reference"):
        raise region_starter.StarterError(f"no standalone reference of it could be written "
                                          f"({region.get('note') or 'no reason recorded'})")
    if len({o and o["dtype"] for o in region.get("outputs") or ()}) > 1:
        raise region_starter.StarterError(f"its {len(region['outputs'])} outputs have different "
                                          "dtypes, which one packed tensor cannot hold (the gate "
                                          "judges a kernel's one output tensor)")
    label = re.sub(r"\W", "_", region["label"]).lower()
    problem = Path(workspace) / "regions" / f"{region['label']}_{region['id']}.py"
    if not problem.exists() or problem.read_text() != region["reference"]:
        write_kernel_file(problem, region["reference"])  # the frozen oracle (no agent edits it)
    name = f"{label}_{rank}"
    path = Path(workspace) / f"{name}.py"
    instances = region["instances"]
    where = ", ".join(i or "the forward" for i in instances[:4]) + \
        (f" (+{len(instances) - 4} more)" if len(instances) > 4 else "")
    header = {"doc": REGION_DOC.format(
        name=candidate["name"], model=profile["model"], ops=", ".join(region["ops"]),
        where=where, share=100 * candidate["share"]).strip("\n"),
        "contract": "\n".join([
            f'KERNEL_TYPE = "region"', f"KERNEL_NAME = {name!r}",
            f"KERNELBENCH_PROBLEM = {rel(problem)!r}  # the region's reference: the oracle",
            f"KERNELBENCH_SHA256 = {state.digest(problem.read_bytes())!r}",
            f"BENCH_DTYPE = {profile['dtype']!r}  # the dtype the model ran in"])}
    source = region_starter.starter_source(problem, header)
    write_unless_worked_on(path, source, force)
    share = candidate["share"]
    return {"rank": rank, "name": name, "kernel_type": "region", "file": rel(path),
            "shapes": candidate["shapes"], "bench_shapes": [], "dtype": profile["dtype"],
            "variant": {}, "share": share, "time_us": candidate["time_us"],
            "amdahl_ceiling": 1.0 / (1.0 - share) if share < 1.0 else None,
            "bound": candidate["bound"], "ops": region["ops"], "backend": "triton",
            "region": {"id": region["id"], "label": region["label"], "instances": instances,
                       "plug": region.get("plug", ""),
                       "problem": rel(problem)}}


REGION_DOC = """
Region {name} of {model}: {ops}; in {where}; {share:.1f}% of the model's op time.

extract.py wrote this starter from the region's reference (KERNELBENCH_PROBLEM, frozen from the
model's graph by profile.py): the convolutions and GEMMs are the vendor libraries' (cuDNN,
cuBLAS), made as the reference makes them, every run of elementwise ops between them is one
fused Triton kernel (_fused_<n>: one pass over memory, computed in fp32; a GroupNorm heads its
run: one program a group of channels), and a pooling or a cat is a kernel of its own. A region
with 2-d convolutions runs in channels_last (NHWC), as torch.compile runs them where that pays:
the weights are put in it once in __init__, an input that comes in NCHW is copied into it by
to_channels_last, and every fused kernel walks memory in that order. That is much what
torch.compile makes of a region (on the H100, elementwise regions start at 1.0x torch.compile).
First moves: an eval-mode BatchNorm folded into the convolution's weights and bias (a small
kernel over the weights in forward: verify.py passes each instance's own tensors in at every
call, so values made from the parameters in __init__ would be the reference's draws, not the
model's); the elementwise tail fused into your own GEMM or convolution's epilogue; a
GroupNorm's groups split across programs when there are fewer groups than SMs.

The rules (autokernel/region_kind.py): ModelNew.__init__ draws the reference's parameters in the
same order and under the same names (the judge builds Model and ModelNew under one seed;
verify.py puts each instance's own tensors in by those names), and its forward may call the
libraries' convolutions and GEMMs (torch.conv*, F.linear, torch.matmul, mm, bmm, addmm, baddbmm;
the verdict names each call); any other torch compute op there is refused: the rest is this
file's own Triton or CUDA.
"""


def brief(shapes, most=3):
    more = f" (+{len(shapes) - most} more)" if len(shapes) > most else ""
    return shape_list(shapes[:most]) + more


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=5,
                        help="how many kernels: kernel types and regions, most time first "
                             "(default 5)")
    parser.add_argument("--types", default=None,
                        help="only these kernel types, comma-separated, e.g. softmax,matmul")
    parser.add_argument("--profile", default=str(autokernel.PROFILE_JSON),
                        help="profile.py's output (default: workspace/profile.json)")
    parser.add_argument("--workspace", default=str(autokernel.WORKSPACE),
                        help="where kernel files and plan.json go (default: workspace/)")
    parser.add_argument("--backend", choices=("triton", "cuda"), default="triton",
                        help="the starters' language: triton (kernels/) or cuda (kernels/cuda/, "
                             "CUDA C++; judging them needs a GPU)")
    parser.add_argument("--kernels-dir", default=None,
                        help="starter kernels, one <type>.py each (default: kernels/, or "
                             "kernels/cuda/ with --backend cuda)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite workspace kernel files that differ")
    args = parser.parse_args(argv)
    if args.top < 1:
        raise UsageError("--top must be >= 1")
    types = parse_types(args.types)
    profile = read_profile(args.profile)
    kernels_dir = args.kernels_dir or str(autokernel.starters_dir(args.backend))
    cpu = not autokernel.CUDA and args.backend == "triton"  # scaled shapes for the interpreter

    candidates, skipped = merge_by_type(profile["entries"], types)
    for name, ktype, reason in skipped:
        print(f"extract: skipped {name} ({ktype}): {reason}")
    if not types and args.backend == "triton":  # regions rank beside the types, by share
        candidates = sorted(candidates + region_candidates(profile["entries"]),
                            key=lambda c: -c["share"])
    if not candidates:
        return fail("extract.py", "no profiled op maps to a kernel type with known shapes"
                    + (f" among --types {args.types}" if types else ""), 1)

    plan, failed, kept = [], 0, 0
    # A candidate keeps its rank (and so its file name) whatever happens to the others; a
    # region without a starter gives its place to the next candidate, so --top N writes N.
    for rank, candidate in enumerate(candidates, start=1):
        if len(plan) + failed >= args.top:
            break
        try:
            if "region" in candidate:
                row = write_region(candidate, rank, profile, args.workspace, args.force)
            else:
                row = write_kernel(candidate, rank, profile, kernels_dir,
                                   args.workspace, args.force, cpu=cpu, backend=args.backend)
        except region_starter.StarterError as e:
            where = f"; its reference is in {rel(Path(args.workspace) / 'regions')}/" \
                if candidate["region"].get("reference") else ""
            print(f"extract: skipped region {candidate['name']} "
                  f"({100 * candidate['share']:.1f}%): {e}{where}")
            continue
        except UsageError as e:
            failed += 1
            kept += isinstance(e, WorkExists)
            fail("extract.py", e)
            continue
        plan.append(row)
        print(f"{row['rank']}. {row['file']:<34} {100 * row['share']:5.1f}% of op time, "
              f"Amdahl ceiling {row['amdahl_ceiling'] or float('inf'):.2f}x, {row['bound']}, "
              f"shapes {brief(row['shapes'])}"
              + (f" (CPU: {brief(row['bench_shapes'])})" if cpu and row["bench_shapes"] else ""))

    plan_path = Path(args.workspace) / autokernel.PLAN_JSON.name
    if kept:  # kernel files hold other work (a night in progress): its plan stays as it was
        return fail("extract.py", f"{plan_path} left as it was: {kept} kernel file(s) hold "
                    "other work; keep the night's plan, or pass --force to start over", 1)
    write_json(plan_path, {
        "model": profile["model"], "created": datetime.now(timezone.utc).isoformat(),
        "profile": str(args.profile), "device": profile.get("device"),
        "dtype": profile["dtype"], "input_shapes": profile.get("input_shapes"),
        "total_op_us": profile.get("total_op_us"), "cpu_scaled": cpu,
        "backend": args.backend, "kernels": plan})
    print(f"wrote {plan_path} ({len(plan)} kernels)")
    if args.backend == "cuda" and not autokernel.CUDA:
        print("note: CUDA C++ kernels need an NVIDIA GPU to be judged (bench.py refuses here)")
    if args.backend == "cuda" and profile.get("device") == "cpu":
        print(f"note: this plan comes from a CPU profile ({profile['dtype']}, CPU shapes); for "
              f"a night on a GPU, run profile.py and extract.py there")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_main("extract.py", main))
