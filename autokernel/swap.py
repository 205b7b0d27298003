"""
How a kernel gets into a model.

A kernel file, loaded, is a checked call of its type's contract (autokernel/kernel_call.py). A
Swap plugs such calls into one model for the length of a `with swap.installed(model):` block and
records what happened: calls and shapes per kernel, fallbacks with their reasons, modules it
could not swap. verify.py runs models with swaps. Swap(..., compiled=True) calls each kernel
through its torch custom op (autokernel/ops.py), so torch.compile of the model inside
`swap.installed` traces the patched entry points and keeps each kernel call as one opaque node;
calls are then counted by the op's body as the compiled forward runs it. Dynamo guards on the
patched entry points: the compiled model traced inside the block is traced again outside it.

The rules (SWAP_RULES, one entry per kernel type):
  * While a kernel type is active, the torch entry points its rule handles are patched (and
    restored on exit; autokernel/patching.py): F.linear, torch.addmm (transformers' Conv1D) and
    x @ W with a 2-D W (matmul, the bias going into the kernel's epilogue),
    F.scaled_dot_product_attention (no mask or dropout; causal or not, any scale, grouped-query
    heads read by the kernel: flash_attention; a few queries over a longer static KV cache under
    a causal mask, a generation step's: decode_attention), F.layer_norm and F.rms_norm over one or several
    trailing dims, with their eps and with or without affine parameters (layernorm, rmsnorm),
    F.softmax / torch.softmax / Tensor.softmax over the last dim (softmax), F.cross_entropy (mean
    over 2-D logits: cross_entropy), torch.sum / Tensor.sum over any one dim (reduce): the
    handlers are autokernel/swap_torch.py.
    Patching, not a TorchFunctionMode: a mode would tax every torch call of the forward. The
    price: a name bound before the swap (`from torch.nn.functional import linear`) is not seen.
  * Module swaps (autokernel/swap_modules.py): RMSNorm-like modules (rmsnorm), SwiGLU MLPs
    (fused_mlp), models/layers.RotaryEmbedding (rotary_embedding), attention modules whose q/k/v
    projections and rotary are one kernel, confirmed on a probe input (qkv_rotary), and norm and
    gated-MLP modules of any name whose forward computes rmsnorm, layernorm or fused_mlp
    (autokernel/computed.py). transformers' models get patches of their own
    (autokernel/swap_hf.py): LLaMA-style apply_rotary_pos_emb (rotary_embedding), attention
    layers with their own forward kept (qkv_rotary), and the mask checks that let SDPA's
    is_causal do the masking (flash_attention).
  * A call whose arguments fall outside the kernel contract (an attention mask, dropout, GQA
    without enable_gqa, ...) runs the original op and is counted as a fallback with its reason.
    A kernel that never ran during the forward is a FAILURE, not a replacement.
  * A computation a kernel type's pattern recognizes where the model writes it out as torch ops
    (attention as q @ k^T, a causal mask, softmax, @ v: flash_attention), which no entry point
    or module class leads to, is plugged into the graph of the module instance that holds it:
    the forward captured by TorchDynamo at the model's first forward, the match replaced by the
    kernel's call (through swap.run, as the SDPA handler calls it), the rewritten forward used
    once a first call agrees with the module's own (autokernel/swap_graph.py; GRAPH_RULES
    there, one entry per type). Eager and inside torch.compile.
  * Region kernels (a ModelNew for a piece of the model's own code) replace the forward of each
    module instance the plan names, on the instance's own parameters, once a first call agrees
    with the module's own forward (autokernel/swap_regions.py); inside torch.compile, one
    custom op per call.
  * Glue outside the kernels is torch and is counted in the timings: non-contiguous arguments
    are copied to contiguous ones, cos/sin tables are sliced and cast. Weights for the matmul
    kernel are transposed to contiguous [K, N] copies, their rows padded to 128 bytes, ONCE per
    weight (autokernel/weight_cache.py).
"""
import contextlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

