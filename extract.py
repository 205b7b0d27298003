"""
Turn the model's top ops (from workspace/profile.json) into standalone kernel files the agent can
optimize, and write the plan orchestrate.py follows.

    uv run profile.py                       # first: rank the model's ops
    uv run extract.py --top 5               # the 5 kernel types with the most time
    uv run extract.py --top 3 --types softmax,matmul

For each kernel type among the profile's entries (entries of the same type are merged: all of the
model's linear layers are one matmul kernel, with all their shapes), extract.py copies the starter
kernels/<type>.py to workspace/<type>_<rank>.py and appends a block that sets

    KERNEL_NAME  = "<type>_<rank>"        the results.tsv tag
    BENCH_SHAPES = [(...), ...]            the model's real shapes in the type's convention, most
                                           time first: bench.py times the first, sweeps them all
    BENCH_DTYPE  = "fp16"                  the dtype the model ran in

Entries whose shapes could not be derived are skipped with the reason (never a default shape).
An existing workspace file with different content is kept unless --force: the agent may have
worked on it.

workspace/plan.json schema (orchestrate.py reads it):
  model        str   the profiled model's description (profile.json "model")
  created      str   ISO-8601 time this plan was written
  profile      str   the profile.json it was built from
  device, dtype, input_shapes   as in profile.json
  total_op_us  float the model's summed op time per forward (the Amdahl denominator)
  kernels      list  priority order (highest share first):
    rank           int    1, 2, ...
    name           str    KERNEL_NAME, e.g. "matmul_1"
    kernel_type    str    one of autokernel.KERNEL_TYPE_NAMES
    file           str    workspace/<name>.py, relative to the repo root
    shapes         list   BENCH_SHAPES as lists, most time first
    dtype          str    BENCH_DTYPE
    share          float  fraction (0..1) of the model's op time spent in this type's ops
    time_us        float  that time per forward
    amdahl_ceiling float  1 / (1 - share): end-to-end speedup if the kernel took no time
    bound          str    "compute" | "memory" (roofline of the model's calls) | "n/a" (CPU)
    ops            list   the profile entries merged into it, e.g. ["aten::linear", "aten::matmul"]
"""
import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import autokernel
from autokernel import KERNEL_TYPES, ROOT


class UsageError(Exception):
    pass


def read_profile(path):
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path} not found: run `uv run profile.py` first")
    try:
        profile = json.loads(path.read_text())
        profile["entries"]
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{path} is not a profile.py output: run `uv run profile.py` again") \
            from None
    return profile


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
        m = merged.setdefault(ktype, {"kernel_type": ktype, "time_us": 0.0, "share": 0.0,
                                      "ops": [], "shapes": {}, "bounds": []})
        m["time_us"] += e["time_us"]
        m["share"] += e["share"]
        m["ops"].append(e["name"])
        m["bounds"].append((e["time_us"], e.get("bound", "n/a")))
        for d in e["shape_detail"]:
            shape = tuple(d["shape"])
            m["shapes"][shape] = m["shapes"].get(shape, 0.0) + d["time_us"]
    for m in merged.values():
        m["shapes"] = [list(s) for s, _ in sorted(m["shapes"].items(), key=lambda kv: -kv[1])]
        m["bound"] = max(m.pop("bounds"))[1]  # the bound of the op with the most time
    return sorted(merged.values(), key=lambda m: -m["time_us"]), skipped


def kernel_source(starter_text, name, shapes, dtype, model):
    shape_lines = "".join(f"    {tuple(s)!r},\n" for s in shapes)
    return (starter_text.rstrip("\n") + "\n\n\n"
            f"# --- appended by extract.py: the shapes {model} runs, most time first ---\n"
            f"KERNEL_NAME = {name!r}\n"
            f"BENCH_SHAPES = [\n{shape_lines}]\n"
            f"BENCH_DTYPE = {dtype!r}\n")


