"""
The file the agent edits: a small, correct example of the kernel file contract (x.sum(dim) for x
of any rank, dim -1 by default). `uv run orchestrate.py next` replaces it with the plan's first
kernel.

The contract (autokernel/contract.py reads these names without running the file):
    KERNEL_TYPE   one of the registered types (autokernel.KERNEL_TYPES): what kernel_fn computes
    kernel_fn     takes the reference's arguments by name, returns a new tensor of the reference's
                  dtype and shape; torch only allocates outputs and reads shapes and strides,
                  the math happens in the Triton kernel
optional:
    KERNEL_NAME   the tag in results.tsv and plan.json (default: KERNEL_TYPE)
    BACKEND       "triton" (the default)
    BENCH_SHAPES  the shapes that matter, e.g. [(4096, 50257)]; the first is timed
    BENCH_DTYPE   the timed dtype, "fp16" (default), "bf16" or "fp32"

The contiguous x is viewed as [outer, R, inner] (R: the summed dim; inner == 1 for the last dim).
A program owns BLOCK_I neighbouring outputs of one outer index and walks R in [BLOCK_R, BLOCK_I]
tiles, masked at the tails (any size: 1023, 50257, 128256), summing in fp32 whatever the input
dtype: an fp16 sum loses digits on long rows.

Usage:
    uv run bench.py -m "what this edit tries"
"""
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"

TILE = 1024  # elements per step: BLOCK_R * BLOCK_I, powers of two


@triton.jit
def sum_kernel(x_ptr, y_ptr, R, INNER, col_blocks, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    pid = tl.program_id(0)
    o = (pid // col_blocks).to(tl.int64)  # o * R * INNER can pass 2^31 elements
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
    if y.numel():  # R == 0 runs no loop step: sums of nothing are 0
        # up to 64 columns, more where R is too short to fill a tile's rows
        r_pow2 = triton.next_power_of_2(max(R, 1))
        block_i = min(triton.next_power_of_2(inner), max(64, TILE // r_pow2))
        col_blocks = triton.cdiv(inner, block_i)
        sum_kernel[(outer * col_blocks,)](x, y, R, inner, col_blocks,
                                          BLOCK_R=TILE // block_i, BLOCK_I=block_i)
    return y
