"""
Decode attention in Triton: Q[B, Hq, Sq, D], the newest Sq positions of each sequence, over a
static KV cache K/V[B, Hkv, L, D] whose first lengths[b] positions are live. Starter kernel for
AutoKernel: query i of sequence b sits at position lengths[b] - Sq + i and attends to the cache
positions up to it; query head h reads key/value head h // (Hq / Hkv); scale 1/sqrt(D) unless
given. Output [B, Hq, Sq, D] in Q's dtype, math in fp32.

A decode step has one query per head and a cache of hundreds to thousands of positions, so one
program per (sequence, head) leaves most of the GPU idle (8 x 32 = 256 programs of one query at
batch 8) and each program walks the whole cache alone. The work is cut along the cache instead
(split-KV, "flash-decoding"):
  * pass 1, one program per (sequence, key/value head, slice of the cache): the query heads that
    share this key/value head (GROUP = Hq / Hkv of them, times Sq queries) are the rows of one
    tile, so each key/value block is read from memory once for the whole group (grouped-query
    attention's saving), and the scores are one tl.dot. It keeps an online softmax (running max
    m, running sum l, unnormalized accumulator) over its slice and writes all three.
  * pass 2, one program per (sequence, query head, query): rescales the slices' partial results
    to a common max and divides by the total sum.
Slices are chosen so that pass 1 has about two programs per SM; slices past a sequence's live
length do nothing (their l is 0 and they weigh nothing in pass 2). Positions past lengths[b] are
never loaded, so stale or NaN values there cannot leak in.

Rows of the tile past GROUP * Sq are padding (tl.dot needs at least 16 rows); at batch 1 and
GROUP 4 that is 12 of 16 rows computed for nothing, which costs no memory traffic, and decode
attention is memory-bound.

Things to try: the slice count per shape (the cache length is only known on the device, so the
host plans for the full cache); BLOCK_N 32 vs 64 vs 128; fp16/bf16 P for the second dot (done
here) vs fp32; one pass with atomics instead of the combine; for Sq = 1 and GROUP = 1 (plain
multi-head attention) a dot-free path (a [BLOCK_N, D] product summed over D).

Usage:
  uv run bench.py --kernel kernels/decode_attention.py
"""
import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "decode_attention"
BACKEND = "triton"

SM_COUNT = torch.cuda.get_device_properties(0).multi_processor_count \
    if torch.cuda.is_available() else 4


@triton.jit
def decode_split_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, ml_ptr, scale,
                        sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d,
                        H_KV, SQ, GROUP, D, SPLIT_LEN, NUM_SPLITS,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b, hkv = pid // H_KV, pid % H_KV
    length = tl.load(len_ptr + b).to(tl.int32)
    start = split * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, length)

    rows = tl.arange(0, BLOCK_M)  # row r: query head hkv * GROUP + r // SQ, query r % SQ
    row_ok = rows < GROUP * SQ
    head = hkv * GROUP + rows // SQ
    qi = rows % SQ
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < D
    q = tl.load(q_ptr + b.to(tl.int64) * sq_b + head[:, None] * sq_h + qi[:, None] * sq_s
                + dims[None, :] * sq_d, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    query_pos = length - SQ + qi  # each query sees the cache up to its own position

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + b.to(tl.int64) * sk_b + hkv * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + hkv * sv_h
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < end
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_base + cols[:, None] * sk_n + dims[None, :] * sk_d, mask=kv_mask,
                    other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        visible = col_ok[None, :] & (cols[None, :] <= query_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        v = tl.load(v_base + cols[:, None] * sv_n + dims[None, :] * sv_d, mask=kv_mask,
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l = l * alpha + tl.sum(p, axis=1)
        m = m_new

    # partial results at [b, head, query, split]: acc [.., D], then (m, l)
    part = ((b * H_KV * GROUP + head) * SQ + qi) * NUM_SPLITS + split
    tl.store(o_ptr + part[:, None] * D + dims[None, :], acc,
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(ml_ptr + part * 2, m, mask=row_ok)
    tl.store(ml_ptr + part * 2 + 1, l, mask=row_ok)


@triton.jit
def decode_combine_kernel(o_ptr, ml_ptr, out_ptr, D, NUM_SPLITS,
                          BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # (b, head, query), the output's rows in order
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < NUM_SPLITS
    m = tl.load(ml_ptr + (row * NUM_SPLITS + splits) * 2, mask=split_ok, other=float("-inf"))
    l = tl.load(ml_ptr + (row * NUM_SPLITS + splits) * 2 + 1, mask=split_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    weight = tl.where(l > 0, tl.exp(m - m_max), 0.0)  # an empty slice has m = -inf, l = 0
    dims = tl.arange(0, BLOCK_D)
    acc = tl.load(o_ptr + (row * NUM_SPLITS + splits)[:, None] * D + dims[None, :],
                  mask=split_ok[:, None] & (dims[None, :] < D), other=0.0)
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    tl.store(out_ptr + row * D + dims, out.to(out_ptr.dtype.element_ty), mask=dims < D)


@functools.lru_cache(maxsize=None)
def _plan(B, H_kv, L, rows):
    """(BLOCK_N, slice length, slice count): about two pass-1 programs per SM over the full
    cache, each slice a whole number of key blocks."""
    block_n = 64 if rows <= 16 else 32
    blocks = triton.cdiv(max(L, 1), block_n)
    splits = max(1, min(blocks, triton.cdiv(2 * SM_COUNT, B * H_kv), 64))
    split_len = triton.cdiv(blocks, splits) * block_n
    return block_n, split_len, triton.cdiv(max(L, 1), split_len)


def kernel_fn(Q, K, V, lengths, scale=None):
    B, H, Sq, D = Q.shape
    H_kv, L = K.shape[1], K.shape[2]
    if H % H_kv or K.shape != V.shape or K.shape[0] != B or K.shape[3] != D:
        raise ValueError(f"Q {tuple(Q.shape)} and K/V {tuple(K.shape)} do not fit")
    group = H // H_kv
    rows = group * Sq
    block_m = max(16, triton.next_power_of_2(rows))
    block_n, split_len, splits = _plan(B, H_kv, L, block_m)
    scale = D ** -0.5 if scale is None else scale
    partial = torch.empty((B * H * Sq * splits, D), dtype=torch.float32, device=Q.device)
    ml = torch.empty((B * H * Sq * splits, 2), dtype=torch.float32, device=Q.device)
    out = torch.empty((B, H, Sq, D), dtype=Q.dtype, device=Q.device)
    block_d = triton.next_power_of_2(D)
    decode_split_kernel[(B * H_kv, splits)](
        Q, K, V, lengths, partial, ml, scale, *Q.stride(), *K.stride(), *V.stride(),
        H_kv, Sq, group, D, split_len, splits,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=4)
    decode_combine_kernel[(B * H * Sq,)](partial, ml, out, D, splits,
                                         BLOCK_S=triton.next_power_of_2(splits),
                                         BLOCK_D=block_d, num_warps=4)
    return out
