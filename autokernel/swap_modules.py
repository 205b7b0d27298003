"""
The swap rules that replace a module's forward: an MLP's first projection with its GELU (GPT-2's,
BERT's: matmul with the activation in its epilogue), RMSNorm-like modules (rmsnorm), SwiGLU MLPs
with w_gate/w_up/w_down or gate_proj/up_proj/down_proj (fused_mlp), models/layers.RotaryEmbedding
(rotary_embedding), attention modules whose forward(x) is causal attention over wq/wk/wv (or
q_proj/k_proj/v_proj) projections rotated by a RotaryEmbedding child, confirmed on a probe input
(qkv_rotary: the three projections and the rotation in one kernel; attention and the output
projection as the other rules run them), and norm and gated-MLP modules of any name whose
forward computes rmsnorm, layernorm or fused_mlp (autokernel/computed.py: recognized from their
graph, confirmed by their output).

A matcher gets (swap, module) and returns None (not its kind), a reason string (its kind, but
not swappable) or the replacement forward. A call the replacement cannot take runs the module's
own forward, counted as a fallback.
"""
import copy
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel import computed
from autokernel.cli import describe
from autokernel.kernel_call import FLOAT_DTYPES
from autokernel.patching import FALLBACK
from autokernel.swap_torch import as_rows, projected


def _conv1d_project(swap, input, conv, activation):
    """transformers' Conv1D (weight [K, N], x @ W + bias) with the activation, or FALLBACK."""
    W, bias = conv.weight, conv.bias
    if input.dtype not in FLOAT_DTYPES or W.dtype != input.dtype or input.numel() == 0 \
            or (bias is not None and bias.dtype != input.dtype):
        return swap.fallback("matmul", "dtype or shape outside the contract")
    out = swap.run("matmul", A=as_rows(input), B=W.contiguous(), bias=bias, activation=activation)
    return out.view(*input.shape[:-1], W.shape[1])


# Activation modules that are the contract's activations (transformers' names included).
GELU_MODULES = {"NewGELUActivation": "gelu_tanh", "GELUTanh": "gelu_tanh",
                "PytorchGELUTanh": "gelu_tanh", "FastGELUActivation": "gelu_tanh",
                "GELUActivation": "gelu"}


def _activation_of(act):
    if isinstance(act, nn.GELU):
        return {"tanh": "gelu_tanh", "none": "gelu"}.get(act.approximate)
    return GELU_MODULES.get(type(act).__name__)


def projection_act_module(swap, module):
    """An MLP's first projection with its activation as one matmul call, the activation in the
    kernel's epilogue. Two layouts whose forward is known: GPT-2's MLP (children c_fc, act,
    c_proj and maybe dropout: dropout(c_proj(act(c_fc(x))))) and BERT's intermediate (dense,
    intermediate_act_fn: act(dense(x)))."""
    children, cls = set(dict(module.named_children())), type(module).__name__
    if cls.endswith("MLP") and children in ({"c_fc", "act", "c_proj"},
                                            {"c_fc", "act", "c_proj", "dropout"}):
        proj, act = module.c_fc, module.act
        after = [module.c_proj] + ([module.dropout] if "dropout" in children else [])
    elif cls.endswith("Intermediate") and children == {"dense", "intermediate_act_fn"}:
        proj, act, after = module.dense, module.intermediate_act_fn, []
    else:
        return None
    activation = _activation_of(act)
    if activation is None:
        return f"skipped: activation {type(act).__name__} is not in the contract"
    if isinstance(proj, nn.Linear):
        project = lambda x: projected(swap, x, proj.weight, proj.bias, activation)  # noqa: E731
    elif type(proj).__name__ == "Conv1D" and getattr(proj, "weight", None) is not None:
        project = lambda x: _conv1d_project(swap, x, proj, activation)  # noqa: E731
    else:
        return "skipped: the projection is neither nn.Linear nor Conv1D"
    original = module.forward

    def forward(x, *args, **kwargs):
        h = FALLBACK if args or kwargs else project(x)
        if h is FALLBACK:
            return original(x, *args, **kwargs)
        for m in after:
            h = m(h)
        return h
    return forward


