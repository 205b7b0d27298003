"""
The rotary patterns: rotary embedding in its spellings (half-split as rotate_half or as the two
halves' products, interleaved pairs by stacking or complex numbers), and an attention layer's
q/k/v projections with rotary on q and k (qkv_rotary). autokernel/patterns.py lists them among
the other patterns.
"""
from torch.fx import Node

from autokernel.fx_vocabulary import VIEWS, arg, op, operands, same, shape, through
from autokernel.matches import Match
from autokernel.recognize import is_last_dim


def rotary(n, values):
    """Rotary embedding: half-split (x * cos + rotate_half(x) * sin, with rotate_half as
    cat(-x2, x1); or cat(x1*cos - x2*sin, x2*cos + x1*sin)) is rotary_embedding (B, H, S, D);
    interleaved pairs (x[..., ::2] with x[..., 1::2]: stack + flatten, or complex numbers) are
    noted: the kernel pairs the halves."""
    o = op(n)
    if o == "add":
        for xc, rs in operands(n):
            if op(xc) != "mul" or op(rs) != "mul":
                continue
            for r, sin in operands(rs):
                x, rnodes, pairing = _rotated(r)
                if x is None:
                    continue
                cos = next((c for d, c in operands(xc) if same(d, x)), None)
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
            for c, f in operands(inner.args[0]):
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
    for x1, cos in operands(a):
        for x2, sin in operands(b):
            (xa, ia), (xb, ib) = split(x1), split(x2)
            if xa is None or xa is not xb or (ia, ib) != (0, 1):
                continue
            for c, d in operands(second):
                if _product_of(c, x2, cos) and _product_of(d, x1, sin):
                    return xa, cos, [first, second, a, b, c, d, x1, x2]
    return None


def _product_of(m, p, q):
    """Whether m is p * q in either order (up to casts)."""
    return op(m) == "mul" and any(same(u, p) and same(v, q) for u, v in operands(m))


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
