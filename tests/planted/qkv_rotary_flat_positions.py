"""Planted: q/k/v + rotary that takes a row's position from its flat index (clamped to the
table) instead of index % S: right when B == 1, wrong for every later batch entry.
Expected reason: wrong values at the first shape with B > 1."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "qkv_rotary"
BENCH_SHAPES = [(1, 16, 32, 2, 1, 16)]
ROWS = 16


@triton.jit
def _qkv_rotary(x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, y_ptr, M, S, K, HALF, HEADS, ROT,
                HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    head = tl.program_id(1)
    j = tl.arange(0, BLOCK)
    ks = tl.arange(0, BLOCK_K)
    w1 = (head * 2 * HALF + j) * K
    acc1 = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    acc2 = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xm = (rows[:, None] < M) & (k0 + ks[None, :] < K)
        a = tl.load(x_ptr + rows[:, None] * K + k0 + ks[None, :], mask=xm, other=0.0)
        wm = (j[:, None] < HALF) & (k0 + ks[None, :] < K)
        b1 = tl.load(w_ptr + w1[:, None] + k0 + ks[None, :], mask=wm, other=0.0)
        b2 = tl.load(w_ptr + w1[:, None] + HALF * K + k0 + ks[None, :], mask=wm, other=0.0)
        acc1 = tl.dot(a, b1.T, acc1, input_precision="ieee")
        acc2 = tl.dot(a, b2.T, acc2, input_precision="ieee")
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + head * 2 * HALF + j, mask=j < HALF, other=0.0)[None, :]
        acc2 += tl.load(b_ptr + head * 2 * HALF + HALF + j, mask=j < HALF, other=0.0)[None, :]
    mask = (rows[:, None] < M) & (j[None, :] < HALF)
    pos = tl.minimum(rows, S - 1)[:, None] * HALF + j[None, :]
    c = tl.load(cos_ptr + pos, mask=mask, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + pos, mask=mask, other=0.0).to(tl.float32)
    if head < ROT:
        acc1, acc2 = acc1 * c - acc2 * s, acc2 * c + acc1 * s
    out = y_ptr + (rows[:, None] * HEADS + head) * 2 * HALF + j[None, :]
    tl.store(out, acc1, mask=mask)
    tl.store(out + HALF, acc2, mask=mask)


def kernel_fn(x, w_qkv, cos, sin, kv_heads, bias=None):
    B, S, K = x.shape
    D = 2 * cos.shape[-1]
    heads = w_qkv.shape[0] // D
    x, w_qkv, cos, sin = (t.contiguous() for t in (x, w_qkv, cos, sin))
    y = torch.empty((B, S, heads, D), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(B * S, ROWS), heads)
    _qkv_rotary[grid](x, w_qkv, bias, cos, sin, y, B * S, S, K, D // 2, heads, heads - kv_heads,
                      HAS_BIAS=bias is not None, ROWS=ROWS,
                      BLOCK=max(16, triton.next_power_of_2(D // 2)), BLOCK_K=16)
    return y
