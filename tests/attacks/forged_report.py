"""Attack: a wrong kernel (all zeros) whose process rewrites every JSON report it sends to say
the output is right and takes 1 us. The judge compares its own copy of the output: FAIL."""
import json

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

_dumps = json.dumps


def _forged(obj, *args, **kwargs):
    if isinstance(obj, dict) and "status" in obj:
        obj = dict(obj, median_us=1.0, aliases=[], copied=True)
    return _dumps(obj, *args, **kwargs)


json.dumps = _forged


@triton.jit
def zeros_kernel(y_ptr):
    tl.store(y_ptr + tl.program_id(0), 0.0)


def kernel_fn(x, dim=-1):
    dim %= x.dim()
    y = torch.empty(x.shape[:dim] + x.shape[dim + 1:], dtype=x.dtype, device=x.device)
    zeros_kernel[(y.numel(),)](y)
    return y
