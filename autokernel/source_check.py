"""
The judge reads a kernel file before anything runs it, and refuses the ways a kernel file could
leave its own code. `refusal(path)` parses the file (ast: nothing in it is imported or run here)
and answers None or one line naming the first construct refused and why:

    source check: line 9, torch.utils._python_dispatch._disable_current_modes: the dispatcher's
    internals (...)

RULES is the whole policy, read top to bottom: the first rule that matches a use names it. From
torch a kernel file takes only what ALLOWED_TORCH lists (allocation, views and metadata, dtypes,
torch.cuda's device helpers, nn's parameter holders, cpp_extension for the CUDA backend); other
modules only those of ALLOWED_MODULES, and files of the repo it imports (kernels/<type>.py, ...)
are read by the same rules. A tensor method that computes (x.sum(), x @ y, x.float()) is refused
where the receiver is evidently a tensor: a function's parameter, a torch allocation, or what is
computed from them; inside @triton.jit functions (Triton's tensors) methods are Triton's own.
Two places take more: a class's __init__ may do tensor math (a ModelNew draws its parameters
there, once, outside the op guard), and a region's kernel file (KERNEL_TYPE = "region") may
call the libraries' convolutions and GEMMs (REGION_LIBRARY), which its guard lets through.

This is a line of defence beside the child's op guard (autokernel/child.py): the guard sees the
ops a kernel runs, this sees the code that would reach past the guard (switching it off, patching
torch, reading the judge's frames). What only running shows stays the guard's, the snapshot's and
the sandbox's.
"""
import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import autokernel as ak

# ---- what a kernel file may use -------------------------------------------------------------

ALLOWED_TORCH = frozenset(
    # allocation (and the random draws a KernelBench ModelNew makes its parameters with)
    ["torch." + n for n in ("empty", "empty_like", "empty_strided", "zeros", "zeros_like",
                            "ones", "ones_like", "full", "full_like", "arange", "tensor",
                            "randn", "rand", "randint", "no_grad", "inference_mode")]
    # views, as functions (a region starter keeps its reference's torch.flatten(x, 1))
    + ["torch." + n for n in ("flatten", "unflatten", "reshape", "permute", "transpose", "t",
                              "squeeze", "unsqueeze", "movedim", "narrow", "select", "chunk",
                              "split", "unbind")]
    # dtypes and metadata
    + ["torch." + n for n in ("float16", "half", "bfloat16", "float32", "float", "float64",
                              "double", "int8", "uint8", "int16", "short", "int32", "int",
                              "int64", "long", "bool", "float8_e4m3fn", "float8_e5m2",
                              "float8_e4m3fnuz", "float8_e5m2fnuz", "dtype", "finfo", "iinfo",
                              "Tensor", "Size", "device", "channels_last",
                              "contiguous_format", "is_tensor", "is_floating_point",
                              "numel", "get_default_dtype", "promote_types", "__version__",
                              "version.cuda", "version.hip")]
    # torch.cuda's device and stream helpers
    + ["torch.cuda." + n for n in ("is_available", "current_device", "device_count", "device",
                                   "get_device_name", "get_device_capability",
                                   "get_device_properties", "current_stream", "default_stream",
                                   "stream", "Stream", "Event", "set_device", "synchronize")]
    # nn's containers, and the layers a KernelBench ModelNew builds to hold its parameters as
    # Model does (calling one runs torch's math: the op guard refuses that)
    + ["torch.nn." + n for n in ("Module", "Parameter", "ModuleList", "ModuleDict",
                                 "ParameterList", "ParameterDict", "Linear", "Bilinear",
                                 "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
                                 "ConvTranspose2d", "ConvTranspose3d", "LayerNorm", "GroupNorm",
                                 "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
                                 "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
                                 "Embedding", "EmbeddingBag")]
    # the CUDA backend's compile (autokernel/cuda_build.py wraps it)
    + ["torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load"])
# What a region's kernel file (KERNEL_TYPE = "region") may also call: the vendor libraries'
# convolutions and GEMMs, which its op guard lets through and counts (autokernel/region_kind.py).
REGION_LIBRARY = frozenset(
    ["torch." + n for n in ("conv1d", "conv2d", "conv3d", "conv_transpose1d",
                            "conv_transpose2d", "conv_transpose3d", "matmul", "mm", "bmm",
                            "addmm", "baddbmm")]
    + ["torch.nn.functional." + n for n in ("conv1d", "conv2d", "conv3d", "conv_transpose1d",
                                            "conv_transpose2d", "conv_transpose3d", "linear")])
