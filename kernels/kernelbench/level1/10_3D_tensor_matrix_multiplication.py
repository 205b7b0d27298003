"""KernelBench level 1, problem 10 (A [N, M, K] @ B [K, L] -> [N, M, L]): one matmul of the
starter (kernels/matmul.py) on A seen as [N*M, K]; A is contiguous, so both that and the
output's [N, M, L] are views (.view: it would raise rather than copy)."""
import torch.nn as nn

from kernels.matmul import kernel_fn as matmul


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        n, m, k = A.shape
        return matmul(A.view(n * m, k), B).view(n, m, B.shape[1])
