"""Planted: attention that indexes Q, K, V as contiguous [B,H,S,D] (right on contiguous
inputs, wrong on a [B,S,H,D] buffer seen through .transpose(1, 2), which the contract takes).
Expected reason: wrong values at the layout variant."""
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "flash_attention"
BENCH_SHAPES = [(1, 4, 16, 16)]
BLOCK = 16


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, Hq, Hkv, S, D, scale, CAUSAL: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    bh = tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    kv_base = (b * Hkv + h // (Hq // Hkv)) * S * D
    base = bh * S * D
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    q = tl.load(q_ptr + base + rm[:, None] * D + rd[None, :],
                mask=(rm[:, None] < S) & (rd[None, :] < D), other=0.0)
    m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    hi = tl.minimum((tl.program_id(0) + 1) * BM, S) if CAUSAL else S
    for start in range(0, hi, BN):
        rn = start + tl.arange(0, BN)
        kv_mask = (rn[:, None] < S) & (rd[None, :] < D)
        k = tl.load(k_ptr + kv_base + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_base + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = rn[None, :] < S
        if CAUSAL:
            keep = keep & (rn[None, :] <= rm[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + rm[:, None] * D + rd[None, :], out,
             mask=(rm[:, None] < S) & (rd[None, :] < D))


def kernel_fn(Q, K, V, causal=True, scale=None):
    B, Hq, S, D = Q.shape
    O = torch.empty_like(Q)
    grid = (triton.cdiv(S, BLOCK), B * Hq)
    _attention[grid](Q, K, V, O, Hq, K.shape[1], S, D,
                     1.0 / math.sqrt(D) if scale is None else scale, CAUSAL=bool(causal),
                     BM=BLOCK, BN=BLOCK, BD=max(16, triton.next_power_of_2(D)))
    return O
