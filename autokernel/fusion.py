"""
Fusions torch.compile cannot make across a kernel: a pass over the compiled graph that folds the
ops around the kernels' custom ops into their arguments.

Inductor sees each kernel as one opaque node and fuses nothing into it, so in a block's
`x = x + proj(h)` with proj our matmul, the projection's output makes a trip through memory of
its own (written by the kernel, read back by inductor's add, or by the add it fused into the
next norm). The pass rewrites

    add(x, view(matmul(A, B, bias, activation)))
        -> view(matmul(A, B, bias, activation, residual=reshape(x, [-1, N])))

and the same for fused_mlp (an MLP's `x + mlp(h)`: the residual goes into its down projection),
where the kernel's output has no other use (nor is x: y + y stays), x has the add's shape and
dtype (no broadcast, no type promotion) and the kernel file takes `residual` (files written
before the argument do not). And a pre-norm block's LayerNorm, when our layernorm kernel's only
use is a projection by our matmul kernel:

    matmul(views(layernorm(x, w, b, eps)), B, ...)
        -> matmul(views(x), B, ..., ln_weight=w, ln_bias=b, ln_eps=eps)

so the normalized rows never go through memory (the matmul kernel takes the statistics from
its A tiles). Not where B is vocabulary-wide (N > LN_FOLD_MAX_N): the kernel's tile order for
a norm reads B once per row block. Both run as inductor's post-grad custom pass (aten ops,
functional, after dead code is gone), installed by a compiled swap around its compiles
(Swap.installed); the pass then gives every kernel op its lowering (give_fallbacks).
"""
import contextlib
import hashlib
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import autokernel
from autokernel import ops

aten = torch.ops.aten
SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # the pass's cache key
VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}


def _is(node, targets):
    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and node.target in targets


def _arguments(node):
    """The op node's arguments in schema order, defaults filled in: [(name, value)]."""
    schema = node.target._schema.arguments
    values = list(node.args) + [node.kwargs.get(a.name, a.default_value)
                                for a in schema[len(node.args):]]
    return [(a.name, v) for a, v in zip(schema, values)]


def _takes(op, arg):
    """Whether op is a kernel op whose type has the argument (residual: matmul and fused_mlp;
    ln_eps: matmul) and whose kernel file takes it (files written before it do not)."""
    ktype = ops.kernel_type_of(op)
    return ktype is not None and arg in autokernel.KERNEL_TYPES[ktype].args \
        and ops.accepts(op, arg)


def _projection(operand, out):
    """(kernel node, views from it up to operand) when operand is the output of a kernel that
    may take a residual, seen through single-use views and shaped like the add's output; else
    None."""
    views, node = [], operand
    while _is(node, VIEWS) and len(node.users) == 1:
        views.append(node)
        node = node.args[0]
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and _takes(node.target, "residual") and len(node.users) == 1
            and dict(_arguments(node)).get("residual") is None):
        return None
    val = operand.meta.get("val")
    if val is None or tuple(val.shape) != tuple(out.shape):
        return None
    return node, views


def _foldable(add):
    """(kernel node, its views up to the add, x) when add is x + a matmul's or fused_mlp's
    output that fold_residual_adds may rewrite; else None."""
    if not _is(add, {aten.add.Tensor}) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    out = add.meta.get("val")
    for operand, x in (add.args, reversed(add.args)):
        found = _projection(operand, out) if out is not None else None
        x_val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if found is None or x_val is None or tuple(x_val.shape) != tuple(out.shape) \
                or x_val.dtype != out.dtype:
            continue
        mm, views = found
        if x is operand or x is mm or x in views:  # y + y: the residual would be the output
            continue
        if isinstance(mm.meta["val"].shape[-1], int) and mm.meta["val"].dtype == out.dtype:
            return mm, views, x
    return None


def _fold(graph, add, mm, views, x):
    """add(x, views(mm)) -> views(mm with residual x as rows), placed where the add was (x may
    be computed after mm: the new nodes and the views go just before the add)."""
    n = mm.meta["val"].shape[-1]
    with graph.inserting_before(add):
        rows = graph.call_function(aten.reshape.default, (x, [-1, n]))
        rows.meta["val"] = x.meta["val"].reshape(-1, n)
        # the call as it was, residual by name (inductor's lowering of a custom op expects the
        # arguments as the graph gave them, not every default spelled out)
        fused = graph.call_function(mm.target, mm.args, {**mm.kwargs, "residual": rows})
        fused.meta = dict(mm.meta)
    for view in reversed(views):  # innermost first: each lands just before the add, in order
        add.prepend(view)
    if views:
        views[-1].replace_input_with(mm, fused)
    add.replace_all_uses_with(views[0] if views else fused)
    graph.erase_node(add)
    graph.erase_node(mm)


