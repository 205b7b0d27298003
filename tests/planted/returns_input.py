"""Planted: softmax computed in place and the input returned.
Expected reason: returned its input x."""
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BENCH_SHAPES = [(4, 256)]


@triton.jit
def softmax_inplace_kernel(x_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(x_ptr + row * N + cols, (e / tl.sum(e, axis=0)).to(x_ptr.dtype.element_ty),
             mask=cols < N)


def kernel_fn(x):
    M, N = x.shape
    softmax_inplace_kernel[(M,)](x, N, BLOCK=triton.next_power_of_2(N))
    return x
