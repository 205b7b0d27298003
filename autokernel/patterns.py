"""
Recognition by computation: which kernel type a piece of a model computes, whoever wrote it.

profile.py runs the model's forward once under TorchDynamo (torch.compile with a backend of
ours), finds in each captured graph the computations that are a kernel type -- RMSNorm,
LayerNorm, softmax, a SwiGLU or GeGLU MLP, rotary embedding (half-split or interleaved), an
attention layer's q/k/v projections with rotary on q and k, cross-entropy, attention written
out -- in the usual spellings, and puts every match in an
`autokernel::` profiler scope that carries its kernel type and shape (recognize.scope_name).
The profiled forwards run these instrumented graphs, so the time of a match's ops belongs to
its kernel type. When capture fails, profiling falls back to the op names and module classes of
recognize.py (module_scopes), after one line saying so.

Why TorchDynamo: torch.fx.symbolic_trace fails on data-dependent Python, which real models
(transformers' among them) are full of; torch.export must take the whole forward as one graph
(one unsupported construct fails the model) and hands back an ATen graph whose decompositions
are not the program the user runs. A Dynamo backend gets every graph Dynamo captures (a graph
break only splits them), each node with its example value (shape, dtype) and the modules it
was called in, and the real example inputs (a mask can be evaluated: causal or not); the graph
it returns is what runs, calling the same torch functions as the model, so the profiled
forward runs the model's own ops, now inside scopes.

A match is one PATTERNS entry: a short function that, given a node, checks the computation that
ends there and returns a Match (the nodes, the kernel type's shape and contract variant, or a
note saying why no kernel of the type can take it, e.g. an interleaved rotary). Matches never
overlap (PATTERNS is in priority order: attention before the softmax inside it), and a match is
kept only when nothing outside it reads its intermediate values, so its nodes can run as one
block, which is what a kernel would replace.
"""
import heapq
import logging
import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.fx import Node
from torch.fx.node import map_arg
from torch.profiler import record_function

from autokernel.cli import describe
from autokernel.recognize import is_last_dim, module_scopes, scope_name


# ---------------------------------------------------------------------------------------------
# Capture: the model's forward through a Dynamo backend that matches and instruments each graph
# ---------------------------------------------------------------------------------------------

@contextmanager
def recognized_forward(model, inputs, say=print, skip=()):
    """The forward to profile: the model under Dynamo with every match in its profiler scope
    (already run once, the capture); skip: patterns (by name) not to look for. When capture
    fails, the model itself inside its module classes' scopes, after one line saying so.
    Dynamo's caches are cleared afterwards: they would keep this model's graphs, and after 8 of
    them Dynamo stops tracing that code."""
    try:
        forward, matches = capture(model, inputs, skip)
    except Exception as e:  # noqa: BLE001  (any failure to trace leaves today's recognition)
        torch._dynamo.reset()
        say(f"  graph capture failed ({describe(e, 160)}): kernel types recognized by op name "
            "and module class only")
        with module_scopes(model):
            yield model
        return
    counts = Counter(m.ktype for m in matches)
    say("  recognized by computation: " + (", ".join(f"{n} {k}" for k, n in counts.most_common())
                                           or "nothing beyond single ops"))
    try:
        yield forward
    finally:
        torch._dynamo.reset()


def capture(model, inputs, skip=()):
    """Run the model once under Dynamo; every graph it captures is matched and instrumented.
    Returns (the compiled forward, [Match])."""
    found, graphs = [], []
    root = type(model).__name__

    def backend(gm, example_inputs):
        matches = find_matches(gm, example_inputs, root, skip)
        instrument(gm, matches)
        found.extend(matches)
        graphs.append(gm)
        return gm

    compiled = torch.compile(model, backend=backend, dynamic=False)
    with _dynamo_quiet():
        compiled(*inputs)
    if not graphs:
        raise RuntimeError("Dynamo captured no graph of the forward")
    return compiled, found


@contextmanager
def _dynamo_quiet():
    # A failed trace logs pages of internals before it raises; the one-line reason is enough.
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(previous)


# ---------------------------------------------------------------------------------------------
# Matches, and running each as one block inside its scope
# ---------------------------------------------------------------------------------------------

@dataclass(eq=False)
class Match:
    ktype: str
    output: Node
    nodes: set
    shape: tuple = None       # in the kernel type's convention; None: no kernel takes it (note)
    variant: dict = field(default_factory=dict)
    note: str = ""
    label: str = ""           # the innermost module the computation is in (its class name)
    source: Node = None       # the tensor a rotary rotates (qkv_rotary finds its projection)
    outputs: tuple = ()       # values read outside besides `output` (qkv_rotary's k and v)

    @property
    def scope(self):
        return scope_name(self.label, self.ktype, self.shape, self.variant, self.note)


