"""Attack: start a process in its own session at import (it would outlive the verdict and could
edit the repo later). Its pid goes to $AUTOKERNEL_TEST_PIDFILE so the test can look for it."""
import os
import subprocess

_proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
if os.environ.get("AUTOKERNEL_TEST_PIDFILE"):
    with open(os.environ["AUTOKERNEL_TEST_PIDFILE"], "w") as _f:
        _f.write(str(_proc.pid))

import math  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


@triton.jit
def sum_kernel(x_ptr, y_ptr, R, INNER, col_blocks, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
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
    tl.store(y_ptr + o * INNER + cols, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty),
             mask=cols < INNER)


def kernel_fn(x, dim=-1):
    dim %= x.dim()
    outer, R, inner = math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:])
    y = torch.empty(x.shape[:dim] + x.shape[dim + 1:], dtype=x.dtype, device=x.device)
    # ~16K-element tiles; a short R leaves room for more columns
    block_i = min(triton.next_power_of_2(inner), max(64, 16384 // triton.next_power_of_2(R)))
    col_blocks = triton.cdiv(inner, block_i)
    block_r = min(triton.next_power_of_2(R), 16384 // block_i)
    sum_kernel[(outer * col_blocks,)](x, y, R, inner, col_blocks, BLOCK_R=block_r, BLOCK_I=block_i)
    return y
