"""
PyTorch references for the kernel types, in two flavours:

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


def _opt_up(t):
    return None if t is None else t.to(ORACLE)


# ---- matmul: activation(A[M,K] @ B[K,N] (+ bias[N])) (+ residual[M,N]) ----------------------
# activation None or one of ACTIVATIONS: what an MLP's first projection is followed by in real
# models, applied in the GEMM's epilogue (GPT-2's gelu_new is gelu_tanh, BERT's gelu the
# erf-based one). residual: the stream a block's output projection is added to (x + proj(h)),
# added last, so the projection's output never makes a separate trip through memory.
ACTIVATIONS = {"gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}


def _activate(x, activation):
    return x if activation is None else ACTIVATIONS[activation](x)


# ln_eps given: A's rows go through a LayerNorm (ln_weight, ln_bias, each may be None) first, as
# a pre-norm block's norm before its projection.
def matmul(A, B, bias=None, activation=None, residual=None, ln_weight=None, ln_bias=None,
           ln_eps=None):
    A64 = A.to(ORACLE)
    if ln_eps is not None:
        A64 = F.layer_norm(A64, (A.shape[-1],), _opt_up(ln_weight), _opt_up(ln_bias), ln_eps)
    out = A64 @ B.to(ORACLE)
    out = out if bias is None else out + bias.to(ORACLE)
    out = _activate(out, activation)
    return (out if residual is None else out + residual.to(ORACLE)).to(A.dtype)


def matmul_eager(A, B, bias=None, activation=None, residual=None, ln_weight=None, ln_bias=None,
                 ln_eps=None):
    if ln_eps is not None:
        A = F.layer_norm(A, (A.shape[-1],), ln_weight, ln_bias, ln_eps)
    out = _activate(A @ B if bias is None else torch.addmm(bias, A, B), activation)
    return out if residual is None else out + residual


# ---- softmax over the last dim --------------------------------------------------------------
def softmax(x):
    return torch.softmax(x.to(ORACLE), dim=-1).to(x.dtype)


def softmax_eager(x):
    return torch.softmax(x, dim=-1)


# ---- layernorm over the last dim; weight and bias may each be None (no affine) --------------
def layernorm(x, weight, bias, eps=LAYERNORM_EPS):
    return F.layer_norm(x.to(ORACLE), (x.shape[-1],), _opt_up(weight), _opt_up(bias),
                        eps).to(x.dtype)


def layernorm_eager(x, weight, bias, eps=LAYERNORM_EPS):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


# ---- rmsnorm over the last dim; weight may be None ------------------------------------------
def rmsnorm(x, weight, eps=RMSNORM_EPS):
    xd = x.to(ORACLE)
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    return (y if weight is None else y * weight.to(ORACLE)).to(x.dtype)


def rmsnorm_eager(x, weight, eps=RMSNORM_EPS):
    # As LLaMA in transformers writes it: statistics in fp32, the weight applied in the input dtype.
    h = x.float()
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return h if weight is None else weight * h


def rmsnorm_library(x, weight, eps=RMSNORM_EPS):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


# ---- attention: Q[B,Hq,S,D], K/V[B,Hkv,S,D] (query head h reads key/value head h // (Hq/Hkv)),
# causal or not, scale 1/sqrt(D) unless given ------------------------------------------------
def _attention(q, k, v, causal, scale):
    S, D = q.shape[-2], q.shape[-1]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(D) if scale is None else scale)
    if causal:
        mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def flash_attention(Q, K, V, causal=True, scale=None):
    return _attention(*_up(Q, K, V), causal, scale).to(Q.dtype)


def flash_attention_eager(Q, K, V, causal=True, scale=None):
    return _attention(Q, K, V, causal, scale)


def flash_attention_library(Q, K, V, causal=True, scale=None):
    return F.scaled_dot_product_attention(Q, K, V, is_causal=causal, scale=scale,
                                          enable_gqa=K.shape[1] != Q.shape[1])


# ---- decode attention: Q[B,Hq,Sq,D] (the newest Sq positions of each sequence) over a static
# KV cache K/V[B,Hkv,L,D] whose first lengths[b] positions are live (the rest is stale memory a
# kernel must not read); query i of sequence b sits at position lengths[b] - Sq + i and sees the
# keys up to it. Query head h reads key/value head h // (Hq/Hkv). ------------------------------
def _visible(lengths, Sq, L, device):
    """[B, 1, Sq, L] bool: which cache positions each query sees."""
    query_pos = lengths.long()[:, None] - Sq + torch.arange(Sq, device=device)  # [B, Sq]
    return (torch.arange(L, device=device) <= query_pos[..., None])[:, None]


def decode_attention(Q, K, V, lengths, scale=None):
    q, k, v = _up(Q, K, V)
    L = K.shape[2]
    live = (torch.arange(L, device=K.device) < lengths.long()[:, None])[:, None, :, None]
    k, v = k.where(live, 0.0), v.where(live, 0.0)  # stale values (even NaN) weigh nothing
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-2, -1)) * (Q.shape[-1] ** -0.5 if scale is None else scale)
    scores = scores.masked_fill(~_visible(lengths, Q.shape[2], L, Q.device), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).to(Q.dtype)


def decode_attention_eager(Q, K, V, lengths, scale=None):
    """What a model with a static cache runs: SDPA over the whole cache under a mask."""
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=_visible(lengths, Q.shape[2],
                                                                      K.shape[2], Q.device),
                                          scale=scale, enable_gqa=K.shape[1] != Q.shape[1])


# ---- fused SwiGLU MLP: (silu(x w_gate^T) * (x w_up^T)) w_down^T (+ residual[M,D]) -----------
# residual: the stream the block's MLP output is added to, added last, as matmul's.
def fused_mlp(x, w_gate, w_up, w_down, residual=None):
    xd, g, u, d = _up(x, w_gate, w_up, w_down)
    out = (F.silu(xd @ g.T) * (xd @ u.T)) @ d.T
    return (out if residual is None else out + residual.to(ORACLE)).to(x.dtype)


def fused_mlp_eager(x, w_gate, w_up, w_down, residual=None):
    out = F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)
    return out if residual is None else out + residual


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


# ---- reduce: sum over one dim of x (any rank; the last dim is the common case) --------------
def reduce(x, dim=-1):
    return x.to(ORACLE).sum(dim=dim).to(x.dtype)


def reduce_eager(x, dim=-1):
    return x.sum(dim=dim)


# ---- qkv_rotary: an attention layer's q/k/v projections as one GEMM, rotary on q and k -------
# x[B,S,K] @ w_qkv[(Hq+2Hkv)*D, K]^T (+ bias), seen as [B, S, Hq+2Hkv, D]: heads 0..Hq-1 are q,
# the next kv_heads k, the last kv_heads v; q and k rotated (half-split) by cos/sin[S, D/2].
def _qkv_heads(y, cos, kv_heads):
    B, S, _ = y.shape
    y = y.view(B, S, -1, 2 * cos.shape[-1])
    return y, y.shape[2] - kv_heads  # the heads rotated: q and k


def qkv_rotary(x, w_qkv, cos, sin, kv_heads, bias=None):
    y = x.to(ORACLE) @ w_qkv.to(ORACLE).T
    y, rot = _qkv_heads(y if bias is None else y + bias.to(ORACLE), cos, kv_heads)
    c, s = (t.to(ORACLE)[:, None, :] for t in (cos, sin))  # [S, 1, D/2]: one row per position
    return torch.cat([_rotate(y[:, :, :rot], c, s), y[:, :, rot:]], dim=2).to(x.dtype)


def qkv_rotary_eager(x, w_qkv, cos, sin, kv_heads, bias=None):
    y, rot = _qkv_heads(F.linear(x, w_qkv, bias), cos, kv_heads)
    qk = rotary_embedding_eager(y[:, :, :rot].transpose(1, 2), cos, sin).transpose(1, 2)
    return torch.cat([qk, y[:, :, rot:]], dim=2)


def _blas():
    """Who runs torch.matmul here: the matmul baseline's name in reports."""
    if not torch.cuda.is_available():
        return "CPU BLAS"
    return "hipBLAS" if torch.version.hip else "cuBLAS"


# Library baselines shown beside eager and torch.compile where one exists.
LIBRARY = {
    "matmul": (_blas(), matmul_eager),
    "rmsnorm": ("F.rms_norm", rmsnorm_library),
    "flash_attention": ("SDPA", flash_attention_library),
}
