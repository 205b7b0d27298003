"""
The kernel file contract (kernel.py, kernels/<type>.py, workspace/<name>.py): what a file must
define, read one way by every script.

    KERNEL_TYPE  = "softmax"          # one of the registered types (autokernel.KERNEL_TYPES)
    KERNEL_NAME  = "softmax_1"        # optional: the tag in results.tsv and plan.json (during
                                      #   a night, kernel.py's must be the plan's: night_attrs)
    BACKEND      = "triton"           # optional: "triton" (default) or "cuda" (CUDA C++ source
                                      #   built by autokernel/cuda_build.py; needs a GPU to run)
    BENCH_SHAPES = [(4096, 50257)]    # optional: the shapes that matter (the first is timed)
    BENCH_DTYPE  = "bf16"             # optional: the timed dtype (default fp16)
    BENCH_VARIANT = {"kv_groups": 4}  # optional: the timed variant of the type's contract
    def kernel_fn(**args): ...        # the reference's named arguments in, a new tensor out

A KernelBench problem's solution instead sets KERNEL_TYPE = "kernelbench", KERNELBENCH_PROBLEM
(the problem file) and KERNELBENCH_SHA256 (its bytes' hash) and defines ModelNew in place of
kernel_fn (autokernel/kernelbench.py; `uv run kernelbench.py setup PROBLEM.py` writes one): another
kind of problem (autokernel/kinds.py), planned by its own module; `plan` here plans kernel types.

The names are read from the source without running it (`read_attrs`), so a row can be tagged
even when the file does not import; `load` imports the file and checks the same names.
"""
import ast
import importlib.abc
import importlib.util
import linecache
import re
import sys
import textwrap
from pathlib import Path

from autokernel import KERNEL_TYPE_NAMES

CONTRACT_NAMES = ("KERNEL_TYPE", "KERNEL_NAME", "BENCH_SHAPES", "BENCH_DTYPE", "BENCH_VARIANT",
                  "BACKEND", "KERNELBENCH_PROBLEM", "KERNELBENCH_SHA256")
BACKENDS = ("triton", "cuda")


class KernelFileError(Exception):
    """The file breaks the contract; the message says what to set."""


def read_attrs(source, filename="kernel.py"):
    """The contract names assigned a literal at the top level (the last assignment wins), read
    without running the file. -> (attrs, syntax error message or None)."""
    try:
        tree = ast.parse(source, filename=str(filename))
    except (SyntaxError, ValueError) as e:
        attrs = dict(re.findall(r"^(KERNEL_TYPE|KERNEL_NAME)\s*=\s*['\"]([\w.-]+)['\"]",
                                source, re.M))
        return attrs, f"syntax error in {Path(filename).name} line " \
                      f"{getattr(e, 'lineno', '?')}: {getattr(e, 'msg', e)}"
    attrs = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in CONTRACT_NAMES:
                    try:
                        attrs[target.id] = ast.literal_eval(node.value)
                    except (ValueError, TypeError, SyntaxError):  # computed at import time
                        pass
    return attrs, None


def read_file_attrs(path):
    return read_attrs(Path(path).read_text(errors="replace"), path)


def is_cuda_kernel(path):
    """Whether a kernel file declares BACKEND = "cuda", read from its text (importing it would
    compile it)."""
    return read_file_attrs(path)[0].get("BACKEND") == "cuda"


def tag_of(attrs) -> str:
    """The name a kernel goes by in results.tsv and plan.json: KERNEL_NAME, else KERNEL_TYPE."""
    return str(attrs.get("KERNEL_NAME") or attrs.get("KERNEL_TYPE") or "")


def tag_of_source(source):
    """tag_of for a file's text (None when it names no type)."""
    return tag_of(read_attrs(source)[0]) or None


def shape_list(shapes):
    """[[8, 1024], [4, 64]] -> "8x1024, 4x64"."""
    return ", ".join("x".join(map(str, s)) for s in shapes)


