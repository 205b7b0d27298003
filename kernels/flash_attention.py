"""
Starter kernel: flash attention forward, O = softmax(Q K^T * scale (+ causal mask)) V, in Triton.

    from kernels.flash_attention import kernel_fn
    O = kernel_fn(Q=Q, K=K, V=V, causal=True, scale=None)   # Q, O [B,Hq,S,D]; K, V [B,Hkv,S,D]
    uv run bench.py            # after extract.py (or you) copied this file to kernel.py

scale None is 1/sqrt(D). Grouped-query attention: Hq is a multiple of Hkv, and query head h reads
key/value head h // (Hq // Hkv); each program offsets its K/V addresses by that head, so K and V
are never repeated in memory (Hq == Hkv is ordinary multi-head attention).
O is stored as [B,S,Hq,D] and returned as its [B,Hq,S,D] view (.transpose(1, 2)), the layout
torch's own flash SDPA returns: attention layers follow it with y.transpose(1, 2).reshape(B, S,
Hq * D) for the output projection, a free view of this layout and a full copy of a contiguous
[B,Hq,S,D] one. Inside torch.compile the op's output has this layout in any case (the type's
out_order): a kernel returning another one pays that copy.

FlashAttention-2 style: one program owns BLOCK_M query rows of one (batch, head), keeps its Q tile
in registers and streams K/V tiles through an online softmax (running max m, running sum l, fp32
accumulator rescaled when the max grows), so the S x S score matrix never touches memory.
  * exp2 instead of exp: log2(e) is folded into the softmax scale once, outside the loop.
  * Two loops, the first with no mask at all, the second over the few key blocks that need one.
    Causal: the first runs over the key blocks wholly left of the diagonal, the second over the
    block that straddles it (which also masks keys past the end of S, so any S works: 1, 127,
    1023...); blocks wholly right of the diagonal are never loaded. Not causal (causal=False):
    the first runs over every whole block of BLOCK_N keys, the second over the partial block at
    the end of S, if there is one, masking the keys past S.
  * Heaviest query blocks first: with the causal mask the last query block of a head sees every
    key, the first sees one block, so programs start from the bottom of the sequence and the
    light ones fill the tail (without it every block sees all S keys, and the order is moot).
  * On Hopper, for large problems with contiguous [B,H,S,D] inputs, Q/K/V tiles arrive through
    TMA descriptors over the [B*Hq*S, D] and [B*Hkv*S, D] row views (address math and pipelining
    by the copy engine). Any other layout (e.g. [B,S,H,D] views, or slices of a fused q/k/v
    buffer) takes the pointer path, which honours strides.
fp32 inputs use tf32x3 dots (three tensor-core products): ~1e-6 error against the 1e-4 tolerance.
Head dims that are not a power of two are padded to the next one with masked loads.

On Hopper (sm_90), large fp16/bf16 problems with head dim 64 or 128 and a positive scale, whose Q,
K and V are contiguous or rows of positions seen through .transpose(1, 2) ([B,S,H,D] buffers,
or head slices of a fused q/k/v buffer), take a second kernel
(causal or not, grouped-query or not, with the same key/value head index and masks), written in
Gluon (Triton's lower-level dialect: explicit layouts, shared memory, barriers and async
tensor-core ops), in the style of FlashAttention-3. Plain Triton 3.6 waits
for each tensor-core product before the softmax that follows it, and at D=128 the exp2s cost
about half as much as the two products: the Triton kernel kept the tensor pipe busy 49% of the
time under ncu (SDPA's cuDNN kernel 63%) and ran at 0.83x SDPA. The Gluon kernel:
  * warp specialization: one warp only issues TMA loads; two warpgroups of 64 query rows each
    (one 128-row tile per CTA) only compute. They talk through mbarriers: "ready" (the load
    landed) and "empty" (both warpgroups are done with a K or V buffer).
  * inside a warpgroup, block j+1's scores S = Q K^T and block j's O += P V are issued together
    (async wgmma); the softmax of block j+1 runs while the tensor cores do P V.
  * ping-pong: the two warpgroups take turns issuing their products, so one's softmax runs
    while the other's products do (measured: no gain or loss at these shapes; FA3 has it).
  * persistent CTAs (one per SM) that walk a host-made schedule: query tiles in groups of heads
    whose K/V fit in a third of L2, heaviest first, each tile handed to the CTA that frees up
    first (a group spans Hq // Hkv times as many query heads, which share K/V). Without the
    grouping the K/V of all 64 heads were live at once: 289 MB read from DRAM against SDPA's
    100 MB, and 0.92x SDPA instead of 1.05x.
On the H100 (fp16, causal): 2x32x2048x128 139 us, 1.08x SDPA (cuDNN's FA3-class kernel; the
Triton kernel: 188 us); 1x32x4096x64 174 us, 1.06x SDPA (Triton: 180). Alone at GPT-2's
8x12x1024x64 it is 2% faster than cuDNN's, but inside GPT-2's compiled forward, which runs at
the H100's 700 W power cap, it drew more power: 47.8 us a call against cuDNN's 45.2 and the
whole forward's clock 4% lower, so verify.py's
per-kernel timing inside torch.compile leaves GPT-2's attention to cuDNN. Energy a call is
what counts there.
What has worked here: fully masked causal blocks never loaded, exp2, BLOCK_M 128 / BLOCK_N 64,
the 1/l rescale once at the end, O allocated as torch.empty(B, S, H, D).transpose(1, 2) (inside
a compiled model any other layout is copied into that one, time the model pays).
Things to try: BLOCK_M/BLOCK_N/num_stages per head dim for the Triton kernel, finer-grained
diagonal masking, BLOCK_N=176 or 192 for the Gluon kernel (fewer, longer steps), Gluon kernels
for Blackwell (tcgen05) or for other head dims.
"""
import functools
import heapq
import math

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

