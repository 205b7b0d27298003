"""
Profile a PyTorch model, attribute its GPU time to ops, classify each op as one of the nine kernel
types or a named group (elementwise, copy/cast, embedding, ...), and rank them.

    uv run profile.py                                    # the default: models/llama.py, compact
    uv run profile.py --model models/gpt2.py --input-shape 8x1024 --dtype bf16
    uv run profile.py --model models/llama.py --config 7b --input-shape 1x2048
    uv run profile.py --model my_model.py --class-name MyNet      # your own file
    uv run profile.py --model kernelbench_level1_23.py            # KernelBench format
    uv run profile.py --module transformers --hf-config tiny-llama   # or a local config.json/dir

How the time is attributed: every GPU kernel (on a CPU: every op's self time) belongs to the
innermost `autokernel::` scope it ran in -- profile.py wraps modules that ARE a kernel type
(RMSNorm, SwiGLU, RotaryEmbedding; see MODULE_SCOPES) in such scopes while profiling -- or else
to the outermost aten op that launched it (aten::linear, not the aten::addmm inside it), which
OP_TABLE classifies. Wall time is measured in a separate run without the profiler, so
"GPU busy" = GPU kernel time / wall time is not skewed by profiling overhead.

Writes workspace/profile.json (schema below) and prints a ranked table. On a CPU the times are
CPU op times (labelled so) and there is no roofline.

profile.json schema (times are per iteration, in microseconds):
  model            str    what was profiled ("models/llama.py LLaMA config=compact (162.4M params)")
  model_args       dict   the loader flags as given (model, class_name, config, module,
                          hf_config, input_shape, dtype, device; null = default), so verify.py
                          can rebuild the same model
  input_shapes     list   shapes of the forward's tensor arguments, e.g. [[8, 1024]]
  dtype            str    fp16 | bf16 | fp32
  device           str    "cuda" or "cpu";  device_name: the GPU's name or "cpu"
  time_source      str    "gpu kernel time" or "cpu op time"
  warmup, iters    int
  wall_us          float  wall time of one forward (no profiler)
  total_op_us      float  summed kernel (op) time of one forward
  gpu_busy_pct     float  100 * total_op_us / wall_us (null on a CPU)
  launch_bound     bool   gpu_busy_pct < 60 (null on a CPU)
  named_pct        float  share of op time in named groups (the nine types or a named group)
  ceilings         {"tflops", "bandwidth_gb_s", "source"} for the roofline (null on a CPU)
  groups           [{"group", "time_us", "share"}] most time first
  entries          ranked list, most time first:
    name           op or scope: "aten::linear", "RMSNorm", "aten::scaled_dot_product_attention"
    group          one of the nine kernel types, a named group, or "other"
    kernel_type    one of autokernel.KERNEL_TYPE_NAMES, or null
    time_us, share (of total_op_us, 0..1), calls (per iteration)
    shapes         [[...], ...] in the kernel type's convention (matmul (M,N,K), attention
                   (B,H,S,D), ...), most time first; [] when the type's shape can't be derived
    shape_detail   [{"shape", "time_us", "calls"}] the same, with each shape's time
    bound          "compute" | "memory" (roofline; for untyped groups: the group's nature) | "n/a"
    pct_of_roofline  100 * roofline floor / measured time (typed ops on a GPU), else null
    amdahl_ceiling 1 / (1 - share): the end-to-end speedup if this op took no time at all
    note           why shapes are missing, or "" (never a silent default)
"""
import argparse
import json
import math
import os
import sys
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import autokernel  # noqa: F401  (first: CPU-mode setup and the stdlib `profile` fix)
from autokernel import KERNEL_TYPES, ROOT

import torch
from torch.profiler import ProfilerActivity, record_function

DEFAULT_MODEL = autokernel.MODELS_DIR / "llama.py"
CPU_INPUT_SHAPE = (1, 32)   # token models on a CPU: small enough that the default run is seconds
LAUNCH_BOUND_PCT = 60.0    # below: launch-bound, fix that before kernels
PARTLY_IDLE_PCT = 85.0     # below: worth saying how much of the wall time kernels can't touch
SCOPE_PREFIX = "autokernel::"


class UsageError(ValueError):
    """Bad user input (a missing file or class, a bad flag value): exit code 2."""


class ModelError(RuntimeError):
    """The model itself failed (import, construction or forward raised): exit code 1."""


# ---------------------------------------------------------------------------------------------
# Classification: ONE table from aten op to (group, kernel type, shape function)
# ---------------------------------------------------------------------------------------------
# Shape functions get (input_shapes, concrete_inputs) as the profiler records them and return
# the kernel type's shape tuple, or a string saying why there is none.

class Untyped(str):
    """A shape function's answer for an op that is NOT its kernel type (e.g. bidirectional
    attention): the op is classified in `group` with no kernel type, and the reason is its note."""

    def __new__(cls, reason, group):
        obj = super().__new__(cls, reason)
        obj.group = group
        return obj


def _rows(shape):
    """(M, N) of a tensor reduced/normalized over its last dim."""
    return (math.prod(shape[:-1]), shape[-1])


def _last_dim(dim, ndim):
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    return isinstance(dim, int) and dim in (-1, ndim - 1)


def _concrete(concrete, i):
    return concrete[i] if concrete and len(concrete) > i else None


