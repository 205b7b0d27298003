"""
Starter kernel: fused SwiGLU MLP, out = (silu(x w_gate^T) * (x w_up^T)) w_down^T, in Triton
(and Gluon, Triton's lower-level dialect, on Hopper).

    from kernels.fused_mlp import kernel_fn; out = kernel_fn(x=x, w_gate=wg, w_up=wu, w_down=wd)
    uv run bench.py            # after extract.py (or you) copied this file to kernel.py

Shapes: x[M,D], w_gate/w_up[F,D], w_down[D,F] (nn.Linear weights) -> out[M,D]; residual[M,D],
when given, is added to out (a block's `x + mlp(norm(x))`: the sum leaves the GEMM in one pass).
Two GEMMs (this file is standalone on purpose: extract.py copies it alone):
  1. GATED: each tile of x w_gate^T and the same tile of x w_up^T are computed from one x tile
     (two fp32 accumulators, x read once for both), silu(g) * u is taken in registers and h[M,F]
     is written once. Eager writes gate and up, reads them back for silu and the product: ~5
     extra passes over an [M,F] tensor that never happen here.
  2. h @ w_down^T, a plain GEMM, the residual added in its epilogue in fp32.
h is kept in the input dtype (as eager keeps it); the gate math runs in fp32 before that rounding.
The gated GEMM on Hopper (half precision, 16-byte aligned rows, >= 2^30 multiply-adds) is a
Gluon kernel, persistent and warp-specialized like kernels/matmul.py's: a one-warp producer
issues the TMA loads of the x, w_gate and w_up tiles into a ring of shared-memory stages, two
warpgroups issue the wgmma products into two 64x128 accumulators each and store h through TMA.
On an H100 (bf16, GPU time) it runs within 0-3% of cuBLAS computing gate and up as one GEMM
of width 2F with no activation at all (the same multiply-adds): 262 us at 16384x768x3072
against 255, where cuBLAS's two GEMMs + silu*mul take 408 and the Triton kernel below 290.
Elsewhere, and for the down projection, Triton kernels as kernels/matmul.py's: grouped
(L2-friendly) tile order; on Hopper, when the operands are row-major with 16-byte aligned rows,
TMA loads, and for a half-precision down projection of 2^30 or more multiply-adds a persistent
kernel (one program per SM looping over tiles in one flattened pipeline, descriptors built on
the device, the tile stored in two column halves), so a tile's epilogue overlaps the next
tile's loads; a pointer path honouring any strides otherwise, and tf32x3 dots for fp32 inputs
(~1e-6 error against the 1e-4 tolerance).
A generation step's few rows (M <= SKINNY_MAX_M = 16) take a split-K path in both GEMMs: each
program a column block of one slice of K (skinny_config: at M = 1 a 2048-wide down projection
would otherwise be 32 programs on 132 SMs), fp32 partial sums, then a kernel adding the slices
in order with silu(gate) * up or the residual. On an H100 at Llama-3.2-1B's MLP, M = 1: the
gated GEMM 25.9 us (86% of the copy bandwidth; cuBLAS 30.4), the down projection 9.1 us.
Things to try: the down projection in the Gluon kernel, ping-pong tiles for the gated GEMM at
small K (slower at 64 rows: 324 us at 16384x768x3072), fusing the down projection; at decode,
the skinny path's tiles and slices per shape, and the down projection started while the gate
slices finish.
"""
import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.runtime import _allocation

KERNEL_TYPE = "fused_mlp"
BACKEND = "triton"


