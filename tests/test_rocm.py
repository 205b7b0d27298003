"""AMD GPUs (torch's ROCm build): the starters take no NVIDIA-only path there (TMA, the Gluon
Hopper kernel, maxnreg, tf32 dot precisions, pipelines deeper than an AMD GPU's LDS holds), and
every Triton starter compiles for an AMD target with Triton's HIP backend
(tests/amd_compile.py; no AMD GPU needed, nothing runs)."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import autokernel
from autokernel.contract import load_module

HERE = os.path.dirname(os.path.abspath(__file__))


def _starter(name):
    return load_module(autokernel.ROOT / "kernels" / f"{name}.py", f"rocm_{name}")


@pytest.mark.parametrize("hip, capability, nvidia_paths", [
    (None, (9, 0), True),       # an H100
    ("6.4", (9, 4), False),     # an MI300X: ROCm reports gfx942 as 9.4
    ("6.4", (9, 0), False),     # an MI200 (gfx90a)
])
def test_hopper_paths_are_taken_on_nvidia_only(monkeypatch, hip, capability, nvidia_paths):
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    props = SimpleNamespace(major=capability[0], minor=capability[1], multi_processor_count=304,
                            L2_cache_size=4 << 20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    attention = _starter("flash_attention")
    for name in ("matmul", "fused_mlp", "flash_attention"):
        module = _starter(name)
        module._device_has_tma.cache_clear()
        assert module._device_has_tma(0) is nvidia_paths, name
        precision = module._dot_precision(torch.float32)
        assert precision == ("tf32x3" if nvidia_paths else "ieee"), name
    attention._hopper_device.cache_clear()
    assert (attention._hopper_device(0) is not None) is nvidia_paths
    matmul = _starter("matmul")
    matmul._hopper_device.cache_clear()
    assert matmul._hopper_device(0) is nvidia_paths


def _compile(*args):
    pytest.importorskip("triton.backends.amd.compiler", reason="this triton has no HIP backend")
    env = dict(os.environ, TRITON_INTERPRET="0")
    return subprocess.run([sys.executable, os.path.join(HERE, "amd_compile.py"), *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_every_triton_starter_compiles_for_an_mi300():
    """gfx942 (MI300X, MI325X): 64 KiB of LDS, where the H100 has 228 KiB of shared memory."""
    done = _compile("gfx942")
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert len(lines) == 2 * len(autokernel.KERNEL_TYPES) + 1
    assert all(" compiled for gfx942 " in line for line in lines)


def test_the_check_fails_where_a_starter_makes_nvidia_choices():
    """gfx950 (MI350X, MI355X): its Triton takes neither tf32 form."""
    done = _compile("gfx950", "--as-nvidia", "--types", "matmul")
    assert done.returncode == 1
    assert done.stdout.count("FAILED") == 2 and "Got tf32" in done.stdout, done.stdout
