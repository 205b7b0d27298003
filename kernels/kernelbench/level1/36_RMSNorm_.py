"""KernelBench level 1, problem 36 (x / sqrt(mean(x^2 over dim 1) + eps) for x[batch, features,
dim1, dim2]): normalised across the features at every position, so no starter applies (they
normalise along the contiguous last dim). x is seen as [batch, C, S] (S = dim1 * dim2): each
program loads a [C, BLOCK_S] tile (C rows of BLOCK_S neighbouring positions: coalesced loads),
sums the squares down its columns in fp32 and writes the tile scaled: one read, one write."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_S = 128


@triton.jit
def rms_across_channels(x_ptr, y_ptr, C, S, eps, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    c = tl.arange(0, BLOCK_C)
    mask = (c[:, None] < C) & (s[None, :] < S)
    offs = tl.program_id(1).to(tl.int64) * C * S + c[:, None] * S + s[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    tl.store(y_ptr + offs, (x / rms[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.num_features, self.eps = num_features, eps

    def forward(self, x):
        batch, channels = x.shape[0], x.shape[1]
        positions = x.numel() // max(batch * channels, 1)
        y = torch.empty_like(x)
        block_c = triton.next_power_of_2(channels)
        grid = (triton.cdiv(positions, BLOCK_S), batch)
        rms_across_channels[grid](x, y, channels, positions, self.eps, BLOCK_C=block_c,
                                  BLOCK_S=BLOCK_S, num_warps=8 if block_c >= 64 else 4)
        return y