@triton.jit
def _tile_of(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile index -> (pid_m, pid_n) in groups of GROUP_M tile rows (neighbours share L2 data)."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % group_rows
    pid_n = (tile % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _tile_coords(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (pid_m, pid_n) for the one-tile-per-program kernels."""
    return _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)


@triton.jit
def _silu_times(gate, up):
    # silu(g) = g * sigmoid(g) = g / (1 + exp(-g)); exp(-g) = inf for g << 0 gives -0, not NaN.
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _add_residual(acc, res_ptr, stride_rm, off_m, off_n, M, N, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The down projection's residual: the tile's [BLOCK_M, BLOCK_N] of residual (rows
    stride_rm apart, unit-stride columns) added in fp32, so out is still rounded once."""
    if HAS_RESIDUAL:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        ptrs = res_ptr + offs_m[:, None].to(tl.int64) * stride_rm + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def mlp_gemm_ptr_kernel(a_ptr, w1_ptr, w2_ptr, c_ptr, res_ptr, M, N, K,
                        stride_am, stride_ak, stride_w1n, stride_w1k, stride_w2n, stride_w2k,
                        stride_cm, stride_cn, stride_rm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr,
                        PRECISION: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """C = a @ w1^T (+ residual), or silu(a @ w1^T) * (a @ w2^T) when GATED."""
    pid_m, pid_n = _tile_coords(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = offs_m % M  # wrapped: loads need no M/N mask, the store has one
    cols = offs_n % N
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    # [BLOCK_K, BLOCK_N] tiles of w^T, read straight from the [N,K] weights
    w1_ptrs = w1_ptr + offs_k[:, None] * stride_w1k + cols[None, :].to(tl.int64) * stride_w1n
    w2_ptrs = w2_ptr + offs_k[:, None] * stride_w2k + cols[None, :].to(tl.int64) * stride_w2n
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w1 = tl.load(w1_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            w1 = tl.load(w1_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc1 = tl.dot(a, w1, acc1, input_precision=PRECISION)
        if GATED:
            if EVEN_K:
                w2 = tl.load(w2_ptrs)
            else:
                w2 = tl.load(w2_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc2 = tl.dot(a, w2, acc2, input_precision=PRECISION)
            w2_ptrs += BLOCK_K * stride_w2k
        a_ptrs += BLOCK_K * stride_ak
        w1_ptrs += BLOCK_K * stride_w1k
    if GATED:
        acc1 = _silu_times(acc1, acc2)
    acc1 = _add_residual(acc1, res_ptr, stride_rm, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N,
                         BLOCK_M, BLOCK_N, HAS_RESIDUAL)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc1.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def skinny_partial_kernel(a_ptr, w1_ptr, w2_ptr, part_ptr, M, N, K, stride_am, stride_ak,
                          stride_w1n, stride_w1k, stride_w2n, stride_w2k, K_PER_SPLIT,
                          GATED: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A generation step's few rows (M <= SKINNY_MAX_M) against all of the weights: a program
    per (column block, slice of K), so the weights, which are all the traffic, stream through
    every SM even where N is narrow. Writes the slice's fp32 sums of a @ w1^T (and a @ w2^T
    when GATED, at part[.., 1]) for the M real rows to part[slice, 1 or 2, M, N]."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < k_end), other=0.0)
        w_mask = (ks[:, None] < k_end) & (cols[None, :] < N)
        w1 = tl.load(w1_ptr + ks[:, None] * stride_w1k + cols[None, :].to(tl.int64) * stride_w1n,
                     mask=w_mask, other=0.0)
        acc1 = tl.dot(a, w1, acc1, input_precision=PRECISION)
        if GATED:
            w2 = tl.load(w2_ptr + ks[:, None] * stride_w2k
                         + cols[None, :].to(tl.int64) * stride_w2n, mask=w_mask, other=0.0)
            acc2 = tl.dot(a, w2, acc2, input_precision=PRECISION)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    parts: tl.constexpr = 2 if GATED else 1
    out = part_ptr + ((pid_k * parts) * M + rows[:, None]).to(tl.int64) * N + cols[None, :]
    tl.store(out, acc1, mask=mask)
    if GATED:
        tl.store(out + M * N, acc2, mask=mask)


@triton.jit
def skinny_epilogue_kernel(part_ptr, c_ptr, res_ptr, M, N, SPLITS, stride_cm, stride_rm,
                           GATED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The slices' sums added in slice order (deterministic: no atomics), then silu(gate) * up
    or the residual, one rounding to c's dtype."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    parts: tl.constexpr = 2 if GATED else 1
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLITS):
        at = part_ptr + ((s * parts) * M + rows[:, None]).to(tl.int64) * N + cols[None, :]
        acc1 += tl.load(at, mask=mask, other=0.0)
        if GATED:
            acc2 += tl.load(at + M * N, mask=mask, other=0.0)
    if GATED:
        acc1 = _silu_times(acc1, acc2)
    acc1 = _add_residual(acc1, res_ptr, stride_rm, 0, tl.program_id(0) * BLOCK_N, M, N,
                         BLOCK_M, BLOCK_N, HAS_RESIDUAL)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :],
             acc1.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def mlp_gemm_tma_kernel(a_desc, w1_desc, w2_desc, c_desc, res_ptr, M, N, K, stride_rm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, GATED: tl.constexpr, OUT_DTYPE: tl.constexpr,
                        PRECISION: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The same GEMM with row-major a[M,K], w[N,K], c[M,N] read and written by TMA."""
    pid_m, pid_n = _tile_coords(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        off_k = k * BLOCK_K
        a = a_desc.load([off_m, off_k])
        acc1 = tl.dot(a, w1_desc.load([off_n, off_k]).T, acc1, input_precision=PRECISION)
        if GATED:
            acc2 = tl.dot(a, w2_desc.load([off_n, off_k]).T, acc2, input_precision=PRECISION)
    if GATED:
        acc1 = _silu_times(acc1, acc2)
    acc1 = _add_residual(acc1, res_ptr, stride_rm, off_m, off_n, M, N, BLOCK_M, BLOCK_N,
                         HAS_RESIDUAL)
    c_desc.store([off_m, off_n], acc1.to(OUT_DTYPE))


@triton.jit
def mlp_gemm_persistent_kernel(a_desc, w_desc, c_desc, res_ptr, M, N, K, a_rs, w_rs, c_rs,
                               r_rs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                               OUT_DTYPE: tl.constexpr, EPI_SPLIT: tl.constexpr,
                               NUM_PROGRAMS: tl.constexpr, DEVICE_DESC: tl.constexpr,
                               HAS_RESIDUAL: tl.constexpr):
    """The down projection a @ w^T (+ residual), persistent: one program per SM looping over
    tiles p, p + NUM_PROGRAMS, ... in one flattened software pipeline, so the next tile's loads
    are in flight while this one's epilogue (the residual, the cast, the store in EPI_SPLIT
    column slices) runs."""
    EPI_N: tl.constexpr = BLOCK_N // EPI_SPLIT
    if DEVICE_DESC:  # raw tensors came in: build the descriptors here (no host encoding)
        a_desc = tl.make_tensor_descriptor(a_desc, [M, K], [a_rs, 1], [BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_desc, [N, K], [w_rs, 1], [BLOCK_N, BLOCK_K])
        c_desc = tl.make_tensor_descriptor(c_desc, [M, N], [c_rs, 1], [BLOCK_M, EPI_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    # The epilogue recomputes its tile from a counter of its own: nothing from the prologue
    # stays live across the flattened K loop.
    epi_tile = tl.program_id(0) - NUM_PROGRAMS
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, k_steps):
            off_k = k * BLOCK_K
            acc = tl.dot(a_desc.load([off_m, off_k]), w_desc.load([off_n, off_k]).T, acc)
        epi_tile += NUM_PROGRAMS
        pid_m, pid_n = _tile_of(epi_tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _add_residual(acc, res_ptr, r_rs, off_m, off_n, M, N, BLOCK_M, BLOCK_N,
                            HAS_RESIDUAL)
        if EPI_SPLIT == 2:
            left, right = acc.reshape(BLOCK_M, 2, EPI_N).permute(0, 2, 1).split()
            c_desc.store([off_m, off_n], left.to(OUT_DTYPE))
            c_desc.store([off_m, off_n + EPI_N], right.to(OUT_DTYPE))
        else:
            c_desc.store([off_m, off_n], acc.to(OUT_DTYPE))


# ---- The gated GEMM on Hopper, in Gluon (Triton's lower-level dialect: explicit layouts, shared
# memory, barriers and warp roles), the same design as kernels/matmul.py's Hopper kernel. One CTA
# per SM, persistent, three partitions that talk through mbarriers: a one-warp producer that only
# issues TMA loads (an x tile and the same rows of w_gate and w_up for every k step) into a ring
# of STAGES buffers ("ready": a load landed; "empty": its readers are done with it), and two
# warpgroups that only issue wgmma products and run the epilogue. Each warpgroup keeps two
# 64 x BLOCK_N fp32 accumulators, x @ w_gate^T and x @ w_up^T, both fed by the same x tile in
# shared memory; the epilogue takes silu(gate) * up in registers and stores h through TMA. Two
# schedules (COOP), as in the matmul: cooperative 128-row tiles, warpgroup w computing rows
# 64w..64w+63; or ping-pong 64-row tiles, the warpgroups taking alternate tiles and turns at the
# tensor cores ("turn" barriers), so one's epilogue runs under the other's products.

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _gl_tile_of(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """_tile_of for the Gluon kernel (the same grouped order)."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % group_rows
    pid_n = (tile % per_group) // group_rows
    return pid_m, pid_n


@gluon.jit
def _gated_consumer(wg: gl.constexpr, descs, bars, bufs, M, N, K, NUM_PROGRAMS,
                    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                    STAGES: gl.constexpr, COOP: gl.constexpr):
    a_desc, wgate_desc, wup_desc, c_desc = descs
    ready, empty, turn = bars
    a_smem, wgate_smem, wup_smem, c_smem = bufs
    BLOCK_M: gl.constexpr = 128 if COOP else 64
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    k_steps = (K + BLOCK_K - 1) // BLOCK_K
    c_buf = c_smem.index(wg)
    # The CTA's tiles are j = 0, 1, ... (tile ids program_id + j * NUM_PROGRAMS); tile j's loads
    # take ring places j * k_steps onwards. Cooperative: every tile, our 64 rows of it.
    # Ping-pong: tiles j = wg, wg + 2, ..., all of their rows.
    if COOP:
        first, step, j, j_step, row = gl.program_id(0), NUM_PROGRAMS, 0, 1, 64 * wg
    else:
        first, step, j, j_step, row = gl.program_id(0) + wg * NUM_PROGRAMS, 2 * NUM_PROGRAMS, \
            wg, 2, 0
    for tile in range(first, num_pid_m * num_pid_n, step):
        pid_m, pid_n = _gl_tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M + row
        off_n = pid_n * BLOCK_N
        count = j * k_steps
        gate = gl.zeros([64, BLOCK_N], gl.float32, acc_layout)
        up = gl.zeros([64, BLOCK_N], gl.float32, acc_layout)
        prev = 0
        if not COOP:
            # Our turn once the other warpgroup waited for all of its tile's loads; this also
            # keeps each ready barrier's waits in ring order (a wait only tells a parity).
            mbarrier.wait(turn.index(wg), (j // 2 + 1 - wg) & 1)
        for k in range(k_steps):
            s = count % STAGES
            mbarrier.wait(ready.index(s), (count // STAGES) & 1)
            if COOP:
                a = a_smem.index(2 * s + wg)
            else:
                a = a_smem.index(s)
            gate = warpgroup_mma(a, wgate_smem.index(s).permute((1, 0)), gate, is_async=True)
            up = warpgroup_mma(a, wup_smem.index(s).permute((1, 0)), up, is_async=True)
            # this step's two products stay in flight; the step before's are done
            gate, up = warpgroup_mma_wait(2, deps=(gate, up))
            if k > 0:  # step k - 1's products retired: its stage can be refilled
                mbarrier.arrive(empty.index(prev), count=1)
            prev = s
            count += 1
        if not COOP:
            mbarrier.arrive(turn.index(1 - wg), count=1)
        gate, up = warpgroup_mma_wait(0, deps=(gate, up))
        mbarrier.arrive(empty.index(prev), count=1)
        # silu(g) * u = g / (1 + exp(-g)) * u; exp(-g) = inf for g << 0 gives -0, not NaN
        h = gate / (1.0 + gl.exp(-gate)) * up
        tma.store_wait(0)  # the previous tile's TMA store has read c_buf
        c_buf.store(h.to(c_desc.dtype))
        fence_async_shared()  # c_buf's writes are seen by the TMA engine
        _tma_store(c_desc, [off_m, off_n], c_buf)  # rows/cols past M/N are clipped
        j += j_step
    tma.store_wait(0)


# warp_specialize takes one function per partition; the worker partitions' functions must
# share a signature: hence two thin wrappers around _gated_consumer.
@gluon.jit
def _gated_consumer0(descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N: gl.constexpr,
                     BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                     COOP: gl.constexpr):
    _gated_consumer(0, descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K, GROUP_M,
                    STAGES, COOP)


@gluon.jit
def _gated_consumer1(descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N: gl.constexpr,
                     BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                     COOP: gl.constexpr):
    _gated_consumer(1, descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K, GROUP_M,
                    STAGES, COOP)


@gluon.jit
def _gated_producer(descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N: gl.constexpr,
                    BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                    COOP: gl.constexpr):
    """One warp: the x, w_gate and w_up tiles of every k step of the CTA's tiles, in the
    consumers' order. x arrives as 64-row boxes (two per stage in cooperative tiles)."""
    a_desc, wgate_desc, wup_desc, c_desc = descs
    ready, empty, turn = bars
    a_smem, wgate_smem, wup_smem, c_smem = bufs
    BLOCK_M: gl.constexpr = 128 if COOP else 64
    A_BOXES: gl.constexpr = 2 if COOP else 1
    num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    k_steps = (K + BLOCK_K - 1) // BLOCK_K
    count = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS):
        pid_m, pid_n = _gl_tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for k in range(k_steps):  # K past its end reads zeros (TMA fills out-of-bounds boxes)
            s = count % STAGES
            mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), A_BOXES * a_desc.block_type.nbytes
                            + 2 * wgate_desc.block_type.nbytes)
            for h in gl.static_range(A_BOXES):
                _tma_load(a_desc, [off_m + 64 * h, k * BLOCK_K], ready.index(s),
                          a_smem.index(s * A_BOXES + h))
            _tma_load(wgate_desc, [off_n, k * BLOCK_K], ready.index(s), wgate_smem.index(s))
            _tma_load(wup_desc, [off_n, k * BLOCK_K], ready.index(s), wup_smem.index(s))
            count += 1


@gluon.jit
def gated_hopper_kernel(a_desc, wgate_desc, wup_desc, c_desc, M, N, K, NUM_PROGRAMS,
                        BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                        STAGES: gl.constexpr, COOP: gl.constexpr):
    dtype: gl.constexpr = a_desc.dtype
    A_BOXES: gl.constexpr = 2 if COOP else 1
    a_smem = gl.allocate_shared_memory(dtype, [STAGES * A_BOXES, 64, BLOCK_K], a_desc.layout)
    wgate_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], wgate_desc.layout)
    wup_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], wup_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [2, 64, BLOCK_N], c_desc.layout)  # one each
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=A_BOXES)  # cooperative: both warpgroups read it
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    descs = (a_desc, wgate_desc, wup_desc, c_desc)
    bars = (ready, empty, turn)
    bufs = (a_smem, wgate_smem, wup_smem, c_smem)
    # The default partition (the kernel's 4 warps) is warpgroup 0; the workers get 4 warps
    # (warpgroup 1: two 64 x 128 fp32 accumulators are 128 registers a thread) and 1 warp.
    gl.warp_specialize([
        (_gated_consumer0, (descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                            GROUP_M, STAGES, COOP)),
        (_gated_consumer1, (descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                            GROUP_M, STAGES, COOP)),
        (_gated_producer, (descs, bars, bufs, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                           GROUP_M, STAGES, COOP))],
        [4, 1], [232, 40])


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def pick_config(M, N, K, dtype, gated):
    """Tiles per GEMM for the Triton kernels (triton 3.6), which take the gated GEMM where the
    Gluon kernel does not (off Hopper, fp32, odd strides). The gated GEMM holds two accumulators:
    128x64 tiles on 4 warps, one tile per program, beat 128x128 on 8 (605 vs 684-748 us at
    2048x4096x11008, H100) and beat a persistent grid by 1.1-2x (H200: its epilogue is short
    next to two K loops). 3 stages at K = 768-2048 (272 vs 309 us at 16384x768x3072, 879 vs
    1056 at 8192x2048x8192, H200), 4 at K = 4096 (4% faster, H100). The down projection runs
    persistent above PERSISTENT_MIN_MACS, 128x256 on 8 warps, 3 stages: 1.0x / 0.96x / 0.98x
    cuBLAS at 16384x3072x768 / 8192x8192x2048 / 8192x4864x896, against 0.86-0.93x one tile a
    program."""
    if dtype == torch.float32:  # 4-byte operands, three products per tf32x3 dot
        return dict(BLOCK_M=128, BLOCK_N=64 if gated else 128, BLOCK_K=32, GROUP_M=8,
                    num_warps=8, num_stages=3)
    if M <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    if gated:
        return dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=16, num_warps=4,
                    num_stages=3 if K < 4096 else 4)
    if M * N * K >= PERSISTENT_MIN_MACS:
        return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3,
                    EPI_SPLIT=2, PERSISTENT=True)
    # The down projection (N = D, long K = F): 128x128 on 4 warps beat 128x256 on 8 there.
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)


