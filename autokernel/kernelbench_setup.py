"""
A KernelBench problem as kernel.py (kernelbench.py setup): the solution to start from (a given
ModelNew, or the problem's own Model renamed), then the contract names that tie the file to its
problem (autokernel/kernelbench.py), committed like orchestrate.py's switches so that bench.py's
reverts come back to it.
"""
import ast
import re
from pathlib import Path

import autokernel as ak
from autokernel import git, kernelbench
from autokernel.cli import UsageError
from autokernel.contract import KernelFileError, read_attrs

CONTRACT_MARK = "# ---- AutoKernel: this file as a KernelBench problem's kernel file"


def setup(problem_path, solution=None, dtype=None, kernel=None, force=False, log=print):
    """Write (and, for the repo's kernel.py, commit) the kernel file; log what the agent does
    next. Returns the plan bench.py will judge it at."""
    kernel = Path(kernel or ak.KERNEL_PY).resolve()
    try:
        problem = kernelbench.Problem(problem_path)
    except KernelFileError as e:
        raise UsageError(str(e)) from None
    source = None
    if solution is not None:
        try:
            source = Path(solution).read_text()
        except OSError as e:
            raise UsageError(f"solution {solution} cannot be read ({e.strerror}): pass a "
                             f"KernelBench solution file (it defines ModelNew)") from None
        if not defines_model_new(source):
            raise UsageError(f"{solution} defines no class ModelNew at its top level: pass a "
                             f"KernelBench solution (ModelNew takes Model's init arguments)")
    text = kernel_file_text(problem, where(problem.path), dtype or kernelbench.DEFAULT_DTYPE,
                            source)
    try:
        plan = kernelbench.plan(read_attrs(text)[0])  # the problem runs, every dtype probed
    except KernelFileError as e:
        raise UsageError(str(e)) from None
    in_repo = kernel == ak.KERNEL_PY.resolve() and git.is_own_repo() and git.has_commit()
    if in_repo and not force and git.is_tracked("kernel.py") and git.changed_paths("kernel.py"):
        raise UsageError("kernel.py has uncommitted edits: run `uv run bench.py -m \"...\"` on "
                         "them (or git checkout HEAD -- kernel.py) first, or pass --force to "
                         "replace them")
    kernel.write_text(text)
    commit = git.commit_file("kernel.py", f"kernelbench: set up {problem.name}") \
        if in_repo else None
    log(f"kernel: {kernel}")
    log(f"problem: {problem.path} ({plan['shape_str']})")
    log(f"start: ModelNew from {solution}" if solution else
        "start: the problem's Model renamed ModelNew (torch ops: the gate refuses it until its "
        "forward runs Triton kernels)")
    for name, entry in plan["oracles"].items():
        log(f"oracle_{name}: {entry['note']}")
    log(f"dtype: {plan['dtype']} (timed); tag: {plan['tag']}")
    if commit:
        log(f"commit: {commit}")
    log("next: the agent edits ModelNew in kernel.py and runs `uv run bench.py -m \"...\"` "
        "(program.md, \"KernelBench problems\"): Model's init arguments and forward, the math in "
        "Triton kernels, correct in every judged dtype; kept only when correct and faster")
    return plan


def where(path):
    """The problem's path as the kernel file records it: relative to the repo when inside it."""
    try:
        return str(Path(path).resolve().relative_to(ak.ROOT.resolve()))
    except ValueError:
        return str(Path(path).resolve())


def defines_model_new(source):
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)


def kernel_file_text(problem, path_text, dtype, solution_source=None):
    """kernel.py for a problem: the solution's source (without one: the problem's own source,
    Model renamed ModelNew and the input makers dropped, as a starting point that the gate
    refuses until forward does its math in Triton), then the contract names."""
    if solution_source is None:
        source = starter_source(problem)
    else:
        source = solution_source.split(CONTRACT_MARK)[0].rstrip() + "\n"
    return (f"{source}\n\n{CONTRACT_MARK} {'-' * max(0, 99 - len(CONTRACT_MARK))}\n"
            "# bench.py judges ModelNew above against the problem file named below (its Model,\n"
            "# get_inputs and get_init_inputs; changing them here changes nothing): ModelNew\n"
            "# takes Model's init arguments and computes Model's forward, the math in Triton\n"
            "# kernels (torch only allocates outputs and makes views), in every dtype the\n"
            "# problem allows. KernelBench ignores these names, so the file moves there as it\n"
            "# is. program.md, \"KernelBench problems\", has the rules.\n"
            "KERNEL_TYPE = \"kernelbench\"\n"
            f"KERNEL_NAME = \"kb_{problem.name}\"\n"
            f"KERNELBENCH_PROBLEM = {path_text!r}\n"
            f"KERNELBENCH_SHA256 = \"{problem.sha256}\"\n"
            f"BENCH_DTYPE = \"{dtype}\"\n")


def starter_source(problem):
    text = problem.path.read_text()
    lines = text.splitlines()
    for node in reversed(ast.parse(text).body):  # the judge makes inputs from the problem file
        if isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs"):
            del lines[node.lineno - 1:node.end_lineno]
    body = re.sub(r"\bModel\b", "ModelNew", "\n".join(lines)).strip()
    return ("# Starting point: the problem's Model renamed ModelNew. bench.py refuses its torch\n"
            "# compute ops until forward does the math in Triton kernels.\n"
            f"{body}\n")
