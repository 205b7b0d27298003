"""Tests run on the CPU through Triton's interpreter: set it before anything imports triton,
and put the repo root on sys.path so tests import the scripts as modules."""
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The session's workspace is a temporary folder: tests never touch a night's prepare.json,
# logs or build cache. Only this process: scripts the tests run in a repo copy use the copy's.
os.environ["AUTOKERNEL_WORKSPACE"] = tempfile.mkdtemp(prefix="autokernel_test_ws_")
atexit.register(shutil.rmtree, os.environ["AUTOKERNEL_WORKSPACE"], ignore_errors=True)
import autokernel  # noqa: E402,F401  (loads the stdlib `profile` before ours can shadow it)
del os.environ["AUTOKERNEL_WORKSPACE"]


# The files that take longest on two cores, longest first (measured with --durations): with
# `--dist loadfile --no-loadscope-reorder` (pyproject.toml) each worker takes the next file when
# it runs short, so starting with the long ones leaves short files for the end and the two
# workers finish together.
LONGEST_FIRST = ["test_bench.py", "test_cuda_backend.py", "test_verify.py", "test_overnight.py",
                 "test_program.py", "test_ops.py", "test_starters.py", "test_sandbox.py",
                 "test_generation.py", "test_hf_models.py", "test_region_kernels.py",
                 "test_mem_kernels.py", "test_kernels_compute.py", "test_kernelbench.py",
                 "test_bench_starters.py", "test_profile.py", "test_extract.py", "test_fusion.py",
                 "test_export.py", "test_swap.py", "test_region_layout.py", "test_patterns.py",
                 "test_rocm.py", "test_swap_graph.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
