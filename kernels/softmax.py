"""
Softmax over the last dim of x[M, N], in Triton. Starter kernel for AutoKernel.

Two paths, picked by row length:
  * rows that fit in registers (N <= MAX_FUSED_N): one read, one write. Each program owns a
    [BLOCK_M, BLOCK_N] tile of whole rows (several rows per program when rows are short).
  * long rows (vocab-sized, e.g. 50257): one program per row loops over the row twice.
    Pass 1 keeps a running max (one per row) and per-lane sums of exp (online softmax, one exp
    per element) and loads with evict_last; pass 2 re-reads the row (last chunk first, so it is
    most likely still in L2, then evict_first) and writes. Chunks start on 16-byte boundaries
    even when rows don't (odd N), so the loads inside the row are unmasked 16-byte vectors.
    2048-element chunks, 4 warps: the best of a sweep on the H200 (chunks 2048-8192, 4-32
    warps): 338 us at 4096x50257 fp16, eager 352 us. On the H100 a persistent grid sized so the
    rows in flight fit in L2, and whole rows in registers with 16/32 warps, both measured
    slower. This path is the weakest starter: about 57% of the copy bandwidth.
Rows that fit, on the H200 (8192x8192 fp16): 69 us, 3.9 TB/s (eager 259 us).
Math in fp32 whatever the input dtype; the output has x's dtype.

Usage:
  uv run bench.py --kernel kernels/softmax.py      # the gate
  cp kernels/softmax.py kernel.py                  # start the agent from here
"""
import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"

LOG2E = tl.constexpr(1.4426950408889634)
MAX_FUSED_N = 16384   # longest row held whole in registers (fp32: 64 KB per program)


