"""KernelBench level 1, problem 11 (einsum "bijl,lk->bijk": A [b, i, j, l] @ B [l, k]): the
contraction is over A's last dim only, so it is one matmul of the starter (kernels/matmul.py) on
A seen as [b*i*j, l], the output seen back as [b, i, j, k] (views of contiguous tensors, no
copies)."""
import torch.nn as nn

from kernels.matmul import kernel_fn as matmul


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        b, i, j, l = A.shape
        return matmul(A.view(b * i * j, l), B).view(b, i, j, B.shape[1])
