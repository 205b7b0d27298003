"""
The patterns: each kernel type's computation as models write it, recognized in a captured FX
graph whoever wrote it (autokernel/graph_capture.py captures, autokernel/matches.py selects).

A pattern takes a node and the graph's NodeValues (autokernel/mask_values.py) and returns the
Match that ends at that node, or None. PATTERNS is in priority order: a pattern that contains
another's computation comes first (attention before the softmax inside it, qkv_rotary before
the rotaries it is made of). The rotary family lives in autokernel/patterns_rotary.py.
"""
import math

from torch.fx import Node

from autokernel.fx_vocabulary import (VIEWS, affine, arg, normalized, number, op, operands,
                                      row_max, row_reduce, row_shape, same, shape, sole_user,
                                      square, through)
from autokernel.mask_values import NEG_LARGE, blocked_scores, blocks_future
from autokernel.matches import Match
from autokernel.patterns_rotary import qkv_rotary, rotary
from autokernel.recognize import is_last_dim


def attention(n, values):
    """softmax(q @ k^T [* scale] [+ mask]) [dropout] @ v: flash_attention (B, H, S, D); causal
    when the mask blocks exactly the future, bidirectional without a mask; grouped-query heads
    when k and v are repeated (repeat_interleave, or transformers' expand + reshape)."""
    if op(n) not in ("matmul", "bmm"):
        return None
    probs, v = n.args[0], n.args[1]
    if not isinstance(v, Node):
        return None
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
    qk, peeled, mask, scale = _scores(scores)
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
    # What a kernel call takes in place of the match (autokernel/swap_graph.py): the tensors
    # that feed q @ k^T and the weighted sum, the scale the scores are multiplied by, the mask.
    found.operands = {"q": q, "k": k, "v": v, "scale": scale, "mask": mask and mask[1]}
    if ks[-2] != seq or vs[-2] != seq:
        found.note = (f"cross attention ({seq} queries, {ks[-2]} keys): the kernel takes "
                      "self-attention")
    elif ks[-1] != dim or vs[-1] != dim:
        found.note = "value head size differs from the query's: the kernel takes one head size"
    else:
        found.shape = tuple(qs) if len(qs) == 4 else (qs[0], 1, seq, dim)
        if mask is None:
            found.variant = {"causal": False}
        elif not blocks_future(blocked_scores(mask, values), seq):
            found.shape, found.note = None, "attention with a mask that is not causal"
        if found.shape and len(qs) == 4:
            heads, k_heads = _kv_heads(k, qs[1])
            if heads != qs[1]:
                found.variant["kv_groups"] = qs[1] // heads
                v_heads = _kv_heads(v, qs[1])
                # the kernel reads each key/value head once: k and v before their repeat
                if v_heads[0] == heads and shape(v_heads[1]) == shape(k_heads):
                    found.operands.update(k=k_heads, v=v_heads[1])
                else:
                    found.operands.update(k=None, v=None)
    return found


def _scores(s):
    """(q @ k^T node, nodes peeled, mask, scale) under a scale and a mask, in either order; the
    scale is what q @ k^T is multiplied by (1.0 when it is not scaled)."""
    nodes, mask, scale = [], None, 1.0
    for _ in range(3):
        s, casts = through(s)
        nodes += casts
        o = op(s)
        if o in ("matmul", "bmm"):
            return s, nodes, mask, scale
        if o in ("mul", "div") and (number(arg(s, 1)) or o == "mul" and number(arg(s, 0))):
            nodes.append(s)
            factor = arg(s, 1) if number(arg(s, 1)) else arg(s, 0)
            scale = scale * factor if o == "mul" else scale / factor
            s = arg(s, 0) if isinstance(arg(s, 0), Node) else arg(s, 1)
        elif mask is None and o == "masked_fill" and number(arg(s, 2, "value")) \
                and arg(s, 2, "value") <= NEG_LARGE:
            nodes.append(s)
            mask, s = ("blocked", arg(s, 1, "mask")), s.args[0]
        elif mask is None and o == "where" and number(arg(s, 2)) and arg(s, 2) <= NEG_LARGE:
            nodes.append(s)
            mask, s = ("kept", arg(s, 0)), arg(s, 1)
        elif mask is None and o == "add":
            a, b = arg(s, 0), arg(s, 1)
            if not (isinstance(a, Node) and isinstance(b, Node)):
                return None, [], None, None
            # the scores are the side that leads to q @ k^T
            scores, other = (a, b) if _scores_path(a) else (b, a)
            nodes.append(s)
            mask, s = ("additive", other), scores
        else:
            return None, [], None, None
    return None, [], None, None


def _scores_path(n):
    for _ in range(4):
        n, _casts = through(n)
        if op(n) in ("matmul", "bmm"):
            return True
        if op(n) not in ("mul", "div", "masked_fill", "where", "add"):
            return False
        n = arg(n, 0) if op(n) != "where" else arg(n, 1)
    return False


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
    """(the key heads before a repeat to `heads` (repeat_interleave, expand + reshape), the
    node that holds them); (heads, k) when k is not repeated."""
    n, repeated = k, False
    for _ in range(8):
        if op(n) in ("repeat_interleave", "expand", "repeat"):
            repeated = True
        elif repeated and shape(n) and len(shape(n)) == 4:
            h = shape(n)[1]
            return (h, n) if h < heads and heads % h == 0 else (heads, k)
        if op(n) not in VIEWS | {"repeat"} or not isinstance(arg(n, 0), Node):
            break
        n = n.args[0]
    if repeated and shape(n) and len(shape(n)) == 4 and heads % shape(n)[1] == 0:
        return shape(n)[1], n
    return heads, k


