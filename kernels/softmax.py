"""
Softmax over the last dim of x[M, N], in Triton. Starter kernel for AutoKernel.

Three paths, picked by row length and row count:
  * rows that fit in registers (N <= MAX_FUSED_N): one read, one write. Each program owns a
    [BLOCK_M, BLOCK_N] tile of whole rows (several rows per program when rows are short).
  * long rows (vocab-sized, e.g. 50257): one program per row loops over the row twice.
    Pass 1 keeps a running max (one per row) and per-lane sums of exp (online softmax, one exp
    per element) and loads with evict_last; pass 2 re-reads the row (last chunk first, so it is
    most likely still in L2, then evict_first) and writes. Chunks start on 16-byte boundaries
    even when rows don't (odd N), so the loads inside the row are unmasked 16-byte vectors.
    2048-element chunks, 4 warps: the best of a sweep on the H200 (chunks 2048-8192, 4-32
    warps): 338 us at 4096x50257 fp16, eager 352 us. On the H100 (429 us, eager 388) a
    persistent grid sized so the rows in flight fit in L2, whole rows in registers (they
    spill) and 1024-thread programs all measured slower: the second read comes from HBM, so
    this path runs at about 64% of the copy bandwidth, the weakest of the starters.
  * few long rows (fewer than 4 per SM, e.g. the logits of one decoding step): one program per
    row would leave SMs idle, so rows are split into slices; one kernel writes each slice's
    (max, sum of exp), a second combines a row's partials and writes the slice. On the H100
    (GPU time, fp16): 8x50257 6.7 us (one program per row: 25.1, torch 16.3), 8x128256 7.5
    (60.7, torch 35.2). The price is a second launch: ~50 us more host time per call, which
    only CUDA graphs hide.
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
def _row_stats(x_ptr, x_off, c_begin, num_chunks, N, stride_n, cols, ALIGN: tl.constexpr,
               BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    """Pass 1 over chunks c_begin + k * BLOCK_N, k < num_chunks: one running max m (a scalar,
    updated once per chunk) and per-lane sums s of exp(x - m), rescaled when m grows: one FMA,
    one exp2 and one FMA an element. (A per-lane running max costs ~4 more ALU ops an element;
    on the H200 it measured 8% slower, the memory there being fast enough for ALU work to show.)"""
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    for k in range(0, num_chunks):
        x = _load_chunk(x_ptr, x_off, c_begin + k * BLOCK_N, N, stride_n, cols, ALIGN, BLOCK_N,
                        EVICT)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)  # all -inf so far: exp2 -> 0
        s = s * tl.exp2((m - m_ref) * LOG2E) + tl.exp2((x - m_ref) * LOG2E)
        m = m_new
    return m, s


@triton.jit
def _write_chunks(x_ptr, y_ptr, x_off, y_off, c_begin, num_chunks, row_max, inv_sum, N,
                  stride_xn, stride_yn, cols, ALIGN: tl.constexpr, BLOCK_N: tl.constexpr,
                  EVICT: tl.constexpr):
    """Pass 2: y = exp(x - row_max) * inv_sum over the same chunks, walked backwards: the chunks
    read last in pass 1 are the likeliest to still be in L2."""
    for i in range(0, num_chunks):
        c = c_begin + (num_chunks - 1 - i) * BLOCK_N
        x = _load_chunk(x_ptr, x_off, c, N, stride_xn, cols, ALIGN, BLOCK_N, EVICT)
        y = tl.exp2((x - row_max) * LOG2E) * inv_sum
        _store_chunk(y_ptr, y.to(y_ptr.dtype.element_ty), y_off, c, N, stride_yn, cols, ALIGN,
                     BLOCK_N)


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym, stride_yn,
                          ALIGN: tl.constexpr, BLOCK_N: tl.constexpr, EVICT1: tl.constexpr,
                          EVICT2: tl.constexpr):
    """One row per program by default; a smaller grid makes it persistent (rows strided)."""
    cols = tl.arange(0, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)  # M*N can pass 2^31 elements
        x_off = row64 * stride_xm
        first = -(x_off % ALIGN)   # chunks start on 16-byte boundaries (a negative lead)
        num_chunks = tl.cdiv(N - first, BLOCK_N)
        m, s = _row_stats(x_ptr, x_off, first, num_chunks, N, stride_xn, cols, ALIGN, BLOCK_N,
                          EVICT1)
        _write_chunks(x_ptr, y_ptr, x_off, row64 * stride_ym, first, num_chunks, m,
                      1.0 / tl.sum(s, axis=0), N, stride_xn, stride_yn, cols, ALIGN, BLOCK_N,
                      EVICT2)


# Few long rows (e.g. the logits of one decoding step, M = batch size): one program per row
# would leave most SMs idle, so each row is cut into slices of chunks_per_split chunks. The first
# kernel writes each slice's (max, sum of exp); the second combines a row's partials and
# writes its slice. Two launches; few rows fit in L2, so the second read of x mostly hits it.
@triton.jit
def _program_slice(N, stride_xm, chunks_per_split, ALIGN: tl.constexpr, BLOCK_N: tl.constexpr):
    """(row, x_off, c_begin, num_chunks) of this program's slice: program (row, split) takes
    chunks split * chunks_per_split onwards of the row's 16-byte-aligned chunks (the last
    slices of a row can be short or empty)."""
    row64 = tl.program_id(0).to(tl.int64)
    x_off = row64 * stride_xm
    c_begin = -(x_off % ALIGN) + tl.program_id(1) * chunks_per_split * BLOCK_N
    num_chunks = tl.minimum(chunks_per_split, tl.cdiv(N - c_begin, BLOCK_N))
    return row64, x_off, c_begin, num_chunks


@triton.jit
def softmax_split_stats_kernel(x_ptr, part_max_ptr, part_sum_ptr, N, stride_xm, stride_xn,
                               chunks_per_split, ALIGN: tl.constexpr, BLOCK_N: tl.constexpr,
                               EVICT: tl.constexpr):
    row64, x_off, c_begin, num_chunks = _program_slice(N, stride_xm, chunks_per_split, ALIGN, BLOCK_N)
    m, s = _row_stats(x_ptr, x_off, c_begin, num_chunks, N, stride_xn, tl.arange(0, BLOCK_N),
                      ALIGN, BLOCK_N, EVICT)
    out = row64 * tl.num_programs(1) + tl.program_id(1)
    tl.store(part_max_ptr + out, m)
    tl.store(part_sum_ptr + out, tl.sum(s, axis=0))


@triton.jit
def softmax_split_write_kernel(x_ptr, y_ptr, part_max_ptr, part_sum_ptr, N, stride_xm, stride_xn,
                               stride_ym, stride_yn, chunks_per_split, SPLITS_POW2: tl.constexpr,
                               ALIGN: tl.constexpr, BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    row64, x_off, c_begin, num_chunks = _program_slice(N, stride_xm, chunks_per_split, ALIGN, BLOCK_N)
    splits = tl.num_programs(1)
    k = tl.arange(0, SPLITS_POW2)
    pm = tl.load(part_max_ptr + row64 * splits + k, mask=k < splits, other=-float("inf"))
    ps = tl.load(part_sum_ptr + row64 * splits + k, mask=k < splits, other=0.0)
    row_max = tl.max(pm, axis=0)
    scale = tl.where(pm == -float("inf"), 0.0, tl.exp2((pm - row_max) * LOG2E))
    inv_sum = 1.0 / tl.sum(ps * scale, axis=0)
    _write_chunks(x_ptr, y_ptr, x_off, row64 * stride_ym, c_begin, num_chunks, row_max, inv_sum,
                  N, stride_xn, stride_yn, tl.arange(0, BLOCK_N), ALIGN, BLOCK_N, EVICT)


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


@functools.lru_cache(maxsize=None)
def _sm_count(device_index):
    if device_index is None:   # CPU interpreter: a small "GPU" keeps test grids small
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _long_row_plan(M, N, block_n, align, splits, sm_count):
    """(block_n, splits, chunks_per_split, splits_pow2) for rows too long for registers: enough
    programs for ~4 per SM (so one program per row from 4 * sm_count rows on), never a slice
    shorter than a chunk. Chunks: 2048 for one program per row (sweeps on the H100 and H200);
    split rows take 4096 once there is a program per SM anyway (132-264 rows: 5-12% faster on
    the H100)."""
    if splits is None:
        splits = max(1, (4 * sm_count + M - 1) // M)
    if block_n is None:
        block_n = 4096 if 1 < splits and sm_count <= M else 2048
    chunks = (N + align - 1 + block_n - 1) // block_n   # the most any row's alignment lead needs
    splits = min(splits, chunks)
    chunks_per_split = (chunks + splits - 1) // splits
    splits = (chunks + chunks_per_split - 1) // chunks_per_split  # none starting past the row
    return block_n, splits, chunks_per_split, triton.next_power_of_2(splits)


def softmax(x, fused=None, block_n=None, num_warps=None, block_m=None, evict="", programs=None,
            evict1="evict_last", evict2="evict_first", splits=None):
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
        return y.view(x.shape)
    nw = num_warps or 4
    # 16-byte chunk alignment holds for x and y alike only for unit-stride rows whose
    # row strides agree modulo 16 bytes (always so for the contiguous inputs of the contract)
    align = 16 // x.element_size()
    if x2.stride(1) != 1 or (x2.stride(0) - y.stride(0)) % align:
        align = 1
    if programs:   # a persistent grid strides over whole rows
        splits = 1
    bn, splits, chunks_per_split, splits_pow2 = _long_row_plan(
        M, N, block_n, align, splits, _sm_count(x.device.index if x.is_cuda else None))
    if splits == 1:
        softmax_looped_kernel[(min(M, programs or M),)](
            x2, y, M, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1),
            ALIGN=align, BLOCK_N=bn, EVICT1=evict1, EVICT2=evict2, num_warps=nw)
        return y.view(x.shape)
    part_max, part_sum = torch.empty((2, M, splits), dtype=torch.float32, device=x.device)
    softmax_split_stats_kernel[(M, splits)](
        x2, part_max, part_sum, N, x2.stride(0), x2.stride(1), chunks_per_split,
        ALIGN=align, BLOCK_N=bn, EVICT=evict1, num_warps=nw)
    softmax_split_write_kernel[(M, splits)](
        x2, y, part_max, part_sum, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1),
        chunks_per_split, SPLITS_POW2=splits_pow2, ALIGN=align, BLOCK_N=bn, EVICT=evict2,
        num_warps=nw)
    return y.view(x.shape)


def kernel_fn(x):
    return softmax(x)