def _linear_shape(shapes, concrete):
    x, w = shapes[0], shapes[1]
    if len(w) != 2:
        return f"linear weight of rank {len(w)}"
    return (math.prod(x[:-1]), w[0], w[1])


def _matmul_shape(shapes, concrete):
    a, b = shapes[0], shapes[1]
    if len(b) == 2 and len(a) >= 1:
        return (math.prod(a[:-1]) if len(a) > 1 else 1, b[1], b[0])
    return f"batched matmul {a} @ {b} has no 2-D (M,N,K) shape"


def _addmm_shape(shapes, concrete):
    a, b = shapes[1], shapes[2]
    return (a[0], b[1], a[1])


def _softmax_shape(shapes, concrete):
    x, dim = shapes[0], _concrete(concrete, 1)
    if dim is None:
        return "softmax dim not recorded by this torch's profiler"
    return _rows(x) if _last_dim(dim, len(x)) else f"softmax over dim {dim}, not the last"


def _layer_norm_shape(shapes, concrete):
    x, normalized = shapes[0], _concrete(concrete, 1)
    if normalized is not None and len(normalized) != 1:
        return f"layer_norm over {len(normalized)} dims, not the last one"
    if len(shapes) < 3 or not shapes[2] or not shapes[3]:
        return "layer_norm without weight and bias"
    return _rows(x)


def _rms_norm_shape(shapes, concrete):
    if len(shapes) < 3 or not shapes[2]:
        return "rms_norm without weight"
    return _rows(shapes[0])


def _sum_shape(shapes, concrete):
    x, dims = shapes[0], _concrete(concrete, 1)
    if not x:
        return "sum of a scalar"
    if dims is None:
        return "sum dims not recorded by this torch's profiler"
    return _rows(x) if _last_dim(dims, len(x)) else f"sum over dims {dims}, not the last"


def _cross_entropy_shape(shapes, concrete):
    logits, targets = shapes[0], shapes[1]
    if len(logits) != 2 or len(targets) != 1:
        return f"cross_entropy on logits {logits}: the kernel takes [M, V] with int targets [M]"
    if shapes[2] if len(shapes) > 2 else False:
        return "cross_entropy with class weights"
    if (_concrete(concrete, 5) or 0.0) != 0.0:
        return "cross_entropy with label smoothing"
    return tuple(logits)


def _sdpa_shape(shapes, concrete):
    q, k, v = shapes[0], shapes[1], shapes[2]
    if len(shapes) > 3 and shapes[3]:
        return "attention with an explicit mask"
    causal = _concrete(concrete, 5)
    if causal is None:
        return "is_causal not recorded by this torch's profiler"
    if not causal:
        return Untyped("bidirectional attention (the flash_attention kernel is causal)",
                       "attention")
    if not (q == k == v) or len(q) != 4:
        return f"q/k/v shapes differ ({q}, {k}, {v}): grouped-query or cross attention"
    scale = _concrete(concrete, 6)
    if scale is not None and abs(scale * math.sqrt(q[-1]) - 1) > 1e-6:
        return f"attention with a custom scale {scale:g} (the kernel's is 1/sqrt(D))"
    return tuple(q)


def _table(*rows):
    table = {}
    for group, ktype, shape_fn, ops in rows:
        for op in ops.split():
            table[f"aten::{op}"] = (group, ktype, shape_fn)
    return table