def find_matches(gm, example_inputs, root="forward", skip=()):
    """Every pattern's matches in a captured graph, without overlaps, most specific first. Each
    is then grown by the casts right after it and the casts and views that only feed it (a
    kernel replaces those too), and kept if it can run as one block."""
    values = _Values(gm, example_inputs)
    claimed, matches = set(), []
    for fn in (f for f in PATTERNS if f.__name__ not in skip):
        for node in list(gm.graph.nodes):
            m = fn(node, values) if node not in claimed else None
            if m is not None and _self_contained(m, claimed):
                m.label = _label(m.nodes, root)
                claimed |= m.nodes
                matches.append(m)
    for m in matches:
        while (u := _sole_user(m.output)) is not None and op(u) in CASTS and u not in claimed:
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
    return {n for n in candidates if (op(n) in VIEWS or _constant(n)) and not _mutates(n)
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
        if _mutates(n) and (n not in m.nodes or n.args[0] not in m.nodes):
            return False
        if n not in m.nodes and op(n) and op(n) != "_log_api_usage_once" \
                and (not n.users or "autocast" in op(n)):
            return False
    return True


def instrument(gm, matches):
    """Reorder the graph so each match's nodes are contiguous (nodes in between that don't
    depend on it move before it) and wrap each in its profiler scope."""
    graph = gm.graph
    owner = {n: m for m in matches for n in m.nodes}
    order = {n: i for i, n in enumerate(graph.nodes)}
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    members, deps, users = {}, {}, {}
    for n in graph.nodes:
        if n is not output:
            members.setdefault(owner.get(n, n), []).append(n)
    for unit, nodes in members.items():
        deps[unit] = {owner.get(a, a) for n in nodes for a in n.all_input_nodes} - {unit}
        for d in deps[unit]:
            users.setdefault(d, []).append(unit)
    # Topological order of the blocks, each as early as the original order has it: acyclic
    # because only a match's output is read outside it.
    ready = [(order[nodes[0]], i, unit) for i, (unit, nodes) in enumerate(members.items())
             if not deps[unit]]
    heapq.heapify(ready)
    tie = len(members)
    while ready:
        _, _, unit = heapq.heappop(ready)
        if isinstance(unit, Match):
            with graph.inserting_before(output):
                scope = graph.call_function(_enter_scope, (unit.scope,))
            for n in members[unit]:
                output.prepend(n)
            with graph.inserting_before(output):
                graph.call_function(_exit_scope, (scope,))
        elif unit.op != "placeholder":
            output.prepend(unit)
        for u in users.get(unit, ()):
            deps[u].discard(unit)
            if not deps[u]:
                tie += 1
                heapq.heappush(ready, (order[members[u][0]], tie, u))
    graph.lint()
    gm.recompile()


def _enter_scope(name):
    scope = record_function(name)
    scope.__enter__()
    return scope


def _exit_scope(scope):
    scope.__exit__(None, None, None)


def _label(nodes, root):
    """The class name of the innermost module all nodes were called in (the model's own class
    for code in its forward)."""
    common = None
    for n in nodes:
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        if common is None:
            common = stack
        else:
            k = 0
            while k < min(len(common), len(stack)) and common[k][0] == stack[k][0]:
                k += 1
            common = common[:k]
    if not common:
        return root
    cls = common[-1][1]
    return cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]


# ---------------------------------------------------------------------------------------------
# The graph's vocabulary: one name per operation however it was spelled
# ---------------------------------------------------------------------------------------------

ALIASES = {"truediv": "div", "true_divide": "div", "divide": "div", "multiply": "mul",
           "subtract": "sub", "negative": "neg", "iadd": "add", "isub": "sub", "imul": "mul",
           "itruediv": "div", "concat": "cat", "concatenate": "cat", "mT": "transpose"}
CASTS = {"to", "float", "half", "bfloat16", "double", "type", "type_as", "contiguous", "detach",
         "clone"}
VIEWS = CASTS | {"view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand",
                 "expand_as", "flatten", "unflatten", "view_as", "t", "getitem",
                 "repeat_interleave"}
RANDOM = {"dropout", "rand", "randn", "randint", "rand_like", "randn_like", "bernoulli",
          "multinomial", "normal"}
HEAVY = {"linear", "matmul", "bmm", "mm", "addmm", "baddbmm", "einsum", "conv1d", "conv2d",
         "conv3d", "scaled_dot_product_attention", "embedding"}


def op(n):
    """A node's operation by one name, however it was called (torch.mul, Tensor.mul, Tensor.mul_,
    operator.mul, operator.imul: 'mul'); None for anything but a call."""
    if not isinstance(n, Node) or n.op not in ("call_function", "call_method"):
        return None
    name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return ALIASES.get(name, name)


def _mutates(n):
    """Whether a call writes one of its inputs (in-place methods, +=, setitem, inplace=True)."""
    if not isinstance(n, Node) or n.op not in ("call_function", "call_method"):
        return False
    name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "")
    return ((name.endswith("_") and not name.endswith("__"))
            or name in ("iadd", "isub", "imul", "itruediv", "setitem")
            or n.kwargs.get("inplace") is True)


def arg(n, i, name=None, default=None):
    """Argument i of a call (the tensor a method is called on is argument 0), or its keyword."""
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default) if name else default


