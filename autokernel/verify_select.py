"""
Which kernel files verify.py plugs into the model, and the morning's re-check of each.

Kernels come from workspace/plan.json (extract.py's list; each file holds that kernel's best kept
version), from --kernels FILE[,FILE], or from --starters (every kernels/*.py, or kernels/cuda/*.py
with --backend cuda; a starter that finds nothing to replace in this model is listed as "unused",
not as a replacement and not as a failure). A kernel file whose type has no call site in the model
beside the other files' types (one forward with the references of the given types plugged in:
qkv_rotary, say, takes an attention layer's rotation from rotary_embedding) is neither re-gated
nor imported: a starter is then unused, a file named by --kernels or the plan never ran; a
file refused by its re-gate gives its call sites back. CUDA C++ kernel files need a GPU.
Before any kernel is imported here, each file goes through the gate's correctness stages again
(autokernel/regate.py: bench.py --correctness-only, fresh inputs, not timed: verify.py times the
model itself) and each plan kernel's file must be the bytes of a kept row of results.tsv (the
report names which: experiment, commit, recorded latency; it warns when a plan kernel has no kept
version), and a kept row on this branch that no plan kernel is named after is named on a line of
its own. A file that fails is left out and the run fails. --no-regate skips this for quick
checks.
"""
import glob
import re
from collections import Counter
from pathlib import Path

import autokernel
from autokernel import regate
from autokernel.cli import UsageError, describe
from autokernel.contract import (KernelFileError, check_module, is_cuda_kernel, load_module,
                                 read_file_attrs, tag_of)
from autokernel.endtoend import forward
from autokernel.night import unplaced_keeps
from autokernel.results import read_rows, rel
from autokernel.kernel_call import Kernel
from autokernel.swap import pluggable_types
from autokernel.verify_report import Steps, blank_entry
from autokernel.workspace import plan_kernels, read_plan


def load_kernel(path, name=None, kernel_type=None, shapes=None, optional=False, instances=None,
                plug=None, region_id=None):
    """A kernel file, imported and checked against the contract; its dispatch shapes are the
    plan's, else its BENCH_SHAPES, else none (it takes every shape of its type). A region
    kernel's callable is its ModelNew, plugged into the plan's instances of the region (their
    forwards, or at `plug` in them), or, with no plug, wherever the model's graph computes its
    region (the plan's id, else the one its reference's file name ends in)."""
    path = kernel_path(path)
    try:
        module = load_module(path)
    except Exception as e:  # a kept kernel that no longer imports is a usage problem to fix first
        raise UsageError(f"cannot import kernel {path}: {describe(e)}") from None
    if getattr(module, "KERNEL_TYPE", None) == "region":
        if not isinstance(getattr(module, "ModelNew", None), type):
            raise UsageError(f"{path}: a region kernel file must define class ModelNew")
        name = name or getattr(module, "KERNEL_NAME", None) or path.stem
        found = re.search(r"_(r[0-9a-f]{8})\.py$", str(getattr(module, "KERNELBENCH_PROBLEM", "")))
        return Kernel(name, "region", path, module.ModelNew, [], optional,
                      list(instances or []), plug, region_id or (found and found.group(1)) or "")
    try:
        declared = check_module(module)["kernel_type"]
    except KernelFileError as e:
        raise UsageError(f"{path}: {e}") from None
    if kernel_type and kernel_type != declared:
        raise UsageError(f"{path}: KERNEL_TYPE {declared!r} but plan.json says {kernel_type!r}")
    shapes = shapes or getattr(module, "BENCH_SHAPES", None) or []
    name = name or getattr(module, "KERNEL_NAME", None) or declared
    return Kernel(name, declared, path, module.kernel_fn, [tuple(s) for s in shapes], optional)


