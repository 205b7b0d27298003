"""
Regions: the model's own computation outside the kernel types, cut into pieces a kernel can
replace (a residual block's conv + BatchNorm + ReLU + add, a written-out GELU, GroupNorm + SiLU,
a pooling head).

profile.py's capture (autokernel/graph_capture.py) finds the kernel types in each graph Dynamo
captures; find_regions then cuts every call left over into regions:
  * a call belongs to the innermost module of the model's own code it ran in (a module class
    not from torch.nn: BasicBlock with its downsample Sequential, NewGELU, the model itself for
    code in its forward), or, outside any, the innermost container (an nn.Sequential block), so
    a region never spans two blocks a user wrote;
  * within that module, a call joins the region of one of its inputs when that keeps the
    region convex (no path leaves the region and comes back into it), so every region can run
    as one block, which is what a kernel would replace; otherwise it starts a region;
  * pieces of a region that no value of its own connects are regions of their own (one thing
    computed, one output where it can be, which the gate judges), views of its inputs that only
    the rest of the model reads leave it, and an item of a tuple that no region computes (the
    output of F.multi_head_attention_forward, one call) is an input, not a region;
  * a region of views alone (a flatten) computes nothing and is left to the op names; a copy
    (contiguous, a cast) is work, and a region.
Each region is described by what it computes (its calls in order, with their arguments, and
every input's and output's shape, dtype and strides): the signature. Instances with the same
signature compute the same thing at the same shapes (each with its own parameters) and are one
entry of the profile. A region's reference is written from its graph as a standalone problem
file in KernelBench's format (reference_source): the frozen oracle a region kernel is judged
against.
"""
import hashlib
import math
import operator
import re
from dataclasses import dataclass, field

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node

from autokernel.fx_vocabulary import CASTS, VIEWS, op, passes_through
from autokernel.matches import Match, _movable, module_stack
from autokernel.recognize import OP_TABLE, REGION

CONV = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}
BATCHED = {"bmm", "baddbmm", "einsum"}
ATEN_NAMES = {"cross_entropy": "cross_entropy_loss"}  # the profiler's name where torch's differs
CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)
GEMM = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum"}


@dataclass(eq=False)
class Region(Match):
    """A Match of kind "region": its nodes, the values it reads from outside (inputs:
    activations and the model's parameters, in the order it first reads them) and those of its
    own read outside it (outs), in graph order."""
    order: list = field(default_factory=list)   # its nodes in graph order
    inputs: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    module: str = ""            # the owning module's path in the model ("" for the model itself)
    signature: str = ""
    problem_note: str = ""     # why no standalone reference could be written
    plug: str = ""              # where verify.py swaps it in, relative to module (plug_path)

    @property
    def id(self):
        return self.note


# Modules of these packages are library layers, not the model's own code: their calls belong to
# the module that calls them (transformers' activation modules, ACT2FN's, as torch.nn's SiLU:
# a conv, its norm and its activation are one region, one fused kernel).
LIBRARY_MODULES = ("torch.nn", "transformers.activations")


def owner_of(node, modules=None):
    """(path, class name) of the innermost module of the model's own code a call ran in (a
    container inside it is part of it: a ResNet block's downsample Sequential), else of the
    innermost container (a model built of nn.Sequential blocks, as KernelBench's MobileNetV2,
    has no class of its own per block); (None, None) for code in the top-level forward.
    modules: {str(id(module)): its name in the model}, the keys of Dynamo's module stack (a
    module reached through a closure or a lambda has its own name there, not the way the
    forward reached it). The model's own entry, which a trace of the model passed as an argument
    (the graph swap's) has and a trace of its forward (the profile's) has not, is skipped: both
    cut the same regions."""
    container = None, None
    for key, (path, cls) in reversed(list((node.meta.get("nn_module_stack") or {}).items())):
        if not isinstance(cls, type) or (modules or {}).get(key) == "":
            continue
        if not cls.__module__.startswith(LIBRARY_MODULES):
            return (modules or {}).get(key, module_path(path)), cls.__name__
        if container[0] is None and issubclass(cls, CONTAINERS):
            container = (modules or {}).get(key, module_path(path)), cls.__name__
    return container


