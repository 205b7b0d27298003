"""KernelBench level 1, problem 4 (C = A @ B, A [2048, 1048576], B [1048576, 1]: a matrix-vector
product streaming 8 GB of A): split-K out of two starters. The matmul starter's kernel body
(kernels/matmul.py, matmul_ptr_kernel called as a device function) computes partial products
over K slices in one launch (grid axis 1 is the slice: a wrapper kernel offsets A's columns and
B's rows to it and writes partial s to P[s]); the reduce starter (kernels/reduce.py) then sums P
over the slices in a fixed order (deterministic). The tiles are the starter's kernel with a
narrow config (tl.dot needs N >= 16: the starter wraps the 15 missing columns onto column 0,
so B's one column is loaded once per tile and the extra products cost no memory traffic).
matmul() alone would run 16 programs of 128 rows, each walking all of K; here 16 row tiles x 128
K slices of 8192 stream A. The partials are 128 x 2048 x 1 (1 MB). On an H200, fp32: 1.97 ms
against eager's 2.32 (a sweep of 32-128-row tiles and 512-2048 programs: 1.97-3.4 ms; 16-row
tiles: 15 ms)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels.matmul import _dot_precision, matmul_ptr_kernel
from kernels.reduce import kernel_fn as reduce_sum

CONFIG = dict(BLOCK_M=128, BLOCK_N=16, BLOCK_K=64, GROUP_M=1, num_warps=8, num_stages=3)
TARGET_PROGRAMS = 2048  # split K until the tiles times the slices reach about this many


@triton.jit
def split_k_kernel(a_ptr, b_ptr, p_ptr, M, N, K_SPLIT, stride_am, stride_ak, stride_bk,
                   stride_bn, stride_ps, stride_pm, stride_pn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr):
    s = tl.program_id(1).to(tl.int64)
    p = p_ptr + s * stride_ps
    matmul_ptr_kernel(a_ptr + s * K_SPLIT * stride_ak, b_ptr + s * K_SPLIT * stride_bk, p, p,
                      M, N, K_SPLIT, stride_am, stride_ak, stride_bk, stride_bn, stride_pm,
                      stride_pn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, PRECISION, False,
                      None)


def split_k_matmul(A, B, cfg, target_programs):
    M, K = A.shape
    N = B.shape[1]
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    tiles = (M + BM - 1) // BM * ((N + BN - 1) // BN)
    splits = 1  # a power of two dividing K, each slice at least 4 K steps long
    while tiles * splits < target_programs and K % (2 * splits) == 0 \
            and K // (2 * splits) >= 4 * BK:
        splits *= 2
    k_split = K // splits
    P = torch.empty((splits, M, N), device=A.device, dtype=A.dtype)
    split_k_kernel[(tiles, splits)](
        A, B, P, M, N, k_split, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
        *P.stride(), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg["GROUP_M"],
        EVEN_K=k_split % BK == 0, PRECISION=_dot_precision(A.dtype),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return P


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return reduce_sum(split_k_matmul(A, B, CONFIG, TARGET_PROGRAMS), dim=0)