def rmsnorm_module(swap, module):
    if "RMSNorm" not in type(module).__name__:
        return None
    weight = getattr(module, "weight", None)
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return "skipped: no 1-D weight"
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return "skipped: no eps attribute"
    if _offset_weight(type(module)):
        return "skipped: scales by (1 + weight)"
    original, eps = module.forward, float(eps)

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dtype != weight.dtype or x.shape[-1] != weight.shape[0]:
            swap.fallback("rmsnorm", "input dtype differs from the weight's")
            return original(x, *args, **kwargs)
        return swap.run("rmsnorm", x=as_rows(x), weight=weight, eps=eps).view(x.shape)
    return forward


def computed_norm(ktype):
    """A hand-written norm module of this type, recognized by what its forward computes
    (autokernel/computed.py), whatever its class is called."""
    def matcher(swap, module):
        if not computed.norm_candidate(module):
            return None
        found, eps = computed.verdict(module)
        if found != ktype:
            return None
        reading = computed.norm_reading(module, ktype, eps)
        if isinstance(reading, str):
            return reading
        weight, bias = reading["weight"], reading["bias"]
        original = module.forward

        def forward(x, *args, **kwargs):
            if args or kwargs or not isinstance(x, torch.Tensor) or x.dtype != weight.dtype \
                    or x.shape[-1] != weight.shape[0] or x.numel() == 0:
                swap.fallback(ktype, "input dtype or width differs from the weight's")
                return original(x, *args, **kwargs)
            extra = {"bias": bias} if ktype == "layernorm" else {}
            return swap.run(ktype, x=as_rows(x), weight=weight, eps=eps, **extra).view(x.shape)
        return forward
    return matcher


