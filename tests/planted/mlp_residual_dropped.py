"""Planted: a fused_mlp that takes `residual` and never adds it (a kernel file that only grew
the argument to fit the signature). Right without a residual, wrong with one. Expected reason:
wrong values, at the residual variant."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "fused_mlp"
BLOCK = 32


@triton.jit
def _gate_up(x_ptr, g_ptr, u_ptr, h_ptr, M, F, D, BM: tl.constexpr, BF: tl.constexpr,
             BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rf = tl.program_id(1) * BF + tl.arange(0, BF)
    rk = tl.arange(0, BK)
    acc_g = tl.zeros((BM, BF), dtype=tl.float32)
    acc_u = tl.zeros((BM, BF), dtype=tl.float32)
    for k in range(0, D, BK):
        x = tl.load(x_ptr + rm[:, None] * D + (k + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < D), other=0.0)
        wmask = ((k + rk)[:, None] < D) & (rf[None, :] < F)
        g = tl.load(g_ptr + rf[None, :] * D + (k + rk)[:, None], mask=wmask, other=0.0)
        u = tl.load(u_ptr + rf[None, :] * D + (k + rk)[:, None], mask=wmask, other=0.0)
        acc_g = tl.dot(x, g, acc_g)
        acc_u = tl.dot(x, u, acc_u)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + rm[:, None] * F + rf[None, :], h, mask=(rm[:, None] < M) & (rf[None, :] < F))


@triton.jit
def _down(h_ptr, w_ptr, y_ptr, M, D, F, BM: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.program_id(1) * BD + tl.arange(0, BD)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    for k in range(0, F, BK):
        h = tl.load(h_ptr + rm[:, None] * F + (k + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < F), other=0.0)
        w = tl.load(w_ptr + rd[None, :] * F + (k + rk)[:, None],
                    mask=((k + rk)[:, None] < F) & (rd[None, :] < D), other=0.0)
        acc = tl.dot(h, w.to(tl.float32), acc)
    mask = (rm[:, None] < M) & (rd[None, :] < D)
    tl.store(y_ptr + rm[:, None] * D + rd[None, :], acc, mask=mask)


def kernel_fn(x, w_gate, w_up, w_down, residual=None):
    M, D = x.shape
    F = w_gate.shape[0]
    h = torch.empty((M, F), device=x.device, dtype=torch.float32)
    _gate_up[(triton.cdiv(M, BLOCK), triton.cdiv(F, BLOCK))](x, w_gate, w_up, h, M, F, D,
                                                            BM=BLOCK, BF=BLOCK, BK=BLOCK)
    y = torch.empty((M, D), device=x.device, dtype=x.dtype)
    _down[(triton.cdiv(M, BLOCK), triton.cdiv(D, BLOCK))](h, w_down, y, M, D, F,
                                                         BM=BLOCK, BD=BLOCK, BK=BLOCK)
    return y
