"""
Kernels as a package that runs without AutoKernel, only torch and triton (export.py is its CLI).

write_package(kernels, out, name) writes out/<name>/:

    __init__.py, kernel_types.py,  autokernel/export_template/'s files (README.md with the package's
    smoke_test.py, README.md       name and kernels filled in)
    swap.py, ops.py, ...           AutoKernel's own modules (RUNTIME: swap.py, ops.py and the
                                   modules they import), copied with their imports of AutoKernel
                                   made package-relative (package_relative): a module the package
                                   carries comes from it, any other name from its kernel_types.py.
                                   The package runs the swap rules verbatim.
    kernels/<name>.py              each kernel file, byte for byte
    regions/<label>_<id>.py        a region kernel's reference (its problem file, the oracle)
    manifest.json                  {"name", "exported", "source", "kernel_types": {type: {"args",
                                   "uses_dot", "out_order"}} (all types: swap.py checks its rules
                                   against them),
                                   "tolerances": {dtype: the gate's} (computed.py's check),
                                   "kernels": [{"name", "kernel_type", "file", "shapes", "origin",
                                   "sha256", "kept", a region's "region": {"id", "instances",
                                   "plug", "reference"}}]}
    smoke_cases.pt                 [{"kernel", "variant", "dtype", "shape", "inputs", "rtol",
                                   "atol"}]: small inputs made by the type's input makers, with the
                                   gate's tolerances for them (smoke_test.py)

Which kernels: kept_kernels (the plan's kernels whose file is a kept version in results.tsv: the
bytes bench.py judged) or starter_kernels (kernels/*.py).
"""
import ast
import json
import keyword
import re
import shutil
import string
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from autokernel import KERNELS_DIR, ROOT, git, regate
from autokernel.cli import UsageError
from autokernel.contract import (KernelFileError, is_cuda_kernel, plan as contract_plan,
                                 read_file_attrs, tag_of)
from autokernel.kernel_types import DTYPE_NAMES, KERNEL_TYPES, TOLERANCES
from autokernel.results import rel
from autokernel.state import digest
from autokernel.workspace import plan_kernels

TEMPLATE = Path(__file__).resolve().parent / "export_template"
TEMPLATE_FILES = ("__init__.py", "kernel_types.py", "smoke_test.py", "README.md")
# AutoKernel modules the package carries: its module name -> the file copied.
RUNTIME = {m: f"autokernel/{m}.py" for m in (
    "swap", "kernel_call", "weight_cache", "patching", "swap_torch", "swap_modules", "swap_hf",
    "ops", "cli", "recognize", "computed", "graph_capture", "matches", "fx_vocabulary",
    "mask_values", "patterns", "patterns_rotary", "fusion", "regions", "swap_regions",
    "swap_graph", "graph_trace")} | {
    "reference": "autokernel/reference.py"}
SHIM = "kernel_types"  # the package's stand-in for every other name of AutoKernel
SMOKE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class ShippedKernel:
    name: str
    kernel_type: str
    path: Path
    shapes: list  # the model's shapes it serves (swap.py dispatches by them); [] takes every one
    kept: str     # why it ships, one line
    region: dict = None  # a region kernel's: id, instances, plug, reference (its problem file)


# ---------------------------------------------------------------------------------------------
# Which kernels
# ---------------------------------------------------------------------------------------------

def kept_kernels(plan, rows, log=print):
    """The kernels of a plan (workspace.read_plan) whose file is a kept version among results.tsv's
    rows, in plan order. A kernel with no kept version is left out (logged); a file whose bytes
    match no kept row of its kernel (edited after its keep) is a UsageError: only judged bytes
    ship."""
    kept = []
    for name, entry in plan_kernels(plan).items():
        path = Path(entry["file"]) if Path(entry["file"]).is_absolute() else ROOT / entry["file"]
        if not path.is_file():
            raise UsageError(f"{entry['file']} (plan kernel {name}) does not exist: re-run "
                             f"`uv run extract.py`")
        ok, why = regate.kept_version(path, name, rows)
        if ok is False:
            raise UsageError(f"{why}: restore its kept version before exporting", code=1)
        if ok and is_cuda_kernel(path):
            # it builds through autokernel/cuda_build.py, which the package does not carry
            ok, why = None, f"{why}; a CUDA C++ kernel, which the package cannot build yet"
        region = None
        if ok and entry["kernel_type"] == "region":
            region = dict(entry["region"])
            region["reference"] = ROOT / region["problem"] \
                if not Path(region["problem"]).is_absolute() else Path(region["problem"])
            if not region["reference"].is_file():
                ok, why = None, f"{why}; its region's reference {region['problem']} is gone"
        log(f"  {name}: {why}" + ("" if ok else ": left out"))
        if ok:
            kept.append(ShippedKernel(name, entry["kernel_type"], path,
                                      entry.get("shapes") or [], why, region))
    return kept


