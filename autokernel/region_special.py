"""
The layouts a region starter's kernels are written for (autokernel/region_starter.py), and the
kernels written whole rather than as a run of elementwise lines: a norm's (GroupNorm,
InstanceNorm: statistics over a group of channels, then the fused calls), a pooling window, a
cat, a constant pad, a reduction (one program a row of the kept dims), and the copy of an input
into the traced layout.

Every kernel's index math has the traced shapes and strides as constants (ShapeProp's, on the
reference). A region with a 2-d convolution is traced in channels_last (NHWC: where cuDNN's
convolutions are fast, the layout torch.compile picks for them), so its activations are NHWC
throughout: each kernel walks its output in memory order (the dims sorted by stride, outermost
first), so consecutive lanes touch consecutive addresses in every layout, and allocates its
outputs with the traced strides. Launchers check that their inputs have the strides the index
math assumes (a size-1 dim's stride is never read, so it is not checked).
"""
import math

import torch
from torch.fx import Node

from autokernel.fx_vocabulary import arg, op


class StarterError(Exception):
    """The region has a call no generated code covers yet (one line: which)."""


def meta(n):
    tm = n.meta.get("tensor_meta") if isinstance(n, Node) else None
    return (tuple(tm.shape), tuple(tm.stride)) if tm is not None else None


# ---- layouts ------------------------------------------------------------------------------------

def contiguous(shape):
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


def memory_order(shape, strides):
    """The dims of a tensor from the outermost in memory to the innermost (ties, size-1 dims
    among them, in their logical order): the identity for a contiguous tensor, (0, 2, 3, 1) for
    a channels_last one."""
    return tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))


def permuted(values, order):
    return [values[d] for d in order]


def same_layout(shape, a, b):
    """Two strides of one shape that address it alike (a size-1 dim's stride is never used)."""
    return all(x == y for size, x, y in zip(shape, a, b) if size != 1)


def dense(shape, strides):
    """Whether strides lay shape out with no gaps and no overlaps (a fresh tensor's)."""
    order = memory_order(shape, strides)
    return same_layout(permuted(shape, order), permuted(strides, order),
                       contiguous(permuted(shape, order)))


def allocation(shape, strides, dtype):
    """The launcher's line for an output of this shape, in the traced strides (contiguous where
    they leave gaps: never the case for a value computed afresh)."""
    shape = tuple(shape)
    if strides is None or not dense(shape, strides) or tuple(strides) == contiguous(shape):
        return f"torch.empty({shape!r}, device=x0.device, dtype={dtype})"
    return f"torch.empty_strided({shape!r}, {tuple(strides)!r}, device=x0.device, dtype={dtype})"


def index_expr(shape, strides, var="offs"):
    """The element of an operand (its strides, broadcast to `shape`) for the flat position
    `var` in `shape`: `var` where it is laid out as `shape` is, else the terms of its own
    strides, with the sizes as constants (a block of offsets even for a value every element
    shares: a scalar pointer with a block mask is not a load Triton takes)."""
    dims = [(s, st) for s, st in zip(shape, strides) if s != 1]
    merged = []
    for size, stride in dims:  # neighbouring dims that are one run of memory become one
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    total, inner, terms = math.prod(shape), math.prod(s for s, _ in merged), []
    for size, stride in merged:
        inner //= size
        if stride == 0:
            continue
        term = var if inner == 1 else f"({var} // {inner})"
        if size * inner < total:
            term = f"({term} % {size})"
        terms.append(term if stride == 1 else f"{term} * {stride}")
    return " + ".join(terms) or f"{var} * 0"  # (one element for every lane: still a block)


def coordinates(shape, order):
    """Each dim's index, as a Triton expression of `offs`, the flat position in memory order."""
    total, inner, coords = math.prod(shape), 1, {}
    for d in reversed(order):
        term = "offs" if inner == 1 else f"(offs // {inner})"
        coords[d] = "tl.zeros_like(offs)" if shape[d] == 1 else \
            term if inner * shape[d] == total else f"({term} % {shape[d]})"
        inner *= shape[d]
    return [coords[d] for d in range(len(shape))]


