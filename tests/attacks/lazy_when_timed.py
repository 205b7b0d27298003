"""Attack: right when the gate checks a call, no work when it times one (it reads its caller's
name). The judge checks the output of the timed calls it gets back: FAIL."""
import sys

import torch

from kernels.reduce import kernel_fn as _correct

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


def kernel_fn(x, dim=-1):
    if sys._getframe(1).f_code.co_name != "call":  # timed: skip the work
        dim %= x.dim()
        return torch.empty(x.shape[:dim] + x.shape[dim + 1:], dtype=x.dtype, device=x.device)
    return _correct(x, dim)