# Uses that are tensor math, allowed in a class's __init__: a ModelNew draws and shapes its
# parameters there once, and the child builds it outside the op guard (autokernel/child.py).
TENSOR_MATH = ("method", "operator", "computing")
TORCH_ALLOCATIONS = frozenset(p for p in ALLOWED_TORCH if p.split(".")[1] in (
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "arange", "tensor", "randn", "rand", "randint"))
# Tensor methods that allocate, view or read metadata (autokernel/child.ALLOWED_OPS's methods);
# every other method of torch.Tensor computes.
TENSOR_METHODS = frozenset((
    "view", "view_as", "reshape", "reshape_as", "contiguous", "as_strided", "expand",
    "expand_as", "t", "transpose", "permute", "squeeze", "unsqueeze", "select", "narrow",
    "unbind", "split", "split_with_sizes", "chunk", "unflatten", "flatten", "movedim", "detach",
    "unfold", "size", "stride", "dim", "ndimension", "numel", "nelement", "element_size", "data_ptr",
    "storage_offset", "untyped_storage", "is_contiguous", "is_same_size", "is_floating_point",
    "is_complex", "get_device", "type", "item", "new_empty", "new_empty_strided", "new_zeros",
    "new_ones", "new_full", "fill_", "zero_", "record_stream", "requires_grad_"))
VIEWS = frozenset(("view", "view_as", "reshape", "reshape_as", "contiguous", "as_strided",
                   "expand", "expand_as", "t", "transpose", "permute", "squeeze", "unsqueeze",
                   "narrow", "unflatten", "flatten", "movedim", "unfold", "detach", "new_empty",
                   "new_empty_strided", "new_zeros", "new_ones", "new_full"))
ALLOWED_MODULES = ("torch", "triton", "math", "functools", "itertools", "heapq", "bisect",
                   "weakref", "dataclasses", "typing", "collections", "enum", "numbers", "abc",
                   "warnings", "contextlib", "time", "os", "sys", "__future__")
SYS_ALLOWED = frozenset(("version_info", "version", "hexversion", "platform", "maxsize",
                         "byteorder", "float_info", "int_info", "implementation", "stdout",
                         "stderr", "getsizeof", "exit"))
ALLOWED_DUNDERS = frozenset(("__init__", "__name__", "__qualname__", "__doc__", "__class__",
                             "__file__"))
JUDGE_ALLOWED = "autokernel.cuda_build"  # the CUDA backend's build helper

# ---- what is refused, by name ---------------------------------------------------------------

DISPATCH = ("torch._C", "torch.ops", "torch._ops", "torch.library", "torch.overrides",
            "torch.utils._python_dispatch", "torch._dispatch", "torch._subclasses",
            "torch._prims", "torch._refs", "torch._decomp", "torch._dynamo", "torch._inductor",
            "torch._higher_order_ops", "torch.fx")
DISPATCH_NAMES = frozenset(("_python_dispatch", "_disable_current_modes", "_pop_mode",
                            "_push_mode", "_pop_mode_temporarily", "_get_current_dispatch_mode",
                            "_DisableTorchDispatch", "DisableTorchFunction",
                            "DisableTorchFunctionSubclass", "TorchDispatchMode",
                            "TorchFunctionMode", "__torch_dispatch__", "__torch_function__"))
FRAME_MODULES = ("inspect", "gc", "traceback")
FRAME_NAMES = frozenset(("f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace",
                         "tb_frame", "tb_next", "gi_frame", "cr_frame", "ag_frame", "gi_code",
                         "cr_code", "__traceback__"))
SYS_FRAMES = frozenset(("_getframe", "_current_frames", "settrace", "setprofile", "gettrace",
                        "getprofile", "exc_info", "exception", "last_traceback", "monitoring",
                        "getrefcount"))
PROCESS_MODULES = ("subprocess", "multiprocessing", "concurrent", "signal", "pty", "asyncio",
                   "threading", "_thread", "torch.multiprocessing")