KERNEL_TYPE = "flash_attention"
BACKEND = "triton"

LOG2E = 1.4426950408889634
# triton 3.6 names the TMA load async_copy_global_to_shared; 3.9 renamed it async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@triton.jit
def _attend(acc, m_i, l_i, q, k_src, v_src, kv_row0, offs_m, offs_d, start, stop, S, D, qk_scale,
            stride_ks, stride_vs, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
            CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, USE_TMA: tl.constexpr,
            PRECISION: tl.constexpr):
    """Fold key/value blocks [start, stop) into the running (acc, m_i, l_i) of one query tile.
    k_src/v_src: tensor descriptors over [B*Hkv*S, D] rows (USE_TMA; this kv head starts at
    kv_row0), or pointer tiles [BLOCK_N, BLOCK_D] at key 0 of this kv head.
    MASKED blocks may hold keys past S, and (CAUSAL) keys after some of the tile's queries: they
    mask the scores (and the pointer loads); the others load and score every key unmasked."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, stop, BLOCK_N):
        keys = start_n + offs_n
        if USE_TMA:
            # Rows past S belong to the next head (or are zero-filled past the tensor's end):
            # only masked blocks reach them, and the score mask below removes them.
            k = k_src.load([kv_row0 + start_n, 0])
            v = v_src.load([kv_row0 + start_n, 0])
        elif MASKED:  # keys past S are masked here, and in the scores below
            kv_mask = keys[:, None] < S
            if not EVEN_D:
                kv_mask = kv_mask & (offs_d[None, :] < D)
            k = tl.load(k_src + start_n * stride_ks, mask=kv_mask, other=0.0)
            v = tl.load(v_src + start_n * stride_vs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_src + start_n * stride_ks)
            v = tl.load(v_src + start_n * stride_vs)
        else:
            k = tl.load(k_src + start_n * stride_ks, mask=offs_d[None, :] < D, other=0.0)
            v = tl.load(v_src + start_n * stride_vs, mask=offs_d[None, :] < D, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # log2 units
        if MASKED:
            if CAUSAL:  # key <= query; this also removes keys past S from every real query row
                scores = tl.where(offs_m[:, None] >= keys[None, :], scores, float("-inf"))
            else:
                scores = tl.where(keys[None, :] < S, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.math.exp2(scores - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def flash_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, q_desc, k_desc, v_desc, H, GROUP, S, D,
                           qk_scale,
                           stride_qb, stride_qh, stride_qs, stride_qd,
                           stride_kb, stride_kh, stride_ks, stride_kd,
                           stride_vb, stride_vh, stride_vs, stride_vd,
                           stride_ob, stride_oh, stride_os, stride_od,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                           CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, USE_TMA: tl.constexpr,
                           PRECISION: tl.constexpr):
    bh = tl.program_id(0)
    block_m = tl.num_programs(1) - 1 - tl.program_id(1)  # heaviest (last) query block first
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    kv_h = h // GROUP  # GROUP query heads share one key/value head (grouped-query attention)
    o_ptr += b * stride_ob + h * stride_oh

    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = offs_m[:, None] < S
    if not EVEN_D:
        q_mask = q_mask & (offs_d[None, :] < D)
    # This head's first row in the [B*H*S, D] view of Q, and its kv head's in the [B*Hkv*S, D]
    # views of K and V (TMA path).
    row0 = (bh * S).to(tl.int32)
    kv_row0 = ((b * (H // GROUP) + kv_h) * S).to(tl.int32)
    if USE_TMA:
        q = q_desc.load([row0 + block_m * BLOCK_M, 0])
        k_src = k_desc
        v_src = v_desc
    else:
        q_ptr += b * stride_qb + h * stride_qh
        q = tl.load(q_ptr + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                    mask=q_mask, other=0.0)
        k_src = k_ptr + b * stride_kb + kv_h * stride_kh + (offs_n[:, None] * stride_ks
                                                            + offs_d[None, :] * stride_kd)
        v_src = v_ptr + b * stride_vb + kv_h * stride_vh + (offs_n[:, None] * stride_vs
                                                            + offs_d[None, :] * stride_vd)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    if CAUSAL:  # unmasked up to the diagonal block, which is masked; nothing right of it
        mask_start = block_m * BLOCK_M  # BLOCK_M is a multiple of BLOCK_N
        mask_stop = tl.minimum(mask_start + BLOCK_M, S)
    else:  # every whole block of keys unmasked, then the partial one at the end of S, if any
        mask_start = (S // BLOCK_N) * BLOCK_N
        mask_stop = S
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_src, v_src, kv_row0, offs_m, offs_d, 0,
                            mask_start, S, D, qk_scale, stride_ks, stride_vs, BLOCK_N, False,
                            CAUSAL, EVEN_D, USE_TMA, PRECISION)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_src, v_src, kv_row0, offs_m, offs_d, mask_start,
                            mask_stop, S, D, qk_scale, stride_ks, stride_vs, BLOCK_N, True,
                            CAUSAL, EVEN_D, USE_TMA, PRECISION)
    # Every real query row saw at least one key (its own, or key 0), so l_i > 0 there; padded
    # rows are not stored.
    out = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=q_mask)


# ---------------------------------------------------------------------------------------------
# Hopper: the same algorithm in Gluon, FlashAttention-3 style (see the docstring at the top).
# A CTA has three partitions: two consumer warpgroups (64 query rows each; the default partition
# is warpgroup 0) and a one-warp producer. K and V blocks of BLOCK_N keys live in a ring of
# STAGES shared-memory buffers, each with a "ready" barrier (the TMA load landed) and an "empty"
# barrier (both warpgroups are done with it; count 2). mbarriers start in phase 0, and a wait for
# phase 1 on a fresh one passes at once, which is how the producer fills the ring the first time.

@gluon.jit
def _hopper_online_softmax(s, m_i, l_i, qk_scale, row_lo, start_n, S, MASK: gl.constexpr,
                           CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Online softmax of one 64 x BLOCK_N score block (log2 units after qk_scale, which must be
    positive: the row max is taken before scaling)."""
    if MASK:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if CAUSAL:  # key <= query (this also removes keys past S from every real row)
            rows = row_lo + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
            s = gl.where(rows[:, None] >= cols[None, :], s, float("-inf"))
        else:  # keys past S
            s = gl.where((cols < S)[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])  # the scale folds into one FMA
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _hopper_softmax_step(s, m_i, l_i, qk_scale, row_lo, block, first_masked, S,
                         CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Key block `block`'s softmax: only blocks from first_masked on build a mask (the causal
    one, or keys past S)."""
    if block >= first_masked:
        return _hopper_online_softmax(s, m_i, l_i, qk_scale, row_lo, block * BLOCK_N, S, True,
                                      CAUSAL, BLOCK_N, s_layout)
    else:
        return _hopper_online_softmax(s, m_i, l_i, qk_scale, row_lo, block * BLOCK_N, S, False,
                                      CAUSAL, BLOCK_N, s_layout)


@gluon.jit
def _hopper_consumer(wg: gl.constexpr, descs, bars, bufs, out, S, sched, heads, qk_scale,
                     n_qb,
                     BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr):
    """Warpgroup wg: rows 64*wg..64*wg+63 of each of this CTA's 128-row query tiles."""
    q_desc, k_desc, v_desc = descs
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn = bars
    q_smem, k_smem, v_smem = bufs
    o_ptr, n_heads = out  # O is [B,S,H,D] in memory
    dtype: gl.constexpr = q_desc.dtype
    # wgmma accumulator layouts for S [64, BLOCK_N] and O [64, HEAD_D]; P feeds the P V product
    # from registers, as the A operand of O's layout.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q = q_smem.index(wg)
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)

    # Counters carried across tiles: they give each ring buffer's index and barrier phase.
    kc = 0     # K blocks used
    vc = 0     # V blocks used
    turns = 0  # turns taken at the tensor cores
    tiles = 0
    for t in range(gl.load(sched + gl.program_id(0)), gl.load(sched + gl.program_id(0) + 1)):
        code = gl.load(sched + t)
        bh = code // n_qb
        off_m = (code % n_qb) * 128
        row_lo = off_m + 64 * wg
        if CAUSAL:  # keys up to the tile's last row
            n_blocks = (gl.minimum(off_m + 128, S) + BLOCK_N - 1) // BLOCK_N
            first_masked = (row_lo + 1) // BLOCK_N  # blocks from here on hold keys past a row
        else:  # all S keys
            n_blocks = (S + BLOCK_N - 1) // BLOCK_N
            first_masked = S // BLOCK_N  # the block holding keys past S, if any
        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([64, HEAD_D], gl.float32, o_layout)

        # Block 0's scores, alone: the loop below always has a P V product to overlap.
        mbarrier.wait(q_ready, tiles & 1)
        ks = kc % STAGES
        mbarrier.wait(k_ready.index(ks), (kc // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(ks).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(ks), count=1)
        mbarrier.arrive(q_empty, count=1, pred=n_blocks == 1)  # Q's last use
        kc += 1
        p, m_i, l_i, alpha = _hopper_softmax_step(s, m_i, l_i, qk_scale, row_lo, 0, first_masked,
                                                  S, CAUSAL, BLOCK_N, s_layout)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

        for j in range(0, n_blocks - 1):
            ks = kc % STAGES
            vs = vc % STAGES
            mbarrier.wait(k_ready.index(ks), (kc // STAGES) & 1)
            mbarrier.wait(v_ready.index(vs), (vc // STAGES) & 1)
            # Ping-pong: wait for our turn (warpgroup 0 goes first), issue S_{j+1} = Q K_{j+1}^T
            # and O += P_j V_j, hand the turn over.
            mbarrier.wait(turn.index(wg), (turns + 1 - wg) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(ks).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            acc_tok = warpgroup_mma(p_op, v_smem.index(vs), acc, is_async=True)
            mbarrier.arrive(turn.index(1 - wg), count=1)
            turns += 1
            s = warpgroup_mma_wait(1, deps=(s_tok,))  # S is done; P V may still run
            mbarrier.arrive(k_empty.index(ks), count=1)
            mbarrier.arrive(q_empty, count=1, pred=j + 2 == n_blocks)
            kc += 1
            p, m_i, l_i, alpha = _hopper_softmax_step(s, m_i, l_i, qk_scale, row_lo, j + 1,
                                                      first_masked, S, CAUSAL, BLOCK_N, s_layout)
            # P_j's registers stay alive until the product that reads them is done
            acc, p_done = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
            mbarrier.arrive(v_empty.index(vs), count=1)
            vc += 1
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        vs = vc % STAGES
        mbarrier.wait(v_ready.index(vs), (vc // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(vs), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc_tok,))
        mbarrier.arrive(v_empty.index(vs), count=1)
        vc += 1

        # Every real row saw at least one key (its own, or key 0), so l_i > 0 there; rows past
        # S are not stored.
        o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        rows = row_lo + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        # every term a multiple of HEAD_D: the compiler knows the rows' alignment and stores
        # each thread's adjacent columns as one vector
        o_rows = ((bh // n_heads) * S + rows).to(gl.int64) * n_heads + bh % n_heads
        offs = o_rows[:, None] * HEAD_D + cols[None, :]
        gl.store(o_ptr + offs, o.to(dtype), mask=(rows < S)[:, None])
        tiles += 1


# warp_specialize takes one function per partition, and the worker partitions' functions must
# share a signature: hence two thin wrappers around _hopper_consumer.
@gluon.jit
def _hopper_consumer0(descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb,
                      BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr):
    _hopper_consumer(0, descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb, BLOCK_N,
                     HEAD_D, STAGES, CAUSAL)


@gluon.jit
def _hopper_consumer1(descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb,
                      BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr):
    _hopper_consumer(1, descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb, BLOCK_N,
                     HEAD_D, STAGES, CAUSAL)


@gluon.jit
def _hopper_producer(descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb,
                     BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr):
    """One warp: TMA loads of each tile's Q (both halves) and K/V blocks, in the consumers'
    order: K_0, then K_{j+1} with V_j."""
    q_desc, k_desc, v_desc = descs
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn = bars
    q_smem, k_smem, v_smem = bufs
    kc = 0
    vc = 0
    tiles = 0
    for t in range(gl.load(sched + gl.program_id(0)), gl.load(sched + gl.program_id(0) + 1)):
        code = gl.load(sched + t)
        off_m = (code % n_qb) * 128
        if CAUSAL:  # the consumers' key blocks: up to the tile's last row, or all of S
            n_blocks = (gl.minimum(off_m + 128, S) + BLOCK_N - 1) // BLOCK_N
        else:
            n_blocks = (S + BLOCK_N - 1) // BLOCK_N
        # Where this head's rows start in each descriptor's 2-D view, and its key/value head's
        # (see _tma_rows and _hopper_heads).
        head = heads + (code // n_qb) * 6
        q_row, q_col = gl.load(head), gl.load(head + 1)
        k_row, k_col = gl.load(head + 2), gl.load(head + 3)
        v_row, v_col = gl.load(head + 4), gl.load(head + 5)
        # The next tile's Q loads as soon as both warpgroups made their last Q K^T product.
        mbarrier.wait(q_empty, (tiles & 1) ^ 1)
        mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row + off_m, q_col], q_ready, q_smem.index(0))
        _tma_load(q_desc, [q_row + off_m + 64, q_col], q_ready, q_smem.index(1))
        for j in range(-1, n_blocks):
            if j + 1 < n_blocks:
                ks = kc % STAGES
                mbarrier.wait(k_empty.index(ks), ((kc // STAGES) & 1) ^ 1)
                mbarrier.expect(k_ready.index(ks), k_desc.block_type.nbytes)
                _tma_load(k_desc, [k_row + (j + 1) * BLOCK_N, k_col], k_ready.index(ks),
                          k_smem.index(ks))
                kc += 1
            if j >= 0:
                vs = vc % STAGES
                mbarrier.wait(v_empty.index(vs), ((vc // STAGES) & 1) ^ 1)
                mbarrier.expect(v_ready.index(vs), v_desc.block_type.nbytes)
                _tma_load(v_desc, [v_row + j * BLOCK_N, v_col], v_ready.index(vs),
                          v_smem.index(vs))
                vc += 1
        tiles += 1


@gluon.jit
def flash_attention_hopper_kernel(q_desc, k_desc, v_desc, o_ptr, n_heads, S, sched, heads,
                                  qk_scale, n_qb,
                                  BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                                  STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, 64, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    descs = (q_desc, k_desc, v_desc)
    bars = (q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn)
    bufs = (q_smem, k_smem, v_smem)
    out = (o_ptr, n_heads)
    # The default partition (this kernel's 4 warps) is warpgroup 0; the workers get 4 warps at
    # 240 registers (warpgroup 1) and 1 warp at 24 (the producer).
    gl.warp_specialize([
        (_hopper_consumer0, (descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb, BLOCK_N,
                             HEAD_D, STAGES, CAUSAL)),
        (_hopper_consumer1, (descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb, BLOCK_N,
                             HEAD_D, STAGES, CAUSAL)),
        (_hopper_producer, (descs, bars, bufs, out, S, sched, heads, qk_scale, n_qb, BLOCK_N,
                            HEAD_D, STAGES, CAUSAL))],
        [4, 1], [240, 24])


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def pick_config(S, D, dtype):
    """BLOCK_M query rows per program, BLOCK_N keys per step, by head dim (register budget)."""
    if dtype == torch.float32:  # 4-byte tiles and tf32x3: keep tiles small
        if D <= 64:
            return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
        return dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2)
    if D <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4)
    # D=128: a sweep on the H200 (BLOCK_M 64/128, BLOCK_N 32-128, 4/8 warps, 2-4 stages) at
    # 2x32x2048x128 put 64x64 tiles with 4 warps first (169 us; 128x32 with 8 warps: 174 us)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)


# Below this much work (B*H*S*S*D) the TMA path's per-launch host work costs more than it saves
# (on triton 3.6 a launch with host tensor descriptors took ~50 us of host time on an H100).
TMA_MIN_WORK = 2 ** 34
# The Gluon kernel from 512 positions and a quarter of that work. H100, bf16 causal, GPU time
# (us, Gluon / Triton): 2x32x1024x128 48.0 / 58.2, 8x12x1024x64 46.8 / 48.1, 8x12x512x64
# 18.4 / 18.7; below, its two query tiles a head lose: 8x16x256x128 17.1 / 15.4.
HOPPER_MIN_S = 512
HOPPER_MIN_WORK = 2 ** 32


def _tma_rows(t):
    """t[B,H,S,D] as a 2-D view whose consecutive rows are consecutive positions, for the Gluon
    kernel's descriptors, with (b, h)'s first row at b * rows_b + h * rows_h and column h * cols_h:
    (view, rows_b, rows_h, cols_h). Contiguous [B,H,S,D] is [B*H*S, D]; rows of positions seen
    as [B,H,S,D] (what attention layers hand over after .transpose(1, 2): a [B,S,H,D] buffer,
    or a head slice of a fused q/k/v buffer, whose rows are R > H*D elements apart) are
    [B*S, H*D] with row stride R. None for any other layout, or rows not 16-byte aligned."""
    B, H, S, D = t.shape
    es, R = t.element_size(), t.stride(2)
    if (D * es) % 16 or t.data_ptr() % 16:
        return None
    if t.stride() == (H * S * D, S * D, D, 1):
        return t.view(B * H * S, D), H * S, S, 0
    if t.stride(3) == 1 and t.stride(1) == D and R >= H * D and (R * es) % 16 == 0 \
            and (B == 1 or t.stride(0) == S * R):
        return t.as_strided((B * S, H * D), (R, 1)), S, 0, D
    return None


def _rows_view(t):
    """t[B,H,S,D] as [B*H*S, D] rows for the Triton kernel's TMA path, which addresses (b, h)'s
    rows from (b * H + h) * S (H: this tensor's heads, Hq for Q, Hkv for K and V): only a
    contiguous [B,H,S,D] qualifies (the first layout of _tma_rows)."""
    rows = _tma_rows(t)
    return rows[0] if rows is not None and rows[3] == 0 else None


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


def _check_shapes(Q, K, V):
    """Q [B,Hq,S,D], K and V [B,Hkv,S,D] with Hq a multiple of Hkv: (B, Hq, Hkv, S, D)."""
    B, Hq, S, D = Q.shape
    Hkv = K.shape[1]
    assert K.shape == (B, Hkv, S, D) and V.shape == K.shape, \
        "K and V must be [B, Hkv, S, D] with Q's B, S and D"
    assert Hq % Hkv == 0, "the query heads must be a multiple of the key/value heads"
    return B, Hq, Hkv, S, D


def flash_attention(Q, K, V, causal=True, scale=None, config=None, tma=None, hopper=None):
    """softmax(Q K^T * scale (causal or not)) V on [B,H,S,D] tensors of any strides, with K and V
    on Hkv heads that Q's H heads share in groups of H // Hkv; scale None is 1/sqrt(D). The Gluon
    kernel runs where _hopper_ok allows it, unless hopper=False or a Triton config is given."""
    B, H, Hkv, S, D = _check_shapes(Q, K, V)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if hopper is None:
        hopper = config is None and tma is None and _hopper_ok(Q, K, V, scale)
    if hopper:
        return flash_attention_hopper(Q, K, V, causal, scale)
    O = torch.empty((B, S, H, D), device=Q.device, dtype=Q.dtype).transpose(1, 2)
    cfg = dict(config or pick_config(S, D, Q.dtype))
    if not config and torch.version.hip is not None:
        # AMD GPUs have 64 KiB of LDS (MI300X; 160 on MI350X), not the 228 KiB these H100
        # configs fill: two stages keep every tile within it
        cfg["num_stages"] = min(cfg["num_stages"], 2)
    BM, BN = cfg["BLOCK_M"], cfg["BLOCK_N"]
    assert BM % BN == 0, "BLOCK_M must be a multiple of BLOCK_N"
    block_d = max(16, 1 << (D - 1).bit_length())  # next power of 2
    if tma is None:
        tma = B * H * S * S * D >= TMA_MIN_WORK and _gpu_has_tma(Q)
    views = [_rows_view(t) for t in (Q, K, V)] if tma and block_d == D else [None]
    use_tma = all(v is not None for v in views)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        descs = [TensorDescriptor.from_tensor(v, [rows, D])
                 for v, rows in zip(views, (BM, BN, BN))]
    else:
        descs = [None, None, None]
    grid = (B * H, (S + BM - 1) // BM)
    flash_attention_kernel[grid](
        Q, K, V, O, *descs, H, H // Hkv, S, D, LOG2E * scale,
        *Q.stride(), *K.stride(), *V.stride(), *O.stride(),
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=block_d, CAUSAL=bool(causal), EVEN_D=block_d == D,
        USE_TMA=use_tma, PRECISION=_dot_precision(Q.dtype),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return O


# The Gluon kernel's tiles: 128 query rows (two warpgroups of 64) by 128 keys, and a ring of two
# K and two V buffers: 32 + 2 * 2 * 32 = 160 KB of shared memory at D=128, one CTA per SM. On
# the H100 a third buffer pair (224 KB) measured the same; D=64 too.
HOPPER_BLOCK_N = 128
HOPPER_STAGES = 2


@functools.lru_cache(maxsize=None)
def _hopper_device(index):
    """(SM count, L2 bytes) if GPU `index` is a Hopper (compute capability 9.x: wgmma), else
    None. An AMD GPU never is, whatever capability ROCm reports (gfx942: 9.4)."""
    props = torch.cuda.get_device_properties(index)
    hopper = props.major == 9 and torch.version.hip is None
    return (props.multi_processor_count, props.L2_cache_size) if hopper else None


def _hopper_ok(Q, K, V, scale=None):
    """Large fp16/bf16 problems with head dim 64 or 128 and a positive scale (None: 1/sqrt(D)) on
    a Hopper GPU, each of Q, K and V contiguous or rows of positions (_tma_rows); K
    and V may have fewer heads than Q (grouped-query attention)."""
    B, H, S, D = Q.shape
    Hkv = K.shape[1]
    return (Q.is_cuda and Q.dtype in (torch.float16, torch.bfloat16)
            and K.dtype == Q.dtype and V.dtype == Q.dtype and D in (64, 128)
            and K.shape == (B, Hkv, S, D) and V.shape == K.shape and H % Hkv == 0
            and (scale is None or scale > 0)
            and S >= HOPPER_MIN_S and B * H * S * S * D >= HOPPER_MIN_WORK
            and _hopper_device(Q.device.index) is not None
            and all(_tma_rows(t) is not None for t in (Q, K, V)))


@functools.lru_cache(maxsize=None)
def _hopper_heads(B, H, group, q_place, k_place, v_place, device):
    """Per (b, h) of Q's H heads: the first row and the column of its rows in Q's 2-D view, and
    of its key/value head h // group's rows in K's and V's."""
    table = [[coord for (rb, rh, ch), head in ((q_place, h), (k_place, h // group),
                                               (v_place, h // group))
              for coord in (b * rb + head * rh, head * ch)]
             for b in range(B) for h in range(H)]
    return torch.tensor(table, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=None)
def hopper_schedule(BH, S, ctas, heads_per_group, device, causal=True):
    """Which 128-row query tiles each persistent CTA runs, in order. Tiles come in groups of
    heads_per_group heads (their K/V stay in L2 while the group runs), heaviest query block
    first within a group, and each goes to the CTA that frees up first (greedy longest-first;
    a tile costs its key blocks, all of S's when not causal, plus one for its prologue).
    Layout: ctas + 1 offsets into the tensor, then tile codes bh * n_qb + block_m, CTA by CTA."""
    n_qb = (S + 127) // 128
    free = [(0, c) for c in range(ctas)]  # (when the CTA frees up, CTA)
    tiles = [[] for _ in range(ctas)]
    for first_head in range(0, BH, heads_per_group):
        for block_m in reversed(range(n_qb)):
            for bh in range(first_head, min(BH, first_head + heads_per_group)):
                busy_until, cta = heapq.heappop(free)
                tiles[cta].append(bh * n_qb + block_m)
                keys = min(block_m * 128 + 128, S) if causal else S
                key_blocks = (keys + HOPPER_BLOCK_N - 1) // HOPPER_BLOCK_N
                heapq.heappush(free, (busy_until + key_blocks + 1, cta))
    offsets = [ctas + 1]
    for cta_tiles in tiles:
        offsets.append(offsets[-1] + len(cta_tiles))
    codes = [code for cta_tiles in tiles for code in cta_tiles]
    return torch.tensor(offsets + codes, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=None)
def _hopper_layouts(D, dtype):
    el = gl.float16 if dtype == torch.float16 else gl.bfloat16
    return (gl.NVMMASharedLayout.get_default_for([64, D], el),
            gl.NVMMASharedLayout.get_default_for([HOPPER_BLOCK_N, D], el))


def flash_attention_hopper(Q, K, V, causal=True, scale=None):
    """The Gluon kernel; the caller checked _hopper_ok(Q, K, V, scale)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    B, H, S, D = Q.shape
    group = H // K.shape[1]  # query heads per key/value head
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    sms, l2_bytes = _hopper_device(Q.device.index)
    q_layout, kv_layout = _hopper_layouts(D, Q.dtype)
    (q2, *q_place), (k2, *k_place), (v2, *v_place) = (_tma_rows(t) for t in (Q, K, V))
    q_desc = TensorDescriptor.from_tensor(q2, [64, D], q_layout)
    k_desc = TensorDescriptor.from_tensor(k2, [HOPPER_BLOCK_N, D], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v2, [HOPPER_BLOCK_N, D], kv_layout)
    heads = _hopper_heads(B, H, group, tuple(q_place), tuple(k_place), tuple(v_place), Q.device)
    O = torch.empty((B, S, H, D), device=Q.device, dtype=Q.dtype).transpose(1, 2)
    n_qb = (S + 127) // 128
    # A third of L2 for the running group's K and V: on the H100 (50 MB) that is 16 heads at
    # S=2048, D=128 (146 us against 147 for 8 heads, 167 for all 64 at once). Consecutive query
    # heads share a key/value head in runs of `group`, so a group spans that many more of them.
    heads_per_group = max(1, l2_bytes // 3 // (2 * S * D * Q.element_size())) * group
    ctas = min(sms, B * H * n_qb)
    sched = hopper_schedule(B * H, S, ctas, heads_per_group, Q.device, bool(causal))
    # 12 warps (4 + 4 + 1, rounded up to whole warpgroups) x 32 threads x 168 registers fill the
    # 64K register file; warp_specialize then moves them: 240 to each consumer, 24 to the producer.
    flash_attention_hopper_kernel[(ctas,)](
        q_desc, k_desc, v_desc, O, H, S, sched, heads, LOG2E * scale, n_qb,
        BLOCK_N=HOPPER_BLOCK_N, HEAD_D=D, STAGES=HOPPER_STAGES, CAUSAL=bool(causal), num_warps=4,
        maxnreg=168)
    return O


def kernel_fn(Q, K, V, causal=True, scale=None):
    return flash_attention(Q, K, V, causal=causal, scale=scale)