def starter_kernels():
    """Every kernels/*.py, catch-alls for their type (unless a file declares BENCH_SHAPES)."""
    out = []
    for path in sorted(KERNELS_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        attrs, error = read_file_attrs(path)
        try:
            if error:
                raise KernelFileError(error)
            kernel_type = contract_plan(attrs)["kernel_type"]
        except KernelFileError as e:
            raise UsageError(f"{rel(path)}: {e}") from None
        out.append(ShippedKernel(tag_of(attrs), kernel_type, path,
                                 [list(s) for s in attrs.get("BENCH_SHAPES") or []],
                                 "the shipped starter"))
    return out


# ---------------------------------------------------------------------------------------------
# The package
# ---------------------------------------------------------------------------------------------

def write_package(kernels, out, name, source, log=print):
    """out/<name>/ as the module docstring lays it out, replacing an earlier export of the same
    name (written aside first, then moved in). Returns its path."""
    out = Path(out)
    target = check_target(out, name)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
    scratch.chmod(0o755)  # mkdtemp's 0700 would keep the package from other users
    try:
        _write(scratch, kernels, name, source, log)
        if target.exists():
            shutil.rmtree(target)
        scratch.rename(target)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)
    return target


def check_target(out, name):
    """out/<name>, or a UsageError when name is no package name or the folder holds something
    other than an earlier export."""
    if not name.isidentifier() or keyword.iskeyword(name) or name == "autokernel":
        raise UsageError(f"--name {name!r} is not a usable package name: use letters, digits and "
                         f"_, not starting with a digit, and not 'autokernel' (e.g. "
                         f"autokernel_kernels)")
    target = Path(out) / name
    if target.exists() and not (target / "manifest.json").is_file():
        raise UsageError(f"{target} exists and is not an exported package: pass another --out "
                         f"or --name")
    return target


