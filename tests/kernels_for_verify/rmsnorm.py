"""Test kernel (verify.py's tests): rmsnorm, eps as given, weight or None, statistics in fp32."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
ROWS = 16
SCALE = 1.0


@triton.jit
def _rmsnorm(x_ptr, w_ptr, y_ptr, M, N, eps, scale, HAS_WEIGHT: tl.constexpr,
             ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None] * scale
    if HAS_WEIGHT:
        y *= tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs, y, mask=mask)


def kernel_fn(x, weight, eps=1e-6):
    M, N = x.shape
    y = torch.empty_like(x)
    _rmsnorm[(triton.cdiv(M, ROWS),)](x, x if weight is None else weight, y, M, N, eps, SCALE,
                                      HAS_WEIGHT=weight is not None, ROWS=ROWS,
                                      BLOCK=triton.next_power_of_2(N))
    return y
