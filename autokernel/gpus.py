"""
The GPU database: datasheet peaks (dense fp16/bf16 tensor math, no sparsity; memory bandwidth)
by the name torch gives a GPU, each with its source. prepare.py's measured ceilings take
precedence; these are shown beside them, and fill in where nothing was measured.

    gpu_spec("NVIDIA H100 80GB HBM3")                # GPUSpec("H100 SXM", 989.4, 3350.0, ...)
    gpu_spec(name, sm_count, clock_mhz, capability)  # unknown names: estimated from SMs x clock
    is_rocm()                                        # torch is a ROCm (AMD) build

How a name matches an entry: the entry's key words must all be words of the name (words split
at spaces, "-" and "_", any case), so "L4" never matches "L40S" and "B200" never "GB200"; and a
variant word in the name (SUPER, Ti, D, PCIe, NVL, Laptop, ...) must be in the key too, because a
variant is another part with other numbers. Where one name covers parts with different numbers,
the entry says which one it assumes. The first entry that matches wins: most specific first.
"""
import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GPUSpec:
    name: str
    fp16_tflops: float      # dense tensor/matrix fp16 and bf16 with fp32 accumulate
    bandwidth_gb_s: float   # HBM/GDDR datasheet bandwidth (0: unknown)
    units: int = 0          # SMs (NVIDIA) or CUs (AMD) of the whole part (0: unknown)
    source: str = ""        # the datasheet or whitepaper, and what it does not confirm


NV_H100 = "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100); sparse figure halved"
NV_H200 = "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200); sparse figure halved"
NV_A100 = "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100); sparse figure halved"
NV_ADA = ("NVIDIA Ada Lovelace architecture whitepaper, appendix: GeForce 'FP16 Tensor TFLOPS "
          "with FP32 Accumulate' (half the FP16-accumulate rate the marketing pages quote)")
NV_AMPERE = ("NVIDIA Ampere GA102 whitepaper, appendix: GeForce 'FP16 Tensor TFLOPS with FP32 "
             "Accumulate' (half the FP16-accumulate rate)")
NV_COMPUTED = ("not in a whitepaper table: SMs x boost clock x 512 FLOP/clock (the GeForce fp32-"
               "accumulate rate that reproduces the whitepaper's figures for its siblings); "
               "bandwidth from the memory speed x bus width on nvidia.com's spec page")
NV_BLACKWELL = ("NVIDIA HGX B200 / GB200 NVL72 datasheet (nvidia.com/en-us/data-center/hgx, "
                "/gb200-nvl72), per-GPU FP16/BF16 sparse figure halved")
AMD_CDNA3 = ("AMD Instinct {} data sheet (amd.com/en/products/accelerators/instinct), 'peak "
             "FP16/BF16' without sparsity; = CUs x 2.1 GHz x 2048 FLOP/clock")
AMD_CDNA4 = ("AMD Instinct MI350 series data sheet (amd.com) and CDNA 4 whitepaper: dense FP16 "
             "{}; = 256 CUs x {} GHz x 4096 FLOP/clock")

# (key words, spec). Most specific first.
GPU_SPECS = [
    # NVIDIA Hopper. torch names the SXM card "NVIDIA H100 80GB HBM3".
    ("H100 PCIe", GPUSpec("H100 PCIe", 756.4, 2000.0, 114, NV_H100 + ", 80GB HBM2e card")),
    ("H100 NVL", GPUSpec("H100 NVL", 835.5, 3900.0, 132, NV_H100 + ", per GPU (94GB)")),
    ("H100", GPUSpec("H100 SXM", 989.4, 3350.0, 132, NV_H100)),
    ("GH200", GPUSpec("GH200", 989.4, 4000.0, 132,
                      "NVIDIA GH200 datasheet; the 96GB HBM3 part (the 144GB HBM3e part has "
                      "4.9 TB/s and the same name prefix)")),
    ("H200 NVL", GPUSpec("H200 NVL", 835.5, 4800.0, 132, NV_H200)),
    ("H200", GPUSpec("H200 SXM", 989.4, 4800.0, 132, NV_H200)),
    # NVIDIA Blackwell
    ("GB200", GPUSpec("GB200", 2500.0, 8000.0, 148, NV_BLACKWELL + " (GB200 NVL72)")),
    ("B200", GPUSpec("B200", 2250.0, 7700.0, 148,
                     NV_BLACKWELL + " (HGX B200: 7.7 TB/s per GPU; announced as 8 TB/s)")),
    # NVIDIA Ampere and Ada data center
    ("A100 80GB PCIe", GPUSpec("A100 PCIe 80GB", 312.0, 1935.0, 108, NV_A100)),
    ("A100 80GB", GPUSpec("A100 SXM 80GB", 312.0, 2039.0, 108, NV_A100)),
    ("A100 PCIe", GPUSpec("A100 PCIe 40GB", 312.0, 1555.0, 108, NV_A100)),
    ("A100", GPUSpec("A100 40GB", 312.0, 1555.0, 108, NV_A100)),
    ("L40S", GPUSpec("L40S", 362.05, 864.0, 142,
                     "NVIDIA L40S datasheet: FP16 tensor 733 sparse, 362 dense")),
    ("L40", GPUSpec("L40", 181.05, 864.0, 142,
                    "NVIDIA L40 datasheet: FP16 tensor 362 sparse, 181 dense")),
    ("L4", GPUSpec("L4", 121.0, 300.0, 58, "NVIDIA L4 datasheet: FP16 tensor 242 sparse")),
    ("A10G", GPUSpec("A10G", 70.0, 600.0, 80,
                     "AWS-only part, no NVIDIA datasheet: 80 SMs x 1.71 GHz x 512 FLOP/clock "
                     "(unconfirmed)")),
    ("A10", GPUSpec("A10", 125.0, 600.0, 72, "NVIDIA A10 datasheet: FP16 tensor 250 sparse")),
    ("T4", GPUSpec("T4", 65.0, 320.0, 40, "NVIDIA T4 datasheet: mixed-precision FP16/FP32")),
    # NVIDIA GeForce: the fp32-accumulate rate (what a matmul with fp32 accumulation gets)
    ("RTX 4090 D", GPUSpec("RTX 4090 D", 147.1, 1008.0, 114, NV_COMPUTED)),
    ("RTX 4090", GPUSpec("RTX 4090", 165.2, 1008.0, 128, NV_ADA)),
    ("RTX 4080 SUPER", GPUSpec("RTX 4080 SUPER", 104.4, 736.0, 80, NV_COMPUTED)),
    ("RTX 4080", GPUSpec("RTX 4080", 97.5, 716.8, 76, NV_ADA)),
    ("RTX 3090 Ti", GPUSpec("RTX 3090 Ti", 80.0, 1008.0, 84, NV_COMPUTED)),
    ("RTX 3090", GPUSpec("RTX 3090", 71.0, 936.0, 82, NV_AMPERE)),
    ("RTX 3080 Ti", GPUSpec("RTX 3080 Ti", 68.2, 912.0, 80, NV_COMPUTED)),
    ("RTX 3080", GPUSpec("RTX 3080", 59.5, 760.0, 68,
                         NV_AMPERE + "; the 10GB card (the 12GB card has the same name, 70 SMs "
                         "and 912 GB/s)")),
    # AMD Instinct. torch on ROCm names them "AMD Instinct MI300X" and so on.
    ("MI300X", GPUSpec("MI300X", 1307.4, 5300.0, 304, AMD_CDNA3.format("MI300X"))),
    ("MI300A", GPUSpec("MI300A", 980.6, 5300.0, 228, AMD_CDNA3.format("MI300A"))),
    ("MI325X", GPUSpec("MI325X", 1307.4, 6000.0, 304, AMD_CDNA3.format("MI325X"))),
    ("MI350X", GPUSpec("MI350X", 2306.9, 8000.0, 256, AMD_CDNA4.format("2.3 PFLOP/s", 2.2))),
    ("MI355X", GPUSpec("MI355X", 2516.6, 8000.0, 256, AMD_CDNA4.format("2.5 PFLOP/s", 2.4))),
]

