"""
How a kernel gets into a model.

A kernel file, loaded (Kernel), becomes a callable of its type's contract (KernelOp: the
reference's named tensors in, an output checked against the reference's shape and dtype out).
A Swap plugs such ops into one model for the length of a `with swap.installed(model):` block and
records what happened: calls and shapes per kernel, fallbacks with their reasons, modules it
could not swap. verify.py runs models with swaps. Swap(..., compiled=True) calls each kernel
through its torch custom op (autokernel/ops.py), so torch.compile of the model inside
`swap.installed` traces the patched entry points and keeps each kernel call as one opaque node;
calls are then counted by the op's body as the compiled forward runs it. Dynamo guards on the
patched entry points: the compiled model traced inside the block is traced again outside it.

The rules (SWAP_RULES, one entry per kernel type):
  * While a kernel type is active, the torch entry points its rule handles are patched (and
    restored on exit): F.linear, torch.addmm (transformers' Conv1D) and x @ W with a 2-D W
    (matmul, the bias going into the kernel's epilogue), F.scaled_dot_product_attention (no
    mask or dropout; causal or not, any scale, grouped-query heads read by the kernel:
    flash_attention), F.layer_norm and F.rms_norm over one or several trailing dims, with their
    eps and with or without affine parameters (layernorm, rmsnorm), F.softmax / torch.softmax /
    Tensor.softmax over the last dim (softmax), F.cross_entropy (mean over 2-D logits:
    cross_entropy), torch.sum / Tensor.sum over any one dim (reduce).
    Patching, not a TorchFunctionMode: a mode would tax every torch call of the forward. The
    price: a name bound before the swap (`from torch.nn.functional import linear`) is not seen.
  * Module swaps: RMSNorm-like modules (rmsnorm), SwiGLU MLPs with w_gate/w_up/w_down or
    gate_proj/up_proj/down_proj (fused_mlp), models/layers.RotaryEmbedding and transformers'
    LLaMA-style apply_rotary_pos_emb (rotary_embedding), attention modules whose forward(x) is
    causal attention over wq/wk/wv (or q_proj/k_proj/v_proj) projections rotated by a
    RotaryEmbedding child, confirmed on a probe input (qkv_rotary: the three projections and
    the rotation in one kernel; attention and the output projection as the other rules run
    them), transformers' attention layers the same way with their own forward kept
    (_hf_qkv_patches), and norm and gated-MLP modules of any
    name whose forward computes rmsnorm, layernorm or fused_mlp (autokernel/computed.py:
    recognized from their graph, confirmed by their output).
  * A call whose arguments fall outside the kernel contract (an attention mask, dropout, GQA
    without enable_gqa, ...) runs the original op and is counted as a fallback with its reason.
    A kernel that never ran during the forward is a FAILURE, not a replacement.
  * Glue outside the kernels is torch and is counted in the timings: non-contiguous arguments
    are copied to contiguous ones, cos/sin tables are sliced and cast. Weights for the matmul
    kernel are transposed to contiguous [K, N] copies ONCE per weight (a load-time layout
    change, like a serving engine's; weight_layout="view", verify.py's --weight-layout view,
    passes the strided W.t() view instead, for kernels that honour strides). A copy whose rows
    would not be a multiple of 128 bytes (GPT-2's vocabulary of 50257) gets zero columns (and
    its bias zeros) up to the next multiple, and the kernel's output is viewed back to N
    columns: rows that are not 16-byte aligned rule out vector loads and TMA and make a matmul
    like GPT-2's lm_head several times slower, and rows that are not 128-byte aligned split
    every TMA row of the output across cache lines (the Hopper matmul ran GPT-2's lm_head 15%
    slower at N = 50264 than at 50304). torch.compile pads such matmuls too; nanoGPT pads its
    vocabulary. The kernel is picked and reported by the model's shape, N=50257.
"""
import contextlib
import copy
import functools
import importlib
import inspect
import math
import sys
import weakref
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function

import autokernel
from autokernel import computed, ops
from autokernel.cli import describe
from autokernel.recognize import is_last_dim, one_dim, reduce_shape
from autokernel.results import rel

FALLBACK = object()  # a handler's "not mine: run the original op"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class Kernel:
    """A loaded kernel file: its name in reports, its type, its kernel_fn, and the contract
    shapes it declared (plan.json or BENCH_SHAPES; none = it takes every shape of its type)."""
    name: str
    kernel_type: str
    file: Path
    fn: object
    shapes: list = field(default_factory=list)
    optional: bool = False  # one that finds no op in the model is "unused", not a failure

    @property
    def rel_file(self):
        return rel(self.file)


class KernelFailure(Exception):
    """A kernel raised or returned the wrong thing while the model ran."""

    def __init__(self, kernel, message):
        super().__init__(f"{kernel.name} ({kernel.rel_file}): {message}")
        self.kernel, self.message = kernel, message


