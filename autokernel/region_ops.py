"""
What each call of a region's reference is to its starter (autokernel/region_starter.py): a library
call (the convolutions and GEMMs the region kind allows), a view, or an elementwise op, written
as its Triton expression over fp32 values (ELEMENTWISE: the op's name -> a function of the call's
arguments, as the starter's _Args reads them, giving the expression).
"""
import math

from autokernel.fx_vocabulary import DROPOUTS  # identities in eval mode
from autokernel.region_special import StarterError

LIBRARY = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "linear", "matmul", "mm", "bmm", "addmm", "baddbmm"}
VIEWS = {"view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "unsqueeze",
         "squeeze", "expand", "expand_as", "view_as", "getitem", "size", "unfold",
         "chunk", "split", "unbind", "narrow", "select"}
SAME = {"contiguous", "clone", "detach", "to", "float", "half", "bfloat16", "type", "type_as",
        *DROPOUTS}  # in fp32 compute: the value itself
NORMS = {"batch_norm", "group_norm", "instance_norm"}  # per-channel operands along dim 1
COMPARISONS = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}


def _tanh(x):
    return f"(2 * tl.sigmoid(2 * {x}) - 1)"


def _clamp(x, low, high):
    y = x if low is None else f"tl.maximum({x}, {low})"
    return y if high is None else f"tl.minimum({y}, {high})"


def _pow(x, e):
    if not isinstance(e, (int, float)):
        raise StarterError("pow with a tensor exponent")
    if float(e).is_integer() and 1 <= e <= 4:
        return "(" + " * ".join([x] * int(e)) + ")"
    named = {0.5: f"tl.sqrt({x})", -0.5: f"tl.rsqrt({x})", -1: f"(1.0 / {x})",
             -2: f"(1.0 / ({x} * {x}))"}
    if e in named:
        return named[e]
    raise StarterError(f"pow with exponent {e}")


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return f"(0.5 * {x} * (1 + {_tanh(inner)}))"
    return f"(0.5 * {x} * (1 + tl.erf({x} * 0.7071067811865476)))"


def _softplus(x, beta=1.0, threshold=20.0):
    return (f"tl.where({x} * {beta} > {threshold}, {x}, "
            f"tl.log(1 + tl.exp({x} * {beta})) / {beta})")