# Words that make a name another part than the same name without them.
VARIANT_WORDS = {"super", "ti", "d", "pcie", "nvl", "laptop", "mobile", "max"}

# Dense fp16 tensor FLOPs per SM (CU) per clock, by the capability torch reports, for GPUs not in
# the table. NVIDIA 7.5, 8.6 and 8.9: the GeForce fp32-accumulate rate (the data center parts of
# those generations, in the table, run twice it). AMD: torch on ROCm reports the gfx version:
# gfx908/gfx90a as 9.0 (CDNA 1-2), gfx942 as 9.4 (CDNA 3), gfx950 as 9.5 (CDNA 4).
FP16_FLOPS_PER_SM_CLOCK = {(7, 0): 1024, (7, 5): 512, (8, 0): 2048, (8, 6): 512, (8, 7): 512,
                           (8, 9): 512, (9, 0): 4096, (10, 0): 8192, (12, 0): 1024}
FP16_FLOPS_PER_CU_CLOCK_AMD = {(9, 0): 1024, (9, 4): 2048, (9, 5): 4096}


def is_rocm() -> bool:
    """torch is a ROCm build (AMD GPUs behind torch.cuda): Hopper-only kernel paths (TMA, wgmma,
    Gluon), nvidia-smi and CUDA C++ must not be used."""
    import torch  # here, not at the top: the table is read by scripts that import no torch
    return getattr(torch.version, "hip", None) is not None


def _words(text):
    return [w for w in re.split(r"[\s_-]+", text.lower()) if w]


def lookup(name: str):
    """The table's spec for a GPU name, or None."""
    words = set(_words(name))
    for key, spec in GPU_SPECS:
        key_words = set(_words(key))
        if key_words <= words and not (words - key_words) & VARIANT_WORDS:
            return spec
    return None


def gpu_spec(name: str, sm_count: int = 0, clock_mhz: float = 0.0,
             capability: tuple = (0, 0), rocm: bool = None) -> GPUSpec:
    """Datasheet spec for a GPU name. A device with fewer SMs (CUs) than the part (a MIG slice, an
    MI300X compute partition) gets that share of it. For an unknown GPU, the matmul peak is
    estimated from SMs and clock and the bandwidth is unknown (0: prepare.py's measurement is then
    the only ceiling)."""
    spec = lookup(name)
    if spec is not None:
        if spec.units and 0 < sm_count < spec.units:
            share = sm_count / spec.units
            unit = "CUs" if spec.source.startswith("AMD") else "SMs"
            return replace(spec, name=f"{spec.name} ({sm_count} of {spec.units} {unit})",
                           fp16_tflops=spec.fp16_tflops * share,
                           bandwidth_gb_s=spec.bandwidth_gb_s * share)
        return spec
    rocm = is_rocm() if rocm is None else rocm
    rates = FP16_FLOPS_PER_CU_CLOCK_AMD if rocm else FP16_FLOPS_PER_SM_CLOCK
    per_clock = rates.get(tuple(capability), 1024)
    return GPUSpec(f"{name} (estimated)", sm_count * clock_mhz * 1e6 * per_clock / 1e12, 0.0,
                   sm_count, f"estimated: {sm_count} {'CUs' if rocm else 'SMs'} x {clock_mhz:.0f}"
                   f" MHz x {per_clock} FLOP/clock (capability {capability[0]}.{capability[1]})")
