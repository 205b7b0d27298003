"""
verify.py: plug the kept kernels back into the model, run it, and report whether it still computes
the same thing and how much faster it got end to end.

    uv run verify.py                      # plan.json's kernels, the model profile.json recorded
    uv run verify.py --model models/llama.py --config compact --input-shape 8x2048 --dtype bf16
    uv run verify.py --model models/gpt2.py --input-shape 8x1024 --dtype bf16 --starters
    uv run verify.py --model models/custom.py --kernels kernels/softmax.py,kernels/reduce.py
    uv run verify.py --module transformers --hf-config tiny-llama --starters
    uv run verify.py ... --diagnose       # each kernel alone: which one breaks the model?
    uv run verify.py ... --cuda-graphs    # time as CUDA graph replays (no launch overhead)

The model flags are profile.py's (add_model_args / load_model); with none given, the flags
recorded in workspace/profile.json are reused. Kernels come from
workspace/plan.json (extract.py's list; each file holds that kernel's best kept version), from
--kernels FILE[,FILE], or from --starters (every kernels/*.py; a starter that finds nothing
to replace in this model is listed as "unused", not as a replacement and not as a failure).

How kernels get in (SWAP_RULES below, one entry per kernel type):
  * While a kernel type is active, the torch entry points its rule handles are patched (and
    restored on exit): F.linear, torch.addmm (transformers' Conv1D) and x @ W with a 2-D W
    (matmul), F.scaled_dot_product_attention (causal, no mask/dropout, default scale:
    flash_attention; GQA key/value heads are repeated), F.layer_norm (layernorm), F.softmax /
    torch.softmax / Tensor.softmax over the last dim (softmax), F.cross_entropy (mean over 2-D
    logits: cross_entropy), torch.sum / Tensor.sum over the last dim (reduce) and F.rms_norm.
    Patching, not a TorchFunctionMode: a mode would tax every torch call of the forward. The
    price: a name bound before the swap (`from torch.nn.functional import linear`) is not seen.
  * Module swaps: RMSNorm-like modules (rmsnorm), SwiGLU MLPs with w_gate/w_up/w_down or
    gate_proj/up_proj/down_proj (fused_mlp), models/layers.RotaryEmbedding and transformers'
    LLaMA-style apply_rotary_pos_emb (rotary_embedding).
  * A call whose arguments fall outside the kernel contract (an attention mask, an eps that is not
    the contract's, GQA without enable_gqa, ...) runs the original op and is counted as a fallback
    with its reason. A kernel that never ran during the forward is a FAILURE, not a replacement.
  * Glue outside the kernels is torch and is counted in the timings: F.linear's and addmm's
    bias is added after the matmul kernel, non-contiguous arguments are copied to contiguous
    ones, cos/sin tables are sliced and cast. Weights for the matmul kernel are transposed to
    contiguous [K, N] copies ONCE per weight (a load-time layout change, like a serving
    engine's; --weight-layout view passes the strided W.t() view instead, for kernels that
    honour strides). A copy whose rows would not be a multiple of 16 bytes (GPT-2's vocabulary
    of 50257) gets zero columns up to the next multiple, and the kernel's output is viewed
    back to N columns: unaligned rows rule out vector loads and TMA and made GPT-2's lm_head
    several times slower (torch.compile pads such matmuls too; nanoGPT pads its vocabulary).
    The kernel is picked and reported by the model's shape, N=50257.

Correctness: the forward's logits (for a model that returns only a loss, the logits given to
F.cross_entropy, and the loss too) are compared with the original model's, in the same dtype.
  rel_err    = max|y - y_ref| / max|y_ref|, must be <= E2E_TOLERANCE[dtype]
               (fp32 1e-3, fp16 2e-2, bf16 5e-2: measured noise between two correct bf16
               implementations of a 6-layer random-init LLaMA is ~1e-2, fp16 ~1.3e-3).
  top1       = strict argmax agreement over positions: reported only, because randomly
               initialised models have near-tied logits whose argmax flips under rounding noise.
  top1_tie_aware = a position agrees when the kernel model's top token is within the tolerance
               band (E2E_TOLERANCE * max|y_ref|) of the reference's best: must be >= TOP1_MIN
               (fp32 99%, fp16/bf16 97%).

Timing: median of --repeat warm forwards (CUDA events on a GPU; perf_counter on a CPU, where the
Triton interpreter makes the numbers meaningless and they are labelled so) for the original
model in eager mode, torch.compile of the original (CUDA only unless --compile-backend is given;
--no-compile skips it), and the model with all kernels. Each kernel's share of the gain: the model
is timed with ONLY that kernel swapped in; gain_ms = eager_ms - alone_ms, share = gain_ms /
(eager_ms - kernels_ms), null when all kernels together lose. Shares need not add up to 100%
(kernels interact, timings are noisy).
When some kernels gain and others lose, the gainers are also timed together: what shipping only
them would give.
--cuda-graphs times all of these as replays of a CUDA graph of the forward. A starter's call costs
tens of microseconds of host time (on the H100 machine, 40-190 us against 15-30 for the torch op
it replaces), so a forward with many swapped calls can become host-bound and lose to eager even
when every kernel is faster on the GPU, and plain-launch timings swing with the host's load;
graphs remove launch overhead for every variant alike, as a serving engine would.

--diagnose runs each kernel alone against the original model and names every kernel that breaks
it, one line each; it skips the timings.

Writes workspace/verify.json (--out to change):
  {"model": str, "device": str, "dtype": "bf16", "timing_meaningful": bool, "passed": bool,
   "failures": [str],
   "kernels": [{"name", "kernel_type", "file", "calls": int (one forward, all kernels in),
                "shapes": ["8x2048x768", ...], "fallbacks": {reason: count},
                "skipped": {reason: modules not swapped}, "notes": [str],
                "status": "ok" | "never ran" | "crashed" | "mismatch" | "unused"
                          | "stopped" (another kernel crashed first),
                "error": str | null,
                "alone": {"calls", and the "correctness" keys below} | null,  (--diagnose)
                "alone_ms": float | null, "gain_ms": float | null, "share": float | null}],
   "correctness": {"output": "logits" | "tensor" | "logits (the loss's input)", "shape": [..],
                   "max_abs_err", "rel_err", "tolerance", "top1", "top1_tie_aware", "top1_min",
                   "loss_rel_err" (models returning a loss), "passed", "error"},
   "timing": {"method", "cuda_graphs": bool, "warmup", "repeat", "eager_ms", "compile_ms",
              "compile_note", "kernels_ms", "gainers": [names of kernels whose alone_ms beat eager],
              "gainers_ms": float | null (the gainers together, when some kernels lose)} | null,
   "speedup_vs_eager": float | null, "speedup_vs_compile": float | null}

Exit status: 0 all kernels ran and the outputs match; 1 a kernel never ran, crashed, or the
outputs mismatch; 2 usage errors (bad flags, missing files).
"""
import argparse
import contextlib
import glob
import inspect
import json
import math
import statistics
import sys
import time
import weakref
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import autokernel  # first: sets the Triton interpreter on CPU and loads the stdlib `profile`

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, handle_torch_function, has_torch_function

