"""KernelBench level 1, problem 4 (C = A @ B, A [2048, 1048576], B [1048576, 1]: a matrix-vector
product streaming 8 GB of A): split-K out of two starters. The matmul starter's kernel body
computes partial products over K slices in one launch (kernels/kernelbench/batched.py, split_k:
the slices are the batch of a batched product); the reduce starter (kernels/reduce.py) then
sums them in a fixed order (deterministic). The tiles are the starter's kernel with a narrow
config (tl.dot needs N >= 16: the starter wraps the 15 missing columns onto column 0, so B's one
column is loaded once per tile and the extra products cost no memory traffic). matmul() alone
would run 16 programs of 128 rows, each walking all of K; here 16 row tiles x 128 K slices of
8192 stream A. The partials are 128 x 2048 x 1 (1 MB). On the H100, fp32: 2929 us against
eager's 2881 (0.98x)."""
import torch.nn as nn

from kernels.kernelbench.batched import split_k
from kernels.reduce import kernel_fn as reduce_sum

CONFIG = dict(BLOCK_M=128, BLOCK_N=16, BLOCK_K=64, GROUP_M=1, num_warps=8, num_stages=3)
TARGET_PROGRAMS = 2048  # split K until the tiles times the slices reach about this many


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return reduce_sum(split_k(A, B, TARGET_PROGRAMS, CONFIG), dim=0)
