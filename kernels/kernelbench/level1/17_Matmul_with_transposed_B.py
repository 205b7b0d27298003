"""KernelBench level 1, problem 17 (C = A @ B.T, B given as [N, K]): the matmul starter
(kernels/matmul.py) on the view B.t() (strides (1, K), no copy), the nn.Linear weight layout
it is built for."""
import torch.nn as nn

from kernels.matmul import kernel_fn as matmul


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return matmul(A, B.t())