# group, kernel type (or None), shape function, aten ops (outermost op names, without "aten::")
OP_TABLE = _table(
    ("matmul", "matmul", _linear_shape, "linear"),
    ("matmul", "matmul", _matmul_shape, "matmul mm"),
    ("matmul", "matmul", _addmm_shape, "addmm"),
    ("matmul", "matmul", lambda s, c: "batched matmul (bmm) has no 2-D (M,N,K) shape",
     "bmm baddbmm einsum"),
    ("matmul", None, None, "addmv mv dot vdot outer addbmm _scaled_mm"),
    ("softmax", "softmax", _softmax_shape, "softmax _softmax"),
    ("log_softmax", None, None, "log_softmax _log_softmax"),
    ("attention", None, None, "_native_multi_head_attention multi_head_attention_forward"),
    ("layernorm", "layernorm", _layer_norm_shape, "layer_norm native_layer_norm"),
    ("rmsnorm", "rmsnorm", _rms_norm_shape, "rms_norm _fused_rms_norm"),
    ("normalization", None, None, "group_norm native_group_norm batch_norm native_batch_norm "
     "_native_batch_norm_legit_no_training instance_norm"),
    ("flash_attention", "flash_attention", _sdpa_shape, "scaled_dot_product_attention"),
    ("attention", None, None, "_scaled_dot_product_flash_attention "
     "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
     "_flash_attention_forward _efficient_attention_forward _scaled_dot_product_attention_math "
     "_scaled_dot_product_flash_attention_for_cpu"),
    ("cross_entropy", "cross_entropy", _cross_entropy_shape, "cross_entropy_loss"),
    ("loss", None, None, "nll_loss nll_loss_nd nll_loss_forward nll_loss2d mse_loss l1_loss "
     "binary_cross_entropy binary_cross_entropy_with_logits smooth_l1_loss kl_div"),
    ("reduce", "reduce", _sum_shape, "sum"),
    ("reduction", None, None, "mean amax amin max min argmax argmin var std var_mean std_mean "
     "norm linalg_vector_norm prod logsumexp any all count_nonzero cumsum cumprod"),
    ("sort/topk", None, None, "sort topk argsort multinomial"),
    ("scalar/sync", None, None, "is_nonzero item _local_scalar_dense equal allclose"),
    ("elementwise", None, None,
     "add sub rsub mul div neg pow rsqrt sqrt exp exp2 expm1 log log1p log2 tanh sigmoid gelu "
     "silu relu relu6 leaky_relu elu selu celu mish softplus hardtanh hardswish hardsigmoid "
     "erf erfc abs sign sin cos reciprocal square clamp clamp_min clamp_max clip where "
     "masked_fill maximum minimum eq ne lt le gt ge logical_and logical_or logical_not "
     "bitwise_and bitwise_or bitwise_not floor ceil round trunc frac remainder fmod "
     "floor_divide lerp addcmul addcdiv triu tril dropout native_dropout feature_dropout "
     "isnan isinf nan_to_num glu silu_ gelu_ threshold polar view_as_real view_as_complex "
     "complex real imag diff"),
    ("copy/cast", None, None,
     "to _to_copy copy_ contiguous clone type_as float half bfloat16 double int long bool "
     "reshape view _unsafe_view transpose permute t expand expand_as flatten unflatten "
     "squeeze unsqueeze narrow slice select split split_with_sizes chunk unbind movedim "
     "as_strided detach alias numpy_T view_as _reshape_alias lift_fresh"),
    ("embedding", None, None, "embedding embedding_bag"),
    ("indexing", None, None, "index index_select gather scatter scatter_add index_put "
     "index_add index_copy masked_select masked_scatter nonzero take repeat_interleave "
     "one_hot"),
    ("concat/pad", None, None, "cat stack hstack vstack concat constant_pad_nd pad repeat roll "
     "flip tile"),
    ("fill/init", None, None, "zeros zeros_like ones ones_like full full_like empty empty_like "
     "empty_strided fill zero arange linspace rand randn randint rand_like randn_like "
     "normal uniform bernoulli scalar_tensor new_zeros new_ones new_full new_empty"),
    ("convolution", None, None, "conv1d conv2d conv3d convolution _convolution "
     "cudnn_convolution conv_transpose1d conv_transpose2d conv_transpose3d"),
    ("pooling/resize", None, None, "max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d "
     "avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_max_pool2d upsample_nearest2d "
     "upsample_bilinear2d interpolate pixel_shuffle"),
)
# The nature of untyped groups, for the "bound" column (they move data, they don't compute).
GROUP_BOUND = {"elementwise": "memory", "copy/cast": "memory", "embedding": "memory",
               "indexing": "memory", "concat/pad": "memory", "fill/init": "memory",
               "log_softmax": "memory", "reduction": "memory", "normalization": "memory",
               "loss": "memory", "pooling/resize": "memory", "attention": "compute",
               "scalar/sync": "memory",
               "convolution": "compute"}
OTHER = "other"


