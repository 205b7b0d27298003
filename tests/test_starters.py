"""
Every starter kernel (kernels/<type>.py, whichever exist) and the shipped kernel.py pass the real
gate: autokernel.gate runs all five stages in-process at the CPU shape sets, on the interpreter.

    uv run pytest tests/test_starters.py
"""
import pytest

import autokernel
from autokernel import gate
from autokernel.child import Runner
from autokernel.contract import check_module, load_module

STARTERS = [p for p in sorted(autokernel.KERNELS_DIR.glob("*.py"))
            if p.stem in autokernel.KERNEL_TYPES] + [autokernel.KERNEL_PY]


@pytest.mark.parametrize("path", STARTERS, ids=lambda p: p.relative_to(autokernel.ROOT).as_posix())
def test_starter_passes_the_gate(path):
    module = load_module(path)
    plan = check_module(module)
    assert plan["kernel_type"] in autokernel.KERNEL_TYPES
    result = gate.check(Runner(module.kernel_fn), plan)
    assert result["correctness"] == "PASS", result["reason"]
    assert all(status == "PASS" for status in result["stages"].values()), result["stages"]
