"""
The one table of kernel types: each type's arguments, input makers, adversarial inputs, FLOP and
byte counts, shape sets per gate stage (GPU and CPU), tolerances and oracle. Every script reads
it; adding a kernel type is adding one entry here (and its starter and reference).

Importing this module imports torch and sets CPU mode: with no CUDA GPU, TRITON_INTERPRET=1 so
Triton kernels run in the interpreter (it must be set before triton is imported).
"""
import math
import os
from dataclasses import dataclass
from typing import Callable

import autokernel  # noqa: F401  (the stdlib `profile` fix comes first)
import torch  # torch itself does not import triton

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = "cuda" if CUDA else "cpu"
# In CPU mode timings come from Triton's interpreter: they rank nothing real.
TIMING_MEANINGFUL = CUDA


# ---------------------------------------------------------------------------------------------
# Tolerances (atol and rtol), judged against an fp32/fp64 oracle. Keyed by the input dtype.
# ---------------------------------------------------------------------------------------------

TOLERANCES = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-4}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def parse_dtype(name: str) -> torch.dtype:
    """'fp16'/'float16'/'half' -> torch.float16, with a one-line error for anything else."""
    aliases = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32",
               "float": "fp32"}
    key = aliases.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of fp16, bf16, fp32")
    return DTYPES[key]


# ---------------------------------------------------------------------------------------------
# Input makers: realistic values, fresh every call (the caller passes a seeded or unseeded
# torch.Generator on the target device; bench.py never uses a fixed seed).
# ---------------------------------------------------------------------------------------------

def _randn(shape, dtype, device, gen, scale=1.0, shift=0.0):
    return (torch.randn(shape, device=device, generator=gen, dtype=torch.float32) * scale
            + shift).to(dtype)


def _affine_weight(n, dtype, device, gen):
    # Non-trivial: a kernel that ignores the weight (all ones) or bias (all zeros) fails.
    return _randn((n,), dtype, device, gen, scale=0.2, shift=1.0)