import reference

E2E_TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
TOP1_MIN = {torch.float32: 0.99, torch.float16: 0.97, torch.bfloat16: 0.97}
FALLBACK = object()  # a handler's "not mine: run the original op"


def first_line(e, limit=300):
    """An exception as one line (Triton compile errors span dozens)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


class UsageError(Exception):
    """Bad flags or files: one line, exit 2."""


class ModelFailure(Exception):
    """The original model (no kernels in) failed to run: one line, exit 1."""


class KernelFailure(Exception):
    """A kernel raised or returned the wrong thing while the model ran."""

    def __init__(self, kernel, message):
        super().__init__(f"{kernel.name} ({kernel.rel_file}): {message}")
        self.kernel, self.message = kernel, message


# ---------------------------------------------------------------------------------------------
# Kernels to plug in
# ---------------------------------------------------------------------------------------------

@dataclass
class Kernel:
    name: str
    kernel_type: str
    file: Path
    fn: object
    shapes: list = field(default_factory=list)  # declared contract shapes (plan / BENCH_SHAPES)
    optional: bool = False  # --starters: one that finds no op in this model is "unused"

    @property
    def rel_file(self):
        try:
            return str(self.file.resolve().relative_to(autokernel.ROOT))
        except ValueError:
            return str(self.file)


def load_kernel(path, name=None, kernel_type=None, shapes=None, optional=False):
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = autokernel.ROOT / path
    if not path.exists():
        raise UsageError(f"kernel file {path} does not exist")
    try:
        module = autokernel.load_module(path)
    except Exception as e:  # a kept kernel that no longer imports is a usage problem to fix first
        raise UsageError(f"cannot import kernel {path}: {first_line(e)}") from None
    declared = getattr(module, "KERNEL_TYPE", None)
    if declared not in autokernel.KERNEL_TYPES:
        raise UsageError(f"{path}: KERNEL_TYPE {declared!r} is not one of "
                         f"{', '.join(autokernel.KERNEL_TYPE_NAMES)}")
    if kernel_type and kernel_type != declared:
        raise UsageError(f"{path}: KERNEL_TYPE {declared!r} but plan.json says {kernel_type!r}")
    if not callable(getattr(module, "kernel_fn", None)):
        raise UsageError(f"{path}: no kernel_fn(...) defined")
    shapes = shapes or getattr(module, "BENCH_SHAPES", None) or []
    name = name or getattr(module, "KERNEL_NAME", None) or declared
    return Kernel(name, declared, path, module.kernel_fn, [tuple(s) for s in shapes], optional)


def select_kernels(args):
    """Kernels from --kernels, --starters or workspace/plan.json (in that order of precedence)."""
    if args.kernels:
        kernels = [load_kernel(p.strip()) for p in args.kernels.split(",") if p.strip()]
    elif args.starters:
        files = sorted(p for p in glob.glob(str(autokernel.KERNELS_DIR / "*.py"))
                       if not Path(p).name.startswith("_"))
        kernels = [load_kernel(p, optional=True) for p in files]
    else:
        plan_path = Path(args.plan)
        if not plan_path.exists():
            raise UsageError(f"no {plan_path}: run extract.py first, or pass --kernels FILE[,FILE] "
                             "or --starters")
        try:
            entries = json.loads(plan_path.read_text())["kernels"]
            files = [(e["file"], e.get("name"), e.get("kernel_type"), e.get("shapes"))
                     for e in entries]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UsageError(f"{plan_path} is not a plan (expected {{\"kernels\": [{{\"file\": "
                             f"..., \"name\": ..., ...}}]}}): {first_line(e)}") from None
        kernels = [load_kernel(*entry) for entry in files]
    if not kernels:
        raise UsageError("no kernels to verify")
    seen = Counter()
    for k in kernels:  # two files with one name (two starters of one type): keep names unique
        seen[k.name] += 1
        if seen[k.name] > 1:
            k.name = f"{k.name}#{seen[k.name]}"
    return kernels


# ---------------------------------------------------------------------------------------------
# The swap: which kernels are active, what they ran on, and the context that plugs them in
# ---------------------------------------------------------------------------------------------

class WeightCache:
    """Contiguous W.t() copies [K, N_padded] for the matmul kernel, made once per weight and
    shared by every swap of a run (so timing runs never pay for them). Rows are padded with
    zero columns to a multiple of 16 bytes (see the module docstring)."""

    def __init__(self):
        self.copies = {}

    def transposed(self, weight):
        key = id(weight)
        hit = self.copies.get(key)
        if hit and hit[0]() is weight and hit[1] == weight._version:
            return hit[2]
        n, k = weight.shape
        per_16_bytes = max(1, 16 // weight.element_size())
        padded = -(-n // per_16_bytes) * per_16_bytes
        copy = weight.new_zeros((k, padded))
        copy[:, :n] = weight.detach().t()
        self.copies[key] = (weakref.ref(weight), weight._version, copy)
        return copy


def _output_spec(ktype, inputs):
    """(shape, dtype) the reference produces for these inputs, found on the meta device."""
    meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in inputs.items()}
    out = ktype.eager(**meta)
    return tuple(out.shape), out.dtype


class Swap:
    """Kernels plugged into one model: dispatch by type (and declared shape), call counts, shapes
    seen, fallbacks with reasons, modules skipped with reasons."""

    def __init__(self, kernels, weights=None, weight_layout="copy"):
        self.kernels = list(kernels)
        self.by_type = defaultdict(list)
        for k in self.kernels:
            self.by_type[k.kernel_type].append(k)
        self.weights = weights or WeightCache()
        self.weight_layout = weight_layout
        self.busy = False  # inside a kernel_fn: its own torch calls pass straight through
        self.specs = {}
        self.ignore_index_seen = {}  # (targets shape, ignore_index) -> hit (_hits_ignore_index)
        self.reset()

    def reset(self):
        self.calls = Counter()
        self.shapes = defaultdict(set)
        self.fallbacks = defaultdict(Counter)  # type -> reason -> calls
        self.skipped = defaultdict(Counter)    # type -> reason -> modules
        self.notes = defaultdict(set)          # type -> glue done in torch

    def active(self, ktype):
        return bool(self.by_type.get(ktype))

    def fallback(self, ktype, reason):
        self.fallbacks[ktype][reason] += 1
        return FALLBACK

    def note(self, ktype, text):
        self.notes[ktype].add(text)

    def run(self, ktype, model_shape=None, **inputs):
        """Call the kernel for this type with the contract's arguments and check what comes
        back. Which kernel: the one that declared this shape (model_shape when the inputs were
        padded), else the first that declared no shapes (a catch-all), else the first."""
        rule, kt = SWAP_RULES[ktype], autokernel.KERNEL_TYPES[ktype]
        shape = model_shape or rule.contract_shape(inputs)
        candidates = self.by_type[ktype]
        kernel = next((k for k in candidates if shape in k.shapes), None) or \
            next((k for k in candidates if not k.shapes), candidates[0])
        key = (ktype,) + tuple((tuple(v.shape), v.dtype) for v in inputs.values())
        busy, self.busy = self.busy, True  # the kernel's and the meta reference's torch calls
        try:                                # pass through (a patched handler may be busy already)
            if key not in self.specs:
                self.specs[key] = _output_spec(kt, inputs)
            want_shape, want_dtype = self.specs[key]
            # Torch-function handling off for the kernel's own host work: under a mode (e.g.
            # _LossInput) every tensor access in Triton's launcher (strides, data_ptr, dtype, ...)
            # would pay a Python round trip, ~1.7 us each.
            with torch._C.DisableTorchFunction():
                out = kernel.fn(**inputs)
        except Exception as e:
            raise KernelFailure(kernel, f"raised {first_line(e)} (shape {kt.shape_str(shape)})") \
                from e
        finally:
            self.busy = busy
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want_shape \
                or out.dtype != want_dtype:
            got = (f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise KernelFailure(kernel, f"returned {got}, expected {want_shape} {want_dtype} "
                                f"(shape {kt.shape_str(shape)})")
        self.calls[kernel.name] += 1
        self.shapes[kernel.name].add(kt.shape_str(shape))
        return out

    @contextlib.contextmanager
    def installed(self, model):
        """Plug the kernels into `model` and restore everything on exit, also when the forward
        raises. Everything is one list of (owner, attribute, replacement): the active rules'
        torch entry points (F.linear, torch.sum, Tensor.softmax, ...), module forwards and
        module-level patches. Only what an active rule handles is touched: no TorchFunctionMode,
        so torch calls the kernels do not replace cost nothing extra (a mode taxed every call
        and tensor access of the forward, ~1.7 us each, which made the model host-bound)."""
        patches, swapped = [], set()
        for ktype, rule in SWAP_RULES.items():
            if self.active(ktype):
                for (owner, attr), handler in rule.functions.items():
                    patches.append((owner, attr, _patched(self, getattr(owner, attr), handler)))
        for module in model.modules():
            for ktype, rule in SWAP_RULES.items():
                if not self.active(ktype) or id(module) in swapped:
                    continue
                for matcher in rule.modules:
                    found = matcher(self, module)
                    if isinstance(found, str):
                        self.skipped[ktype][found] += 1
                    elif found is not None:
                        patches.append((module, "forward", found))
                        swapped.add(id(module))
                        break
        for ktype, rule in SWAP_RULES.items():
            if self.active(ktype):
                for patcher in rule.patches:
                    patches += patcher(self, model)
        applied = []  # (owner, attr, whether owner itself held attr, the original)
        try:
            for owner, attr, new in patches:
                applied.append((owner, attr, attr in vars(owner), getattr(owner, attr)))
                setattr(owner, attr, new)
            yield self
        finally:
            for owner, attr, had_own, old in reversed(applied):
                if had_own:
                    setattr(owner, attr, old)
                else:  # inherited (a class's forward, TensorBase's methods): uncover it again
                    delattr(owner, attr)


def _patched(swap, original, handler):
    """`original` (a torch function or Tensor method) with the rule's handler in front: the
    handler gets the call's arguments bound to its own signature; the original runs on FALLBACK,
    on a call the handler's signature cannot bind, and while swap.busy."""
    signature = inspect.signature(handler)
    # Whether a call binds depends only on how many positional arguments it has and which
    # keywords it names, so bind once per calling convention (Signature.bind costs ~5 us).
    bindable = {}

    def binds(args, kwargs):
        try:
            signature.bind(swap, *args, **kwargs)
            return True
        except TypeError:
            return False

    def call(*args, **kwargs):
        if swap.busy:  # a kernel's, a handler's or a fallback's own torch calls
            return original(*args, **kwargs)
        relevant = args + tuple(kwargs.values()) if kwargs else args
        if has_torch_function(relevant):
            # An active TorchFunctionMode (checked_forward's _LossInput) or a tensor subclass
            # sees the call first, as it would the original's; it calls us back without itself.
            return handle_torch_function(call, relevant, *args, **kwargs)
        convention = (len(args), tuple(kwargs))
        ok = bindable.get(convention)
        if ok is None:
            ok = bindable[convention] = binds(args, kwargs)
        if not ok:  # a calling convention the rule does not know: leave it alone
            return original(*args, **kwargs)
        # Busy for the handler's glue and the fallback too: F.softmax's original calls
        # Tensor.softmax, which must not be intercepted (and counted) a second time.
        swap.busy = True
        try:
            out = handler(swap, *args, **kwargs)
            return original(*args, **kwargs) if out is FALLBACK else out
        finally:
            swap.busy = False
    return call


