"""
The judge's reading of a kernel file before anything runs it (autokernel/source_check.py): every
way of leaving the kernel's own code it knows is refused by name, and every shipped starter and
honest test kernel passes. The gate's use of it (a FAIL row, reverted) is in test_bench.py.

    uv run pytest tests/test_source_check.py
"""
from pathlib import Path

import pytest

import autokernel
from autokernel.source_check import refusal

TESTS = Path(__file__).resolve().parent
ROOT = autokernel.ROOT

# The attack that passed every stage of the gate: the op guard switched off from inside.
GUARD_OFF = TESTS / "planted" / "guard_off.py"

DISPATCHER = "the dispatcher's internals"
PATCHING = "patching a module or a class"
FRAMES = "reading the caller's frames or the garbage collector"
PROCESSES = "starting or signalling a process"
LOADING = "loading code at run time or reaching Python's internals"
FILES = "writing files"
JUDGE = "the judge's own code"
TORCH_MATH = "torch doing the math"
MODULE = "a module kernel files do not use"

# (the kernel file's text, the rule that must name it, what the refusal must show)
FORBIDDEN = {
    "disable_current_modes_imported": (
        "from torch.utils._python_dispatch import _disable_current_modes\n", DISPATCHER,
        "_python_dispatch"),
    "torch_C_dispatch_off": ("import torch\n_off = torch._C._DisableTorchDispatch\n", DISPATCHER,
                             "torch._C._DisableTorchDispatch"),
    "torch_ops_aten": ("import torch\ndef kernel_fn(x):\n    return torch.ops.aten._softmax(x, -1,"
                       " False)\n", DISPATCHER, "torch.ops.aten._softmax"),
    "torch_library": ("import torch.library\n", DISPATCHER, "import torch.library"),
    "function_mode": ("from torch.overrides import TorchFunctionMode\n", DISPATCHER,
                      "torch.overrides"),
    "own_dispatch_mode": ("class Mode:\n    def __torch_dispatch__(self, *a):\n        pass\n",
                          DISPATCHER, "__torch_dispatch__"),
    "dispatch_through_triton": ("import triton.testing\n"
                                "f = triton.testing.torch.utils._python_dispatch\n",
                                DISPATCHER, "torch.utils._python_dispatch"),
    "torch_softmax": ("import torch\ndef kernel_fn(x):\n    return torch.softmax(x, -1)\n",
                      TORCH_MATH, "torch.softmax"),
    "functional_imported": ("import torch.nn.functional as F\n", TORCH_MATH,
                            "import torch.nn.functional"),
    "functional_named": ("from torch import softmax\n", TORCH_MATH, "import torch.softmax"),
    "star_import": ("from torch import *\n", TORCH_MATH, "import torch.*"),
    "torch_as_a_value": ("import torch\nt = [torch]\n", TORCH_MATH, "line 2, torch"),
    "tensor_method": ("def kernel_fn(x, dim=-1):\n    return x.sum(dim)\n", TORCH_MATH, "x.sum"),
    "tensor_method_by_literal_name": (
        "def kernel_fn(x):\n    return getattr(x, 'softmax')(-1)\n", TORCH_MATH, "getattr(x"),
    "tensor_cast": ("def kernel_fn(x):\n    return x.float()\n", TORCH_MATH, "x.float"),
    "tensor_method_from_its_class": ("def kernel_fn(x):\n    return type(x).exp(x)\n",
                                     TORCH_MATH, "type(x).exp"),
    "matmul_operator": ("def kernel_fn(A, B):\n    return A @ B\n", TORCH_MATH, "A @ B"),
    "arithmetic_on_a_view": ("def kernel_fn(x):\n    return x.view(-1) * 2\n", TORCH_MATH,
                             "x.view(-1) * 2"),
    "arithmetic_on_an_allocation": (
        "import torch\ndef kernel_fn(x):\n    y = torch.empty_like(x)\n    y += x\n    return y\n",
        TORCH_MATH, "y += x"),
    "builtin_sum_of_a_tensor": ("def kernel_fn(x):\n    return sum(x.view(-1))\n", TORCH_MATH,
                                "sum(x.view(-1))"),
    "compile": ("import torch\nfn = torch.compile(lambda x: x)\n", TORCH_MATH, "torch.compile"),
    "nn_functional_chain": ("import torch.nn as nn\nf = nn.functional.gelu\n", TORCH_MATH,
                            "torch.nn.functional.gelu"),
    "parameter_free_layer": ("import torch.nn as nn\nact = nn.GELU()\n", TORCH_MATH,
                             "torch.nn.GELU"),
    "patch_torch": ("import torch\ntorch.cuda.Event.elapsed_time = lambda self, end: 0.0\n",
                    PATCHING, "torch.cuda.Event.elapsed_time"),
    "patch_through_alias": ("import torch\nEvent = torch.cuda.Event\nEvent.record = None\n",
                            PATCHING, "torch.cuda.Event.record"),
    "setattr_on_torch": ("import torch\nsetattr(torch, 'empty', None)\n", PATCHING,
                         "torch (setattr)"),
    "patch_triton": ("import triton.testing\ntriton.testing.do_bench = None\n", PATCHING,
                     "triton.testing.do_bench"),
    "patch_tensor_class": ("def kernel_fn(x):\n    type(x).clone = None\n", PATCHING,
                           "type(x).clone"),
    "torch_flag": ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", PATCHING,
                   "torch.backends.cuda.matmul.allow_tf32"),
    "getframe": ("import sys\ndef kernel_fn(x):\n    return sys._getframe(1)\n", FRAMES,
                 "sys._getframe"),
    "frame_attribute": ("def kernel_fn(x, frame=None):\n    return frame.f_back\n", FRAMES,
                        ".f_back"),
    "inspect": ("import inspect\n", FRAMES, "import inspect"),
    "gc": ("from gc import get_objects\n", FRAMES, "import gc.get_objects"),
    "traceback": ("import traceback\n", FRAMES, "import traceback"),
    "subprocess": ("import subprocess\n", PROCESSES, "import subprocess"),
    "multiprocessing": ("import multiprocessing\n", PROCESSES, "import multiprocessing"),
    "os_system": ("import os\nos.system('git reset --hard')\n", PROCESSES, "os.system"),
    "os_fork": ("import os\npid = os.fork()\n", PROCESSES, "os.fork"),
    "os_exec": ("from os import execv\n", PROCESSES, "import os.execv"),
    "os_kill": ("import os\nos.kill(os.getppid(), 9)\n", PROCESSES, "os.kill"),
    "signal": ("import signal\n", PROCESSES, "import signal"),
    "os_through_triton": ("import triton\ntriton.compiler.os.system('x')\n", PROCESSES,
                          "os.system"),
    "ctypes": ("import ctypes\n", LOADING, "import ctypes"),
    "importlib": ("import importlib\n", LOADING, "import importlib"),
    "dunder_import": ("m = __import__('subprocess')\n", LOADING, "__import__"),
    "eval": ("eval('1 + 1')\n", LOADING, "eval"),
    "exec": ("exec('x = 1')\n", LOADING, "exec"),
    "compile_builtin": ("c = compile('x', 'f', 'exec')\n", LOADING, "compile"),
    "globals": ("globals()['KERNEL_NAME'] = 'other'\n", LOADING, "globals"),
    "builtins_module": ("import builtins\n", LOADING, "import builtins"),
    "builtins_name": ("b = __builtins__\n", LOADING, "__builtins__"),
    "subclasses": ("c = ().__class__.__base__.__subclasses__()\n", LOADING,
                   ".__subclasses__"),
    "sys_modules": ("import sys\nt = sys.modules['torch']\n", LOADING, "sys.modules"),
    "sys_path": ("import sys\nsys.path.insert(0, '/tmp')\n", LOADING, "sys.path"),
    "computed_getattr_on_torch": ("import torch\nname = 'soft' + 'max'\nf = getattr(torch, name)\n",
                                  LOADING, "getattr(torch, <a computed name>)"),
    "pickle": ("import pickle\n", LOADING, "import pickle"),
    "open_for_writing": ("open('results.tsv', 'w').write('')\n", FILES, "open('results.tsv'"),
    "open_by_a_computed_mode": ("mode = 'a'\nf = open('x', mode)\n", FILES, "open('x', mode)"),
    "os_remove": ("import os\nos.remove('results.tsv')\n", FILES, "os.remove"),
    "shutil": ("import shutil\n", FILES, "import shutil"),
    "judge_module": ("import autokernel.child\n", JUDGE, "import autokernel.child"),
    "judge_function": ("from autokernel.contract import load_module\n", JUDGE,
                       "autokernel.contract.load_module"),
    "judge_package": ("import autokernel.cuda_build\nautokernel.state.recover()\n", JUDGE,
                      "autokernel.state.recover"),
    "judge_script": ("import bench\n", JUDGE, "import bench"),
    "json": ("import json\n", MODULE, "import json"),
    "pathlib": ("from pathlib import Path\n", MODULE, "import pathlib.Path"),
    "patch_clock": ("import time\ntime.perf_counter = lambda: 0.0\n", PATCHING,
                    "time.perf_counter"),
    "sys_other": ("import sys\nx = sys.argv\n", MODULE, "sys.argv"),
}