def _offset_weight(cls):
    """Whether an RMSNorm class scales by (1 + weight), as Gemma's does: not the contract's."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return any(s in source.replace(" ", "") for s in ("1+self.weight", "1.0+self.weight"))


def swiglu_module(swap, module):
    names = next((n for n in (("w_gate", "w_up", "w_down"), ("gate_proj", "up_proj", "down_proj"))
                  if all(hasattr(module, a) for a in n)), None)
    if names is None:
        return None
    gate, up, down = (getattr(module, a) for a in names)
    if not all(isinstance(m, nn.Linear) for m in (gate, up, down)):
        return None
    if any(m.bias is not None for m in (gate, up, down)):
        return "skipped: projections have a bias"
    act = getattr(module, "act_fn", getattr(module, "act", None))
    is_silu = (act is None and "SwiGLU" in type(module).__name__) or \
        (act is not None and (isinstance(act, nn.SiLU) or "SiLU" in type(act).__name__))
    if not is_silu:
        return "skipped: activation is not SiLU"
    return _fused_mlp_forward(swap, module, gate.weight, up.weight, down.weight)


def computed_mlp(swap, module):
    """A gated MLP of any names, recognized by what its forward computes (computed.py)."""
    if not computed.mlp_candidate(module) or computed.verdict(module)[0] != "fused_mlp":
        return None
    reading = computed.mlp_reading(module)
    if isinstance(reading, str):
        return reading
    return _fused_mlp_forward(swap, module, **reading)


def _fused_mlp_forward(swap, module, w_gate, w_up, w_down):
    original = module.forward

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dtype != w_gate.dtype or x.dtype not in FLOAT_DTYPES:
            swap.fallback("fused_mlp", "dtype outside the contract")
            return original(x, *args, **kwargs)
        out = swap.run("fused_mlp", x=as_rows(x), w_gate=w_gate, w_up=w_up, w_down=w_down)
        return out.view(*x.shape[:-1], w_down.shape[0])
    return forward


# Attention modules whose q/k/v projections and rotary run as one qkv_rotary kernel: these
# attribute names, a RotaryEmbedding child with [max_seq, D/2] tables, and a forward(x) that is
# causal attention over them (confirmed once per class and shapes on a probe input, _ATTENTION).
QKV_NAMES = (("wq", "wk", "wv", "wo"), ("q_proj", "k_proj", "v_proj", "o_proj"))
_ATTENTION = {}  # (class, parameter shapes and dtype) -> None if confirmed, else why not


def qkv_rotary_module(swap, module):
    names = next((n for n in QKV_NAMES if all(hasattr(module, a) for a in n)), None)
    rotary = getattr(module, "rotary", None)
    if names is None or rotary is None:
        return None
    projections = [getattr(module, a) for a in names]
    cos = getattr(rotary, "cos", None)
    if not all(isinstance(p, nn.Linear) for p in projections) or not isinstance(cos, torch.Tensor) \
            or cos.dim() != 2 or "RotaryEmbedding" not in type(rotary).__name__:
        return None
    wq, wk, wv, wo = projections
    D = 2 * cos.shape[1]
    if not stackable([wq, wk, wv], D) or wo.weight.dtype != wq.weight.dtype:
        return UNEQUAL_QKV
    refused = probed(module, projections, lambda: _attention_mismatch(module, names))
    return refused or _qkv_rotary_forward(swap, module, wq, wk, wv, wo, rotary)


UNEQUAL_QKV = "skipped: q/k/v projections of unequal kinds"


def stackable(projections, D):
    """Whether q/k/v projections (three, or one fused) stack into the kernel's w_qkv: whole
    heads of D, k and v alike, one dtype, all biased or none."""
    rows = [p.weight.shape[0] for p in projections]
    return all(r % D == 0 for r in rows) \
        and (len(projections) == 1 or projections[1].weight.shape == projections[2].weight.shape) \
        and len({p.weight.dtype for p in projections}) == 1 \
        and len({p.bias is None for p in projections}) == 1


def probed(module, projections, probe):
    """probe() (None: the swap is confirmed, else why not), run once per class, projection
    shapes and dtype."""
    key = (type(module), tuple((tuple(p.weight.shape), p.bias is None) for p in projections),
           projections[0].weight.dtype)
    if key not in _ATTENTION:
        _ATTENTION[key] = probe()
    return _ATTENTION[key]


def stacked_qkv(swap, *linears):
    """[w_q; w_k; w_v] (and their biases): one copy, made once per weight version (one fused
    projection's own weight as it is)."""
    if len(linears) == 1:
        return linears[0].weight, linears[0].bias
    weights = swap.weights.stacked([p.weight for p in linears])
    bias = None if linears[0].bias is None else swap.weights.stacked([p.bias for p in linears])
    return weights, bias


def _qkv_attention(qkv_fn, x, wq, wk, wv, wo, D):
    """Causal attention over q/k/v from qkv_fn(x) -> [B, S, Hq + 2 Hkv, D]: what the swapped
    forward computes (qkv_fn the kernel) and what it is confirmed against (the eager one)."""
    B, S, _ = x.shape
    Hq, Hkv = wq.weight.shape[0] // D, wk.weight.shape[0] // D
    q, k, v = (t.transpose(1, 2) for t in qkv_fn(x, Hkv).split([Hq, Hkv, Hkv], dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
    return wo(y.transpose(1, 2).reshape(B, S, Hq * D))


def _attention_mismatch(layer, names):
    """None when the layer's forward(x) is _qkv_attention on a probe input (a random copy of the
    layer: random_copy), else why not. names: its q/k/v/o projections' attributes."""
    from autokernel import reference
    gen = torch.Generator().manual_seed(0)
    module = random_copy(layer, gen)
    wq, wk, wv, wo = (getattr(module, a) for a in names)
    rotary = module.rotary
    weights, bias = cat_qkv([wq, wk, wv])
    w = wq.weight
    S = min(16, rotary.cos.shape[0])
    x = torch.randn((2, S, w.shape[1]), generator=gen).to(w)
    cos, sin = (t[:S].to(w.dtype) for t in (rotary.cos, rotary.sin))
    try:
        with torch.no_grad():
            got = module(x)
            want = _qkv_attention(lambda t, kv: reference.qkv_rotary_eager(
                t, weights, cos, sin, kv, bias), x, wq, wk, wv, wo, 2 * rotary.cos.shape[1])
    except Exception as e:  # noqa: BLE001  (a forward that needs more than x)
        return f"skipped: forward(x) alone raised {describe(e, 80)}"
    if not isinstance(got, torch.Tensor) or not computed.agrees(got, want, w.dtype):
        return "skipped: forward is not causal attention over rotary q/k (probe mismatch)"
    return None


def random_copy(layer, gen):
    """A copy of an attention layer with random parameters, for a probe. With its own, a norm on
    q/k whose weights are still all ones (Qwen3's, as initialized) commutes with the rotation:
    the probe would pass, and the swap compute wrong values once trained weights are loaded."""
    module = copy.deepcopy(layer)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen)
            p.copy_(r * p.shape[-1] ** -0.5 if p.dim() > 1 else r * 0.2 + name.endswith("weight"))
    return module


def cat_qkv(projections):
    """(w_qkv, bias) of q/k/v projections stacked afresh: a probe's, on its copy's weights."""
    bias = None if projections[0].bias is None else torch.cat([p.bias for p in projections])
    return torch.cat([p.weight for p in projections]), bias


def _qkv_rotary_forward(swap, module, wq, wk, wv, wo, rotary):
    original = module.forward
    D = 2 * rotary.cos.shape[1]
    tables = {}

    def qkv(x, kv_heads):
        cos, sin = _table_rows(rotary, tables, 0, x.shape[1], x.dtype)
        weights, bias = stacked_qkv(swap, wq, wk, wv)
        return swap.run("qkv_rotary", x=x, w_qkv=weights, cos=cos, sin=sin, kv_heads=kv_heads,
                        bias=bias)

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dim() != 3 or x.dtype != wq.weight.dtype \
                or x.shape[1] > rotary.cos.shape[0] or x.dtype not in FLOAT_DTYPES:
            swap.fallback("qkv_rotary", "arguments outside the contract")
            return original(x, *args, **kwargs)
        return _qkv_attention(qkv, x, wq, wk, wv, wo, D)
    return forward


def rotary_module(swap, module):
    """models/layers.RotaryEmbedding: real cos/sin buffers [max_seq, D/2], forward(x, offset)."""
    cos, sin = getattr(module, "cos", None), getattr(module, "sin", None)
    if "RotaryEmbedding" not in type(module).__name__ or not isinstance(cos, torch.Tensor) \
            or not isinstance(sin, torch.Tensor):
        return None
    if cos.dim() != 2 or cos.shape != sin.shape:
        return "skipped: cos/sin tables are not [max_seq, D/2]"
    original = module.forward
    tables = {}

    def forward(x, offset=0, positions=None):
        S, D = x.shape[-2], x.shape[-1]
        if x.dim() != 4 or D != 2 * module.cos.shape[1] or offset + S > module.cos.shape[0] \
                or x.dtype not in FLOAT_DTYPES:
            swap.fallback("rotary_embedding", "shape or dtype outside the contract")
            return original(x, offset, positions)
        if positions is not None:  # a generation step's rows, gathered on the device
            c, s = (t[positions].to(x.dtype) for t in (module.cos, module.sin))
        else:
            c, s = _table_rows(module, tables, offset, S, x.dtype)
        return swap.run("rotary_embedding", x=x.contiguous(), cos=c, sin=s)
    return forward


def _table_rows(rotary, tables, offset, S, dtype):
    """A RotaryEmbedding's cos/sin rows offset..offset+S-1 in dtype, sliced and cast once per
    (offset, length, dtype) into `tables`. Under torch.compile the graph slices and casts: a
    data_ptr() key would break it."""
    if torch.compiler.is_compiling():
        return tuple(t[offset:offset + S].to(dtype).contiguous() for t in (rotary.cos, rotary.sin))
    key = (offset, S, dtype, rotary.cos.data_ptr())
    if key not in tables:
        tables[key] = tuple(t[offset:offset + S].to(dtype).contiguous()
                            for t in (rotary.cos, rotary.sin))
    return tables[key]
