"""Planted: softmax without subtracting the row max. Right on ordinary inputs, NaN on the
stability stage's huge rows (exp overflows, inf / inf). Expected reason: output has NaN."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BENCH_SHAPES = [(4, 256)]


@triton.jit
def naive_softmax_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
    e = tl.exp(x)  # no max subtraction
    tl.store(y_ptr + row * N + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty),
             mask=cols < N)


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty_like(x)
    naive_softmax_kernel[(M,)](x, y, N, BLOCK=triton.next_power_of_2(N))
    return y
