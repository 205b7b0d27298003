"""KernelBench level 1, problem 8 (C = A @ B at irregular sizes 8205 x 2949 x 5921): the matmul
starter (kernels/matmul.py). Rows of 2949 fp32 are not 16-byte aligned, so it takes its pointer
path, which masks the ragged K tail and wraps out-of-range rows/cols (the store is masked)."""
import torch.nn as nn

from kernels.matmul import kernel_fn as matmul


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return matmul(A, B)
