"""Test kernel (verify.py's tests): softmax over the last dim, ROWS rows per program."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
ROWS = 16


@triton.jit
def _softmax(x_ptr, y_ptr, M, N, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]
    # Rows past M read row M-1 (never stored): an all -inf padding row would make NaNs.
    safe = tl.minimum(rows, M - 1)[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + safe, mask=cols[None, :] < N, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(x)
    tl.store(y_ptr + offs, e / tl.sum(e, axis=1)[:, None], mask=mask)


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty_like(x)
    _softmax[(triton.cdiv(M, ROWS),)](x, y, M, N, ROWS=ROWS, BLOCK=triton.next_power_of_2(N))
    return y
