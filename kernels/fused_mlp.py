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
Like kernels/matmul.py: grouped (L2-friendly) tile order; on Hopper, when the operands are
row-major with 16-byte aligned rows, TMA loads, and for a half-precision down projection of 2^30
or more multiply-adds a persistent kernel (one program per SM looping over tiles in one flattened
pipeline, descriptors built on the device, the tile stored in two column halves), so a tile's
epilogue overlaps the next tile's loads; a pointer path honouring any strides otherwise, and
tf32x3 dots for fp32 inputs (~1e-6 error against the 1e-4 tolerance).
Things to try: tile sizes per GEMM, num_stages, warp specialisation, fusing the down projection.
"""
import functools

import torch
import triton
import triton.language as tl
from triton.runtime import _allocation

KERNEL_TYPE = "fused_mlp"
BACKEND = "triton"


@triton.jit
def _tile_of(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile index -> (pid_m, pid_n) in groups of GROUP_M tile rows (neighbours share L2 data)."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % group_rows
    pid_n = (tile % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _tile_coords(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (pid_m, pid_n) for the one-tile-per-program kernels."""
    return _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)


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


@triton.jit
def mlp_gemm_persistent_kernel(a_desc, w_desc, c_desc, M, N, K, a_rs, w_rs, c_rs,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                               OUT_DTYPE: tl.constexpr, EPI_SPLIT: tl.constexpr,
                               NUM_PROGRAMS: tl.constexpr, DEVICE_DESC: tl.constexpr):
    """The down projection a @ w^T, persistent: one program per SM looping over tiles p,
    p + NUM_PROGRAMS, ... in one flattened software pipeline, so the next tile's loads are in
    flight while this one's epilogue (the cast, the store in EPI_SPLIT column slices) runs."""
    EPI_N: tl.constexpr = BLOCK_N // EPI_SPLIT
    if DEVICE_DESC:  # raw tensors came in: build the descriptors here (no host encoding)
        a_desc = tl.make_tensor_descriptor(a_desc, [M, K], [a_rs, 1], [BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_desc, [N, K], [w_rs, 1], [BLOCK_N, BLOCK_K])
        c_desc = tl.make_tensor_descriptor(c_desc, [M, N], [c_rs, 1], [BLOCK_M, EPI_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    # The epilogue recomputes its tile from a counter of its own: nothing from the prologue
    # stays live across the flattened K loop.
    epi_tile = tl.program_id(0) - NUM_PROGRAMS
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, k_steps):
            off_k = k * BLOCK_K
            acc = tl.dot(a_desc.load([off_m, off_k]), w_desc.load([off_n, off_k]).T, acc)
        epi_tile += NUM_PROGRAMS
        pid_m, pid_n = _tile_of(epi_tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if EPI_SPLIT == 2:
            left, right = acc.reshape(BLOCK_M, 2, EPI_N).permute(0, 2, 1).split()
            c_desc.store([off_m, off_n], left.to(OUT_DTYPE))
            c_desc.store([off_m, off_n + EPI_N], right.to(OUT_DTYPE))
        else:
            c_desc.store([off_m, off_n], acc.to(OUT_DTYPE))


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def pick_config(M, N, K, dtype, gated):
    """Tiles per GEMM (triton 3.6). The gated GEMM holds two accumulators: 128x64 tiles on 4
    warps, one tile per program, beat 128x128 on 8 (605 vs 684-748 us at 2048x4096x11008, H100)
    and beat a persistent grid by 1.1-2x (H200: its epilogue is short next to two K loops).
    3 stages at K = 768-2048 (272 vs 309 us at 16384x768x3072, 879 vs 1056 at 8192x2048x8192,
    H200), 4 at K = 4096 (4% faster, H100). The down projection runs persistent above
    PERSISTENT_MIN_MACS, 128x256 on 8 warps, 3 stages: 1.0x / 0.96x / 0.98x cuBLAS at
    16384x3072x768 / 8192x8192x2048 / 8192x4864x896, against 0.86-0.93x one tile a program."""
    if dtype == torch.float32:  # 4-byte operands, three products per tf32x3 dot
        return dict(BLOCK_M=128, BLOCK_N=64 if gated else 128, BLOCK_K=32, GROUP_M=8,
                    num_warps=8, num_stages=3)
    if M <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    if gated:
        return dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=16, num_warps=4,
                    num_stages=3 if K < 4096 else 4)
    if M * N * K >= PERSISTENT_MIN_MACS:
        return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3,
                    EPI_SPLIT=2, PERSISTENT=True)
    # The down projection (N = D, long K = F): 128x128 on 4 warps beat 128x256 on 8 there.
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)