# Half-precision down projections with at least this many multiply-adds run persistent on a GPU
# with TMA (device-built descriptors), and gated GEMMs the Gluon kernel on Hopper; below it the
# launch's host time bounds the call.
PERSISTENT_MIN_MACS = 2 ** 30
# fp32 takes the one-tile TMA kernel above this size: a launch with host tensor descriptors
# took ~50 us of host time on an H100 (triton 3.6), more than it saves below.
TMA_MIN_MACS = 2 ** 35


def _row_major_ok(t):
    """TMA needs a unit last stride, 16-byte aligned rows and base."""
    es = t.element_size()
    return (t.stride(1) == 1 and (t.stride(0) * es) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.shape[1] * es >= 16)


@functools.lru_cache(maxsize=None)
def _device_has_tma(index):
    # NVIDIA sm_90 and later: torch on ROCm reports AMD's gfx942 as capability 9.4 as well
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def _dot_precision(dtype):
    """tl.dot's input precision: fp32 as tf32x3 on NVIDIA (16-bit inputs ignore it). ROCm's
    Triton refuses tf32x3 on every AMD GPU and tf32 on all but gfx942: plain fp32 there."""
    if torch.version.hip is not None:
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _gpu_has_tma(t):
    # Cached: asking torch for the capability on every launch cost tens of us of host time.
    return t.is_cuda and _device_has_tma(t.device.index)