def layout_check(launcher, inputs):
    """A launcher's first lines: its inputs' strides as the kernel's index math assumes them."""
    args = ", ".join(f"x{i}" for i in range(len(inputs)))
    layouts = [tuple(None if size == 1 else st for size, st in zip(*meta(a))) for a in inputs]
    differs = "x.stride() != layout" if all(None not in lay for lay in layouts) else \
        "any(s != t for s, t in zip(x.stride(), layout) if t is not None)"
    return [f"    for x, layout in zip(({args},), {layouts!r}):",
            f"        if {differs}:  # the kernel's index math assumes these strides",
            f"            raise ValueError(f'{launcher}: an input has strides {{x.stride()}}, "
            "the kernel was written for {layout}')"]


# ---- norms: a GroupNorm (an InstanceNorm) heads a fused kernel of its own -------------------

def norm_head(n):
    """A GroupNorm, or an InstanceNorm of its input's statistics (a GroupNorm of one channel a
    group): statistics over a group of channels, so one program a group."""
    return op(n) == "group_norm" or op(n) == "instance_norm" and \
        arg(n, 5, "use_input_stats", True)


def norm_groups(n):
    """(groups per sample, eps) of a norm head."""
    if op(n) == "group_norm":
        return arg(n, 1, "num_groups"), arg(n, 4, "eps", 1e-5)
    return meta(n)[0][1], arg(n, 7, "eps", 1e-5)


def normed_kernel(kname, params, norm, names, shape, order, ops, loads, body, stores):
    """A norm's fused kernel: one program a (sample, group), whose channels are one contiguous
    run of memory in (N, C, ...) (in channels_last: a run of them a pixel, a strided walk for
    an InstanceNorm's single channel). Its mean and variance first, with the calls of the group
    that make the norm's input computed on the way (that input never goes through memory: it
    stays fp32, and no kernel writes and reads it back); sums of the values less the group's
    first one, so an offset of the data costs no precision. Then the normalization and every
    call of the group, a block at a time (loads, body: each input's and call's line; stores)."""
    x = arg(norm, 0, "input")
    x_strides = meta(x)[1]
    rank, walked = len(shape), permuted(shape, order)
    if rank < 2 or not same_layout(walked, permuted(x_strides, order), contiguous(walked)) \
            or order not in (tuple(range(rank)), (0, *range(2, rank), 1)):
        raise StarterError(f"{op(norm)} of a {rank}-d input laid out as {x_strides}")
    groups, eps = norm_groups(norm)
    size, width = math.prod(shape) // (shape[0] * groups), shape[1] // groups
    big = math.prod(shape) >= 2 ** 31
    pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
    if order[1] == 1:  # (N, C, ...): the group is one run of memory
        base, offs = f"{pid} * {size}", "base + start + lanes"
    else:  # channels_last: the group's channels are a run of each pixel's C
        base = f"({pid} // {groups}) * {math.prod(shape[1:])} + ({pid} % {groups}) * {width}"
        offs = f"base + ((start + lanes) // {width}) * {shape[1]} + (start + lanes) % " \
            f"{width}" if width > 1 else f"base + (start + lanes) * {shape[1]}"
    prologue, todo = [], [x]  # the group's calls the norm's input is made of, and their loads
    while todo:
        m = todo.pop()
        if m not in prologue:
            prologue.append(m)
            todo += m.all_input_nodes if m in body else []
    first = [line for m, line in {**loads, **body}.items() if m in prologue]
    return "\n".join([
        "@triton.jit",
        f"def {kname}({', '.join(params)}, BLOCK: tl.constexpr):",
        f'    """{ops} over {tuple(shape)}: one program a group of {width} '
        f'channels ({size} values): statistics, then one pass."""',
        f"    base = {base}",
        "    lanes = tl.arange(0, BLOCK)",
        "    offs = base + lanes * 0  # the group's first value, in every lane",
        "    mask = lanes >= 0", *first,
        f"    shift = tl.sum(tl.where(lanes == 0, {names[x]}, 0.0), axis=0)",
        "    s1 = tl.zeros([BLOCK], tl.float32)",
        "    s2 = tl.zeros([BLOCK], tl.float32)",
        f"    for start in range(0, {size}, BLOCK):",
        f"        mask = start + lanes < {size}",
        f"        offs = {offs}", *("    " + line for line in first),
        f"        d = tl.where(mask, {names[x]} - shift, 0.0)",
        "        s1 += d",
        "        s2 += d * d",
        f"    mean_d = tl.sum(s1, axis=0) / {size}",
        f"    rstd = tl.rsqrt(tl.sum(s2, axis=0) / {size} - mean_d * mean_d + {eps})",
        "    mean = shift + mean_d",
        f"    for start in range(0, {size}, BLOCK):",
        f"        mask = start + lanes < {size}",
        f"        offs = {offs}",
        *("    " + line for line in [*loads.values(), *body.values(), *stores]), ""])


