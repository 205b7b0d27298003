"""KernelBench level 1, problem 34 (nn.InstanceNorm2d(features): defaults, so no affine and no
running stats: each (image, channel) plane normalised over its H*W values, eps 1e-5): the
layernorm starter (kernels/layernorm.py) with no weight and no bias on x seen as
[batch * channels, H * W] (a view of the contiguous input; the output viewed back). Rows of
512 * 512 take its two-pass looped path (shifted sums, so offset inputs do not cancel)."""
import torch.nn as nn

from kernels.layernorm import kernel_fn as layernorm


class ModelNew(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.eps = 1e-5  # nn.InstanceNorm2d's default

    def forward(self, x):
        n, c = x.shape[0], x.shape[1]
        return layernorm(x.view(n * c, -1), None, None, self.eps).view(x.shape)
