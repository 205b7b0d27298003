"""Test kernel (verify.py's tests): sum over any dim, fp32 accumulation."""
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
TILE = 4096


@triton.jit
def _sum(x_ptr, y_ptr, R, INNER, col_blocks, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    # x viewed as [outer, R, inner]: program o * col_blocks + j sums x[o, :, j*BLOCK_I ...] over R.
    pid = tl.program_id(0)
    o = pid // col_blocks
    cols = (pid % col_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    rows = tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R, BLOCK_I], tl.float32)
    for start in range(0, R, BLOCK_R):
        mask = (start + rows < R)[:, None] & (cols < INNER)[None, :]
        offs = o * R * INNER + (start + rows)[:, None] * INNER + cols[None, :]
        acc += tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + o * INNER + cols, tl.sum(acc, axis=0), mask=cols < INNER)


def kernel_fn(x, dim=-1):
    dim %= x.dim()
    outer, R, inner = math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:])
    y = torch.empty(x.shape[:dim] + x.shape[dim + 1:], device=x.device, dtype=x.dtype)
    if y.numel():
        r_pow2 = triton.next_power_of_2(max(R, 1))
        block_i = min(triton.next_power_of_2(inner), max(64, TILE // r_pow2))
        col_blocks = triton.cdiv(inner, block_i)
        _sum[(outer * col_blocks,)](x, y, R, inner, col_blocks,
                                    BLOCK_R=min(r_pow2, TILE // block_i), BLOCK_I=block_i)
    return y