# ---------------------------------------------------------------------------------------------
# Swap rules, one per kernel type. A function handler gets the intercepted call's arguments and
# returns the result or FALLBACK (after swap.fallback(type, reason)); a module matcher returns
# None (not its kind), a reason string (its kind, but not swappable) or a replacement forward; a
# patcher returns [(owner, attribute, replacement)].
# ---------------------------------------------------------------------------------------------

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _rows(x):
    """x [..., N] as the contract's contiguous [M, N]."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def _last_dim(dim, ndim):
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, ndim - 1)


def _same_eps(eps, contract):
    return eps is not None and math.isclose(float(eps), contract, rel_tol=1e-6)


def _linear(swap, input, weight, bias=None):
    if input.dtype not in FLOAT_DTYPES or weight.dtype != input.dtype or weight.dim() != 2 \
            or input.numel() == 0:
        return swap.fallback("matmul", "dtype or shape outside the contract")
    if bias is not None and bias.dtype != input.dtype:
        return swap.fallback("matmul", "bias dtype differs")
    A, N = _rows(input), weight.shape[0]
    if swap.weight_layout == "view":
        out = swap.run("matmul", A=A, B=weight.t())
    else:  # [K, N] padded to 16-byte rows: the kernel computes zero columns, the view drops them
        out = swap.run("matmul", A=A, B=swap.weights.transposed(weight),
                       model_shape=(A.shape[0], N, A.shape[1]))[:, :N]
    out = out.view(*input.shape[:-1], N)
    if bias is not None:
        swap.note("matmul", "F.linear bias added in torch after the kernel")
        out = out + bias
    return out


def _addmm(swap, input, mat1, mat2, *, beta=1, alpha=1):
    """torch.addmm(bias, x, W): transformers' Conv1D (GPT-2) projections, W already [K, N]."""
    if beta != 1 or alpha != 1 or mat1.dim() != 2 or mat2.dim() != 2 \
            or mat1.dtype not in FLOAT_DTYPES or mat2.dtype != mat1.dtype \
            or input.dtype != mat1.dtype:
        return swap.fallback("matmul", "addmm outside the contract")
    swap.note("matmul", "addmm bias added in torch after the kernel")
    return swap.run("matmul", A=mat1.contiguous(), B=mat2.contiguous()) + input