# The copy of a 4-d input (or parameter) into the layout the region was traced in: its
# kernels' index math has the traced strides as constants, and a block's output may come in
# the other layout (a channels_last region's output into a region traced NCHW, or the reverse),
# so the forward starts with one call each (a no-op where the layout is already the traced one).
RELAYOUT = '''@triton.jit
def _relayout(x, out, C, H, W, s0, s1, s2, s3, t0, t1, t2, t3, BLOCK_C: tl.constexpr,
              BLOCK_P: tl.constexpr):
    """x (N, C, H, W) in strides s into out in strides t: a tile of channels x pixels a
    program (read along one, written along the other: NCHW <-> NHWC either way)."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)[None, :]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]
    n = tl.program_id(2).to(tl.int64)
    mask = (c < C) & (p < H * W)
    v = tl.load(x + n * s0 + c * s1 + (p // W) * s2 + (p % W) * s3, mask=mask)
    tl.store(out + n * t0 + c * t1 + (p // W) * t2 + (p % W) * t3, v, mask=mask)


def _relayout_to(x, layout):
    """x itself where it has these strides (size-1 dims' strides are never read), else its
    copy in them."""
    N, C, H, W = x.shape
    if all(s == t for s, t, size in zip(x.stride(), layout, x.shape) if size != 1):
        return x
    out = torch.empty_strided(x.shape, layout, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(H * W, 64), triton.cdiv(C, 32), N)
    _relayout[grid](x, out, C, H, W, *x.stride(), *layout, BLOCK_C=32, BLOCK_P=64, num_warps=4)
    return out
'''
TO_LAYOUT = {True: '''def to_channels_last(x):
    """x in channels_last, the layout this region's kernels were written for (x itself when it
    comes so: one block's output handed to the next)."""
    N, C, H, W = x.shape
    return _relayout_to(x, (H * W * C, 1, W * C, C))
''', False: '''def to_contiguous(x):
    """x in NCHW, the layout this region's kernels were written for (x itself when it comes
    so; a copy where a channels_last block hands its output on)."""
    N, C, H, W = x.shape
    return _relayout_to(x, (C * H * W, H * W, W, 1))
'''}
# ModelNew.__init__'s last line in such a region: its 4-d weights in channels_last once (the
# judge builds ModelNew, then moves it to the device and dtype: .to keeps the layout; verify.py
# hands each instance's own tensors in, copied once into the layouts ModelNew holds).
NHWC_INIT = "self.to(memory_format=torch.channels_last)  # the convolutions' weights, as traced"


# ---- calls with a kernel of their own: pooling windows, concatenation ------------------------

def _pair(value, name):
    value = tuple(value) if isinstance(value, (list, tuple)) else (value, value)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise StarterError(f"{name} {value!r} (not two ints)")
    return value


