"""
A region's starter kernel file, written from its reference (the KernelBench-format problem
profile.py froze, autokernel/regions.py). The reference's forward is traced with torch.fx and
each call sorted into
  * a library call: convolutions and GEMMs, made as the reference makes them (cuDNN, cuBLAS:
    what inductor calls for them too); the region kind allows exactly these
    (autokernel/region_kind.py) and the verdict names them;
  * a view (reshape, permute, flatten, ...): no work, kept as it is;
  * an elementwise op (arithmetic, activations, an eval-mode BatchNorm or dropout, casts and
    copies): neighbouring ones are fused into one Triton kernel that loads each input once,
    computes in fp32 and stores only what the rest of the region reads; a GroupNorm (or an
    InstanceNorm: a group of one channel) heads such a kernel (one program a group of channels:
    its statistics, then the normalization and the calls after it in one pass); a number the
    forward makes a tensor of is a constant of the kernel;
  * a pooling window (max, average, an adaptive average with equal windows), a cat, a constant
    pad, a gather by one integer index, a roll, or a reduction (sum, mean, amax, amin over any dims;
    softmax, log_softmax, normalize over one): a kernel of its own (autokernel/region_special.py).
Where the reference returns several outputs packed in one flat tensor (autokernel/regions.py)
and one fused kernel computes them all, that kernel writes them into it directly.
A region with a 2-d convolution is traced in channels_last (NHWC), as torch.compile runs it:
cuDNN's convolutions are fastest there, and the kernels between them walk and write NHWC (the
layouts: autokernel/region_special.py). Its forward copies a 4-d input that comes in NCHW into
channels_last first (a no-op for one that comes NHWC, a previous block's output), and ModelNew
puts its 4-d weights in channels_last once. Where channels_last would leave torch a copy (a
flatten of an NHWC activation into a GEMM, say) or a norm's output in the other layout, the
region is traced NCHW, as any other is, and its forward copies a 4-d input that comes in
channels_last (a neighbouring block's output) into NCHW first.
A region with any other call (a variance, a min with its indices, a cumsum, a gather by a mask, an LSTM)
has no generated starter yet: StarterError names the call in one line, and extract.py leaves
the region's reference for a kernel written by hand.

The file holds the fused kernels (@triton.jit, specialized to the region's shapes: the index
math has the sizes as constants, as inductor's generated kernels do), a launcher for each, and
ModelNew: the reference's __init__ (the same draws, so the same parameters under the judge's
seed) and a forward that makes the library calls, views and launches in a valid order.
"""
import ast
import contextlib
import io
import math
import operator
import re

import torch
from torch.fx import Graph, GraphModule, Node, Tracer
from torch.fx.node import map_arg
from torch.fx.passes.shape_prop import ShapeProp

from autokernel.contract import load_module
from autokernel.fx_vocabulary import DROPOUTS, arg, op, passes_through
from autokernel.region_ops import (CAST_METHODS, COMPARISONS, ELEMENTWISE, LIBRARY,
                                   NORMS, VIEWS, literal)
from autokernel.region_special import (NHWC_INIT, RELAYOUT, SPECIAL, TO_LAYOUT,
                                       StarterError, allocation, contiguous, dense, index_expr,
                                       layout_check, memory_order, meta, norm_groups,
                                       norm_head, normed_kernel, permuted, same_layout)

# Every fused kernel is memory-bound and one-dimensional: 1,024 elements a program over 4 warps
# (8 a thread: 16-byte loads in fp16), inductor's usual pick for a large pointwise kernel.
CONFIGS = ("BLOCK = 1024  # elements a program: 8 a thread over 4 warps, 16-byte fp16 loads\n"
           "NUM_WARPS = 4")