def _matmul(swap, input, other):
    """x @ W with a 2-D right operand; batched products (attention scores) stay torch."""
    if not isinstance(input, torch.Tensor) or not isinstance(other, torch.Tensor) \
            or other.dim() != 2 or input.dim() < 1:
        return swap.fallback("matmul", "batched or vector matmul")
    if input.dtype not in FLOAT_DTYPES or other.dtype != input.dtype or input.numel() == 0:
        return swap.fallback("matmul", "dtype or shape outside the contract")
    out = swap.run("matmul", A=_rows(input), B=other.contiguous())
    return out.view(*input.shape[:-1], other.shape[1])


def _sdpa(swap, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    reason = None
    if attn_mask is not None:
        reason = "attention mask"
    elif dropout_p:
        reason = "dropout"
    elif not is_causal:
        reason = "not causal"
    elif query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        reason = "not [B, H, S, D]"
    elif query.shape[2] != key.shape[2] or value.shape != key.shape \
            or query.shape[-1] != key.shape[-1] or query.shape[0] != key.shape[0]:
        reason = "query/key/value shapes differ"
    elif scale is not None and not math.isclose(scale, query.shape[-1] ** -0.5, rel_tol=1e-6):
        reason = "non-default scale"
    elif query.dtype not in FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        reason = "dtype outside the contract"
    elif key.shape[1] != query.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        reason = "head counts differ"
    if reason:
        return swap.fallback("flash_attention", reason)
    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        swap.note("flash_attention", "GQA: key/value heads repeated in torch")
    return swap.run("flash_attention", Q=query.contiguous(), K=key.contiguous(),
                    V=value.contiguous())


def _layer_norm(swap, input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list, torch.Size)) \
        else (normalized_shape,)
    if not _same_eps(eps, reference.LAYERNORM_EPS):
        return swap.fallback("layernorm", f"eps {eps:g} != contract {reference.LAYERNORM_EPS:g}")
    if weight is None or bias is None:
        return swap.fallback("layernorm", "no weight or bias")
    if len(shape) != 1 or shape[0] != input.shape[-1] or input.dtype not in FLOAT_DTYPES \
            or weight.dtype != input.dtype or bias.dtype != input.dtype:
        return swap.fallback("layernorm", "shape or dtype outside the contract")
    return swap.run("layernorm", x=_rows(input), weight=weight, bias=bias).view(input.shape)


def _rms_norm(swap, input, normalized_shape, weight=None, eps=None):
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list, torch.Size)) \
        else (normalized_shape,)
    if not _same_eps(eps, reference.RMSNORM_EPS):
        return swap.fallback("rmsnorm", f"eps {eps} != contract {reference.RMSNORM_EPS:g}")
    if weight is None or len(shape) != 1 or shape[0] != input.shape[-1] \
            or input.dtype not in FLOAT_DTYPES or weight.dtype != input.dtype:
        return swap.fallback("rmsnorm", "shape, weight or dtype outside the contract")
    return swap.run("rmsnorm", x=_rows(input), weight=weight).view(input.shape)


def _last_dim_input(swap, ktype, input, dim, dtype):
    """The input of a last-dim op (softmax, sum) cast to its dtype= argument, or FALLBACK."""
    if not isinstance(input, torch.Tensor) or input.dim() == 0 or not _last_dim(dim, input.dim()):
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


def _hits_ignore_index(swap, target, ignore_index):
    """Whether a target is ignore_index (the contract has none). Reading that back syncs, which a
    CUDA graph capture forbids: there the answer of the warm-up forwards just before it (same
    inputs, same shapes) is reused, and with none the call falls back to torch."""
    key = (tuple(target.shape), ignore_index)
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
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
    input = _last_dim_input(swap, "reduce", input, dim, dtype)
    if input is FALLBACK:
        return FALLBACK
    out = swap.run("reduce", x=_rows(input)).view(input.shape[:-1])
    return out.unsqueeze(-1) if keepdim else out


def _rmsnorm_module(swap, module):
    if "RMSNorm" not in type(module).__name__:
        return None
    weight = getattr(module, "weight", None)
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return "skipped: no 1-D weight"
    if not _same_eps(eps, reference.RMSNORM_EPS):
        return f"skipped: eps {eps} != contract {reference.RMSNORM_EPS:g}"
    original = module.forward

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dtype != weight.dtype or x.shape[-1] != weight.shape[0]:
            swap.fallback("rmsnorm", "input dtype differs from the weight's")
            return original(x, *args, **kwargs)
        return swap.run("rmsnorm", x=_rows(x), weight=weight).view(x.shape)
    return forward


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
    original = module.forward

    def forward(x, *args, **kwargs):
        w = gate.weight
        if args or kwargs or x.dtype != w.dtype or x.dtype not in FLOAT_DTYPES:
            swap.fallback("fused_mlp", "dtype outside the contract")
            return original(x, *args, **kwargs)
        out = swap.run("fused_mlp", x=_rows(x), w_gate=w, w_up=up.weight, w_down=down.weight)
        return out.view(*x.shape[:-1], down.weight.shape[0])
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
        key = (offset, S, x.dtype, module.cos.data_ptr())
        if key not in tables:  # the slice and cast, once per (offset, length, dtype)
            tables[key] = tuple(t[offset:offset + S].to(x.dtype).contiguous()
                                for t in (module.cos, module.sin))
        c, s = tables[key]
        return swap.run("rotary_embedding", x=x.contiguous(), cos=c, sin=s)
    return forward


