"""
Which kernel type a profiled op or module is. profile.py attributes the GPU time of a forward to
events and asks this module what each one is:
  * an aten op (the outermost one that launched the work: aten::linear, not the aten::addmm
    inside it) is looked up in OP_TABLE, which gives its group (one of the kernel types or
    a named group: elementwise, copy/cast, embedding, ...), its kernel type, and a function that
    reads the type's shape from the profiler's recorded input shapes;
  * a computation that IS a kernel type runs inside an `autokernel::<label>::<type>::<shape>`
    profiler scope while profiling, and everything it launches belongs to that scope: each match
    autokernel/patterns.py finds in the captured graph, or, when capture fails, each module of a
    class in MODULE_SCOPES (RMSNorm, SwiGLU, RotaryEmbedding: module_scopes).
"""
import json
import math
from contextlib import contextmanager

from torch.profiler import record_function

SCOPE_PREFIX = "autokernel::"
OTHER = "other"
REGION = "region"  # a piece of the model outside the kernel types (autokernel/regions.py)


# ---------------------------------------------------------------------------------------------
# aten ops: one table from op name to (group, kernel type, shape function)
# ---------------------------------------------------------------------------------------------
# Shape functions get (input_shapes, concrete_inputs) as the profiler records them and return
# the kernel type's shape tuple, or (shape, variant) where the op is one of the type's variants
# (autokernel.kernel_types: grouped-query or bidirectional attention, a bias, a sum over another
# dim), or a string saying why there is none.

def _rows(shape):
    """(M, N) of a tensor reduced/normalized over its last dim."""
    return (math.prod(shape[:-1]), shape[-1])


def is_last_dim(dim, ndim):
    """Whether a dim argument (an int, or a one-element list or tuple) names the last of ndim
    dims: softmax is over the last dim only."""
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, ndim - 1)


def one_dim(dim, ndim):
    """The dim argument (an int, or a one-element list or tuple) as one index in 0..ndim-1, or
    None when it names no single dim (None, several dims, out of range)."""
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        return None
    return dim % ndim


def _concrete(concrete, i):
    return concrete[i] if concrete and len(concrete) > i else None


def _linear_shape(shapes, concrete):
    x, w = shapes[0], shapes[1]
    if len(w) != 2:
        return f"linear weight of rank {len(w)}"
    bias = len(shapes) > 2 and bool(shapes[2])
    return (math.prod(x[:-1]), w[0], w[1]), ({"bias": True} if bias else {})


def _matmul_shape(shapes, concrete):
    a, b = shapes[0], shapes[1]
    if len(b) == 2 and len(a) >= 1:
        return (math.prod(a[:-1]) if len(a) > 1 else 1, b[1], b[0])
    return f"batched matmul {a} @ {b} has no 2-D (M,N,K) shape"


def _addmm_shape(shapes, concrete):
    a, b = shapes[1], shapes[2]
    return (a[0], b[1], a[1]), ({"bias": True} if len(shapes[0]) == 1 else {})


def _softmax_shape(shapes, concrete):
    x, dim = shapes[0], _concrete(concrete, 1)
    if dim is None:
        return "softmax dim not recorded by this torch's profiler"
    return _rows(x) if is_last_dim(dim, len(x)) else f"softmax over dim {dim}, not the last"


def _norm_shape(shapes, concrete):
    """(M, N) of a norm over the trailing dims its normalized_shape names (one or several)."""
    x, normalized = shapes[0], _concrete(concrete, 1)
    k = len(normalized) if isinstance(normalized, (list, tuple)) and normalized else 1
    if not x or k > len(x):
        return "norm of a scalar"
    return (math.prod(x[:-k]), math.prod(x[-k:]))


def _sum_shape(shapes, concrete):
    x, dims = shapes[0], _concrete(concrete, 1)
    if not x:
        return "sum of a scalar"
    if dims is None:
        return "sum dims not recorded by this torch's profiler"
    d = one_dim(dims, len(x))
    if d is None:
        return f"sum over dims {dims}, not over one dim"
    return reduce_shape(x, d)


