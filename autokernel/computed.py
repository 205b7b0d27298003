"""
Module swaps by computation: norms and gated MLPs written by hand, whatever their class is called.

The swap's name-based rules plug kernels into modules they know (classes named *RMSNorm, MLPs
whose projections are called gate_proj/up_proj/down_proj or w_gate/w_up/w_down, torch's
F.layer_norm and F.rms_norm). A user's `class Norm(nn.Module)` whose forward spells
`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight`, or Meta's LLaMA
`FeedForward` (`self.w2(F.silu(self.w1(x)) * self.w3(x))`), is recognized by profile.py
(autokernel/graph_capture.py) but would never reach a kernel. Here such a module is recognized the
same way and confirmed by numbers before it is swapped:
  1. its forward is captured under Dynamo on a small probe input and matched by the patterns;
     it qualifies when the whole forward is one match of a type below (its output is the
     module's output);
  2. the kernel's arguments are read off the module: a norm's eps from its graph (the number
     added to the statistic), its own 1-D weight (or 1 + weight, as Gemma scales) and bias;
     an MLP's down projection by its shape, gate and up (two projections, or the halves of a
     fused one) by which order reproduces the output;
  3. the module's output must match reference.py's oracle with that reading, within the
     dtype's tolerance (a norm's probe rows span scales 1 to 1e-4, where a wrong eps shows).
A module that fails any step keeps its forward, with the reason in the swap's report. The
capture runs once per class, parameter shapes and dtypes and number attributes (an eps);
step 3 runs for every module.
"""
import torch
import torch.nn as nn

from autokernel import graph_capture
from autokernel.fx_vocabulary import number, op
from autokernel.kernel_types import TOLERANCES


def norm_candidate(module):
    """A leaf module holding a 1-D `weight` (and maybe a `bias` of its size) and nothing else,
    not one of torch's own layers (their functional calls are patched instead)."""
    if next(module.children(), None) is not None or _torch_layer(module):
        return False
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    return (isinstance(weight, torch.Tensor) and weight.dim() == 1 and weight.dtype in TOLERANCES
            and set(params) <= {"weight", "bias"}
            and (params.get("bias") is None or params["bias"].shape == weight.shape))


def mlp_candidate(module):
    """Bias-free nn.Linear children of one dtype, D -> F twice and F -> D (or D -> 2F fused and
    F -> D), other children without parameters (an activation module), nothing else."""
    children, linears = list(module.children()), _linears(module)
    if _torch_layer(module) or next(module.parameters(recurse=False), None) is not None \
            or any(next(c.parameters(), None) is not None for c in children
                   if not isinstance(c, nn.Linear)) \
            or not linears or any(c.bias is not None for c in linears):
        return False
    return _projections(linears) is not None and linears[0].weight.dtype in TOLERANCES \
        and len({c.weight.dtype for c in linears}) == 1


def verdict(module):
    """(kernel type, eps or None) when the module's forward is one match by its graph (a norm
    or a gated MLP), else (None, None)."""
    params = tuple((n, tuple(p.shape), p.dtype, p.device) for n, p in module.named_parameters())
    scalars = tuple(sorted((k, v) for k, v in vars(module).items()
                           if isinstance(v, (int, float))))  # an eps attribute, say
    key = (type(module), params, scalars)
    if key not in _VERDICTS:
        _VERDICTS[key] = _graph_verdict(module)
    return _VERDICTS[key]


# (class, its parameters' names, shapes, dtypes and devices, number attributes) ->
# (kernel type or None, eps or None)
_VERDICTS = {}
TYPES = ("rmsnorm", "layernorm", "fused_mlp")


