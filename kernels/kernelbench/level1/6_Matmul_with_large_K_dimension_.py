"""KernelBench level 1, problem 6 (C = A @ B, [256, K] @ [K, 256] with K = 524288): split-K out
of two starters. The matmul starter's kernel body, with its pick_config tiles, computes the
partial products of K slices in one launch (kernels/kernelbench/batched.py, split_k: the slices
are the batch of a batched product); the reduce starter (kernels/reduce.py) then sums them in a
fixed order (deterministic). matmul() alone would run the 8 output tiles on 8 programs, each
walking all of K; the partials (in the input dtype, fp32 here) are SPLITS x 256 x 256 (16 MB at
64 slices), next to the 1 GB the product reads. On the H100, fp32: 1279 us against eager's
1302 (1.02x)."""
import torch.nn as nn

from kernels.kernelbench.batched import split_k
from kernels.reduce import kernel_fn as reduce_sum

TARGET_PROGRAMS = 512  # split K until the tiles times the slices reach about this many


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return reduce_sum(split_k(A, B, TARGET_PROGRAMS), dim=0)
