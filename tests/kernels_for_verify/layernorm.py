"""Test kernel (verify.py's tests): layernorm, eps as given, weight and bias each or None,
two-pass statistics in fp32."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "layernorm"
ROWS = 16


@triton.jit
def _layernorm(x_ptr, w_ptr, b_ptr, y_ptr, M, N, eps, HAS_WEIGHT: tl.constexpr,
               HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    d = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / N + eps)
    y = d * rstd[:, None]
    if HAS_WEIGHT:
        y *= tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs, y, mask=mask)


def kernel_fn(x, weight, bias, eps=1e-5):
    M, N = x.shape
    y = torch.empty_like(x)
    _layernorm[(triton.cdiv(M, ROWS),)](x, x if weight is None else weight,
                                        x if bias is None else bias, y, M, N, eps,
                                        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                                        ROWS=ROWS, BLOCK=triton.next_power_of_2(N))
    return y