def pool_code(index, n):
    """max_pool2d / avg_pool2d (and adaptive_avg_pool2d, adaptive_avg_pool1d where the windows
    are equal) over an (N, C, H, W) in any strides: one program per BLOCK outputs (in the
    output's memory order), the window unrolled. A 1-d pool's (N, C, L) is (N, C, 1, L)."""
    name = op(n)
    x = arg(n, 0, "input")
    (x_shape, x_strides), (out_shape, out_strides) = meta(x), meta(n)
    allocated = allocation(out_shape, out_strides, "x0.dtype")
    if name == "adaptive_avg_pool1d" and len(x_shape) == 3:  # H = 1, any stride
        x_shape, x_strides = (*x_shape[:2], 1, x_shape[2]), (*x_strides[:2], 0, x_strides[2])
        out_shape, out_strides = (*out_shape[:2], 1, out_shape[2]), \
            (*out_strides[:2], 0, out_strides[2])
        name = "adaptive_avg_pool2d"
    if len(x_shape) != 4:
        raise StarterError(f"{name} of a {len(x_shape)}-d input")
    (N, C, H, W), (OH, OW) = x_shape, out_shape[-2:]
    if name == "adaptive_avg_pool2d":
        if H % OH or W % OW:
            raise StarterError(f"adaptive_avg_pool2d from {H}x{W} to {OH}x{OW} (unequal windows)")
        (KH, KW), (SH, SW), (PH, PW), (DH, DW), include_pad, divisor = \
            (H // OH, W // OW), (H // OH, W // OW), (0, 0), (1, 1), True, None
        name = "avg_pool2d"
    else:
        KH, KW = _pair(arg(n, 1, "kernel_size"), "kernel_size")
        SH, SW = _pair(arg(n, 2, "stride") or (KH, KW), "stride")
        PH, PW = _pair(arg(n, 3, "padding", 0), "padding")
        if name == "max_pool2d":
            DH, DW = _pair(arg(n, 4, "dilation", 1), "dilation")
            if arg(n, 6, "return_indices", False):
                raise StarterError("max_pool2d with return_indices")
            include_pad, divisor = True, None
        else:
            DH = DW = 1
            if arg(n, 4, "ceil_mode", False):
                raise StarterError("avg_pool2d with ceil_mode")
            include_pad, divisor = arg(n, 5, "count_include_pad", True), \
                arg(n, 6, "divisor_override")
    is_max = name == "max_pool2d"
    start = 'float("-inf")' if is_max else "0.0"  # the identity of the window's reduction
    total = N * C * OH * OW
    if not dense(out_shape, out_strides):
        out_strides = contiguous(out_shape)
    order = memory_order(out_shape, out_strides)
    if tuple(x_strides) == contiguous(x_shape) and order == (0, 1, 2, 3):
        where = [f"    ow = offs % {OW}", f"    oh = (offs // {OW}) % {OH}",
                 f"    plane = offs // {OH * OW}  # n * C + c"]
        address = f"plane * {H * W} + ih * {W} + iw"
    else:  # channels_last (or any strides): the output's coordinates, the input's strides
        where = [f"    {v} = {e}" for v, e in zip(("n", "c", "oh", "ow"),
                                                 coordinates(out_shape, order))]
        address = " + ".join(v if s == 1 else f"{v} * {s}"
                             for v, s in zip(("n", "c", "ih", "iw"), x_strides))
    lines = ["@triton.jit", f"def _pool_{index}(x, out, BLOCK: tl.constexpr):",
             f'    """{op(n)} of ({N}, {C}, {H}, {W}) -> ({N}, {C}, {OH}, {OW}): window '
             f'{KH}x{KW}, stride {SH}x{SW}, padding {PH}x{PW}."""',
             "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             f"    mask = offs < {total}", *where,
             f"    acc = tl.full([BLOCK], {start}, tl.float32)"]
    if not is_max and not include_pad:
        lines.append("    count = tl.zeros([BLOCK], tl.float32)")
    lines += [f"    for kh in tl.static_range({KH}):",
              f"        ih = oh * {SH} - {PH} + kh * {DH}",
              f"        for kw in tl.static_range({KW}):",
              f"            iw = ow * {SW} - {PW} + kw * {DW}",
              f"            ok = mask & (ih >= 0) & (ih < {H}) & (iw >= 0) & (iw < {W})",
              f"            v = tl.load(x + {address}, mask=ok, other={start})"]
    if is_max:
        lines.append("            acc = tl.maximum(acc, v.to(tl.float32))")
    else:
        lines.append("            acc += v.to(tl.float32)")
        if not include_pad:
            lines.append("            count += ok.to(tl.float32)")
    if not is_max:
        if divisor:
            lines.append(f"    acc = acc / {divisor}")
        elif include_pad:  # the window's cells inside the padded input (PyTorch's divisor)
            lines += [f"    hs = oh * {SH} - {PH}", f"    ws = ow * {SW} - {PW}",
                      f"    he = tl.minimum(hs + {KH}, {H + PH})",
                      f"    we = tl.minimum(ws + {KW}, {W + PW})",
                      "    acc = acc / ((he - hs) * (we - ws)).to(tl.float32)"]
        else:
            lines.append("    acc = acc / tl.maximum(count, 1.0)  # masked lanes: no 0 / 0")
    lines += ["    tl.store(out + offs, acc, mask=mask)", ""]
    launcher = [f"def kernel_{index}(x0):", f'    """{op(n)}: one Triton kernel."""',
                *layout_check(f"kernel_{index}", [x]),
                f"    out = {allocated}",
                f"    _pool_{index}[(triton.cdiv({total}, BLOCK),)](x0, out, BLOCK=BLOCK, "
                "num_warps=NUM_WARPS)", "    return out", ""]
    return "\n".join(lines), "\n".join(launcher), [x], [n]


def cat_code(index, n):
    """torch.cat: each input copied into its slice of the output by a kernel of its own (the
    index math of both sides from their strides, walking the output's memory order)."""
    tensors, dim = arg(n, 0, "tensors"), arg(n, 1, "dim", 0)
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, Node) for t in tensors):
        raise StarterError("cat of something other than a list of tensors")
    shape, out_strides = meta(n)
    dim = dim % len(shape)
    if not dense(shape, out_strides):
        out_strides = contiguous(shape)
    order = memory_order(shape, out_strides)
    kernels, launches, offset = [], [], 0
    for i, t in enumerate(tensors):
        t_shape, t_strides = meta(t)
        size, at = math.prod(t_shape), permuted(t_shape, order)
        kernels += ["@triton.jit", f"def _cat_{index}_{i}(src, out, BLOCK: tl.constexpr):",
                    f'    """Input {i} of the cat ({tuple(t_shape)}) into its slice of the '
                    f'output, from index {offset} along dim {dim}."""',
                    "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                    f"    mask = offs < {size}",
                    f"    v = tl.load(src + {index_expr(at, permuted(t_strides, order))}, "
                    "mask=mask)",
                    f"    tl.store(out + {offset * out_strides[dim]} + "
                    f"{index_expr(at, permuted(out_strides, order))}, v, mask=mask)", "", ""]
        launches.append(f"    _cat_{index}_{i}[(triton.cdiv({size}, BLOCK),)](x{i}, out, "
                        "BLOCK=BLOCK, num_warps=NUM_WARPS)")
        offset += t_shape[dim]
    args = ", ".join(f"x{i}" for i in range(len(tensors)))
    launcher = [f"def kernel_{index}({args}):", f'    """cat along dim {dim}: a copy kernel an '
                'input."""', *layout_check(f"kernel_{index}", list(tensors)),
                f"    out = {allocation(shape, out_strides, 'x0.dtype')}",
                *launches, "    return out", ""]
    return "\n".join(kernels).rstrip() + "\n", "\n".join(launcher), list(tensors), [n]


