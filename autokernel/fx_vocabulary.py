"""
The FX graph's vocabulary: one name per operation however it was spelled, and the small
spellings the patterns are written in (a row reduction, a square, 1/sqrt, a norm's
normalization and affine tail).

op(node) names a call by one name (torch.mul, Tensor.mul, Tensor.mul_, operator.mul,
operator.imul: 'mul'); arg, shape, through and same read a node's arguments, its example value's
shape, the value under a chain of casts, and whether two nodes are one value. Each spelling
helper takes a node and returns what it is made of, or None.
"""
import math

import torch
from torch.fx import Node

from autokernel.recognize import is_last_dim

ALIASES = {"truediv": "div", "true_divide": "div", "divide": "div", "multiply": "mul",
           "subtract": "sub", "negative": "neg", "iadd": "add", "isub": "sub", "imul": "mul",
           "itruediv": "div", "concat": "cat", "concatenate": "cat", "mT": "transpose"}
CASTS = {"to", "float", "half", "bfloat16", "double", "type", "type_as", "contiguous", "detach",
         "clone"}
VIEWS = CASTS | {"view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand",
                 "expand_as", "flatten", "unflatten", "view_as", "t", "getitem",
                 "repeat_interleave"}
DROPOUTS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
            "feature_alpha_dropout"}
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


def passes_through(n):
    """A dropout that hands its input back: in eval mode (training=False) or with p = 0."""
    name = op(n)
    return name in DROPOUTS and not (arg(n, 2, "training", "alpha" not in name)
                                      and arg(n, 1, "p", 0.5))


def mutates(n):
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


def number(a):
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def sole_user(n):
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
    if depth > 4 or a.op != b.op or a.target != b.target or op(a) is None or mutates(a) \
            or op(a) in RANDOM or len(a.args) != len(b.args) or a.kwargs != b.kwargs:
        return False
    return all(same(x, y, depth + 1) if isinstance(x, Node) else x == y
               for x, y in zip(a.args, b.args))


def row_shape(x):
    s = shape(x)
    return (math.prod(s[:-1]), s[-1])


def operands(n):
    """Both orders of a binary op's two arguments (for the commutative ones)."""
    a, b = arg(n, 0), arg(n, 1)
    return [(a, b), (b, a)]


def _other(n, x):
    """The argument of binary op n that is not x, or None when x is neither."""
    a, b = arg(n, 0), arg(n, 1)
    return b if a is x else a if b is x else None


def row_reduce(n, ops, keepdim=True):
    """x for n = x.<op>(-1, keepdim=True) (any spelling of the last dim), else None."""
    if op(n) not in ops or not isinstance(arg(n, 0), Node) or shape(arg(n, 0)) is None:
        return None
    x = n.args[0]
    if not is_last_dim(arg(n, 1, "dim"), len(shape(x))) or bool(arg(n, 2, "keepdim")) != keepdim:
        return None
    return x


def row_max(n):
    """(x, nodes) for x.amax(-1, keepdim=True) or x.max(-1, keepdim=True)[0] / .values."""
    if (x := row_reduce(n, ("amax",))) is not None:
        return x, [n]
    if op(n) == "getitem" and arg(n, 1) == 0 \
            and (x := row_reduce(n.args[0], ("max",))) is not None:
        return x, [n, n.args[0]]
    return None, []


def square(n):
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
    return next((s for s, eps in operands(a) if isinstance(s, Node) and number(eps)), None)


def normalized(n):
    """(data, statistic, nodes) for n = data * rsqrt(statistic + eps) or
    data / sqrt(statistic + eps), in any of the spellings above (eps the contract's argument)."""
    candidates = []
    if op(n) == "mul":
        candidates = [(d, r, _inv_sqrt) for d, r in operands(n)]
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
    while (u := sole_user(n)) is not None and op(u) in CASTS and arg(u, 0) is n:
        casts.append(u)
        n = u
    return sole_user(n), casts, n


def affine(n, size, with_bias):
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