OS_PROCESS = frozenset(("system", "popen", "fork", "forkpty", "kill", "killpg", "setsid",
                        "setpgid", "setpgrp", "posix_spawn", "posix_spawnp", "pidfd_open",
                        "pidfd_send_signal", "register_at_fork", "wait", "waitpid", "wait3",
                        "wait4", "waitid"))
OS_PROCESS_PREFIXES = ("exec", "spawn")
CODE_MODULES = ("importlib", "runpy", "code", "codeop", "pickle", "marshal", "ctypes", "cffi",
                "types", "zipimport", "pkgutil", "builtins", "imp", "__main__", "site")
SYS_CODE = frozenset(("modules", "meta_path", "path", "path_hooks", "path_importer_cache",
                      "addaudithook", "setrecursionlimit", "setswitchinterval", "breakpointhook",
                      "displayhook", "excepthook", "unraisablehook"))
CODE_BUILTINS = frozenset(("eval", "exec", "compile", "__import__", "globals", "vars",
                           "breakpoint", "__builtins__", "__loader__", "__spec__"))
FILE_MODULES = ("shutil", "tempfile")
OS_FILES = frozenset(("remove", "unlink", "rename", "renames", "replace", "rmdir", "removedirs",
                      "mkdir", "makedirs", "chmod", "chown", "lchown", "truncate", "ftruncate",
                      "symlink", "link", "write", "open", "utime", "mkfifo", "mknod", "chdir"))
FILE_METHODS = frozenset(("write_text", "write_bytes", "touch", "unlink", "mkdir", "rmdir",
                          "symlink_to", "hardlink_to", "chmod"))
COMPUTING_BUILTINS = frozenset(("sum", "abs", "max", "min", "pow", "round", "divmod", "sorted",
                                "any", "all"))
# A chain that passes through one of these (triton.testing.torch.softmax, a module's os.system)
# is judged from there.
REROOT = frozenset(("torch", "os", "sys", "autokernel") + FRAME_MODULES + PROCESS_MODULES[:-1]
                   + CODE_MODULES + FILE_MODULES)


@dataclass
class Use:
    """One thing the file uses. kind: import, chain (a module's attribute, resolved through
    imports and aliases), store (an assignment to one), name (a builtin), attr (any attribute
    by name), method (a tensor method), operator, call (open, getattr, ...)."""
    kind: str
    what: str
    line: int
    col: int = 0


def under(path, *prefixes):
    return any(path == p or path.startswith(p + ".") for p in prefixes)


def is_allowed_torch(path, imported=False):
    if path in ALLOWED_TORCH:
        return True
    return imported and any(p.startswith(path + ".") for p in ALLOWED_TORCH)


def dispatcher(u):
    if u.kind in ("import", "chain", "store"):
        return under(u.what, *DISPATCH) or bool(DISPATCH_NAMES & set(u.what.split(".")))
    return u.kind == "attr" and u.what in DISPATCH_NAMES


def patches(u):
    return u.kind == "store"


def frames(u):
    if u.kind in ("import", "chain"):
        return under(u.what, *FRAME_MODULES) or (
            under(u.what, "sys") and u.what.split(".")[1:2] and u.what.split(".")[1] in SYS_FRAMES)
    return u.kind == "attr" and u.what in FRAME_NAMES


def processes(u):
    if u.kind not in ("import", "chain"):
        return False
    name = u.what.split(".")[1] if under(u.what, "os") and "." in u.what else ""
    return under(u.what, *PROCESS_MODULES) or name in OS_PROCESS \
        or name.startswith(OS_PROCESS_PREFIXES)


def loads_code(u):
    if u.kind in ("import", "chain"):
        return under(u.what, *CODE_MODULES) or (
            under(u.what, "sys") and "." in u.what and u.what.split(".")[1] in SYS_CODE)
    if u.kind == "name":
        return u.what in CODE_BUILTINS
    if u.kind == "attr":
        return u.what.startswith("__") and u.what.endswith("__") \
            and u.what not in ALLOWED_DUNDERS
    return u.kind == "call" and u.what.startswith(("getattr", "setattr", "delattr", "hasattr"))