def kernel_source(starter_text, name, shapes, dtype, model, real_shapes=None, variant=None,
                  writer="extract.py"):
    """A starter with the contract block appended (KERNEL_NAME, BENCH_SHAPES, BENCH_DTYPE,
    BENCH_VARIANT): the kernel files extract.py and `orchestrate.py rewrite` write. real_shapes:
    the model's shapes when `shapes` are CPU-scaled versions of them (the comment says so);
    variant: the model's variant of the type's contract (BENCH_VARIANT, when not the default)."""
    shape_lines = "".join(f"    {tuple(s)!r},\n" for s in shapes)
    scaled = "" if real_shapes is None else textwrap.fill(
        "CPU mode: BENCH_SHAPES are the model's shapes scaled down for Triton's interpreter (no "
        "dimension beyond the type's own CPU shapes; each shrunk one keeps its remainder modulo "
        f"16). The real ones, in plan.json: {shape_list(real_shapes)}", 99,
        initial_indent="# ", subsequent_indent="# ", break_long_words=False,
        break_on_hyphens=False) + "\n"
    return (starter_text.rstrip("\n") + "\n\n\n"
            f"# --- appended by {writer}: the shapes {model} runs, most time first ---\n"
            f"KERNEL_NAME = {name!r}\n"
            f"{scaled}BENCH_SHAPES = [\n{shape_lines}]\n"
            f"BENCH_DTYPE = {dtype!r}\n"
            + (f"BENCH_VARIANT = {variant!r}\n" if variant else ""))


def plan(attrs) -> dict:
    """What to judge a kernel type's file at, from its contract names: {"kernel_type", "tag",
    "shape" (the timed one), "shape_str", "bench_shapes", "dtype", "variant", "backend"}. Raises
    KernelFileError."""
    from autokernel.kernel_types import DTYPE_NAMES, KERNEL_TYPES, parse_dtype
    name = attrs.get("KERNEL_TYPE")
    if name is None:
        raise KernelFileError(f"kernel file defines no KERNEL_TYPE; set it to one of "
                              f"{', '.join(KERNEL_TYPE_NAMES)}")
    if name not in KERNEL_TYPE_NAMES:
        raise KernelFileError(f"unknown KERNEL_TYPE {name!r}: use one of "
                              f"{', '.join(KERNEL_TYPE_NAMES)}")
    backend = attrs.get("BACKEND", "triton")
    if backend not in BACKENDS:
        raise KernelFileError(f"BACKEND {backend!r} is not supported: use one of "
                              f"{', '.join(BACKENDS)}")
    ktype = KERNEL_TYPES[name]
    shapes = attrs.get("BENCH_SHAPES") or [ktype.shapes("primary")]
    try:
        shapes = [tuple(int(d) for d in s) for s in shapes]
    except (TypeError, ValueError):
        raise KernelFileError(f"BENCH_SHAPES must be a list of shape tuples, got {shapes!r}")
    for s in shapes:
        if len(s) != len(ktype.shape_names) or min(s) < 1:
            raise KernelFileError(f"BENCH_SHAPES entry {s} is not a {name} shape "
                                  f"({', '.join(ktype.shape_names)}, all >= 1)")
    try:
        dtype = parse_dtype(str(attrs.get("BENCH_DTYPE") or "fp16"))
    except ValueError as e:
        raise KernelFileError(f"BENCH_DTYPE: {e}")
    if dtype not in ktype.dtypes():  # bf16 tl.dot is wrong in the CPU interpreter
        dtype = ktype.dtypes()[0]
    variant = attrs.get("BENCH_VARIANT") or {}
    if not isinstance(variant, dict):
        raise KernelFileError(f"BENCH_VARIANT must be a dict of {name} options, got {variant!r}")
    try:
        variant = ktype.check_variant(variant)
    except ValueError as e:
        raise KernelFileError(str(e))
    return {"kernel_type": name, "tag": tag_of(attrs), "shape": list(shapes[0]),
            "shape_str": ktype.shape_str(shapes[0]), "bench_shapes": [list(s) for s in shapes],
            "dtype": DTYPE_NAMES[dtype], "variant": variant, "backend": backend}


