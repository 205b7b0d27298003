"""
A loaded kernel as a torch custom op, so torch.compile sees one opaque node per kernel call.

Dynamo cannot trace a Triton launcher written as plain Python (it would break the graph at every
kernel call); a `torch.library.custom_op` it does not look into. kernel_op(kernel, impl) gives
`torch.ops.autokernel.<name>`: its real body is `impl` (the caller's checked call of kernel_fn),
its fake (meta) body is the type's eager reference run on the fake inputs, which gives dynamo and
inductor the output's shape and dtype, symbolic shapes included, laid out as the type declares
(KernelType.out_order: the real body copies a kernel's output of another layout into that one).
Backward is the gradient of that same reference (the kernel's forward output, the reference's
derivative): a kernel file has no backward of its own, and a training step through a swapped
model should still run (a custom op with none registered runs forward and raises "Trying to
backward through autokernel.<name> ... but no autograd formula was registered" on backward).

The schema comes from type annotations, and each type has its own arguments, so the op's Python
signature is built per type from KERNEL_TYPES[t].args: tensors unless ARG_TYPES says otherwise,
defaults from the eager reference. One op per kernel file and type: the name is the kernel's name
(sanitized) and a hash of its file and type; loading the file again re-points the op's body at the
new kernel_fn (a registered op cannot be re-registered, and its schema depends only on the type).
"""
import hashlib
import inspect
import itertools
import re
import weakref
from contextlib import contextmanager
from typing import Optional

import torch

import autokernel

NAMESPACE = "autokernel"
# Arguments that are not a required tensor. Every kernel type's args are covered by this table
# or are tensors; a new type with a new kind of argument adds it here.
ARG_TYPES = {"bias": Optional[torch.Tensor], "weight": Optional[torch.Tensor], "eps": float,
             "causal": bool, "scale": Optional[float], "dim": int, "activation": Optional[str],
             "kv_heads": int, "residual": Optional[torch.Tensor],
             "ln_weight": Optional[torch.Tensor], "ln_bias": Optional[torch.Tensor],
             "ln_eps": Optional[float]}

# How many op bodies (real, fake or backward) run right now. While one does, the swap's patched
# torch entry points pass straight through: the kernel's own torch calls and the reference's
# must not be intercepted, and under torch.compile the swap's own `busy` flag is only set in the
# traced program, not while the op runs. A one-element list, read cheaply by the closures of
# autokernel/patching.py.
RUNNING = [0]

_ops = {}    # op name -> its OpOverload (torch.ops.autokernel.<name>.default)
_impls = {}  # op name -> the real body now (the latest kernel_fn loaded from that file)
_types = {}  # OpOverload -> its kernel type
_params = {}  # op name -> its kernel_fn's parameter names now (None: it takes **kwargs)


@contextmanager
def running():
    RUNNING[0] += 1
    try:
        yield
    finally:
        RUNNING[0] -= 1


def op_name(kernel):
    """A valid, per-file unique op name: the kernel's name as an identifier, then a short hash
    of its resolved file and type (two files may share a KERNEL_NAME)."""
    base = re.sub(r"\W", "_", kernel.name).strip("_").lower() or "kernel"
    if base[0].isdigit():
        base = f"k_{base}"
    key = f"{kernel.file.resolve() if kernel.file else kernel.name}:{kernel.kernel_type}"
    return f"{base}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def signature(kernel_type):
    """The op's Python signature for a type: its contract args in order, annotated by ARG_TYPES
    (tensor otherwise), with the eager reference's defaults."""
    from autokernel import reference
    ref = inspect.signature(getattr(reference, f"{kernel_type}_eager")).parameters
    params = []
    for name in autokernel.KERNEL_TYPES[kernel_type].args:
        default = ref[name].default if name in ref else inspect.Parameter.empty
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        annotation=ARG_TYPES.get(name, torch.Tensor),
                                        default=default))
    return inspect.Signature(params, return_annotation=torch.Tensor)


def kernel_op(kernel, impl=None):
    """torch.ops.autokernel.<op_name(kernel)>.default, registered on first use. impl(**inputs)
    is the real body (default: kernel.fn); it runs with the swap's patches passing through."""
    name = op_name(kernel)
    _impls[name] = impl or kernel.fn
    if name not in _ops:
        _ops[name] = _register(name, kernel.kernel_type)
        _types[_ops[name]] = kernel.kernel_type
    _params[name] = parameters(kernel.fn)
    return _ops[name]


def parameters(fn):
    """The names kernel_fn takes, or None when it takes any (**kwargs)."""
    params = inspect.signature(fn).parameters.values()
    return None if any(p.kind == p.VAR_KEYWORD for p in params) else {p.name for p in params}


def _takes(name, arg):
    """Whether op `name`'s kernel_fn now takes `arg` (any, when it takes **kwargs)."""
    params = _params.get(name, set())
    return params is None or arg in params


def taking(arg):
    """The registered ops whose kernel takes `arg` now, by name (sorted)."""
    return sorted(name for name in _params if _takes(name, arg))


def accepts(op, arg):
    """Whether the kernel behind one of these ops takes `arg` (a type's later optional argument,
    such as matmul's residual, which kernel files written before it do not)."""
    return _takes(op._schema.name.split("::")[-1], arg)


