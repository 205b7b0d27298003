"""
Sum over the last dim of x[M, N] -> [M], in Triton. Starter kernel for AutoKernel.

Each program owns BLOCK_M rows and walks them in [BLOCK_M, BLOCK_N] tiles, accumulating in
fp32 lanes and reducing the lanes once at the end (a fixed order, so bitwise deterministic; an
fp16 accumulator would lose digits on long rows). Rows that fit (N <= MAX_FUSED_N) are read in
one tile, several rows per program when rows are short. Loads are marked evict_first: the data
is read once, and keeping it out of L2 measured 10% faster on the H100. The output has x's dtype.
A smaller grid (programs=) makes the kernel persistent; on the H100 that measured slower.

Measured on the H100 (16384x4096 fp16): 49.7 us, 2.70 TB/s (eager 60 us, torch.compile 50 us).

Usage:
  uv run bench.py --kernel kernels/reduce.py
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"

MAX_FUSED_N = 16384


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


def _config(M, N, fused):
    """About 8K elements a tile (~32 fp32 values per thread); whole rows when they fit.
    Measured on the H100 at 16384x4096 fp16: 2 rows x 4096, 8 warps, evict_first loads 49.7 us;
    1 row / 8 warps 51.8 us; without evict_first 57 us."""
    if fused:
        block_n = triton.next_power_of_2(N)
        block_m = min(max(1, 8192 // block_n), triton.next_power_of_2(M))
    else:
        block_n, block_m = 4096, 2
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
    tiles = triton.cdiv(M, bm)
    reduce_rows_kernel[(min(tiles, programs or tiles),)](
        x2, y, M, N, x2.stride(0), x2.stride(1), y.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=num_stages or 1, EVICT=evict, num_warps=nw)
    return y.view(x.shape[:-1])


def kernel_fn(x):
    return reduce(x)