def rotary_tables(seq_len, head_dim, dtype, device, base=10000.0, offset=0):
    """cos/sin tables [S, D/2] as LLaMA builds them (positions offset..offset+S-1)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device,
                                            dtype=torch.float64) / head_dim))
    pos = torch.arange(offset, offset + seq_len, device=device, dtype=torch.float64)
    angles = torch.outer(pos, inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _make_matmul(shape, dtype, device, gen, bias=False, activation=None, residual=False,
                 ln=False):
    M, N, K = shape
    inputs = {"A": _randn((M, K), dtype, device, gen), "B": _randn((K, N), dtype, device, gen),
              "bias": _randn((N,), dtype, device, gen, scale=2.0) if bias else None,
              "activation": activation}
    if residual:  # only then: kernel files written before the option keep their signature
        # rows 8 apart more than N (a view of a wider buffer): kernels must honour its stride
        inputs["residual"] = _randn((M, N + 8), dtype, device, gen, scale=4.0)[:, :N]
    if ln:  # a pre-norm block's LayerNorm on A's rows (rows off zero, as a residual stream's)
        inputs["A"] = _randn((M, K), dtype, device, gen, scale=2.0, shift=0.5)
        inputs.update(ln_weight=_affine_weight(K, dtype, device, gen),
                      ln_bias=_randn((K,), dtype, device, gen, scale=0.2), ln_eps=1e-5)
    return inputs


def _make_rows(shape, dtype, device, gen, scale=1.0):
    M, N = shape
    return {"x": _randn((M, N), dtype, device, gen, scale=scale)}


def _make_softmax(shape, dtype, device, gen):
    return _make_rows(shape, dtype, device, gen, scale=3.0)


def _make_layernorm(shape, dtype, device, gen, eps=1e-5, affine=True):
    M, N = shape
    return {"x": _randn((M, N), dtype, device, gen, scale=2.0, shift=0.5),
            "weight": _affine_weight(N, dtype, device, gen) if affine else None,
            "bias": _randn((N,), dtype, device, gen, scale=0.2) if affine else None,
            "eps": eps}


def _make_rmsnorm(shape, dtype, device, gen, eps=1e-6, affine=True):
    M, N = shape
    return {"x": _randn((M, N), dtype, device, gen, scale=2.0),
            "weight": _affine_weight(N, dtype, device, gen) if affine else None, "eps": eps}


def _make_attention(shape, dtype, device, gen, causal=True, kv_groups=1, scale=None,
                    layout="bhsd"):
    """H in the shape is the query heads; kv_groups query heads share a key/value head (the
    largest divisor of H not above kv_groups, so every shape takes every variant). layout
    "bshd": Q, K and V are head slices of one [B, S, H + 2 Hkv, D] buffer (a fused q/k/v
    projection's output, as GPT-2's c_attn leaves them), each seen as [B,H,S,D] through
    .transpose(1, 2): rows of positions wider than the tensor's own heads, at an offset. The
    swap passes such views uncopied, and separate projections' [B,S,H,D] views too (rows
    exactly H*D wide): a kernel that honours these strides takes both."""
    B, H, S, D = shape
    Hkv = H // max(g for g in range(1, kv_groups + 1) if H % g == 0)
    if layout == "bshd":
        qkv = _randn((B, S, H + 2 * Hkv, D), dtype, device, gen)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([H, Hkv, Hkv], dim=2))
    else:
        q, k, v = (_randn((B, heads, S, D), dtype, device, gen) for heads in (H, Hkv, Hkv))
    return {"Q": q, "K": k, "V": v, "causal": causal, "scale": scale}


def _make_decode_attention(shape, dtype, device, gen, ragged=False, scale=None):
    """A decode step's attention: queries for the newest Sq positions, a static cache of L
    positions. Default: every sequence's cache full (what the roofline counts). ragged: each
    sequence its own live length, from Sq to L - 1, the positions past it holding stale values
    of another scale, as a reused cache does: a kernel that reads them is wrong."""
    B, H, Hkv, Sq, L, D = shape
    Q = _randn((B, H, Sq, D), dtype, device, gen)
    K, V = (_randn((B, Hkv, L, D), dtype, device, gen) for _ in range(2))
    lengths = torch.full((B,), L, dtype=torch.int32, device=device)
    if ragged and L > Sq:
        lengths = torch.randint(Sq, L, (B,), device=device, generator=gen, dtype=torch.int32)
        stale = torch.arange(L, device=device)[None, None, :, None] >= lengths[:, None, None,
                                                                                 None].long()
        K, V = (t.masked_fill(stale, 20.0) for t in (K, V))
    return {"Q": Q, "K": K, "V": V, "lengths": lengths, "scale": scale}


def _make_fused_mlp(shape, dtype, device, gen, residual=False):
    M, D, F = shape
    inputs = {"x": _randn((M, D), dtype, device, gen),
              "w_gate": _randn((F, D), dtype, device, gen, scale=D ** -0.5),
              "w_up": _randn((F, D), dtype, device, gen, scale=D ** -0.5),
              "w_down": _randn((D, F), dtype, device, gen, scale=F ** -0.5)}
    if residual:  # as matmul's: a strided view (rows 8 apart more than D), only when asked
        inputs["residual"] = _randn((M, D + 8), dtype, device, gen, scale=4.0)[:, :D]
    return inputs


def _make_cross_entropy(shape, dtype, device, gen):
    M, V = shape
    return {"logits": _randn((M, V), dtype, device, gen, scale=2.0),
            "targets": torch.randint(0, V, (M,), device=device, generator=gen)}


def _make_rotary(shape, dtype, device, gen):
    B, H, S, D = shape
    offset = int(torch.randint(0, 4096, (1,), generator=gen, device=device).item())
    cos, sin = rotary_tables(S, D, dtype, device, offset=offset)
    return {"x": _randn((B, H, S, D), dtype, device, gen), "cos": cos, "sin": sin}


def _make_qkv_rotary(shape, dtype, device, gen, bias=False):
    B, S, K, Hq, Hkv, D = shape
    N = (Hq + 2 * Hkv) * D
    offset = int(torch.randint(0, 4096, (1,), generator=gen, device=device).item())
    cos, sin = rotary_tables(S, D, dtype, device, offset=offset)
    return {"x": _randn((B, S, K), dtype, device, gen),
            "w_qkv": _randn((N, K), dtype, device, gen, scale=K ** -0.5),
            "cos": cos, "sin": sin, "kv_heads": Hkv,
            "bias": _randn((N,), dtype, device, gen) if bias else None}


def _make_reduce(shape, dtype, device, gen, dim=-1, inner=1):
    """x[M, N] summed over dim (-1: rows, 0: columns); inner > 1 makes x[M, N, inner] summed over
    dim 1, the general case of a dim with dims on both sides."""
    M, N = shape
    size = (M, N) if inner == 1 else (M, N, inner)
    return {"x": _randn(size, dtype, device, gen), "dim": dim}


def _sum_norm_rms(inputs):
    # A sum's natural scale: the RMS of the L2 norms of the vectors summed (sqrt(N) for N unit
    # values), what the output's RMS is anyway when there are many outputs.
    x = inputs["x"].double()
    return float(x.square().sum(inputs.get("dim", -1)).mean().sqrt()) if x.numel() else 1.0


# ---------------------------------------------------------------------------------------------
# Adversarial inputs (stage 3): each maker returns [(label, inputs), ...] built on fresh values.
# ---------------------------------------------------------------------------------------------

def _big(dtype):
    # A large magnitude that is still finite after the math (fp16 max is 65504).
    return 1e4 if dtype == torch.float16 else 1e6


def _adv_matmul(shape, dtype, device, gen, **options):
    M, N, K = shape
    inp = _make_matmul(shape, dtype, device, gen, **options)
    # Wide dynamic range: rows of A and columns of B scaled over 2^-6 .. 2^0. Scales stay <= 1 so
    # every output element keeps the error budget of an unscaled one: with scales above 1, fp32
    # rounding where a dot product cancels exceeds the elementwise 1e-4 for ANY fp32 kernel
    # (torch's own fp32 matmul included), which would test luck, not kernels.
    rs = 2.0 ** torch.randint(-6, 1, (M, 1), device=device, generator=gen).float()
    cs = 2.0 ** torch.randint(-6, 1, (1, N), device=device, generator=gen).float()
    wide = dict(inp, A=(inp["A"].float() * rs).to(dtype))
    # Under a norm only A's rows are scaled (the norm must undo it, eps and all). A norm's
    # product rounds once on the way, as every pipeline does (eager: the norm's output in A's
    # dtype), and that error follows a column's scale, not the output's RMS that atol follows:
    # with B's columns scaled too, eager itself failed bf16 here (1 element of 8M on a CPU, 3 of
    # 12M on the H100).
    if not options.get("ln"):
        wide["B"] = (inp["B"].float() * cs).to(dtype)
        ones = dict(inp, A=torch.ones((M, K), device=device, dtype=dtype))
        return [("wide dynamic range", wide), ("all-ones A", ones)]
    # Rows whose mean is many times their spread (a residual stream's outlier rows): no variance
    # as E[x^2] - E[x]^2 about zero, and a centring done after the products (x B - mean
    # colsum(B)) must cancel exactly.
    spread = 2.0 ** torch.randint(-3, 1, (M, 1), device=device, generator=gen).float()
    offset = 4.0 * torch.randn((M, 1), device=device, generator=gen)
    far = torch.randn((M, K), device=device, generator=gen) * spread + offset
    return [("wide dynamic range", wide), ("rows far from zero", dict(inp, A=far.to(dtype)))]


def _adv_softmax(shape, dtype, device, gen, **options):
    M, N = shape
    big = _big(dtype)
    equal = {"x": torch.full((M, N), big, device=device, dtype=dtype)}
    spread = _randn((M, N), dtype, device, gen, scale=big / 8)
    one_hot = torch.full((M, N), -big, device=device, dtype=dtype)
    one_hot[:, -1] = big  # the max in the last element: catches a row loop that drops its tail
    return [("huge equal rows", equal), ("huge spread rows", {"x": spread}),
            ("max at the row's last element", {"x": one_hot})]


def _adv_norm(make):
    def adv(shape, dtype, device, gen, **options):
        M, N = shape
        near_const = make(shape, dtype, device, gen, **options)
        # Tiny variance on a large mean: E[x^2] - E[x]^2 cancels catastrophically. fp32 inputs
        # get a milder ratio, since fp32 rounding of the mean alone would break 1e-4 at 1e-3/3.
        noise, mean = (1e-2, 1.0) if dtype == torch.float32 else (1e-3, 3.0)
        near_const["x"] = _randn((M, N), dtype, device, gen, scale=noise, shift=mean)
        large = make(shape, dtype, device, gen, **options)
        large["x"] = _randn((M, N), dtype, device, gen, scale=_big(dtype) / 100,
                            shift=_big(dtype) / 50)
        return [("near-zero variance", near_const), ("large mean and magnitude", large)]
    return adv


# The sharp-scores case: scaled scores ~N(0, SHARP_STD), whatever the variant's scale. exp of
# the largest overflows every float type without the max subtracted, and the running max moves
# between key blocks; yet fp32 stays well conditioned (a score's rounding grows with its size
# and moves the softmax weights by as much): on the H100 PyTorch's own fp32 SDPA missed the fp32
# tolerance by up to 2.1x at scores ~N(0, 154) (Q, K times 8 with scale 0.3), and stayed within
# 0.9 of it at ~N(0, 64).
SHARP_STD = 32.0


def _adv_attention(shape, dtype, device, gen, **options):
    inp = _make_attention(shape, dtype, device, gen, **options)
    D = shape[3]
    scale = options.get("scale") or D ** -0.5
    factor = (SHARP_STD / (scale * D ** 0.5)) ** 0.5  # on Q and on K: scores grow by its square
    sharp = dict(inp, Q=(inp["Q"].float() * factor).to(dtype),
                 K=(inp["K"].float() * factor).to(dtype))
    return [("sharp scores (online softmax rescaling)", sharp)]


def _adv_decode_attention(shape, dtype, device, gen, **options):
    B, H, Hkv, Sq, L, D = shape
    options = dict(options, ragged=True)
    inp = _make_decode_attention(shape, dtype, device, gen, **options)
    stale = torch.arange(L, device=device)[None, None, :, None] >= inp["lengths"][:, None, None,
                                                                                  None].long()
    cases = [("NaN in the cache past the live length",
              dict(inp, K=inp["K"].masked_fill(stale, float("nan")),
                   V=inp["V"].masked_fill(stale, float("nan"))))]
    scale = options.get("scale") or D ** -0.5
    factor = (SHARP_STD / (scale * D ** 0.5)) ** 0.5
    cases.append(("sharp scores (online softmax rescaling)",
                  dict(inp, Q=(inp["Q"].float() * factor).to(dtype),
                       K=(inp["K"].float() * factor).to(dtype))))
    return cases


def _adv_fused_mlp(shape, dtype, device, gen, **options):
    inp = _make_fused_mlp(shape, dtype, device, gen, **options)
    # Gate pre-activations ~N(0, 64): silu saturates on both sides (exp overflows in fp16 math);
    # the up projection shrinks by as much so the product, and its fp16 rounding, stay O(1).
    return [("saturated gate", dict(inp, w_gate=(inp["w_gate"].float() * 8).to(dtype),
                                    w_up=(inp["w_up"].float() / 8).to(dtype)))]


def _adv_cross_entropy(shape, dtype, device, gen, **options):
    M, V = shape
    big = _big(dtype)
    logits = _randn((M, V), dtype, device, gen, scale=big / 8)
    edge_targets = torch.randint(0, 2, (M,), device=device, generator=gen) * (V - 1)
    confident = _randn((M, V), dtype, device, gen)
    confident[torch.arange(M, device=device), edge_targets] = big
    return [("huge logits", {"logits": logits,
                             "targets": torch.randint(0, V, (M,), device=device, generator=gen)}),
            ("targets 0 and V-1, confident", {"logits": confident, "targets": edge_targets})]


def _adv_rotary(shape, dtype, device, gen, **options):
    inp = _make_rotary(shape, dtype, device, gen)
    # Large enough that fp16 intermediates (x1*cos rounded before the subtraction) fail, small
    # enough that fp32 math stays inside the fp32 tolerance where the two products cancel.
    scale = 100.0 if dtype == torch.float32 else 500.0
    return [("large values", dict(inp, x=(inp["x"].float() * scale).to(dtype)))]


def _adv_qkv_rotary(shape, dtype, device, gen, **options):
    B, S, K = shape[:3]
    inp = _make_qkv_rotary(shape, dtype, device, gen, **options)
    # As for matmul: rows of x and of w_qkv scaled over 2^-6 .. 2^0 (see _adv_matmul). And the
    # same x at every position, where only the rotation tells the positions apart: a kernel
    # that takes a row's position from the wrong index (m instead of m % S, or none) fails.
    rs = 2.0 ** torch.randint(-6, 1, (B, S, 1), device=device, generator=gen).float()
    ws = 2.0 ** torch.randint(-6, 1, (inp["w_qkv"].shape[0], 1), device=device,
                              generator=gen).float()
    wide = dict(inp, x=(inp["x"].float() * rs).to(dtype),
                w_qkv=(inp["w_qkv"].float() * ws).to(dtype))
    same = dict(inp, x=inp["x"][:1, :1].expand(B, S, K).contiguous())
    return [("wide dynamic range", wide), ("the same x at every position", same)]


def _adv_reduce(shape, dtype, device, gen, dim=-1, inner=1):
    M, N = shape
    # Positive values whose sum stays finite in fp16 but loses digits with an fp16 accumulator.
    top = 6.0e4 / N if dtype == torch.float16 else 8.0
    # (No cancelling case: elementwise tolerance on a sum that cancels to ~0 fails every fp32
    # accumulator, so it would test luck, not kernels.)
    pos = (torch.rand((M, N), device=device, generator=gen) * top).to(dtype)
    return [("positive, fp16 accumulation loses digits", {"x": pos, "dim": -1})]


# ---------------------------------------------------------------------------------------------
# FLOP and byte counts (the fewest bytes: each input read once, each output written once)
# ---------------------------------------------------------------------------------------------

def _es(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _attention_flops(s, causal=True, **options):
    B, H, S, D = s
    return 4 * B * H * S * S * D / (2 if causal else 1)  # causal: half of QK^T and PV


from autokernel import KERNEL_TYPE_NAMES  # noqa: E402


@dataclass(frozen=True)
class KernelType:
    name: str
    args: tuple                 # kernel_fn's arguments, in order (all passed by name)
    shape_names: tuple          # what each entry of a shape tuple means
    make_inputs: Callable       # (shape, dtype, device, gen, **variant) -> {arg: value}
    adversarial: Callable       # (shape, dtype, device, gen, **variant) -> [(label, {arg: value})]
    flops: Callable             # (shape, **variant) -> floating-point operations
    bytes: Callable             # (shape, dtype) -> fewest bytes moved through device memory
    bound: str                  # "memory" or "compute": how the roofline judges it
    gpu_shapes: dict            # stage -> [shape, ...]; "primary" is a single shape
    cpu_shapes: dict            # the same, small enough for the interpreter
    uses_dot: bool = False      # tl.dot in bf16 is wrong in the interpreter: CPU mode skips bf16
    out_dtype: torch.dtype = None  # None: same as the first input's dtype
    # inputs -> the size of the terms one output element adds up, for types whose outputs can
    # cancel to ~0 (a sum); mismatches() never judges atol below it. None: 1.
    term_scale: Callable = None
    # What real models vary, as options of make_inputs: the gate cycles through these over its
    # shapes (every one is judged in every dtype); the first is the default, what is timed
    # unless the kernel file's BENCH_VARIANT names another.
    variants: tuple = ({},)
    # The output's dims in memory order, outermost first (None: row-major). Inside a compiled
    # model the op's output has exactly this dense layout (ops.out_strides): what the next op
    # reads.
    out_order: tuple = None

    def shapes(self, stage: str):
        return (self.gpu_shapes if CUDA else self.cpu_shapes)[stage]

    def dtypes(self):
        if not CUDA and self.uses_dot:
            return [torch.float16, torch.float32]
        return [torch.float16, torch.bfloat16, torch.float32]

    def inputs(self, shape, dtype, device=DEVICE, gen=None, variant=None):
        return self.make_inputs(tuple(shape), dtype, device, gen, **(variant or {}))

    def check_variant(self, variant):
        """A BENCH_VARIANT's options, or a ValueError naming the ones this type takes."""
        known = {k for v in self.variants for k in v}
        unknown = set(variant or {}) - known
        if unknown:
            raise ValueError(f"BENCH_VARIANT option {sorted(unknown)[0]!r} is not one of "
                             f"{self.name}'s: {', '.join(sorted(known)) or 'none'}")
        return dict(variant or {})

    def reference(self, **inputs):
        from autokernel import reference
        return getattr(reference, self.name)(**inputs)

    def eager(self, **inputs):
        from autokernel import reference
        return getattr(reference, f"{self.name}_eager")(**inputs)

    def error_scale(self, inputs) -> float:
        """The least output scale mismatches() assumes: at least 1, and the terms' scale where
        the type has one (a non-finite one, from inf inputs, counts as none)."""
        scale = float(self.term_scale(inputs)) if self.term_scale else 1.0
        return scale if math.isfinite(scale) and scale > 1.0 else 1.0

    def mismatches(self, got, want, inputs):
        """autokernel.mismatches for an output of these inputs: their dtype's tolerance, atol
        never below error_scale(inputs). What the gate and bench_starters judge values by."""
        return mismatches(got, want, inputs[self.args[0]].dtype, self.error_scale(inputs))

    def shape_str(self, shape):
        return "x".join(str(d) for d in shape)