def _plan_specs(path):
    """(the plan's kernel files as specs, each with its name, type, shapes and region; the
    plan)."""
    if not Path(path).exists():
        raise UsageError(f"no {rel(path)}: run extract.py first, or pass --kernels "
                         "FILE[,FILE] or --starters")
    plan = read_plan(path)
    kernels = plan_kernels(plan)
    regions = {name: k.get("region") or {} for name, k in kernels.items()}
    return [(k["file"], name, k["kernel_type"], k.get("shapes"), False,
             regions[name].get("instances"), regions[name].get("plug"), regions[name].get("id"))
            for name, k in kernels.items()], plan


def kernel_specs(args):
    """The kernel files to plug in, from --kernels (each as --plan names it, where --plan is
    given too), --starters or workspace/plan.json (in that order of precedence), none imported
    yet. -> ([(path, name, kernel_type, shapes, optional)],
    results.tsv's rows for the plan's kept-version check, or None)."""
    rows = None
    if args.kernels:
        specs = [(p.strip(), None, None, None, False) for p in args.kernels.split(",")
                 if p.strip()]
        if getattr(args, "plan_given", False):  # these files as the plan names them
            planned = {Path(spec[0]).resolve(): spec for spec in _plan_specs(args.plan)[0]}
            specs = [planned.get(Path(spec[0]).resolve(), spec) for spec in specs]
    elif args.starters:
        files = sorted(p for p in glob.glob(str(autokernel.starters_dir(args.backend) / "*.py"))
                       if not Path(p).name.startswith("_"))
        specs = [(p, None, None, None, True) for p in files]
    else:
        specs, plan = _plan_specs(args.plan)
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


def without_call_sites(specs, model, inputs, among=(), probe=None):
    """The kernel files whose type has no call site in this model beside the other files' types
    (and `among`'s), found by one forward with the references of those types plugged in
    (swap.pluggable_types), the types read from the files' text. They are neither re-gated nor
    imported: a re-gate costs a child process and the stages, and GPT-2 calls 3 of the 10
    starters' types. An unknown type, or one that contradicts the plan, is kept for the re-gate and
    load_kernel to refuse; a model whose forward fails here keeps every file (verify() then
    reports the failure). probe(model): the run to look in instead of a forward of `inputs`
    (a generation's steps). -> (the specs to plug in, [(spec, name, type)] left out)."""
    attrs = {spec[0]: read_file_attrs(spec[0])[0] for spec in specs}
    types = {spec[0]: attrs[spec[0]].get("KERNEL_TYPE") for spec in specs}
    try:
        plugged = pluggable_types(model, probe or (lambda m: forward(m, inputs)),
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


def plugged_kernels(args, specs, rows, model, inputs, steps=None, probe=None):
    """The files with call sites in this model (without_call_sites), re-gated and imported
    (select_kernels). A file refused by its re-gate gives its call sites back: the files left
    out beside it are checked again. -> (kernels, {file: re-gate result}, [(spec, name, type)]
    left out). steps: the run's progress lines (verify_report.Steps)."""
    steps = steps or Steps([])
    steps.start("find call sites", "one forward with the kernel types' references plugged in")
    specs, idle = without_call_sites(specs, model, inputs, probe=probe)
    if idle:
        files = "starters" if args.starters else "kernel files"
        print(f"{len(idle)} of {len(specs) + len(idle)} {files} have no call site in this model "
              f"beside the others ({', '.join(t for _, _, t in idle)}): not run")
    if args.no_regate:
        print("re-gate: skipped (--no-regate): the kernel files are plugged in without being "
              "judged again")
    else:
        steps.start("re-gate", f"{len(specs)} kernel file(s) through the gate's correctness "
                               "stages, each in a process of its own")
    kernels, checked = select_kernels(args, specs, rows)
    refused = [f for f, c in checked.items() if not c["passed"]]
    if refused and idle:
        back, idle = without_call_sites([spec for spec, _, _ in idle], model, inputs,
                                        among={k.kernel_type for k in kernels}, probe=probe)
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

