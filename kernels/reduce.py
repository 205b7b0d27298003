"""
Sum over the last dim of x[M, N] -> [M], in Triton. Starter kernel for AutoKernel.

Each program owns BLOCK_M rows and walks them in [BLOCK_M, BLOCK_N] tiles, accumulating in
fp32 lanes and reducing the lanes once at the end (a fixed order, so bitwise deterministic; an
fp16 accumulator would lose digits on long rows). Short rows (N <= MAX_FUSED_N) are read in one
tile, several rows per program; longer rows one row per program in 1024-column tiles. Loads
are marked evict_first: the data is read once, and keeping it out of L2 measured 10% faster on
the H100. The output has x's dtype. A smaller grid (programs=) makes the kernel persistent; on
the H100 that measured slower.

On the H200 (16384x4096 fp16) a sweep of tile shapes, warps and pipeline stages put one row per
program in 1024-column tiles with 8 warps first: 35.9 us, 3.7 TB/s (whole 4096-column rows in
one tile: 39.0 us at best; eager 45.8 us).

Usage:
  uv run bench.py --kernel kernels/reduce.py
"""
import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"

MAX_FUSED_N = 1024   # longer rows: looped 1024-column tiles (faster than one wide tile)


@triton.jit
def reduce_rows_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_y,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
                       EVICT: tl.constexpr):
    # Persistent when the grid is smaller than the number of row tiles.
    cols = tl.arange(0, BLOCK_N)
    for tile in range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=NUM_STAGES):
            c = start + cols
            mask = row_ok[:, None] & (c < N)[None, :]
            acc += tl.load(x_rows + c[None, :] * stride_xn, mask=mask, other=0.0,
                           eviction_policy=EVICT).to(tl.float32)
        total = tl.sum(acc, axis=1)
        tl.store(y_ptr + rows * stride_y, total.to(y_ptr.dtype.element_ty), mask=row_ok)


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def _config(M, N, fused):
    """Short rows: ~8K elements a tile (~32 fp32 values per thread), whole rows. Long rows: one
    row per program, 1024 columns a step, 8 warps (the H200 sweep's best at 16384x4096)."""
    if not fused:
        return 1, 1024, 8
    block_n = triton.next_power_of_2(N)
    block_m = min(max(1, 8192 // block_n), triton.next_power_of_2(M))
    num_warps = min(16, max(1, block_m * block_n // 1024))
    return block_m, block_n, num_warps


def reduce(x, fused=None, block_n=None, num_warps=None, block_m=None, programs=None,
           num_stages=None, evict="evict_first"):
    """Launch with heuristic settings; the keyword overrides exist for tuning scripts."""
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    M = x2.shape[0]
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    if M == 0:
        return y.view(x.shape[:-1])
    if fused is None:
        fused = N <= MAX_FUSED_N
    bm, bn, nw = _config(M, N, fused)
    bm, bn, nw = block_m or bm, block_n or bn, num_warps or nw
    tiles = (M + bm - 1) // bm
    reduce_rows_kernel[(min(tiles, programs or tiles),)](
        x2, y, M, N, x2.stride(0), x2.stride(1), y.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=num_stages or 1, EVICT=evict, num_warps=nw)
    return y.view(x.shape[:-1])


def kernel_fn(x):
    return reduce(x)