def reduce_shape(shape, dim):
    """A sum over dim of x as the reduce type sees it, x viewed as [outer, R, inner]: the shape
    (outer, R), and the variant that adds the inner dims (none for the last dim)."""
    inner = math.prod(shape[dim + 1:])
    return (math.prod(shape[:dim]), shape[dim]), ({"dim": 1, "inner": inner} if inner > 1 else {})


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
    if len(q) != 4 or len(k) != 4 or k != v or q[0] != k[0] or q[2:] != k[2:] \
            or q[1] % k[1]:
        return f"q/k/v shapes differ ({q}, {k}, {v}): cross attention"
    # Causal or not, grouped-query heads and any scale are the contract's; the variant keeps
    # what changes the work (the scale does not).
    variant = {"causal": False} if _concrete(concrete, 5) is False else {}
    if q[1] != k[1]:
        variant["kv_groups"] = q[1] // k[1]
    return tuple(q), variant


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
    ("layernorm", "layernorm", _norm_shape, "layer_norm native_layer_norm"),
    ("rmsnorm", "rmsnorm", _norm_shape, "rms_norm _fused_rms_norm"),
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


DECODE_MAX_QUERIES = 16  # a decode step's (or a speculative step's) queries; more is a prefill


def _decode_shape(shapes):
    """(B, H, Hkv, Sq, L, D) of an SDPA call that is a generation step's (a few queries over a
    longer cache under a mask: decode_attention), else None."""
    q, k = shapes[0], shapes[1]
    mask = shapes[3] if len(shapes) > 3 else None
    if len(q) == 4 and len(k) == 4 and mask and q[2] < k[2] and q[2] <= DECODE_MAX_QUERIES \
            and q[0] == k[0] and q[3] == k[3] and q[1] % k[1] == 0:
        if q[1] == k[1] and q[2] > 1 and len(mask) == 4 and mask[2] == 1:
            # transformers' grouped-query decode: a KV head's G query heads folded into the
            # query dim, all under one mask row; they are G heads of one query each
            return (q[0], q[1] * q[2], k[1], 1, k[2], q[3])
        return (q[0], q[1], k[1], q[2], k[2], q[3])
    return None


def classify_op(name, shapes, concrete):
    """(group, kernel_type, shape or None, note, variant) for an outermost op."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    group, ktype, shape_fn = OP_TABLE.get(name) or OP_TABLE.get(base) or (OTHER, None, None)
    if ktype is None:
        return group, None, None, "", {}
    if ktype == "flash_attention" and _decode_shape(shapes):
        return "decode_attention", "decode_attention", _decode_shape(shapes), "", {}
    try:
        shape = shape_fn(shapes, concrete)
    except (IndexError, TypeError, ValueError) as e:
        shape = f"could not read {name}'s input shapes ({e})"
    if isinstance(shape, str):
        return group, ktype, None, shape, {}
    shape, variant = shape if shape and isinstance(shape[-1], dict) else (shape, {})
    return group, ktype, tuple(int(d) for d in shape), "", variant


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


def scope_name(label, ktype, shape, variant=None, note=""):
    """The scope of one call of a kernel type: its shape, or when no kernel of the type can take
    it the note saying why, then the contract variant (JSON) when it is not the default."""
    name = f"{SCOPE_PREFIX}{label}::{ktype}::"
    name += "x".join(map(str, shape)) if shape else note.replace("::", ":")
    return name + (f"::{json.dumps(variant, sort_keys=True)}" if variant else "")


def parse_scope(name):
    """'autokernel::RMSNorm::rmsnorm::8192x4096' -> ('RMSNorm', 'rmsnorm', (8192, 4096), '', {});
    a note in place of the shape comes back as (label, ktype, None, note, variant)."""
    label, ktype, shape, *variant = name[len(SCOPE_PREFIX):].split("::", 3)
    variant = json.loads(variant[0]) if variant else {}
    if all(d.isdigit() for d in shape.split("x")):
        return label, ktype, tuple(int(d) for d in shape.split("x")), "", variant
    return label, ktype, None, shape, variant


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


def classify_event(event):
    """(name, group, kernel_type, shape or None, note, variant) for a profiler event that time is
    attributed to: an autokernel scope (named by its module's class) or an aten op."""
    if event.name.startswith(SCOPE_PREFIX):
        label, ktype, shape, note, variant = parse_scope(event.name)
        if ktype == REGION:  # its id in the note's place: one entry per distinct region
            return f"{label}:{note}", REGION, None, None, "", {}
        return label, ktype, ktype, shape, note, variant
    group, ktype, shape, note, variant = classify_op(
        event.name, event.input_shapes or [], getattr(event, "concrete_inputs", None) or [])
    return event.name, group, ktype, shape, note, variant
