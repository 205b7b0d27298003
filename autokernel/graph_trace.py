"""
A module's forward traced under Dynamo with the arguments it was called with, as the graph swap
(autokernel/swap_graph.py) captures an instance: the trace itself, where each graph input comes
from (steps, read), and what a captured graph was specialized to (signature).
"""
import ast
import contextlib
import types

import torch

from autokernel.graph_capture import dynamo_quiet


def trace(module, args, kwargs, backend, fullgraph):
    """module(*args, **kwargs) under Dynamo with `backend`. Each trace gets a code object of its
    own: Dynamo's caches are per code object, and a shared one would fill up after a few
    instances (Dynamo then stops tracing it)."""
    entry = types.FunctionType(_enter.__code__.replace(), _enter.__globals__, "graph_swap")
    with dynamo_quiet(), no_function_modes():
        return torch.compile(entry, backend=backend, fullgraph=fullgraph,
                             dynamic=False)(module, args, kwargs)


@contextlib.contextmanager
def no_function_modes():
    """The torch function modes around the forward (verify's recorder of the loss's input, say)
    off while it is traced: Dynamo would trace their handlers too, which can split the graph at
    every torch call; the graph is the model's computation, which runs under them again."""
    modes = []
    while torch._C._len_torch_function_stack() > 0:
        modes.append(torch._C._pop_torch_function_stack())
    try:
        yield
    finally:
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)


def _enter(module, args, kwargs):
    return module(*args, **kwargs)


def steps(placeholder):
    """Where a graph input comes from, as steps from _enter's arguments: Dynamo's source name
    ("L['module']._modules['attn']._parameters['weight']", "L['args'][0]") read as
    [("item", "module"), ("attr", "_modules"), ("item", "attn"), ...]; None if it is not
    such a chain (a global, a computed value)."""
    source = getattr(placeholder.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    name = name() if callable(name) else name
    try:
        node = ast.parse(name, mode="eval").body
    except (SyntaxError, TypeError, ValueError):
        return None
    steps = []
    while not (isinstance(node, ast.Name) and node.id == "L"):
        if isinstance(node, ast.Attribute):
            steps.append(("attr", node.attr))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            steps.append(("item", node.slice.value))
        else:
            return None
        node = node.value
    steps.reverse()
    return steps if steps and steps[0] in (("item", "module"), ("item", "args"),
                                           ("item", "kwargs")) else None


def read(steps, value):
    for kind, key in steps:
        value = getattr(value, key) if kind == "attr" else value[key]
    return value


def signature(module, args, kwargs):
    """What a captured graph was specialized to, hashable: each tensor argument's shape,
    strides, dtype and device, the other arguments' values, the modules' train/eval flags;
    None for an argument of another kind (the module's own forward then)."""
    leaves = summary((args, kwargs))
    if leaves is None:
        return None
    return leaves, tuple(m.training for m in module.modules())


def summary(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.stride(), v.dtype, v.device, v.requires_grad)
    if v is None or isinstance(v, (bool, int, float, str)):
        return (type(v).__name__, v)
    if isinstance(v, (tuple, list)):
        items = tuple(summary(x) for x in v)
        return None if None in items else (type(v).__name__, items)
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        items = tuple((k, summary(x)) for k, x in v.items())
        return None if any(s is None for _, s in items) else ("dict", items)
    return None


def odd_argument(v):
    """The type name of the first argument summary() cannot summarize."""
    if isinstance(v, (tuple, list)):
        return next((t for t in map(odd_argument, v) if t), None)
    if isinstance(v, dict):
        return next((t for t in map(odd_argument, v.values()) if t), None)
    return None if summary(v) is not None else type(v).__name__


def attributes(module):
    """The modules' attributes by identity (tensors in _parameters/_buffers are not here)."""
    return [(id(m), {k: id(v) for k, v in vars(m).items() if k != "forward"})
            for m in module.modules()]
