"""
The swap rules' handlers of torch's own calls: F.linear, torch.addmm (transformers' Conv1D) and
x @ W with a 2-D W (matmul, the bias going into the kernel's epilogue),
F.scaled_dot_product_attention (flash_attention), F.layer_norm and F.rms_norm over one or several
trailing dims (layernorm, rmsnorm), F.softmax / torch.softmax / Tensor.softmax over the last dim
(softmax), F.cross_entropy (cross_entropy), torch.sum / Tensor.sum over any one dim (reduce); and
traced_through, the matmul rule's patch that lets Dynamo see the linears inside
F.multi_head_attention_forward.

A handler gets the intercepted call's arguments, bound to its own signature after `swap`
(autokernel/patching.py), and returns the result, or FALLBACK after swap.fallback(type, reason):
a call outside the kernel contract runs the original op. The glue around the kernel call
(contiguous copies, casts, views) is torch. swap.py's SWAP_RULES says which calls each kernel
type's handlers take.
"""
import math
import types

import torch
import torch.nn.functional as F

from autokernel.kernel_call import FLOAT_DTYPES
from autokernel.patching import FALLBACK, capturing
from autokernel.recognize import DECODE_MAX_QUERIES, is_last_dim, one_dim


def as_rows(x):
    """x [..., N] as the contract's contiguous [M, N]."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def linear(swap, input, weight, bias=None):
    return projected(swap, input, weight, bias)


def projected(swap, input, weight, bias=None, activation=None):
    """activation(F.linear(input, weight, bias)) on the matmul kernel, or FALLBACK."""
    if input.dtype not in FLOAT_DTYPES or weight.dtype != input.dtype or weight.dim() != 2 \
            or input.numel() == 0:
        return swap.fallback("matmul", "dtype or shape outside the contract")
    if bias is not None and (bias.dtype != input.dtype or bias.shape != weight.shape[:1]):
        return swap.fallback("matmul", "bias dtype or shape differs")
    A, N = as_rows(input), weight.shape[0]
    if swap.weight_layout == "view":
        out = swap.run("matmul", A=A, B=weight.t(), bias=bias, activation=activation)
    else:  # [K, N] padded to 128-byte rows: the kernel computes zero columns, the view drops them
        B = swap.weights.transposed(weight)
        out = swap.run("matmul", A=A, B=B, bias=swap.weights.padded_bias(bias, B.shape[1]),
                       activation=activation, model_shape=(A.shape[0], N, A.shape[1]))[:, :N]
    return out.view(*input.shape[:-1], N)


def addmm(swap, input, mat1, mat2, *, beta=1, alpha=1):
    """torch.addmm(bias, x, W): transformers' Conv1D (GPT-2) projections, W already [K, N]."""
    if beta != 1 or alpha != 1 or mat1.dim() != 2 or mat2.dim() != 2 \
            or mat1.dtype not in FLOAT_DTYPES or mat2.dtype != mat1.dtype \
            or input.dtype != mat1.dtype:
        return swap.fallback("matmul", "addmm outside the contract")
    if input.shape == mat2.shape[1:]:  # a bias row: the kernel adds it
        return swap.run("matmul", A=mat1.contiguous(), B=mat2.contiguous(),
                        bias=input.contiguous())
    swap.note("matmul", "addmm's [M, N] input added in torch after the kernel")
    return swap.run("matmul", A=mat1.contiguous(), B=mat2.contiguous()) + input


def matmul(swap, input, other):
    """x @ W with a 2-D right operand; batched products (attention scores) stay torch."""
    if not isinstance(input, torch.Tensor) or not isinstance(other, torch.Tensor) \
            or other.dim() != 2 or input.dim() < 1:
        return swap.fallback("matmul", "batched or vector matmul")
    if input.dtype not in FLOAT_DTYPES or other.dtype != input.dtype or input.numel() == 0:
        return swap.fallback("matmul", "dtype or shape outside the contract")
    out = swap.run("matmul", A=as_rows(input), B=other.contiguous(), bias=None)
    return out.view(*input.shape[:-1], other.shape[1])