def _shape_sets(primary, sweep, stability, edge):
    return {"primary": primary, "sweep": sweep, "stability": stability, "edge": edge}


# The two norms share their odd-size cases and their CPU shapes.
NORM_GPU_EDGE = [(1023, 1023), (4097, 1537), (513, 4097), (100, 50257)]
NORM_CPU_SHAPES = _shape_sets((64, 1024), [(1, 16), (4, 128), (16, 768), (8, 4096), (2, 5000)],
                              [(4, 512)], [(3, 1023), (2, 4097), (5, 1537), (2, 50257)])

KERNEL_TYPES = {k.name: k for k in [
    KernelType(
        "matmul", ("A", "B", "bias", "activation", "residual", "ln_weight", "ln_bias", "ln_eps"),
        ("M", "N", "K"), _make_matmul,
        _adv_matmul,
        flops=lambda s, **v: 2 * s[0] * s[1] * s[2],
        bytes=lambda s, dt: (s[0] * s[2] + s[2] * s[1] + s[0] * s[1]) * _es(dt),
        bound="compute", uses_dot=True,
        variants=({}, {"bias": True}, {"bias": True, "activation": "gelu_tanh"},
                  {"bias": True, "activation": "gelu"}, {"bias": True, "residual": True},
                  {"activation": "gelu", "residual": True}, {"bias": True, "ln": True},
                  {"bias": True, "activation": "gelu_tanh", "ln": True}),
        gpu_shapes=_shape_sets((4096, 4096, 4096),
                               [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
                                (4096, 4096, 4096), (8192, 8192, 8192), (128, 4096, 4096),
                                (4096, 11008, 4096), (2048, 512, 8192)],
                               [(1024, 1024, 1024)],
                               [(1023, 1023, 1023), (4097, 1537, 1023), (1, 4096, 4096),
                                (1537, 50257, 768)]),
        cpu_shapes=_shape_sets((64, 64, 64),
                               [(16, 16, 16), (64, 32, 48), (32, 64, 128), (128, 64, 64)],
                               [(32, 32, 64)],
                               [(33, 17, 1023), (1, 31, 65), (31, 1537, 16)])),
    KernelType(
        "softmax", ("x",), ("M", "N"), _make_softmax, _adv_softmax,
        flops=lambda s, **v: 5 * s[0] * s[1],
        bytes=lambda s, dt: 2 * s[0] * s[1] * _es(dt),
        bound="memory",
        gpu_shapes=_shape_sets((8192, 8192),
                               [(1, 1024), (128, 4096), (1024, 1024), (4096, 4096), (8192, 8192),
                                (4096, 32000), (4096, 50257), (2048, 128256), (32768, 512)],
                               [(256, 8192)],
                               [(1023, 1023), (4097, 1537), (513, 4097), (1024, 50257),
                                (256, 128256)]),
        cpu_shapes=_shape_sets((64, 1024),
                               [(1, 16), (4, 128), (16, 1024), (8, 4096), (2, 5000)],
                               [(4, 512)],
                               [(3, 1023), (2, 4097), (5, 1537), (2, 50257)])),
    KernelType(
        "layernorm", ("x", "weight", "bias", "eps"), ("M", "N"), _make_layernorm,
        _adv_norm(_make_layernorm),
        flops=lambda s, **v: 8 * s[0] * s[1],
        bytes=lambda s, dt: (2 * s[0] * s[1] + 2 * s[1]) * _es(dt),
        bound="memory", variants=({}, {"eps": 1e-12}, {"eps": 1e-6, "affine": False}),
        gpu_shapes=_shape_sets((8192, 4096),
                               [(1, 768), (128, 1024), (2048, 768), (4096, 1024), (8192, 4096),
                                (4096, 8192), (16384, 2048), (1024, 16384)],
                               [(512, 4096)], NORM_GPU_EDGE),
        cpu_shapes=NORM_CPU_SHAPES),
    KernelType(
        "rmsnorm", ("x", "weight", "eps"), ("M", "N"), _make_rmsnorm, _adv_norm(_make_rmsnorm),
        flops=lambda s, **v: 4 * s[0] * s[1],
        bytes=lambda s, dt: (2 * s[0] * s[1] + s[1]) * _es(dt),
        bound="memory", variants=({}, {"eps": 1e-5}, {"affine": False}),
        gpu_shapes=_shape_sets((8192, 8192),
                               [(1, 4096), (128, 4096), (2048, 2048), (4096, 4096), (8192, 8192),
                                (16384, 4096), (4096, 11008), (1024, 16384)],
                               [(512, 4096)], NORM_GPU_EDGE),
        cpu_shapes=NORM_CPU_SHAPES),
    KernelType(
        "flash_attention", ("Q", "K", "V", "causal", "scale"), ("B", "H", "S", "D"), _make_attention,
        _adv_attention,
        flops=_attention_flops,
        bytes=lambda s, dt: 4 * s[0] * s[1] * s[2] * s[3] * _es(dt),
        bound="compute", uses_dot=True,
        variants=({}, {"causal": False}, {"kv_groups": 4},
                  {"causal": False, "kv_groups": 2, "scale": 0.3},
                  {"kv_groups": 4, "layout": "bshd"}),
        # O[B,H,S,D] stored as [B,S,H,D], as torch's flash SDPA stores it: the model's
        # y.transpose(1, 2).reshape(B, S, H * D) for the output projection is then a view.
        out_order=(0, 2, 1, 3),
        gpu_shapes=_shape_sets((2, 32, 2048, 128),
                               [(1, 8, 128, 64), (1, 16, 512, 64), (2, 16, 1024, 128),
                                (2, 32, 2048, 128), (1, 32, 4096, 64), (4, 12, 1024, 64),
                                (1, 8, 8192, 128), (8, 16, 256, 128)],
                               [(1, 8, 512, 64)],
                               [(1, 4, 127, 64), (2, 8, 1023, 128), (1, 2, 1537, 64),
                                (1, 1, 1, 64), (3, 5, 257, 128)]),
        cpu_shapes=_shape_sets((1, 2, 128, 64),
                               [(1, 1, 16, 16), (1, 2, 64, 32), (1, 4, 32, 32),
                                (1, 2, 64, 64)],
                               [(1, 2, 64, 32)],
                               [(1, 1, 127, 64), (1, 1, 33, 128), (1, 4, 1, 32)])),
    KernelType(
        "fused_mlp", ("x", "w_gate", "w_up", "w_down", "residual"), ("M", "D", "F"),
        _make_fused_mlp, _adv_fused_mlp,
        flops=lambda s, **v: 6 * s[0] * s[1] * s[2],
        bytes=lambda s, dt: (2 * s[0] * s[1] + 3 * s[1] * s[2]) * _es(dt),
        bound="compute", uses_dot=True, variants=({}, {"residual": True}),
        gpu_shapes=_shape_sets((2048, 4096, 11008),
                               [(128, 1024, 2816), (512, 2048, 5632), (1024, 4096, 11008),
                                (2048, 4096, 11008), (4096, 2048, 5632), (8192, 768, 3072),
                                (1, 4096, 11008), (256, 4096, 14336)],
                               [(256, 1024, 2816)],
                               [(1023, 1023, 2731), (4097, 768, 1537), (33, 2048, 5461)]),
        cpu_shapes=_shape_sets((64, 64, 128),
                               [(16, 16, 32), (32, 64, 96), (64, 32, 64)],
                               [(16, 32, 64)],
                               [(33, 17, 1023), (7, 65, 129)])),
    KernelType(
        "cross_entropy", ("logits", "targets"), ("M", "V"), _make_cross_entropy,
        _adv_cross_entropy,
        flops=lambda s, **v: 4 * s[0] * s[1],
        bytes=lambda s, dt: s[0] * s[1] * _es(dt) + 8 * s[0] + 4,
        bound="memory", out_dtype=torch.float32,
        gpu_shapes=_shape_sets((8192, 32000),
                               [(1, 32000), (128, 50257), (1024, 32000), (8192, 32000),
                                (4096, 50257), (4096, 128256), (16384, 8192), (2048, 151936)],
                               [(256, 32000)],
                               [(1023, 1023), (4097, 1537), (513, 50257), (257, 128256)]),
        cpu_shapes=_shape_sets((64, 1024),
                               [(1, 16), (4, 128), (16, 1000), (8, 4096)],
                               [(4, 512)],
                               [(3, 1023), (2, 4097), (5, 1537), (2, 50257)])),
    KernelType(
        "rotary_embedding", ("x", "cos", "sin"), ("B", "H", "S", "D"), _make_rotary,
        _adv_rotary,
        flops=lambda s, **v: 3 * s[0] * s[1] * s[2] * s[3],
        bytes=lambda s, dt: (2 * s[0] * s[1] * s[2] * s[3] + s[2] * s[3]) * _es(dt),
        bound="memory",
        gpu_shapes=_shape_sets((2, 32, 2048, 128),
                               [(1, 8, 128, 64), (1, 32, 512, 128), (4, 12, 1024, 64),
                                (2, 32, 2048, 128), (1, 32, 4096, 128), (8, 32, 1024, 128),
                                (1, 8, 8192, 64), (16, 16, 256, 64)],
                               [(1, 8, 512, 128)],
                               [(1, 4, 127, 64), (2, 8, 1023, 128), (1, 2, 1537, 64),
                                (1, 3, 4097, 32)]),
        cpu_shapes=_shape_sets((1, 2, 128, 64),
                               [(1, 1, 16, 16), (1, 2, 64, 32), (2, 1, 64, 128)],
                               [(1, 2, 32, 64)],
                               [(1, 1, 127, 64), (1, 3, 1023, 32), (1, 1, 1537, 16)])),
    KernelType(
        "reduce", ("x", "dim"), ("M", "N"), _make_reduce, _adv_reduce,
        flops=lambda s, **v: s[0] * s[1],
        bytes=lambda s, dt: (s[0] * s[1] + s[0]) * _es(dt),
        bound="memory", term_scale=_sum_norm_rms,
        variants=({}, {"dim": 0}, {"dim": 1, "inner": 8}),
        gpu_shapes=_shape_sets((16384, 4096),
                               [(1, 4096), (128, 1024), (1024, 4096), (4096, 4096), (16384, 4096),
                                (8192, 8192), (4096, 32000), (65536, 256)],
                               [(256, 8192)],
                               [(1023, 1023), (4097, 1537), (513, 4097), (64, 50257),
                                (16, 128256)]),
        cpu_shapes=_shape_sets((64, 1024),
                               [(1, 16), (4, 128), (16, 1000), (8, 4096)],
                               [(4, 512)],
                               [(3, 1023), (2, 4097), (5, 1537), (2, 50257)])),
    KernelType(
        "qkv_rotary", ("x", "w_qkv", "cos", "sin", "kv_heads", "bias"),
        ("B", "S", "K", "Hq", "Hkv", "D"), _make_qkv_rotary, _adv_qkv_rotary,
        flops=lambda s, **v: 2 * s[0] * s[1] * s[2] * (s[3] + 2 * s[4]) * s[5]
        + 3 * s[0] * s[1] * (s[3] + s[4]) * s[5],
        bytes=lambda s, dt: (s[0] * s[1] * s[2] + (s[2] + s[0] * s[1]) * (s[3] + 2 * s[4]) * s[5]
                             + s[1] * s[5]) * _es(dt),
        bound="compute", uses_dot=True, variants=({}, {"bias": True}),
        gpu_shapes=_shape_sets((8, 2048, 768, 12, 12, 64),
                               [(8, 2048, 768, 12, 12, 64), (4, 2048, 2048, 32, 8, 64),
                                (4, 2048, 896, 14, 2, 64), (1, 4096, 4096, 32, 32, 128),
                                (1, 128, 4096, 32, 8, 128), (16, 512, 1024, 16, 16, 64)],
                               [(2, 256, 512, 8, 8, 64)],
                               [(2, 1023, 768, 12, 12, 64), (1, 1, 2048, 16, 4, 128),
                                (3, 257, 1000, 5, 1, 64), (1, 127, 896, 7, 7, 128)]),
        cpu_shapes=_shape_sets((1, 32, 64, 2, 2, 32),
                               [(1, 16, 32, 2, 1, 16), (2, 8, 48, 3, 3, 32)],
                               [(1, 16, 32, 2, 2, 16)],
                               [(1, 33, 40, 3, 1, 16), (2, 7, 24, 1, 1, 64)])),
    KernelType(
        "decode_attention", ("Q", "K", "V", "lengths", "scale"), ("B", "H", "Hkv", "Sq", "L", "D"),
        _make_decode_attention, _adv_decode_attention,
        flops=lambda s, **v: 4 * s[0] * s[1] * s[3] * s[4] * s[5],
        bytes=lambda s, dt: (2 * s[0] * s[2] * s[4] * s[5] + 2 * s[0] * s[1] * s[3] * s[5])
        * _es(dt) + 4 * s[0],
        bound="memory", uses_dot=True,
        variants=({}, {"ragged": True}, {"ragged": True, "scale": 0.3}),
        # Llama-3.2-1B's (32 query heads, 8 key/value heads, head 64) at batch 8 after a 512-token
        # prompt and 256 new ones; then other models' heads, batches, caches and Sq > 1.
        gpu_shapes=_shape_sets((8, 32, 8, 1, 768, 64),
                               [(1, 32, 8, 1, 768, 64), (1, 32, 8, 1, 4096, 128),
                                (8, 32, 8, 1, 2048, 128), (32, 32, 8, 1, 1024, 64),
                                (4, 16, 16, 1, 8192, 64), (2, 32, 8, 4, 1024, 128),
                                (16, 12, 12, 1, 1024, 64), (1, 32, 32, 1, 2048, 128)],
                               [(2, 8, 2, 1, 512, 64)],
                               [(3, 5, 5, 1, 1023, 64), (1, 8, 2, 1, 1, 128),
                                (2, 14, 2, 1, 1537, 64), (1, 6, 2, 3, 777, 64),
                                (2, 4, 4, 1, 300, 96)]),
        cpu_shapes=_shape_sets((1, 4, 2, 1, 64, 32),
                               [(2, 4, 2, 1, 40, 16), (1, 2, 2, 2, 33, 32), (1, 8, 1, 1, 100, 64)],
                               [(1, 2, 1, 1, 32, 16)],
                               [(3, 3, 3, 1, 17, 16), (1, 2, 2, 1, 1, 32), (1, 2, 1, 1, 9, 48)])),
]}
assert tuple(KERNEL_TYPES) == KERNEL_TYPE_NAMES