def night_attrs(entry) -> dict:
    """The contract names the night fixes for kernel.py (entry: the plan.json entry of the kernel
    the night is on; None: no night, nothing fixed): the tag, the type and the shapes a run is
    recorded under come from the plan, not from lines the agent may edit."""
    if entry is None:
        return {}
    fixed = {"KERNEL_NAME": entry["name"], "KERNEL_TYPE": entry["kernel_type"]}
    if entry["kernel_type"] == "region":  # a region's setting is its reference, not shapes
        fixed["KERNELBENCH_PROBLEM"] = (entry.get("region") or {}).get("problem")
    elif entry.get("bench_shapes") is not None:
        fixed["BENCH_SHAPES"] = [tuple(s) for s in entry["bench_shapes"]]
    return fixed


def night_disagreement(attrs, entry, shapes_read=True):
    """The one line bench.py refuses kernel.py with when its KERNEL_NAME, KERNEL_TYPE or
    BENCH_SHAPES (a region's: KERNELBENCH_PROBLEM) disagree with the kernel the night is on
    (night_attrs); None when they agree.
    shapes_read=False: the file did not parse, so only the names the regex found are compared."""
    fixed = night_attrs(entry)
    undo = ("(git diff kernel.py shows the edit; nothing was judged or recorded; another kernel: "
            "`uv run orchestrate.py install NAME`)")
    for key in ("KERNEL_NAME", "KERNEL_TYPE", "BENCH_SHAPES", "KERNELBENCH_PROBLEM"):
        if key not in fixed or (key == "BENCH_SHAPES" and not shapes_read):
            continue
        have, want = attrs.get(key), fixed[key]
        if key == "BENCH_SHAPES":
            try:
                have = [tuple(int(d) for d in s) for s in have]
            except (TypeError, ValueError):
                pass
        if have != want:
            shown = f"{key} = {attrs[key]!r}" if key in attrs else f"no {key} line"
            return (f"kernel.py has {shown}, but the night is on {entry['name']} (orchestrate.py's "
                    f"current kernel; plan.json: {key} = {want!r}): put it back {undo}")
    return None


def load_module(path, name=None, source=None):
    """Import a Python file by path under a unique module name (never shadowing a library).
    source: the file's text, given in memory; path then only names it (it need not exist)."""
    import autokernel.kernel_types  # noqa: F401  (CPU mode is set before the file imports triton)
    path = Path(path)
    if source is None and not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    name = name or f"autokernel_loaded_{path.stem}_{abs(hash(str(path.resolve())))}"
    if source is None:
        spec = importlib.util.spec_from_file_location(name, path)
    else:  # inspect.getsource (triton.jit) asks the loader for the text, through linecache
        linecache.cache.pop(str(path), None)  # another text under this name, loaded earlier
        spec = importlib.util.spec_from_loader(name, TextLoader(path, source), origin=str(path))
        spec.has_location = True  # __file__ names the path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit needs the module importable for inspect
    spec.loader.exec_module(module)
    return module


class TextLoader(importlib.abc.SourceLoader):
    """A module's source from memory, named by a path that need not exist."""

    def __init__(self, path, text):
        self.path, self.text = str(path), text

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        return self.text.encode()


def module_attrs(module) -> dict:
    """The contract names an imported kernel module defines."""
    return {k: getattr(module, k) for k in CONTRACT_NAMES if hasattr(module, k)}


def check_module(module):
    """The plan of an imported kernel module; KernelFileError when it breaks the contract."""
    result = plan(module_attrs(module))
    if not callable(getattr(module, "kernel_fn", None)):
        raise KernelFileError("kernel file defines no kernel_fn(...); it must take the "
                              "reference's arguments by name and return a new tensor")
    return result