def classify_op(name, shapes, concrete):
    """(group, kernel_type, shape or None, note) for an outermost op."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    group, ktype, shape_fn = OP_TABLE.get(name) or OP_TABLE.get(base) or (OTHER, None, None)
    if ktype is None:
        return group, None, None, ""
    try:
        shape = shape_fn(shapes, concrete)
    except (IndexError, TypeError, ValueError) as e:
        shape = f"could not read {name}'s input shapes ({e})"
    if isinstance(shape, Untyped):
        return shape.group, None, None, str(shape)
    if isinstance(shape, str):
        return group, ktype, None, shape
    return group, ktype, tuple(int(d) for d in shape), ""


# ---------------------------------------------------------------------------------------------
# Module scopes: modules that ARE a kernel type get an `autokernel::` profiler scope
# ---------------------------------------------------------------------------------------------

def _mlp_shape(module, x, gate, up):
    return (math.prod(x.shape[:-1]), x.shape[-1], getattr(module, gate).out_features)


# class-name suffix, attributes it must have, kernel type, shape from (module, first input)
MODULE_SCOPES = [
    ("RMSNorm", ("weight",), "rmsnorm", lambda m, x: _rows(tuple(x.shape))),
    ("SwiGLU", ("w_gate", "w_up", "w_down"), "fused_mlp",
     lambda m, x: _mlp_shape(m, x, "w_gate", "w_up")),
    ("MLP", ("gate_proj", "up_proj", "down_proj"), "fused_mlp",   # transformers' LLaMA family
     lambda m, x: _mlp_shape(m, x, "gate_proj", "up_proj")),
    ("RotaryEmbedding", ("cos", "sin"), "rotary_embedding", lambda m, x: tuple(x.shape)),
]


def _module_scope(module):
    name = type(module).__name__
    for suffix, attrs, ktype, shape_fn in MODULE_SCOPES:
        if name.endswith(suffix) and all(hasattr(module, a) for a in attrs):
            return ktype, shape_fn
    return None


def scope_name(label, ktype, shape):
    return f"{SCOPE_PREFIX}{label}::{ktype}::{'x'.join(map(str, shape))}"


def parse_scope(name):
    """'autokernel::RMSNorm::rmsnorm::8192x4096' -> ('RMSNorm', 'rmsnorm', (8192, 4096))."""
    label, ktype, shape = name[len(SCOPE_PREFIX):].split("::")
    return label, ktype, tuple(int(d) for d in shape.split("x"))


@contextmanager
def module_scopes(model):
    """Wrap the forward of every module in MODULE_SCOPES in a named profiler scope that carries
    its kernel type and shape; restore the forwards afterwards."""
    wrapped = []
    for module in model.modules():
        found = _module_scope(module)
        if found is None:
            continue
        ktype, shape_fn = found

        def forward(*args, _orig=module.forward, _m=module, _k=ktype, _f=shape_fn, **kwargs):
            try:
                x = args[0] if args else next(iter(kwargs.values()))
                name = scope_name(type(_m).__name__, _k, _f(_m, x))
            except (StopIteration, AttributeError, IndexError, TypeError):
                return _orig(*args, **kwargs)  # not called the way the table expects: no scope
            with record_function(name):
                return _orig(*args, **kwargs)

        module.forward = forward
        wrapped.append(module)
    try:
        yield len(wrapped)
    finally:
        for module in wrapped:
            del module.forward


# ---------------------------------------------------------------------------------------------
# Model loading (shared with verify.py: the same flags, the same loader)
# ---------------------------------------------------------------------------------------------

def add_model_args(parser):
    g = parser.add_argument_group("model")
    g.add_argument("--model", default=None, metavar="FILE",
                   help=f"model file (default: {DEFAULT_MODEL.relative_to(ROOT)}); a models/ "
                        "file, your own (see models/custom.py) or a KernelBench file")
    g.add_argument("--class-name", default=None, help="nn.Module class in FILE (default: Model)")
    g.add_argument("--config", default=None,
                   help="config preset from the file's CONFIGS, e.g. llama compact|7b")
    g.add_argument("--module", default=None, choices=["transformers"],
                   help="build a transformers model instead of a file (needs the hf extra)")
    g.add_argument("--hf-config", default=None, metavar="NAME_OR_PATH",
                   help="with --module transformers: a local config.json, a local model "
                        "directory, or a built-in tiny config: " + ", ".join(HF_TINY))
    g.add_argument("--input-shape", default=None, metavar="BxS",
                   help="batch x sequence for token models, e.g. 8x1024 (default: the model's "
                        f"DEFAULT_INPUT_SHAPE on a GPU, {CPU_INPUT_SHAPE[0]}x"
                        f"{CPU_INPUT_SHAPE[1]} on a CPU); KernelBench files: get_inputs() decides")
    g.add_argument("--dtype", default=None, help="fp16 | bf16 | fp32 (default: fp16 on a GPU, "
                                                 "fp32 on a CPU)")
    g.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    return parser


def parse_input_shape(text):
    try:
        dims = tuple(int(d) for d in text.lower().replace("*", "x").split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 2 or min(dims) < 1:
        raise UsageError(f"bad --input-shape {text!r}: use BATCHxSEQ, e.g. 8x1024")
    return dims


def _device_and_dtype(args):
    device = args.device or autokernel.DEVICE
    if device.split(":")[0] not in ("cuda", "cpu"):
        raise UsageError(f"unknown --device {device!r}: use cuda or cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible: use --device cpu")
    try:
        dtype = autokernel.parse_dtype(args.dtype or ("fp16" if device.startswith("cuda")
                                                      else "fp32"))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return torch.device(device), dtype


def _first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _import_file(path):
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"model file {path} not found: pass --model FILE (a .py file)")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # model files import models.layers
    try:
        return autokernel.load_module(path)
    except Exception as e:
        raise ModelError(f"could not import {path}: {_first_line(e)}") from None


def _memory_check(model_on_meta, dtype, device, what):
    """Refuse, with the numbers, to allocate a model that can't fit (7B on a small box)."""
    need = sum(p.numel() for p in model_on_meta.parameters()) * dtype.itemsize
    if device.type == "cuda":
        have = torch.cuda.mem_get_info(device)[0]
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    if need > 0.9 * have:
        raise UsageError(f"{what} needs {need / 2**30:.1f} GiB of weights in "
                         f"{autokernel.DTYPE_NAMES[dtype]} but {device.type} has "
                         f"{have / 2**30:.1f} GiB free: use a smaller --config or a GPU")


def _build(factory, dtype, device, what):
    """Construct on the meta device first (free) to check the size, then for real, directly in
    the target dtype and device (no fp32 copy of a 7B model)."""
    try:
        with torch.device("meta"):
            meta = factory()
    except Exception:
        meta = None  # a model that can't be built on meta is checked only by building it
    if meta is not None:
        _memory_check(meta, dtype, device, what)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = factory()
        return model.to(device=device, dtype=dtype).eval()
    except UsageError:
        raise
    except Exception as e:
        raise ModelError(f"building {what} raised {_first_line(e)}") from None
    finally:
        torch.set_default_dtype(previous)


