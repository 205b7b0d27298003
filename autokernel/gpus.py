"""
The GPU database: datasheet peaks (dense, no sparsity) by GPU name. prepare.py's measured
ceilings take precedence; these are shown beside them, and fill in where nothing was measured.
Names are matched by substring, most specific first.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    name: str
    fp16_tflops: float      # dense tensor-core fp16/bf16 with fp32 accumulate
    bandwidth_gb_s: float   # HBM/GDDR datasheet bandwidth


# Order matters: "H100 PCIe" and "H100 NVL" before the bare "H100" (which means the SXM part:
# torch reports the SXM card as "NVIDIA H100 80GB HBM3").
GPU_SPECS = [
    ("H100 PCIe", GPUSpec("H100 PCIe", 756.0, 2000.0)),
    ("H100 NVL", GPUSpec("H100 NVL", 835.0, 3900.0)),
    ("H100", GPUSpec("H100 SXM", 989.4, 3350.0)),
    ("GH200", GPUSpec("GH200", 989.4, 4000.0)),  # before "H200": "GH200" contains it
    ("H200", GPUSpec("H200 SXM", 989.4, 4800.0)),
    ("A100-SXM4-80GB", GPUSpec("A100 SXM 80GB", 312.0, 2039.0)),
    ("A100 80GB PCIe", GPUSpec("A100 PCIe 80GB", 312.0, 1935.0)),
    ("A100", GPUSpec("A100 40GB", 312.0, 1555.0)),
    ("L40S", GPUSpec("L40S", 362.0, 864.0)),
    ("L40", GPUSpec("L40", 181.0, 864.0)),  # before "L4", which it contains
    ("L4", GPUSpec("L4", 121.0, 300.0)),
    ("A10G", GPUSpec("A10G", 70.0, 600.0)),
    ("A10", GPUSpec("A10", 125.0, 600.0)),
    ("RTX 4090", GPUSpec("RTX 4090", 165.2, 1008.0)),
    ("RTX 3090", GPUSpec("RTX 3090", 71.0, 936.0)),
    ("T4", GPUSpec("T4", 65.0, 320.0)),
]

# Dense fp16 tensor FLOPs per SM per clock, by compute capability (for GPUs not in the table).
FP16_FLOPS_PER_SM_CLOCK = {(7, 0): 1024, (7, 5): 512, (8, 0): 2048, (8, 6): 512, (8, 7): 512,
                           (8, 9): 512, (9, 0): 4096, (10, 0): 8192, (12, 0): 1024}


def gpu_spec(name: str, sm_count: int = 0, clock_mhz: float = 0.0,
             capability: tuple = (0, 0)) -> GPUSpec:
    """Datasheet spec for a GPU name; for an unknown GPU, estimate the matmul peak from SMs and
    clock (bandwidth unknown: 0, prepare.py's measurement is then the only ceiling)."""
    for key, spec in GPU_SPECS:
        if key in name:
            return spec
    per_clock = FP16_FLOPS_PER_SM_CLOCK.get(tuple(capability), 1024)
    return GPUSpec(f"{name} (estimated)", sm_count * clock_mhz * 1e6 * per_clock / 1e12, 0.0)
