"""Test kernel (verify.py's tests): rotary embedding, half-split pairing; x [B,H,S,D] as rows."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rotary_embedding"
ROWS = 16


@triton.jit
def _rotary(x_ptr, cos_ptr, sin_ptr, y_ptr, R, S, HALF, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < R) & (cols[None, :] < HALF)
    base = rows[:, None] * (2 * HALF) + cols[None, :]
    pos = (rows % S)[:, None] * HALF + cols[None, :]
    x1 = tl.load(x_ptr + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + pos, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + base, x1 * c - x2 * s, mask=mask)
    tl.store(y_ptr + base + HALF, x2 * c + x1 * s, mask=mask)


def kernel_fn(x, cos, sin):
    B, H, S, D = x.shape
    y = torch.empty_like(x)
    R = B * H * S
    _rotary[(triton.cdiv(R, ROWS),)](x, cos, sin, y, R, S, D // 2, ROWS=ROWS,
                                     BLOCK=triton.next_power_of_2(D // 2))
    return y