def kernel_type(name: str) -> KernelType:
    """Look a type up by name, with a one-line error naming them all."""
    if name not in KERNEL_TYPES:
        raise ValueError(f"unknown kernel type {name!r}: use one of {', '.join(KERNEL_TYPES)}")
    return KERNEL_TYPES[name]


def out_dtype(ktype: KernelType, inputs: dict) -> torch.dtype:
    return ktype.out_dtype or inputs[ktype.args[0]].dtype


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCES[dtype]


def mismatches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, floor: float = 1.0,
               rms: float = None):
    """Where got differs from the oracle beyond the tolerance for input `dtype`: a bool tensor,
    and the absolute tolerance used. rms: the RMS of the whole output's finite values, when
    got and want are one piece of it (an output too large to compare at once).

    rtol is the table's value. atol is the table's value in units of the output's scale (its RMS,
    never less than `floor`, which is 1 or the type's error_scale): for unit-scale outputs (norms,
    softmax, attention, rotary) that is exactly the table, while for long dot products and sums it
    stays achievable. A plain atol of 1e-4 on a fp32 8192^3 matmul, whose outputs have an RMS near
    90, demands 1e-6 relative accuracy where the products cancel, more than fp32 accumulation over
    8192 terms gives (cuBLAS's included). The floor covers outputs too few to have a telling RMS:
    one row's sum of 128256 unit values can land near 0 while its rounding error is set by the
    terms (~5e-5 in fp32), so reduce judges it at the terms' scale, as it would with many rows."""
    tol = TOLERANCES[dtype]
    got, want = got.double(), want.double()
    if rms is None:
        finite = want[torch.isfinite(want)]
        rms = float(finite.square().mean().sqrt()) if finite.numel() else 0.0
    atol = tol * max(floor, rms)
    return ~torch.isclose(got, want, rtol=tol, atol=atol), atol