class _HalfTables:
    """transformers' cos/sin are [B, S, D] with the [S, D/2] table duplicated along the last dim
    and repeated over the batch. Check that once per table object and keep the [S, D/2] halves."""

    def __init__(self):
        self.cache = {}

    def get(self, cos, sin, dtype):
        hit = self.cache.get(id(cos))
        if hit and hit[0]() is cos and hit[1]() is sin:
            return hit[2]
        halves = None
        if cos.dim() in (2, 3) and cos.shape == sin.shape and cos.shape[-1] % 2 == 0:
            c, s = (t.reshape(-1, *t.shape[-2:]) for t in (cos, sin))
            h = c.shape[-1] // 2
            if all(torch.equal(t[..., :h], t[..., h:]) and torch.equal(t, t[:1].expand_as(t))
                   for t in (c, s)):
                halves = tuple(t[0, :, :h].to(dtype).contiguous() for t in (c, s))
        self.cache[id(cos)] = (weakref.ref(cos), weakref.ref(sin), halves)
        return halves


def _hf_rotary_patches(swap, model):
    """Patch apply_rotary_pos_emb in the transformers modules the model's classes come from
    (LLaMA and the models that copy its half-split rotate_half), restored on exit."""
    owners = {sys.modules.get(type(m).__module__) for m in model.modules()}
    owners = [o for o in owners if o is not None and o.__name__.startswith("transformers.")
              and callable(getattr(o, "apply_rotary_pos_emb", None)) and hasattr(o, "rotate_half")]
    patches = []
    for owner in owners:
        original, tables = owner.apply_rotary_pos_emb, _HalfTables()

        def apply_rotary_pos_emb(q, k, cos, sin, *args, _original=original, _tables=tables,
                                 **kwargs):
            unsqueeze_dim = kwargs.get("unsqueeze_dim", 1)
            usable = not args and set(kwargs) <= {"unsqueeze_dim"} and unsqueeze_dim == 1 \
                and q.dim() == 4 and k.dim() == 4 and q.dtype in FLOAT_DTYPES \
                and k.dtype == q.dtype and q.shape[-1] == cos.shape[-1] \
                and q.shape[-2] == cos.shape[-2] and k.shape[-2] == cos.shape[-2]
            halves = _tables.get(cos, sin, q.dtype) if usable else None
            if halves is None:
                swap.fallback("rotary_embedding", "cos/sin not the shared half-duplicated tables")
                return _original(q, k, cos, sin, *args, **kwargs)
            c, s = halves
            return (swap.run("rotary_embedding", x=q.contiguous(), cos=c, sin=s),
                    swap.run("rotary_embedding", x=k.contiguous(), cos=c, sin=s))
        patches.append((owner, "apply_rotary_pos_emb", apply_rotary_pos_emb))
    return patches


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
                       contract_shape=lambda t: (t["A"].shape[0], t["B"].shape[1],
                                                 t["A"].shape[1])),
    "softmax": SwapRule(functions={(F, "softmax"): _softmax_functional,
                                   (torch, "softmax"): _softmax_torch,
                                   (T, "softmax"): _softmax_torch}),
    "layernorm": SwapRule(functions={(F, "layer_norm"): _layer_norm}),
    "rmsnorm": SwapRule(functions={(F, "rms_norm"): _rms_norm}, modules=(_rmsnorm_module,)),
    "flash_attention": SwapRule(functions={(F, "scaled_dot_product_attention"): _sdpa}),
    "fused_mlp": SwapRule(modules=(_swiglu_module,),
                          contract_shape=lambda t: (t["x"].shape[0], t["x"].shape[1],
                                                    t["w_gate"].shape[0])),
    "cross_entropy": SwapRule(functions={(F, "cross_entropy"): _cross_entropy}),
    "rotary_embedding": SwapRule(modules=(_rotary_module,), patches=(_hf_rotary_patches,)),
    "reduce": SwapRule(functions={(torch, "sum"): _sum, (T, "sum"): _sum}),
}
assert set(SWAP_RULES) == set(autokernel.KERNEL_TYPE_NAMES)


# ---------------------------------------------------------------------------------------------
# Running, comparing, timing
# ---------------------------------------------------------------------------------------------

def forward(model, inputs):
    with torch.no_grad():
        if isinstance(inputs, dict):
            out = model(**inputs)
        elif isinstance(inputs, (tuple, list)):
            out = model(*inputs)
        else:
            out = model(inputs)
    return output_tensor(out)


def output_tensor(out):
    """The tensor to compare: a tensor itself, .logits (then .loss) of a transformers output,
    the first tensor of a tuple or dict."""
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "loss"):
        if isinstance(getattr(out, attr, None), torch.Tensor):
            return getattr(out, attr)
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) \
        else []
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"the model returned {type(out).__name__}, which holds no tensor to compare")


class _LossInput(TorchFunctionMode):
    """Records the logits F.cross_entropy is given, so a model whose forward returns only its
    loss still has its logits compared (a scalar loss hides most errors)."""

    def __init__(self):
        super().__init__()
        self.logits = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.cross_entropy and args and isinstance(args[0], torch.Tensor) \
                and not args[0].is_meta:
            self.logits = args[0].detach()
        return func(*args, **(kwargs or {}))


def checked_forward(model, inputs):
    """(output tensor, the loss's input logits when the output is a scalar loss, else None)."""
    capture = _LossInput()
    with capture:
        y = forward(model, inputs)
    return y, (capture.logits if y.dim() == 0 else None)


def compare_runs(run, run_ref):
    """compare() on the logits; for a model that returns a loss, on the logits the loss was
    computed from AND on the loss."""
    (y, logits), (y_ref, logits_ref) = run, run_ref
    if logits_ref is None:
        return compare(y, y_ref)
    if logits is None:
        result = compare(y, y_ref)
        result.update(passed=False, error="the kernels' run computed no F.cross_entropy")
        return result
    result = compare(logits, logits_ref)
    loss = compare(y, y_ref)
    result.update(output="logits (the loss's input)", loss_rel_err=loss["rel_err"],
                  passed=result["passed"] and loss["passed"])
    if loss["error"] and not result["error"]:
        result["error"] = f"loss: {loss['error']}"
    return result


