"""
PyTorch references for the nine kernel types, in two flavours:

  <type>(...)        the oracle bench.py judges against: computed in float64 whatever the input
                     dtype, cast to the output dtype only at the end. (An oracle that squares fp16
                     values in fp16 overflows and fails correct kernels.)
  <type>_eager(...)  what a PyTorch model runs today, in the input dtype: the eager baseline that
                     prepare.py times, and the function torch.compile is given.

Argument names are the kernel_fn contract (see autokernel.KERNEL_TYPES).
"""
import math

import torch
import torch.nn.functional as F

ORACLE = torch.float64
LAYERNORM_EPS = 1e-5
RMSNORM_EPS = 1e-6


def _up(*tensors):
    return [t.to(ORACLE) for t in tensors]


# ---- matmul: A[M,K] @ B[K,N] ----------------------------------------------------------------
def matmul(A, B):
    a, b = _up(A, B)
    return (a @ b).to(A.dtype)


def matmul_eager(A, B):
    return A @ B


# ---- softmax over the last dim --------------------------------------------------------------
def softmax(x):
    return torch.softmax(x.to(ORACLE), dim=-1).to(x.dtype)


def softmax_eager(x):
    return torch.softmax(x, dim=-1)


# ---- layernorm (eps 1e-5) -------------------------------------------------------------------
def layernorm(x, weight, bias):
    xd, w, b = _up(x, weight, bias)
    return F.layer_norm(xd, (x.shape[-1],), w, b, LAYERNORM_EPS).to(x.dtype)


def layernorm_eager(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, LAYERNORM_EPS)


# ---- rmsnorm (eps 1e-6) ---------------------------------------------------------------------
def rmsnorm(x, weight):
    xd, w = _up(x, weight)
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + RMSNORM_EPS) * w).to(x.dtype)


def rmsnorm_eager(x, weight):
    # As LLaMA in transformers writes it: statistics in fp32, the weight applied in the input dtype.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + RMSNORM_EPS)
    return weight * h.to(x.dtype)


def rmsnorm_library(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, RMSNORM_EPS)


# ---- causal attention, scale 1/sqrt(D) ------------------------------------------------------
def _causal_attention(q, k, v):
    S, D = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def flash_attention(Q, K, V):
    return _causal_attention(*_up(Q, K, V)).to(Q.dtype)


def flash_attention_eager(Q, K, V):
    return _causal_attention(Q, K, V)


def flash_attention_library(Q, K, V):
    return F.scaled_dot_product_attention(Q, K, V, is_causal=True)


# ---- fused SwiGLU MLP: (silu(x w_gate^T) * (x w_up^T)) w_down^T ------------------------------
def fused_mlp(x, w_gate, w_up, w_down):
    xd, g, u, d = _up(x, w_gate, w_up, w_down)
    return ((F.silu(xd @ g.T) * (xd @ u.T)) @ d.T).to(x.dtype)


def fused_mlp_eager(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


# ---- cross entropy: mean loss, fp32 scalar --------------------------------------------------
def cross_entropy(logits, targets):
    return F.cross_entropy(logits.to(ORACLE), targets).to(torch.float32)


def cross_entropy_eager(logits, targets):
    return F.cross_entropy(logits, targets).float()


# ---- rotary embedding, half-split pairing (x[..., :D/2] with x[..., D/2:]) -------------------
def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rotary_embedding(x, cos, sin):
    xd, c, s = _up(x, cos, sin)
    return _rotate(xd, c, s).to(x.dtype)


def rotary_embedding_eager(x, cos, sin):
    # As transformers' LLaMA does it: full-width cos/sin and rotate_half.
    cos2, sin2 = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos2 + rotated * sin2


# ---- reduce: sum over the last dim ----------------------------------------------------------
def reduce(x):
    return x.to(ORACLE).sum(dim=-1).to(x.dtype)


def reduce_eager(x):
    return x.sum(dim=-1)


# Library baselines shown beside eager and torch.compile where one exists.
LIBRARY = {
    "matmul": ("cuBLAS", matmul_eager),
    "rmsnorm": ("F.rms_norm", rmsnorm_library),
    "flash_attention": ("SDPA", flash_attention_library),
}