def flat_launcher(index, kname, inputs, shape, strides, doc):
    """The launcher of a kernel whose programs each take BLOCK of the output's elements (a pad,
    a gather, a roll): its inputs' strides checked, the output allocated, one launch."""
    args = ", ".join(f"x{i}" for i in range(len(inputs)))
    return "\n".join([
        f"def kernel_{index}({args}):", f'    """{doc}"""',
        *layout_check(f"kernel_{index}", inputs),
        f"    out = {allocation(shape, strides, 'x0.dtype')}",
        f"    {kname}[(triton.cdiv({math.prod(shape)}, BLOCK),)]({args}, out, BLOCK=BLOCK, "
        "num_warps=NUM_WARPS)", "    return out", ""])


def gather_code(index, n):
    """x[idx] with one integer tensor index (Swin's relative position bias read from its table):
    for each element of idx, a row of x (along dim 0), negative indices counted from the end."""
    x, idx = n.args[0], n.args[1]
    if isinstance(idx, (list, tuple)) and len(idx) == 1:
        idx = idx[0]
    if not isinstance(idx, Node) or meta(idx) is None or \
            idx.meta["tensor_meta"].dtype not in (torch.int64, torch.int32):
        raise StarterError("indexing with tensors other than one integer index along dim 0 (a "
                           "gather: no generated code for it yet; write this region's kernel by "
                           "hand)")
    (x_shape, x_strides), (i_shape, i_strides) = meta(x), meta(idx)
    shape, inner = meta(n)[0], math.prod(x_shape[1:])
    rest = index_expr(x_shape[1:], x_strides[1:], "r") if x_shape[1:] else "0"
    kernel = "\n".join([
        "@triton.jit", f"def _gather_{index}(src, idx, out, BLOCK: tl.constexpr):",
        f'    """Row idx[i] of x {tuple(x_shape)} for each of the {math.prod(i_shape)} indices: '
        f'the output {tuple(shape)}, contiguous."""',
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
        f"    mask = offs < {math.prod(shape)}",
        f"    i, r = offs // {inner}, offs % {inner}",
        f"    row = tl.load(idx + {index_expr(i_shape, i_strides, 'i')}, mask=mask)",
        f"    row = tl.where(row < 0, row + {x_shape[0]}, row)",
        f"    v = tl.load(src + row * {x_strides[0]} + {rest}, mask=mask)",
        "    tl.store(out + offs, v, mask=mask)", "", ""])
    launcher = flat_launcher(index, f"_gather_{index}", [x, idx], shape, contiguous(shape),
                             "x[idx]: a gather, one kernel.")
    return kernel, launcher, [x, idx], [n]