def compare(y, y_ref):
    """rel_err against the tolerance and (for logits) tie-aware top-1 agreement; see the
    module docstring."""
    dtype = y_ref.dtype if y_ref.dtype in E2E_TOLERANCE else torch.float32
    tol, top1_min = E2E_TOLERANCE[dtype], TOP1_MIN[dtype]
    result = {"output": "logits" if y_ref.dim() >= 2 else "tensor", "shape": list(y_ref.shape),
              "tolerance": tol, "top1_min": top1_min, "max_abs_err": None, "rel_err": None,
              "top1": None, "top1_tie_aware": None, "passed": False, "error": None}
    if y.shape != y_ref.shape or y.dtype != y_ref.dtype:
        result["error"] = f"output {tuple(y.shape)} {y.dtype} != original {tuple(y_ref.shape)} " \
                          f"{y_ref.dtype}"
        return result
    a, b = y.float(), y_ref.float()
    if not torch.isfinite(a).all() and torch.isfinite(b).all():
        result["error"] = "output has inf/nan where the original has none"
        return result
    diff = (a - b).abs().nan_to_num(0.0)
    scale = b.abs().nan_to_num(0.0).max().item()
    max_abs = diff.max().item() if diff.numel() else 0.0
    rel = max_abs / scale if scale > 0 else max_abs
    result.update(max_abs_err=max_abs, rel_err=rel)
    passed = rel <= tol
    if y_ref.dim() >= 2 and y_ref.shape[-1] > 1:
        top_k, top_ref = a.argmax(-1), b.argmax(-1)
        result["top1"] = (top_k == top_ref).float().mean().item()
        band = tol * max(scale, 1e-12)
        ref_at_k = b.gather(-1, top_k.unsqueeze(-1)).squeeze(-1)
        result["top1_tie_aware"] = (ref_at_k >= b.max(-1).values - band).float().mean().item()
        passed = passed and result["top1_tie_aware"] >= top1_min
    result["passed"] = passed
    return result


def sync():
    if autokernel.CUDA:
        torch.cuda.synchronize()


class GraphCaptureError(Exception):
    pass