def sdpa(swap, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """A prefill's attention (queries and keys of one length: flash_attention) or a decode
    step's (a few queries over a longer cache under a mask: decode_attention)."""
    if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and query.dim() == 4 \
            and key.dim() == 4 and query.shape[2] < key.shape[2]:
        if not swap.active("decode_attention"):
            return FALLBACK
        return decode_sdpa(swap, query, key, value, attn_mask, dropout_p, is_causal, scale,
                           enable_gqa)
    if not swap.active("flash_attention"):
        return FALLBACK
    reason = None
    if attn_mask is not None:
        reason = "attention mask"
    elif dropout_p:
        reason = "dropout"
    elif query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        reason = "not [B, H, S, D]"
    elif query.shape[2] != key.shape[2] or value.shape != key.shape \
            or query.shape[-1] != key.shape[-1] or query.shape[0] != key.shape[0]:
        reason = "query/key/value shapes differ"
    elif query.dtype not in FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        reason = "dtype outside the contract"
    elif key.shape[1] != query.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        reason = "head counts differ"
    if reason:
        return swap.fallback("flash_attention", reason)
    return swap.run("flash_attention", Q=attention_heads(query), K=attention_heads(key),
                    V=attention_heads(value), causal=bool(is_causal),
                    scale=None if scale is None else float(scale))


def decode_sdpa(swap, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Queries for the newest Sq positions over a static cache of L > Sq positions, the mask
    saying which positions each query sees: the kernel takes each sequence's live length, read
    on the device from the mask's last query row (so a CUDA graph of the step replays any
    position). That is exact when the mask is causal over a live prefix of the cache, which the
    swap checks on every eager call (it reads the mask back: a sync) and trusts while a graph is
    captured or the model compiled, where the eager run has already checked the same call."""
    B, H, Sq, D = query.shape
    L, reason = key.shape[2], None
    if isinstance(attn_mask, torch.Tensor) and attn_mask.dim() in (2, 4) and Sq > 1 \
            and attn_mask.shape[-2] == 1 and not is_causal:
        # Every query sees the same positions: they are query heads of one position
        # (transformers folds grouped-query heads into the query length this way).
        out = decode_sdpa(swap, query.reshape(B, H * Sq, 1, D), key, value, attn_mask,
                          dropout_p, is_causal, scale, True)
        return out if out is FALLBACK else out.reshape(B, H, Sq, D)
    if attn_mask is None or is_causal:
        reason = "no mask over the cache (or is_causal with keys longer than queries)"
    elif dropout_p:
        reason = "dropout"
    elif value.shape != key.shape or key.shape[0] != B or key.shape[3] != D:
        reason = "query/key/value shapes differ"
    elif query.dtype not in FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        reason = "dtype outside the contract"
    elif Sq > DECODE_MAX_QUERIES:
        reason = f"more than {DECODE_MAX_QUERIES} queries over the cache (a prefill)"
    elif H % key.shape[1] or (H != key.shape[1] and not enable_gqa):
        reason = "head counts differ"
    elif attn_mask.dim() not in (2, 4) or attn_mask.shape[-1] != L \
            or attn_mask.shape[-2] not in (1, Sq) \
            or (attn_mask.dim() == 4 and (attn_mask.shape[1] != 1
                                          or attn_mask.shape[0] not in (1, B))):
        reason = "mask is not [Sq, L] or [B or 1, 1, Sq, L]"
    if reason:
        return swap.fallback("decode_attention", reason)
    seen = attn_mask if attn_mask.dtype == torch.bool else attn_mask == 0  # additive: 0 or -inf
    seen = (seen[:, 0] if seen.dim() == 4 else seen[None]).expand(B, Sq, L)
    lengths = seen[:, -1].sum(-1, dtype=torch.int32)
    if not capturing():
        query_pos = lengths[:, None].long() - Sq + torch.arange(Sq, device=query.device)
        if not torch.equal(seen, torch.arange(L, device=query.device) <= query_pos[..., None]):
            return swap.fallback("decode_attention", "mask is not causal over a live prefix")
    return swap.run("decode_attention", Q=query, K=key, V=value, lengths=lengths,
                    scale=None if scale is None else float(scale))


def attention_heads(t):
    """t [B,H,S,D] as the contract takes it: contiguous, or rows of positions seen through
    .transpose(1, 2), each row R >= H*D elements wide (a projection's [B,S,H,D] output, R = H*D,
    or one head slice of a fused q/k/v projection's), passed without a copy; any other layout
    is copied."""
    B, H, S, D = t.shape
    R = t.stride(2)
    rows = t.stride(3) == 1 and t.stride(1) == D and R >= H * D and (B == 1 or t.stride(0) == S * R)
    return t if t.is_contiguous() or rows else t.contiguous()


def _norm_rows(input, normalized_shape, *params):
    """x [..., *normalized_shape] as contiguous rows [M, N] and the affine parameters flattened
    to [N] (None stays None), or None when the shapes do not line up."""
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list, torch.Size)) \
        else (normalized_shape,)
    if not shape or tuple(input.shape[input.dim() - len(shape):]) != shape \
            or any(p is not None and tuple(p.shape) != shape for p in params):
        return None
    n = math.prod(shape)
    return (input.reshape(-1, n).contiguous(),
            *(None if p is None else p.reshape(n).contiguous() for p in params))


def layer_norm(swap, input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if input.dtype not in FLOAT_DTYPES or any(p is not None and p.dtype != input.dtype
                                              for p in (weight, bias)):
        return swap.fallback("layernorm", "dtype outside the contract")
    rows = _norm_rows(input, normalized_shape, weight, bias)
    if rows is None or input.numel() == 0:
        return swap.fallback("layernorm", "shape outside the contract")
    x, w, b = rows
    return swap.run("layernorm", x=x, weight=w, bias=b, eps=float(eps)).view(input.shape)


def rms_norm(swap, input, normalized_shape, weight=None, eps=None):
    if input.dtype not in FLOAT_DTYPES or (weight is not None and weight.dtype != input.dtype):
        return swap.fallback("rmsnorm", "dtype outside the contract")
    rows = _norm_rows(input, normalized_shape, weight)
    if rows is None or input.numel() == 0:
        return swap.fallback("rmsnorm", "shape outside the contract")
    x, w = rows
    # F.rms_norm's eps=None means the dtype's machine epsilon.
    eps = torch.finfo(input.dtype).eps if eps is None else float(eps)
    return swap.run("rmsnorm", x=x, weight=w, eps=eps).view(input.shape)


def _last_dim_input(swap, ktype, input, dim, dtype, any_dim=False):
    """The input of a one-dim op (softmax: the last dim; sum: any_dim) cast to its dtype=
    argument, or FALLBACK."""
    if not isinstance(input, torch.Tensor) or input.dim() == 0:
        return swap.fallback(ktype, "not a tensor of at least one dim")
    if any_dim and one_dim(dim, input.dim()) is None:
        return swap.fallback(ktype, "not over exactly one dim")
    if not any_dim and not is_last_dim(dim, input.dim()):
        return swap.fallback(ktype, "not over the last dim")
    if dtype is not None and dtype != input.dtype:
        input = input.to(dtype)
        swap.note(ktype, "dtype= argument: input cast in torch")
    if input.dtype not in FLOAT_DTYPES or input.numel() == 0:
        return swap.fallback(ktype, "dtype outside the contract")
    return input


def _softmax_common(swap, input, dim, dtype):
    input = _last_dim_input(swap, "softmax", input, dim, dtype)
    if input is FALLBACK:
        return FALLBACK
    return swap.run("softmax", x=as_rows(input)).view(input.shape)


def softmax_functional(swap, input, dim=None, _stacklevel=3, dtype=None):
    return _softmax_common(swap, input, dim, dtype)


def softmax_torch(swap, input, dim, dtype=None):
    return _softmax_common(swap, input, dim, dtype)


def _hits_ignore_index(swap, target, ignore_index):
    """Whether a target is ignore_index (the contract has none). Reading that back syncs, which a
    CUDA graph capture forbids and dynamo cannot trace without a graph break: there the answer
    of the eager warm-up forwards before it (same inputs, same shapes) is reused, and with none
    the call falls back to torch. A compiled forward keeps the answer it was traced with."""
    key = (tuple(target.shape), ignore_index)
    if capturing():
        return swap.ignore_index_seen.get(key, True)
    hit = bool((target == ignore_index).any())
    swap.ignore_index_seen[key] = swap.ignore_index_seen.get(key, False) or hit
    return hit


def cross_entropy(swap, input, target, weight=None, size_average=None, ignore_index=-100,
                   reduce=None, reduction="mean", label_smoothing=0.0):
    reason = None
    if weight is not None or size_average is not None or reduce is not None \
            or reduction != "mean" or label_smoothing:
        reason = "not a plain mean loss"
    elif input.dim() != 2 or target.dim() != 1 or target.dtype != torch.int64 \
            or input.dtype not in FLOAT_DTYPES:
        reason = "not 2-D logits with 1-D int64 targets"
    elif _hits_ignore_index(swap, target, ignore_index):
        reason = "targets hit ignore_index"
    if reason:
        return swap.fallback("cross_entropy", reason)
    loss = swap.run("cross_entropy", logits=input.contiguous(), targets=target.contiguous())
    return loss.to(input.dtype)  # F.cross_entropy returns the logits' dtype


def torch_sum(swap, input, dim=None, keepdim=False, *, dtype=None):
    input = _last_dim_input(swap, "reduce", input, dim, dtype, any_dim=True)
    if input is FALLBACK:
        return FALLBACK
    d = one_dim(dim, input.dim())
    out = swap.run("reduce", x=input.contiguous(), dim=d)
    return out.unsqueeze(d) if keepdim else out


def traced_through(swap, model):
    """Dynamo runs a few torch.nn.functional functions, multi_head_attention_forward among them
    (nn.MultiheadAttention's, so every nn.TransformerEncoderLayer's), as one in-graph call: it
    runs the function's Python on fake tensors outside its own tracing. The linears inside then
    get weights with no link to the model's parameters, and the matmul kernel's weight copy
    (WeightCache: made once per weight) is made inside the graph, again at every forward: a
    read and a write of every attention weight. A copy of the function (its code, not the
    object Dynamo's rules name) is traced like the model's own code, parameters and all.
    Compiled swaps only; in eager the function runs as it is."""
    if not swap.compiled or not any(isinstance(m, torch.nn.MultiheadAttention)
                                    for m in model.modules()):
        return []
    original = F.multi_head_attention_forward
    copy = types.FunctionType(original.__code__, original.__globals__, original.__name__,
                              original.__defaults__, original.__closure__)
    copy.__kwdefaults__ = original.__kwdefaults__
    return [(F, "multi_head_attention_forward", copy)]
