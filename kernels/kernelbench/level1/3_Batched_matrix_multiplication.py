"""KernelBench level 1, problem 3 (torch.bmm, fp32 [batch, m, k] @ [batch, k, n]): the matmul
starter's kernel body (kernels/matmul.py, matmul_ptr_kernel, called as a device function with the
starter's own pick_config tiles) run for every batch entry in ONE launch: grid axis 1 is the batch
entry, whose A, B and C base pointers a 3-line wrapper kernel offsets by the batch strides. The
starter's matmul() takes one 2-D product and returns a fresh C; calling it per entry would need a
copy of each result into place, so the batch is folded into the launch instead. At these sizes
(2^30 multiply-adds an entry, fp32) matmul() itself would take this pointer path for one entry."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels.matmul import _dot_precision, matmul_ptr_kernel, pick_config


@triton.jit
def bmm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_ab, stride_am, stride_ak,
               stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr):
    batch = tl.program_id(1).to(tl.int64)
    c = c_ptr + batch * stride_cb
    matmul_ptr_kernel(a_ptr + batch * stride_ab, b_ptr + batch * stride_bb, c, c, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, PRECISION, False, None)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        batch, M, K = A.shape
        N = B.shape[2]
        C = torch.empty((batch, M, N), device=A.device, dtype=A.dtype)
        cfg = pick_config(M, N, K, A.dtype)
        BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        grid = ((M + BM - 1) // BM * ((N + BN - 1) // BN), batch)
        bmm_kernel[grid](A, B, C, M, N, K, *A.stride(), *B.stride(), *C.stride(),
                         BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg["GROUP_M"],
                         EVEN_K=K % BK == 0, PRECISION=_dot_precision(A.dtype),
                         num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        return C
