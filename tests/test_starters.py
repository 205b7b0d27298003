"""
Every starter kernel (kernels/<type>.py, whichever exist) and the shipped kernel.py pass the real
gate: bench.check runs all five stages in-process at the CPU shape sets, on the interpreter.

    uv run pytest tests/test_starters.py
"""
import pytest

import autokernel
import bench

STARTERS = [p for p in sorted(autokernel.KERNELS_DIR.glob("*.py"))
            if p.stem in autokernel.KERNEL_TYPES] + [autokernel.KERNEL_PY]


@pytest.mark.parametrize("path", STARTERS, ids=lambda p: p.relative_to(autokernel.ROOT).as_posix())
def test_starter_passes_the_gate(path):
    module = autokernel.load_module(path)
    result = bench.check(module)
    assert result["correctness"] == "PASS", result["reason"]
    assert all(status == "PASS" for status in result["stages"].values()), result["stages"]
    assert result["plan"]["kernel_type"] in autokernel.KERNEL_TYPES