def fold_residual_adds(graph):
    """Rewrite every add(x, a matmul's or fused_mlp's output) of the graph as the kernel's
    residual (see the module's docstring). Returns how many were folded."""
    folded = 0
    for add in list(graph.nodes):
        found = _foldable(add)
        if found:
            _fold(graph, add, *found)
            folded += 1
    return folded


LN_FOLD_MAX_N = 16384  # the widest projection a LayerNorm is folded into (see the docstring)


def _normed_projection(ln):
    """(matmul node, views from ln up to its A, the norm's arguments) when a layernorm op's
    output is used only as the A of a matmul that may take the norm, through single-use views;
    else None."""
    views, node = [], ln
    while len(node.users) == 1 and _is(next(iter(node.users)), VIEWS):
        node = next(iter(node.users))
        views.append(node)
    if len(node.users) != 1:
        return None
    mm = next(iter(node.users))
    if not (mm.op == "call_function" and _takes(mm.target, "ln_eps")):
        return None
    args, norm = dict(_arguments(mm)), dict(_arguments(ln))
    out, x, rows = (n.meta.get("val") if isinstance(n, torch.fx.Node) else None
                    for n in (mm, norm["x"], node))
    if args["A"] is not node or args.get("ln_eps") is not None or None in (out, x, rows) \
            or not isinstance(out.shape[-1], int) or out.shape[-1] > LN_FOLD_MAX_N \
            or x.shape[-1] != rows.shape[-1]:  # the norm's rows are the product's rows
        return None
    return mm, views, norm


def fold_layernorms(graph):
    """Rewrite every layernorm op whose only use is a matmul's A as that matmul's norm (see the
    module's docstring). Returns how many were folded."""
    folded = 0
    for ln in list(graph.nodes):
        if not (ln.op == "call_function" and ops.kernel_type_of(ln.target) == "layernorm"):
            continue
        found = _normed_projection(ln)
        if found is None:
            continue
        mm, views, norm = found
        with graph.inserting_before(mm):
            rows = norm["x"]
            for view in views:  # the same views, of x (shaped as the norm's output)
                rows = graph.call_function(view.target, (rows, *view.args[1:]), view.kwargs)
                rows.meta["val"] = view.meta["val"]
            fused = graph.call_function(mm.target, (rows, *mm.args[1:]), {
                **mm.kwargs, "ln_weight": norm["weight"], "ln_bias": norm["bias"],
                "ln_eps": norm["eps"]})
            fused.meta = dict(mm.meta)
        mm.replace_all_uses_with(fused)
        graph.erase_node(mm)
        for view in reversed(views):
            graph.erase_node(view)
        graph.erase_node(ln)
        folded += 1
    return folded


def give_fallbacks(graph):
    """Each kernel op in the graph gets inductor's fallback lowering now, the one inductor would
    give it (the same layout constraint), so inductor never takes its implicit path for it: that
    path logs the op's arguments first, and torch 2.11 formats that line whether it is logged
    or not, printing the IR behind each argument as a tree (shared inputs printed again on each
    path to them): with GPT-2's norms folded into its projections, compiling the model hung in
    that formatting for minutes on the H100. (Later torch formats it only when logged.)"""
    from torch._inductor import lowering
    for node in graph.nodes:
        op = node.target
        if node.op == "call_function" and ops.kernel_type_of(op) is not None \
                and op not in lowering.lowerings:
            tag = lowering.get_layout_constraint_tag(op, with_default=True)
            lowering.make_fallback(op, layout_constraint=lowering.tag_to_layout_constraint(tag),
                                   warn=False)


class FusionPass(CustomGraphPass):
    """The pass as inductor takes it: a callable on the graph with a uuid for its cache: this
    file's hash (a change to the pass invalidates what it compiled) and which kernel ops take a
    residual and a norm now (a kernel file reverted to one without them must not get a folded
    graph from the cache)."""

    def __init__(self, then=None):
        # post-grad passes installed already (one, or a list): they run after ours
        self.then = [] if then is None else list(then) if isinstance(then, (list, tuple)) \
            else [then]

    def __call__(self, graph):
        fold_residual_adds(graph)
        fold_layernorms(graph)
        give_fallbacks(graph)
        for then in self.then:
            then(graph)

    def uuid(self):
        if not all(hasattr(then, "uuid") for then in self.then):
            return None  # a plain callable's result cannot be keyed: inductor skips its cache
        parts = [SOURCE_HASH, *ops.taking("residual"), *ops.taking("ln_eps"),
                 *(str(then.uuid()) for then in self.then)]
        return ":".join(parts)


@contextlib.contextmanager
def installed():
    """The fusion pass in inductor's post-grad custom pass slot, for compiles inside the block
    (after any pass already there)."""
    import torch._inductor.config as config
    with config.patch(post_grad_custom_post_pass=FusionPass(config.post_grad_custom_post_pass)):
        yield