def shape(n):
    v = n.meta.get("example_value") if isinstance(n, Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _number(a):
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def _sole_user(n):
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def through(n, ops=CASTS):
    """The node under a chain of ops (casts unless told), and the chain: x for x.float()."""
    chain = []
    while op(n) in ops and isinstance(arg(n, 0), Node):
        chain.append(n)
        n = n.args[0]
    return n, chain


def same(a, b, depth=0):
    """Whether two nodes are one value: one node up to casts (x and x.float()), or the same call
    on the same arguments (x[..., :4] or exp(x) written twice)."""
    if not (isinstance(a, Node) and isinstance(b, Node)):
        return False
    a, b = through(a)[0], through(b)[0]
    if a is b:
        return True
    if depth > 4 or a.op != b.op or a.target != b.target or op(a) is None or _mutates(a) \
            or op(a) in RANDOM or len(a.args) != len(b.args) or a.kwargs != b.kwargs:
        return False
    return all(same(x, y, depth + 1) if isinstance(x, Node) else x == y
               for x, y in zip(a.args, b.args))


def _rows(x):
    s = shape(x)
    return (math.prod(s[:-1]), s[-1])


def _operands(n):
    """Both orders of a binary op's two arguments (for the commutative ones)."""
    a, b = arg(n, 0), arg(n, 1)
    return [(a, b), (b, a)]


def _other(n, x):
    """The argument of binary op n that is not x, or None when x is neither."""
    a, b = arg(n, 0), arg(n, 1)
    return b if a is x else a if b is x else None


def _row_reduce(n, ops, keepdim=True):
    """x for n = x.<op>(-1, keepdim=True) (any spelling of the last dim), else None."""
    if op(n) not in ops or not isinstance(arg(n, 0), Node) or shape(arg(n, 0)) is None:
        return None
    x = n.args[0]
    if not is_last_dim(arg(n, 1, "dim"), len(shape(x))) or bool(arg(n, 2, "keepdim")) != keepdim:
        return None
    return x


def _row_max(n):
    """(x, nodes) for x.amax(-1, keepdim=True) or x.max(-1, keepdim=True)[0] / .values."""
    if (x := _row_reduce(n, ("amax",))) is not None:
        return x, [n]
    if op(n) == "getitem" and arg(n, 1) == 0 \
            and (x := _row_reduce(n.args[0], ("max",))) is not None:
        return x, [n, n.args[0]]
    return None, []


def _square(n):
    """x for x * x, x ** 2, x.pow(2), x.square()."""
    o = op(n)
    if o == "pow" and arg(n, 1, "exponent") == 2 or o == "square":
        return n.args[0]
    if o == "mul" and isinstance(arg(n, 0), Node) and arg(n, 0) is arg(n, 1):
        return n.args[0]
    return None


def _sqrt(n):
    """a for sqrt(a), a ** 0.5."""
    o = op(n)
    if o == "sqrt" or o == "pow" and arg(n, 1, "exponent") == 0.5:
        return n.args[0]
    return None


def _inv_sqrt(n):
    """(a, nodes) for 1/sqrt(a): rsqrt(a), a ** -0.5, 1 / sqrt(a), reciprocal(sqrt(a))."""
    o = op(n)
    if o == "rsqrt" or o == "pow" and arg(n, 1, "exponent") == -0.5:
        return n.args[0], [n]
    root = n.args[0] if o == "reciprocal" else n.args[1] if o == "div" and arg(n, 0) == 1 else None
    if isinstance(root, Node) and (a := _sqrt(root)) is not None:
        return a, [n, root]
    return None, []


def _without_eps(a):
    """statistic for a = statistic + eps (eps a number, either order), a itself without one."""
    if op(a) != "add":
        return a
    return next((s for s, eps in _operands(a) if isinstance(s, Node) and _number(eps)), None)


def _normalized(n):
    """(data, statistic, nodes) for n = data * rsqrt(statistic + eps) or
    data / sqrt(statistic + eps), in any of the spellings above (eps the contract's argument)."""
    candidates = []
    if op(n) == "mul":
        candidates = [(d, r, _inv_sqrt) for d, r in _operands(n)]
    elif op(n) == "div":
        candidates = [(arg(n, 0), arg(n, 1), lambda r: (_sqrt(r), [r]))]
    for data, r, root in candidates:
        if not isinstance(data, Node) or not isinstance(r, Node):
            continue
        a, nodes = root(r)
        if not isinstance(a, Node):
            continue
        stat = _without_eps(a)
        if stat is not None:
            return data, stat, [n, *nodes, a]
    return None


def _after_casts(n):
    """(n's only user past a chain of single-user casts or None, the casts, the last of n and
    the casts)."""
    casts = []
    while (u := _sole_user(n)) is not None and op(u) in CASTS and arg(u, 0) is n:
        casts.append(u)
        n = u
    return _sole_user(n), casts, n


def _affine(n, size, with_bias):
    """The elementwise weight (and bias) applied after a norm's output n: vectors of the normalized
    size, in either order. Returns (output, nodes, has_weight, has_bias)."""
    out, nodes, weight, bias = n, [], False, False
    u, casts, last = _after_casts(n)
    if op(u) == "mul" and shape(_other(u, last)) == (size,):
        out, nodes, weight = u, casts + [u], True
        if with_bias:
            u, casts, last = _after_casts(out)
            if op(u) == "add" and shape(_other(u, last)) == (size,):
                out, nodes, bias = u, nodes + casts + [u], True
    elif with_bias and op(u) == "add" and shape(_other(u, last)) == (size,):
        out, nodes, bias = u, casts + [u], True
    return out, nodes, weight, bias


# ---------------------------------------------------------------------------------------------
# Concrete values of cheap nodes (a mask's construction), from the real example inputs
# ---------------------------------------------------------------------------------------------

class _Unknown(Exception):
    pass


class _Values:
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
        if n.op not in ("call_function", "call_method") or op(n) in HEAVY or _mutates(n) \
                or depth > 64:
            raise _Unknown(n)
        args, kwargs = map_arg((n.args, n.kwargs), lambda a: self._value(a, depth + 1))
        value = (n.target(*args, **kwargs) if n.op == "call_function"
                 else getattr(args[0], n.target)(*args[1:], **kwargs))
        self.known[n] = value
        return value


def _blocks_future(blocked, seq):
    """Whether a boolean mask of blocked scores, broadcast over [..., S, S], blocks exactly the
    positions after each query's own (causal)."""
    if not isinstance(blocked, torch.Tensor) or blocked.dim() < 2 \
            or tuple(blocked.shape[-2:]) != (seq, seq):
        return False
    future = torch.ones(seq, seq, dtype=torch.bool, device=blocked.device).triu(1)
    return bool((blocked == future).all())


NEG_LARGE = -1e4  # a fill at or below this is a mask (-inf, finfo.min, -1e9, -10000.0)


# ---------------------------------------------------------------------------------------------
# The patterns, in priority order: each takes a node and returns the Match that ends there
# ---------------------------------------------------------------------------------------------

def attention(n, values):
    """softmax(q @ k^T [* scale] [+ mask]) [dropout] @ v: flash_attention (B, H, S, D); causal
    when the mask blocks exactly the future, bidirectional without a mask; grouped-query heads
    when k and v are repeated (repeat_interleave, or transformers' expand + reshape)."""
    if op(n) not in ("matmul", "bmm"):
        return None
    probs, v = n.args[0], n.args[1]
    probs, nodes = through(probs)
    nodes = [n, *nodes]
    if op(probs) == "dropout":
        if arg(probs, 2, "training", True) and arg(probs, 1, "p", 0.5) != 0:
            return None
        nodes.append(probs)
        probs, casts = through(probs.args[0])
        nodes += casts
    scores, sm_nodes = _softmax_parts(probs)
    if scores is None:
        return None
    nodes += sm_nodes
    qk, peeled, mask = _scores(scores)
    if qk is None:
        return None
    nodes += peeled
    q, kt = qk.args[0], qk.args[1]
    k = _untransposed(kt)
    if k is None or not all(isinstance(t, Node) and shape(t) for t in (q, v)):
        return None
    nodes += [qk, kt]
    qs, ks, vs = shape(q), shape(k), shape(v)
    if len(qs) not in (3, 4) or len(ks) != len(qs) or len(vs) != len(qs):
        return None
    seq, dim = qs[-2], qs[-1]
    found = Match("flash_attention", n, nodes)
    if ks[-2] != seq or vs[-2] != seq:
        found.note = (f"cross attention ({seq} queries, {ks[-2]} keys): the kernel takes "
                      "self-attention")
    elif ks[-1] != dim or vs[-1] != dim:
        found.note = "value head size differs from the query's: the kernel takes one head size"
    else:
        found.shape = tuple(qs) if len(qs) == 4 else (qs[0], 1, seq, dim)
        if mask is None:
            found.variant = {"causal": False}
        elif not _blocks_future(_blocked(mask, values), seq):
            found.shape, found.note = None, "attention with a mask that is not causal"
        if found.shape and len(qs) == 4:
            heads = _kv_heads(k, qs[1])
            if heads != qs[1]:
                found.variant["kv_groups"] = qs[1] // heads
    return found


def _scores(s):
    """(q @ k^T node, nodes peeled, mask) under a scale and a mask, in either order."""
    nodes, mask = [], None
    for _ in range(3):
        s, casts = through(s)
        nodes += casts
        o = op(s)
        if o in ("matmul", "bmm"):
            return s, nodes, mask
        if o in ("mul", "div") and (_number(arg(s, 1)) or o == "mul" and _number(arg(s, 0))):
            nodes.append(s)
            s = arg(s, 0) if isinstance(arg(s, 0), Node) else arg(s, 1)
        elif mask is None and o == "masked_fill" and _number(arg(s, 2, "value")) \
                and arg(s, 2, "value") <= NEG_LARGE:
            nodes.append(s)
            mask, s = ("blocked", arg(s, 1, "mask")), s.args[0]
        elif mask is None and o == "where" and _number(arg(s, 2)) and arg(s, 2) <= NEG_LARGE:
            nodes.append(s)
            mask, s = ("kept", arg(s, 0)), arg(s, 1)
        elif mask is None and o == "add":
            a, b = arg(s, 0), arg(s, 1)
            if not (isinstance(a, Node) and isinstance(b, Node)):
                return None, [], None
            # the scores are the side that leads to q @ k^T
            scores, other = (a, b) if _scores_path(a) else (b, a)
            nodes.append(s)
            mask, s = ("additive", other), scores
        else:
            return None, [], None
    return None, [], None


def _scores_path(n):
    for _ in range(4):
        n, _casts = through(n)
        if op(n) in ("matmul", "bmm"):
            return True
        if op(n) not in ("mul", "div", "masked_fill", "where", "add"):
            return False
        n = arg(n, 0) if op(n) != "where" else arg(n, 1)
    return False


def _blocked(mask, values):
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


def _untransposed(kt):
    """k for k.transpose(-2, -1), k.mT, k.permute(... last two swapped)."""
    s = shape(kt)
    if s is None:
        return None
    nd, o = len(s), op(kt)
    if o == "transpose":
        dims = [arg(kt, 1), arg(kt, 2)] if len(kt.args) > 1 else [-2, -1]  # mT has none
        if sorted(d % nd for d in dims) == [nd - 2, nd - 1]:
            return kt.args[0]
    if o == "permute":
        perm = list(kt.args[1:]) if len(kt.args) > 2 else list(arg(kt, 1, "dims"))
        if [p % nd for p in perm] == list(range(nd - 2)) + [nd - 1, nd - 2]:
            return kt.args[0]
    return None


def _kv_heads(k, heads):
    """The key heads before a repeat to `heads` (repeat_interleave, expand + reshape)."""
    n, repeated = k, False
    for _ in range(8):
        if op(n) in ("repeat_interleave", "expand", "repeat"):
            repeated = True
        elif repeated and shape(n) and len(shape(n)) == 4:
            h = shape(n)[1]
            return h if h < heads and heads % h == 0 else heads
        if op(n) not in VIEWS | {"repeat"} or not isinstance(arg(n, 0), Node):
            break
        n = n.args[0]
    if repeated and shape(n) and len(shape(n)) == 4 and heads % shape(n)[1] == 0:
        return shape(n)[1]
    return heads


def _softmax_parts(n):
    """(x, nodes) for a softmax of x over the last dim: a softmax call, or exp(x - max(x)) /
    sum(exp(...)) written out (the max may be left out); (None, []) otherwise."""
    if op(n) == "softmax":
        x = arg(n, 0)
        return (x, [n]) if shape(x) and is_last_dim(arg(n, 1, "dim"), len(shape(x))) else (None, [])
    if op(n) == "div":
        e, s, extra = arg(n, 0), arg(n, 1), []
    elif op(n) == "mul":
        pair = next(((e, r) for e, r in _operands(n) if op(r) == "reciprocal"), None)
        if pair is None:
            return None, []
        e, s, extra = pair[0], pair[1].args[0], [pair[1]]
    else:
        return None, []
    e, casts = through(e)
    if op(e) != "exp" or not isinstance(s, Node) or not same(_row_reduce(s, ("sum",)), e):
        return None, []
    nodes = [n, *extra, *casts, e, s, *through(s.args[0])[1]]
    z = e.args[0]
    if op(z) == "sub":
        x, (mx, mnodes) = z.args[0], _row_max(z.args[1])
        if not same(mx, x):
            return None, []
        return x, nodes + [z, *mnodes]
    return z, nodes


def cross_entropy(n, values):
    """nll_loss(log_softmax(x, -1), t), or the mean of -log_softmax(x).gather(-1, t): mean
    cross_entropy over the rows of x (M, V)."""
    if op(n) == "nll_loss":
        logp, target = arg(n, 0), arg(n, 1, "target")
        if arg(n, 2, "weight") is not None or arg(n, 6, "reduction", "mean") != "mean" \
                or arg(n, 4, "ignore_index", -100) != -100:
            return None  # class weights, a sum, an ignored class: not the kernel's loss
        nodes = [n]
    else:
        logp, target, nodes = _gathered_mean(n)
        if logp is None:
            return None
    logp, views = through(logp, VIEWS)
    x, lnodes = _log_softmax_parts(logp)
    if x is None or not isinstance(target, Node) or shape(target) is None:
        return None
    target, tviews = through(target, VIEWS)
    rows = _rows(x)
    if math.prod(shape(target)) != rows[0]:
        return None
    return Match("cross_entropy", n, nodes + views + lnodes + tviews, rows)


def _gathered_mean(n):
    """(logp, targets, nodes) for -(logp.gather(-1, t[:, None])).mean() in either order."""
    nodes, seen = [], set()
    while op(n) in ("neg", "mean", "squeeze") and len(nodes) < 4:
        if op(n) == "mean" and (len(n.args) > 1 or "dim" in n.kwargs):
            return None, None, []
        seen.add(op(n))
        nodes.append(n)
        n = n.args[0]
    if not {"neg", "mean"} <= seen or op(n) != "gather":
        return None, None, []
    logp, index = arg(n, 0), arg(n, 2, "index")
    if not shape(logp) or not is_last_dim(arg(n, 1, "dim"), len(shape(logp))) \
            or not isinstance(index, Node):
        return None, None, []
    return logp, index, nodes + [n]


def _log_softmax_parts(n):
    """(x, nodes) for log_softmax(x, -1), x - x.logsumexp(-1, keepdim=True), log(softmax(x))."""
    o = op(n)
    if o == "log_softmax" and shape(arg(n, 0)) and is_last_dim(arg(n, 1, "dim"),
                                                               len(shape(arg(n, 0)))):
        return n.args[0], [n]
    if o == "sub" and same(_row_reduce(arg(n, 1), ("logsumexp",)), arg(n, 0)):
        return n.args[0], [n, n.args[1]]
    if o == "log":
        x, nodes = _softmax_parts(through(n.args[0])[0])
        if x is not None:
            return x, [n, *through(n.args[0])[1], *nodes]
    return None, []


def fused_mlp(n, values):
    """down(act(gate(x)) * up(x)) with nn.Linear/F.linear projections: fused_mlp (M, D, F) for
    SwiGLU (silu, or g * sigmoid(g)); GeGLU (gelu) and projections with a bias are noted."""
    if op(n) != "linear" or op(arg(n, 0)) != "mul":
        return None
    h = n.args[0]
    for a, u in _operands(h):
        act, g, anodes = _activation(a)
        gate_up = _gate_up(g, u)
        if act is None or gate_up is None:
            continue
        x, projections, pnodes = gate_up
        m = Match("fused_mlp", n, [n, h, *anodes, *pnodes])
        notes = []
        if act != "silu":
            notes.append(f"{act}(gate) * up: the fused_mlp kernel computes silu(gate) * up")
        if any(arg(p, 2, "bias") is not None for p in (*projections, n)):
            notes.append("projections with a bias: the fused_mlp kernel takes none")
        if notes:
            m.note = "; ".join(notes)
        else:
            m.shape = (*_rows(x), shape(g)[-1])
        return m
    return None


def _activation(a):
    """(name, gate, nodes) for silu(g), g * sigmoid(g), gelu(g)."""
    if op(a) in ("silu", "gelu") and isinstance(arg(a, 0), Node):
        return op(a), a.args[0], [a]
    if op(a) == "mul":
        for g, s in _operands(a):
            if op(s) == "sigmoid" and same(arg(s, 0), g):
                return "silu", g, [a, s]
    return None, None, []


def _gate_up(g, u):
    """(x, projections, nodes) when g and u are two projections of one x: two linears, or the
    two halves of one (chunk or split of a fused gate_up projection)."""
    if op(g) == "linear" and op(u) == "linear" and same(arg(g, 0), arg(u, 0)):
        return g.args[0], [g, u], [g, u]
    if op(g) == op(u) == "getitem" and arg(g, 0) is arg(u, 0) and (arg(g, 1), arg(u, 1)) == (0, 1):
        parts = g.args[0]
        fused = arg(parts, 0)
        if op(parts) in ("chunk", "split") and op(fused) == "linear" and shape(fused) \
                and is_last_dim(arg(parts, 2, "dim"), len(shape(fused))) \
                and shape(g) == shape(u) and 2 * shape(g)[-1] == shape(fused)[-1]:
            return fused.args[0], [fused], [g, u, parts, fused]
    return None


def projection_gelu(n, values):
    """gelu(F.linear(x, W, b)) or gelu(torch.addmm(b, x, W)) (transformers' Conv1D), the GELU
    the projection's only reader: matmul (M, N, K) with the activation in its epilogue
    ({"activation": "gelu_tanh" | "gelu"}, and {"bias": True} with a bias)."""
    if op(n) != "gelu" or not isinstance(arg(n, 0), Node):
        return None
    p = n.args[0]
    if _sole_user(p) is not n or shape(p) is None:
        return None
    if op(p) == "linear":
        x, bias = arg(p, 0), arg(p, 2, "bias")
    elif op(p) == "addmm" and arg(p, 3, "beta", 1) == 1 and arg(p, 4, "alpha", 1) == 1:
        bias, x = arg(p, 0), arg(p, 1)
    else:
        return None
    if shape(x) is None:
        return None
    approximate = arg(n, 1, "approximate", "none")
    activation = {"tanh": "gelu_tanh", "none": "gelu"}.get(approximate)
    if activation is None:
        return None
    M, K = _rows(x)
    m = Match("matmul", n, [n, p], shape=(M, shape(p)[-1], K))
    m.variant = {"activation": activation, **({"bias": True} if bias is not None else {})}
    return m


def rotary(n, values):
    """Rotary embedding: half-split (x * cos + rotate_half(x) * sin, with rotate_half as
    cat(-x2, x1); or cat(x1*cos - x2*sin, x2*cos + x1*sin)) is rotary_embedding (B, H, S, D);
    interleaved pairs (x[..., ::2] with x[..., 1::2]: stack + flatten, or complex numbers) are
    noted: the kernel pairs the halves."""
    o = op(n)
    if o == "add":
        for xc, rs in _operands(n):
            if op(xc) != "mul" or op(rs) != "mul":
                continue
            for r, sin in _operands(rs):
                x, rnodes, pairing = _rotated(r)
                if x is None:
                    continue
                cos = next((c for d, c in _operands(xc) if same(d, x)), None)
                if isinstance(cos, Node) and isinstance(sin, Node):
                    return _rotary_match(n, [n, xc, rs, *rnodes], x, cos, pairing)
    if o == "cat" and is_last_dim(arg(n, 1, "dim", 0), len(shape(n) or ())):
        parts = arg(n, 0)
        if len(parts) == 2 and (found := _rotation(*parts, _half)):
            x, cos, nodes = found
            return _rotary_match(n, [n, *nodes], x, cos, "half")
    if o in ("flatten", "reshape", "view") and shape(n) is not None:
        inner = arg(n, 0)
        if op(inner) == "stack" and len(arg(inner, 0)) == 2 and arg(inner, 1, "dim", 0) in (
                -1, len(shape(inner)) - 1):
            if (found := _rotation(*arg(inner, 0), _every_other)):
                x, cos, nodes = found
                return _rotary_match(n, [n, inner, *nodes], x, cos, "interleaved")
        if op(inner) == "view_as_real" and op(arg(inner, 0)) == "mul":
            for c, f in _operands(inner.args[0]):
                if op(c) == "view_as_complex" and op(arg(c, 0)) in ("reshape", "view"):
                    x, casts = through(c.args[0].args[0])
                    if shape(x) and shape(x)[-1] == shape(n)[-1]:
                        return _rotary_match(n, [n, inner, inner.args[0], c, c.args[0], *casts],
                                             x, f, "interleaved")
    return None


def _rotated(r):
    """(x, nodes, pairing) for the rotated copy of x: cat(-x2, x1) of its halves, or the pairs
    (-x_odd, x_even) stacked and flattened."""
    if op(r) == "cat" and len(arg(r, 0)) == 2 and is_last_dim(arg(r, 1, "dim", 0),
                                                              len(shape(r) or ())):
        a, b = arg(r, 0)
        if op(a) == "neg" and _half(a.args[0])[1] == 1 and _half(b)[1] == 0 \
                and _half(a.args[0])[0] is _half(b)[0]:
            return _half(b)[0], [r, a, a.args[0], b], "half"
    if op(r) in ("flatten", "reshape", "view") and op(arg(r, 0)) == "stack":
        st = r.args[0]
        if len(arg(st, 0)) == 2:
            a, b = arg(st, 0)
            if op(a) == "neg" and _every_other(a.args[0])[1] == 1 and _every_other(b)[1] == 0 \
                    and _every_other(a.args[0])[0] is _every_other(b)[0]:
                return _every_other(b)[0], [r, st, a, a.args[0], b], "interleaved"
    return None, [], None


def _rotation(first, second, split):
    """(x, cos, nodes) for [x1*cos - x2*sin, x2*cos + x1*sin] where split(x) gives x1 and x2
    (each product in either order, the sum's terms too)."""
    if op(first) != "sub" or op(second) != "add":
        return None
    a, b = arg(first, 0), arg(first, 1)
    if op(a) != "mul" or op(b) != "mul":
        return None
    for x1, cos in _operands(a):
        for x2, sin in _operands(b):
            (xa, ia), (xb, ib) = split(x1), split(x2)
            if xa is None or xa is not xb or (ia, ib) != (0, 1):
                continue
            for c, d in _operands(second):
                if _product_of(c, x2, cos) and _product_of(d, x1, sin):
                    return xa, cos, [first, second, a, b, c, d, x1, x2]
    return None


def _product_of(m, p, q):
    """Whether m is p * q in either order (up to casts)."""
    return op(m) == "mul" and any(same(u, p) and same(v, q) for u, v in _operands(m))


def _half(n):
    """(x, 0 or 1) when n is the first or second half of x along the last dim (a slice, chunk,
    split or narrow), else (None, None)."""
    o = op(n)
    if o == "getitem" and op(arg(n, 0)) in ("chunk", "split") and arg(n, 1) in (0, 1):
        parts = n.args[0]
        x = arg(parts, 0)
        if shape(x) and is_last_dim(arg(parts, 2, "dim", 0), len(shape(x))) \
                and shape(n)[-1] * 2 == shape(x)[-1]:
            return x, n.args[1]
    if o == "narrow" and shape(arg(n, 0)):
        x, d, start, length = n.args[:4]
        size = shape(x)[-1]
        if is_last_dim(d, len(shape(x))) and length * 2 == size and start in (0, size // 2):
            return x, int(start != 0)
    sl = _last_slice(n)
    if sl is not None:
        x, s, size = sl
        if s.step in (None, 1):
            if s.start in (None, 0) and s.stop == size // 2:
                return x, 0
            if s.start == size // 2 and s.stop in (None, size) and size % 2 == 0:
                return x, 1
    return None, None


def _every_other(n):
    """(x, 0 or 1) for x[..., 0::2] or x[..., 1::2], else (None, None)."""
    sl = _last_slice(n)
    if sl is not None and sl[1].step == 2 and sl[1].stop is None and sl[1].start in (None, 0, 1):
        return sl[0], int(sl[1].start == 1)
    return None, None


def _last_slice(n):
    """(x, slice, size) when n is x indexed by a slice of its last dim only."""
    if op(n) != "getitem" or not isinstance(arg(n, 0), Node) or not shape(arg(n, 0)):
        return None
    x, index = n.args[0], n.args[1]
    nd = len(shape(x))
    index = index if isinstance(index, tuple) else (index,)
    if not index or not isinstance(index[-1], slice):
        return None
    full = slice(None, None, None)
    lead = index[:-1]
    if not (lead == (Ellipsis,) or (len(index) == nd and all(i == full for i in lead))):
        return None
    return x, index[-1], shape(x)[-1]


def _rotary_match(n, nodes, x, cos, pairing):
    """The rotary Match: (B, H, S, D) of x with the positions on the dim the tables follow."""
    m = Match("rotary_embedding", n, nodes, source=x)
    s, t = shape(x), shape(cos)
    if pairing != "half":
        m.note = ("interleaved pairs (even with odd elements): the rotary_embedding kernel "
                  "pairs the halves (x[..., :D/2] with x[..., D/2:])")
    elif s is None or len(s) != 4:
        m.note = f"rotary on a tensor of rank {len(s or ())}: the kernel takes x[B, H, S, D]"
    elif t and len(t) >= 3 and t[-2] == 1 and t[-3] == s[1] and s[1] > 1:
        m.shape = (s[0], s[2], s[1], s[3])      # x[B, S, H, D]: positions on dim 1
    else:
        m.shape = s
    return m


def qkv_rotary(n, values):
    """Two rotaries (half-split) of linear projections of one input h, and a third projection
    of h the size of the second (v): an attention layer's q/k/v, qkv_rotary (B, S, K, Hq, Hkv,
    D); or the three as consecutive slices of one projection's columns (Phi-3's qkv_proj).
    Found at the first rotary; it claims the projections, the views between them and the
    rotations; q and k rotated and v's view are read outside it."""
    first = rotary(n, values)
    found = first and first.shape and _projection(first.source)
    if not found:
        return None
    h = arg(found[0], 0)
    for other in list(n.graph.nodes):
        second = rotary(other, values) if other is not n else None
        found2 = second and second.shape and _projection(second.source)
        if found2 and arg(found2[0], 0) is h and (found2[0] is not found[0]) == (found[2] is None):
            break
    else:
        return None
    # q has at least as many heads as k (grouped-query attention shares k among q heads); of
    # one projection's slices, q's comes first
    (q, (lin_q, views_q, cols_q)), (k, (lin_k, views_k, cols_k)) = sorted(
        [(first, found), (second, found2)],
        key=lambda p: (-p[0].shape[1], 0) if p[1][2] is None else (0, p[1][2].start or 0))
    if cols_q is None:
        v = next((u for u in h.users if op(u) == "linear" and u not in (lin_q, lin_k)
                  and shape(u)[-1] == shape(lin_k)[-1] and _biased_like(u, lin_k)), None)
        if v is None or not _biased_like(lin_q, lin_k):
            return None
    else:  # q, k and v: columns [0, a), [a, b) and [b, N) of the one projection
        v = next((u for u in lin_q.users if (sl := _last_slice(u)) and sl[1].step in (None, 1)
                  and sl[1].start == cols_k.stop and sl[1].stop in (None, sl[2])), None)
        if v is None or cols_q.start not in (None, 0) or cols_q.stop != cols_k.start:
            return None
    v_views, last = [], v
    while len(last.users) == 1 and op(u := next(iter(last.users))) in ("view", "reshape",
                                                                         "transpose"):
        v_views.append(u)
        last = u
    (B, Hq, S, D), Hkv = q.shape, k.shape[1]
    (out1, joins1), (out2, joins2) = _rejoined(first), _rejoined(second)
    nodes = {*q.nodes, *k.nodes, lin_q, lin_k, v, *views_q, *views_k, *v_views, *joins1,
             *joins2}
    # a spelling that slices q (or k) twice: the second slices read q too
    nodes |= {u for t in (q.source, k.source) for u in t.users
              if op(u) in VIEWS and all(w in nodes for w in u.users)}
    m = Match("qkv_rotary", out1, nodes, (B, S, shape(h)[-1], Hq, Hkv, D),
              {"bias": True} if _bias_of(lin_q) is not None else {},
              outputs=(out2, last))
    return m if k.shape[::2] == (B, S) and k.shape[3] == D \
        and shape(lin_q)[-1] in (Hq * D, (Hq + 2 * Hkv) * D) else None


def _whole_slice(x):
    """y when x is y[..., :n] with n at least y's last dim (all of it), else None."""
    sl = _last_slice(x)
    if sl is not None and sl[1].start in (None, 0) and sl[1].step in (None, 1) \
            and (sl[1].stop is None or sl[1].stop >= sl[2]):
        return sl[0]
    return None


def _rejoined(r):
    """(output, extra nodes) of a rotary match: Phi-3 rotates x[..., :d] (d the tables' width)
    and puts back cat([rotated, x[..., d:]], -1); where d covers all of x, the cat and the empty
    slice are part of the rotary (the cat is its output)."""
    y = _whole_slice(r.source)
    users = list(r.output.users)
    if y is not None and len(users) == 1 and op(users[0]) == "cat":
        cat = users[0]
        parts = arg(cat, 0)
        rest = _last_slice(parts[1]) if len(parts) == 2 and parts[0] is r.output else None
        if rest is not None and rest[0] is y and rest[1].start == rest[2] \
                and is_last_dim(arg(cat, 1, "dim", 0), len(shape(cat) or ())):
            return cat, (cat, parts[1])
    return r.output, ()


def _projection(x):
    """(linear, the views after it, None) when x is a linear projection seen through views (the
    view(B, S, H, D).transpose(1, 2) of an attention layer); (linear, views, the slice) when x is
    a slice of a projection's columns seen through views; else None."""
    whole = _whole_slice(x)
    first = [x] if whole is not None else []
    x, views = through(whole if whole is not None else x,
                       VIEWS - {"getitem", "expand", "expand_as", "repeat_interleave"})
    views = first + views
    if op(x) == "linear":
        return x, views, None
    sl = _last_slice(x)
    if sl is not None and op(sl[0]) == "linear" and sl[1].step in (None, 1):
        return sl[0], views + [x], sl[1]
    return None


def _bias_of(lin):
    return arg(lin, 2, "bias")


def _biased_like(a, b):
    return (_bias_of(a) is None) == (_bias_of(b) is None)


def layernorm(n, values):
    """(x - mean) / sqrt(var + eps) or (x - mean) * rsqrt(var + eps) over the last dim, var the
    biased variance (mean of squares of x - mean, var(unbiased=False), var_mean), then an
    optional weight and bias: layernorm (M, N)."""
    found = _normalized(n)
    if found is None or op(found[0]) != "sub":
        return None
    centered, stat, nodes = found
    x, mu = centered.args[0], centered.args[1]
    if not isinstance(mu, Node):
        return None
    if (m := _row_reduce(mu, ("mean",))) is not None and same(m, x):
        mean_nodes = [mu]
    elif op(mu) == "getitem" and arg(mu, 1) == 1 and _biased_var_mean(mu.args[0], x):
        mean_nodes = [mu, mu.args[0]]
    else:
        return None
    sq = _row_reduce(stat, ("mean",))
    c = _square(sq) if sq is not None else None
    if c is not None and (c is centered or op(c) == "sub" and same(c.args[0], x)
                          and same(c.args[1], mu)):
        var_nodes = [stat, sq, c]
    elif op(stat) == "var" and _biased(stat) and _row_reduce(stat, ("var",)) is not None \
            and same(stat.args[0], x):
        var_nodes = [stat]
    elif op(stat) == "getitem" and arg(stat, 1) == 0 and arg(stat, 0) is arg(mu, 0) \
            and op(mu) == "getitem":
        var_nodes = [stat]
    else:
        return None
    size = shape(x)[-1]
    out, tail, weight, bias = _affine(n, size, with_bias=True)
    return Match("layernorm", out, nodes + [centered, *mean_nodes, *var_nodes, *tail],
                 _rows(x), {} if weight or bias else {"affine": False})


def _biased(n):
    return n.kwargs.get("unbiased", arg(n, 2) if len(n.args) > 2 else True) is False \
        or n.kwargs.get("correction") == 0


def _biased_var_mean(n, x):
    return op(n) == "var_mean" and _biased(n) and _row_reduce(n, ("var_mean",)) is not None \
        and same(n.args[0], x)


def rmsnorm(n, values):
    """x * rsqrt(mean(x^2) + eps) over the last dim (x*x, x**2, pow, square; rsqrt, 1/sqrt,
    ** -0.5; or x / sqrt(...)), then an optional weight: rmsnorm (M, N)."""
    found = _normalized(n)
    if found is None:
        return None
    data, stat, nodes = found
    sq = _row_reduce(stat, ("mean",))
    x = _square(sq) if sq is not None else None
    if x is None or not same(x, data) or shape(x) is None:
        return None
    out, tail, weight, _ = _affine(n, shape(x)[-1], with_bias=False)
    return Match("rmsnorm", out, nodes + [stat, sq, *tail], _rows(x),
                 {} if weight else {"affine": False})


def softmax(n, values):
    """A softmax over the last dim written out (exp, sum, divide): softmax (M, N). A softmax
    call is one op: recognize.py names it without a scope."""
    if op(n) == "softmax":
        return None
    x, nodes = _softmax_parts(n)
    if x is None or shape(x) is None:
        return None
    return Match("softmax", n, nodes, _rows(x))


PATTERNS = [attention, cross_entropy, fused_mlp, projection_gelu, qkv_rotary, rotary, layernorm,
            rmsnorm, softmax]
