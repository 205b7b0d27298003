"""x squared (tiny); no solution is given for it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x


def get_inputs():
    return [torch.randn(4, 32)]


def get_init_inputs():
    return []