def module_path(source):
    """Dynamo's name for a module ("L['self'].layers[0].mlp", "getattr(L['self'].h, '0')") as
    the model's named_modules() spells it ("layers.0.mlp")."""
    path = source
    while (m := re.search(r"getattr\(([^()]*?), '([^']+)'\)", path)):
        path = path[:m.start()] + f"{m.group(1)}.{m.group(2)}" + path[m.end():]
    path = re.sub(r"^L\['[^']+'\]", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return re.sub(r"\['([^']+)'\]", r".\1", path).strip(".")


def _is_tensor_call(n):
    if op(n) is None and n.op != "call_module":
        return False
    v = n.meta.get("example_value")
    if isinstance(v, (tuple, list)):
        return bool(v) and all(isinstance(t, torch.Tensor) for t in v)
    return isinstance(v, torch.Tensor)


def find_regions(gm, matches, root="forward", modules=None):
    """Cut the calls of a captured graph that no match holds into convex regions (see the module
    docstring; modules: as owner_of takes them). Returns [Region] in graph order, each with its
    signature and id."""
    owner = {n: m for m in matches for n in m.nodes}
    deps, unit_of, regions, latest = {}, {}, [], {}
    for n in gm.graph.nodes:
        ins = n.all_input_nodes
        up = set()
        for a in ins:
            up |= deps[a]
            if a in unit_of:
                up.add(id(unit_of[a]))
        if n in owner:
            unit_of[n] = owner[n]
        elif n.op != "output" and _is_tensor_call(n) and not _typed(n) \
                and not _unpacks(n, unit_of):
            path, cls = owner_of(n, modules)
            key = (path or "", cls or root)
            # The module's open region first (a branch of the same code joins it), else one
            # its inputs are in; either only where no input depends on it through another unit.
            tries = [latest.get(key)] + [unit_of.get(a) for a in ins]
            region = next((r for r in tries if isinstance(r, Region) and (r.module, r.label)
                           == key and all(a in r.nodes or id(r) not in deps[a] for a in ins)),
                          None)
            if region is None:
                region = Region(REGION, n, set(), label=key[1], module=key[0])
                regions.append(region)
            region.nodes.add(n)
            region.output = n
            unit_of[n] = latest[key] = region
        deps[n] = frozenset(up)
    kept = []
    for r in [part for r in regions for part in _connected(r, gm.graph)]:
        _drop_passing_views(r, gm.graph)
        if all(op(n) in VIEWS - CASTS or passes_through(n) for n in r.nodes) \
                or not _movable(r, gm.graph):
            continue  # computes nothing (an eval-mode dropout's copy would be all its kernel)
        _plug(r, gm.graph, modules)
        _seal(r, gm.graph)
        kept.append(r)
    return kept


def _connected(r, graph):
    """The region's pieces that no value of its own connects (Swin V2's normalized queries and
    keys, which meet only in a matmul outside it): regions of their own, each convex as the
    whole is, so each kernel computes one thing (and a kernel file returns one output where it
    can, which the gate judges)."""
    piece = {n: n for n in r.nodes}

    def root(n):
        while piece[n] is not n:
            n = piece[n]
        return n
    for n in r.nodes:
        for a in n.all_input_nodes:
            if a in r.nodes:
                piece[root(a)] = root(n)
    groups = {}
    for n in graph.nodes:
        if n in r.nodes:
            groups.setdefault(root(n), []).append(n)
    if len(groups) == 1:
        return [r]
    return [Region(REGION, nodes[-1], set(nodes), label=r.label, module=r.module)
            for nodes in groups.values()]


def _drop_passing_views(r, graph):
    """Views of the region's inputs that only the rest of the model reads (ViT's class token
    expanded beside its patches, which joined the forward's open region) leave it: they compute
    nothing, and as outputs they would make a kernel return them too."""
    leading = _leading_views(r, graph)
    dropped = set()
    while (gone := {n for n in leading - dropped
                    if not any(u in r.nodes and u not in dropped for u in n.users)}):
        dropped |= gone
    if dropped and dropped != r.nodes:
        r.nodes -= dropped
        r.output = [n for n in graph.nodes if n in r.nodes][-1]


def _leading_views(r, graph):
    """The region's views of its own inputs (and of such views): they compute nothing."""
    leading = set()
    for n in graph.nodes:
        if n in r.nodes and op(n) in VIEWS - CASTS and \
                all(a not in r.nodes or a in leading for a in n.all_input_nodes):
            leading.add(n)
    return leading


def plug_path(nodes, module, graph, modules=None):
    """Where verify.py can swap a region of these nodes in, relative to its module: the
    innermost module whose forward computes them and nothing else ("" the module itself;
    "dwconv" where they are all a torch.nn child computes while the module also runs a kernel
    type, ConvNeXt's block), or None where no module's forward is only the region."""
    calls = [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    for key, (path, _) in reversed(module_stack(nodes)):
        name = (modules or {}).get(key, module_path(path))
        if module and name != module and not name.startswith(module + "."):
            return None  # above the region's module: regions never span two
        if all(n in nodes for n in calls if key in (n.meta.get("nn_module_stack") or {})):
            return "" if name == module else name[len(module) + 1:] if module else name
        if name == module:
            return None
    return "" if all(n in nodes for n in calls) else None


def _plug(r, graph, modules):
    """r.plug (plug_path); where the region is a child's forward but for views of its output
    (ConvNeXt's `self.dwconv(x).permute(0, 2, 3, 1)`), those views are left to the module's
    own code, so that the child's forward can be swapped."""
    r.plug = plug_path(r.nodes, r.module, graph, modules)
    if r.plug is not None:
        return
    trimmed, changed = set(r.nodes), True
    while changed:  # views nothing in the region reads, from the end
        ends = {n for n in trimmed if op(n) in VIEWS - CASTS and not set(n.users) & trimmed}
        trimmed, changed = trimmed - ends, bool(ends)
    plug = plug_path(trimmed, r.module, graph, modules) if trimmed != r.nodes and trimmed \
        else None
    if plug:
        r.nodes, r.plug = trimmed, plug
        r.output = [n for n in graph.nodes if n in trimmed][-1]


def _unpacks(n, unit_of):
    """Whether a call takes an item of a tuple that no region computes (the attention output
    of F.multi_head_attention_forward, one call in the graph): that item is an input of the
    regions reading it, as the call's value would be, not a region of its own."""
    source = n.args[0] if op(n) == "getitem" and n.args else None
    return isinstance(source, Node) and \
        isinstance(source.meta.get("example_value"), (tuple, list)) and \
        not isinstance(unit_of.get(source), Region)


def _typed(n):
    """Whether a call is one of the kernel types by its op name alone (a linear is a matmul, a
    layer_norm a layernorm): the profile gives its time to that type, not to a region. Batched
    matmuls (bmm, or a matmul whose second operand has batch dims: Swin's q @ k.T) have no
    shape in the matmul type's convention, so regions take them."""
    name = ATEN_NAMES.get(op(n), op(n))
    entry = OP_TABLE.get(f"aten::{name}")
    if name == "matmul" and len(n.args) > 1 and isinstance(n.args[1], Node):
        other = n.args[1].meta.get("example_value")
        if isinstance(other, torch.Tensor) and other.dim() > 2:
            return False
    return entry is not None and entry[1] is not None and name not in BATCHED


def _seal(r, graph):
    """Fill a region's inputs, outputs, signature and id."""
    r.order = order = [n for n in graph.nodes if n in r.nodes]
    r.inputs = []
    for n in order:
        for a in n.all_input_nodes:
            if a not in r.nodes and a not in r.inputs:
                r.inputs.append(a)
    # A view of the inputs that the rest of the model also reads (Swin's qkv permuted, whose
    # v the attention's matmul reads) is no output: the model's own view node stays for it.
    views = _leading_views(r, graph)
    r.outs = [n for n in order if n not in views and any(u not in r.nodes for u in n.users)]
    names = {a: f"in{i}" for i, a in enumerate(r.inputs)}
    names.update({n: f"v{i}" for i, n in enumerate(order)})

    def spell(a):
        if isinstance(a, Node):
            return names[a]
        if isinstance(a, (list, tuple)):
            return type(a)(spell(x) for x in a)
        if isinstance(a, dict):
            return {k: spell(v) for k, v in a.items()}
        return repr(a)

    parts = [_meta(a) for a in r.inputs]
    parts += [(n.op, _target_name(n), spell(n.args), spell(dict(n.kwargs)), _meta(n))
              for n in order]
    parts.append(tuple(names[n] for n in r.outs))
    r.signature = hashlib.sha1(repr(parts).encode()).hexdigest()
    r.note = region_id(r.signature)
    r.label = r.label.replace("::", ":")


def region_id(signature):
    """A region's short name: never all digits, which a profiler scope would read as a shape."""
    return "r" + signature[:8]


def _target_name(n):
    t = n.target
    if isinstance(t, str):
        return t
    return f"{getattr(t, '__module__', '')}.{getattr(t, '__name__', t)}"


def _meta(n):
    v = n.meta.get("example_value")
    vals = v if isinstance(v, (tuple, list)) else [v]
    return tuple((tuple(t.shape), str(t.dtype), tuple(t.stride())) if isinstance(t, torch.Tensor)
                 else repr(t) for t in vals)


def ops_of(r):
    """The region's calls by name, in order: 'conv2d, batch_norm, add, relu'."""
    return [op(n) or str(n.target) for n in r.order if op(n) not in VIEWS - CASTS]


def flops(r):
    """FLOPs of the region's GEMMs and convolutions (2 a multiply-add); elementwise work is
    left out, so a region without either counts as memory-bound."""
    total = 0
    for n in r.nodes:
        name, out = op(n), n.meta.get("example_value")
        if not isinstance(out, torch.Tensor):
            continue
        if name in CONV:
            w = n.args[1].meta["example_value"]
            groups = n.args[6] if len(n.args) > 6 else n.kwargs.get("groups", 1)
            per_out = w.shape[1] * w[0, 0].numel() if "transpose" not in name else \
                w.shape[0] // max(groups, 1) * w[0, 0].numel()
            total += 2 * out.numel() * per_out
        elif name in GEMM:
            a = n.args[0].meta.get("example_value") if isinstance(n.args[0], Node) else None
            if isinstance(a, torch.Tensor) and a.dim() >= 1:
                total += 2 * out.numel() * a.shape[-1]
    return total


def nbytes(r):
    """Bytes a region must move at least: its inputs read once, its outputs written once."""
    total = 0
    for n in list(r.inputs) + list(r.outs):
        v = n.meta.get("example_value")
        for t in (v if isinstance(v, (tuple, list)) else [v]):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def observe(gm, example_inputs, nodes, params):
    """Run a captured graph once on the capture's real inputs and summarize the value of each of
    `nodes` (the regions' inputs): {node: {"shape", "dtype", "stats" (_stats), "parameter" (the
    model's name for it, or None), "trainable" (an nn.Parameter)}}. Summaries, not tensors: a
    model's activations are not held."""
    wanted, seen = set(nodes), {}

    def summary(n, value):
        if n in wanted and isinstance(value, torch.Tensor):
            seen[n] = {"shape": list(value.shape),
                       "dtype": str(value.dtype).removeprefix("torch."),
                       "stats": _stats(value), "parameter": params.get(id(value)),
                       "trainable": isinstance(value, torch.nn.Parameter)}

    class Watch(Interpreter):
        def run_node(self, n):
            value = super().run_node(n)
            summary(n, value)
            return value

    with torch.no_grad():
        Watch(gm).run(*example_inputs)
    return seen


def record(r, seen, origin):
    """profile.json's record of a region: what it computes, its inputs (with the region's name
    for those that are the model's parameters) and outputs, its FLOPs and bytes, and its
    reference as a problem file (reference_source, or None and a note saying why). seen:
    observe()'s summaries. "instances" (module paths) is filled by the caller."""
    def tensor(n):
        s = seen.get(n)
        return {"shape": s["shape"], "dtype": s["dtype"], "parameter": attribute_name(
            s["parameter"], r.module) if s["parameter"] else None} if s else None
    outputs = []
    for n in r.outs:
        v = n.meta.get("example_value")
        outputs.append({"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
                       if isinstance(v, torch.Tensor) else None)
    return {"id": r.id, "label": r.label, "ops": ops_of(r),
            "inputs": [tensor(a) for a in r.inputs], "outputs": outputs, "flops": flops(r),
            "bytes": nbytes(r), "instances": [], "plug": r.plug,
            "reference": reference_source(r, seen, origin),
            "note": r.problem_note}


# ---------------------------------------------------------------------------------------------
# The reference: a region's graph as a standalone KernelBench-style problem
# ---------------------------------------------------------------------------------------------

SAFE_GLOBALS = {"torch", "operator", "math", "inf", "nan", "device", "Tensor",
                "NoneType", "fx_pytree", "pytree"}  # the last three: FX's own, in every graph


def packed_shapes(r):
    """The shapes of a region's outputs where it has several of one dtype, which its reference
    returns packed in one flat tensor (each flattened, in order, concatenated: the gate judges
    one tensor, and a plug views the kernel's back into the several); else None."""
    values = [n.meta.get("example_value") for n in r.outs]
    if len(values) < 2 or not all(isinstance(v, torch.Tensor) for v in values) or \
            len({v.dtype for v in values}) != 1:
        return None
    return [tuple(v.shape) for v in values]


def unpack(flat, shapes):
    """A packed output (packed_shapes) as its values: views of it, in order."""
    sizes = [math.prod(s) for s in shapes]
    return tuple(t.view(s) for t, s in zip(flat.split(sizes), shapes))


def region_module(r):
    """The region as a GraphModule of its own: one placeholder per input (activations in0, in1,
    ...; parameters by the region's name for them), its calls copied, its output returned (its
    outputs packed in one flat tensor where it has several: packed_shapes)."""
    graph, env = Graph(), {}
    for i, a in enumerate(r.inputs):
        env[a] = graph.placeholder(f"in{i}")
        env[a].meta = dict(a.meta)
    for n in r.order:
        env[n] = graph.node_copy(n, env.__getitem__)
    outs = [env[n] for n in r.outs]
    if packed_shapes(r):
        outs = [graph.call_function(torch.cat, ([graph.call_function(torch.flatten, (o,))
                                                 for o in outs],))]
    graph.output(outs[0] if len(outs) == 1 else tuple(outs))
    return GraphModule(torch.nn.Module(), graph)


def forward_source(r):
    """The region's forward as Python source, and the globals it needs beyond torch (non-empty:
    the region calls something a standalone file cannot name)."""
    gm = region_module(r)
    code = gm.graph.python_code(root_module="self")
    foreign = sorted(k for k, v in code.globals.items() if k not in SAFE_GLOBALS
                     and not k.startswith("torch") and v is not operator)
    return code.src, foreign


def _stats(t):
    """How a stand-in for a model tensor is drawn: the real one's mean and spread, kept
    non-negative where the real one is (a running variance)."""
    if not t.is_floating_point():
        return {"low": int(t.min()) if t.numel() else 0, "high": int(t.max()) + 1 if t.numel()
                else 1}
    f = t.detach().float()
    mean = float(f.mean()) if f.numel() else 0.0
    std = float(f.std()) if f.numel() > 1 else 0.0
    # A constant (a fresh norm's ones and zeros) is drawn with a spread all the same: drawn
    # constant, a kernel that skips it (the scale, the shift) would pass.
    std = max(std, 0.1 * max(abs(mean), 1.0))
    return {"mean": round(mean, 6), "std": round(std, 6),
            "positive": bool(f.numel() and float(f.min()) >= 0)}


def _draw(shape, dtype, stats):
    shape = tuple(shape)
    if dtype == "bool":
        return f"torch.rand({shape}) < 0.5"
    if "low" in stats:
        return f"torch.randint({stats['low']}, {stats['high']}, {shape}, dtype=torch.{dtype})"
    draw = f"torch.randn({shape}) * {stats['std']} + {stats['mean']}"
    return f"({draw}).abs()" if stats["positive"] else draw


def attribute_name(param, module):
    """A model parameter's name inside the region's Model: relative to the region's module
    ("conv.weight" of "layer1.0" -> conv_weight), else its whole dotted path; an identifier
    either way."""
    if module and param.startswith(module + "."):
        param = param[len(module) + 1:]
    name = re.sub(r"\W", "_", param)
    return f"m{name}" if name[:1].isdigit() else name  # a Sequential's "0.weight": m0_weight


def _names_fx_writes(body):
    """The imports for the bare names FX's code uses for constants (device('cuda', 0), inf)."""
    lines = []
    if re.search(r"\bdevice\(", body):
        lines.append("from torch import device")
    used = [n for n in ("inf", "nan") if re.search(rf"(?<![\w.]){n}\b", body)]
    if used:
        lines.append(f"from math import {', '.join(used)}")
    return lines


def _packed_note(r):
    shapes = packed_shapes(r)
    if not shapes:
        return []
    return ["", f"It returns its {len(shapes)} outputs packed in one flat tensor, each flattened, "
            "in this order:", ", ".join("x".join(map(str, s)) or "scalar" for s in shapes) + ".",
            "The gate judges that one tensor; verify.py views a kernel's back into the",
            "several values the model reads."]


def reference_source(r, seen, origin):
    """A region as a standalone problem file in KernelBench's format: Model holds the region's
    parameters (drawn like the model's own: same shapes, mean and spread) and runs its calls;
    get_inputs() draws its activations the same way; get_init_inputs() is empty. seen:
    observe()'s summaries; origin: the model, for the docstring. None when the calls cannot be
    named outside the model (the reason is in r.problem_note)."""
    body, foreign = forward_source(r)
    if foreign:
        r.problem_note = f"calls {', '.join(foreign)}, which a standalone file cannot name"
        return None
    body = "\n".join(body.strip("\n").splitlines()[1:])  # the def line is written below
    members, args, inits, draws = [], [], [], []
    for i, a in enumerate(r.inputs):
        s = seen.get(a)
        if s is None:
            r.problem_note = f"input {i} is not a tensor"
            return None
        floating = "low" not in s["stats"] and s["dtype"] != "bool"
        value = _draw(s["shape"], "float32" if floating else s["dtype"], s["stats"])
        if s["parameter"] is None:
            args.append(f"in{i}")
            draws.append(value)
            continue
        attr = attribute_name(s["parameter"], r.module)
        members.append(f"in{i} = self.{attr}")
        inits.append(f"self.{attr} = nn.Parameter({value})  # {s['parameter']}"
                     if s["trainable"] else
                     f"self.register_buffer({attr!r}, {value})  # {s['parameter']}")
    where = f"{r.module or 'the forward'} ({r.label})"
    text = ['"""', f"Region {r.label}:{r.id} of {origin}, in {where}: {', '.join(ops_of(r))}.",
            "",
            "Frozen from the forward's captured graph by profile.py: the oracle a region kernel",
            "is judged against. Parameters and inputs are drawn with the real ones' shapes,",
            "means and spreads (verify.py plugs a kernel in with the model's own values).",
            *_packed_note(r), '"""', "import torch", "import torch.nn as nn", *_names_fx_writes(body), "", "",
            "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()"]
    text += [f"        {line}" for line in inits] or ["        pass"]
    text += ["", f"    def forward(self, {', '.join(args)}):"]
    text += [f"        {line}" for line in members]
    text += [f"    {line}".rstrip() for line in body.rstrip().splitlines()]
    text += ["", "", "def get_inputs():", f"    return [{', '.join(draws)}]", "", "",
             "def get_init_inputs():", "    return []", ""]
    return "\n".join(text)
