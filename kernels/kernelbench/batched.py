"""
Batched products out of the matmul starter's kernel body, for the KernelBench solutions in
level1/ (a batched matmul, a 1x1 convolution, attention taken apart, split-K products).

The matmul starter's matmul() takes one 2-D product and returns a fresh C. Here its pointer
kernel (kernels/matmul.py, matmul_ptr_kernel, called as a device function) runs a whole batch in
ONE launch: grid axis 1 is the batch entry, whose A, B and C base pointers a wrapper kernel
offsets by the batch strides. Operands are views of any strides; a batch stride of 0 shares an
operand across the batch (a convolution's weight).
"""
import torch
import triton
import triton.language as tl

from kernels.matmul import _dot_precision, matmul_ptr_kernel, pick_config


@triton.jit
def bmm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_ab, stride_am, stride_ak,
               stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
               HAS_BIAS: tl.constexpr):
    batch = tl.program_id(1).to(tl.int64)
    matmul_ptr_kernel(a_ptr + batch * stride_ab, b_ptr + batch * stride_bb,
                      c_ptr + batch * stride_cb, bias_ptr, M, N, K, stride_am, stride_ak,
                      stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K,
                      GROUP_M, EVEN_K, PRECISION, HAS_BIAS, None)


def bmm(A, B, C, bias=None, cfg=None):
    """C[i] = A[i] @ B[i] (+ bias[N] per column) for 3-D views, written in place. cfg: the
    starter's tiles for one [M, N, K] product (default: its pick_config)."""
    batch, M, K = A.shape
    N = B.shape[2]
    cfg = cfg or pick_config(M, N, K, A.dtype)
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    grid = ((M + BM - 1) // BM * ((N + BN - 1) // BN), batch)
    bmm_kernel[grid](A, B, C, bias if bias is not None else C, M, N, K, *A.stride(),
                     *B.stride(), *C.stride(), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                     GROUP_M=cfg["GROUP_M"], EVEN_K=K % BK == 0,
                     PRECISION=_dot_precision(A.dtype), HAS_BIAS=bias is not None,
                     num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return C


def split_k(A, B, target_programs, cfg=None):
    """P[s] = A[:, s-th K slice] @ B[s-th K slice, :] for 2-D A [M, K] and B [K, N]: K cut into
    a power of two of slices (each at least 4 K steps long) until the output tiles times the
    slices reach about target_programs, all in one launch. Sum P over dim 0 for A @ B: when M and
    N leave few output tiles, one program per tile would walk all of K alone."""
    M, K = A.shape
    N = B.shape[1]
    cfg = cfg or pick_config(M, N, K, A.dtype)
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    tiles = (M + BM - 1) // BM * ((N + BN - 1) // BN)
    splits = 1
    while tiles * splits < target_programs and K % (2 * splits) == 0 \
            and K // (2 * splits) >= 4 * BK:
        splits *= 2
    k_split = K // splits
    # The slices as batch entries: views that step k_split columns of A and rows of B apart.
    a = A.as_strided((splits, M, k_split), (k_split * A.stride(1), A.stride(0), A.stride(1)))
    b = B.as_strided((splits, k_split, N), (k_split * B.stride(0), B.stride(0), B.stride(1)))
    P = torch.empty((splits, M, N), device=A.device, dtype=A.dtype)
    return bmm(a, b, P, cfg=cfg)
