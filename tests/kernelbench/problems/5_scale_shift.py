"""x * weight + bias with learned parameters of its own (tiny): a solution gets them by building
its own under the same seed."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return [32]
