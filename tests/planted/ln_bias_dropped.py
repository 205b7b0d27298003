"""Planted: a matmul that takes the LayerNorm arguments but drops ln_bias (normalizes and
scales the rows, never shifts them): right whenever the norm has no bias, wrong for the gate's
norm variants, whose ln_bias is never zero. Expected reason: wrong values, at a norm variant."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "matmul"
BLOCK = 32


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr, M, N, K, sam, sak, sbk, sbn, srm, srn,
            HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
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
    if HAS_RESIDUAL:
        acc += tl.load(r_ptr + rm[:, None] * srm + rn[None, :] * srn, mask=inside, other=0.0)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=inside)


@triton.jit
def _layernorm(x_ptr, w_ptr, b_ptr, y_ptr, K, sxm, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
               BK: tl.constexpr):  # HAS_B: never read
    row = tl.program_id(0)
    cols = tl.arange(0, BK)
    x = tl.load(x_ptr + row * sxm + cols, mask=cols < K, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / K
    d = tl.where(cols < K, x - mean, 0.0)
    y = d * tl.rsqrt(tl.sum(d * d, axis=0) / K + eps)
    if HAS_W:
        y *= tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * K + cols, y, mask=cols < K)


def kernel_fn(A, B, bias=None, activation=None, residual=None, ln_weight=None, ln_bias=None,
              ln_eps=None):
    if ln_eps is not None:  # the rows normalized first, into a copy
        normed = torch.empty(A.shape, device=A.device, dtype=A.dtype)
        _layernorm[(A.shape[0],)](A, A if ln_weight is None else ln_weight,
                                  A if ln_bias is None else ln_bias, normed, A.shape[1],
                                  A.stride(0), ln_eps, HAS_W=ln_weight is not None,
                                  HAS_B=ln_bias is not None, BK=triton.next_power_of_2(A.shape[1]))
        A = normed
    M, K = A.shape
    N = B.shape[1]
    C = torch.empty((M, N), device=A.device, dtype=A.dtype)
    R = C if residual is None else residual
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))
    _matmul[grid](A, B, C, C if bias is None else bias, R, M, N, K, A.stride(0), A.stride(1),
                  B.stride(0), B.stride(1), R.stride(0), R.stride(1), HAS_BIAS=bias is not None,
                  ACTIVATION=activation, HAS_RESIDUAL=residual is not None, BM=BLOCK, BN=BLOCK,
                  BK=BLOCK)
    return C
