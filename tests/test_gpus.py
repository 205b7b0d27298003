"""The GPU database (autokernel/gpus.py): every accelerator the product names is found under the
name torch gives it, with its datasheet numbers and a source; variants (SUPER, Ti, laptop parts)
are never taken for the card they extend; partitions get their share; unknown GPUs are
estimated with the vendor's per-clock rate."""
import pytest

from autokernel import gpus
from autokernel.gpus import GPU_SPECS, gpu_spec

# The name torch reports -> (the spec's name, dense fp16/bf16 TFLOP/s, bandwidth GB/s).
NAMED = {
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 989.4, 3350),
    "NVIDIA H100 PCIe": ("H100 PCIe", 756.4, 2000),
    "NVIDIA H100 NVL": ("H100 NVL", 835.5, 3900),
    "NVIDIA H200": ("H200 SXM", 989.4, 4800),
    "NVIDIA H200 NVL": ("H200 NVL", 835.5, 4800),
    "NVIDIA GH200 480GB": ("GH200", 989.4, 4000),
    "NVIDIA A100-SXM4-80GB": ("A100 SXM 80GB", 312, 2039),
    "NVIDIA A100-SXM4-40GB": ("A100 40GB", 312, 1555),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe 80GB", 312, 1935),
    "NVIDIA A100-PCIE-40GB": ("A100 PCIe 40GB", 312, 1555),
    "NVIDIA L40S": ("L40S", 362.05, 864),
    "NVIDIA L40": ("L40", 181.05, 864),
    "NVIDIA L4": ("L4", 121, 300),
    "NVIDIA A10": ("A10", 125, 600),
    "NVIDIA A10G": ("A10G", 70, 600),
    "Tesla T4": ("T4", 65, 320),
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 165.2, 1008),
    "NVIDIA GeForce RTX 4090 D": ("RTX 4090 D", 147.1, 1008),
    "NVIDIA GeForce RTX 4080": ("RTX 4080", 97.5, 716.8),
    "NVIDIA GeForce RTX 4080 SUPER": ("RTX 4080 SUPER", 104.4, 736),
    "NVIDIA GeForce RTX 3090": ("RTX 3090", 71, 936),
    "NVIDIA GeForce RTX 3090 Ti": ("RTX 3090 Ti", 80, 1008),
    "NVIDIA GeForce RTX 3080": ("RTX 3080", 59.5, 760),
    "NVIDIA GeForce RTX 3080 Ti": ("RTX 3080 Ti", 68.2, 912),
    "NVIDIA B200": ("B200", 2250, 7700),
    "NVIDIA GB200": ("GB200", 2500, 8000),
    "AMD Instinct MI300X": ("MI300X", 1307.4, 5300),
    "AMD Instinct MI300X VF": ("MI300X", 1307.4, 5300),  # the same card under SR-IOV
    "AMD Instinct MI300A": ("MI300A", 980.6, 5300),
    "AMD Instinct MI325X": ("MI325X", 1307.4, 6000),
    "AMD Instinct MI350X": ("MI350X", 2306.9, 8000),
    "AMD Instinct MI355X": ("MI355X", 2516.6, 8000),
}


@pytest.mark.parametrize("name", NAMED)
def test_every_named_gpu_has_its_datasheet_numbers_and_a_source(name):
    spec = gpu_spec(name)
    assert (spec.name, spec.fp16_tflops, spec.bandwidth_gb_s) == pytest.approx(NAMED[name])
    assert spec.source and spec.units > 0


def test_the_products_list_is_covered():
    """The accelerators the README names, each found by some torch name above."""
    found = {gpu_spec(name).name for name in NAMED}
    for part in ("H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM", "A100 SXM 80GB", "L40S", "L4",
                 "A10", "RTX 4090", "RTX 4080", "RTX 3090", "RTX 3080", "MI300X", "MI325X",
                 "MI350X", "MI355X", "B200"):
        assert part in found


def test_every_entry_is_reachable_by_its_own_key():
    """No entry is shadowed by a less specific one above it."""
    for key, spec in GPU_SPECS:
        assert gpu_spec(f"NVIDIA {key}") is spec, key


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090 Laptop GPU",
                                  "NVIDIA GeForce RTX 3080 Ti Laptop GPU",
                                  "NVIDIA GeForce RTX 4070 Ti SUPER", "NVIDIA H800"])
def test_parts_not_in_the_table_are_estimated_not_mistaken(name):
    spec = gpu_spec(name, sm_count=76, clock_mhz=2000, capability=(8, 9), rocm=False)
    assert spec.name == f"{name} (estimated)" and spec.bandwidth_gb_s == 0
    assert spec.fp16_tflops == pytest.approx(76 * 2000e6 * 512 / 1e12)


def test_a_partition_gets_its_share_of_the_part():
    """An MI300X in CPX mode shows 38 of its 304 CUs per device; a MIG slice shows its SMs."""
    spec = gpu_spec("AMD Instinct MI300X", sm_count=38)
    assert spec.name == "MI300X (38 of 304 CUs)"
    assert spec.fp16_tflops == pytest.approx(1307.4 / 8)
    assert gpu_spec("NVIDIA A100-SXM4-80GB MIG 3g.40gb", sm_count=42).name == \
        "A100 SXM 80GB (42 of 108 SMs)"
    assert gpu_spec("NVIDIA H100 80GB HBM3", sm_count=132) is gpu_spec("NVIDIA H100 80GB HBM3")


def test_unknown_amd_gpus_are_estimated_with_the_cdna_rate():
    """torch on ROCm reports gfx942 as capability 9.4: 2048 FLOP per CU per clock (the MI300X's
    1307 TFLOP/s at 304 CUs and 2.1 GHz), not the 4096 of NVIDIA's 9.0."""
    spec = gpu_spec("AMD Instinct MI308X", sm_count=304, clock_mhz=2100, capability=(9, 4),
                    rocm=True)
    assert spec.fp16_tflops == pytest.approx(1307.4, rel=1e-3)
    assert "CUs" in spec.source


def test_is_rocm_follows_torch(monkeypatch):
    import torch
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    assert gpus.is_rocm()
    monkeypatch.setattr(torch.version, "hip", None)
    assert not gpus.is_rocm()