def kind_of(n):
    """'library', 'view', 'elementwise' or 'special' (SPECIAL: a kernel of its own), or raises
    StarterError naming the call."""
    name = op(n)
    if name in LIBRARY:
        return "library"
    if name == "getitem" and _tensor_index(n):  # a gather (region_special.gather_code)
        return "special"
    if name in VIEWS:
        return "view"
    if name in DROPOUTS and not passes_through(n):
        raise StarterError(f"{name} in training mode")
    if name in ("min", "max", "prod", "logsumexp", "var", "std", "norm", "cumsum") and \
            not isinstance(arg(n, 1, "other"), Node):  # torch.min(x, y) is elementwise
        dims = arg(n, 1, "dim")
        over = "all elements" if dims is None else f"dim {dims}"
        raise StarterError(f"{name} over {over} (a reduction: no generated code for it yet; "
                           f"write this region's kernel by hand)")
    if name in ELEMENTWISE:
        return "elementwise"
    if name in SPECIAL:
        return "special"
    raise StarterError(f"{name or n.target} (no generated code for it yet: write this "
                       f"region's kernel by hand)")


def _tensor_index(n):
    """Whether a getitem's index holds a tensor (x[idx], x[:, mask]): a gather, not a view."""
    found = []
    map_arg(n.args[1:], lambda a: found.append(meta(a) is not None))
    return any(found)


# ---- grouping: neighbouring elementwise calls of one shape become one kernel ---------------

def groups_of(graph):
    """[[node, ...], ...]: the elementwise calls, grouped so that each group is one kernel over
    one shape and no path leaves a group and comes back into it (it runs as one launch). A call
    joins every group of its inputs at its shape that it can (a written-out GELU's branches
    become one kernel)."""
    groups, group_of = [], {}
    for n in graph.nodes:
        if n.op not in ("call_function", "call_method") or kind_of(n) != "elementwise":
            continue
        shape = meta(n) and meta(n)[0]
        chosen = []
        for a in n.all_input_nodes:
            g = group_of.get(a)
            if g is None or g in chosen or meta(groups[g][0])[0] != shape:
                continue
            if norm_head(n) and (a is not arg(n, 0, "input") or _normed(groups[g])):
                continue  # a norm joins the group that makes its input (its prologue) alone
            if (chosen and _normed(groups[g])) or any(_normed(groups[h]) for h in chosen):
                continue
            if _convex({n, *(m for h in chosen + [g] for m in groups[h])}, groups, group_of):
                chosen.append(g)
        if not chosen:
            groups.append([])
            chosen = [len(groups) - 1]
        into = chosen[0]
        for g in chosen[1:]:
            for m in groups[g]:
                group_of[m] = into
            groups[into] += groups[g]
            groups[g] = []
        groups[into].append(n)
        group_of[n] = into
    order = {n: i for i, n in enumerate(graph.nodes)}
    return [sorted(g, key=order.get) for g in groups if g]


def _normed(nodes):
    """A group with a norm: one program a group of channels, its statistics pass first (the
    calls that make the norm's input computed in it too), then the rest in one pass; one norm
    a group."""
    return any(norm_head(n) for n in nodes)


def _convex(members, groups, group_of):
    """Whether no path leaves `members` and comes back (a group reached is reached whole)."""
    seen, frontier = set(), [u for m in members for u in m.users if u not in members]
    while frontier:
        x = frontier.pop()
        if x in members:
            return False
        if x in seen:
            continue
        seen.add(x)
        mates = groups[group_of[x]] if x in group_of else [x]
        frontier += [u for m in mates for u in m.users] + [m for m in mates if m is not x]
    return True


# ---- code for one group ----------------------------------------------------------------------

class _Args:
    """A call's arguments as Triton expressions (tensors: their variable) or raw constants."""

    def __init__(self, n, names):
        self.n, self.names = n, names

    def raw(self, i, name=None, default=None):
        value = arg(self.n, i, name, default) if i is not None else \
            self.n.kwargs.get(name, default)
        return self.names[value] if isinstance(value, Node) else value

    def __call__(self, i, name=None):
        value = arg(self.n, i, name)
        return self.names[value] if isinstance(value, Node) else literal(value)