def _load_file_model(args, device, dtype):
    path = Path(args.model) if args.model else DEFAULT_MODEL
    module = _import_file(path)
    name = args.class_name or "Model"
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type)
                       and issubclass(v, torch.nn.Module) and v.__module__ == module.__name__)
        raise UsageError(f"{path} has no nn.Module class {name!r}: pass --class-name, one of "
                         f"{', '.join(found) or '(none defined)'}")
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    what = f"{shown} {cls.__name__}"

    if hasattr(module, "get_init_inputs"):  # KernelBench: Model(*get_init_inputs()), get_inputs()
        if args.input_shape:
            print("profile: note: --input-shape ignored, a KernelBench file's get_inputs() "
                  "decides", file=sys.stderr)
        try:
            init_args = module.get_init_inputs()
            model = _build(lambda: cls(*init_args), dtype, device, what)
            inputs = module.get_inputs()
        except (UsageError, ModelError):
            raise
        except Exception as e:
            raise ModelError(f"{what}: get_init_inputs/get_inputs raised {_first_line(e)}") \
                from None
        inputs = tuple(t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
                       if torch.is_tensor(t) else t for t in inputs)
        return model, inputs, f"{what} (KernelBench, {_params(model)})"

    batch, seq = _input_shape(args, device, module)  # bad shapes fail before any allocation
    configs = getattr(module, "CONFIGS", None)
    if configs:
        config_name = args.config or next(iter(configs))
        if config_name not in configs:
            raise UsageError(f"unknown --config {config_name!r} for {shown}: use one of "
                             f"{', '.join(configs)}")
        config = configs[config_name]
        max_seq = getattr(config, "max_seq", None)
        if max_seq and seq > max_seq:
            raise UsageError(f"--input-shape sequence {seq} exceeds {what} "
                             f"config={config_name}'s max_seq {max_seq}")
        model = _build(lambda: cls(config), dtype, device, f"{what} config={config_name}")
        what = f"{what} config={config_name}"
    else:
        if args.config:
            raise UsageError(f"{shown} has no CONFIGS, so --config {args.config!r} means nothing")
        config = None
        model = _build(cls, dtype, device, what)

    get_inputs = getattr(module, "get_inputs", None)
    if get_inputs is None:
        raise UsageError(f"{shown} has no get_inputs(batch, seq, device): add one "
                         "(see models/custom.py)")
    try:
        kwargs = {"config": config} if config is not None and _takes(get_inputs, "config") else {}
        inputs = tuple(get_inputs(batch, seq, device=device, **kwargs))
    except Exception as e:
        raise ModelError(f"{shown} get_inputs raised {_first_line(e)}") from None
    return model, inputs, f"{what} ({_params(model)})"


def _takes(fn, name):
    import inspect
    return name in inspect.signature(fn).parameters


def _input_shape(args, device, module=None):
    if args.input_shape:
        return parse_input_shape(args.input_shape)
    if device.type == "cuda":
        return tuple(getattr(module, "DEFAULT_INPUT_SHAPE", (8, 1024)))
    return CPU_INPUT_SHAPE


def _params(model):
    n = sum(p.numel() for p in model.parameters())
    return (f"{n / 1e9:.2f}B params" if n >= 1e9 else f"{n / 1e6:.1f}M params" if n >= 1e6
            else f"{n:,} params")


# Tiny transformers configs built offline (no hub download): name -> (config class, kwargs).
HF_TINY = {
    "tiny-llama": ("LlamaConfig", dict(hidden_size=128, intermediate_size=344,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=4, vocab_size=2048,
                                       max_position_embeddings=512)),
    "tiny-gpt2": ("GPT2Config", dict(n_embd=128, n_layer=2, n_head=4, vocab_size=2048,
                                     n_positions=512)),
    "tiny-bert": ("BertConfig", dict(hidden_size=128, intermediate_size=512,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     vocab_size=2048, max_position_embeddings=512)),
}


class HFLogits(torch.nn.Module):
    """A transformers model whose forward takes token ids and returns logits (as ours do)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        kwargs = {"use_cache": False} if getattr(self.model.config, "is_decoder", True) else {}
        return self.model(input_ids=input_ids, **kwargs).logits


def _load_hf_model(args, device, dtype):
    if not args.hf_config:
        raise UsageError("--module transformers needs --hf-config NAME_OR_PATH (a local "
                         f"config.json or model directory, or one of {', '.join(HF_TINY)})")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
    try:
        import transformers
    except ImportError:
        raise UsageError("--module transformers needs the transformers package: "
                         "uv sync --extra hf") from None
    source = args.hf_config
    path = Path(source)
    pretrained = path.is_dir() and any((path / f).exists() for f in
                                       ("model.safetensors", "pytorch_model.bin",
                                        "model.safetensors.index.json"))
    try:
        if source in HF_TINY:
            cls_name, kwargs = HF_TINY[source]
            config = getattr(transformers, cls_name)(**kwargs)
        elif path.is_file():  # a bare config.json
            fields = json.loads(path.read_text())
            config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        elif path.is_dir():
            config = transformers.AutoConfig.from_pretrained(str(path))
        else:
            raise UsageError(f"--hf-config {source!r} is neither a local path nor a built-in "
                             f"tiny config ({', '.join(HF_TINY)}); hub names can't be "
                             "downloaded offline: pass a local config.json or directory")
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"could not read --hf-config {source!r}: {_first_line(e)}") from None
    config._attn_implementation = "sdpa"
    auto = (transformers.AutoModelForMaskedLM if config.model_type in ("bert", "roberta",
                                                                       "distilbert")
            else transformers.AutoModelForCausalLM)
    what = f"transformers {config.model_type} ({source})"
    if pretrained:
        try:
            model = auto.from_pretrained(str(path)).to(device=device, dtype=dtype).eval()
        except Exception as e:
            raise ModelError(f"loading {what} raised {_first_line(e)}") from None
    else:
        model = _build(lambda: auto.from_config(config), dtype, device, what)
    model = HFLogits(model).eval()
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions",
                                                                        None)
    batch, seq = _input_shape(args, device)
    if not args.input_shape and limit:
        seq = min(seq, limit)  # the default shape fits the model's positions
    if limit and seq > limit:
        raise UsageError(f"--input-shape sequence {seq} exceeds {what}'s {limit} positions")
    inputs = (torch.randint(0, config.vocab_size, (batch, seq), device=device),)
    return model, inputs, f"{what} ({_params(model)})"


def load_model(args):
    """(model in eval mode on the device and dtype, inputs tuple, description) from the shared
    flags (add_model_args). Raises UsageError for bad flags, ModelError when the model fails."""
    device, dtype = _device_and_dtype(args)
    if args.module == "transformers":
        return _load_hf_model(args, device, dtype)
    if args.hf_config:
        raise UsageError("--hf-config needs --module transformers")
    return _load_file_model(args, device, dtype)


def model_args(args):
    """The loader flags, as profile.json records them (verify.py can rebuild the model)."""
    return {k: getattr(args, k) for k in ("model", "class_name", "config", "module", "hf_config",
                                          "input_shape", "dtype", "device")}


# ---------------------------------------------------------------------------------------------
# Profiling and attribution
# ---------------------------------------------------------------------------------------------

@contextmanager
def _quiet_kineto(quiet):
    """Kineto prints start/stop lines and, without a GPU, a "gpuGetDeviceCount failed" error
    straight to fd 2; on a CPU run they are noise, so fd 2 is muted while it starts and stops."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_forward(model, inputs):
    try:
        return model(*inputs)
    except Exception as e:
        raise ModelError(f"the model's forward raised {_first_line(e)}") from None


