"""
Concrete values of cheap nodes in a captured graph, from its real example inputs: an attention
mask's construction evaluated, to tell a causal mask from any other.

NodeValues(gm, example_inputs)(node) is the node's value when what it depends on is cheap (no
GEMM, attention, embedding or in-place write), else None; blocked_scores turns a mask as the
graph applies it (masked_fill, where, an additive bias) into the boolean tensor of blocked
scores, and blocks_future says whether that is exactly the causal mask.
"""
import torch
from torch.fx import Node
from torch.fx.node import map_arg

from autokernel.fx_vocabulary import HEAVY, mutates, op


class _Unknown(Exception):
    pass


class NodeValues:
    """Evaluates a node from the graph's real example inputs, when what it depends on is cheap
    (no GEMM, attention, embedding, in-place write): masks are built from inputs and buffers."""

    def __init__(self, gm, example_inputs):
        self.gm = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.known = (dict(zip(placeholders, example_inputs))
                      if len(placeholders) == len(example_inputs) else {})

    def __call__(self, n):
        try:
            with torch.no_grad():
                return self._value(n, depth=0)
        except Exception:  # noqa: BLE001  (a mask that can't be computed here is unknown)
            return None

    def _value(self, n, depth):
        if not isinstance(n, Node):
            return n
        if n in self.known:
            return self.known[n]
        if n.op == "get_attr":
            return getattr(self.gm, n.target)
        if n.op not in ("call_function", "call_method") or op(n) in HEAVY or mutates(n) \
                or depth > 64:
            raise _Unknown(n)
        args, kwargs = map_arg((n.args, n.kwargs), lambda a: self._value(a, depth + 1))
        value = (n.target(*args, **kwargs) if n.op == "call_function"
                 else getattr(args[0], n.target)(*args[1:], **kwargs))
        self.known[n] = value
        return value


def blocks_future(blocked, seq):
    """Whether a boolean mask of blocked scores, broadcast over [..., S, S], blocks exactly the
    positions after each query's own (causal)."""
    if not isinstance(blocked, torch.Tensor) or blocked.dim() < 2 \
            or tuple(blocked.shape[-2:]) != (seq, seq):
        return False
    future = torch.ones(seq, seq, dtype=torch.bool, device=blocked.device).triu(1)
    return bool((blocked == future).all())


NEG_LARGE = -1e4  # a fill at or below this is a mask (-inf, finfo.min, -1e9, -10000.0)


def blocked_scores(mask, values):
    """The boolean tensor of blocked scores a mask stands for, or None when it can't be known."""
    kind, node = mask
    m = values(node)
    if not isinstance(m, torch.Tensor):
        return None
    if kind == "blocked":
        return m.bool()
    if kind == "kept":
        return ~m.bool()
    if m.dtype == torch.bool or not m.is_floating_point():
        return None
    blocked = m <= NEG_LARGE
    return blocked if bool((m.masked_fill(blocked, 0) == 0).all()) else None  # a bias is no mask