def roll_code(index, n):
    """torch.roll over named dims (Swin's shifted windows): output element c reads input
    element c - shift along each rolled dim, wrapped around; the output contiguous."""
    x, shifts, dims = arg(n, 0), arg(n, 1, "shifts"), arg(n, 2, "dims")
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = None if dims is None else [dims] if isinstance(dims, int) else list(dims)
    if dims is None or len(dims) != len(shifts) or not all(isinstance(v, int)
                                                           for v in shifts + dims):
        raise StarterError("roll without one constant shift a named dim (no generated code for "
                           "it yet; write this region's kernel by hand)")
    (shape, strides), total = meta(x), math.prod(meta(x)[0])
    shift = {d % len(shape): v for d, v in zip(dims, shifts)}
    coords = coordinates(shape, list(range(len(shape))))
    terms = []
    for d, (c, size, stride) in enumerate(zip(coords, shape, strides)):
        if d in shift and shift[d] % size:
            c = f"(({c} + {size - shift[d] % size}) % {size})"
        if size > 1 and stride:
            terms.append(c if stride == 1 else f"{c} * {stride}")
    kernel = "\n".join([
        "@triton.jit", f"def _roll_{index}(src, out, BLOCK: tl.constexpr):",
        f'    """x {tuple(shape)} rolled by {shifts} along dims {dims}: the output '
        'contiguous."""',
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
        f"    mask = offs < {total}",
        f"    v = tl.load(src + {' + '.join(terms) or 'offs * 0'}, mask=mask)",
        "    tl.store(out + offs, v, mask=mask)", "", ""])
    launcher = flat_launcher(index, f"_roll_{index}", [x], shape, contiguous(shape),
                             "torch.roll: one kernel.")
    return kernel, launcher, [x], [n]