def _anchor(evt):
    """The event a kernel's time belongs to: the innermost autokernel scope around it, else
    the outermost op (a name with '::' that is not a user annotation) it ran in."""
    outermost = None
    e = evt
    while e is not None:
        if e.name.startswith(SCOPE_PREFIX):
            return e
        if "::" in e.name and not e.is_user_annotation:
            outermost = e
        e = e.cpu_parent
    return outermost


def attribute(events, on_gpu):
    """Sum kernel time (GPU) or self CPU time (CPU) per anchor event.
    Returns ([(anchor, time_us)], Counter(kernel name -> unattributed us), total_us)."""
    per_anchor, unattributed, total = {}, Counter(), 0.0
    cpu = torch.autograd.DeviceType.CPU
    for evt in events:
        if evt.device_type != cpu or getattr(evt, "is_async", False):
            continue
        t = sum(k.duration for k in evt.kernels) if on_gpu else evt.self_cpu_time_total
        if t <= 0:
            continue
        anchor = _anchor(evt)
        if anchor is None:
            if on_gpu:  # GPU time launched outside any op; CPU self time of Python glue is not
                unattributed[evt.name] += t  # op time at all, so it is left out on a CPU
                total += t
            continue
        total += t
        slot = per_anchor.setdefault(id(anchor), [anchor, 0.0])
        slot[1] += t
    if on_gpu:
        # Device work the profiler could not link to a CPU op (a library's own launches):
        # every device event not matched by a linked kernel (GPU-side copies of our annotation
        # scopes are not work and are left out).
        linked = Counter((k.name, round(k.duration, 3)) for evt in events
                         if evt.device_type == cpu for k in evt.kernels)
        for e in events:
            if (e.device_type == cpu or getattr(e, "is_user_annotation", False)
                    or e.name.startswith(SCOPE_PREFIX)):
                continue
            key = (e.name, round(e.time_range.elapsed_us(), 3))
            if linked[key] > 0:
                linked[key] -= 1
            elif key[1] > 0:
                unattributed[e.name] += key[1]
                total += key[1]
    return list(per_anchor.values()), unattributed, total


def classify_anchor(anchor):
    """(name, group, kernel_type, shape or None, note) for an anchor event."""
    if anchor.name.startswith(SCOPE_PREFIX):
        label, ktype, shape = parse_scope(anchor.name)
        return label, ktype, ktype, shape, ""
    group, ktype, shape, note = classify_op(anchor.name, anchor.input_shapes or [],
                                            getattr(anchor, "concrete_inputs", None) or [])
    return anchor.name, group, ktype, shape, note


def load_ceilings(device, dtype):
    """Roofline ceilings: prepare.py's measurements on this GPU when present, else the datasheet."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    try:
        prep = json.loads(autokernel.PREPARE_JSON.read_text())
        c = prep["ceilings"]
        tflops = c["tflops"]
        if isinstance(tflops, dict):  # measured per dtype
            tflops = tflops.get(autokernel.DTYPE_NAMES[dtype]) or tflops.get("fp16")
        if prep.get("key", "").startswith(name) and tflops and c.get("bandwidth_gb_s"):
            return {"tflops": float(tflops), "bandwidth_gb_s": float(c["bandwidth_gb_s"]),
                    "source": f"measured by prepare.py ({autokernel.PREPARE_JSON.name})"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    props = torch.cuda.get_device_properties(device)
    spec = autokernel.gpu_spec(props.name, props.multi_processor_count,
                               getattr(props, "clock_rate", 0) / 1e3,
                               (props.major, props.minor))
    if not spec.bandwidth_gb_s:
        return None
    return {"tflops": spec.fp16_tflops, "bandwidth_gb_s": spec.bandwidth_gb_s,
            "source": f"datasheet ({spec.name}; run prepare.py to measure)"}


def _roofline(ktype_name, shape_detail, dtype, time_us, ceilings):
    """(bound, pct_of_roofline) from the summed FLOPs and bytes of an op's calls."""
    if ceilings is None:
        return "n/a", None
    ktype = KERNEL_TYPES[ktype_name]
    flops = sum(ktype.flops(d["shape"]) * d["calls"] for d in shape_detail)
    nbytes = sum(ktype.bytes(d["shape"], dtype) * d["calls"] for d in shape_detail)
    ridge = ceilings["tflops"] * 1e12 / (ceilings["bandwidth_gb_s"] * 1e9)  # FLOP per byte
    bound = "compute" if nbytes and flops / nbytes >= ridge else "memory"
    floor_us = sum(autokernel.roofline(ktype, d["shape"], dtype, d["time_us"] / d["calls"],
                                       ceilings)["floor_us"] * d["calls"] for d in shape_detail)
    return bound, (100.0 * floor_us / time_us if time_us > 0 else None)


