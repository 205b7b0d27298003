"""Planted: sums only whole BLOCK-sized chunks, dropping the tail of rows whose length is not a
multiple of the block. Right at 4x256 (smoke), wrong at 16x1000 (sweep).
Expected reason: wrong values at 16x1000."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N - BLOCK + 1, BLOCK):  # bug: the last partial chunk is skipped
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * N + cols).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    row_sum_kernel[(M,)](x, y, N, BLOCK=min(triton.next_power_of_2(N), 64))
    return y