def pad_code(index, n):
    """F.pad in constant mode (any dims, negative pads crop): each output element loads its
    input element, or takes the value where that falls outside the input (TF-style "same"
    padding before a convolution: MobileNetV2's, EfficientNet's)."""
    x, pad = arg(n, 0, "input"), arg(n, 1, "pad")
    mode, value = arg(n, 2, "mode", "constant"), arg(n, 3, "value", None)
    if mode != "constant":
        raise StarterError(f"pad in {mode!r} mode (only constant: write this region's kernel "
                           "by hand)")
    (x_shape, x_strides), (shape, strides) = meta(x), meta(n)
    if not dense(shape, strides):
        strides = contiguous(shape)
    order, total = memory_order(shape, strides), math.prod(shape)
    before = [0] * len(shape)  # pad's pairs run from the last dim backwards
    for k in range(len(pad) // 2):
        before[len(shape) - 1 - k] = pad[2 * k]
    lines = ["@triton.jit", f"def _pad_{index}(x, out, BLOCK: tl.constexpr):",
             f'    """pad {tuple(x_shape)} -> {tuple(shape)} with {value or 0.0}."""',
             "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             f"    mask = offs < {total}", "    ok = mask"]
    terms = []
    for d, coord in enumerate(coordinates(shape, order)):
        lines.append(f"    i{d} = {coord} - {before[d]}" if before[d] else f"    i{d} = {coord}")
        if shape[d] != x_shape[d] or before[d]:
            lines.append(f"    ok = ok & (i{d} >= 0) & (i{d} < {x_shape[d]})")
        if x_shape[d] != 1:
            terms.append(f"i{d}" if x_strides[d] == 1 else f"i{d} * {x_strides[d]}")
    lines += [f"    v = tl.load(x + {' + '.join(terms) or 'offs * 0'}, mask=ok, "
              f"other={float(value or 0.0)!r})",
              f"    tl.store(out + {index_expr(permuted(shape, order), permuted(strides, order))}"
              ", v, mask=mask)", ""]
    launcher = flat_launcher(index, f"_pad_{index}", [x], shape, strides,
                             "pad: one Triton kernel.")
    return "\n".join(lines), launcher, [x], [n]


# The reductions a region kernel computes itself: the value its masked lanes load (the
# reduction's identity) and how a row's block folds into the accumulator.
REDUCED = {"sum": ("0.0", "acc + v", "tl.sum"), "mean": ("0.0", "acc + v", "tl.sum"),
           "amax": ('float("-inf")', "tl.maximum(acc, v)", "tl.max"),
           "amin": ('float("inf")', "tl.minimum(acc, v)", "tl.min")}


def reduce_code(index, n):
    """sum, mean, amax, amin over one or several dims (keepdim or not: a CNN's head is a mean
    over H and W) and softmax, log_softmax, normalize (p = 1 or 2: Swin V2's cosine attention)
    over one dim: one program a row (an element of the kept dims), its reduced elements walked
    RBLOCK at a time in fp32 with any strides. softmax takes three walks: the row's max, the sum
    of exponentials, then the outputs; normalize two: the row's norm, then the outputs."""
    name, x = op(n), arg(n, 0, "input")
    (x_shape, x_strides), (out_shape, out_strides) = meta(x), meta(n)
    rank, softmax = len(x_shape), name in ("softmax", "log_softmax")
    rowwise = softmax or name == "normalize"  # an output per element, from its row's reduction
    dims = arg(n, 2, "dim", 1) if name == "normalize" else arg(n, 1, "dim")
    if n.kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in n.args) \
            or n.meta["tensor_meta"].dtype != x.meta["tensor_meta"].dtype:  # a bool mask's sum
        raise StarterError(f"{name} with a dtype (write this region's kernel by hand)")
    if rowwise and not isinstance(dims, int):
        raise StarterError(f"{name} over dim {dims!r}")
    p, eps = (float(arg(n, 1, "p", 2.0)), float(arg(n, 3, "eps", 1e-12))) \
        if name == "normalize" else (None, None)
    if name == "normalize" and p not in (1.0, 2.0):
        raise StarterError(f"normalize with p={p} (p = 1 or 2 have generated code)")
    dims = range(rank) if dims is None else dims if isinstance(dims, (list, tuple)) else [dims]
    dims = sorted({d % rank for d in dims})
    kept = [d for d in range(rank) if d not in dims]
    R, rows = math.prod(x_shape[d] for d in dims), math.prod(x_shape[d] for d in kept)
    if not dense(out_shape, out_strides):
        out_strides = contiguous(out_shape)
    reduced = ([x_shape[d] for d in dims], [x_strides[d] for d in dims])
    out_reduced = [out_strides[d] for d in dims] if rowwise else None
    row_in = index_expr([x_shape[d] for d in kept], [x_strides[d] for d in kept], "row")
    place = kept if rowwise or len(out_shape) == rank else range(len(kept))
    row_out = index_expr([x_shape[d] for d in kept], [out_strides[p] for p in place], "row")
    rblock = min(triton_pow2(R), 1024)
    lines = ["@triton.jit", f"def _reduce_{index}(x, out, RBLOCK: tl.constexpr):",
             f'    """{name} of {tuple(x_shape)} over dims {dims}: one program a row of '
             f'{R} elements."""',
             "    row = tl.program_id(0)", f"    x = x + {row_in}", f"    out = out + {row_out}"]

    def walk(body, other):
        return [f"    for r0 in range(0, {R}, RBLOCK):", "        r = r0 + tl.arange(0, RBLOCK)",
                f"        v = tl.load(x + {index_expr(*reduced, 'r')}, mask=r < {R}, "
                f"other={other}).to(tl.float32)", *[f"        {b}" for b in body]]
    if softmax:
        lines += ['    acc = tl.full([RBLOCK], float("-inf"), tl.float32)',
                  *walk(["acc = tl.maximum(acc, v)"], 'float("-inf")'),
                  "    top = tl.max(acc, axis=0)", "    acc = tl.zeros([RBLOCK], tl.float32)",
                  *walk(["acc += tl.exp(v - top)"], 'float("-inf")'),
                  "    total = tl.sum(acc, axis=0)",
                  *walk(["y = tl.exp(v - top) / total" if name == "softmax" else
                         "y = v - top - tl.log(total)",
                         f"tl.store(out + {index_expr(reduced[0], out_reduced, 'r')}, y, "
                         f"mask=r < {R})"], "0.0")]
    elif name == "normalize":
        lines += ["    acc = tl.zeros([RBLOCK], tl.float32)",
                  *walk(["acc += v * v" if p == 2.0 else "acc += tl.abs(v)"], "0.0"),
                  "    norm = " + ("tl.sqrt(tl.sum(acc, axis=0))" if p == 2.0 else
                                   "tl.sum(acc, axis=0)"),
                  f"    norm = tl.maximum(norm, {eps!r})",
                  *walk(["y = v / norm",
                         f"tl.store(out + {index_expr(reduced[0], out_reduced, 'r')}, y, "
                         f"mask=r < {R})"], "0.0")]
    else:
        identity, fold, finish = REDUCED[name]
        lines += [f"    acc = tl.full([RBLOCK], {identity}, tl.float32)",
                  *walk([f"acc = {fold}"], identity),
                  f"    y = {finish}(acc, axis=0)" + (f" / {R}" if name == "mean" else ""),
                  "    tl.store(out, y)"]
    launcher = [f"def kernel_{index}(x0):", f'    """{name}: one Triton kernel."""',
                *layout_check(f"kernel_{index}", [x]),
                f"    out = {allocation(out_shape, out_strides, 'x0.dtype')}",
                f"    _reduce_{index}[({rows},)](x0, out, RBLOCK={rblock}, num_warps=NUM_WARPS)",
                "    return out", ""]
    return "\n".join(lines + [""]), "\n".join(launcher), [x], [n]


def triton_pow2(n):
    return 1 << max(0, (n - 1).bit_length())


SPECIAL = {"max_pool2d": pool_code, "avg_pool2d": pool_code, "adaptive_avg_pool2d": pool_code,
           "adaptive_avg_pool1d": pool_code,
           "cat": cat_code, "pad": pad_code, "getitem": gather_code,
           "roll": roll_code, **{name: reduce_code for name in REDUCED},
           "softmax": reduce_code, "log_softmax": reduce_code, "normalize": reduce_code}