def build_entries(anchors, iters, total_us, dtype, ceilings):
    """Aggregate anchors into ranked entries (one per name, group and kernel type)."""
    rows = defaultdict(lambda: {"time": 0.0, "calls": 0, "shapes": defaultdict(lambda: [0.0, 0]),
                                "notes": set()})
    for anchor, t in anchors:
        name, group, ktype, shape, note = classify_anchor(anchor)
        row = rows[(name, group, ktype)]
        row["time"] += t
        row["calls"] += 1
        if shape is not None:
            row["shapes"][shape][0] += t
            row["shapes"][shape][1] += 1
        elif note:
            row["notes"].add(note)
    entries = []
    for (name, group, ktype), row in rows.items():
        time_us = row["time"] / iters
        share = row["time"] / total_us if total_us else 0.0
        detail = sorted(({"shape": list(s), "time_us": t / iters, "calls": c / iters}
                         for s, (t, c) in row["shapes"].items()), key=lambda d: -d["time_us"])
        if ktype and detail:  # the roofline of the calls whose shape is known
            bound, pct = _roofline(ktype, detail, dtype, sum(d["time_us"] for d in detail),
                                   ceilings)
        else:
            bound = ("n/a" if ceilings is None else
                     KERNEL_TYPES[ktype].bound if ktype else GROUP_BOUND.get(group, "unknown"))
            pct = None
        entries.append({
            "name": name, "group": group, "kernel_type": ktype, "time_us": time_us,
            "share": share, "calls": row["calls"] / iters,
            "shapes": [d["shape"] for d in detail], "shape_detail": detail,
            "bound": bound, "pct_of_roofline": pct,
            "amdahl_ceiling": 1.0 / (1.0 - share) if share < 1.0 else None,
            "note": "; ".join(sorted(row["notes"])) + (" (calls without a shape are left out)"
                                                        if row["notes"] and detail else ""),
        })
    entries.sort(key=lambda e: -e["time_us"])
    return entries


def profile_model(model, inputs, device, dtype, warmup, iters):
    """Time the forward without the profiler, then profile it. Returns the result dict
    (profile.json's fields other than model/model_args)."""
    on_gpu = device.type == "cuda"
    with torch.inference_mode():
        for _ in range(warmup):
            run_forward(model, inputs)
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            run_forward(model, inputs)
        _sync(device)
        wall_us = (time.perf_counter() - start) * 1e6 / iters

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        prof = torch.profiler.profile(activities=activities, record_shapes=True)
        with module_scopes(model):
            with _quiet_kineto(not on_gpu):
                prof.start()
            try:
                for _ in range(iters):
                    run_forward(model, inputs)
                _sync(device)
            finally:
                with _quiet_kineto(not on_gpu):
                    prof.stop()
    anchors, unattributed, total = attribute(prof.events(), on_gpu)
    ceilings = load_ceilings(device, dtype)
    entries = build_entries(anchors, iters, total, dtype, ceilings)
    lost = sum(unattributed.values())
    if lost > 0:
        names = ", ".join(f"{n[:40]} {_us(t / iters)}" for n, t in unattributed.most_common(3))
        entries.append({"name": "(kernels outside any op)", "group": OTHER, "kernel_type": None,
                        "time_us": lost / iters, "share": lost / total, "calls": 0,
                        "shapes": [], "shape_detail": [], "bound": "unknown",
                        "pct_of_roofline": None,
                        "amdahl_ceiling": 1 / (1 - lost / total) if lost < total else None,
                        "note": f"GPU time not linked to a CPU op; largest: {names}"})
        entries.sort(key=lambda e: -e["time_us"])
    total_op_us = total / iters
    groups = defaultdict(float)
    for e in entries:
        groups[e["group"]] += e["time_us"]
    busy = 100.0 * min(total_op_us / wall_us, 1.0) if on_gpu and wall_us > 0 else None
    return {
        "input_shapes": [list(t.shape) for t in inputs if torch.is_tensor(t)],
        "dtype": autokernel.DTYPE_NAMES[dtype],
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "time_source": "gpu kernel time" if on_gpu else "cpu op time",
        "warmup": warmup, "iters": iters,
        "wall_us": wall_us, "total_op_us": total_op_us,
        "gpu_busy_pct": busy, "launch_bound": (busy < LAUNCH_BOUND_PCT) if on_gpu else None,
        "named_pct": 100.0 * (1 - groups.get(OTHER, 0.0) / total_op_us) if total_op_us else 0.0,
        "ceilings": ceilings,
        "groups": [{"group": g, "time_us": t, "share": t / total_op_us if total_op_us else 0.0}
                   for g, t in sorted(groups.items(), key=lambda kv: -kv[1])],
        "entries": entries,
    }


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def _us(t):
    return f"{t / 1000:.2f} ms" if t >= 1000 else f"{t:.1f} us"


