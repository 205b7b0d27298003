"""
Matches in a captured graph: which computations become one block each, and where they came from.

A pattern (autokernel/patterns.py) is a short function that, given a node, checks the
computation that ends there and returns a Match (the nodes, the kernel type's shape and contract
variant, or a note saying why no kernel of the type can take it, e.g. an interleaved rotary).
find_matches tries the patterns in priority order (attention before the softmax inside it), so
matches never overlap, and keeps a match only when nothing outside it reads its intermediate
values, so its nodes can run as one block, which is what a kernel would replace.
"""
from dataclasses import dataclass, field

from torch.fx import Node

from autokernel.fx_vocabulary import CASTS, RANDOM, VIEWS, mutates, op, sole_user
from autokernel.mask_values import NodeValues
from autokernel.recognize import scope_name


@dataclass(eq=False)
class Match:
    ktype: str
    output: Node
    nodes: set
    shape: tuple = None       # in the kernel type's convention; None: no kernel takes it (note)
    variant: dict = field(default_factory=dict)
    note: str = ""
    label: str = ""           # the innermost module the computation is in (its class name)
    modules: list = field(default_factory=list)  # Dynamo's module stack its nodes share (as
                                                 # module_stack; before views feeding it joined)
    source: Node = None       # the tensor a rotary rotates (qkv_rotary finds its projection)
    outputs: tuple = ()       # values read outside besides `output` (qkv_rotary's k and v)
    operands: dict = field(default_factory=dict)  # what a kernel call would take in its place
                                                  # (attention's q, k, v, scale, mask: the
                                                  # graph swap's arguments, swap_graph.py)

    @property
    def scope(self):
        return scope_name(self.label, self.ktype, self.shape, self.variant, self.note)


def find_matches(gm, example_inputs, patterns, root="forward", skip=()):
    """Every pattern's matches in a captured graph, without overlaps, the patterns tried in
    their order (most specific first) but those named in skip. Each is then grown by the casts
    right after it and the casts and views that only feed it (a kernel replaces those too), and
    kept if it can run as one block."""
    values = NodeValues(gm, example_inputs)
    claimed, matches = set(), []
    for fn in (f for f in patterns if f.__name__ not in skip):
        for node in list(gm.graph.nodes):
            m = fn(node, values) if node not in claimed else None
            if m is not None and _self_contained(m, claimed):
                m.modules = module_stack(m.nodes)
                m.label = _label(m.modules, root)
                claimed |= m.nodes
                matches.append(m)
    for m in matches:
        while (u := sole_user(m.output)) is not None and op(u) in CASTS and u not in claimed:
            m.nodes.add(u)
            claimed.add(u)
            m.output = u
    for m in matches:
        feeding = _feeding(m, _inputs(m.nodes) - claimed)
        while feeding:
            m.nodes |= feeding
            claimed |= feeding
            feeding = _feeding(m, _inputs(feeding) - claimed)
    return [m for m in matches if _movable(m, gm.graph)]


def _inputs(nodes):
    return {a for n in nodes for a in n.all_input_nodes}


def _feeding(m, candidates):
    """The candidates only m reads that a kernel makes unnecessary: casts and views, and
    constants built in the forward (a causal mask from torch.ones(S, S).triu(1))."""
    return {n for n in candidates if (op(n) in VIEWS or _constant(n)) and not mutates(n)
            and all(u in m.nodes for u in n.users)}


def _constant(n, depth=0):
    """Whether a call's value depends on no input of the graph: built from Python values in a
    few steps (a mask is; deeper chains are taken as not constant)."""
    return depth < 8 and op(n) is not None and op(n) not in RANDOM and all(
        _constant(a, depth + 1) for a in n.all_input_nodes)


def _self_contained(m, claimed):
    """No node taken by another match, and no value but its outputs read outside it."""
    m.nodes = set(m.nodes)
    read = {m.output, *m.outputs}
    return not m.nodes & claimed and all(u in m.nodes for n in m.nodes if n not in read
                                         for u in n.users)


def _movable(m, graph):
    """Whether the nodes between a match's first and last can move before it: none of them
    writes a tensor in place or changes a mode (autocast, grad: a call nobody reads), and its
    own in-place writes are to its own values."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    first, last = min(order[n] for n in m.nodes), max(order[n] for n in m.nodes)
    for n in list(graph.nodes)[first:last + 1]:
        if mutates(n) and (n not in m.nodes or n.args[0] not in m.nodes):
            return False
        if n not in m.nodes and op(n) and op(n) != "_log_api_usage_once" \
                and (not n.users or "autocast" in op(n)):
            return False
    return True


def module_stack(nodes):
    """Dynamo's module stack all nodes share, outermost first: [(key, (path, class))], the
    last the innermost module they were all called in; [] for code in the top-level forward."""
    common = None
    for n in nodes:
        stack = list((n.meta.get("nn_module_stack") or {}).items())
        if common is None:
            common = stack
        else:
            k = 0
            while k < min(len(common), len(stack)) and common[k][1][0] == stack[k][1][0]:
                k += 1
            common = common[:k]
    return common or []


def _label(common, root):
    """The class name of the innermost module of a module stack (the model's own class for code
    in its forward)."""
    if not common:
        return root
    cls = common[-1][1][1]
    return cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
