"""KernelBench level 1, problem 15 (torch.tril(A @ B), square fp32): the matmul starter
(kernels/matmul.py) for the product, then a tiny Triton kernel of this file that zeroes C's
elements above the diagonal in place (torch.tril). For lower triangular inputs those elements
are exact zeros already (every term of their sums has a zero factor); the mask is kept so that
any inputs get tril(A @ B). It writes at most N^2 / 2 elements (32 MB at N = 4096, fp32) after
a 2 N^3-flop product: one program per 64 x 64 tile of C, its store masked to the triangle."""
import torch.nn as nn
import triton
import triton.language as tl

from kernels.matmul import kernel_fn as matmul

BLOCK = 64


@triton.jit
def zero_above_diagonal(c_ptr, M, N, stride_m, stride_n, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (cols[None, :] < N) & (cols[None, :] > rows[:, None])
    ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_m + cols[None, :] * stride_n
    tl.store(ptrs, tl.zeros((BLOCK, BLOCK), c_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        C = matmul(A, B)
        M, N = C.shape
        grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))
        zero_above_diagonal[grid](C, M, N, C.stride(0), C.stride(1), BLOCK=BLOCK)
        return C