def writes_files(u):
    if u.kind in ("import", "chain"):
        return under(u.what, *FILE_MODULES) or (
            under(u.what, "os") and "." in u.what and u.what.split(".")[1] in OS_FILES)
    if u.kind == "attr":
        return u.what in FILE_METHODS
    return u.kind in ("call", "name") and u.what.startswith("open")


def judges_code(u):
    return u.kind in ("import", "chain") and under(u.what, "autokernel", "<judge>") \
        and not under(u.what, JUDGE_ALLOWED)


def torch_math(u):
    if u.kind in ("method", "operator", "computing"):
        return True
    return u.kind in ("import", "chain") and under(u.what, "torch") \
        and not is_allowed_torch(u.what, imported=u.kind == "import")


def other_module(u):
    if u.kind == "import":
        top = u.what.split(".")[0]
        return top not in ALLOWED_MODULES + ("<repo>", "<missing>") \
            and not under(u.what, JUDGE_ALLOWED)
    return u.kind == "chain" and (u.what in ("os", "sys") or (
        under(u.what, "sys") and u.what.split(".")[1] not in SYS_ALLOWED))


@dataclass
class Rule:
    matches: object  # Use -> bool
    refuses: str     # what the file was doing, as the refusal names it


RULES = [
    Rule(dispatcher, "the dispatcher's internals (the op guard and torch's dispatch are the "
                     "judge's)"),
    Rule(patches, "patching a module or a class the kernel file did not define"),
    Rule(frames, "reading the caller's frames or the garbage collector"),
    Rule(processes, "starting or signalling a process"),
    Rule(loads_code, "loading code at run time or reaching Python's internals"),
    Rule(writes_files, "writing files"),
    Rule(judges_code, f"the judge's own code (of autokernel/ a kernel file imports "
                      f"{JUDGE_ALLOWED.split('.')[1]} alone)"),
    Rule(torch_math, "torch doing the math (a kernel file takes from torch only allocation, "
                     "views, metadata, dtypes and device helpers: the math is its own kernels')"),
    Rule(other_module, "a module kernel files do not use (they import torch, triton, the repo's "
                       "kernels and the few modules of source_check.ALLOWED_MODULES)"),
]


# ---- the check ------------------------------------------------------------------------------

def refusal(path, root=None, _seen=None):
    """None when the kernel file at `path` (and the repo files it imports) uses nothing RULES
    refuses; else one line naming the first use refused. A file that does not parse is left to
    the contract's syntax error."""
    path, root = Path(path).resolve(), Path(root or ak.ROOT).resolve()
    seen = _seen if _seen is not None else set()
    seen.add(path)
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except (SyntaxError, ValueError):
        return None
    except (RecursionError, MemoryError):
        return "source check: the file is nested too deeply to read"
    reader = Reader(path, root)
    try:
        reader.visit(tree)
    except RecursionError:
        return "source check: the file is nested too deeply to read"
    for use in sorted(reader.uses, key=lambda u: (u.line, u.col)):
        for rule in RULES:
            if rule.matches(use):
                return f"source check: line {use.line}, {shown(use)}: {rule.refuses}"
    for line, module in reader.repo_imports:
        if module in seen:
            continue
        nested = refusal(module, root, seen)
        if nested:
            where = module.relative_to(root) if module.is_relative_to(root) else module
            return nested.replace("source check: ", f"source check: {where} (imported at line "
                                                    f"{line}): ", 1)
    return None


def shown(use):
    what = use.what.replace("<judge>.", "").replace("<missing>.", "").replace("<repo>.", "")
    return {"import": f"import {what}", "store": f"assignment to {what}",
            "name": what, "attr": f".{what}"}.get(use.kind, what)


@functools.cache
def computing_methods():
    """(every method of torch.Tensor that computes, those of them no builtin type has): the
    first set is refused on what is surely a tensor, the second on what may be one."""
    import torch
    names = {n for n in dir(torch.Tensor) if not n.startswith("_")
             and callable(getattr(torch.Tensor, n, None))} - TENSOR_METHODS
    builtin = set().union(*(dir(t) for t in (int, float, str, bytes, list, dict, set, tuple)))
    return frozenset(names), frozenset(names - builtin)


