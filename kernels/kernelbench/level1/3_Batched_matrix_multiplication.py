"""KernelBench level 1, problem 3 (torch.bmm, fp32 [batch, m, k] @ [batch, k, n]): the matmul
starter's kernel body run for every batch entry in ONE launch (kernels/kernelbench/batched.py,
bmm, with the starter's own pick_config tiles). The starter's matmul() takes one 2-D product and
returns a fresh C; calling it per entry would need a copy of each result into place, so the batch
is folded into the launch instead. At these sizes (2^30 multiply-adds an entry, fp32) matmul()
itself would take this pointer path for one entry."""
import torch
import torch.nn as nn

from kernels.kernelbench.batched import bmm


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        C = torch.empty((A.shape[0], A.shape[1], B.shape[2]), device=A.device, dtype=A.dtype)
        return bmm(A, B, C)