def group_code(index, nodes, outside, packed=False):
    """(kernel source, launcher source, inputs, outputs) of one group. outside(node): whether
    a node of the group is read after it (or is the region's output); packed: its outputs are
    the region's several, which its launcher writes into one flat tensor (_pack)."""
    members = set(nodes)
    shape = meta(nodes[0])[0]
    inputs = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in members and a not in inputs:
                if meta(a) is None:
                    raise StarterError(f"{op(n)} reads {a.name}, which is not a tensor")
                inputs.append(a)
    outputs = [n for n in nodes if outside(n)]
    written = [_written(n) for n in outputs]  # each output's strides: the traced ones
    order = memory_order(shape, written[0])  # the kernel walks the first output's memory order
    walked = permuted(shape, order)
    names = {a: f"v{i}" for i, a in enumerate(inputs)}
    ops = ", ".join(op(n) for n in nodes)
    body, loads = {}, {}
    for i, a in enumerate(inputs):
        a_shape, a_strides = meta(a)
        strides = _broadcast_strides(a_shape, a_strides, shape, _channel_dim(a, nodes))
        value = f"tl.load(in{i} + {index_expr(walked, permuted(strides, order))}, mask=mask)"
        kind = a.meta["tensor_meta"].dtype
        loads[a] = f"    v{i} = {value} != 0" if kind == torch.bool else \
            f"    v{i} = {value}.to(tl.float32)"
    for j, n in enumerate(nodes):
        names[n] = f"t{j}"
        body[n] = f"    t{j} = {ELEMENTWISE[op(n)](_Args(n, names))}  # {op(n)}"
    stores = [f"    tl.store(out{k} + {_at(walked, permuted(st, order))}, {names[n]}, mask=mask)"
              for k, (n, st) in enumerate(zip(outputs, written))]
    kname, params = f"_fused_{index}", [f"in{i}" for i in range(len(inputs))] + \
        [f"out{k}" for k in range(len(outputs))]
    if _normed(nodes):
        norm = next(n for n in nodes if norm_head(n))
        kernel = normed_kernel(kname, params, norm, names, shape, order, ops, loads, body,
                               stores)
        launcher = _launcher(index, kname, inputs, outputs, written, shape, ops,
                             grid=shape[0] * norm_groups(norm)[0], packed=packed)
        return kernel, launcher, inputs, outputs
    total = math.prod(shape)
    offs = "tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)"
    if total * max([1] + [max(meta(a)[1] or (1,)) for a in inputs]) >= 2 ** 31:
        offs = "tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)"
    kernel = "\n".join([
        "@triton.jit",
        f"def {kname}({', '.join(params)}, BLOCK: tl.constexpr):",
        f'    """{ops} over {tuple(shape)}: one pass over memory."""',
        f"    offs = {offs}",
        f"    mask = offs < {total}",
        *loads.values(), *body.values(), *stores, ""])
    launcher = _launcher(index, kname, inputs, outputs, written, shape, ops, packed=packed)
    return kernel, launcher, inputs, outputs


def _pack(graph, groups, group_of, outside):
    """Where the reference returns its several outputs packed (torch.cat of each flattened:
    autokernel/regions.py) and one fused group computes them all, in order and contiguous:
    (that group, the cat, the flattens), so the group writes them into the packed tensor
    itself instead of a cat copying them there; else None."""
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    if not isinstance(out, Node) or op(out) != "cat" or not isinstance(out.args[0], (list, tuple)):
        return None
    flats = list(out.args[0])
    if not all(isinstance(f, Node) and op(f) == "flatten" and len(f.users) == 1 for f in flats):
        return None
    values = [f.args[0] for f in flats]
    g = group_of.get(values[0])
    if g is None or any(group_of.get(v) != g for v in values):
        return None
    outputs = [n for n in groups[g] if outside(n)]  # as group_code finds them
    if outputs != values or len({meta(v) and str(v.meta["tensor_meta"].dtype)
                                 for v in values}) != 1 or \
            any(tuple(meta(v)[1]) != contiguous(meta(v)[0]) for v in values):
        return None
    return g, out, flats


