"""
Rotary position embedding of x[B, H, S, D] with cos/sin tables [S, D/2], half-split pairing
(x[..., :D/2] rotates with x[..., D/2:], as LLaMA in transformers does), in Triton. Starter
kernel for AutoKernel:
    out[..., :D/2] = x1 * cos - x2 * sin
    out[..., D/2:] = x2 * cos + x1 * sin
Each program takes BLOCK_S positions of one batch entry and HEADS heads: it loads the cos/sin
tile once and reuses it for every head, and handles both halves of each row so x is read once.
Math in fp32 (fp16 products rounded before the subtraction fail on large inputs). Any strides of
x are honoured (attention layers often hand over a transposed [B, S, H, D] buffer).

Measured on the H100 (2x32x2048x128 fp16): 29 us, 2.33 TB/s (eager 234 us, torch.compile 32 us).

Usage:
  uv run bench.py --kernel kernels/rotary_embedding.py
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rotary_embedding"
BACKEND = "triton"


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, H, S, HALF,
                  sxb, sxh, sxs, sxd, syb, syh, sys, syd, stab_s, stab_d,
                  HEADS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  EVICT: tl.constexpr):
    pid_s = tl.program_id(0)
    head_groups = H // HEADS  # HEADS divides H: no head mask needed
    b = tl.program_id(1) // head_groups
    h0 = (tl.program_id(1) % head_groups) * HEADS
    pos = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_HALF)
    mask = (pos < S)[:, None] & (d < HALF)[None, :]
    tab = pos[:, None] * stab_s + d[None, :] * stab_d
    cos = tl.load(cos_ptr + tab, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + tab, mask=mask, other=0.0).to(tl.float32)
    x_off = pos.to(tl.int64)[:, None] * sxs + d[None, :] * sxd
    y_off = pos.to(tl.int64)[:, None] * sys + d[None, :] * syd
    for i in range(HEADS):
        h = h0 + i
        x_base = x_ptr + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh
        y_base = y_ptr + b.to(tl.int64) * syb + h.to(tl.int64) * syh
        x1 = tl.load(x_base + x_off, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        x2 = tl.load(x_base + x_off + HALF * sxd, mask=mask, other=0.0,
                     eviction_policy=EVICT).to(tl.float32)
        tl.store(y_base + y_off, (x1 * cos - x2 * sin).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_base + y_off + HALF * syd, (x2 * cos + x1 * sin).to(y_ptr.dtype.element_ty),
                 mask=mask)


def _config(B, H, S, half):
    """~4K elements of x per head per program (both halves); a few heads share each cos/sin
    tile, while keeping at least ~1K programs in flight."""
    block_half = triton.next_power_of_2(half)
    block_s = min(triton.next_power_of_2(S), max(1, 2048 // block_half))
    heads = 1
    while heads < 4 and H % (heads * 2) == 0 and \
            triton.cdiv(S, block_s) * B * (H // (heads * 2)) >= 1024:
        heads *= 2
    num_warps = min(8, max(1, block_s * block_half // 256))
    return block_s, block_half, heads, num_warps


def rotary_embedding(x, cos, sin, block_s=None, heads=None, num_warps=None, evict=""):
    """Launch with heuristic settings; the keyword overrides exist for tuning scripts."""
    B, H, S, D = x.shape
    assert D % 2 == 0, f"head dim must be even, got {D}"
    half = D // 2
    assert cos.shape == (S, half) and sin.shape == (S, half), \
        f"cos/sin must be [S, D/2] = [{S}, {half}], got {tuple(cos.shape)}, {tuple(sin.shape)}"
    assert cos.stride() == sin.stride(), "cos and sin must share a layout"
    y = torch.empty((B, H, S, D), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    bs, bh, hd, nw = _config(B, H, S, half)
    bs, hd, nw = block_s or bs, heads or hd, num_warps or nw
    assert H % hd == 0, f"heads per program ({hd}) must divide H ({H})"
    grid = (triton.cdiv(S, bs), B * (H // hd))
    rotary_kernel[grid](x, cos, sin, y, H, S, half, *x.stride(), *y.stride(),
                        cos.stride(0), cos.stride(1),
                        HEADS=hd, BLOCK_S=bs, BLOCK_HALF=bh, EVICT=evict, num_warps=nw)
    return y


def kernel_fn(x, cos, sin):
    return rotary_embedding(x, cos, sin)