@functools.lru_cache(maxsize=None)
def _num_sms(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def _scratch(size, alignment, stream):
    """Global scratch for the device-built descriptors (128 bytes per descriptor and program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator():
    """Device-built descriptors need triton's allocator; install ours only where none is set
    (it is per thread: a context variable)."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _persistent(a, w, c, residual, cfg):
    """Launch the persistent kernel: one program per SM (4 in the interpreter, which takes
    host-made descriptors)."""
    M, K = a.shape
    N = w.shape[0]
    BM, BN, BK, epi = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["EPI_SPLIT"]
    tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
    n_sm = _num_sms(a.device.index) if a.is_cuda else 4
    if a.is_cuda:
        _ensure_allocator()
        args = (a, w, c)
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor
        args = (TensorDescriptor.from_tensor(a, [BM, BK]),
                TensorDescriptor.from_tensor(w, [BN, BK]),
                TensorDescriptor.from_tensor(c, [BM, BN // epi]))
    mlp_gemm_persistent_kernel[(min(tiles, n_sm),)](
        *args, c if residual is None else residual, M, N, K, a.stride(0), w.stride(0),
        c.stride(0), 0 if residual is None else residual.stride(0), BM, BN, BK, cfg["GROUP_M"],
        OUT_DTYPE=_TL_DTYPES[a.dtype], EPI_SPLIT=epi, NUM_PROGRAMS=n_sm,
        DEVICE_DESC=a.is_cuda, HAS_RESIDUAL=residual is not None, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])


@functools.lru_cache(maxsize=None)
def _hopper_device(index):
    """Compute capability 9.x (wgmma): the Gluon kernel's GPUs. Not Blackwell (no wgmma), and
    never an AMD GPU, whatever capability ROCm reports (gfx942: 9.4)."""
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] == 9


@functools.lru_cache(maxsize=None)
def _gl_layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(
        list(block), gl.float16 if dtype == torch.float16 else gl.bfloat16)


# The gated Gluon kernel's schedule: 128 columns of gate and of up a tile (two 64x128
# accumulators a warpgroup: the 128 registers of a thread that one 64x256 tile takes). Four
# stages of x, w_gate and w_up tiles and the two h buffers fill 224 of a Hopper block's 227 KB
# of shared memory: a fifth stage or wider tiles need fewer stages.
GATED_HOPPER_CONFIG = dict(COOP=True, BLOCK_N=128, STAGES=4, GROUP_M=8)


def _gated_hopper_ok(a, w1, w2, c):
    """On a Hopper GPU, operands the gated Gluon kernel takes (_gated_operands)."""
    return a.is_cuda and _hopper_device(a.device.index) and _gated_operands(a, w1, w2, c)


def _gated_operands(a, w1, w2, c):
    """Half precision, more rows than half a tile (64 or fewer would leave most of each 128-row
    tile's products on zeros), at least PERSISTENT_MIN_MACS, every matrix TMA-describable (unit
    last stride, 16-byte aligned rows)."""
    M, K = a.shape
    return (a.dtype in (torch.float16, torch.bfloat16) and w1.dtype == a.dtype
            and w2.dtype == a.dtype and M > 64 and M * w1.shape[0] * K >= PERSISTENT_MIN_MACS
            and all(_row_major_ok(t) for t in (a, w1, w2, c)))


def gated_hopper(a, w1, w2, c, config=None):
    """silu(a @ w1^T) * (a @ w2^T) -> c with the Gluon kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    config = config or GATED_HOPPER_CONFIG
    M, K = a.shape
    N = w1.shape[0]
    BN, BK = config["BLOCK_N"], 64  # 128 bytes of a 16-bit row: one 128-byte swizzle line
    descs = [TensorDescriptor.from_tensor(t, list(block), _gl_layout(block, a.dtype))
             for t, block in ((a, (64, BK)), (w1, (BN, BK)), (w2, (BN, BK)), (c, (64, BN)))]
    tiles = -(-M // (128 if config["COOP"] else 64)) * -(-N // BN)
    grid = min(tiles, _num_sms(a.device.index))
    gated_hopper_kernel[(grid,)](*descs, M, N, K, grid, BN, BK, config["GROUP_M"],
                                 config["STAGES"], config["COOP"], num_warps=4)
    return c


def mlp_gemm(a, w1, w2=None, residual=None, config=None, tma=None, hopper=None):
    """a[M,K] @ w1[N,K]^T (+ residual[M,N]) -> [M,N]; with w2: silu(a @ w1^T) * (a @ w2^T) (no
    residual). New tensor, a's dtype. The gated GEMM runs the Gluon kernel where
    _gated_hopper_ok allows it, unless hopper=False or a Triton config/tma is given (tuning);
    hopper may also be a config for it."""
    M, K = a.shape
    N = w1.shape[0]
    gated = w2 is not None
    w2 = w1 if w2 is None else w2  # an unused placeholder when not gated
    assert w1.shape == (N, K) and w2.shape == (N, K), "weights must be [N, K]"
    assert residual is None or (not gated and tuple(residual.shape) == (M, N)
                                and residual.dtype == a.dtype), \
        f"residual must be [{M}, {N}] in {a.dtype}, on the plain GEMM"
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()  # the epilogue reads rows of unit-stride columns
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    res_arg, res_rs = (c, 0) if residual is None else (residual, residual.stride(0))
    if M <= SKINNY_MAX_M and config is None and tma is None and not hopper:
        return mlp_skinny(a, w1, w2 if gated else None, residual, c)
    if hopper is None:
        hopper = gated and config is None and tma is None and _gated_hopper_ok(a, w1, w2, c)
    if hopper:
        assert gated, "the Gluon kernel is the gated GEMM's: give w2"
        return gated_hopper(a, w1, w2, c, hopper if isinstance(hopper, dict) else None)
    cfg = dict(config or pick_config(M, N, K, a.dtype, gated))
    if not config and torch.version.hip is not None:
        # AMD GPUs have 64 KiB of LDS (MI300X; 160 on MI350X), not the 228 KiB these H100
        # configs fill: two stages keep every tile within it
        cfg["num_stages"] = min(cfg["num_stages"], 2)
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    precision = _dot_precision(a.dtype)
    grid = ((M + BM - 1) // BM * ((N + BN - 1) // BN),)
    use_tma = tma if tma is not None else \
        (cfg.get("PERSISTENT") or M * N * K >= TMA_MIN_MACS) and _gpu_has_tma(a)
    row_major = use_tma and all(_row_major_ok(t) for t in (a, w1, w2, c))
    if row_major and cfg.get("PERSISTENT") and not gated:
        _persistent(a, w1, c, residual, cfg)
    elif row_major:
        from triton.tools.tensor_descriptor import TensorDescriptor
        mlp_gemm_tma_kernel[grid](
            TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(w1, [BN, BK]),
            TensorDescriptor.from_tensor(w2, [BN, BK]), TensorDescriptor.from_tensor(c, [BM, BN]),
            res_arg, M, N, K, res_rs, BM, BN, BK, cfg["GROUP_M"], GATED=gated,
            OUT_DTYPE=_TL_DTYPES[a.dtype], PRECISION=precision,
            HAS_RESIDUAL=residual is not None, num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"])
    else:
        mlp_gemm_ptr_kernel[grid](
            a, w1, w2, c, res_arg, M, N, K, a.stride(0), a.stride(1), *w1.stride(),
            *w2.stride(), c.stride(0), c.stride(1), res_rs, BM, BN, BK, cfg["GROUP_M"],
            GATED=gated, EVEN_K=K % BK == 0, PRECISION=precision,
            HAS_RESIDUAL=residual is not None, num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"])
    return c


SKINNY_MAX_M = 16  # rows of a generation step (the batch) or fewer: split-K
SKINNY_LAUNCH = dict(num_warps=4, num_stages=3)  # the slices' kernel


@functools.lru_cache(maxsize=None)
def skinny_config(N, K, sms, gated=False, block_n=None, block_k=128, per_sm=None):
    """(BLOCK_N, BLOCK_K, K per slice, slices): tiles of the weights 128 deep in K (256
    contiguous bytes of a weight row in half precision); the gated GEMM 32 columns wide at
    about one program per SM, the down projection 64 wide at two. Measured on an H100
    (benchmarks/skinny_sweep.py, bf16, Llama-3.2-1B's MLP at M = 1 and 8): gate+up 25.9-27.0 us
    (86% of the copy bandwidth at M = 1; cuBLAS 30.4-31.0), from 28.5-30.2 with 64-wide tiles
    at four programs per SM; the down projection 9.1-10.1 us from 10.6-11.9."""
    block_n = block_n or (32 if gated else 64)
    per_sm = per_sm or (1 if gated else 2)
    k_blocks = -(-K // block_k)
    wanted = max(1, min(k_blocks, -(-per_sm * sms // -(-N // block_n))))
    per_split = -(-k_blocks // wanted) * block_k
    return block_n, block_k, per_split, -(-K // per_split)


def mlp_skinny(a, w1, w2, residual, c):
    """mlp_gemm for M <= SKINNY_MAX_M: skinny_partial_kernel, then skinny_epilogue_kernel. The
    partial sums cost M * N * 4 bytes a slice (twice when gated), written and read once: a few
    percent of the weights' bytes at M = 1."""
    M, K = a.shape
    N = w1.shape[0]
    gated = w2 is not None
    w2 = w1 if w2 is None else w2
    sms = _num_sms(a.device.index) if a.is_cuda else 4
    block_n, block_k, per_split, splits = skinny_config(N, K, sms, gated)
    part = torch.empty((splits, 2 if gated else 1, M, N), device=a.device, dtype=torch.float32)
    n_blocks = -(-N // block_n)
    skinny_partial_kernel[(n_blocks, splits)](
        a, w1, w2, part, M, N, K, a.stride(0), a.stride(1), *w1.stride(), *w2.stride(),
        per_split, GATED=gated, PRECISION=_dot_precision(a.dtype), BLOCK_M=16,
        BLOCK_N=block_n, BLOCK_K=block_k, **SKINNY_LAUNCH)
    skinny_epilogue_kernel[(n_blocks,)](
        part, c, c if residual is None else residual, M, N, splits, c.stride(0),
        0 if residual is None else residual.stride(0), GATED=gated,
        HAS_RESIDUAL=residual is not None, BLOCK_M=16, BLOCK_N=block_n, num_warps=4)
    return c


def fused_mlp(x, w_gate, w_up, w_down, residual=None, gate_config=None, down_config=None,
              tma=None):
    h = mlp_gemm(x, w_gate, w_up, config=gate_config, tma=tma)  # [M,F] = silu(gate) * up
    return mlp_gemm(h, w_down, residual=residual, config=down_config, tma=tma)  # [M,D]


def kernel_fn(x, w_gate, w_up, w_down, residual=None):
    return fused_mlp(x, w_gate, w_up, w_down, residual)
