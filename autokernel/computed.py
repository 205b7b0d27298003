"""
Module swaps by computation: a norm module written by hand, whatever its class is called.

The swap's name-based rules plug kernels into modules they know (classes named *RMSNorm, torch's
F.layer_norm and F.rms_norm). A user's `class Norm(nn.Module)` whose forward spells
`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight` is recognized by
profile.py (autokernel/patterns.py) but would never reach a kernel. Here such a module is
recognized the same way and confirmed by numbers before it is swapped:
  1. its forward is captured under Dynamo on a small probe input and matched by the patterns;
     it qualifies when the whole forward is one rmsnorm or layernorm match (its output is the
     module's output) over the last dim;
  2. eps is read from the graph (the number added to the statistic), the weight and bias are the
     module's own 1-D parameters;
  3. the module's output on probe rows of very different scales (where a wrong eps shows) must
     match reference.py's oracle with that reading, within the dtype's tolerance.
A module that fails any step keeps its forward, with the reason in the swap's report. The
capture runs once per class, width, dtype, parameters and number attributes (its eps); step 3
runs for every module.
"""
import torch

from autokernel import patterns
from autokernel.kernel_types import TOLERANCES

NORM_TYPES = ("rmsnorm", "layernorm")


def candidate(module):
    """A leaf module holding a 1-D `weight` (and maybe a `bias` of its size) and nothing else,
    not one of torch's own layers (their functional calls are patched instead)."""
    if next(module.children(), None) is not None or type(module).__module__.startswith("torch."):
        return False
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    return (isinstance(weight, torch.Tensor) and weight.dim() == 1 and weight.dtype in TOLERANCES
            and set(params) <= {"weight", "bias"}
            and (params.get("bias") is None or params["bias"].shape == weight.shape))


def verdict(module):
    """(kernel type, eps) when a candidate module's forward is one norm by its graph, else
    (None, None)."""
    weight, bias = module.weight, getattr(module, "bias", None)
    scalars = tuple(sorted((k, v) for k, v in vars(module).items()
                           if isinstance(v, (int, float))))  # an eps attribute, say
    key = (type(module), weight.shape[0], weight.dtype, weight.device, bias is not None, scalars)
    if key not in _VERDICTS:
        _VERDICTS[key] = _graph_verdict(module)
    return _VERDICTS[key]


def reading(module, ktype, eps):
    """{"eps", "weight", "bias"} for the kernel when the module's output confirms them, else
    the reason it does not."""
    found = {"eps": eps, "weight": module.weight, "bias": getattr(module, "bias", None)}
    if not _confirmed(module, ktype, found):
        return (f"skipped: its graph computes {ktype}, but its output differs from {ktype} "
                f"with eps {eps:g} and its own weight")
    return found


# (class, width, dtype, device, has a bias, number attributes) -> (kernel type or None, eps)
_VERDICTS = {}


def _graph_verdict(module):
    """(kernel type, eps) when the module's forward is one norm match, else (None, None)."""
    weight = module.weight
    x = torch.randn(4, weight.shape[0], device=weight.device, dtype=weight.dtype)
    try:
        with torch.no_grad():
            _, matches = patterns.capture(lambda t: module(t), (x,))
    except Exception:  # noqa: BLE001  (an untraceable forward keeps its own)
        return None, None
    if len(matches) != 1 or matches[0].ktype not in NORM_TYPES or matches[0].shape is None \
            or matches[0].variant.get("affine") is False or not _is_output(matches[0].output):
        return None, None
    match = matches[0]
    eps = next((float(a) for n in match.nodes if patterns.op(n) == "add"
                for a in n.args if patterns._number(a)), 0.0)
    return match.ktype, eps


def _is_output(node):
    return any(user.op == "output" for user in node.users)


def _confirmed(module, ktype, reading):
    """The module's output equals the oracle's with this reading, on rows of scale 1, 1e-3 and
    1e-4 (where eps is most of the statistic)."""
    import reference
    weight = reading["weight"]
    scales = torch.tensor([1.0, 1e-3, 1e-4], device=weight.device).repeat_interleave(2)
    x = (torch.randn(6, weight.shape[0], device=weight.device) * scales[:, None]).to(weight.dtype)
    with torch.no_grad():
        got = module(x)
        if ktype == "rmsnorm":
            want = reference.rmsnorm(x, weight, reading["eps"])
        else:
            want = reference.layernorm(x, weight, reading["bias"], reading["eps"])
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    tol = TOLERANCES[weight.dtype]
    return bool(torch.allclose(got.float(), want.float(), rtol=tol, atol=tol))
