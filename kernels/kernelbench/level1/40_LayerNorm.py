"""KernelBench level 1, problem 40 (nn.LayerNorm over the trailing dims (features, dim1, dim2)):
the layernorm starter (kernels/layernorm.py) on x seen as [rows, prod(normalized_shape)].
Model's parameters are nn.LayerNorm's: ones and zeros, made here the same way."""
import torch
import torch.nn as nn

from kernels.layernorm import kernel_fn as layernorm


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = 1e-5  # nn.LayerNorm's default

    def forward(self, x):
        n = self.weight.numel()
        y = layernorm(x.view(-1, n), self.weight.view(n), self.bias.view(n), self.eps)
        return y.view(x.shape)