def check(tmp_path, text, name="kernel.py"):
    path = tmp_path / name
    path.write_text(text)
    return refusal(path)


def test_the_guard_switched_off_is_refused_by_name():
    reason = refusal(GUARD_OFF)
    assert reason is not None and DISPATCHER in reason, reason
    assert "line 11, torch.utils._python_dispatch._disable_current_modes" in reason
    assert "\n" not in reason


@pytest.mark.parametrize("name", list(FORBIDDEN))
def test_a_forbidden_construct_is_refused_with_its_name(tmp_path, name):
    text, rule, shown = FORBIDDEN[name]
    reason = check(tmp_path, text)
    assert reason is not None and reason.startswith("source check: line "), (name, reason)
    assert rule in reason and shown in reason, (name, reason)


ALLOWED = '''import functools
import math
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl
import autokernel.cuda_build
from autokernel import cuda_build
from torch.utils.cpp_extension import load_inline

KERNEL_TYPE = "reduce"


@triton.jit
def _sum(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK), mask=tl.arange(0, BLOCK) < N)
    tl.store(y_ptr, x.to(tl.float32).sum(axis=0) * 2)


@functools.lru_cache
def _sms(device):
    return torch.cuda.get_device_properties(device).multi_processor_count


class Holder(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.proj = nn.Linear(n, n)

    def forward(self, x):
        return self.weight.view(-1)


def kernel_fn(x, dim=-1):
    if x.dim() == 0 or x.stride(-1) != 1 or x.dtype is torch.float16:
        x = x.contiguous()
    rows = math.prod(x.shape[:-1])
    y = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
    debug = os.environ.get("DEBUG") is not None
    _sum[(rows,)](x.reshape(rows, -1), y.view(-1), x.shape[-1], BLOCK=triton.next_power_of_2(8))
    return y if not debug else torch.flatten(y.transpose(0, -1).unsqueeze(0).squeeze(0), 0)
'''


