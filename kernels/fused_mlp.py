"""
Starter kernel: fused SwiGLU MLP, out = (silu(x w_gate^T) * (x w_up^T)) w_down^T, in Triton.

    from kernels.fused_mlp import kernel_fn; out = kernel_fn(x=x, w_gate=wg, w_up=wu, w_down=wd)
    uv run bench.py            # after extract.py (or you) copied this file to kernel.py

Shapes: x[M,D], w_gate/w_up[F,D], w_down[D,F] (nn.Linear weights) -> out[M,D].
Two launches of one GEMM kernel (this file is standalone on purpose: extract.py copies it alone):
  1. GATED: each program computes the same [BLOCK_M, BLOCK_N] tile of x w_gate^T and x w_up^T
     from one x tile (two fp32 accumulators, x read once for both), then applies silu(g) * u in
     registers and writes h[M,F] once. Eager writes gate and up, reads them back for silu and
     the product: ~5 extra passes over an [M,F] tensor that never happen here.
  2. h @ w_down^T, a plain GEMM.
h is kept in the input dtype (as eager keeps it); the gate math runs in fp32 before that rounding.
Like kernels/matmul.py: grouped (L2-friendly) tile order, TMA descriptors on Hopper when the
operands are row-major with 16-byte aligned rows, a pointer path honouring any strides otherwise,
and tf32x3 dots for fp32 inputs (~1e-6 error against the 1e-4 tolerance).
Things to try: tile sizes per GEMM, num_stages, a persistent grid, fusing the down projection.
"""
import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "fused_mlp"
BACKEND = "triton"


@triton.jit
def _tile_coords(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (pid_m, pid_n) in groups of GROUP_M tile rows (neighbours share L2 data)."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _silu_times(gate, up):
    # silu(g) = g * sigmoid(g) = g / (1 + exp(-g)); exp(-g) = inf for g << 0 gives -0, not NaN.
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def mlp_gemm_ptr_kernel(a_ptr, w1_ptr, w2_ptr, c_ptr, M, N, K,
                        stride_am, stride_ak, stride_w1n, stride_w1k, stride_w2n, stride_w2k,
                        stride_cm, stride_cn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr,
                        PRECISION: tl.constexpr):
    """C = a @ w1^T, or silu(a @ w1^T) * (a @ w2^T) when GATED."""
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
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc1.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def mlp_gemm_tma_kernel(a_desc, w1_desc, w2_desc, c_desc, M, N, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, GATED: tl.constexpr, OUT_DTYPE: tl.constexpr,
                        PRECISION: tl.constexpr):
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
    c_desc.store([off_m, off_n], acc1.to(OUT_DTYPE))


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def pick_config(M, N, K, dtype, gated):
    """Tiles per GEMM (measured on an H100, triton 3.6 at 2048x4096x11008). The gated GEMM holds
    two accumulators: 128x64 tiles on 4 warps beat 128x128 on 8 there (605 vs 684-748 us). With
    a short K (LLaMA-small's D=768: 12 steps of 64) a 3-deep pipeline beat 4 by 8-12% at
    16384x768x3072 and 8192x768x3072, while K=4096 ran 4% faster with 4."""
    if dtype == torch.float32:  # 4-byte operands, three products per tf32x3 dot
        return dict(BLOCK_M=128, BLOCK_N=64 if gated else 128, BLOCK_K=32, GROUP_M=8,
                    num_warps=8, num_stages=3)
    if M <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    if gated:
        return dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=16, num_warps=4,
                    num_stages=3 if K <= 1024 else 4)
    # The down projection (N = D, long K = F): 128x128 on 4 warps beat 128x256 on 8 there.
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)


# Below this many multiply-adds the TMA path's per-launch host work costs more than it saves
# (on triton 3.6 a launch with host tensor descriptors took ~50 us of host time on an H100).
TMA_MIN_MACS = 2 ** 35


def _row_major_ok(t):
    """TMA needs a unit last stride, 16-byte aligned rows and base."""
    es = t.element_size()
    return (t.stride(1) == 1 and (t.stride(0) * es) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.shape[1] * es >= 16)


@functools.lru_cache(maxsize=None)
def _device_has_tma(index):
    return torch.cuda.get_device_capability(index)[0] >= 9


def _gpu_has_tma(t):
    # Cached: asking torch for the capability on every launch cost tens of us of host time.
    return t.is_cuda and _device_has_tma(t.device.index)


def mlp_gemm(a, w1, w2=None, config=None, tma=None):
    """a[M,K] @ w1[N,K]^T -> [M,N]; with w2: silu(a @ w1^T) * (a @ w2^T). New tensor, a's dtype."""
    M, K = a.shape
    N = w1.shape[0]
    gated = w2 is not None
    w2 = w1 if w2 is None else w2  # an unused placeholder when not gated
    assert w1.shape == (N, K) and w2.shape == (N, K), "weights must be [N, K]"
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    cfg = dict(config or pick_config(M, N, K, a.dtype, gated))
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    precision = "tf32x3" if a.dtype == torch.float32 else "tf32"
    grid = ((M + BM - 1) // BM * ((N + BN - 1) // BN),)
    use_tma = tma if tma is not None else M * N * K >= TMA_MIN_MACS and _gpu_has_tma(a)
    if use_tma and all(_row_major_ok(t) for t in (a, w1, w2, c)):
        from triton.tools.tensor_descriptor import TensorDescriptor
        mlp_gemm_tma_kernel[grid](
            TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(w1, [BN, BK]),
            TensorDescriptor.from_tensor(w2, [BN, BK]), TensorDescriptor.from_tensor(c, [BM, BN]),
            M, N, K, BM, BN, BK, cfg["GROUP_M"], GATED=gated, OUT_DTYPE=_TL_DTYPES[a.dtype],
            PRECISION=precision, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    else:
        mlp_gemm_ptr_kernel[grid](
            a, w1, w2, c, M, N, K, a.stride(0), a.stride(1), *w1.stride(), *w2.stride(),
            c.stride(0), c.stride(1), BM, BN, BK, cfg["GROUP_M"], GATED=gated,
            EVEN_K=K % BK == 0, PRECISION=precision, num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"])
    return c


def fused_mlp(x, w_gate, w_up, w_down, gate_config=None, down_config=None, tma=None):
    h = mlp_gemm(x, w_gate, w_up, config=gate_config, tma=tma)  # [M,F] = silu(gate) * up
    return mlp_gemm(h, w_down, config=down_config, tma=tma)    # [M,D]


def kernel_fn(x, w_gate, w_up, w_down):
    return fused_mlp(x, w_gate, w_up, w_down)
