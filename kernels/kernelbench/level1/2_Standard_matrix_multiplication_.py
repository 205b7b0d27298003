"""KernelBench level 1, problem 2 (C = A @ B, fp32 [M, K] @ [K, N]): the matmul starter
(kernels/matmul.py; fp32 through tf32x3 tensor-core products, ~1e-6 relative error)."""
import torch.nn as nn

from kernels.matmul import kernel_fn as matmul


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return matmul(A, B)