def _written(n):
    """The strides a group's output is allocated with: the traced ones (contiguous where they
    leave gaps, as a value passed through unchanged can)."""
    shape, strides = meta(n)
    return strides if dense(shape, strides) else contiguous(shape)


def _at(walked, strides):
    """Where an output's element for `offs` is: "offs" itself where the kernel walks its
    memory order."""
    return "offs" if same_layout(walked, strides, contiguous(walked)) else \
        index_expr(walked, strides)


def _channel_dim(a, nodes):
    """A BatchNorm's statistics and affine apply along dim 1 of its input (not numpy's
    trailing alignment): the dim a 1-d operand of a batch_norm runs along."""
    for n in nodes:
        if op(n) in NORMS and a in n.all_input_nodes \
                and a is not arg(n, 0, "input"):
            return 1
    return None


def _broadcast_strides(a_shape, a_strides, shape, channel_dim):
    if channel_dim is not None and len(a_shape) == 1:
        strides = [0] * len(shape)
        strides[channel_dim] = a_strides[0]
        return strides
    pad = len(shape) - len(a_shape)
    full = [1] * pad + list(a_shape)
    st = [0] * pad + list(a_strides)
    return [0 if fs == 1 and s != 1 else t for fs, s, t in zip(full, shape, st)]



def _out_dtype(n, same):
    """What a group's output is stored as: the region's activations' dtype (the judged one),
    but a comparison's bool and an explicit cast's dtype."""
    name = op(n)
    if name in COMPARISONS:
        return "torch.bool"
    if name in CAST_METHODS:
        return CAST_METHODS[name]
    if name == "to":
        target = [a for a in (*n.args[1:], n.kwargs.get("dtype")) if isinstance(a, torch.dtype)]
        if target:
            return str(target[0])
    return same


def _launcher(index, kname, inputs, outputs, written, shape, ops, grid=None, packed=False):
    args = [f"x{i}" for i in range(len(inputs))]
    dtype_of = "x0.dtype"
    lines = [f"def fused_{index}({', '.join(args)}):",
             f'    """{ops}: {len(outputs)} output(s) of shape {tuple(shape)}'
             + (", packed in one flat tensor, in order" if packed else "") + '."""',
             *layout_check(f"fused_{index}", inputs)]
    outs = [f"o{k}" for k in range(len(outputs))]
    if packed:  # contiguous, one after another: views of the region's packed output
        size = math.prod(shape)
        lines.append(f"    packed = torch.empty(({size * len(outputs)},), device=x0.device, "
                     f"dtype={_out_dtype(outputs[0], dtype_of)})")
        lines += [f"    o{k} = packed[{k * size}:{(k + 1) * size}].view({tuple(shape)!r})"
                  for k in range(len(outputs))]
    else:
        for k, (n, strides) in enumerate(zip(outputs, written)):
            lines.append(f"    o{k} = {allocation(shape, strides, _out_dtype(n, dtype_of))}")
    grid = grid or f"triton.cdiv({math.prod(shape)}, BLOCK)"
    result = "packed" if packed else outs[0] if len(outs) == 1 else f"({', '.join(outs)},)"
    lines += [f"    grid = ({grid},)",
              f"    {kname}[grid]({', '.join(args + outs)}, BLOCK=BLOCK, num_warps=NUM_WARPS)",
              f"    return {result}", ""]
    return "\n".join(lines)


# ---- the file ---------------------------------------------------------------------------------

def starter_source(problem_path, header):
    """The starter kernel file's text for the region whose reference is at problem_path;
    header: the contract block (KERNEL_TYPE, KERNEL_NAME, KERNELBENCH_PROBLEM, ...) to put
    after the imports. Raises StarterError, also where the generator itself trips on a call's
    arguments (one line for extract.py, never a traceback)."""
    try:
        return _starter_source(problem_path, header)
    except StarterError:
        raise
    except Exception as e:  # noqa: BLE001
        raise StarterError(f"the starter generator failed on it ({type(e).__name__}: "
                           f"{str(e)[:160]})") from None