def _write(pkg, kernels, name, source, log):
    provided = _defined_names(TEMPLATE / f"{SHIM}.py")
    for module, src in RUNTIME.items():
        (pkg / f"{module}.py").write_text(package_relative((ROOT / src).read_text(), src,
                                                           provided))
    files = _module_files(kernels)
    (pkg / "kernels").mkdir()
    (pkg / "kernels" / "__init__.py").write_text(
        '"""The kernel files, byte for byte as exported (manifest.json: where each came '
        'from)."""\n')
    for k in kernels:
        shutil.copyfile(k.path, pkg / files[k.name])
        if k.region:  # its reference beside it: the smoke test's oracle
            (pkg / "regions").mkdir(exist_ok=True)
            shutil.copyfile(k.region["reference"], pkg / "regions" / k.region["reference"].name)
    manifest = {
        "name": name, "exported": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "kernel_types": {t: {"args": list(kt.args), "uses_dot": kt.uses_dot,
                             "out_order": kt.out_order} for t, kt in KERNEL_TYPES.items()},
        "tolerances": {DTYPE_NAMES[d]: tol for d, tol in TOLERANCES.items()},
        "kernels": [{"name": k.name, "kernel_type": k.kernel_type, "file": files[k.name],
                     "shapes": [list(s) for s in k.shapes], "origin": rel(k.path),
                     "sha256": digest(k.path.read_bytes()), "kept": k.kept,
                     **({"region": {"id": k.region["id"], "instances": k.region["instances"],
                                    "plug": k.region.get("plug", ""),
                                    "reference": f"regions/{k.region['reference'].name}"}}
                        if k.region else {})} for k in kernels]}
    (pkg / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    cases = smoke_cases(kernels)
    torch.save(cases, pkg / "smoke_cases.pt")
    log(f"  smoke_cases.pt: {len(cases)} cases (each kernel's variants x fp32, fp16, bf16)")
    for f in TEMPLATE_FILES:
        text = (TEMPLATE / f).read_text()
        if f == "README.md":
            text = string.Template(text).substitute(name=name, kernels="\n".join(
                f"- `{k.name}` ({k.kernel_type}, `{files[k.name]}`): {k.kept}" for k in kernels))
        (pkg / f).write_text(text)


def _module_files(kernels):
    """kernel name -> kernels/<module>.py, each an importable, distinct module name."""
    files = {}
    for k in kernels:
        base = re.sub(r"\W", "_", k.name).strip("_").lower() or "kernel"
        base = f"k_{base}" if base[0].isdigit() or keyword.iskeyword(base) else base
        stem, n = base, 1
        while f"kernels/{stem}.py" in files.values():
            n += 1
            stem = f"{base}_{n}"
        files[k.name] = f"kernels/{stem}.py"
    return files


def smoke_cases(kernels, seed=0):
    """For each kernel, variant of its type and dtype: the type's small CPU stability shape, its
    inputs (seeded: the same package every export) and the gate's tolerances for them (atol in
    units of the oracle output's scale: autokernel.kernel_types.mismatches)."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for k in kernels:
        if k.region:  # judged against its reference instead (smoke_test.py)
            continue
        ktype = KERNEL_TYPES[k.kernel_type]
        shape = ktype.cpu_shapes["stability"][0]
        for variant in ktype.variants:
            for dtype in SMOKE_DTYPES:
                inputs = ktype.inputs(shape, dtype, "cpu", gen, variant)
                want = ktype.reference(**inputs)
                _, atol = ktype.mismatches(want, want, inputs)
                cases.append({"kernel": k.name, "variant": dict(variant),
                              "dtype": DTYPE_NAMES[dtype], "shape": list(shape), "inputs": inputs,
                              "rtol": TOLERANCES[dtype], "atol": atol})
    return cases


# ---------------------------------------------------------------------------------------------
# AutoKernel's modules inside the package
# ---------------------------------------------------------------------------------------------

def package_relative(source, filename, provided):
    """source with each import of AutoKernel made package-relative: `import autokernel` becomes
    the package's kernel_types module under that name, a RUNTIME module is imported from the
    package, any other name of AutoKernel from kernel_types, which must define it (`provided`).
    Anything else of the repo's (another module, an attribute kernel_types lacks) is a
    UsageError that says where to add it."""
    tree = ast.parse(source, filename)
    edits, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [_import_target(a, filename, aliases) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            targets = [_from_target(node.module, a, filename, provided) for a in node.names]
        else:
            continue
        if any(t is not None for t in targets):
            edits.append((node, _statements(node, targets)))
    for node in ast.walk(tree):  # autokernel.X through the module alias: X must be provided
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases and node.attr not in provided:
            raise _missing(filename, f"autokernel.{node.attr}")
    lines = source.splitlines(keepends=True)
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        first, last = node.lineno - 1, node.end_lineno - 1
        lines[first:last + 1] = [lines[first][:node.col_offset] + text
                                 + lines[last][node.end_col_offset:]]
    return "".join(lines)


def _import_target(alias, filename, aliases):
    """Where `import X` comes from in the package: (package module, name), or None (as is)."""
    if alias.name == "autokernel":
        aliases.add(alias.asname or alias.name)
        return ".", SHIM
    if alias.name in RUNTIME:
        return ".", alias.name
    if _is_repo_module(alias.name):
        raise _missing(filename, alias.name)
    return None


def _from_target(module, alias, filename, provided):
    """Where `from module import X` comes from in the package: (package module, name), or
    None (as is)."""
    top, _, sub = (module or "").partition(".")
    if module == "autokernel" and alias.name in RUNTIME:
        return ".", alias.name
    if top == "autokernel" and sub in RUNTIME:
        return f".{sub}", alias.name
    if module in RUNTIME:
        return f".{module}", alias.name
    if top == "autokernel":
        if alias.name not in provided:
            raise _missing(filename, f"{alias.name} from {module}")
        return f".{SHIM}", alias.name
    if _is_repo_module(top):
        raise _missing(filename, f"{alias.name} from {module}")
    return None


def _statements(node, targets):
    """The import node's replacement: one statement per place its names come from, each name
    bound as before (`import autokernel` -> `from . import kernel_types as autokernel`)."""
    groups = {}
    for alias, target in zip(node.names, targets):
        bound = alias.asname or (alias.name if isinstance(node, ast.Import) else None)
        where, name = ("", alias.name) if target is None else (f"from {target[0]} ", target[1])
        groups.setdefault(where, []).append(name if bound in (None, name) else f"{name} as {bound}")
    return "; ".join(f"{where}import {', '.join(names)}" for where, names in groups.items())


def _is_repo_module(name):
    top = name.partition(".")[0]
    return top == "autokernel" or (ROOT / f"{top}.py").is_file() \
        or (ROOT / top / "__init__.py").is_file()


def _missing(filename, what):
    return UsageError(f"{filename} uses {what}, which the exported package does not carry: add "
                      f"the module to RUNTIME in autokernel/export.py or the name to "
                      f"autokernel/export_template/{SHIM}.py", code=1)


def _defined_names(path):
    """The names a module defines at its top level (functions, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).partition(".")[0] for a in node.names}
    return names


def head_commit():
    """The repo's HEAD (short), or None outside a git checkout."""
    proc = git.git("rev-parse", "--short", "HEAD")
    return proc.stdout.strip() if proc.returncode == 0 else None
