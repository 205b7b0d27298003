"""
Starter kernel: an attention layer's q/k/v projections as ONE GEMM with rotary position
embedding applied to q and k in its epilogue, in Triton.

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

On the H100 at the compact LLaMA's shape (8x2048 tokens, 768 wide, 12 + 12 + 12 heads of 64):
the gate's clock 116 us in fp16 against torch.compile's 151 (cuBLAS GEMM, then inductor's rotary)
and eager's 620; bf16 GPU time 107 us against 130 for cuBLAS's fused q/k/v GEMM followed by
inductor's rotary (93 for the GEMM alone). BENCHMARKS.md sections 22 and 23.
Things to try: a Gluon (wgmma, warp-specialized, persistent) mainloop like the matmul starter's
Hopper kernel (the plain GEMM here runs ~15% behind cuBLAS), GROUP_M, a TMA store.
"""
import functools

import torch
import triton
import triton.language as tl

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


def qkv_rotary(x, w_qkv, cos, sin, kv_heads, bias=None, config=None):
    B, S, K = x.shape
    D = 2 * cos.shape[-1]
    heads_total = w_qkv.shape[0] // D
    out = torch.empty((B, S, heads_total, D), device=x.device, dtype=x.dtype)
    M = B * S
    if out.numel() == 0:
        return out
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