def out_strides(shape, order=None):
    """The strides of a dense tensor of `shape` whose dims lie in memory in `order`, outermost
    first (None: row-major), as torch.empty would give them for that order."""
    strides, step = [0] * len(shape), 1
    for dim in reversed(order or range(len(shape))):
        strides[dim] = step
        step *= max(1, shape[dim])
    return tuple(strides)


def kernel_type_of(func):
    """The kernel type of one of these ops, else None (what a TorchFunctionMode that watches
    a torch function, as endtoend's loss-input recorder does F.cross_entropy, also watches)."""
    return _types.get(func) if isinstance(func, torch._ops.OpOverload) else None


def _register(name, kernel_type):
    ktype = autokernel.KERNEL_TYPES[kernel_type]
    sig = signature(kernel_type)
    names = list(sig.parameters)

    def named(args, kwargs):
        """{arg: value}: the dispatcher passes every argument positionally, so zip is the
        common case (a bind costs microseconds a compiled forward's host time would pay)."""
        if not kwargs and len(args) == len(names):
            return dict(zip(names, args))
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def body(*args, **kwargs):
        inputs = named(args, kwargs)
        # an optional argument at None only reaches a kernel_fn taking it
        inputs = {k: v for k, v in inputs.items() if v is not None or _takes(name, k)}
        with running():
            out = _impls[name](**inputs)
        # Compiled code reads the output with the fake's strides: a kernel that chose another
        # layout has its output copied into that one. And custom_op forbids an output that
        # aliases an input (a kernel returning x itself).
        strides = out_strides(out.shape, ktype.out_order)
        if out.stride() != strides or any(out is a for a in inputs.values()):
            out = out.new_empty_strided(out.shape, strides).copy_(out)
        return out
    body.__signature__ = sig
    body.__name__ = name

    op = torch.library.custom_op(f"{NAMESPACE}::{name}", body, mutates_args=())

    def fake(*args, **kwargs):
        with running():
            out = ktype.eager(**named(args, kwargs))
        return out.new_empty_strided(out.shape, out_strides(out.shape, ktype.out_order))
    fake.__signature__ = sig
    op.register_fake(fake)
    op.register_autograd(_backward(ktype, names), setup_context=_setup_context)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


# ---- region kernels -----------------------------------------------------------------------
# A region kernel's ModelNew, plugged into a module instance (autokernel/swap_regions.py), is one
# op per kernel file: (the forward's tensors, a call key) -> the output's tensors. The key names
# one instance and input signature, checked eagerly first: its real body (the instance's
# ModelNew on these tensors) and its outputs' shapes, strides and dtypes (the fake's, since a
# region kernel is specialized to its shapes). Bodies are held weakly: by their swap.
_region_bodies = weakref.WeakValueDictionary()  # key -> body(tensors) -> [tensor, ...]
_region_specs = {}  # key -> [(shape, stride, dtype, device), ...]
_region_keys = itertools.count()


def region_op(kernel):
    """torch.ops.autokernel.<op_name(kernel)>.default for a region kernel, registered on first
    use: op(tensors, key) -> [tensor, ...]."""
    name = op_name(kernel)
    if name not in _ops:
        def body(tensors: list[torch.Tensor], key: int) -> list[torch.Tensor]:
            with running():
                outs = _region_bodies[key](tensors)
            # custom_op forbids an output that aliases an input (a region returning a view)
            inputs = {t.untyped_storage().data_ptr() for t in tensors}
            return [o.clone() if o.untyped_storage().data_ptr() in inputs else o for o in outs]

        op = torch.library.custom_op(f"{NAMESPACE}::{name}", body, mutates_args=())

        def fake(tensors, key):
            return [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                    for shape, stride, dtype, device in _region_specs[key]]
        op.register_fake(fake)
        _ops[name] = getattr(getattr(torch.ops, NAMESPACE), name).default
    return _ops[name]


def region_call(body, outputs):
    """A key for region_op: `body` (held weakly: the caller keeps it) and the outputs the
    eager check saw, whose shapes, strides and dtypes the fake gives."""
    key = next(_region_keys)
    _region_bodies[key] = body
    _region_specs[key] = [(tuple(o.shape), o.stride(), o.dtype, o.device) for o in outputs]
    return key


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*(a if isinstance(a, torch.Tensor) else None for a in inputs))
    ctx.scalars = [None if isinstance(a, torch.Tensor) else a for a in inputs]


def _backward(ktype, names):
    def backward(ctx, grad):
        """The eager reference's vector-Jacobian product at the saved inputs."""
        args = [s if t is None else t for t, s in zip(ctx.saved_tensors, ctx.scalars)]
        wants = [isinstance(a, torch.Tensor) and a.is_floating_point() and need
                 for a, need in zip(args, ctx.needs_input_grad)]
        with running(), torch.enable_grad():
            leaves = [a.detach().requires_grad_() if w else a for a, w in zip(args, wants)]
            out = ktype.eager(**dict(zip(names, leaves)))
            picked = [a for a, w in zip(leaves, wants) if w]
            grads = iter(torch.autograd.grad(out, picked, grad, allow_unused=True)
                         if picked else ())
        return tuple(next(grads) if w else None for w in wants)
    return backward