def _starter_source(problem_path, header):
    gm, nhwc = _traced(load_module(problem_path))
    graph = gm.graph
    _fold_scalars(gm)
    groups = groups_of(graph)
    group_of = {n: g for g, nodes in enumerate(groups) for n in nodes}
    kernels, launchers, new, env = [], {}, Graph(), {}

    def outside(n):
        return any(u not in groups[group_of[n]] for u in n.users)

    pack = _pack(graph, groups, group_of, outside)
    g_packed, cat, flats = pack or (None, None, [])
    pieces = {g: group_code(g, nodes, outside, g == g_packed) for g, nodes in enumerate(groups)}
    for n in graph.nodes:  # a pooling or a cat: a unit (and a kernel) of its own
        if n.op in ("call_function", "call_method") and kind_of(n) == "special" and n is not cat:
            group_of[n] = len(groups)
            pieces[len(groups)] = SPECIAL[op(n)](len(groups), n)
            groups.append([n])
    for g, (kernel, launcher, _, _) in pieces.items():
        kernels.append(kernel)
        launchers[g] = launcher
    functions = {}
    relayout = _named(TO_LAYOUT[nhwc].split("(")[0][4:])  # to_channels_last or to_contiguous
    for n in _units_in_order(graph, groups, group_of):
        if isinstance(n, int):  # a group: one launch
            _, source, inputs, outputs = pieces[n]
            fn = functions.setdefault(n, _named(pieces[n][1].split("(")[0][4:]))
            call = new.create_node("call_function", fn, tuple(env[a] for a in inputs),
                                   name=f"y{n}")
            if n == g_packed:  # the packed output itself: its flattens and cat are done
                env[cat] = call
                continue
            for k, out in enumerate(outputs):
                env[out] = call if len(outputs) == 1 else new.call_function(
                    operator.getitem, (call, k))
            continue
        if n is cat or n in flats:
            continue
        env[n] = new.node_copy(n, env.__getitem__)
        if n.target is operator.matmul:  # `a @ b` as the library call it is (the source check
            env[n].target = torch.matmul  # refuses torch's operators on tensors)
        if (n.op == "placeholder" or nhwc and n.op == "get_attr" and any(
                op(u) not in LIBRARY for u in n.users)) and len((meta(n) or ((),))[0]) == 4:
            # the kernels are written for the traced layout, whatever the caller passes in
            env[n] = new.create_node("call_function", relayout, (env[n],),
                                     name=f"{n.name}_{'cl' if nhwc else 'c'}")
    if any(u.target is relayout for u in new.nodes):
        kernels.append(RELAYOUT)
        launchers[-1] = TO_LAYOUT[nhwc]
    code = new.python_code(root_module="self")
    forward = code.src
    for name, value in code.globals.items():
        if getattr(value, "_region_launcher", None):
            forward = re.sub(rf"\b{re.escape(name)}\b", value._region_launcher, forward)
    forward = re.sub(r";  [\w, =]* = None$", "", forward, flags=re.M)  # FX's frees
    forward = re.sub(r"\btorch\._C\._nn\.(?=linear\()", "torch.nn.functional.",
                     forward)  # (F.linear's own name: a path into torch's internals)
    forward = "\n".join("    " + line if line.strip() else "" for line in
                        forward.strip("\n").splitlines())
    init = _init_source(problem_path, nhwc)
    return "\n".join([
        '"""', header["doc"], '"""', "import torch", "import torch.nn as nn", "import triton",
        "import triton.language as tl", "", header["contract"], "", CONFIGS, "", "",
        *[k + "\n" for k in kernels], *[launchers[g] + "\n" for g in sorted(launchers)],
        "class ModelNew(nn.Module):", init, "", forward.rstrip(), ""])


CONV2D = (torch.nn.Conv2d, torch.nn.ConvTranspose2d)


