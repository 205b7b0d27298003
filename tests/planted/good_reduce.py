"""Planted: a correct row-sum kernel (fp32 accumulation, whole row per program). bench keeps it."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"
BENCH_SHAPES = [(4, 256)]  # tiny: the interpreter runs one program per row


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    row_sum_kernel[(M,)](x, y, N, BLOCK=min(triton.next_power_of_2(N), 16384))
    return y