def roofline(ktype: KernelType, shape, dtype, latency_us: float, ceilings: dict,
             variant=None) -> dict:
    """Achieved TFLOP/s and GB/s, and pct_peak = achieved over attainable, at most 100%.

    ceilings: {"bandwidth_gb_s": measured copy GB/s, "tflops": measured matmul TFLOP/s}.
    Attainable time is the larger of the compute and memory floors (the roofline). The measured
    ceilings are what cuBLAS and a copy reach, so a kernel can beat them (a Triton matmul beats
    cuBLAS at 4096^3 on the H100): then the kernel itself is the best attainable we know of,
    pct_peak is 100 and above_ceiling says so (the raw ratio stays in the achieved numbers)."""
    flops, nbytes = ktype.flops(shape, **(variant or {})), ktype.bytes(shape, dtype)
    seconds = latency_us * 1e-6
    tflops = flops / seconds / 1e12 if seconds > 0 else 0.0
    gb_s = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    floor_s = max(flops / (ceilings["tflops"] * 1e12) if ceilings.get("tflops") else 0.0,
                  nbytes / (ceilings["bandwidth_gb_s"] * 1e9)
                  if ceilings.get("bandwidth_gb_s") else 0.0)
    pct = 100.0 * floor_s / seconds if seconds > 0 and floor_s > 0 else float("nan")
    return {"throughput_tflops": tflops, "bandwidth_gb_s": gb_s, "pct_peak": min(pct, 100.0),
            "above_ceiling": pct > 100.0, "floor_us": floor_s * 1e6}