def capture(model, inputs, warmup):
    """One forward as a CUDA graph: warm-up forwards on a side stream (as torch.cuda.graph
    asks; autotuning happens here), then the capture. Replaying it costs no per-op host work."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 2)):
            forward(model, inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            forward(model, inputs)
    except Exception as e:
        raise GraphCaptureError(first_line(e)) from None
    return graph


def time_forward(model, inputs, warmup, repeat, graphs=False):
    """Median milliseconds of `repeat` forwards after `warmup` untimed ones; with graphs, of
    `repeat` replays of a CUDA graph of the forward."""
    run = capture(model, inputs, warmup).replay if graphs else lambda: forward(model, inputs)
    for _ in range(warmup):
        run()
    sync()
    times = []
    for _ in range(repeat):
        if autokernel.CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_swapped(model, inputs, swap):
    """One forward with `swap` plugged in: (checked_forward's pair or None, error or None)."""
    swap.reset()
    try:
        with swap.installed(model):
            run = checked_forward(model, inputs)
        sync()
        return run, None
    except KernelFailure as e:
        return None, str(e)
    except Exception as e:  # glue or the model itself failed with the kernels in
        return None, f"the model with kernels raised {first_line(e)}"


def model_dtype(model):
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def kernel_entry(kernel, swap, error=None):
    t = kernel.kernel_type
    calls = swap.calls[kernel.name]
    crashed = error is not None and error.startswith(f"{kernel.name} (")
    # After another kernel crashed the forward stopped: this one's count means nothing.
    status = "crashed" if crashed else "stopped" if error else "ok" if calls else "never ran"
    return {"name": kernel.name, "kernel_type": t, "file": kernel.rel_file, "calls": calls,
            "shapes": sorted(swap.shapes[kernel.name]),
            "fallbacks": dict(swap.fallbacks[t]), "skipped": dict(swap.skipped[t]),
            "notes": sorted(swap.notes[t]), "status": status,
            "error": error if status == "crashed" else None,
            "alone": None, "alone_ms": None, "gain_ms": None, "share": None}


def why_not(entry):
    """Why a kernel never ran, from its fallbacks and skipped modules."""
    reasons = [f"{n}x {r}" for r, n in entry["fallbacks"].items()] + \
              [f"{n} module(s) {r}" for r, n in entry["skipped"].items()]
    return "; ".join(reasons) if reasons else "no matching op in the model"


def verify(model, inputs, kernels, *, diagnose=False, timing=True, warmup=None, repeat=None,
           compile_backend=None, weight_layout="copy", cuda_graphs=False, description="model"):
    """Everything but the printing: returns the verify.json dict."""
    model.eval()
    dtype = model_dtype(model)
    weights = WeightCache()
    try:
        run_ref = checked_forward(model, inputs)
        sync()
    except torch.cuda.OutOfMemoryError:
        raise ModelFailure("CUDA out of memory running the original model: use a smaller "
                           "--input-shape or --config") from None
    except Exception as e:
        raise ModelFailure(f"the original model raised {first_line(e)}") from None

    swap = Swap(kernels, weights, weight_layout)
    run, error = run_swapped(model, inputs, swap)
    entries = [kernel_entry(k, swap, error) for k in kernels]
    for k, e in zip(kernels, entries):
        if k.optional and e["status"] == "never ran":
            e["status"] = "unused"  # a starter with nothing to replace here: not a replacement
    used = [(k, e) for k, e in zip(kernels, entries) if e["status"] != "unused"]
    correctness = {"passed": False, "error": error} if run is None else \
        compare_runs(run, run_ref)
    del run

    failures = []
    for e in entries:
        if e["status"] == "crashed":
            failures.append(f"{e['name']} ({e['file']}): crashed: {e['error']}")
        elif e["status"] == "never ran":
            failures.append(f"{e['name']} ({e['file']}): never ran ({why_not(e)})")
    if error and not any(e["status"] == "crashed" for e in entries):
        failures.append(error)
    if not used:
        failures.append("no kernel ran: none of them matches an op of this model")
    if not error and not correctness["passed"]:
        failures.append(f"outputs mismatch: {describe_mismatch(correctness)}")
        if len(used) == 1 and used[0][1]["status"] == "ok":
            used[0][1]["status"] = "mismatch"

    if diagnose:
        for k, e in used:
            alone = Swap([k], weights, weight_layout)
            run_k, err_k = run_swapped(model, inputs, alone)
            c = compare_runs(run_k, run_ref) if run_k is not None else \
                {"passed": False, "error": err_k}
            e["alone"] = dict(c, calls=alone.calls[k.name],
                              passed=bool(c["passed"] and alone.calls[k.name] > 0))
            if not e["alone"]["passed"] and e["status"] == "ok":
                e["status"] = "mismatch"
            del run_k

    report = {"model": description, "device": device_name(), "dtype": autokernel.DTYPE_NAMES.get(
        dtype, str(dtype)), "timing_meaningful": autokernel.TIMING_MEANINGFUL,
        "kernels": entries, "correctness": correctness, "timing": None,
        "speedup_vs_eager": None, "speedup_vs_compile": None}
    if timing and not diagnose and not failures:
        report["timing"] = measure(model, inputs, used, weights, weight_layout, warmup, repeat,
                                   compile_backend, cuda_graphs)
        t = report["timing"]
        report["speedup_vs_eager"] = t["eager_ms"] / t["kernels_ms"]
        if t["compile_ms"] is not None:
            report["speedup_vs_compile"] = t["compile_ms"] / t["kernels_ms"]
    report["failures"] = failures
    report["passed"] = not failures and all(e["status"] in ("ok", "unused") for e in entries)
    return report


def measure(model, inputs, used, weights, weight_layout, warmup, repeat, compile_backend,
            graphs=False):
    """Eager, torch.compile, all kernels, and each kernel alone (for its share of the gain).
    graphs: every one of them timed as CUDA graph replays (no launch overhead)."""
    kernels = [k for k, _ in used]
    warmup = (5 if autokernel.CUDA else 1) if warmup is None else warmup
    repeat = (20 if autokernel.CUDA else 3) if repeat is None else repeat
    method = "CUDA graph replays, CUDA events, median" if graphs else "CUDA events, median"
    timing = {"method": method if autokernel.CUDA else
              "perf_counter, median (CPU interpreter: not meaningful)", "cuda_graphs": graphs,
              "warmup": warmup, "repeat": repeat, "compile_ms": None, "compile_note": None}

    def timed(swap=None, what="the model with kernels"):
        try:
            if swap is None:
                return time_forward(model, inputs, warmup, repeat, graphs)
            with swap.installed(model):
                return time_forward(model, inputs, warmup, repeat, graphs)
        except GraphCaptureError as e:
            raise GraphCaptureError(f"capturing {what} in a CUDA graph failed ({e}): run "
                                    "without --cuda-graphs") from None

    timing["eager_ms"] = timed(what="the original model")
    backend = compile_backend or ("inductor" if autokernel.CUDA else None)
    if backend is None:
        timing["compile_note"] = "skipped on CPU (pass --compile-backend to force)"
    elif backend == "none":
        timing["compile_note"] = "skipped (--no-compile)"
    else:
        try:
            compiled = torch.compile(model, backend=backend)
            forward(compiled, inputs)  # compile outside the timed runs
            timing["compile_ms"] = time_forward(compiled, inputs, warmup, repeat, graphs)
            timing["compile_note"] = f"torch.compile(backend={backend!r})"
        except Exception as e:  # report it, keep the eager comparison
            timing["compile_note"] = f"torch.compile(backend={backend!r}) failed: " \
                                     f"{first_line(e)}"
        compiled = None
        torch._dynamo.reset()
    timing["kernels_ms"] = timed(Swap(kernels, weights, weight_layout))
    total_gain = timing["eager_ms"] - timing["kernels_ms"]
    for k, e in used:
        if len(kernels) == 1:
            e["alone_ms"] = timing["kernels_ms"]
        else:
            e["alone_ms"] = timed(Swap([k], weights, weight_layout), f"the model with {k.name}")
        e["gain_ms"] = timing["eager_ms"] - e["alone_ms"]
        e["share"] = e["gain_ms"] / total_gain if total_gain > 0 else None  # of a loss: n/a
    # The morning's question: which kernels to ship. When some kernels gain and some lose,
    # time the gainers together too.
    gainers = [k for k, e in used if e["gain_ms"] > 0]
    timing["gainers"] = [k.name for k in gainers]
    timing["gainers_ms"] = None
    if gainers and len(gainers) < len(kernels):
        timing["gainers_ms"] = timed(Swap(gainers, weights, weight_layout))
    return timing


def device_name():
    return torch.cuda.get_device_name() if autokernel.CUDA else "cpu (Triton interpreter)"


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------

def _g(x, fmt=".2e"):
    return "n/a" if x is None else format(x, fmt)


def describe_mismatch(c):
    if c.get("error"):
        return c["error"]
    text = f"{c['output']} max rel err {_g(c['rel_err'], '.1e')} (tol {_g(c['tolerance'], '.0e')})"
    if c.get("top1_tie_aware") is not None:
        text += f", top-1 agreement {c['top1_tie_aware']:.1%} (min {c['top1_min']:.0%})"
    return text


def print_report(r):
    print(f"model: {r['model']}")
    print(f"device: {r['device']}  dtype: {r['dtype']}")
    print(f"{'kernel':<22} {'type':<17} {'calls':>6}  {'status':<10} shapes / file")
    for e in r["kernels"]:
        shapes = ", ".join(e["shapes"][:4]) + (" ..." if len(e["shapes"]) > 4 else "")
        print(f"{e['name']:<22} {e['kernel_type']:<17} {e['calls']:>6}  {e['status']:<10} "
              f"{shapes or '-'}  [{e['file']}]")
        extra = [f"fallback {n}x: {why}" for why, n in e["fallbacks"].items()] + \
                [f"{n} module(s) {why}" for why, n in e["skipped"].items()] + e["notes"]
        for line in extra:
            print(f"{'':<24}{line}")
    c = r["correctness"]
    if c.get("rel_err") is not None:
        print(f"correctness: {c['output']} {tuple(c['shape'])} max abs err {_g(c['max_abs_err'])}, "
              f"rel err {_g(c['rel_err'])} (tol {c['tolerance']:.0e}), top-1 {_g(c['top1'], '.1%')}"
              f", tie-aware {_g(c['top1_tie_aware'], '.1%')} (min {c['top1_min']:.0%}): "
              f"{'PASS' if c['passed'] else 'FAIL'}")
    else:
        print(f"correctness: FAIL ({c.get('error')})")
    for e in r["kernels"]:
        a = e["alone"]
        if a is None:
            continue
        if a["passed"]:
            print(f"diagnose: {e['name']} ({e['file']}): ok alone, {a['calls']} calls, "
                  f"rel err {_g(a['rel_err'])}")
        elif a["calls"] == 0 and not a["error"]:
            print(f"diagnose: FAIL {e['name']} ({e['file']}): never ran ({why_not(e)})")
        else:
            print(f"diagnose: FAIL {e['name']} ({e['file']}): {describe_mismatch(a)}")
    alone = [e["alone"] for e in r["kernels"] if e["alone"] is not None]
    if alone and all(a["passed"] for a in alone) and not r["correctness"].get("passed"):
        print("diagnose: every kernel passes alone: the failure comes from their combination")
    t = r["timing"]
    if t:
        note = "" if r["timing_meaningful"] else "  (CPU interpreter: NOT meaningful)"
        print(f"timing ({t['method']}, {t['repeat']} runs after {t['warmup']} warm-up): "
              f"eager {t['eager_ms']:.3f} ms, torch.compile {_g(t['compile_ms'], '.3f')} ms, "
              f"kernels {t['kernels_ms']:.3f} ms{note}")
        if t["compile_ms"] is None:
            print(f"torch.compile: {t['compile_note']}")
        vs_compile = "n/a" if r["speedup_vs_compile"] is None else \
            f"{r['speedup_vs_compile']:.3f}x"
        print(f"speedup: {r['speedup_vs_eager']:.3f}x vs eager, {vs_compile} vs torch.compile")
        for e in (e for e in r["kernels"] if e["alone_ms"] is not None):
            print(f"share of gain: {e['name']:<22} alone {e['alone_ms']:.3f} ms, gain "
                  f"{e['gain_ms']:+.3f} ms, share {_g(e['share'], '.0%')}")
        if t.get("gainers_ms"):
            vs_compile = "" if t["compile_ms"] is None else \
                f", {t['compile_ms'] / t['gainers_ms']:.3f}x vs torch.compile"
            print(f"only the kernels that gain ({', '.join(t['gainers'])}): "
                  f"{t['gainers_ms']:.3f} ms, {t['eager_ms'] / t['gainers_ms']:.3f}x vs eager"
                  f"{vs_compile}")
    for f in r["failures"]:
        print(f"FAIL {f}")
    if r["failures"] and not any(e["alone"] for e in r["kernels"]):
        print("hint: run again with --diagnose to find the kernel that breaks the model")
    print(f"verdict: {'PASS' if r['passed'] else 'FAIL'}"
          + (f" {r['speedup_vs_eager']:.3f}x vs eager" if r["speedup_vs_eager"] else ""))


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def load_profile_module():
    """Our profile.py, imported under another name (the stdlib `profile` keeps its own)."""
    name = "autokernel_profile_script"
    if name in sys.modules:
        return sys.modules[name]
    path = autokernel.ROOT / "profile.py"
    if not path.exists():
        raise UsageError("profile.py is missing: verify.py loads models through it")
    return autokernel.load_module(path, name)


def build_parser(profile_module=None):
    parser = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]).strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if profile_module is not None:
        profile_module.add_model_args(parser)
    src = parser.add_argument_group("kernels (default: workspace/plan.json)")
    src.add_argument("--plan", default=str(autokernel.PLAN_JSON), help="extract.py's plan")
    src.add_argument("--kernels", help="explicit kernel files, comma-separated")
    src.add_argument("--starters", action="store_true", help="every kernels/*.py")
    parser.add_argument("--diagnose", action="store_true",
                        help="run each kernel alone and name the ones that break the model")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile timing")
    parser.add_argument("--compile-backend", help="torch.compile backend (default: inductor on "
                        "CUDA; on CPU compile is skipped unless this is given)")
    parser.add_argument("--no-timing", action="store_true", help="check correctness only")
    parser.add_argument("--warmup", type=int, help="untimed forwards (default 5 CUDA, 1 CPU)")
    parser.add_argument("--repeat", type=int, help="timed forwards (default 20 CUDA, 3 CPU)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="time every variant as CUDA graph replays: kernels without the "
                        "per-launch host cost that makes small forwards launch-bound")
    parser.add_argument("--weight-layout", choices=("copy", "view"), default="copy",
                        help="matmul B operand: contiguous W.t() copy (default) or strided view")
    parser.add_argument("--out", default=str(autokernel.VERIFY_JSON), help="report JSON path")
    return parser


