"""
How a swap patches torch and a model: replacements set for the length of a block, each torch
entry point with its rule's handler in front.

patched(swap, original, handler) is what a swap puts in place of a torch function or Tensor
method: the handler (autokernel/swap_torch.py) answers the call, or returns FALLBACK and the
original runs. applying(patches) sets each (owner, attribute, replacement) and restores them on
exit; suspended(applied) takes them out for a while (a graph swap captures the model's own code).
known_to_the_compiler() builds the compiler's tables of torch's functions before anything
is patched. capturing() says when no value read back from the device may steer a handler.
"""
import contextlib
import importlib
import inspect

import torch
from torch.overrides import handle_torch_function, has_torch_function

import autokernel
from autokernel import ops

FALLBACK = object()  # a handler's "not mine: run the original op"


@contextlib.contextmanager
def applying(patches):
    """setattr(owner, attr, new) for each (owner, attr, new), undone on exit in reverse order.
    Yields the list of what it set, [(owner, attr, whether owner itself held attr, the
    original)], for suspended()."""
    applied = []
    try:
        for owner, attr, new in patches:
            applied.append((owner, attr, attr in vars(owner), getattr(owner, attr)))
            setattr(owner, attr, new)
        yield applied
    finally:
        _undo(applied)


@contextlib.contextmanager
def fast_path_off():
    """nn.TransformerEncoderLayer's (and nn.MultiheadAttention's) fast path off for the block:
    in eval without autograd a batch_first layer is one fused op
    (torch._transformer_encoder_layer_fwd), whose linears, attention and norms neither the
    profile nor a kernel would see. The original model's timings keep it (verify.py's eager
    and torch.compile runs are outside any swap)."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def _undo(applied):
    for owner, attr, had_own, old in reversed(applied):
        if had_own:
            setattr(owner, attr, old)
        else:  # inherited (a class's forward, TensorBase's methods): uncover it again
            delattr(owner, attr)


@contextlib.contextmanager
def suspended(*applied):
    """The originals of what applying() set (each a list it yielded, in the order applied) back
    for the length of a block, the replacements again after it: the model's own code, for a
    graph captured of it."""
    now = [[(owner, attr, vars(owner)[attr]) for owner, attr, _, _ in a] for a in applied]
    for a in reversed(applied):
        _undo(a)
    try:
        yield
    finally:
        for replacements in now:
            for owner, attr, new in replacements:
                setattr(owner, attr, new)


def known_to_the_compiler(inductor):
    """Dynamo builds its tables of torch's functions and Tensor's methods (by identity) on first
    use, and inductor's GEMM lowerings keep torch.addmm & co. as their fallback kernels when
    first imported; both last for the process. Built while a swap has F.linear, torch.addmm or
    Tensor.matmul patched, they would hold the swap's wrappers: the real functions become
    unknown builtins to every later trace (a graph break at each call), and inductor's compiled
    code calls a wrapper that ignores its out= buffer (wrong outputs, or no `addmm` at all).
    Build them before anything is patched; inductor only for a swap meant for torch.compile
    (importing it costs seconds)."""
    rules = getattr(torch._dynamo, "trace_rules", None)
    for table in ("get_torch_obj_rule_map", "get_tensor_method"):
        build = getattr(rules, table, None)
        if callable(build):
            build()
    if inductor:
        importlib.import_module("torch._inductor.lowering")  # it imports inductor's kernel/


def patched(swap, original, handler):
    """`original` (a torch function or Tensor method) with the rule's handler in front: the
    handler gets the call's arguments bound to its own signature; the original runs on FALLBACK,
    on a call the handler's signature cannot bind, while swap.busy and while a kernel's custom
    op body runs (ops.RUNNING: under torch.compile swap.busy is only set in the traced program)."""
    binds = _binder(handler)
    # Whether a call binds depends only on how many positional arguments it has and which
    # keywords it names, so check once per calling convention.
    bindable = {}
    running = ops.RUNNING  # an op body (real, fake, backward) runs: pass through
    on_gpu = autokernel.CUDA

    def call(*args, **kwargs):
        if swap.busy or running[0]:  # a kernel's, a handler's or a fallback's own torch calls
            return original(*args, **kwargs)
        relevant = args + tuple(kwargs.values()) if kwargs else args
        if has_torch_function(relevant):
            # An active TorchFunctionMode (endtoend's loss-input recorder) or a tensor subclass
            # sees the call first, as it would the original's; it calls us back without itself.
            return handle_torch_function(call, relevant, *args, **kwargs)
        convention = (len(args), tuple(kwargs))
        ok = bindable.get(convention)
        if ok is None:
            ok = bindable[convention] = binds(len(args), tuple(kwargs))
        if not ok:  # a calling convention the rule does not know: leave it alone
            return original(*args, **kwargs)
        if on_gpu and args and isinstance(args[0], torch.Tensor) and not args[0].is_cuda:
            return original(*args, **kwargs)  # CPU tensors in a GPU process: not the kernels'
        # Busy for the handler's glue and the fallback too: F.softmax's original calls
        # Tensor.softmax, which must not be intercepted (and counted) a second time.
        swap.busy = True
        try:
            out = handler(swap, *args, **kwargs)
            return original(*args, **kwargs) if out is FALLBACK else out
        finally:
            swap.busy = False
    return call


def _binder(handler):
    """binds(n_positional, keyword_names): whether a call with that convention binds to the
    handler's signature after its `swap` argument, as Signature.bind would decide. Plain
    Python on precomputed sets, so dynamo traces it (Signature.bind's mapping proxies break
    the graph) and it costs less than a bind."""
    P = inspect.Parameter
    params = list(inspect.signature(handler).parameters.values())[1:]
    positional = [p.name for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    by_keyword = {p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    required = {p.name for p in params if p.default is P.empty
                and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)}
    var_args = any(p.kind == P.VAR_POSITIONAL for p in params)
    var_kwargs = any(p.kind == P.VAR_KEYWORD for p in params)

    def binds(n, names):
        if n > len(positional) and not var_args:
            return False
        filled = set(positional[:n])
        for name in names:
            if name in filled or (name not in by_keyword and not var_kwargs):
                return False
            filled.add(name)
        return required <= filled
    return binds


def capturing():
    """A CUDA graph capture, or dynamo tracing: either way a value read back from the device
    cannot steer the Python code (a sync, or a graph break)."""
    return torch.compiler.is_compiling() or \
        (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
