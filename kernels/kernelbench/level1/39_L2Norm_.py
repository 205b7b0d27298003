"""KernelBench level 1, problem 39 (x / ||x||_2 over dim 1 of a 2-D input, the last dim): the
rmsnorm starter (kernels/rmsnorm.py) with eps 0 and a constant weight of 1/sqrt(N):
x / sqrt(mean(x^2)) / sqrt(N) = x / sqrt(sum(x^2)). The weight is N values made once per
(N, dtype, device) and kept (a 256 KB vector at N = 65535, next to the 8.6 GB input)."""
import torch
import torch.nn as nn

from kernels.rmsnorm import kernel_fn as rmsnorm


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._weight = None

    def forward(self, x):
        n = x.shape[-1]
        w = self._weight
        if w is None or w.shape[0] != n or w.dtype != x.dtype or w.device != x.device:
            w = self._weight = torch.full((n,), n ** -0.5, dtype=x.dtype, device=x.device)
        return rmsnorm(x, w, 0.0)
