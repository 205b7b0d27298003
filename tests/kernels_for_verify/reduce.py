"""Test kernel (verify.py's tests): sum over the last dim, fp32 accumulation."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
ROWS = 16


@triton.jit
def _sum(x_ptr, y_ptr, M, N, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, tl.sum(x, axis=1), mask=rows < M)


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), device=x.device, dtype=x.dtype)
    _sum[(triton.cdiv(M, ROWS),)](x, y, M, N, ROWS=ROWS, BLOCK=triton.next_power_of_2(N))
    return y
