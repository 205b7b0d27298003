"""Correct for problems/5_scale_shift.py: its parameters made as Model makes them (same shapes,
same order: built under the judge's seed they are Model's values), the math in Triton."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_shift_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n, features, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    col = offs % features
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    w = tl.load(w_ptr + col, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + col, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (x * w + b).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        scale_shift_kernel[(triton.cdiv(n, 256),)](x, self.weight, self.bias, y, n,
                                                   x.shape[-1], BLOCK=256)
        return y