# Half-precision down projections with at least this many multiply-adds run persistent on a GPU
# with TMA (device-built descriptors); below it the launch's host time bounds the call.
PERSISTENT_MIN_MACS = 2 ** 30
# fp32 takes the one-tile TMA kernel above this size: a launch with host tensor descriptors
# took ~50 us of host time on an H100 (triton 3.6), more than it saves below.
TMA_MIN_MACS = 2 ** 35


def _row_major_ok(t):
    """TMA needs a unit last stride, 16-byte aligned rows and base."""
    es = t.element_size()
    return (t.stride(1) == 1 and (t.stride(0) * es) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.shape[1] * es >= 16)


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


@functools.lru_cache(maxsize=None)
def _num_sms(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def _scratch(size, alignment, stream):
    """Global scratch for the device-built descriptors (128 bytes per descriptor and program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator():
    """Device-built descriptors need triton's allocator; install ours only where none is set
    (it is per thread: a context variable)."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _persistent(a, w, c, cfg):
    """Launch the persistent kernel: one program per SM (4 in the interpreter, which takes
    host-made descriptors)."""
    M, K = a.shape
    N = w.shape[0]
    BM, BN, BK, epi = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["EPI_SPLIT"]
    tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
    n_sm = _num_sms(a.device.index) if a.is_cuda else 4
    if a.is_cuda:
        _ensure_allocator()
        args = (a, w, c)
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor
        args = (TensorDescriptor.from_tensor(a, [BM, BK]),
                TensorDescriptor.from_tensor(w, [BN, BK]),
                TensorDescriptor.from_tensor(c, [BM, BN // epi]))
    mlp_gemm_persistent_kernel[(min(tiles, n_sm),)](
        *args, M, N, K, a.stride(0), w.stride(0), c.stride(0), BM, BN, BK, cfg["GROUP_M"],
        OUT_DTYPE=_TL_DTYPES[a.dtype], EPI_SPLIT=epi, NUM_PROGRAMS=n_sm,
        DEVICE_DESC=a.is_cuda, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def mlp_gemm(a, w1, w2=None, config=None, tma=None):
    """a[M,K] @ w1[N,K]^T -> [M,N]; with w2: silu(a @ w1^T) * (a @ w2^T). New tensor, a's dtype."""
    M, K = a.shape
    N = w1.shape[0]
    gated = w2 is not None
    w2 = w1 if w2 is None else w2  # an unused placeholder when not gated
    assert w1.shape == (N, K) and w2.shape == (N, K), "weights must be [N, K]"
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    cfg = dict(config or pick_config(M, N, K, a.dtype, gated))
    if not config and torch.version.hip is not None:
        # AMD GPUs have 64 KiB of LDS (MI300X; 160 on MI350X), not the 228 KiB these H100
        # configs fill: two stages keep every tile within it
        cfg["num_stages"] = min(cfg["num_stages"], 2)
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    precision = _dot_precision(a.dtype)
    grid = ((M + BM - 1) // BM * ((N + BN - 1) // BN),)
    use_tma = tma if tma is not None else \
        (cfg.get("PERSISTENT") or M * N * K >= TMA_MIN_MACS) and _gpu_has_tma(a)
    row_major = use_tma and all(_row_major_ok(t) for t in (a, w1, w2, c))
    if row_major and cfg.get("PERSISTENT") and not gated:
        _persistent(a, w1, c, cfg)
    elif row_major:
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
