"""
LayerNorm over the last dim of x[M, N], in Triton: y = (x - mean) * rsqrt(var + eps)
(* weight) (+ bias), with weight[N] and bias[N] each present or None. Starter kernel for
AutoKernel.

eps is a runtime argument (1e-5 by default; models use 1e-5, 1e-6, 1e-12): one compiled kernel
serves them all. A None weight or bias compiles its load and its multiply or add out
(HAS_WEIGHT and HAS_BIAS are constexprs: one specialization per combination, no branch at run
time); x stands in for the missing pointer.

Two paths, picked by row length:
  * rows that fit in registers (N <= MAX_FUSED_N): one read, one write. The variance is taken
    around the mean already in registers (two-pass in registers), so rows with a large mean and
    tiny variance do not cancel; weight and bias are loaded once per program.
  * long rows: one program per row; pass 1 sums (x - x[0]) and its square (shifting by the row's
    first element keeps E[d^2] - E[d]^2 from cancelling), pass 2 re-reads, normalizes and writes.
Math in fp32; the output has x's dtype.

Measured on the H100 (8192x4096 fp16): 51 us, 2.64 TB/s (eager 66 us, torch.compile 52 us);
on the H200 38 us, 3.5 TB/s (eager 59 us).

What has worked here: the row kept in registers, its variance taken around its mean (two-pass
or Welford, never E[x^2] - E[x]^2 of the raw values: it cancels when the mean dwarfs the
spread), weight and bias applied before the one store.

Usage:
  uv run bench.py --kernel kernels/layernorm.py
"""
import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "layernorm"
BACKEND = "triton"

MAX_FUSED_N = 16384


@triton.jit
def layernorm_fused_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, stride_xm, stride_xn,
                           stride_ym, stride_yn, eps,
                           HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_xm + cols[None, :] * stride_xn, mask=mask,
                other=0.0, eviction_policy=EVICT).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    diff = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / N + eps)
    y = diff * rstd[:, None]
    if HAS_WEIGHT:
        y *= tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows64 * stride_ym + cols[None, :] * stride_yn,
             y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_looped_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, stride_xm, stride_xn,
                            stride_ym, stride_yn, eps, HAS_WEIGHT: tl.constexpr,
                            HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    cols = tl.arange(0, BLOCK_N)
    shift = tl.load(x_row).to(tl.float32)
    acc = tl.zeros([BLOCK_N], tl.float32)
    acc_sq = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        x = tl.load(x_row + c * stride_xn, mask=c < N, other=0.0).to(tl.float32)
        d = tl.where(c < N, x - shift, 0.0)
        acc += d
        acc_sq += d * d
    mean_d = tl.sum(acc, axis=0) / N
    var = tl.maximum(tl.sum(acc_sq, axis=0) / N - mean_d * mean_d, 0.0)
    mean = shift + mean_d
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        x = tl.load(x_row + c * stride_xn, mask=c < N, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + c, mask=c < N, other=0.0).to(tl.float32)
        tl.store(y_row + c * stride_yn, y.to(y_ptr.dtype.element_ty), mask=c < N)


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def _fused_config(M, N):
    """Whole rows per program: about 8K elements a tile, ~32 fp32 values per thread (8 warps
    for 8K elements measured 5% faster than 16 on the H200 at 8192x4096). Rows of up to 1024:
    2K-element tiles with 4 warps, which ran at the speed of a same-bytes copy at 16384x768 on
    the H100 (22.7 us) where 8K tiles took 25.0."""
    block_n = triton.next_power_of_2(N)
    short = block_n <= 1024
    block_m = min(max(1, (2048 if short else 8192) // block_n), triton.next_power_of_2(M))
    num_warps = min(16, max(1, block_m * block_n // (512 if short else 1024)))
    return block_m, block_n, num_warps


def layernorm(x, weight, bias, eps=1e-5, fused=None, block_n=None, num_warps=None, block_m=None,
              evict=""):
    """Launch with heuristic settings; the keyword overrides exist for tuning scripts."""
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    M = x2.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(x.shape)
    # weight/bias are indexed as contiguous vectors; a missing one passes x as a pointer that
    # is never read (its load is compiled out)
    has_weight, has_bias = weight is not None, bias is not None
    assert all(t is None or t.stride(-1) == 1 for t in (weight, bias)), \
        "weight and bias must be contiguous"
    w = weight if has_weight else x2
    b = bias if has_bias else x2
    if fused is None:
        fused = N <= MAX_FUSED_N
    if fused:
        bm, bn, nw = _fused_config(M, N)
        bm, nw = block_m or bm, num_warps or nw
        layernorm_fused_kernel[((M + bm - 1) // bm,)](
            x2, w, b, y, M, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1), eps,
            HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, BLOCK_M=bm, BLOCK_N=bn, EVICT=evict,
            num_warps=nw)
    else:
        layernorm_looped_kernel[(M,)](
            x2, w, b, y, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1), eps,
            HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, BLOCK_N=block_n or 4096,
            num_warps=num_warps or 8)
    return y.view(x.shape)


def kernel_fn(x, weight, bias, eps=1e-5):
    return layernorm(x, weight, bias, eps)