@triton.jit
def softmax_fused_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym, stride_yn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    rows64 = rows.to(tl.int64)[:, None]  # M*N can pass 2^31 elements
    x = tl.load(x_ptr + rows64 * stride_xm + cols[None, :] * stride_xn, mask=mask,
                other=-float("inf"), eviction_policy=EVICT).to(tl.float32)
    row_max = tl.max(x, axis=1)
    e = tl.exp2((x - row_max[:, None]) * LOG2E)
    inv_sum = 1.0 / tl.sum(e, axis=1)
    y = e * inv_sum[:, None]
    tl.store(y_ptr + rows64 * stride_ym + cols[None, :] * stride_yn,
             y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_chunk(x_ptr, row_off, c, N, stride_n, cols, ALIGN: tl.constexpr,
                BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    """Columns c .. c+BLOCK_N of the row at x_ptr + row_off, -inf outside [0, N). The caller
    makes row_off + c a multiple of ALIGN elements (16 bytes; ALIGN is 1 unless the row is
    unit-stride), so a chunk inside the row loads unmasked in 16-byte vectors even when the
    row length is odd (vocab 50257) and rows start misaligned."""
    if (c >= 0) & (c + BLOCK_N <= N):
        x = tl.load(x_ptr + tl.multiple_of(row_off + c * stride_n, ALIGN) + cols * stride_n,
                    eviction_policy=EVICT)
    else:
        cc = c + cols
        x = tl.load(x_ptr + row_off + cc * stride_n, mask=(cc >= 0) & (cc < N),
                    other=-float("inf"), eviction_policy=EVICT)
    return x.to(tl.float32)


@triton.jit
def _store_chunk(y_ptr, y, row_off, c, N, stride_n, cols, ALIGN: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    if (c >= 0) & (c + BLOCK_N <= N):
        tl.store(y_ptr + tl.multiple_of(row_off + c * stride_n, ALIGN) + cols * stride_n, y)
    else:
        cc = c + cols
        tl.store(y_ptr + row_off + cc * stride_n, y, mask=(cc >= 0) & (cc < N))


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym, stride_yn,
                          ALIGN: tl.constexpr, BLOCK_N: tl.constexpr, EVICT1: tl.constexpr,
                          EVICT2: tl.constexpr):
    """One row per program by default; a smaller grid makes it persistent (rows strided)."""
    cols = tl.arange(0, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)  # M*N can pass 2^31 elements
        x_off = row64 * stride_xm
        y_off = row64 * stride_ym
        first = -(x_off % ALIGN)   # chunks start on 16-byte boundaries (a negative lead)
        num_chunks = tl.cdiv(N - first, BLOCK_N)
        # Pass 1: one running max m for the row (a scalar, updated once per chunk) and per-lane
        # sums s of exp(x - m), rescaled when m grows: one FMA, one exp2 and one FMA an element.
        # (A per-lane running max costs ~4 more ALU ops an element; on the H200 it measured 8%
        # slower, the memory there being fast enough for the ALU work to show.)
        m = tl.full([], -float("inf"), tl.float32)
        s = tl.zeros([BLOCK_N], tl.float32)
        for k in range(0, num_chunks):
            x = _load_chunk(x_ptr, x_off, first + k * BLOCK_N, N, stride_xn, cols, ALIGN,
                            BLOCK_N, EVICT1)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)  # all -inf so far: exp2 -> 0
            s = s * tl.exp2((m - m_ref) * LOG2E) + tl.exp2((x - m_ref) * LOG2E)
            m = m_new
        row_max = m
        inv_sum = 1.0 / tl.sum(s, axis=0)
        # Pass 2: walk the row backwards; the chunks read last in pass 1 are likeliest in L2.
        for i in range(0, num_chunks):
            c = first + (num_chunks - 1 - i) * BLOCK_N
            x = _load_chunk(x_ptr, x_off, c, N, stride_xn, cols, ALIGN, BLOCK_N, EVICT2)
            y = tl.exp2((x - row_max) * LOG2E) * inv_sum
            _store_chunk(y_ptr, y.to(y_ptr.dtype.element_ty), y_off, c, N, stride_yn, cols,
                         ALIGN, BLOCK_N)


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def _fused_config(M, N):
    """Whole rows per program, ~16 fp32 values per thread, 8K elements a tile; 2K for rows of up
    to 1024 (at 16384x768 and 32768x512 on the H100, 2K tiles with 4 warps ran at the speed of a
    same-bytes copy and 8K tiles 1-5% slower: BENCHMARKS.md section 8)."""
    block_n = triton.next_power_of_2(N)
    tile = 2048 if block_n <= 1024 else 8192
    block_m = min(max(1, tile // block_n), triton.next_power_of_2(M))
    num_warps = min(16, max(1, block_m * block_n // 512))
    return block_m, block_n, num_warps


def softmax(x, fused=None, block_n=None, num_warps=None, block_m=None, evict="", programs=None,
            evict1="evict_last", evict2="evict_first"):
    """Launch with heuristic settings; the keyword overrides exist for tuning scripts."""
    N = x.shape[-1]
    x2 = x.reshape(-1, N)  # a view for the contiguous inputs the contract promises
    M = x2.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(x.shape)
    if fused is None:
        fused = N <= MAX_FUSED_N
    if fused:
        bm, bn, nw = _fused_config(M, N)
        bm, nw = block_m or bm, num_warps or nw
        softmax_fused_kernel[((M + bm - 1) // bm,)](
            x2, y, M, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=bm, BLOCK_N=bn, EVICT=evict, num_warps=nw)
    else:
        bn = block_n or 2048
        programs = min(M, programs or M)
        # 16-byte chunk alignment holds for x and y alike only for unit-stride rows whose
        # row strides agree modulo 16 bytes (always so for the contiguous inputs of the contract)
        align = 16 // x.element_size()
        if x2.stride(1) != 1 or (x2.stride(0) - y.stride(0)) % align:
            align = 1
        softmax_looped_kernel[(programs,)](
            x2, y, M, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1),
            ALIGN=align, BLOCK_N=bn, EVICT1=evict1, EVICT2=evict2, num_warps=num_warps or 4)
    return y.view(x.shape)


def kernel_fn(x):
    return softmax(x)