def test_allocation_views_metadata_and_triton_pass(tmp_path):
    assert check(tmp_path, ALLOWED) is None


HONEST = sorted(  # the starters (kernels/<type>.py) are tests/test_starters.py's
    [p for p in (ROOT / "kernels").rglob("*.py") if p.parent != ROOT / "kernels"]
    + list((TESTS / "kernels_for_verify").glob("*.py"))
    + [TESTS / "kernelbench" / "solutions" / f"{n}.py" for n in ("1_softmax", "2_log_softmax",
                                                                   "4_relu", "5_scale_shift")]
    + [TESTS / "kernelbench" / "planted" / f"{n}.py" for n in ("scale_shift",
                                                               "scale_shift_own_init")]
    # the planted kernels whose fault only running shows: the gate must still see them run
    + [p for p in (TESTS / "planted").glob("*.py")
       if not p.stem.startswith("torch_") and p != GUARD_OFF]
    + [p for p in (TESTS / "planted_cuda").glob("*.py") if not p.stem.startswith("torch_")])


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_starter_and_honest_test_kernel_passes(path):
    assert refusal(path) is None


@pytest.mark.parametrize("path", sorted((TESTS / "attacks").glob("*.py"))
                         + sorted(TESTS.glob("planted*/torch_*.py")) + [GUARD_OFF],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_attack_and_torch_kernel_is_refused_before_it_runs(path):
    assert refusal(path) is not None


def test_a_repo_file_it_imports_is_read_by_the_same_rules(tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "mathy.py").write_text(
        "import torch\n\n\ndef norm(x):\n    return torch.nn.functional.normalize(x)\n")
    kernel = tmp_path / "kernel.py"
    kernel.write_text("from helpers.mathy import norm\n\nKERNEL_TYPE = 'softmax'\n")
    reason = refusal(kernel, root=tmp_path)
    assert reason.startswith("source check: helpers/mathy.py (imported at line 1): line 5, "
                             "torch.nn.functional.normalize: torch doing the math"), reason
    (tmp_path / "helpers" / "mathy.py").write_text("def norm(x):\n    return x\n")
    assert refusal(kernel, root=tmp_path) is None


def test_a_module_that_is_nowhere_is_left_to_the_import_error(tmp_path):
    assert check(tmp_path, "import triton_kernels_that_do_not_exist\n") is None