def norm_reading(module, ktype, eps):
    """{"eps", "weight", "bias"} for the norm kernel when the module's output confirms them,
    else the reason it does not. The weight is the module's own, or 1 + it (Gemma's RMSNorm
    scales by 1 + weight: a copy made here, at install)."""
    from autokernel import reference
    weight, bias = module.weight, getattr(module, "bias", None)
    scales = torch.tensor([1.0, 1e-3, 1e-4], device=weight.device).repeat_interleave(2)
    x = (torch.randn(6, weight.shape[0], device=weight.device) * scales[:, None]).to(weight.dtype)
    with torch.no_grad():
        for w in (weight, 1 + weight.detach()):
            if ktype == "rmsnorm":
                oracle = lambda x: reference.rmsnorm(x, w, eps)  # noqa: E731
            else:
                oracle = lambda x: reference.layernorm(x, w, bias, eps)  # noqa: E731
            if _matches(module, oracle, x):
                return {"eps": eps, "weight": w, "bias": bias}
    return (f"skipped: its graph computes {ktype}, but its output differs from {ktype} "
            f"with eps {eps:g} and its own weight")


def mlp_reading(module):
    """{"w_gate", "w_up", "w_down"} for the fused_mlp kernel: the order of the two D -> F
    weights (two projections, or the halves of a fused one) that reproduces the module's
    output, else the reason none does."""
    from autokernel import reference
    (a, b), down = _projections(_linears(module))
    x = torch.randn(6, down.out_features, device=down.weight.device).to(down.weight.dtype)
    for gate, up in ((a, b), (b, a)):
        weights = {"w_gate": gate, "w_up": up, "w_down": down.weight}
        if _matches(module, lambda x: reference.fused_mlp(x, **weights), x):
            return weights
    return "skipped: its graph computes a gated MLP, but not silu(gate(x)) * up(x) -> down"


def _torch_layer(module):
    return type(module).__module__.startswith("torch.")


def _linears(module):
    return [c for c in module.children() if isinstance(c, nn.Linear)]


def _projections(linears):
    """((the two [F, D] gate/up weights in either role), the F -> D projection) of three
    linears, or of two where one is D -> 2F (its halves), else None."""
    for down in linears:
        ins = [m for m in linears if m is not down]
        if len(ins) == 2 and all(m.in_features == down.out_features
                                 and m.out_features == down.in_features for m in ins):
            return (ins[0].weight, ins[1].weight), down
        if len(ins) == 1 and ins[0].in_features == down.out_features \
                and ins[0].out_features == 2 * down.in_features:
            return tuple(ins[0].weight.chunk(2)), down
    return None


def _graph_verdict(module):
    """(kernel type, eps) when the module's forward is one match of TYPES, else (None, None)."""
    if mlp_candidate(module):  # rows of D, the down projection's [D, F] output width
        like = _projections(_linears(module))[1].weight
    else:  # rows of N, a norm's [N] weight
        like = module.weight
    x = torch.randn(4, like.shape[0], device=like.device, dtype=like.dtype)
    try:
        with torch.no_grad():
            _, matches = graph_capture.capture(_probe(module), (x,))
    except Exception:  # noqa: BLE001  (an untraceable forward keeps its own)
        return None, None
    if len(matches) != 1 or matches[0].ktype not in TYPES or matches[0].shape is None \
            or matches[0].variant.get("affine") is False or not _is_output(matches[0].output):
        return None, None
    match = matches[0]
    eps = next((float(a) for n in match.nodes if op(n) == "add"
                for a in n.args if number(a)), 0.0)
    return match.ktype, eps if match.ktype != "fused_mlp" else None


def _probe(module):
    """A function calling the module, with a code object of its own: Dynamo caches what it
    compiled per code object and stops compiling one after a few variants (its recompile
    limit), and every probed module would be one more variant of a shared lambda."""
    def forward(t):
        return module(t)
    forward.__code__ = forward.__code__.replace()
    return forward


def _is_output(node):
    return any(user.op == "output" for user in node.users)


def _matches(module, oracle, x):
    """The module's output on x equals the oracle's within the dtype's tolerance."""
    with torch.no_grad():
        got, want = module(x), oracle(x)
    return isinstance(got, torch.Tensor) and agrees(got, want, x.dtype)


def agrees(got, want, dtype):
    """got equals want within `dtype`'s tolerance (atol in units of want's largest value)."""
    tol = TOLERANCES[dtype]
    return got.shape == want.shape and \
        bool(torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * want.abs().max()))