def _softmax_parts(n):
    """(x, nodes) for a softmax of x over the last dim: a softmax call, or exp(x - max(x)) /
    sum(exp(...)) written out (the max may be left out); (None, []) otherwise."""
    if op(n) == "softmax":
        x = arg(n, 0)
        return (x, [n]) if shape(x) and is_last_dim(arg(n, 1, "dim"), len(shape(x))) else (None, [])
    if op(n) == "div":
        e, s, extra = arg(n, 0), arg(n, 1), []
    elif op(n) == "mul":
        pair = next(((e, r) for e, r in operands(n) if op(r) == "reciprocal"), None)
        if pair is None:
            return None, []
        e, s, extra = pair[0], pair[1].args[0], [pair[1]]
    else:
        return None, []
    e, casts = through(e)
    if op(e) != "exp" or not isinstance(s, Node) or not same(row_reduce(s, ("sum",)), e):
        return None, []
    nodes = [n, *extra, *casts, e, s, *through(s.args[0])[1]]
    z = e.args[0]
    if op(z) == "sub":
        x, (mx, mnodes) = z.args[0], row_max(z.args[1])
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
    rows = row_shape(x)
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
    if o == "sub" and same(row_reduce(arg(n, 1), ("logsumexp",)), arg(n, 0)):
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
    for a, u in operands(h):
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
            m.shape = (*row_shape(x), shape(g)[-1])
        return m
    return None


def _activation(a):
    """(name, gate, nodes) for silu(g), g * sigmoid(g), gelu(g)."""
    if op(a) in ("silu", "gelu") and isinstance(arg(a, 0), Node):
        return op(a), a.args[0], [a]
    if op(a) == "mul":
        for g, s in operands(a):
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
    if sole_user(p) is not n or shape(p) is None:
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
    M, K = row_shape(x)
    m = Match("matmul", n, [n, p], shape=(M, shape(p)[-1], K))
    m.variant = {"activation": activation, **({"bias": True} if bias is not None else {})}
    return m


def layernorm(n, values):
    """(x - mean) / sqrt(var + eps) or (x - mean) * rsqrt(var + eps) over the last dim, var the
    biased variance (mean of squares of x - mean, var(unbiased=False), var_mean), then an
    optional weight and bias: layernorm (M, N)."""
    found = normalized(n)
    if found is None or op(found[0]) != "sub":
        return None
    centered, stat, nodes = found
    x, mu = centered.args[0], centered.args[1]
    if not isinstance(mu, Node):
        return None
    if (m := row_reduce(mu, ("mean",))) is not None and same(m, x):
        mean_nodes = [mu]
    elif op(mu) == "getitem" and arg(mu, 1) == 1 and _biased_var_mean(mu.args[0], x):
        mean_nodes = [mu, mu.args[0]]
    else:
        return None
    sq = row_reduce(stat, ("mean",))
    c = square(sq) if sq is not None else None
    if c is not None and (c is centered or op(c) == "sub" and same(c.args[0], x)
                          and same(c.args[1], mu)):
        var_nodes = [stat, sq, c]
    elif op(stat) == "var" and _biased(stat) and row_reduce(stat, ("var",)) is not None \
            and same(stat.args[0], x):
        var_nodes = [stat]
    elif op(stat) == "getitem" and arg(stat, 1) == 0 and arg(stat, 0) is arg(mu, 0) \
            and op(mu) == "getitem":
        var_nodes = [stat]
    else:
        return None
    size = shape(x)[-1]
    out, tail, weight, bias = affine(n, size, with_bias=True)
    return Match("layernorm", out, nodes + [centered, *mean_nodes, *var_nodes, *tail],
                 row_shape(x), {} if weight or bias else {"affine": False})


def _biased(n):
    return n.kwargs.get("unbiased", arg(n, 2) if len(n.args) > 2 else True) is False \
        or n.kwargs.get("correction") == 0


def _biased_var_mean(n, x):
    return op(n) == "var_mean" and _biased(n) and row_reduce(n, ("var_mean",)) is not None \
        and same(n.args[0], x)


def rmsnorm(n, values):
    """x * rsqrt(mean(x^2) + eps) over the last dim (x*x, x**2, pow, square; rsqrt, 1/sqrt,
    ** -0.5; or x / sqrt(...)), then an optional weight: rmsnorm (M, N)."""
    found = normalized(n)
    if found is None:
        return None
    data, stat, nodes = found
    sq = row_reduce(stat, ("mean",))
    x = square(sq) if sq is not None else None
    if x is None or not same(x, data) or shape(x) is None:
        return None
    out, tail, weight, _ = affine(n, shape(x)[-1], with_bias=False)
    return Match("rmsnorm", out, nodes + [stat, sq, *tail], row_shape(x),
                 {} if weight else {"affine": False})


def softmax(n, values):
    """A softmax over the last dim written out (exp, sum, divide): softmax (M, N). A softmax
    call is one op: recognize.py names it without a scope."""
    if op(n) == "softmax":
        return None
    x, nodes = _softmax_parts(n)
    if x is None or shape(x) is None:
        return None
    return Match("softmax", n, nodes, row_shape(x))


PATTERNS = [attention, cross_entropy, fused_mlp, projection_gelu, qkv_rotary, rotary, layernorm,
            rmsnorm, softmax]
