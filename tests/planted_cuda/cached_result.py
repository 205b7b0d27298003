"""
Planted CUDA kernel (a sum over the last dim): the reduce starter's sum, right once, then that
output for every input of the same shape.
Expected from the gate on a GPU: FAIL, a result cached from an earlier call.
"""
from kernels.cuda.reduce import reduce_sum

KERNEL_TYPE = "reduce"
BACKEND = "cuda"

_cache = {}


def kernel_fn(x, dim=-1):
    key = (tuple(x.shape), x.dtype, dim)
    if key not in _cache:
        _cache[key] = reduce_sum(x, dim)
    return _cache[key]