class _BufferTracer(Tracer):
    """symbolic_trace's, but a buffer is read from the module (a get_attr) rather than taken as
    the value it had: a view of an index buffer (Swin's relative position index) stays the
    model's buffer, which verify.py passes in at every call, not a constant of the trace."""
    proxy_buffer_attributes = True


def _traced(module):
    """The reference's graph with each value's shape and strides (ShapeProp's), and whether it
    was traced in channels_last: a region with a 2-d convolution is, its 4-d inputs and
    parameters NHWC, unless that leaves a call the NCHW trace does not (_nhwc_fits)."""
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).eval()
    inputs = module.get_inputs()
    try:
        gm = GraphModule(model, _BufferTracer().trace(model))
        _propagate(gm, inputs)
        _copying_reshapes(gm, inputs)
    except Exception as e:  # noqa: BLE001  (any trace failure: no generated starter)
        raise StarterError(f"the reference does not trace ({type(e).__name__}: {e})") from None
    if not any(_conv2d(gm, n) for n in gm.graph.nodes):
        return gm, False
    nchw = {n: n.meta.get("tensor_meta") for n in gm.graph.nodes}
    try:  # (a 5-d parameter, say, has no channels_last: NCHW then)
        gm.to(memory_format=torch.channels_last)
        _propagate(gm, [x.contiguous(memory_format=torch.channels_last)
                        if isinstance(x, torch.Tensor) and x.dim() == 4 else x for x in inputs])
        if _nhwc_fits(gm, nchw):
            return gm, True
    except Exception:  # noqa: BLE001, S110  (NCHW then)
        pass
    for n, tm in nchw.items():
        n.meta["tensor_meta"] = tm
    return gm, False


def _propagate(gm, inputs):
    """ShapeProp's shapes and strides on the graph, its printed traceback of a failing call
    kept off the terminal (the failure is an exception here: a StarterError, or NCHW)."""
    with contextlib.redirect_stderr(io.StringIO()):
        ShapeProp(gm).propagate(*inputs)


def _copying_reshapes(gm, inputs):
    """A reshape (or flatten) its input's strides cannot view (an image's unfolded patches
    flattened, ViT's patch extraction) is a copy: a contiguous() goes before it, an elementwise
    copy the starter fuses like any other, and the reshape views that. So is a batched matmul's
    operand whose batch dims do not fold into one (Swin's keys, normalized in the qkv's
    permuted layout, then transposed): torch.matmul would copy it with torch's own clone."""
    changed = False
    for n in list(gm.graph.nodes):
        if op(n) in ("reshape", "flatten"):
            operands, shapes = [arg(n, 0)], [meta(n) and meta(n)[0]]
        elif op(n) == "matmul":
            operands = [a for a in n.args[:2] if meta(a) is not None and len(meta(a)[0]) > 2]
            shapes = [(-1, *meta(a)[0][-2:]) for a in operands]
        else:
            continue
        for a, shape in zip(operands, shapes):
            if meta(a) is None or shape is None:
                continue
            try:
                torch.empty_strided(*meta(a), device="meta").view(shape)
            except RuntimeError:
                with gm.graph.inserting_before(n):
                    copy = gm.graph.call_method("contiguous", (a,))
                n.replace_input_with(a, copy)
                changed = True
    if changed:
        gm.recompile()
        _propagate(gm, inputs)


def _conv2d(gm, n):
    return op(n) in ("conv2d", "conv_transpose2d") or \
        n.op == "call_module" and isinstance(gm.get_submodule(n.target), CONV2D)


