"""
Planted CUDA kernel (a sum over the last dim): lets PyTorch do the math. It is a CUDA kernel
file like the reduce starter, whose compiled library it imports, but never launches it.
Expected from the gate on a GPU: FAIL, called torch compute op aten.sum.
"""
from kernels.cuda.reduce import _lib  # noqa: F401  (the starter's library, built, unused)

KERNEL_TYPE = "reduce"
BACKEND = "cuda"


def kernel_fn(x, dim=-1):
    return x.sum(dim)
