"""Planted: decode attention that puts every query at the sequence's last position (the
causal offset between a step's Sq queries ignored): right for Sq = 1, wrong for Sq > 1.
Expected reason: wrong values at the first shape with Sq > 1."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "decode_attention"


@triton.jit
def _decode(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, scale, H, HKV, SQ, L, D,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)  # (b, h, i) of a contiguous [B, H, Sq, D]
    i, h, b = row % SQ, (row // SQ) % H, row // (SQ * H)
    kv = (b * HKV + h // (H // HKV)) * L * D
    last = tl.load(len_ptr + b) - 1  # every query at the last position
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + row * D + dims, mask=dims < D, other=0.0).to(tl.float32)
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for n0 in range(0, last + 1, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        ok = (cols[:, None] <= last) & (dims[None, :] < D)
        k = tl.load(k_ptr + kv + cols[:, None] * D + dims[None, :], mask=ok, other=0.0)
        s = tl.where(cols <= last, tl.sum(k.to(tl.float32) * q[None, :], 1) * scale,
                     float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + kv + cols[:, None] * D + dims[None, :], mask=ok, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l = l * alpha + tl.sum(p, 0)
        m = m_new
    tl.store(o_ptr + row * D + dims, acc / l, mask=dims < D)


def kernel_fn(Q, K, V, lengths, scale=None):
    B, H, Sq, D = Q.shape
    Q, K, V = Q.contiguous(), K.contiguous(), V.contiguous()
    out = torch.empty_like(Q)
    _decode[(B * H * Sq,)](Q, K, V, lengths, out, D ** -0.5 if scale is None else scale, H,
                           K.shape[1], Sq, K.shape[2], D, BLOCK_N=32,
                           BLOCK_D=triton.next_power_of_2(D))
    return out
