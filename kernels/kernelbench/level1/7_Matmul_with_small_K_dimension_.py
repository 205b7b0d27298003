"""KernelBench level 1, problem 7 (C = A @ B with a small K: [M, 64] @ [64, N]): the matmul
starter (kernels/matmul.py; fp32 through tf32x3 tensor-core products). The work is writing C."""
import torch.nn as nn

from kernels.matmul import kernel_fn as matmul


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return matmul(A, B)
