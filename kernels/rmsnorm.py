"""
RMSNorm over the last dim of x[M, N] with weight[N] or None, in Triton. Starter kernel for
AutoKernel: y = x * rsqrt(mean(x^2) + eps) (* weight), math in fp32, output in x's dtype.

eps is a runtime argument (1e-6 by default; models use 1e-5, 1e-6, ...): one compiled kernel
serves them all. A None weight compiles the weight load and multiply out (HAS_WEIGHT is a
constexpr: a separate specialization, no branch at run time); x stands in for the pointer.

Two paths, picked by row length:
  * rows that fit in registers (N <= MAX_FUSED_N): one read, one write; several rows per
    program when rows are short; the weight is loaded once per program.
  * long rows: one program per row; pass 1 sums x^2, pass 2 re-reads, scales and writes.

Measured on the H100 (8192x8192 fp16): 94 us, 2.86 TB/s (eager 1020 us, torch.compile 93 us).

Usage:
  uv run bench.py --kernel kernels/rmsnorm.py
"""
import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
BACKEND = "triton"

MAX_FUSED_N = 16384


@triton.jit
def rmsnorm_fused_kernel(x_ptr, w_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym, stride_yn,
                         eps, HAS_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_xm + cols[None, :] * stride_xn, mask=mask,
                other=0.0, eviction_policy=EVICT).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        y *= tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows64 * stride_ym + cols[None, :] * stride_yn,
             y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rmsnorm_looped_kernel(x_ptr, w_ptr, y_ptr, N, stride_xm, stride_xn, stride_ym, stride_yn,
                          eps, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    cols = tl.arange(0, BLOCK_N)
    acc_sq = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        x = tl.load(x_row + c * stride_xn, mask=c < N, other=0.0).to(tl.float32)
        acc_sq += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc_sq, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        y = tl.load(x_row + c * stride_xn, mask=c < N, other=0.0).to(tl.float32) * rstd
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
        tl.store(y_row + c * stride_yn, y.to(y_ptr.dtype.element_ty), mask=c < N)


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def _fused_config(M, N):
    """Whole rows per program, ~16 fp32 values per thread, 8K elements a tile; 2K for rows of up
    to 1024 (at 16384x768 and 32768x512 on the H100, 2K tiles with 4 warps ran at the speed of a
    same-bytes copy and 8K tiles 1-5% slower)."""
    block_n = triton.next_power_of_2(N)
    tile = 2048 if block_n <= 1024 else 8192
    block_m = min(max(1, tile // block_n), triton.next_power_of_2(M))
    num_warps = min(16, max(1, block_m * block_n // 512))
    return block_m, block_n, num_warps


def rmsnorm(x, weight, eps=1e-6, fused=None, block_n=None, num_warps=None, block_m=None,
            evict=""):
    """Launch with heuristic settings; the keyword overrides exist for tuning scripts."""
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    M = x2.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(x.shape)
    has_weight = weight is not None
    assert not has_weight or weight.stride(-1) == 1, "weight must be contiguous"
    w = weight if has_weight else x2  # any valid pointer: the load is compiled out
    if fused is None:
        fused = N <= MAX_FUSED_N
    if fused:
        bm, bn, nw = _fused_config(M, N)
        bm, nw = block_m or bm, num_warps or nw
        rmsnorm_fused_kernel[((M + bm - 1) // bm,)](
            x2, w, y, M, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1), eps,
            HAS_WEIGHT=has_weight, BLOCK_M=bm, BLOCK_N=bn, EVICT=evict, num_warps=nw)
    else:
        rmsnorm_looped_kernel[(M,)](
            x2, w, y, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1), eps,
            HAS_WEIGHT=has_weight, BLOCK_N=block_n or 4096, num_warps=num_warps or 8)
    return y.view(x.shape)


def kernel_fn(x, weight, eps=1e-6):
    return rmsnorm(x, weight, eps)