MODEL_FLAGS = ("model", "class_name", "config", "module", "hf_config", "input_shape", "dtype",
               "device")


def reuse_profile_flags(args):
    """No model flags given: rebuild the model profile.py profiled (its profile.json records the
    flags), since plan.json's kernels were extracted from that model."""
    if any(getattr(args, f, None) is not None for f in MODEL_FLAGS):
        return False
    try:
        recorded = json.loads(autokernel.PROFILE_JSON.read_text()).get("model_args") or {}
    except (OSError, ValueError, AttributeError):
        return False
    for f in MODEL_FLAGS:
        if hasattr(args, f) and recorded.get(f) is not None:
            setattr(args, f, recorded[f])
    return bool(recorded)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        profile_module = load_profile_module()
    except UsageError as e:
        print(f"verify.py: error: {e}", file=sys.stderr)
        return 2
    args = build_parser(profile_module).parse_args(argv)
    model_errors = tuple(getattr(profile_module, n) for n in ("UsageError", "ModelError")
                         if hasattr(profile_module, n))
    try:
        if args.kernels and args.starters:
            raise UsageError("pass either --kernels or --starters, not both")
        if args.warmup is not None and args.warmup < 0 or args.repeat is not None \
                and args.repeat < 1:
            raise UsageError("--warmup must be >= 0 and --repeat >= 1")
        if args.cuda_graphs and not autokernel.CUDA:
            raise UsageError("--cuda-graphs needs a CUDA GPU: drop it on this machine")
        kernels = select_kernels(args)
        if reuse_profile_flags(args):
            print(f"model flags from {autokernel.PROFILE_JSON}: "
                  + " ".join(f"--{f.replace('_', '-')} {getattr(args, f)}" for f in MODEL_FLAGS
                             if getattr(args, f, None) is not None))
        model, inputs, description = profile_module.load_model(args)
    except UsageError as e:
        print(f"verify.py: error: {e}", file=sys.stderr)
        return 2
    except model_errors as e:
        print(f"verify.py: error: {e}", file=sys.stderr)
        return 2 if type(e).__name__ == "UsageError" else 1
    backend = "none" if args.no_compile else args.compile_backend
    try:
        report = verify(model, inputs, kernels, diagnose=args.diagnose,
                        timing=not args.no_timing, warmup=args.warmup, repeat=args.repeat,
                        compile_backend=backend, weight_layout=args.weight_layout,
                        cuda_graphs=args.cuda_graphs, description=description)
    except (ModelFailure, GraphCaptureError) as e:
        print(f"verify.py: error: {e}", file=sys.stderr)
        return 1
    print_report(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
