"""KernelBench level 1, problem 18 (C = A.T @ B.T, A given as [K, M], B as [N, K]): the matmul
starter (kernels/matmul.py) on the views A.t() and B.t() (no copies; it honours any strides)."""
import torch.nn as nn

from kernels.matmul import kernel_fn as matmul


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return matmul(A.t(), B.t())