def _nhwc_fits(gm, nchw):
    """Whether the channels_last trace leaves every call a generated kernel or the library
    can take: a GEMM (or a module's call) sees the strides it sees in NCHW, a reshape stays a
    view (a copy would be torch's math), a GroupNorm's groups are runs of each pixel's
    channels."""
    for n in gm.graph.nodes:
        name = op(n)
        if (n.op == "call_module" or name in LIBRARY) and not _conv2d(gm, n):
            for a in n.all_input_nodes:
                was, now = nchw.get(a), meta(a)
                if now and (was is None or now[0] != tuple(was.shape)
                            or not same_layout(now[0], now[1], tuple(was.stride))):
                    return False
        elif name in ("reshape", "flatten", "unflatten", "view_as") and meta(n) and \
                meta(arg(n, 0)):
            try:
                torch.empty_strided(*meta(arg(n, 0)), device="meta").view(meta(n)[0])
            except RuntimeError:
                return False
        elif name in ("group_norm", "instance_norm"):
            shape, strides = meta(arg(n, 0, "input"))
            order = memory_order(shape, strides)
            if not dense(shape, strides) or order not in (tuple(range(len(shape))),
                                                          (0, *range(2, len(shape)), 1)) \
                    or not same_layout(shape, strides, meta(n)[1]):
                return False  # (torch's InstanceNorm returns NCHW: its trace says so)
    return True


def _fold_scalars(gm):
    """A number the forward makes a tensor of (torch.min(x, torch.tensor(0.0)): the trace holds
    it as a constant of its own, which ModelNew has not): its value written into the
    elementwise calls that read it (a constant of the kernel), and such a torch.min or max
    named minimum or maximum (elementwise, not a reduction over a dim)."""
    for n in list(gm.graph.nodes):
        if n.op != "get_attr" or not n.target.startswith("_tensor_constant"):
            continue
        t = getattr(gm, n.target)
        if any(op(u) == "getitem" for u in n.users):  # the trace folded an index buffer's view
            raise StarterError("indexing with a tensor (a gather: no generated code for it yet; "
                               "write this region's kernel by hand)")
        if t.dim() != 0 or t.dtype == torch.bool or t.is_complex() or \
                not all(op(u) in ELEMENTWISE for u in n.users):
            raise StarterError(f"a tensor of shape {tuple(t.shape)} made from constants in the "
                               f"forward (write this region's kernel by hand)")
        value = t.item()
        for u in list(n.users):
            if op(u) in ("min", "max"):
                name = {"min": "minimum", "max": "maximum"}[op(u)]
                u.target = name if u.op == "call_method" else getattr(torch, name)
            u.args = map_arg(u.args, lambda a: value if a is n else a)
            u.kwargs = map_arg(u.kwargs, lambda a: value if a is n else a)
        gm.graph.erase_node(n)


def _named(name):
    """A stand-in for a launcher in the graph FX writes the forward from."""
    def launcher(*args):
        raise RuntimeError("a placeholder for the generated launcher")
    launcher.__name__ = launcher.__qualname__ = name
    launcher._region_launcher = name
    return launcher


def _units_in_order(graph, groups, group_of):
    """Each node outside the groups, and each group once (as its index), in an order where
    everything comes after what it reads: the graph's order, a group placed where its last
    input is ready and before its first reader."""
    nodes = [n for n in graph.nodes if n.op != "output"]
    done, order, pending = set(), [], list(nodes)

    def ready(unit):
        members = groups[unit] if isinstance(unit, int) else [unit]
        return all(a in done or a in members for m in members for a in m.all_input_nodes)
    while pending:
        for n in pending:
            unit = group_of.get(n, n)
            if ready(unit):
                break
        else:
            raise StarterError("the region's calls cannot be ordered into launches")
        members = groups[unit] if isinstance(unit, int) else [unit]
        done.update(members)
        pending = [p for p in pending if p not in members]
        order.append(unit)
    order_out = [n for n in graph.nodes if n.op == "output"]
    return order + order_out


def _init_source(problem_path, nhwc=False):
    """Model.__init__ of the reference, as ModelNew's (the same draws in the same order), its
    4-d parameters put in channels_last after them where the region is traced so."""
    text = open(problem_path).read()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    init = "    " + ast.get_source_segment(text, item, padded=True).lstrip()
                    indent = "\n" + " " * item.body[0].col_offset
                    return init + "".join(indent + line for line in NHWC_INIT.splitlines()
                                          if nhwc)
    raise StarterError("the reference has no Model.__init__")
