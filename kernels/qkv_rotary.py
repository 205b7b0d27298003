"""
Starter kernel: an attention layer's q/k/v projections as ONE GEMM with rotary position
embedding applied to q and k in its epilogue, in Triton (and Gluon, Triton's lower-level
dialect, on Hopper).

    from kernels.qkv_rotary import kernel_fn
    qkv = kernel_fn(x=x, w_qkv=w, cos=cos, sin=sin, kv_heads=Hkv, bias=None)
    # x [B,S,K]; w [(Hq + 2 Hkv) * D, K] (w_q, w_k, w_v stacked, nn.Linear layout); cos/sin
    # [S, D/2]; qkv [B, S, Hq + 2 Hkv, D]: q heads, then k heads (both rotated), then v heads
    uv run bench.py            # after extract.py (or you) copied this file to kernel.py

Why one kernel: the usual layer writes q and k with a GEMM, then reads and writes them again to
rotate them (inductor fuses the rotation with nothing but itself: it needs elements D/2 apart
in a row, which no GEMM epilogue it generates has at hand). Here the accumulator tile of a head
already holds both halves of every row: the rotation costs a few FMAs before the store. The
output is [B, S, heads, D], the layout an attention layer's q/k/v are views of after
`.transpose(1, 2)` (the flash_attention starter reads such views without a copy).

The tile: BLOCK_M rows (positions) by HEADS whole heads. Column c of the tile is head c // DP,
half (c % DP) // HP, element c % HP of that half, with HP = D/2 rounded up to a power of two and
DP = 2 HP: the accumulator reshaped to [BLOCK_M, HEADS, 2, HP] and split on its third axis gives
each head's two halves, x1 and x2, element-aligned, for out1 = x1 cos - x2 sin and out2 = x2 cos
+ x1 sin in fp32 (the bias added first). When D is a power of two those columns are the weight's
rows n0 .. n0 + HEADS * D, loaded on Hopper through TMA descriptors; otherwise (D = 80, 96, ...)
each column's weight row is computed and loaded with a mask. Heads past Hq + Hkv (v) are
stored unrotated. cos/sin rows are indexed by position s = m % S, shared by every head.

On Hopper, half-precision problems of 2^30 multiply-adds or more run the same epilogue after
the matmul starter's Gluon mainloop (persistent, warp-specialized: a TMA producer warp, two
wgmma warpgroups) and store through TMA. H100, compact LLaMA (8x2048 tokens, 768 wide, 12 + 12
+ 12 heads of 64), bf16 GPU time: 98.6 us, against 110.4 for the Triton kernel, 90.9 for
cuBLAS's q/k/v GEMM alone (no rotary) and 156.6 for torch.compile (cuBLAS, then inductor's
rotary); the gate's clock 95.9 us in fp16, 1.54x torch.compile, 6.6x eager.
A generation step (M = B rows of one position each, M <= 16) takes a third path: split-K
(skinny_partial_kernel, then skinny_rotary_kernel), since 128-row tiles would leave the
weight, which is all the step's traffic, to a dozen programs.
The number to beat is cuBLAS's q/k/v GEMM alone: the rotation is free in the epilogue only
while a tile holds whole heads, each head's halves side by side.
Things to try: at D = 128 and K = 4096 the Triton kernel is ~2% ahead (597 against 610 us at
4096 x 4096 -> 12288); a ping-pong schedule lost at every shape tried, a deeper ring needs the
C buffers smaller (one 64 x BLOCK_N buffer a warpgroup, stored in halves).
"""
import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

KERNEL_TYPE = "qkv_rotary"
BACKEND = "triton"


