"""
Sum of x over one dim (x of any rank, dim may be negative) -> x.sum(dim), in Triton. Starter
kernel for AutoKernel. Accumulation in fp32 whatever the input dtype (an fp16 accumulator would
lose digits on long sums); the output has x's dtype.

A contiguous x is viewed as [outer, R, inner]: R is the summed dim, outer the dims before it,
inner the dims after it, and the output is [outer, inner] (reshaped to x.sum(dim)'s shape). Two
kernels, picked by inner:

  * inner == 1 (the last dim, the common case): rows of R contiguous elements. Each program owns
    BLOCK_M rows and walks them in [BLOCK_M, BLOCK_N] tiles, accumulating in fp32 lanes and
    reducing the lanes once at the end (a fixed order, so bitwise deterministic). Short rows
    (R <= MAX_FUSED_N) are read in one tile, several rows per program; longer rows one row per
    program in 1024-column tiles. Loads are marked evict_first: the data is read once, and
    keeping it out of L2 measured 10% faster on the H100. A smaller grid (programs=) makes the
    kernel persistent; on the H100 that measured slower.
  * inner > 1 (dim 0 of a matrix, a middle dim): the R terms of one output sit `inner` elements
    apart, while neighbouring outputs are neighbours in memory. So a program owns BLOCK_I
    neighbouring outputs of one outer index and walks R in [BLOCK_R, BLOCK_I] tiles: each tile
    row is one contiguous (coalesced) load, the tile is added into fp32 lanes, and the lanes are
    reduced over R once at the end (again a fixed order). Tiles hold ~4K elements; when few
    programs would each walk a long R, the column block narrows (down to 32) to spread the work
    over more programs.

An empty output returns at once; R == 0 (a sum of nothing) writes zeros.

On the H200 (16384x4096 fp16, last dim) a sweep of tile shapes, warps and pipeline stages put one
row per program in 1024-column tiles with 8 warps first: 35.9 us, 3.7 TB/s (whole 4096-column
rows in one tile: 39.0 us at best; eager 45.8 us).

Things to try for inner > 1: split R over several programs (partial sums, then a second pass
that adds them in a fixed order) when outer * inner is too small to fill the GPU.

Usage:
  uv run bench.py --kernel kernels/reduce.py
"""
import functools
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"

MAX_FUSED_N = 1024   # longer rows: looped 1024-column tiles (faster than one wide tile)
TILE = 4096          # elements of one [BLOCK_R, BLOCK_I] tile of the inner > 1 kernel


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


@triton.jit
def reduce_inner_kernel(x_ptr, y_ptr, R, INNER, col_blocks, stride_xo, stride_xr, stride_xi,
                        stride_yo, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
                        EVICT: tl.constexpr):
    # Program o * col_blocks + j sums x[o, :, j*BLOCK_I : (j+1)*BLOCK_I] over R into
    # y[o, j*BLOCK_I : (j+1)*BLOCK_I]: neighbouring programs read neighbouring column blocks.
    pid = tl.program_id(0)
    o = (pid // col_blocks).to(tl.int64)
    cols = (pid % col_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_ok = cols < INNER
    r = tl.arange(0, BLOCK_R)
    # The pointer advances by BLOCK_R rows a step: 64-bit pointer math, no int32 offset overflow.
    ptrs = x_ptr + o * stride_xo + r[:, None] * stride_xr + cols[None, :] * stride_xi
    acc = tl.zeros([BLOCK_R, BLOCK_I], tl.float32)
    for start in range(0, R, BLOCK_R):
        mask = ((start + r) < R)[:, None] & col_ok[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        ptrs += BLOCK_R * stride_xr
    total = tl.sum(acc, axis=0)
    tl.store(y_ptr + o * stride_yo + cols, total.to(y_ptr.dtype.element_ty), mask=col_ok)


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def _config(M, N, fused):
    """Short rows: ~8K elements a tile (~32 fp32 values per thread), whole rows. Long rows: one
    row per program, 1024 columns a step, 8 warps (the H200 sweep's best at 16384x4096)."""
    if not fused:
        return 1, 1024, 8
    block_n = triton.next_power_of_2(max(N, 1))  # N == 0: one empty tile, a sum of 0
    block_m = min(max(1, 8192 // block_n), triton.next_power_of_2(M))
    num_warps = min(16, max(1, block_m * block_n // 1024))
    return block_m, block_n, num_warps


@functools.lru_cache(maxsize=None)
def _inner_config(outer, R, inner):
    """[BLOCK_R, BLOCK_I] tiles of ~TILE elements: a short R leaves room for a wide column block
    (R == 1: 4096 columns, a plain copy), a long R takes 32 rows a step. While fewer than 256
    programs would each walk more than 64K elements, halve the column block (not below 32
    columns, 64 bytes of fp16 a row) so that more SMs share the work."""
    r_pow2 = triton.next_power_of_2(max(R, 1))
    block_i = min(triton.next_power_of_2(inner), max(32, TILE // min(r_pow2, 32)))
    while block_i > 32 and outer * ((inner + block_i - 1) // block_i) < 256 \
            and R * block_i > 65536:
        block_i //= 2
    block_r = min(r_pow2, max(1, TILE // block_i))
    num_warps = min(8, max(1, block_r * block_i // 512))
    return block_r, block_i, num_warps


def _split(shape, dim):
    """(outer, R, inner, output shape) of a sum over `dim` of a tensor of this shape."""
    ndim = len(shape)
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"dim {dim} out of range for a tensor of {ndim} dims")
    if ndim == 0:  # a 0-d tensor sums to itself
        return 1, 1, 1, ()
    dim %= ndim
    return (math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:]),
            tuple(shape[:dim]) + tuple(shape[dim + 1:]))


def reduce(x, dim=-1, fused=None, block_n=None, num_warps=None, block_m=None, programs=None,
           num_stages=None, evict="evict_first", block_r=None, block_i=None):
    """Launch with heuristic settings; the keyword overrides exist for tuning scripts (block_m,
    block_n, programs, num_stages: the inner == 1 kernel; block_r, block_i: the other)."""
    outer, R, inner, out_shape = _split(tuple(x.shape), dim)
    y = torch.empty((outer, inner), dtype=x.dtype, device=x.device)
    if outer * inner == 0:
        return y.view(out_shape)
    if inner == 1:
        x2 = x.reshape(outer, R)
        if fused is None:
            fused = R <= MAX_FUSED_N
        bm, bn, nw = _config(outer, R, fused)
        bm, bn, nw = block_m or bm, block_n or bn, num_warps or nw
        tiles = (outer + bm - 1) // bm
        reduce_rows_kernel[(min(tiles, programs or tiles),)](
            x2, y, outer, R, x2.stride(0), x2.stride(1), y.stride(0),
            BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=num_stages or 1, EVICT=evict, num_warps=nw)
    else:
        x3 = x.reshape(outer, R, inner)
        br, bi, nw = _inner_config(outer, R, inner)
        br, bi, nw = block_r or br, block_i or bi, num_warps or nw
        col_blocks = (inner + bi - 1) // bi
        reduce_inner_kernel[(outer * col_blocks,)](
            x3, y, R, inner, col_blocks, x3.stride(0), x3.stride(1), x3.stride(2), y.stride(0),
            BLOCK_R=br, BLOCK_I=bi, EVICT=evict, num_warps=nw)
    return y.view(out_shape)


def kernel_fn(x, dim=-1):
    return reduce(x, dim)