class KernelOp:
    """One kernel as a callable of its type's contract: op(shape, **tensors) calls kernel_fn and
    checks that the output has the shape and dtype the reference gives these inputs; anything
    else, or an exception, is a KernelFailure that names the kernel. `shape` is the contract
    shape the call is reported under.
    compiled: self.op is the kernel's torch custom op (autokernel/ops.py), which torch.compile
    keeps as one node; its body is this same checked call. A compiled swap calls self.op, an
    eager one calls this directly: the op's dispatch costs host time a kernel call cannot spare."""

    def __init__(self, kernel, compiled=False, on_call=None):
        self.kernel = kernel
        self.ktype = autokernel.KERNEL_TYPES[kernel.kernel_type]
        self.specs = {}  # input shapes and dtypes -> the reference's output (shape, dtype)
        self.op = ops.kernel_op(kernel, self._op_body) if compiled else None
        # on_call(op, shape, folded, normed) after each call of the op's body, held weakly:
        # ops.py keeps the body (and so this KernelOp) registered after its swap is gone.
        self.on_call = on_call and weakref.WeakMethod(on_call)

    def _op_body(self, **inputs):
        """The custom op's real body, run when the (compiled) forward runs: the checked call,
        reported under the shape the kernel got (a padded matmul: the padded N)."""
        shape = SWAP_RULES[self.kernel.kernel_type].contract_shape(inputs)
        out = self(shape, **inputs)
        count = self.on_call and self.on_call()
        if count:  # a residual or a norm only comes from inductor's pass (fusion.py): folded in
            count(self, shape, inputs.get("residual") is not None,
                  inputs.get("ln_eps") is not None)
        return out

    def __call__(self, shape, **inputs):
        key = tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
                    for v in inputs.values())
        try:
            if key not in self.specs:
                self.specs[key] = _output_spec(self.ktype, inputs)
            want_shape, want_dtype = self.specs[key]
            # Torch-function handling off for the kernel's own host work: under a mode (e.g.
            # endtoend's loss-input recorder) every tensor access in Triton's launcher (strides,
            # data_ptr, dtype, ...) would pay a Python round trip, ~1.7 us each.
            with torch._C.DisableTorchFunction():
                out = self.kernel.fn(**inputs)
        except Exception as e:
            raise KernelFailure(self.kernel, f"raised {describe(e)} "
                                f"(shape {self.ktype.shape_str(shape)})") from e
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want_shape \
                or out.dtype != want_dtype:
            got = (f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise KernelFailure(self.kernel, f"returned {got}, expected {want_shape} "
                                f"{want_dtype} (shape {self.ktype.shape_str(shape)})")
        return out


def _output_spec(ktype, inputs):
    """(shape, dtype) the reference produces for these inputs, found on the meta device."""
    meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta")
            if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = ktype.eager(**meta)
    return tuple(out.shape), out.dtype


# ---------------------------------------------------------------------------------------------
# The swap: which kernels are active, what they ran on, and the context that plugs them in
# ---------------------------------------------------------------------------------------------

ROW_BYTES = 128  # the matmul weight copies' rows: a multiple of one cache line


class WeightCache:
    """Contiguous W.t() copies [K, N_padded] for the matmul kernel, made once per weight and
    shared by every swap of a run (so timing runs never pay for them). Rows are padded with
    zero columns to a multiple of ROW_BYTES (see the module docstring)."""

    def __init__(self):
        self.copies = {}

    def transposed(self, weight):
        key = id(weight)
        hit = self.copies.get(key)
        if hit and hit[0]() is weight and _same_version(hit[1], weight):
            return hit[2]
        n, k = weight.shape
        per_row_unit = max(1, ROW_BYTES // weight.element_size())
        padded = -(-n // per_row_unit) * per_row_unit
        copy = weight.new_zeros((k, padded))
        copy[:, :n] = weight.detach().t()
        self.copies[key] = (weakref.ref(weight), weight._version, copy)
        return copy

    def stacked(self, tensors):
        """torch.cat(tensors) (q/k/v weights, or their biases), made once per versions."""
        key = tuple(id(t) for t in tensors)
        hit = self.copies.get(key)
        if hit and all(r() is t and _same_version(v, t) for r, v, t in zip(hit[0], hit[1],
                                                                             tensors)):
            return hit[2]
        copy = torch.cat([t.detach() for t in tensors])
        self.copies[key] = ([weakref.ref(t) for t in tensors], [t._version for t in tensors],
                            copy)
        return copy

    def padded_bias(self, bias, width):
        """bias [N] with zeros up to `width` (the padded weight copy's columns), made once."""
        if bias is None or bias.shape[0] == width:
            return bias
        hit = self.copies.get(id(bias))
        if hit and hit[0]() is bias and _same_version(hit[1], bias):
            return hit[2]
        copy = bias.new_zeros((width,))
        copy[:bias.shape[0]] = bias.detach()
        self.copies[id(bias)] = (weakref.ref(bias), bias._version, copy)
        return copy


def _same_version(version, tensor):
    """Whether a tensor is unchanged since its copy was made. Dynamo sees a tensor's _version as
    data (a graph break): a traced forward trusts the copy, and keeps it while it runs."""
    return torch.compiler.is_compiling() or version == tensor._version


class Swap:
    """Kernels plugged into one model: dispatch by type (and declared shape), call counts, shapes
    seen, fallbacks with reasons, modules skipped with reasons."""

    def __init__(self, kernels, weights=None, weight_layout="copy", compiled=False):
        self.kernels = list(kernels)
        self.compiled = compiled  # kernels called through their custom ops (torch.compile)
        self.by_type = defaultdict(list)  # type -> its KernelOps, in the order given
        for k in self.kernels:
            self.by_type[k.kernel_type].append(KernelOp(k, compiled, self._count))
        self.weights = weights or WeightCache()
        self.weight_layout = weight_layout
        self.busy = False  # inside a kernel_fn: its own torch calls pass straight through
        # a transformers attention layer's q and k came rotated out of a qkv_rotary kernel:
        # its apply_rotary_pos_emb passes them on (_hf_qkv_patches)
        self.qk_rotated = False
        self.ignore_index_seen = {}  # (targets shape, ignore_index) -> hit (_hits_ignore_index)
        self.reset()

    def reset(self):
        self.calls = Counter()
        self.folded = Counter()  # kernel -> its compiled calls with an add folded in
        self.normed = Counter()  # kernel -> its compiled calls with a norm folded in
        self.shapes = defaultdict(set)
        self.fallbacks = defaultdict(Counter)  # type -> reason -> calls
        self.skipped = defaultdict(Counter)    # type -> reason -> modules
        self.notes = defaultdict(set)          # type -> glue done in torch

    def active(self, ktype):
        return bool(self.by_type.get(ktype))

    # Fallbacks and notes are counted in eager forwards only: dynamo would guard on the counts
    # and compile the model again at every call (and recompiling inside a CUDA graph capture
    # breaks it). verify.py runs the model eagerly before it compiles it.
    def fallback(self, ktype, reason):
        if not torch.compiler.is_compiling():
            self.fallbacks[ktype][reason] += 1
        return FALLBACK

    def note(self, ktype, text):
        if not torch.compiler.is_compiling():
            self.notes[ktype].add(text)

    def run(self, ktype, model_shape=None, **inputs):
        """Call the kernel for this type with the contract's arguments. Which kernel: the one
        that declared this shape (model_shape when the inputs were padded), else the first that
        declared no shapes (a catch-all), else the first."""
        shape = model_shape or SWAP_RULES[ktype].contract_shape(inputs)
        candidates = self.by_type[ktype]
        op = next((o for o in candidates if shape in o.kernel.shapes), None) or \
            next((o for o in candidates if not o.kernel.shapes), candidates[0])
        if self.compiled:  # the op's body counts the call when it runs (_count)
            return op.op(**inputs)
        busy, self.busy = self.busy, True  # the kernel's and the meta reference's torch calls
        try:                                # pass through (a patched handler may be busy already)
            out = op(shape, **inputs)
        finally:
            self.busy = busy
        self.calls[op.kernel.name] += 1
        self.shapes[op.kernel.name].add(op.ktype.shape_str(shape))
        return out

    def _count(self, op, shape, folded=False, normed=False):
        self.calls[op.kernel.name] += 1
        self.folded[op.kernel.name] += folded
        self.normed[op.kernel.name] += normed
        self.shapes[op.kernel.name].add(op.ktype.shape_str(shape))

    @contextlib.contextmanager
    def installed(self, model):
        """Plug the kernels into `model` and restore everything on exit, also when the forward
        raises. Everything is one list of (owner, attribute, replacement): the active rules'
        torch entry points (F.linear, torch.sum, Tensor.softmax, ...), module forwards and
        module-level patches. Only what an active rule handles is touched: no TorchFunctionMode,
        so torch calls the kernels do not replace cost nothing extra (a mode taxed every call
        and tensor access of the forward, ~1.7 us each, which made the model host-bound)."""
        # Dynamo records torch's functions by identity when it is first imported: imported
        # while torch.sum is patched, it would not know the real one again (a graph break in
        # every later torch.compile). The swap's handlers ask torch.compiler.is_compiling(),
        # which imports it: import it here, before anything is patched.
        import torch._dynamo  # noqa: F401
        _known_to_the_compiler(self.compiled)
        patches, swapped = [], set()
        for ktype, rule in SWAP_RULES.items():
            if self.active(ktype):
                for (owner, attr), handler in rule.functions.items():
                    patches.append((owner, attr, _patched(self, getattr(owner, attr), handler)))
        for module in model.modules():
            for ktype, rule in SWAP_RULES.items():
                if not self.active(ktype) or id(module) in swapped:
                    continue
                reasons = []  # why matchers passed: reported only if none swaps the module
                for matcher in rule.modules:
                    found = matcher(self, module)
                    if isinstance(found, str):
                        reasons.append(found)
                    elif found is not None:
                        patches.append((module, "forward", found))
                        swapped.add(id(module))
                        break
                else:
                    for reason in reasons:
                        self.skipped[ktype][reason] += 1
        for ktype, rule in SWAP_RULES.items():
            if self.active(ktype):
                for patcher in rule.patches:
                    patches += patcher(self, model)
        # Compiled: inductor's pass folds the adds around matmul ops into their residual.
        fusions = contextlib.nullcontext()
        if self.compiled and self.active("matmul"):
            from autokernel import fusion  # imports inductor: only for a compiled swap
            fusions = fusion.installed()
        with _applied(patches), fusions:
            yield self


@contextlib.contextmanager
def _applied(patches):
    """setattr(owner, attr, new) for each (owner, attr, new), undone on exit in reverse order."""
    applied = []  # (owner, attr, whether owner itself held attr, the original)
    try:
        for owner, attr, new in patches:
            applied.append((owner, attr, attr in vars(owner), getattr(owner, attr)))
            setattr(owner, attr, new)
        yield
    finally:
        for owner, attr, had_own, old in reversed(applied):
            if had_own:
                setattr(owner, attr, old)
            else:  # inherited (a class's forward, TensorBase's methods): uncover it again
                delattr(owner, attr)


def _known_to_the_compiler(inductor):
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


def pluggable_types(model, forward, types=None):
    """The kernel types a swap plugs a kernel into in this model, by one forward(model) with
    each of `types` (default: all) swapped for its eager reference: a computation the profiler
    recognized but no swap rule reaches (attention written out as matmul-softmax-matmul, say)
    is absent. The answer depends on the set: a type can take a call site from another (with
    qkv_rotary in, a LLaMA attention layer's rotation is no longer rotary_embedding's)."""
    from autokernel import reference
    types = [t for t in autokernel.KERNEL_TYPE_NAMES if types is None or t in types]
    stand_ins = [Kernel(t, t, Path(reference.__file__), getattr(reference, f"{t}_eager"))
                 for t in types]
    swap = Swap(stand_ins, weight_layout="view")
    with torch.no_grad(), swap.installed(model):  # (inference_mode would make any state the
        forward(model)                            # model builds lazily inference tensors)
    return {t for t in types if swap.calls[t]}


def _patched(swap, original, handler):
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


# ---------------------------------------------------------------------------------------------
# Swap rules, one per kernel type. A function handler gets the intercepted call's arguments and
# returns the result or FALLBACK (after swap.fallback(type, reason)); a module matcher returns
# None (not its kind), a reason string (its kind, but not swappable) or a replacement forward; a
# patcher returns [(owner, attribute, replacement)].
# ---------------------------------------------------------------------------------------------

def _rows(x):
    """x [..., N] as the contract's contiguous [M, N]."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def _linear(swap, input, weight, bias=None):
    return _project(swap, input, weight, bias)


def _project(swap, input, weight, bias=None, activation=None):
    """activation(F.linear(input, weight, bias)) on the matmul kernel, or FALLBACK."""
    if input.dtype not in FLOAT_DTYPES or weight.dtype != input.dtype or weight.dim() != 2 \
            or input.numel() == 0:
        return swap.fallback("matmul", "dtype or shape outside the contract")
    if bias is not None and (bias.dtype != input.dtype or bias.shape != weight.shape[:1]):
        return swap.fallback("matmul", "bias dtype or shape differs")
    A, N = _rows(input), weight.shape[0]
    if swap.weight_layout == "view":
        out = swap.run("matmul", A=A, B=weight.t(), bias=bias, activation=activation)
    else:  # [K, N] padded to 128-byte rows: the kernel computes zero columns, the view drops them
        B = swap.weights.transposed(weight)
        out = swap.run("matmul", A=A, B=B, bias=swap.weights.padded_bias(bias, B.shape[1]),
                       activation=activation, model_shape=(A.shape[0], N, A.shape[1]))[:, :N]
    return out.view(*input.shape[:-1], N)


def _conv1d_project(swap, input, conv, activation):
    """transformers' Conv1D (weight [K, N], x @ W + bias) with the activation, or FALLBACK."""
    W, bias = conv.weight, conv.bias
    if input.dtype not in FLOAT_DTYPES or W.dtype != input.dtype or input.numel() == 0 \
            or (bias is not None and bias.dtype != input.dtype):
        return swap.fallback("matmul", "dtype or shape outside the contract")
    out = swap.run("matmul", A=_rows(input), B=W.contiguous(), bias=bias, activation=activation)
    return out.view(*input.shape[:-1], W.shape[1])


# Activation modules that are the contract's activations (transformers' names included).
GELU_MODULES = {"NewGELUActivation": "gelu_tanh", "GELUTanh": "gelu_tanh",
                "PytorchGELUTanh": "gelu_tanh", "FastGELUActivation": "gelu_tanh",
                "GELUActivation": "gelu"}


def _activation_of(act):
    if isinstance(act, nn.GELU):
        return {"tanh": "gelu_tanh", "none": "gelu"}.get(act.approximate)
    return GELU_MODULES.get(type(act).__name__)


def _projection_act_module(swap, module):
    """An MLP's first projection with its activation as one matmul call, the activation in the
    kernel's epilogue. Two layouts whose forward is known: GPT-2's MLP (children c_fc, act,
    c_proj and maybe dropout: dropout(c_proj(act(c_fc(x))))) and BERT's intermediate (dense,
    intermediate_act_fn: act(dense(x)))."""
    children, cls = set(dict(module.named_children())), type(module).__name__
    if cls.endswith("MLP") and children in ({"c_fc", "act", "c_proj"},
                                            {"c_fc", "act", "c_proj", "dropout"}):
        proj, act = module.c_fc, module.act
        after = [module.c_proj] + ([module.dropout] if "dropout" in children else [])
    elif cls.endswith("Intermediate") and children == {"dense", "intermediate_act_fn"}:
        proj, act, after = module.dense, module.intermediate_act_fn, []
    else:
        return None
    activation = _activation_of(act)
    if activation is None:
        return f"skipped: activation {type(act).__name__} is not in the contract"
    if isinstance(proj, nn.Linear):
        project = lambda x: _project(swap, x, proj.weight, proj.bias, activation)  # noqa: E731
    elif type(proj).__name__ == "Conv1D" and getattr(proj, "weight", None) is not None:
        project = lambda x: _conv1d_project(swap, x, proj, activation)  # noqa: E731
    else:
        return "skipped: the projection is neither nn.Linear nor Conv1D"
    original = module.forward

    def forward(x, *args, **kwargs):
        h = FALLBACK if args or kwargs else project(x)
        if h is FALLBACK:
            return original(x, *args, **kwargs)
        for m in after:
            h = m(h)
        return h
    return forward


def _addmm(swap, input, mat1, mat2, *, beta=1, alpha=1):
    """torch.addmm(bias, x, W): transformers' Conv1D (GPT-2) projections, W already [K, N]."""
    if beta != 1 or alpha != 1 or mat1.dim() != 2 or mat2.dim() != 2 \
            or mat1.dtype not in FLOAT_DTYPES or mat2.dtype != mat1.dtype \
            or input.dtype != mat1.dtype:
        return swap.fallback("matmul", "addmm outside the contract")
    if input.shape == mat2.shape[1:]:  # a bias row: the kernel adds it
        return swap.run("matmul", A=mat1.contiguous(), B=mat2.contiguous(),
                        bias=input.contiguous())
    swap.note("matmul", "addmm's [M, N] input added in torch after the kernel")
    return swap.run("matmul", A=mat1.contiguous(), B=mat2.contiguous()) + input


def _matmul(swap, input, other):
    """x @ W with a 2-D right operand; batched products (attention scores) stay torch."""
    if not isinstance(input, torch.Tensor) or not isinstance(other, torch.Tensor) \
            or other.dim() != 2 or input.dim() < 1:
        return swap.fallback("matmul", "batched or vector matmul")
    if input.dtype not in FLOAT_DTYPES or other.dtype != input.dtype or input.numel() == 0:
        return swap.fallback("matmul", "dtype or shape outside the contract")
    out = swap.run("matmul", A=_rows(input), B=other.contiguous(), bias=None)
    return out.view(*input.shape[:-1], other.shape[1])


def _sdpa(swap, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    reason = None
    if attn_mask is not None:
        reason = "attention mask"
    elif dropout_p:
        reason = "dropout"
    elif query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        reason = "not [B, H, S, D]"
    elif query.shape[2] != key.shape[2] or value.shape != key.shape \
            or query.shape[-1] != key.shape[-1] or query.shape[0] != key.shape[0]:
        reason = "query/key/value shapes differ"
    elif query.dtype not in FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        reason = "dtype outside the contract"
    elif key.shape[1] != query.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        reason = "head counts differ"
    if reason:
        return swap.fallback("flash_attention", reason)
    return swap.run("flash_attention", Q=_heads(query), K=_heads(key), V=_heads(value),
                    causal=bool(is_causal), scale=None if scale is None else float(scale))


def _heads(t):
    """t [B,H,S,D] as the contract takes it: contiguous, or rows of positions seen through
    .transpose(1, 2), each row R >= H*D elements wide (a projection's [B,S,H,D] output, R = H*D,
    or one head slice of a fused q/k/v projection's), passed without a copy; any other layout
    is copied."""
    B, H, S, D = t.shape
    R = t.stride(2)
    rows = t.stride(3) == 1 and t.stride(1) == D and R >= H * D and (B == 1 or t.stride(0) == S * R)
    return t if t.is_contiguous() or rows else t.contiguous()


def _norm_rows(input, normalized_shape, *params):
    """x [..., *normalized_shape] as contiguous rows [M, N] and the affine parameters flattened
    to [N] (None stays None), or None when the shapes do not line up."""
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list, torch.Size)) \
        else (normalized_shape,)
    if not shape or tuple(input.shape[input.dim() - len(shape):]) != shape \
            or any(p is not None and tuple(p.shape) != shape for p in params):
        return None
    n = math.prod(shape)
    return (input.reshape(-1, n).contiguous(),
            *(None if p is None else p.reshape(n).contiguous() for p in params))


def _layer_norm(swap, input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if input.dtype not in FLOAT_DTYPES or any(p is not None and p.dtype != input.dtype
                                              for p in (weight, bias)):
        return swap.fallback("layernorm", "dtype outside the contract")
    rows = _norm_rows(input, normalized_shape, weight, bias)
    if rows is None or input.numel() == 0:
        return swap.fallback("layernorm", "shape outside the contract")
    x, w, b = rows
    return swap.run("layernorm", x=x, weight=w, bias=b, eps=float(eps)).view(input.shape)


def _rms_norm(swap, input, normalized_shape, weight=None, eps=None):
    if input.dtype not in FLOAT_DTYPES or (weight is not None and weight.dtype != input.dtype):
        return swap.fallback("rmsnorm", "dtype outside the contract")
    rows = _norm_rows(input, normalized_shape, weight)
    if rows is None or input.numel() == 0:
        return swap.fallback("rmsnorm", "shape outside the contract")
    x, w = rows
    # F.rms_norm's eps=None means the dtype's machine epsilon.
    eps = torch.finfo(input.dtype).eps if eps is None else float(eps)
    return swap.run("rmsnorm", x=x, weight=w, eps=eps).view(input.shape)


def _last_dim_input(swap, ktype, input, dim, dtype, any_dim=False):
    """The input of a one-dim op (softmax: the last dim; sum: any_dim) cast to its dtype=
    argument, or FALLBACK."""
    if not isinstance(input, torch.Tensor) or input.dim() == 0:
        return swap.fallback(ktype, "not a tensor of at least one dim")
    if any_dim and one_dim(dim, input.dim()) is None:
        return swap.fallback(ktype, "not over exactly one dim")
    if not any_dim and not is_last_dim(dim, input.dim()):
        return swap.fallback(ktype, "not over the last dim")
    if dtype is not None and dtype != input.dtype:
        input = input.to(dtype)
        swap.note(ktype, "dtype= argument: input cast in torch")
    if input.dtype not in FLOAT_DTYPES or input.numel() == 0:
        return swap.fallback(ktype, "dtype outside the contract")
    return input


def _softmax_common(swap, input, dim, dtype):
    input = _last_dim_input(swap, "softmax", input, dim, dtype)
    if input is FALLBACK:
        return FALLBACK
    return swap.run("softmax", x=_rows(input)).view(input.shape)


def _softmax_functional(swap, input, dim=None, _stacklevel=3, dtype=None):
    return _softmax_common(swap, input, dim, dtype)


def _softmax_torch(swap, input, dim, dtype=None):
    return _softmax_common(swap, input, dim, dtype)


def _capturing():
    """A CUDA graph capture, or dynamo tracing: either way a value read back from the device
    cannot steer the Python code (a sync, or a graph break)."""
    return torch.compiler.is_compiling() or \
        (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _hits_ignore_index(swap, target, ignore_index):
    """Whether a target is ignore_index (the contract has none). Reading that back syncs, which a
    CUDA graph capture forbids and dynamo cannot trace without a graph break: there the answer
    of the eager warm-up forwards before it (same inputs, same shapes) is reused, and with none
    the call falls back to torch. A compiled forward keeps the answer it was traced with."""
    key = (tuple(target.shape), ignore_index)
    if _capturing():
        return swap.ignore_index_seen.get(key, True)
    hit = bool((target == ignore_index).any())
    swap.ignore_index_seen[key] = swap.ignore_index_seen.get(key, False) or hit
    return hit


def _cross_entropy(swap, input, target, weight=None, size_average=None, ignore_index=-100,
                   reduce=None, reduction="mean", label_smoothing=0.0):
    reason = None
    if weight is not None or size_average is not None or reduce is not None \
            or reduction != "mean" or label_smoothing:
        reason = "not a plain mean loss"
    elif input.dim() != 2 or target.dim() != 1 or target.dtype != torch.int64 \
            or input.dtype not in FLOAT_DTYPES:
        reason = "not 2-D logits with 1-D int64 targets"
    elif _hits_ignore_index(swap, target, ignore_index):
        reason = "targets hit ignore_index"
    if reason:
        return swap.fallback("cross_entropy", reason)
    loss = swap.run("cross_entropy", logits=input.contiguous(), targets=target.contiguous())
    return loss.to(input.dtype)  # F.cross_entropy returns the logits' dtype


def _sum(swap, input, dim=None, keepdim=False, *, dtype=None):
    input = _last_dim_input(swap, "reduce", input, dim, dtype, any_dim=True)
    if input is FALLBACK:
        return FALLBACK
    d = one_dim(dim, input.dim())
    out = swap.run("reduce", x=input.contiguous(), dim=d)
    return out.unsqueeze(d) if keepdim else out


def _rmsnorm_module(swap, module):
    if "RMSNorm" not in type(module).__name__:
        return None
    weight = getattr(module, "weight", None)
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return "skipped: no 1-D weight"
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return "skipped: no eps attribute"
    if _offset_weight(type(module)):
        return "skipped: scales by (1 + weight)"
    original, eps = module.forward, float(eps)

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dtype != weight.dtype or x.shape[-1] != weight.shape[0]:
            swap.fallback("rmsnorm", "input dtype differs from the weight's")
            return original(x, *args, **kwargs)
        return swap.run("rmsnorm", x=_rows(x), weight=weight, eps=eps).view(x.shape)
    return forward


def _computed_norm(ktype):
    """A hand-written norm module of this type, recognized by what its forward computes
    (autokernel/computed.py), whatever its class is called."""
    def matcher(swap, module):
        if not computed.norm_candidate(module):
            return None
        found, eps = computed.verdict(module)
        if found != ktype:
            return None
        reading = computed.norm_reading(module, ktype, eps)
        if isinstance(reading, str):
            return reading
        weight, bias = reading["weight"], reading["bias"]
        original = module.forward

        def forward(x, *args, **kwargs):
            if args or kwargs or not isinstance(x, torch.Tensor) or x.dtype != weight.dtype \
                    or x.shape[-1] != weight.shape[0] or x.numel() == 0:
                swap.fallback(ktype, "input dtype or width differs from the weight's")
                return original(x, *args, **kwargs)
            extra = {"bias": bias} if ktype == "layernorm" else {}
            return swap.run(ktype, x=_rows(x), weight=weight, eps=eps, **extra).view(x.shape)
        return forward
    return matcher


def _offset_weight(cls):
    """Whether an RMSNorm class scales by (1 + weight), as Gemma's does: not the contract's."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return any(s in source.replace(" ", "") for s in ("1+self.weight", "1.0+self.weight"))


def _swiglu_module(swap, module):
    names = next((n for n in (("w_gate", "w_up", "w_down"), ("gate_proj", "up_proj", "down_proj"))
                  if all(hasattr(module, a) for a in n)), None)
    if names is None:
        return None
    gate, up, down = (getattr(module, a) for a in names)
    if not all(isinstance(m, nn.Linear) for m in (gate, up, down)):
        return None
    if any(m.bias is not None for m in (gate, up, down)):
        return "skipped: projections have a bias"
    act = getattr(module, "act_fn", getattr(module, "act", None))
    is_silu = (act is None and "SwiGLU" in type(module).__name__) or \
        (act is not None and (isinstance(act, nn.SiLU) or "SiLU" in type(act).__name__))
    if not is_silu:
        return "skipped: activation is not SiLU"
    return _fused_mlp_forward(swap, module, gate.weight, up.weight, down.weight)


def _computed_mlp(swap, module):
    """A gated MLP of any names, recognized by what its forward computes (computed.py)."""
    if not computed.mlp_candidate(module) or computed.verdict(module)[0] != "fused_mlp":
        return None
    reading = computed.mlp_reading(module)
    if isinstance(reading, str):
        return reading
    return _fused_mlp_forward(swap, module, **reading)


def _fused_mlp_forward(swap, module, w_gate, w_up, w_down):
    original = module.forward

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dtype != w_gate.dtype or x.dtype not in FLOAT_DTYPES:
            swap.fallback("fused_mlp", "dtype outside the contract")
            return original(x, *args, **kwargs)
        out = swap.run("fused_mlp", x=_rows(x), w_gate=w_gate, w_up=w_up, w_down=w_down)
        return out.view(*x.shape[:-1], w_down.shape[0])
    return forward


# Attention modules whose q/k/v projections and rotary run as one qkv_rotary kernel: these
# attribute names, a RotaryEmbedding child with [max_seq, D/2] tables, and a forward(x) that is
# causal attention over them (confirmed once per class and shapes on a probe input, _ATTENTION).
QKV_NAMES = (("wq", "wk", "wv", "wo"), ("q_proj", "k_proj", "v_proj", "o_proj"))
_ATTENTION = {}  # (class, parameter shapes and dtype) -> None if confirmed, else why not


def _qkv_rotary_module(swap, module):
    names = next((n for n in QKV_NAMES if all(hasattr(module, a) for a in n)), None)
    rotary = getattr(module, "rotary", None)
    if names is None or rotary is None:
        return None
    projections = [getattr(module, a) for a in names]
    cos = getattr(rotary, "cos", None)
    if not all(isinstance(p, nn.Linear) for p in projections) or not isinstance(cos, torch.Tensor) \
            or cos.dim() != 2 or "RotaryEmbedding" not in type(rotary).__name__:
        return None
    wq, wk, wv, wo = projections
    D = 2 * cos.shape[1]
    if not _stackable([wq, wk, wv], D) or wo.weight.dtype != wq.weight.dtype:
        return UNEQUAL_QKV
    refused = _probed(module, projections, lambda: _attention_mismatch(module, names))
    return refused or _qkv_rotary_forward(swap, module, wq, wk, wv, wo, rotary)


UNEQUAL_QKV = "skipped: q/k/v projections of unequal kinds"


def _stackable(projections, D):
    """Whether q/k/v projections (three, or one fused) stack into the kernel's w_qkv: whole
    heads of D, k and v alike, one dtype, all biased or none."""
    rows = [p.weight.shape[0] for p in projections]
    return all(r % D == 0 for r in rows) \
        and (len(projections) == 1 or projections[1].weight.shape == projections[2].weight.shape) \
        and len({p.weight.dtype for p in projections}) == 1 \
        and len({p.bias is None for p in projections}) == 1


def _probed(module, projections, probe):
    """probe() (None: the swap is confirmed, else why not), run once per class, projection
    shapes and dtype."""
    key = (type(module), tuple((tuple(p.weight.shape), p.bias is None) for p in projections),
           projections[0].weight.dtype)
    if key not in _ATTENTION:
        _ATTENTION[key] = probe()
    return _ATTENTION[key]


def _stacked(swap, *linears):
    """[w_q; w_k; w_v] (and their biases): one copy, made once per weight version (one fused
    projection's own weight as it is)."""
    if len(linears) == 1:
        return linears[0].weight, linears[0].bias
    weights = swap.weights.stacked([p.weight for p in linears])
    bias = None if linears[0].bias is None else swap.weights.stacked([p.bias for p in linears])
    return weights, bias


def _qkv_attention(qkv_fn, x, wq, wk, wv, wo, D):
    """Causal attention over q/k/v from qkv_fn(x) -> [B, S, Hq + 2 Hkv, D]: what the swapped
    forward computes (qkv_fn the kernel) and what it is confirmed against (the eager one)."""
    B, S, _ = x.shape
    Hq, Hkv = wq.weight.shape[0] // D, wk.weight.shape[0] // D
    q, k, v = (t.transpose(1, 2) for t in qkv_fn(x, Hkv).split([Hq, Hkv, Hkv], dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
    return wo(y.transpose(1, 2).reshape(B, S, Hq * D))


def _attention_mismatch(layer, names):
    """None when the layer's forward(x) is _qkv_attention on a probe input (a random copy of the
    layer: _random_copy), else why not. names: its q/k/v/o projections' attributes."""
    from autokernel import reference
    gen = torch.Generator().manual_seed(0)
    module = _random_copy(layer, gen)
    wq, wk, wv, wo = (getattr(module, a) for a in names)
    rotary = module.rotary
    weights, bias = _cat_qkv([wq, wk, wv])
    w = wq.weight
    S = min(16, rotary.cos.shape[0])
    x = torch.randn((2, S, w.shape[1]), generator=gen).to(w)
    cos, sin = (t[:S].to(w.dtype) for t in (rotary.cos, rotary.sin))
    try:
        with torch.no_grad():
            got = module(x)
            want = _qkv_attention(lambda t, kv: reference.qkv_rotary_eager(
                t, weights, cos, sin, kv, bias), x, wq, wk, wv, wo, 2 * rotary.cos.shape[1])
    except Exception as e:  # noqa: BLE001  (a forward that needs more than x)
        return f"skipped: forward(x) alone raised {describe(e, 80)}"
    if not isinstance(got, torch.Tensor) or not computed.agrees(got, want, w.dtype):
        return "skipped: forward is not causal attention over rotary q/k (probe mismatch)"
    return None


def _random_copy(layer, gen):
    """A copy of an attention layer with random parameters, for a probe. With its own, a norm on
    q/k whose weights are still all ones (Qwen3's, as initialized) commutes with the rotation:
    the probe would pass, and the swap compute wrong values once trained weights are loaded."""
    module = copy.deepcopy(layer)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen)
            p.copy_(r * p.shape[-1] ** -0.5 if p.dim() > 1 else r * 0.2 + name.endswith("weight"))
    return module


def _cat_qkv(projections):
    """(w_qkv, bias) of q/k/v projections stacked afresh: a probe's, on its copy's weights."""
    bias = None if projections[0].bias is None else torch.cat([p.bias for p in projections])
    return torch.cat([p.weight for p in projections]), bias


def _qkv_rotary_forward(swap, module, wq, wk, wv, wo, rotary):
    original = module.forward
    D = 2 * rotary.cos.shape[1]
    tables = {}

    def qkv(x, kv_heads):
        cos, sin = _table_rows(rotary, tables, 0, x.shape[1], x.dtype)
        weights, bias = _stacked(swap, wq, wk, wv)
        return swap.run("qkv_rotary", x=x, w_qkv=weights, cos=cos, sin=sin, kv_heads=kv_heads,
                        bias=bias)

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dim() != 3 or x.dtype != wq.weight.dtype \
                or x.shape[1] > rotary.cos.shape[0] or x.dtype not in FLOAT_DTYPES:
            swap.fallback("qkv_rotary", "arguments outside the contract")
            return original(x, *args, **kwargs)
        return _qkv_attention(qkv, x, wq, wk, wv, wo, D)
    return forward


def _rotary_module(swap, module):
    """models/layers.RotaryEmbedding: real cos/sin buffers [max_seq, D/2], forward(x, offset)."""
    cos, sin = getattr(module, "cos", None), getattr(module, "sin", None)
    if "RotaryEmbedding" not in type(module).__name__ or not isinstance(cos, torch.Tensor) \
            or not isinstance(sin, torch.Tensor):
        return None
    if cos.dim() != 2 or cos.shape != sin.shape:
        return "skipped: cos/sin tables are not [max_seq, D/2]"
    original = module.forward
    tables = {}

    def forward(x, offset=0):
        S, D = x.shape[-2], x.shape[-1]
        if x.dim() != 4 or D != 2 * module.cos.shape[1] or offset + S > module.cos.shape[0] \
                or x.dtype not in FLOAT_DTYPES:
            swap.fallback("rotary_embedding", "shape or dtype outside the contract")
            return original(x, offset)
        c, s = _table_rows(module, tables, offset, S, x.dtype)
        return swap.run("rotary_embedding", x=x.contiguous(), cos=c, sin=s)
    return forward


def _table_rows(rotary, tables, offset, S, dtype):
    """A RotaryEmbedding's cos/sin rows offset..offset+S-1 in dtype, sliced and cast once per
    (offset, length, dtype) into `tables`. Under torch.compile the graph slices and casts: a
    data_ptr() key would break it."""
    if torch.compiler.is_compiling():
        return tuple(t[offset:offset + S].to(dtype).contiguous() for t in (rotary.cos, rotary.sin))
    key = (offset, S, dtype, rotary.cos.data_ptr())
    if key not in tables:
        tables[key] = tuple(t[offset:offset + S].to(dtype).contiguous()
                            for t in (rotary.cos, rotary.sin))
    return tables[key]


class _HalfTables:
    """transformers' cos/sin are [B, S, D] with the [S, D/2] table duplicated along the last dim
    and repeated over the batch. Check that once per table object and keep the [S, D/2] halves.
    The check reads values back (a sync), which a CUDA graph capture forbids and torch.compile
    cannot trace: there the verdict of the eager forwards at the same shapes is reused (the
    tables are rebuilt every forward, the same way), and with none the call falls back to torch."""

    def __init__(self):
        self.cache = {}
        self.verdicts = {}  # (shape, dtype) of the tables -> all checked so far had the layout

    def get(self, cos, sin, dtype):
        tracing = torch.compiler.is_compiling()
        hit = None if tracing else self.cache.get(id(cos))
        if hit and hit[0]() is cos and hit[1]() is sin:
            return hit[2]
        halves = None
        if cos.dim() in (2, 3) and cos.shape == sin.shape and cos.shape[-1] % 2 == 0:
            c, s = (t.reshape(-1, *t.shape[-2:]) for t in (cos, sin))
            h = c.shape[-1] // 2
            key = (tuple(cos.shape), cos.dtype)
            if _capturing():  # tracing included: no value read back steers a trace
                ok = self.verdicts.get(key, False)
            else:
                ok = all(torch.equal(t[..., :h], t[..., h:]) and torch.equal(t, t[:1].expand_as(t))
                         for t in (c, s))
                self.verdicts[key] = self.verdicts.get(key, True) and ok
            if ok:
                halves = tuple(t[0, :, :h].to(dtype).contiguous() for t in (c, s))
        if not tracing:
            self.cache[id(cos)] = (weakref.ref(cos), weakref.ref(sin), halves)
        return halves


def _hf_rotary_patches(swap, model):
    """Patch apply_rotary_pos_emb in the transformers modules the model's classes come from
    (LLaMA and the models that copy its half-split rotate_half), restored on exit. Tables
    narrower than the heads (GPT-NeoX's rotary_pct: the first dims turn, the rest pass through)
    take the kernel on those dims, once the model's own function has agreed on the first eager
    call at that shape (a copy of LLaMA's would not broadcast there at all)."""
    patches = []
    for owner in _hf_rotary_owners(model):
        original, tables, partial = owner.apply_rotary_pos_emb, _HalfTables(), {}

        def apply_rotary_pos_emb(q, k, cos, sin, *args, _original=original, _tables=tables,
                                 _partial=partial, **kwargs):
            if not swap.active("rotary_embedding"):
                return _original(q, k, cos, sin, *args, **kwargs)
            unsqueeze_dim = kwargs.get("unsqueeze_dim", 1)
            turned = cos.shape[-1]
            usable = not args and set(kwargs) <= {"unsqueeze_dim"} and unsqueeze_dim == 1 \
                and q.dim() == 4 and k.dim() == 4 and q.dtype in FLOAT_DTYPES \
                and k.dtype == q.dtype and k.shape[-1] == q.shape[-1] >= turned \
                and q.shape[-2] == cos.shape[-2] and k.shape[-2] == cos.shape[-2]
            halves = _tables.get(cos, sin, q.dtype) if usable else None
            if halves is None:
                swap.fallback("rotary_embedding", "cos/sin not the shared half-duplicated tables")
                return _original(q, k, cos, sin, *args, **kwargs)
            c, s = halves
            if turned == q.shape[-1]:
                return (swap.run("rotary_embedding", x=q.contiguous(), cos=c, sin=s),
                        swap.run("rotary_embedding", x=k.contiguous(), cos=c, sin=s))
            key = (tuple(q.shape), tuple(k.shape), turned, q.dtype)
            agreed = _partial.get(key)
            if agreed is None and _capturing():  # no value read back can steer a trace
                swap.fallback("rotary_embedding", "partial rotary at a shape no eager call checked")
                return _original(q, k, cos, sin, **kwargs)
            differs = "partial rotary: the model's function differs"
            if agreed is False:
                swap.fallback("rotary_embedding", differs)
                return _original(q, k, cos, sin, **kwargs)
            ours = tuple(torch.cat([swap.run("rotary_embedding", x=t[..., :turned].contiguous(),
                                             cos=c, sin=s), t[..., turned:]], dim=-1)
                         for t in (q, k))
            if agreed is None:
                theirs = _original(q, k, cos, sin, **kwargs)
                _partial[key] = agreed = all(computed.agrees(o, w, q.dtype)
                                             for o, w in zip(ours, theirs))
                if not agreed:
                    swap.fallback("rotary_embedding", differs)
                    return theirs
            return ours
        patches.append((owner, "apply_rotary_pos_emb", _passing_on(apply_rotary_pos_emb, swap)))
    return patches


def _passing_on(apply, flag):
    """apply_rotary_pos_emb that, once flag.qk_rotated is set (a qkv_rotary kernel rotated the
    layer's q and k on their way in, _hf_qkv_patches), hands q and k back as they are and clears
    it; apply otherwise."""
    def apply_rotary_pos_emb(q, k, *args, **kwargs):
        if flag.qk_rotated:
            flag.qk_rotated = False
            return q, k
        return apply(q, k, *args, **kwargs)
    return apply_rotary_pos_emb


def _hf_rotary_owners(model):
    """The transformers modules the model's classes come from that define LLaMA's half-split
    apply_rotary_pos_emb (and rotate_half)."""
    owners = {sys.modules.get(type(m).__module__) for m in model.modules()}
    return [o for o in owners if o is not None and o.__name__.startswith("transformers.")
            and callable(getattr(o, "apply_rotary_pos_emb", None)) and hasattr(o, "rotate_half")]


# transformers' attention layers run their q/k/v projections and rotary as one qkv_rotary call:
# the layer's own forward still runs (masks, caches, attention backends, sliding windows stay
# transformers'), its projections answer from the kernel's output made on entry, and its
# apply_rotary_pos_emb passes the rotated q and k on. Confirmed once per class and shapes on a
# probe input against the layer as it is (a norm on q/k before the rotary, Qwen3's, differs).
def _hf_qkv_patches(swap, model):
    owners = {o.__name__: o for o in _hf_rotary_owners(model)}
    patches = []
    for module in model.modules():
        owner = owners.get(type(module).__module__)
        found = _hf_projections(module) if owner is not None else None
        if found is None:
            continue
        if isinstance(found, str):
            swap.skipped["qkv_rotary"][found] += 1
            continue
        refused = _probed(module, found[0], lambda: _hf_qkv_mismatch(module, owner))
        if refused:
            swap.skipped["qkv_rotary"][refused] += 1
            continue
        patches += _hf_qkv_forwards(module, found, swap, lambda ps: _stacked(swap, *ps),
                                    functools.partial(swap.run, "qkv_rotary"),
                                    functools.partial(swap.fallback, "qkv_rotary"))
    if patches and not swap.active("rotary_embedding"):
        patches += _hf_rotary_patches(swap, model)  # for its pass-through of rotated q and k
    return patches


def _hf_projections(module):
    """(projections, Hq, Hkv) of a transformers attention layer: q_proj, k_proj and v_proj, or
    one qkv_proj (Phi-3) whose rows are q's, k's and v's; None if it is not one, or why not."""
    D = getattr(module, "head_dim", None)
    if not isinstance(D, int) or not isinstance(getattr(module, "o_proj", None), nn.Linear) \
            or "position_embeddings" not in inspect.signature(module.forward).parameters:
        return None
    separate = [getattr(module, a, None) for a in ("q_proj", "k_proj", "v_proj")]
    if all(isinstance(p, nn.Linear) for p in separate):
        projections = separate
        Hq, Hkv = separate[0].weight.shape[0] // D, separate[1].weight.shape[0] // D
    elif isinstance(getattr(module, "qkv_proj", None), nn.Linear):
        projections = [module.qkv_proj]
        config = getattr(module, "config", None)
        Hq = getattr(config, "num_attention_heads", 0)
        Hkv = getattr(config, "num_key_value_heads", None) or Hq
    else:
        return None
    if D % 2 or not _stackable(projections, D) \
            or sum(p.weight.shape[0] for p in projections) != (Hq + 2 * Hkv) * D or Hq == 0:
        return UNEQUAL_QKV
    return projections, Hq, Hkv


def _hf_qkv_forwards(module, found, flag, stacked, run, fallback):
    """The patches that make `module` (a transformers attention layer whose projections are
    found = _hf_projections(module)) take q, k and v from one run(x=..., w_qkv=..., ...) ->
    [B, S, Hq + 2 Hkv, D]; flag.qk_rotated tells its apply_rotary_pos_emb that q and k are
    rotated already."""
    projections, Hq, Hkv = found
    w = projections[0].weight
    D = module.head_dim
    original, tables, stash = module.forward, _HalfTables(), {}

    def forward(hidden_states, position_embeddings=None, *args, **kwargs):
        x, pe = hidden_states, position_embeddings
        usable = isinstance(pe, tuple) and len(pe) == 2 and isinstance(x, torch.Tensor) \
            and x.dim() == 3 and x.dtype == w.dtype and x.dtype in FLOAT_DTYPES \
            and not module.training and pe[0].shape[-1] == D and pe[0].shape[-2] == x.shape[1]
        halves = tables.get(*pe, x.dtype) if usable else None
        if halves is None:
            fallback("cos/sin not the shared half-duplicated tables of the heads")
            return original(hidden_states, position_embeddings, *args, **kwargs)
        weights, bias = stacked(projections)
        qkv = run(x=x, w_qkv=weights, cos=halves[0], sin=halves[1], kv_heads=Hkv, bias=bias)
        # [B, S, heads, D] slices seen as [B, S, heads * D]: what the layer's .view(B, S, -1, D)
        # .transpose(1, 2) turns back into the kernel's layout, with no copy
        parts = qkv.split([Hq, Hkv, Hkv], dim=2) if len(projections) == 3 else (qkv,)
        for i, t in enumerate(parts):
            stash[i] = (x, t.flatten(2))
        flag.qk_rotated = True
        try:
            return original(hidden_states, position_embeddings, *args, **kwargs)
        finally:
            stash.clear()
            flag.qk_rotated = False

    def answering(i):
        plain = projections[i].forward

        def projection(x):
            entry = stash.pop(i, None)  # answered for the layer's input only (not, say, a
            return entry[1] if entry is not None and entry[0] is x else plain(x)  # cross-input)
        return projection
    return [(module, "forward", forward)] + [(p, "forward", answering(i))
                                             for i, p in enumerate(projections)]


def _hf_qkv_mismatch(layer, owner):
    """None when the layer with _hf_qkv_forwards (the eager reference as the kernel) computes what
    it computes alone on a probe input (a random copy of the layer: _random_copy), else why
    not."""
    import types

    from autokernel import reference
    gen = torch.Generator().manual_seed(0)
    module = _random_copy(layer, gen)
    found = _hf_projections(module)
    w = found[0][0].weight
    D, S = module.head_dim, 16
    x = torch.randn((2, S, w.shape[1]), generator=gen).to(w)
    half = torch.randn((S, D // 2), generator=gen)
    cos, sin = (f(torch.cat([half, half], -1)).expand(2, S, D).contiguous().to(w)
                for f in (torch.cos, torch.sin))
    flag = types.SimpleNamespace(qk_rotated=False)
    patches = _hf_qkv_forwards(module, found, flag, _cat_qkv,
                               lambda **inputs: reference.qkv_rotary_eager(**inputs),
                               lambda reason: None)
    patches.append((owner, "apply_rotary_pos_emb",
                    _passing_on(owner.apply_rotary_pos_emb, flag)))
    try:
        with torch.no_grad():
            want = module(x, position_embeddings=(cos, sin), attention_mask=None)
            with _applied(patches):
                got = module(x, position_embeddings=(cos, sin), attention_mask=None)
    except Exception as e:  # noqa: BLE001
        return f"skipped: the layer's forward raised {describe(e, 80)}"
    want, got = (t[0] if isinstance(t, tuple) else t for t in (want, got))
    if not isinstance(got, torch.Tensor) or not computed.agrees(got, want, w.dtype):
        return "skipped: q/k/v are not the projections rotated by apply_rotary_pos_emb " \
            "(probe mismatch)"
    return None


def _hf_mask_patches(swap, model):
    """transformers lets SDPA's is_causal do the masking when nothing is padded, and builds a full
    mask otherwise (which no flash kernel takes). While dynamo traces, torch before 2.14 answers
    torch.compiler.is_exporting() with True, so transformers builds the mask in every compiled
    forward. Where its skip depends on shapes alone (no padding mask, no sliding window reached,
    an int offset: a tensor one means a static cache), the patched checks answer as the eager
    forward does; otherwise, or where transformers' signature is not the one known here, the
    original decides."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None:
        return []

    def no_window(kv_length, local_attention_size):
        return local_attention_size is None or kv_length < local_attention_size

    def ignore_causal(padding_mask, q_length, kv_length, q_offset, kv_offset,
                      local_attention_size=None, _original=None):
        if padding_mask is None and not isinstance(q_offset, torch.Tensor) \
                and no_window(kv_length, local_attention_size):
            return q_length == 1 or kv_length == q_length
        return _original(padding_mask, q_length, kv_length, q_offset, kv_offset,
                         local_attention_size)

    def ignore_bidirectional(padding_mask, kv_length, local_attention_size=None, _original=None):
        if padding_mask is None and no_window(kv_length, local_attention_size):
            return True
        return _original(padding_mask, kv_length, local_attention_size)

    patches = []
    for name, check in (("_ignore_causal_mask_sdpa", ignore_causal),
                        ("_ignore_bidirectional_mask_sdpa", ignore_bidirectional)):
        original = getattr(masking, name, None)
        known = list(inspect.signature(check).parameters)[:-1]
        if callable(original) and list(inspect.signature(original).parameters) == known:
            patches.append((masking, name, functools.partial(check, _original=original)))
    return patches + _hf_packed_patches(masking, model)


def _hf_packed_patches(masking, model):
    """With no attention mask, transformers looks for packed sequences (positions restarting
    inside a row) by reading position_ids: a value read that dynamo cannot trace, so every
    compiled forward builds the full mask. Where the model numbered the tokens itself (the
    caller passed no position_ids: the model's forward takes arange + past length), no row is
    packed, and the patched check says so without reading anything; position_ids the caller
    passed are still read by the original check."""
    original = getattr(masking, "find_packed_sequence_indices", None)
    if not callable(original):
        return []
    numbered = []  # one entry per mask-building forward running: did it number the tokens?

    def find_packed_sequence_indices(position_ids):
        return None if numbered and numbered[-1] else original(position_ids)

    def numbering(forward, index):
        def wrapper(*args, **kwargs):
            given = args[index] if len(args) > index else kwargs.get("position_ids")
            numbered.append(given is None)
            try:
                return forward(*args, **kwargs)
            finally:
                numbered.pop()
        return wrapper

    patches = []
    for module in model.modules():  # the forwards that build the mask from their position_ids
        code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
        if code is None or "create_causal_mask" not in code.co_names:
            continue  # most modules: skipped before any signature is read
        params = list(inspect.signature(module.forward).parameters)
        if "position_ids" in params:
            patches.append((module, "forward", numbering(module.forward,
                                                         params.index("position_ids"))))
    if not patches:
        return []
    return patches + [(masking, "find_packed_sequence_indices", find_packed_sequence_indices)]


def _qkv_shape(t):
    D = 2 * t["cos"].shape[-1]
    heads, kv = t["w_qkv"].shape[0] // D, t["kv_heads"]
    return (*t["x"].shape, heads - 2 * kv, kv, D)


def _first_arg_shape(inputs):
    return tuple(next(iter(inputs.values())).shape)


@dataclass(frozen=True)
class SwapRule:
    # (owner, attribute) -> handler. Model code looks these up at call time (F.linear(...),
    # x.sum(-1), x @ W), so Swap.installed patches exactly them while the rule's type is active.
    functions: dict = field(default_factory=dict)
    modules: tuple = ()                            # module matchers
    patches: tuple = ()                            # module-attribute patchers
    contract_shape: object = _first_arg_shape      # {arg: tensor} -> the type's shape tuple


T = torch.Tensor
SWAP_RULES = {
    "matmul": SwapRule(functions={(F, "linear"): _linear, (torch, "addmm"): _addmm,
                                  (torch, "matmul"): _matmul, (T, "matmul"): _matmul,
                                  (T, "__matmul__"): _matmul},  # x @ W
                       modules=(_projection_act_module,),
                       contract_shape=lambda t: (t["A"].shape[0], t["B"].shape[1],
                                                 t["A"].shape[1])),
    "softmax": SwapRule(functions={(F, "softmax"): _softmax_functional,
                                   (torch, "softmax"): _softmax_torch,
                                   (T, "softmax"): _softmax_torch}),
    "layernorm": SwapRule(functions={(F, "layer_norm"): _layer_norm},
                          modules=(_computed_norm("layernorm"),)),
    "rmsnorm": SwapRule(functions={(F, "rms_norm"): _rms_norm},
                        modules=(_rmsnorm_module, _computed_norm("rmsnorm"))),
    "flash_attention": SwapRule(functions={(F, "scaled_dot_product_attention"): _sdpa},
                                patches=(_hf_mask_patches,)),
    "fused_mlp": SwapRule(modules=(_swiglu_module, _computed_mlp),
                          contract_shape=lambda t: (t["x"].shape[0], t["x"].shape[1],
                                                    t["w_gate"].shape[0])),
    "cross_entropy": SwapRule(functions={(F, "cross_entropy"): _cross_entropy}),
    "rotary_embedding": SwapRule(modules=(_rotary_module,), patches=(_hf_rotary_patches,)),
    "reduce": SwapRule(functions={(torch, "sum"): _sum, (T, "sum"): _sum},
                       contract_shape=lambda t: reduce_shape(tuple(t["x"].shape),
                                                             t["dim"] % t["x"].dim())[0]),
    "qkv_rotary": SwapRule(modules=(_qkv_rotary_module,), patches=(_hf_qkv_patches,),
                           contract_shape=_qkv_shape),
}
assert set(SWAP_RULES) == set(autokernel.KERNEL_TYPE_NAMES)