@triton.jit
def qkv_rotary_kernel(x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, out_ptr, x_desc, w_desc,
                      M, S, K, D, HEADS_TOTAL, ROT_HEADS,
                      stride_xb, stride_xs, stride_xk, stride_wn, stride_wk,
                      stride_cs, stride_cd, stride_ss, stride_sd,
                      BLOCK_M: tl.constexpr, HEADS: tl.constexpr, HP: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, USE_TMA: tl.constexpr,
                      HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    BLOCK_N: tl.constexpr = HEADS * 2 * HP
    # GROUP_M tile rows walked column by column: the tiles in flight share x rows in L2.
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(HEADS_TOTAL, HEADS)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group
    m0, head0 = pid_m * BLOCK_M, pid_n * HEADS

    # Tile column -> (head, half, element) -> the weight row (and output column) it holds.
    c = tl.arange(0, BLOCK_N)
    head = head0 + c // (2 * HP)
    half = (c // HP) % 2
    j = c % HP
    col = head * D + half * (D // 2) + j
    col_ok = (head < HEADS_TOTAL) & (j < D // 2)
    rm = m0 + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + ((rm % M) // S).to(tl.int64) * stride_xb + ((rm % M) % S) * stride_xs
    w_rows = w_ptr + tl.where(col_ok, col, 0).to(tl.int64) * stride_wn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if USE_TMA:  # rows m0.. of x and head0 * D.. of w: out-of-range ones arrive as zeros
            a = x_desc.load([m0, k0])
            b = w_desc.load([head0 * D, k0])
        else:
            k_ok = (k0 + rk) < K
            a = tl.load(x_rows[:, None] + (k0 + rk)[None, :] * stride_xk, mask=k_ok[None, :],
                        other=0.0)
            b = tl.load(w_rows[:, None] + (k0 + rk)[None, :] * stride_wk,
                        mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(a, b.T, acc, input_precision=PRECISION)

    if HAS_BIAS:
        acc += tl.load(b_ptr + col, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    # Each head's two halves, element-aligned: [BLOCK_M, HEADS, HP] each.
    x1, x2 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, HEADS, 2, HP)), (0, 1, 3, 2)))
    pos = (rm % M) % S
    jj = tl.arange(0, HP)
    t_ok = (jj < D // 2)[None, :]
    cs = tl.load(cos_ptr + pos[:, None] * stride_cs + jj[None, :] * stride_cd, mask=t_ok,
                 other=1.0).to(tl.float32)[:, None, :]
    sn = tl.load(sin_ptr + pos[:, None] * stride_ss + jj[None, :] * stride_sd, mask=t_ok,
                 other=0.0).to(tl.float32)[:, None, :]
    rotate = ((head0 + tl.arange(0, HEADS)) < ROT_HEADS)[None, :, None]  # q and k, not v
    out1 = tl.where(rotate, x1 * cs - x2 * sn, x1)
    out2 = tl.where(rotate, x2 * cs + x1 * sn, x2)
    out = tl.reshape(tl.permute(tl.join(out1, out2), (0, 1, 3, 2)), (BLOCK_M, BLOCK_N))
    ptrs = out_ptr + rm[:, None].to(tl.int64) * HEADS_TOTAL * D + col[None, :]
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=(rm < M)[:, None] & col_ok[None, :])



# ---- A generation step: M = B * S of at most SKINNY_MAX_M rows (S = 1 a step). The tile above
# would give the whole weight to a dozen programs (one row of 128-row tiles); instead the weight
# is cut into (column block, slice of K) pieces, about four programs an SM, each writing its
# slice's fp32 sums, and a second kernel adds the slices in order and rotates, a head a program.
SKINNY_MAX_M = 16


@triton.jit
def skinny_partial_kernel(x_ptr, w_ptr, part_ptr, M, S, N, K, stride_xb, stride_xs, stride_xk,
                          stride_wn, stride_wk, K_PER_SPLIT, PRECISION: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """part[slice, m, n] = sum over the slice's k of x[m, k] * w[n, k], for the M real rows."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x_rows = x_ptr + (rows // S).to(tl.int64) * stride_xb + (rows % S) * stride_xs
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_rows[:, None] + ks[None, :] * stride_xk,
                    mask=(rows[:, None] < M) & (ks[None, :] < k_end), other=0.0)
        b = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None] * stride_wk,
                    mask=(ks[:, None] < k_end) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    out = part_ptr + (pid_k * M + rows[:, None]).to(tl.int64) * N + cols[None, :]
    tl.store(out, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def skinny_rotary_kernel(part_ptr, b_ptr, cos_ptr, sin_ptr, out_ptr, M, S, N, D, SPLITS,
                         ROT_HEADS, stride_cs, stride_cd, stride_ss, stride_sd,
                         HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, HP: tl.constexpr):
    """One head of every row: its two halves summed over the slices in slice order (no
    atomics: the same bits every run), the bias, the rotation for q and k heads, the store."""
    head = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    j = tl.arange(0, HP)
    mask = (rows[:, None] < M) & (j[None, :] < D // 2)
    c1 = head * D + j
    c2 = c1 + D // 2
    x1 = tl.zeros((BLOCK_M, HP), dtype=tl.float32)
    x2 = tl.zeros((BLOCK_M, HP), dtype=tl.float32)
    for s in range(SPLITS):
        base = part_ptr + (s * M + rows[:, None]).to(tl.int64) * N
        x1 += tl.load(base + c1[None, :], mask=mask, other=0.0)
        x2 += tl.load(base + c2[None, :], mask=mask, other=0.0)
    if HAS_BIAS:
        x1 += tl.load(b_ptr + c1, mask=j < D // 2, other=0.0).to(tl.float32)[None, :]
        x2 += tl.load(b_ptr + c2, mask=j < D // 2, other=0.0).to(tl.float32)[None, :]
    pos = rows % S
    cs = tl.load(cos_ptr + pos[:, None] * stride_cs + j[None, :] * stride_cd, mask=mask,
                 other=1.0).to(tl.float32)
    sn = tl.load(sin_ptr + pos[:, None] * stride_ss + j[None, :] * stride_sd, mask=mask,
                 other=0.0).to(tl.float32)
    rotate = head < ROT_HEADS  # q and k heads; v heads pass through
    out1 = tl.where(rotate, x1 * cs - x2 * sn, x1)
    out2 = tl.where(rotate, x2 * cs + x1 * sn, x2)
    out_rows = out_ptr + rows[:, None].to(tl.int64) * N
    tl.store(out_rows + c1[None, :], out1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_rows + c2[None, :], out2.to(out_ptr.dtype.element_ty), mask=mask)


def skinny_config(N, K, sms):
    """(BLOCK_N, BLOCK_K, K per slice, slices): 64 x 128 pieces of w (128-byte rows in half
    precision), and slices of K until there are about four programs per SM."""
    block_n, block_k = 64, 128
    k_blocks = -(-K // block_k)
    wanted = max(1, min(k_blocks, -(-4 * sms // -(-N // block_n))))
    per_split = -(-k_blocks // wanted) * block_k
    return block_n, block_k, per_split, -(-K // per_split)


def qkv_rotary_skinny(x, w_qkv, cos, sin, kv_heads, bias, out):
    """The two kernels above. The slices' sums cost M * N * 4 bytes each, written and read
    once: a few percent of the weight's bytes at M = 1."""
    B, S, K = x.shape
    M, N = B * S, w_qkv.shape[0]
    D = 2 * cos.shape[-1]
    sms = _num_sms(x.device.index) if x.is_cuda else 4
    block_n, block_k, per_split, splits = skinny_config(N, K, sms)
    part = torch.empty((splits, M, N), device=x.device, dtype=torch.float32)
    skinny_partial_kernel[(triton.cdiv(N, block_n), splits)](
        x, w_qkv, part, M, S, N, K, *x.stride(), *w_qkv.stride(), per_split,
        PRECISION=_dot_precision(x.dtype), BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4, num_stages=3)
    skinny_rotary_kernel[(N // D,)](
        part, bias if bias is not None else part, cos, sin, out, M, S, N, D, splits,
        N // D - kv_heads, *cos.stride(), *sin.stride(), HAS_BIAS=bias is not None,
        BLOCK_M=16, HP=max(8, 1 << (D // 2 - 1).bit_length()), num_warps=4)
    return out

# ---- On Hopper, in Gluon (Triton's lower-level dialect: explicit layouts, shared memory, barriers
# and warp roles), the matmul starter's Hopper kernel with this epilogue. One CTA per SM,
# persistent, three partitions that talk through mbarriers: a one-warp producer that only issues
# TMA loads of x and w_qkv tiles into a ring of STAGES buffers ("ready": a load landed; "empty":
# its readers are done with it), and two warpgroups that only issue wgmma products and run the
# epilogue. Cooperative schedule (COOP): 128-row tiles, warpgroup w computes rows 64w..64w+63;
# or ping-pong: 64-row tiles, the warpgroups take alternate tiles and turns at the tensor cores
# ("turn" barriers), so one's epilogue runs under the other's products. BLOCK_N is a whole number
# of heads; a thread of a wgmma accumulator holds columns c and c + D/2 of its rows (both are
# register bits of the layout), so the reshape + permute + split that pairs the halves is free.

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _gl_tile_of(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """The Triton kernel's grouped tile order: GROUP_M tile rows walked column by column."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % group_rows
    pid_n = (tile % per_group) // group_rows
    return pid_m, pid_n


@gluon.jit
def _gl_rotate(acc, off_m, off_n, rope, N, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
               HAS_BIAS: gl.constexpr):
    """The epilogue on a 64 x BLOCK_N fp32 accumulator: bias, then each q/k head's halves
    rotated by its rows' positions (off_m + i) % S; v heads pass through."""
    cos_ptr, sin_ptr, bias_ptr, S, ROT_HEADS, stride_cs, stride_cd, stride_ss, stride_sd = rope
    HEADS: gl.constexpr = BLOCK_N // HEAD_D
    HALF: gl.constexpr = HEAD_D // 2
    acc_layout: gl.constexpr = acc.type.layout
    if HAS_BIAS:
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        acc += gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
    x1, x2 = gl.split(gl.permute(gl.reshape(acc, [64, HEADS, 2, HALF]), [0, 1, 3, 2]))
    # cos/sin as [64, HALF] in the layout x1 has without its head axis, broadcast over heads
    table: gl.constexpr = gl.SliceLayout(1, x1.type.layout)
    pos = (off_m + gl.arange(0, 64, layout=gl.SliceLayout(1, table))) % S
    j = gl.arange(0, HALF, layout=gl.SliceLayout(0, table))
    cs = gl.load(cos_ptr + pos[:, None] * stride_cs + j[None, :] * stride_cd).to(gl.float32)
    sn = gl.load(sin_ptr + pos[:, None] * stride_ss + j[None, :] * stride_sd).to(gl.float32)
    cs = gl.expand_dims(cs, 1)
    sn = gl.expand_dims(sn, 1)
    head = off_n // HEAD_D + gl.arange(
        0, HEADS, layout=gl.SliceLayout(0, gl.SliceLayout(2, x1.type.layout)))
    rotate = gl.expand_dims(gl.expand_dims(head < ROT_HEADS, 0), 2)  # q and k, not v
    out1 = gl.where(rotate, x1 * cs - x2 * sn, x1)
    out2 = gl.where(rotate, x2 * cs + x1 * sn, x2)
    out = gl.reshape(gl.permute(gl.join(out1, out2), [0, 1, 3, 2]), [64, BLOCK_N])
    return gl.convert_layout(out, acc_layout)


@gluon.jit
def _hopper_consumer(wg: gl.constexpr, descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS,
                     BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
                     STAGES: gl.constexpr, COOP: gl.constexpr, HEAD_D: gl.constexpr,
                     HAS_BIAS: gl.constexpr):
    x_desc, w_desc, c_desc = descs
    ready, empty, turn = bars
    x_smem, w_smem, c_smem = bufs
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
        acc = gl.zeros([64, BLOCK_N], gl.float32, acc_layout)
        prev = 0
        if not COOP:
            # Our turn once the other warpgroup waited for all of its tile's loads; this also
            # keeps each ready barrier's waits in ring order (a wait only tells a parity).
            mbarrier.wait(turn.index(wg), (j // 2 + 1 - wg) & 1)
        for k in range(k_steps):
            s = count % STAGES
            mbarrier.wait(ready.index(s), (count // STAGES) & 1)
            if COOP:
                a = x_smem.index(2 * s + wg)
            else:
                a = x_smem.index(s)
            acc = warpgroup_mma(a, w_smem.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))  # one product stays in flight
            if k > 0:  # step k - 1's product retired: its stage can be refilled
                mbarrier.arrive(empty.index(prev), count=1)
            prev = s
            count += 1
        if not COOP:
            mbarrier.arrive(turn.index(1 - wg), count=1)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index(prev), count=1)
        out = _gl_rotate(acc, off_m, off_n, rope, N, BLOCK_N, HEAD_D, HAS_BIAS)
        tma.store_wait(0)  # the previous tile's TMA store has read c_buf
        c_buf.store(out.to(c_desc.dtype))
        fence_async_shared()  # c_buf's writes are seen by the TMA engine
        _tma_store(c_desc, [off_m, off_n], c_buf)  # rows/cols past M/N are clipped
        j += j_step
    tma.store_wait(0)


# warp_specialize takes one function per partition; the worker partitions' functions must
# share a signature: hence two thin wrappers around _hopper_consumer.
@gluon.jit
def _hopper_consumer0(descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N: gl.constexpr,
                      BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                      COOP: gl.constexpr, HEAD_D: gl.constexpr, HAS_BIAS: gl.constexpr):
    _hopper_consumer(0, descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                     GROUP_M, STAGES, COOP, HEAD_D, HAS_BIAS)


@gluon.jit
def _hopper_consumer1(descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N: gl.constexpr,
                      BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                      COOP: gl.constexpr, HEAD_D: gl.constexpr, HAS_BIAS: gl.constexpr):
    _hopper_consumer(1, descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                     GROUP_M, STAGES, COOP, HEAD_D, HAS_BIAS)


@gluon.jit
def _hopper_producer(descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N: gl.constexpr,
                     BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                     COOP: gl.constexpr, HEAD_D: gl.constexpr, HAS_BIAS: gl.constexpr):
    """One warp: the x and w_qkv tiles of every k step of the CTA's tiles, in the consumers'
    order. x arrives as 64-row boxes (two per stage in cooperative tiles, one per warpgroup)."""
    x_desc, w_desc, c_desc = descs
    ready, empty, turn = bars
    x_smem, w_smem, c_smem = bufs
    BLOCK_M: gl.constexpr = 128 if COOP else 64
    X_BOXES: gl.constexpr = 2 if COOP else 1
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
            mbarrier.expect(ready.index(s),
                            X_BOXES * x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            for h in gl.static_range(X_BOXES):
                _tma_load(x_desc, [off_m + 64 * h, k * BLOCK_K], ready.index(s),
                          x_smem.index(s * X_BOXES + h))
            _tma_load(w_desc, [off_n, k * BLOCK_K], ready.index(s), w_smem.index(s))
            count += 1


@gluon.jit
def qkv_rotary_hopper_kernel(x_desc, w_desc, c_desc, rope, M, N, K, NUM_PROGRAMS,
                             BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                             GROUP_M: gl.constexpr, STAGES: gl.constexpr, COOP: gl.constexpr,
                             HEAD_D: gl.constexpr, HAS_BIAS: gl.constexpr):
    dtype: gl.constexpr = x_desc.dtype
    X_BOXES: gl.constexpr = 2 if COOP else 1
    x_smem = gl.allocate_shared_memory(dtype, [STAGES * X_BOXES, 64, BLOCK_K], x_desc.layout)
    w_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [2, 64, BLOCK_N], c_desc.layout)  # one each
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=X_BOXES)  # cooperative: both warpgroups read it
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    descs = (x_desc, w_desc, c_desc)
    bars = (ready, empty, turn)
    bufs = (x_smem, w_smem, c_smem)
    # The default partition (the kernel's 4 warps) is warpgroup 0; the workers get 4 warps
    # (warpgroup 1) and 1 warp. The argument tuples are written out in the call: a tuple
    # assigned to a name would turn its constexprs into tensors.
    gl.warp_specialize([
        (_hopper_consumer0, (descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                             GROUP_M, STAGES, COOP, HEAD_D, HAS_BIAS)),
        (_hopper_consumer1, (descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                             GROUP_M, STAGES, COOP, HEAD_D, HAS_BIAS)),
        (_hopper_producer, (descs, bars, bufs, rope, M, N, K, NUM_PROGRAMS, BLOCK_N, BLOCK_K,
                            GROUP_M, STAGES, COOP, HEAD_D, HAS_BIAS))],
        [4, 1], [232, 40])


def _dot_precision(dtype):
    """fp32 inputs: three tf32 products on NVIDIA (~fp32 accuracy; plain tf32 misses the 1e-4
    tolerance). ROCm's Triton refuses tf32x3: plain fp32 there."""
    if torch.version.hip is not None or dtype != torch.float32:
        return "ieee"
    return "tf32x3"


@functools.lru_cache(maxsize=None)
def _hopper(index):
    props = torch.cuda.get_device_properties(index)
    return props.major == 9 and torch.version.hip is None


def _tma_ok(x, w, D):
    """TMA descriptors over x as [B*S, K] and w as [N, K]: rows of positions one after another,
    16-byte aligned, and a power-of-two head dim (a tile's columns are then w's rows as they
    lie)."""
    B, S, K = x.shape
    es = x.element_size()
    return (x.is_cuda and _hopper(x.device.index) and D & (D - 1) == 0 and D >= 16
            and x.stride(2) == 1 and w.stride(1) == 1 and (B == 1 or x.stride(0) == S * x.stride(1))
            and (x.stride(1) * es) % 16 == 0 and (w.stride(0) * es) % 16 == 0
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0)


def pick_config(D, dtype, device_type):
    """Two heads of 64 (or one of 128) per 128-row tile: 64 fp32 accumulators a thread at 8 warps.
    On the H100, 4 heads of 64 (BLOCK_N 256, 3 stages) ran 107 us at the compact LLaMA's shape
    against 113 for 2 heads; the interpreter gets small tiles."""
    hp = max(8, 1 << (D // 2 - 1).bit_length())
    if device_type != "cuda":
        return dict(BLOCK_M=16, HEADS=1, HP=hp, BLOCK_K=16, num_warps=4, num_stages=1)
    heads = max(1, 256 // (2 * hp)) if dtype != torch.float32 else max(1, 64 // (2 * hp))
    return dict(BLOCK_M=128, HEADS=heads, HP=hp, BLOCK_K=64 if dtype != torch.float32 else 32,
                num_warps=8, num_stages=3)


@functools.lru_cache(maxsize=None)
def pick_hopper_config(N):
    """The Gluon kernel's schedule. Measured on an H100 (bf16, GPU time): cooperative 128x256
    tiles (four heads of 64 or two of 128; 3 stages fill shared memory) ran 98.6 us at the compact
    LLaMA's shape (16384 x 768 -> 2304; the Triton kernel 110.4, cuBLAS's GEMM alone 90.9) and
    149.4 at Llama-3-1B's (cuBLAS's GEMM alone 151.2). Where 256-wide tiles would leave over 5% of
    the last column of tiles empty (Qwen2-0.5B's N = 1152), 128x128 with 5 stages: 34.9 against
    38.5. Ping-pong tiles were slower at every shape tried."""
    if ((N + 255) // 256 * 256 - N) * 20 > N:
        return dict(COOP=True, BLOCK_N=128, STAGES=5, GROUP_M=8)
    return dict(COOP=True, BLOCK_N=256, STAGES=3, GROUP_M=8)


HOPPER_BLOCK_K = 64  # 128 bytes of a 16-bit row: one 128-byte swizzle line per TMA box row
# Below this many multiply-adds (or 64 rows and fewer) the Triton kernel: a launch's host time
# bounds the call there, and a 128-row tile of a few rows computes mostly zeros.
HOPPER_MIN_MACS = 2 ** 30


def _hopper_ok(x, w, out, D, config):
    """Half precision on Hopper, TMA-describable x/w (_tma_ok), a head dim that divides the tile."""
    B, S, K = x.shape
    M, N = B * S, w.shape[0]
    return (x.dtype in (torch.float16, torch.bfloat16) and w.dtype == x.dtype and M > 64
            and M * N * K >= HOPPER_MIN_MACS and _tma_ok(x, w, D)
            and config["BLOCK_N"] % D == 0 and (N * out.element_size()) % 16 == 0)


@functools.lru_cache(maxsize=None)
def _gl_layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(
        list(block), gl.float16 if dtype == torch.float16 else gl.bfloat16)


@functools.lru_cache(maxsize=None)
def _num_sms(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def qkv_rotary_hopper(x, w_qkv, cos, sin, kv_heads, bias, out, config):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    B, S, K = x.shape
    M, N = B * S, w_qkv.shape[0]
    D = 2 * cos.shape[-1]
    BN, BK = config["BLOCK_N"], HOPPER_BLOCK_K
    x_desc = TensorDescriptor(x, [M, K], [x.stride(1), 1], [64, BK], _gl_layout((64, BK), x.dtype))
    w_desc = TensorDescriptor.from_tensor(w_qkv, [BN, BK], _gl_layout((BN, BK), x.dtype))
    c_desc = TensorDescriptor.from_tensor(out.view(M, N), [64, BN], _gl_layout((64, BN), x.dtype))
    rope = (cos, sin, bias if bias is not None else cos, S, N // D - kv_heads, *cos.stride(),
            *sin.stride())
    tiles = -(-M // (128 if config["COOP"] else 64)) * -(-N // BN)
    grid = min(tiles, _num_sms(x.device.index))
    qkv_rotary_hopper_kernel[(grid,)](
        x_desc, w_desc, c_desc, rope, M, N, K, grid, BN, BK, config["GROUP_M"], config["STAGES"],
        config["COOP"], D, bias is not None, num_warps=4)
    return out


def qkv_rotary(x, w_qkv, cos, sin, kv_heads, bias=None, config=None, hopper=None):
    """config: the Triton kernel's (pick_config's keys); hopper: the Gluon kernel's
    (pick_hopper_config's keys), or False to keep it off. Without either: the split-K kernels
    for a generation step's few rows (M <= SKINNY_MAX_M), else the Gluon kernel where
    _hopper_ok allows."""
    B, S, K = x.shape
    D = 2 * cos.shape[-1]
    heads_total = w_qkv.shape[0] // D
    out = torch.empty((B, S, heads_total, D), device=x.device, dtype=x.dtype)
    M = B * S
    if out.numel() == 0:
        return out
    if hopper is None and config is None and M <= SKINNY_MAX_M:
        return qkv_rotary_skinny(x, w_qkv, cos, sin, kv_heads, bias, out)
    if hopper is None and config is None:
        cfg = pick_hopper_config(w_qkv.shape[0])
        hopper = cfg if _hopper_ok(x, w_qkv, out, D, cfg) else False
    if hopper:
        return qkv_rotary_hopper(x, w_qkv, cos, sin, kv_heads, bias, out, hopper)
    cfg = dict(config or pick_config(D, x.dtype, x.device.type))
    use_tma = cfg.pop("USE_TMA", _tma_ok(x, w_qkv, D)) and 2 * cfg["HP"] == D
    x_desc = w_desc = None
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        x_desc = TensorDescriptor(x, [M, K], [x.stride(1), 1], [cfg["BLOCK_M"], cfg["BLOCK_K"]])
        w_desc = TensorDescriptor.from_tensor(w_qkv, [cfg["HEADS"] * D, cfg["BLOCK_K"]])
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(heads_total, cfg["HEADS"]),)
    qkv_rotary_kernel[grid](
        x, w_qkv, bias, cos, sin, out, x_desc, w_desc, M, S, K, D, heads_total,
        heads_total - kv_heads, *x.stride(), *w_qkv.stride(), *cos.stride(), *sin.stride(),
        GROUP_M=8, USE_TMA=use_tma, HAS_BIAS=bias is not None,
        PRECISION=_dot_precision(x.dtype), **cfg)
    return out


def kernel_fn(x, w_qkv, cos, sin, kv_heads, bias=None):
    return qkv_rotary(x, w_qkv, cos, sin, kv_heads, bias)
