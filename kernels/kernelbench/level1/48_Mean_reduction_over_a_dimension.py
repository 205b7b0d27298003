"""KernelBench level 1, problem 48 (torch.mean over one dim): the reduce starter
(kernels/reduce.py sums over any one dim, in fp32 lanes), then a tiny Triton kernel of this file
that scales the reduced output by 1/R in place. That pass touches only the output (128 x 4095
values here, 2 MB) after the sum has read the 8.6 GB input."""
import torch.nn as nn
import triton
import triton.language as tl

from kernels.reduce import kernel_fn as reduce_sum

BLOCK = 1024


@triton.jit
def scale_(y_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (y * factor).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        y = reduce_sum(x, dim=self.dim)  # a new contiguous tensor
        n = y.numel()
        scale_[(triton.cdiv(n, BLOCK),)](y, n, 1.0 / x.shape[self.dim], BLOCK=BLOCK)
        return y
