"""Planted: each call scales its result by a slightly different factor (as a kernel whose
atomics land in a different order each run would), always within tolerance.
Expected reason: non-deterministic."""
import itertools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]
_calls = itertools.count()
# One ulp-ish step per dtype: changes the bits, stays inside the gate's tolerance.
_STEP = {torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -20}


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, (tl.sum(acc, axis=0) * scale).to(y_ptr.dtype.element_ty))


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    scale = 1.0 + _STEP[x.dtype] * (next(_calls) % 3 + 1)
    row_sum_kernel[(M,)](x, y, N, scale, BLOCK=min(triton.next_power_of_2(N), 16384))
    return y