import autokernel
from autokernel import swap_graph, swap_hf, swap_modules, swap_regions, swap_torch
from autokernel.kernel_call import Kernel, KernelOp, contract_shape
from autokernel.patching import (FALLBACK, applying, fast_path_off, known_to_the_compiler,
                                 patched)
from autokernel.weight_cache import WeightCache


class Swap:
    """Kernels plugged into one model: dispatch by type (and declared shape), call counts, shapes
    seen, fallbacks with reasons, modules skipped with reasons."""

    def __init__(self, kernels, weights=None, weight_layout="copy", compiled=False):
        self.kernels = list(kernels)
        self.compiled = compiled  # kernels called through their custom ops (torch.compile)
        self.by_type = defaultdict(list)  # type -> its KernelOps, in the order given
        self.regions = [k for k in self.kernels if k.kernel_type == "region"]
        for k in self.kernels:
            if k.kernel_type != "region":
                self.by_type[k.kernel_type].append(KernelOp(k, compiled, self._count))
        self.weights = weights or WeightCache()
        self.weight_layout = weight_layout
        self.busy = False  # inside a kernel_fn: its own torch calls pass straight through
        # a transformers attention layer's q and k came rotated out of a qkv_rotary kernel:
        # its apply_rotary_pos_emb passes them on (swap_hf.qkv_patches)
        self.qk_rotated = False
        self.ignore_index_seen = {}  # (targets shape, ignore_index) -> hit (swap_torch.py)
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
        shape = model_shape or contract_shape(ktype, inputs)
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
    def compiling(self, patches):
        """A compiled swap's settings: inductor's pass that folds the adds around matmul ops
        into their residual, and Dynamo's room to compile each patched forward."""
        if not self.compiled:
            yield
            return
        fusions = contextlib.nullcontext()
        if self.active("matmul"):
            from autokernel import fusion  # imports inductor: only for a compiled swap
            fusions = fusion.installed()
        with room_to_compile_each(patches), fusions:
            yield

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
        known_to_the_compiler(self.compiled)
        patches, swapped, entries = [], set(), set()
        for ktype, rule in SWAP_RULES.items():
            if self.active(ktype):
                for (owner, attr), handler in rule.functions.items():
                    if (owner, attr) not in entries:  # two types may share one handler
                        entries.add((owner, attr))
                        patches.append((owner, attr, patched(self, getattr(owner, attr),
                                                             handler)))
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
        if self.regions:  # each instance's forward (swap_regions.py)
            patches += swap_regions.patches(self, model)
        # Last, on the model's first forward: computations it writes out as torch ops that a
        # type's kernel takes, plugged into its graph (autokernel/swap_graph.py).
        with applying(patches) as applied, self.compiling(patches), fast_path_off(), \
                swap_graph.installed(self, model, applied, ENTRY_POINTS):
            yield self


def room_to_compile_each(patches):
    """Dynamo's recompile limit raised to the number of patched forwards. Each is a closure of
    one code object over its own module and weights; where a graph break leaves it a frame of
    its own (transformers' attention layers on torch 2.11), Dynamo compiles it once per layer,
    and at its default limit of 8 ran every later layer's patched forward uncompiled (a
    1B Llama's last 8 of 16 attention layers, on the H100)."""
    import torch._dynamo
    config = torch._dynamo.config
    forwards = sum(1 for _, attr, _ in patches if attr == "forward")
    return config.patch(recompile_limit=max(config.recompile_limit, forwards + 8),
                        accumulated_recompile_limit=max(config.accumulated_recompile_limit,
                                                        4 * forwards + 64))


