"""Test kernel (verify.py's tests): attention with an online softmax, one program per
(batch*query head, query block); causal or not, any scale, grouped-query heads (query head h
reads key/value head h // (Hq / Hkv)); any strides of B, H and S."""
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "flash_attention"
BLOCK = 16


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, Hq, Hkv, S, D, scale, sqb, sqh, sqs, skb, skh, sks,
               svb, svh, svs, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BD: tl.constexpr):
    bh = tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    kv_h = h // (Hq // Hkv)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    q = tl.load(q_ptr + b * sqb + h * sqh + rm[:, None] * sqs + rd[None, :],
                mask=(rm[:, None] < S) & (rd[None, :] < D), other=0.0)
    m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    hi = tl.minimum((tl.program_id(0) + 1) * BM, S) if CAUSAL else S
    for start in range(0, hi, BN):
        rn = start + tl.arange(0, BN)
        kv_mask = (rn[:, None] < S) & (rd[None, :] < D)
        k = tl.load(k_ptr + b * skb + kv_h * skh + rn[:, None] * sks + rd[None, :], mask=kv_mask,
                    other=0.0)
        v = tl.load(v_ptr + b * svb + kv_h * svh + rn[:, None] * svs + rd[None, :], mask=kv_mask,
                    other=0.0)
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
    tl.store(o_ptr + bh * S * D + rm[:, None] * D + rd[None, :], out,
             mask=(rm[:, None] < S) & (rd[None, :] < D))


def kernel_fn(Q, K, V, causal=True, scale=None):
    B, Hq, S, D = Q.shape
    Q, K, V = (t if t.stride(-1) == 1 else t.contiguous() for t in (Q, K, V))
    O = torch.empty((B, Hq, S, D), device=Q.device, dtype=Q.dtype)
    grid = (triton.cdiv(S, BLOCK), B * Hq)
    _attention[grid](Q, K, V, O, Hq, K.shape[1], S, D,
                     1.0 / math.sqrt(D) if scale is None else scale, *Q.stride()[:3],
                     *K.stride()[:3], *V.stride()[:3], CAUSAL=bool(causal),
                     BM=BLOCK, BN=BLOCK, BD=max(16, triton.next_power_of_2(D)))
    return O