# op name -> Triton expression of its arguments (Triton expressions, or Python constants)
ELEMENTWISE = {
    "add": lambda a: f"({a(0)} + {a(1)}{_alpha(a)})",
    "sub": lambda a: f"({a(0)} - {a(1)}{_alpha(a)})",
    "rsub": lambda a: f"({a(1)} - {a(0)}{_alpha(a)})",
    "mul": lambda a: f"({a(0)} * {a(1)})",
    "div": lambda a: _div(a),
    "neg": lambda a: f"(-{a(0)})",
    "pow": lambda a: _pow(a(0), a.raw(1)),
    "relu": lambda a: f"tl.maximum({a(0)}, 0.0)",
    "relu6": lambda a: _clamp(a(0), 0.0, 6.0),
    "hardtanh": lambda a: _clamp(a(0), a.raw(1, "min_val", -1.0), a.raw(2, "max_val", 1.0)),
    "clamp": lambda a: _clamp(a(0), a.raw(1, "min"), a.raw(2, "max")),
    "clip": lambda a: _clamp(a(0), a.raw(1, "min"), a.raw(2, "max")),
    "clamp_min": lambda a: _clamp(a(0), a.raw(1, "min"), None),
    "clamp_max": lambda a: _clamp(a(0), None, a.raw(1, "max")),
    "silu": lambda a: f"({a(0)} * tl.sigmoid({a(0)}))",
    "tanh": lambda a: _tanh(a(0)),
    "gelu": lambda a: _gelu(a(0), a.raw(1, "approximate", "none")),
    "square": lambda a: f"({a(0)} * {a(0)})",
    "reciprocal": lambda a: f"(1.0 / {a(0)})",
    "maximum": lambda a: f"tl.maximum({a(0)}, {a(1)})",
    "minimum": lambda a: f"tl.minimum({a(0)}, {a(1)})",
    "max": lambda a: f"tl.maximum({a(0)}, {a(1, 'other')})",  # binary (kind_of: not over a dim)
    "min": lambda a: f"tl.minimum({a(0)}, {a(1, 'other')})",
    "where": lambda a: f"tl.where({a(0)}, {a(1)}, {a(2)})",
    # a constant of x's shape: from x's block, not x * 0 (inf and nan times 0 are nan)
    "zeros_like": lambda a: f"tl.zeros_like({a(0)})",
    "ones_like": lambda a: f"(tl.zeros_like({a(0)}) + 1.0)",
    "full_like": lambda a: f"(tl.zeros_like({a(0)}) + {a.raw(1, 'fill_value')})",
    "leaky_relu": lambda a: f"tl.where({a(0)} > 0, {a(0)}, "
                            f"{a(0)} * {a.raw(1, 'negative_slope', 0.01)})",
    "elu": lambda a: f"tl.where({a(0)} > 0, {a(0)}, "
                     f"{a.raw(1, 'alpha', 1.0)} * (tl.exp({a(0)}) - 1))",
    "hardsigmoid": lambda a: f"({_clamp(f'{a(0)} + 3', 0.0, 6.0)} / 6)",
    "hardswish": lambda a: f"({a(0)} * {_clamp(f'{a(0)} + 3', 0.0, 6.0)} / 6)",
    "softplus": lambda a: _softplus(a(0), a.raw(1, "beta", 1.0), a.raw(2, "threshold", 20.0)),
    "mish": lambda a: f"({a(0)} * {_tanh(_softplus(a(0)))})",
    "selu": lambda a: f"1.0507009873554805 * tl.where({a(0)} > 0, {a(0)}, "
                      f"1.6732632423543772 * (tl.exp({a(0)}) - 1))",
    "celu": lambda a: f"tl.where({a(0)} > 0, {a(0)}, {a.raw(1, 'alpha', 1.0)} * "
                      f"(tl.exp({a(0)} / {a.raw(1, 'alpha', 1.0)}) - 1))",
    "softsign": lambda a: f"({a(0)} / (1 + tl.abs({a(0)})))",
    "log_sigmoid": lambda a: f"(tl.minimum({a(0)}, 0.0) - tl.log(1 + tl.exp(-tl.abs({a(0)}))))",
    "batch_norm": lambda a: _batch_norm(a),
    "group_norm": lambda a: _affine(a, f"({a(0)} - mean) * rstd", 2),  # stats: pass one
    "instance_norm": lambda a: _instance_norm(a),
    **{name: (lambda a, s=sym: f"({a(0)} {s} {a(1)})") for name, sym in COMPARISONS.items()},
    **{name: (lambda a, f=name: f"tl.{f}({a(0)})")  # Triton's own elementwise functions
       for name in ("sigmoid", "exp", "log", "sqrt", "rsqrt", "abs", "erf", "sin", "cos")},
    **{name: (lambda a: a(0)) for name in SAME},
}


def _alpha(a):
    alpha = a.raw(None, "alpha", 1)
    return "" if alpha == 1 else f" * {alpha}"


def _div(a):
    if a.raw(None, "rounding_mode") is not None:
        raise StarterError("div with a rounding_mode")
    return f"({a(0)} / {a(1)})"


def _batch_norm(a):
    """Eval-mode BatchNorm: each channel (dim 1) scaled and shifted by its statistics."""
    if a.raw(5, "training", False):
        raise StarterError("batch_norm in training mode (batch statistics)")
    return _affine(a, f"({a(0)} - {a(1, 'running_mean')}) * "
                      f"tl.rsqrt({a(2, 'running_var')} + {a.raw(7, 'eps', 1e-5)})", 3)


def _instance_norm(a):
    """InstanceNorm: a GroupNorm of one channel a group (its kernel's first pass gives mean and
    rstd), or with running statistics (use_input_stats=False) a BatchNorm's affine."""
    if a.raw(5, "use_input_stats", True):
        return _affine(a, f"({a(0)} - mean) * rstd", 3)
    return _affine(a, f"({a(0)} - {a(1, 'running_mean')}) * "
                      f"tl.rsqrt({a(2, 'running_var')} + {a.raw(7, 'eps', 1e-5)})", 3)


def _affine(a, normalized, weight_at):
    """A norm's optional per-channel weight and bias (arguments weight_at and the next)."""
    y = normalized
    if a.raw(weight_at, "weight") is not None:
        y = f"{y} * {a(weight_at, 'weight')}"
    if a.raw(weight_at + 1, "bias") is not None:
        y = f"{y} + {a(weight_at + 1, 'bias')}"
    return f"({y})"


def literal(value):
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float('{value}')"
    if isinstance(value, int):
        return repr(value)
    raise StarterError(f"a constant argument {value!r}")



CAST_METHODS = {"float": "torch.float32", "half": "torch.float16", "bfloat16": "torch.bfloat16"}