def pluggable_types(model, forward, types=None, reasons=None):
    """The kernel types a swap plugs a kernel into in this model, by one forward(model) with
    each of `types` (default: all) swapped for its eager reference: a computation the profiler
    recognized but neither a swap rule nor the graph swap reaches (attention written out with a
    mask the forward's caller passes, say) is absent; reasons, a dict, gets each absent type's
    fallback reasons. The answer depends on the set: a type can take a call site from another
    (with qkv_rotary in, a LLaMA attention layer's rotation is no longer rotary_embedding's;
    with flash_attention in, a written-out attention's softmax is no longer softmax's)."""
    from autokernel import reference
    types = [t for t in autokernel.KERNEL_TYPE_NAMES if types is None or t in types]
    stand_ins = [Kernel(t, t, Path(reference.__file__), getattr(reference, f"{t}_eager"))
                 for t in types]
    swap = Swap(stand_ins, weight_layout="view")
    with torch.no_grad(), swap.installed(model):  # (inference_mode would make any state the
        forward(model)                            # model builds lazily inference tensors)
    plugged = {t for t in types if swap.calls[t]}
    if reasons is not None:
        reasons.update({t: list(swap.fallbacks[t]) for t in types
                        if t not in plugged and swap.fallbacks[t]})
    return plugged


@dataclass(frozen=True)
class SwapRule:
    """A kernel type's rule. A function handler gets the intercepted call's arguments and returns
    the result or FALLBACK (after swap.fallback(type, reason)); a module matcher returns None
    (not its kind), a reason string (its kind, but not swappable) or a replacement forward; a
    patcher returns [(owner, attribute, replacement)]."""
    # (owner, attribute) -> handler. Model code looks these up at call time (F.linear(...),
    # x.sum(-1), x @ W), so Swap.installed patches exactly them while the rule's type is active.
    functions: dict = field(default_factory=dict)
    modules: tuple = ()                            # module matchers
    patches: tuple = ()                            # module-attribute patchers


T = torch.Tensor
SWAP_RULES = {
    "matmul": SwapRule(functions={(F, "linear"): swap_torch.linear,
                                  (torch, "addmm"): swap_torch.addmm,
                                  (torch, "matmul"): swap_torch.matmul,
                                  (T, "matmul"): swap_torch.matmul,
                                  (T, "__matmul__"): swap_torch.matmul},  # x @ W
                       modules=(swap_modules.projection_act_module,),
                       patches=(swap_torch.traced_through,)),
    "softmax": SwapRule(functions={(F, "softmax"): swap_torch.softmax_functional,
                                   (torch, "softmax"): swap_torch.softmax_torch,
                                   (T, "softmax"): swap_torch.softmax_torch}),
    "layernorm": SwapRule(functions={(F, "layer_norm"): swap_torch.layer_norm},
                          modules=(swap_modules.computed_norm("layernorm"),)),
    "rmsnorm": SwapRule(functions={(F, "rms_norm"): swap_torch.rms_norm},
                        modules=(swap_modules.rmsnorm_module,
                                 swap_modules.computed_norm("rmsnorm"))),
    "flash_attention": SwapRule(functions={(F, "scaled_dot_product_attention"): swap_torch.sdpa},
                                patches=(swap_hf.mask_patches,)),
    "fused_mlp": SwapRule(modules=(swap_modules.swiglu_module, swap_modules.computed_mlp)),
    "cross_entropy": SwapRule(functions={(F, "cross_entropy"): swap_torch.cross_entropy}),
    "rotary_embedding": SwapRule(modules=(swap_modules.rotary_module,),
                                 patches=(swap_hf.rotary_patches,)),
    "reduce": SwapRule(functions={(torch, "sum"): swap_torch.torch_sum,
                                  (T, "sum"): swap_torch.torch_sum}),
    "qkv_rotary": SwapRule(modules=(swap_modules.qkv_rotary_module,),
                           patches=(swap_hf.qkv_patches,)),
    # the same entry point as flash_attention: one handler tells a decode step's call apart
    "decode_attention": SwapRule(functions={(F, "scaled_dot_product_attention"):
                                            swap_torch.sdpa},
                                 patches=(swap_hf.gqa_patches,)),
}
assert set(SWAP_RULES) == set(autokernel.KERNEL_TYPE_NAMES)
# Every torch entry point a rule patches: a graph swap's rewritten forward looks them up when it
# runs, so the rules see those calls there too.
ENTRY_POINTS = [key for rule in SWAP_RULES.values() for key in rule.functions]
