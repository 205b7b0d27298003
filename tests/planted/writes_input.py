"""Planted: right output, but uses its input as scratch space (zeroes it after reading).
Expected reason: modified its input x."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(y_ptr + row, tl.sum(x.to(tl.float32), axis=0).to(y_ptr.dtype.element_ty))
    tl.store(x_ptr + row * N + cols, tl.zeros_like(x), mask=cols < N)  # clobbers the input


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    row_sum_kernel[(M,)](x, y, N, BLOCK=triton.next_power_of_2(N))
    return y
