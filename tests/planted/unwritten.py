"""Planted: launches one program too few, so the last row's sum is never written.
Expected reason: elements left unwritten (1 of 4)."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(x, axis=0).to(y_ptr.dtype.element_ty))


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    row_sum_kernel[(M - 1,)](x, y, N, BLOCK=triton.next_power_of_2(N))  # off by one
    return y
