"""
Regions behind the gate. A region's kernel file (extract.py writes it, autokernel/region_starter
.py its starter) is a KernelBench-format solution, ModelNew, to the region's reference: the
problem profile.py froze from the model's graph (autokernel/regions.py). It is judged exactly as
a KernelBench problem is (autokernel/kernelbench.py: the oracle, the stages, the timing, eager
and torch.compile of the same region as the baselines), with one difference: ModelNew may call
the vendor libraries for convolutions and GEMMs (cuDNN and cuBLAS on a GPU), as inductor's own
code for a region does. The child's guard lets exactly those aten ops through and counts them,
and the verdict names them. Every other torch compute op in ModelNew.forward is refused, as in
any kernel file: the rest is the kernel's own Triton or CUDA.

    KERNEL_TYPE = "region"
    KERNEL_NAME = "basicblock_1"
    KERNELBENCH_PROBLEM = "workspace/regions/BasicBlock_r72f6e141.py"   # the reference
    KERNELBENCH_SHA256 = "..."
    BENCH_DTYPE = "fp16"                                                  # the model's dtype
"""
from autokernel import kernelbench

# The aten ops a region kernel may leave to the libraries (what the dispatcher shows for
# F.conv*, F.linear, torch.matmul and the batched GEMMs once their Python wrappers are gone).
LIBRARY_OPS = ("convolution", "_convolution", "conv1d", "conv2d", "conv3d",
               "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear", "matmul",
               "mm", "addmm", "bmm", "baddbmm")


class RegionJudge(kernelbench.ProblemJudge):
    """The KernelBench stages, the library ops allowed, the calls made to them remembered (the
    child's count for one forward: what the verdict names)."""
    library = LIBRARY_OPS
    not_applicable = {"edge": "a region runs at the model's shapes (its reference fixes them)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.library_calls = {}

    def call(self, *args, **kwargs):
        out, reply = super().call(*args, **kwargs)
        self.library_calls = reply.get("library") or {}
        return out, reply


def plan(attrs, dtypes=None):
    return dict(kernelbench.plan(attrs, dtypes), kernel_type="region")


class RegionKind(kernelbench.KernelBenchKind):
    """KERNEL_TYPE "region": a ModelNew judged against the region's reference."""
    judge = RegionJudge
    plan = staticmethod(plan)


KIND = RegionKind()


def describe_calls(calls):
    """'aten.convolution x2, aten.addmm x1' (the library calls of one forward)."""
    return ", ".join(f"aten.{name} x{count}" for name, count in sorted(calls.items()))