class Reader(ast.NodeVisitor):
    """Walks one file, collecting its uses in `uses` and the repo files it imports in
    `repo_imports` ([(line, path)])."""

    def __init__(self, path, root):
        self.path, self.root = path, root
        self.uses, self.repo_imports = [], []
        self.bound = {}      # name -> the module path an import or alias binds it to
        self.defined = set()  # every name the file binds (what is left is a builtin)
        self.scopes = [Scope(self, jit=False)]
        self.library = frozenset()  # REGION_LIBRARY in a region's kernel file

    def use(self, kind, what, node):
        if (kind in TENSOR_MATH and self.scopes[-1].init) or \
                (kind == "chain" and what in self.library):
            return
        self.uses.append(Use(kind, what, getattr(node, "lineno", 0),
                             getattr(node, "col_offset", 0)))

    # -- the file's bindings, read once before the walk

    def visit_Module(self, node):
        for sub in node.body:
            if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and
                                                   t.id == "KERNEL_TYPE" for t in sub.targets) \
                    and isinstance(sub.value, ast.Constant) and sub.value.value == "region":
                self.library = REGION_LIBRARY
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                for alias in sub.names:
                    if isinstance(sub, ast.ImportFrom) or alias.asname:
                        if alias.name != "*":
                            self.bound[alias.asname or alias.name] = self.imported(sub, alias)
                    else:  # `import a.b.c` binds a
                        top = alias.name.split(".")[0]
                        self.bound[top] = self.place(top)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                self.defined.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(sub.name)
            elif isinstance(sub, ast.arg):
                self.defined.add(sub.arg)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                self.defined.add(sub.name)
        self.defined |= set(self.bound)
        for _ in range(5):  # aliases: `E = torch.cuda.Event`, `F = getattr(torch.nn, "x")`
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and len(sub.targets) == 1 \
                        and isinstance(sub.targets[0], ast.Name) \
                        and sub.targets[0].id not in self.bound:
                    path = self.chain(sub.value)
                    if path:
                        self.bound[sub.targets[0].id] = path
        self.scopes[0].collect(node.body)
        self.generic_visit(node)

    def imported(self, node, alias):
        """The dotted path an import names (see place)."""
        module = (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative to the importing file's package
                base = self.path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                try:
                    package = ".".join(base.relative_to(self.root).parts)
                except ValueError:
                    package = ""
                module = ".".join(p for p in (package, module) if p)
            full = f"{module}.{alias.name}" if alias.name != "*" else f"{module}.*"
        else:
            full = module
        return self.place(full)

    def place(self, full):
        """`full`, prefixed `<judge>.` for the repo's scripts, `<repo>.` for its other files and
        `<missing>.` for a module that is nowhere (the child's import error names it)."""
        top = full.split(".")[0]
        if top == "autokernel":
            return full
        if (self.root / f"{top}.py").is_file() and top != "kernel":
            return f"<judge>.{full}"  # the repo's scripts: bench.py, verify.py, ...
        if (self.root / top).is_dir():
            return f"<repo>.{full}"
        if top in ALLOWED_MODULES or top in REROOT:
            return full
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        return full if found else f"<missing>.{full}"

    def repo_file(self, full):
        """The repo file a `<repo>.` import reads (the longest dotted prefix that is a file)."""
        parts = full.split(".")[1:]
        for n in range(len(parts), 0, -1):
            base = self.root.joinpath(*parts[:n])
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
        return None

    # -- chains: a module's attributes

    def chain(self, node):
        """The resolved dotted path of `node` when it is a module (or an attribute of one),
        re-rooted at the last module it passes through; else None."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "getattr" and node.func.id not in self.defined \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            base = self.chain(node.args[0])
            return base and ".".join([base, node.args[1].value] + attrs[::-1])
        if not isinstance(node, ast.Name) or node.id not in self.bound:
            return None
        parts = self.bound[node.id].split(".") + attrs[::-1]
        for i in range(len(parts) - 1, 0, -1):
            if parts[i] in REROOT and parts[i - 1] not in ("<judge>", "<repo>", "<missing>"):
                return ".".join(parts[i:])
        return ".".join(parts)

    # -- the walk

    def visit_Import(self, node):
        for alias in node.names:
            self.import_use(self.imported(node, alias), node)

    def visit_ImportFrom(self, node):
        for alias in node.names:
            self.import_use(self.imported(node, alias), node)

    def import_use(self, full, node):
        if full.startswith("<repo>."):  # read by the same rules (one that is not there
            module = self.repo_file(full)  # fails to import in the child)
            if module is not None:
                self.repo_imports.append((node.lineno, module))
            return
        self.use("import", full, node)

    def visit_Attribute(self, node):
        path = self.chain(node)
        if path:
            self.use("store" if isinstance(node.ctx, (ast.Store, ast.Del)) else "chain", path,
                     node)
            return
        scope = self.scopes[-1]
        if isinstance(node.ctx, (ast.Store, ast.Del)) and scope.is_class_of(node.value):
            self.use("store", f"{ast.unparse(node)}", node)  # named before the attribute
        self.use("attr", node.attr, node)
        if not scope.jit and isinstance(node.ctx, ast.Load):
            surely, maybe = computing_methods()
            if (node.attr in surely and scope.tensor(node.value)) or \
                    (node.attr in maybe and scope.maybe_tensor(node.value)):
                self.use("method", short(node), node)
        self.visit(node.value)

    def visit_Name(self, node):
        if not isinstance(node.ctx, ast.Load):
            return
        if node.id in self.bound:
            self.use("chain", self.chain(node), node)
        elif node.id not in self.defined:
            self.use("name", node.id, node)

    def visit_Call(self, node):
        func = node.func.id if isinstance(node.func, ast.Name) \
            and node.func.id not in self.defined else None  # a builtin's name
        scope = self.scopes[-1]
        if func in ("getattr", "setattr", "delattr", "hasattr") and node.args:
            self.reflection(func, node, scope)
        elif func == "open" and not read_only(node):
            self.use("call", short(node, 60), node)
        elif func in COMPUTING_BUILTINS and not scope.jit \
                and any(scope.tensor(a) for a in node.args):
            self.use("computing", short(node), node)
        resolved = self.chain(node) if func == "getattr" else None
        if resolved:  # getattr(module, "name"): that attribute, as if written out
            self.use("chain", resolved, node)
        if func != "open":  # a read-only open() is fine
            self.visit(node.func)
        for sub in node.args[2 if resolved else 0:] + node.keywords:
            self.visit(sub)

    def reflection(self, func, node, scope):
        """getattr/setattr/delattr/hasattr: on a module or a class reached from an object they
        patch or read by a computed name; on a tensor, a literal name is its method."""
        target, obj = self.chain(node.args[0]), node.args[0]
        literal = len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
            and isinstance(node.args[1].value, str)
        if func in ("setattr", "delattr") and (target or scope.is_class_of(obj)):
            self.use("store", f"{target or ast.unparse(obj)} ({func})", node)
        elif not literal and (target or scope.maybe_tensor(obj)):
            self.use("call", f"{func}({ast.unparse(obj)}, <a computed name>)", node)
        elif literal and not scope.jit and scope.maybe_tensor(obj) \
                and node.args[1].value in computing_methods()[1]:
            self.use("method", short(node), node)

    def visit_BinOp(self, node):
        scope = self.scopes[-1]
        if not scope.jit and (isinstance(node.op, ast.MatMult) or scope.tensor(node.left)
                              or scope.tensor(node.right)):
            self.use("operator", short(node), node)
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if not self.scopes[-1].jit and not isinstance(node.op, ast.Not) \
                and self.scopes[-1].tensor(node.operand):
            self.use("operator", short(node), node)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        if not self.scopes[-1].jit and (isinstance(node.op, ast.MatMult)
                                        or self.scopes[-1].tensor(node.target)):
            self.use("operator", short(node), node)
        self.generic_visit(node)

    def visit_Compare(self, node):
        scope = self.scopes[-1]
        identity = all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
        if not scope.jit and not identity and any(scope.tensor(e)
                                                  for e in [node.left, *node.comparators]):
            self.use("operator", short(node), node)
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        if node.name in DISPATCH_NAMES:
            self.use("attr", node.name, node)
        for sub in node.decorator_list + [node.args, node.returns]:
            if sub is not None:
                self.visit(sub)
        outer = self.scopes[-1]
        jit = outer.jit or any(under(self.chain(d.func if isinstance(d, ast.Call) else d)
                                     or "", "triton") for d in node.decorator_list)
        params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        params += [a.arg for a in (node.args.vararg, node.args.kwarg) if a is not None]
        owner = params[0] if outer.in_class and params else None
        scope = Scope(self, jit=jit, parent=outer, params=set(params) - {owner},
                      owner=owner)
        scope.init = outer.in_class and node.name == "__init__"
        scope.collect(node.body)
        self.scopes.append(scope)
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        outer = self.scopes[-1]
        self.scopes.append(Scope(self, jit=outer.jit, parent=outer,
                                 params={a.arg for a in node.args.args}))
        self.visit(node.body)
        self.scopes.pop()

    def visit_ClassDef(self, node):
        for sub in node.bases + node.keywords + node.decorator_list:
            self.visit(sub)
        outer = self.scopes[-1]
        self.scopes.append(Scope(self, jit=outer.jit, parent=outer, in_class=True))
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()


class Scope:
    """A function's (or the module's) names that hold tensors: surely (a torch allocation, a
    view of a tensor, what is computed from one) or maybe (its parameters and what is taken
    from them). `owner`: a method's self, whose attributes may be tensors (nn.Parameter)."""

    def __init__(self, reader, jit, parent=None, params=(), owner=None, in_class=False):
        self.reader, self.jit, self.parent = reader, jit, parent
        self.owner, self.in_class, self.init = owner, in_class, False
        self.sure, self.maybe = set(), set(params)

    def collect(self, body):
        assigns = [n for statement in body for n in walk_scope(statement)
                   if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
        for _ in range(3):
            for n in assigns:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names = {name for target in targets for name in bound_names(target)}
                if self.tensor(n.value):
                    self.sure |= names
                elif self.maybe_tensor(n.value):
                    self.maybe |= names

    def names(self, kind):
        scope, found = self, set()
        while scope is not None:
            found |= getattr(scope, kind)
            scope = scope.parent
        return found

    def tensor(self, e):
        """Surely a tensor: a torch allocation, a view of a tensor, a name holding one."""
        if isinstance(e, ast.Call):
            path = self.reader.chain(e.func)
            if path in TORCH_ALLOCATIONS:
                return True
            return isinstance(e.func, ast.Attribute) and e.func.attr in VIEWS \
                and self.maybe_tensor(e.func.value)
        if isinstance(e, ast.Subscript):
            return self.tensor(e.value)
        if isinstance(e, ast.Attribute):
            return e.attr in ("T", "mT", "H", "mH", "data", "real", "imag") \
                and self.tensor(e.value)
        if isinstance(e, ast.BinOp):
            return self.tensor(e.left) or self.tensor(e.right)
        return isinstance(e, ast.Name) and e.id in self.names("sure") \
            and e.id not in self.reader.bound

    def maybe_tensor(self, e):
        if self.tensor(e):
            return True
        depth, node = 0, e
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "type":
                return True
            depth += isinstance(node, ast.Attribute)
            node = node.func if isinstance(node, ast.Call) else node.value
        if not isinstance(node, ast.Name) or node.id in self.reader.bound:
            return False
        owners = {s.owner for s in self.chain_of_scopes()} - {None}
        return node.id in self.names("maybe") or (node.id in owners and depth > 0)

    def is_class_of(self, e):
        """A class reached from an object (type(x), x.__class__): patching it patches torch's."""
        while isinstance(e, (ast.Attribute, ast.Subscript)):
            if isinstance(e, ast.Attribute) and e.attr == "__class__":
                return True
            e = e.value
        return isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "type"

    def chain_of_scopes(self):
        scope = self
        while scope is not None:
            yield scope
            scope = scope.parent


def walk_scope(node):
    """ast.walk that stays in one scope (nested functions, lambdas and classes are theirs)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                  ast.ClassDef)):
            yield from walk_scope(child)


def bound_names(target):
    """The names an assignment target binds (not those inside `a[i] = ...` or `a.b = ...`)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return bound_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in bound_names(e)]
    return []


def read_only(call):
    """Whether an open(...) call's mode is a literal that only reads."""
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), ast.Constant("r"))
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) \
        and not set(mode.value) & set("wax+")


def short(node, limit=50):
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