def print_report(result, top):
    r = result
    unit = "GPU" if r["device"] == "cuda" else "CPU op"
    shapes = ", ".join("x".join(map(str, s)) for s in r["input_shapes"])
    print(f"model:        {r['model']}")
    print(f"input:        {shapes}  {r['dtype']}  on {r['device_name']}")
    print(f"wall time:    {_us(r['wall_us'])} per forward ({r['iters']} iters after "
          f"{r['warmup']} warmup)")
    print(f"{unit + ' time:':<14}{_us(r['total_op_us'])} per forward")
    if r["gpu_busy_pct"] is None:
        print("gpu busy:     n/a (CPU run: the times below are CPU op times, they rank "
              "nothing a GPU would do)")
    else:
        print(f"gpu busy:     {r['gpu_busy_pct']:.1f}% of wall time")
    print(f"named groups: {r['named_pct']:.1f}% of {unit} time "
          f"(other: {100 - r['named_pct']:.1f}%)")
    if r["ceilings"]:
        c = r["ceilings"]
        print(f"roofline:     {c['tflops']:.0f} TFLOP/s, {c['bandwidth_gb_s']:.0f} GB/s, "
              f"{c['source']}")
    print()
    header = (f"{'#':>3}  {'op':<34} {'group':<15} {'type':<17} {'time':>10} {'share':>6} "
              f"{'calls':>6} {'bound':<8} {'roofline':>8} {'amdahl':>7}  top shape")
    print(header)
    print("-" * len(header))
    for i, e in enumerate(r["entries"][:top], 1):
        roof = f"{e['pct_of_roofline']:.0f}%" if e["pct_of_roofline"] is not None else "-"
        amdahl = f"{e['amdahl_ceiling']:.2f}x" if e["amdahl_ceiling"] else "inf"
        shape = "x".join(map(str, e["shapes"][0])) if e["shapes"] else (
            "(none: " + e["note"][:70] + ")" if e["note"] else "-")
        more = f" (+{len(e['shapes']) - 1})" if len(e["shapes"]) > 1 else ""
        print(f"{i:>3}  {e['name'][:34]:<34} {e['group']:<15} {e['kernel_type'] or '-':<17} "
              f"{_us(e['time_us']):>10} {100 * e['share']:>5.1f}% {e['calls']:>6g} "
              f"{e['bound']:<8} {roof:>8} {amdahl:>7}  {shape}{more}")
    if len(r["entries"]) > top:
        rest = r["entries"][top:]
        print(f"     ... {len(rest)} more ops, {100 * sum(e['share'] for e in rest):.1f}% "
              f"of {unit} time (--top to show them)")
    print()
    print("by group: " + ", ".join(f"{g['group']} {100 * g['share']:.1f}%" for g in r["groups"]))
    if r["launch_bound"]:
        print(f"launch-bound: the GPU is busy only {r['gpu_busy_pct']:.0f}% of the time; faster "
              "kernels can't fix the idle gaps. Use a larger batch or sequence, CUDA graphs, or "
              "torch.compile (mode='reduce-overhead') before optimizing kernels; the Amdahl "
              "ceilings above assume a busy GPU.")
    elif r["gpu_busy_pct"] is not None and r["gpu_busy_pct"] < PARTLY_IDLE_PCT:  # GPU only
        print(f"partly launch-bound: the GPU idles {100 - r['gpu_busy_pct']:.0f}% of the wall "
              "time; faster kernels shrink only the busy part (CUDA graphs or a larger batch "
              "shrink the rest).")


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed forwards first (default: 3 on a GPU, 1 on a CPU)")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed and profiled forwards (default: 10 on a GPU, 2 on a CPU)")
    parser.add_argument("--top", type=int, default=20, help="rows of the printed table")
    parser.add_argument("--output", default=str(autokernel.PROFILE_JSON),
                        help="where to write the JSON (default: workspace/profile.json)")
    args = parser.parse_args(argv)
    try:
        if (args.warmup is not None and args.warmup < 0) or (args.iters is not None
                                                             and args.iters < 1):
            raise UsageError("--warmup must be >= 0 and --iters >= 1")
        model, inputs, description = load_model(args)
        device = next((t.device for t in inputs if torch.is_tensor(t)), None) or \
            _device_and_dtype(args)[0]
        dtype = _device_and_dtype(args)[1]
        on_gpu = device.type == "cuda"
        warmup = args.warmup if args.warmup is not None else (3 if on_gpu else 1)
        iters = args.iters if args.iters is not None else (10 if on_gpu else 2)
        print(f"profiling {description} ...", flush=True)
        result = {"model": description, "model_args": model_args(args)}
        result.update(profile_model(model, inputs, device, dtype, warmup, iters))
    except UsageError as e:
        print(f"profile.py: error: {e}", file=sys.stderr)
        return 2
    except ModelError as e:
        print(f"profile.py: error: {e}", file=sys.stderr)
        return 1
    except torch.cuda.OutOfMemoryError:
        print("profile.py: error: CUDA out of memory: use a smaller --input-shape or --config",
              file=sys.stderr)
        return 1
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1))
    print_report(result, args.top)
    print(f"\nwrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
