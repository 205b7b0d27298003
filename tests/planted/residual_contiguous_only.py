"""Planted: a matmul that takes `residual` but reads it as if its rows were N elements apart,
ignoring its row stride. Right for a contiguous residual, wrong for the gate's (a view of a wider
buffer, rows N + 8 apart). Expected reason: wrong values, at a residual variant."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "matmul"
BLOCK = 32


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr, M, N, K, sam, sak, sbk, sbn,
            HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * sam + (k + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION == "gelu_tanh":
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc - acc / (tl.exp(2.0 * u) + 1.0)
    elif ACTIVATION == "gelu":
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_RESIDUAL:  # bug: rows taken as N apart, whatever residual.stride(0) is
        acc += tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=inside, other=0.0)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=inside)


def kernel_fn(A, B, bias=None, activation=None, residual=None):
    M, K = A.shape
    N = B.shape[1]
    C = torch.empty((M, N), device=A.device, dtype=A.dtype)
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))
    _matmul[grid](A, B, C, C if bias is None else bias, C if residual is None else residual, M, N,
                  K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), HAS_BIAS=bias is not None,
                  ACTIVATION=activation, HAS_RESIDUAL=residual is not None, BM=BLOCK, BN=BLOCK,
                  BK=BLOCK)
    return C