def write_kernel(candidate, rank, profile, kernels_dir, workspace, force):
    """Write workspace/<type>_<rank>.py; returns the plan row. Raises UsageError (one line)."""
    ktype = candidate["kernel_type"]
    starter = Path(kernels_dir) / f"{ktype}.py"
    if not starter.is_file():
        raise UsageError(f"{starter} is missing: no starter kernel for {ktype}, skipped")
    text = starter.read_text()
    if f'KERNEL_TYPE = "{ktype}"' not in text and f"KERNEL_TYPE = '{ktype}'" not in text:
        raise UsageError(f"{starter} does not set KERNEL_TYPE = {ktype!r}, skipped")
    name = f"{ktype}_{rank}"
    path = Path(workspace) / f"{name}.py"
    source = kernel_source(text, name, candidate["shapes"], profile["dtype"], profile["model"])
    if path.exists() and path.read_text() != source and not force:
        raise UsageError(f"{path} exists with other content (the agent's work?): pass --force "
                         "to overwrite, skipped")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    share = candidate["share"]
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    return {"rank": rank, "name": name, "kernel_type": ktype, "file": str(shown),
            "shapes": candidate["shapes"], "dtype": profile["dtype"], "share": share,
            "time_us": candidate["time_us"],
            "amdahl_ceiling": 1.0 / (1.0 - share) if share < 1.0 else None,
            "bound": candidate["bound"], "ops": candidate["ops"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=5, help="how many kernel types (default 5)")
    parser.add_argument("--types", default=None,
                        help="only these kernel types, comma-separated, e.g. softmax,matmul")
    parser.add_argument("--profile", default=str(autokernel.PROFILE_JSON),
                        help="profile.py's output (default: workspace/profile.json)")
    parser.add_argument("--workspace", default=str(autokernel.WORKSPACE),
                        help="where kernel files and plan.json go (default: workspace/)")
    parser.add_argument("--kernels-dir", default=str(autokernel.KERNELS_DIR),
                        help="starter kernels, one <type>.py each (default: kernels/)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite workspace kernel files that differ")
    args = parser.parse_args(argv)
    try:
        if args.top < 1:
            raise UsageError("--top must be >= 1")
        types = parse_types(args.types)
        profile = read_profile(args.profile)
    except UsageError as e:
        print(f"extract.py: error: {e}", file=sys.stderr)
        return 2

    candidates, skipped = merge_by_type(profile["entries"], types)
    for name, ktype, reason in skipped:
        print(f"extract: skipped {name} ({ktype}): {reason}")
    if not candidates:
        print("extract.py: error: no profiled op maps to a kernel type with known shapes"
              + (f" among --types {args.types}" if types else ""), file=sys.stderr)
        return 1

    plan, failed = [], 0
    for candidate in candidates[:args.top]:
        try:
            row = write_kernel(candidate, len(plan) + 1, profile, args.kernels_dir,
                               args.workspace, args.force)
        except UsageError as e:
            print(f"extract.py: error: {e}", file=sys.stderr)
            failed += 1
            continue
        plan.append(row)
        shapes = ", ".join("x".join(map(str, s)) for s in row["shapes"][:3])
        more = f" (+{len(row['shapes']) - 3} more)" if len(row["shapes"]) > 3 else ""
        print(f"{row['rank']}. {row['file']:<34} {100 * row['share']:5.1f}% of op time, "
              f"Amdahl ceiling {row['amdahl_ceiling'] or float('inf'):.2f}x, {row['bound']}, "
              f"shapes {shapes}{more}")

    plan_path = Path(args.workspace) / autokernel.PLAN_JSON.name
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_text(json.dumps({
        "model": profile["model"], "created": datetime.now(timezone.utc).isoformat(),
        "profile": str(args.profile), "device": profile.get("device"),
        "dtype": profile["dtype"], "input_shapes": profile.get("input_shapes"),
        "total_op_us": profile.get("total_op_us"), "kernels": plan}, indent=1))
    print(f"wrote {plan_path} ({len(plan)} kernels)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
