"""
Region kernels in a model. A region kernel's file holds ModelNew, which computes one region of
the model (autokernel/region_kind.py); the plan names the module instances the region is (the
profile's "instances": "layer1.0", "blocks.1", ...). For each instance, the swap replaces the
module's forward with ModelNew's, run on the instance's own parameters: ModelNew is built once,
and each of its parameters and buffers is the instance's tensor of the same name (the region's
reference names them as regions.attribute_name does: "conv1.weight" -> conv1_weight), passed in
by torch.func.functional_call at every call, so a trained model's values are the ones used.
Only where ModelNew keeps a tensor in another layout (a starter's convolution weights in
channels_last) is the instance's tensor copied, once, into that layout.

The first call of each instance with inputs of a new signature (shapes, strides, dtypes, other
arguments) runs both the module's own forward and ModelNew on the same inputs, in eager mode:
where the outputs differ beyond the dtype's tolerance (or ModelNew does not take these inputs),
the instance keeps its own forward for good and the reason is counted as the kernel's fallback;
where they agree, ModelNew runs from then on, each call counted. Where the region is all a child
module computes (a torch.nn conv in a block that also runs a kernel type: profile.json's
"plug"), that child's forward is the one replaced, its tensors named as the region's module
names them. ModelNew's inputs are made contiguous first (as_drawn), as its reference drew them,
unless it computes the same on them as they come (laid_out_for: checked once per layout).

A region that is only part of a forward (plug null: a written-out GELU between two linears, a
DoubleConv's half before a softmax) is plugged into the forward's captured graph instead
(autokernel/swap_graph.py finds it there by its id and calls graph_call in its place), as is a
region kernel named without a plan. A region kernel none of whose instances could be plugged is
"not plugged" in verify.py's report (with the reasons), not a failure, unless a forward's
graph with it in disagreed with the forward's own (a wrong kernel: a failure, as any kernel's).

Inside torch.compile (a compiled swap: verify.py runs the model once eagerly inside the swap,
then compiles it), each instance's forward is traced by Dynamo and calls the kernel's custom op
(autokernel/ops.py, region_op) on its tensors, one opaque node: the op's body is ModelNew on the
instance's tensors as above, its fake gives the outputs the eager call saw. Only inputs whose
signature (shapes, strides, dtypes, other arguments) an eager call ran go through the op;
any other runs the module's own forward in the graph.
"""
import itertools
import math

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from autokernel import ops
from autokernel.kernel_types import TOLERANCES
from autokernel.regions import attribute_name, unpack


def patches(swap, model):
    """[(module, "forward", replacement)] for each instance of each region kernel of the swap
    found in the model; an instance the model does not have is a fallback with its reason."""
    found, current = [], {}  # module -> its forward so far (two regions of one forward chain)
    names = dict(model.named_modules())
    for kernel in swap.regions:
        if kernel.plug is None:  # part of a forward: the graph swap's (graph_call)
            continue
        for path in kernel.instances:
            module = names.get(kernel.site(path))
            if module is None:
                swap.fallback(kernel.name, f"the model has no module {kernel.site(path)!r}")
                continue
            new = instance_forward(swap, kernel, module, path,
                                   current.get(id(module), module.forward))
            current[id(module)] = new
            found.append((module, "forward", new))
    return found


def instance_forward(swap, kernel, module, path, original):
    """The instance's forward with the region kernel in it (module docstring); original: the
    forward it replaces (another region kernel's, where two are planned for one module)."""
    # checked: input signature -> its frame (None: ModelNew's output is the forward's);
    # packed: input signature -> how ModelNew's one tensor packs the forward's several (packing)
    state = {"checked": {}, "why": None, "new": None, "tensors": None, "ops": {}, "bodies": [],
             "packed": {}, "layouts": {}}

    def tensors():
        """ModelNew's parameters and buffers by name -> the instance's own tensors."""
        site = kernel.site(path)
        own = {attribute_name(f"{site}.{n}" if site else n, path): t
               for n, t in [*module.named_parameters(), *module.named_buffers()]}
        mine = dict([*state["new"].named_parameters(), *state["new"].named_buffers()])
        wanted = list(mine)
        missing = [n for n in wanted if n not in own]
        if missing:
            return None, f"the module has no tensor for ModelNew.{missing[0]}"
        return {n: in_layout(own[n], mine[n]) for n in wanted}, None

    def call(args, kwargs):
        return torch.func.functional_call(state["new"], state["tensors"], args, kwargs)

    def run(args, kwargs, key):
        out = call(*laid_out_for(state["layouts"], call, args, kwargs, key))
        packed = state["packed"].get(key)
        return out if packed is None else in_forward_order(out, *packed)

    def forward(*args, **kwargs):
        key = signature(args, kwargs)
        if torch.compiler.is_compiling():  # traced by Dynamo: the op of these inputs, if any
            call = state["ops"].get(key)
            return original(*args, **kwargs) if call is None else call(args, kwargs)
        if state["why"] is not None:
            return original(*args, **kwargs)
        if key not in state["checked"]:  # (None: arguments of other kinds, checked once)
            why, want, got = check(args, kwargs, key)
            if why is not None:  # the forward's own output, not a second run of it
                state["why"] = why
                swap.fallback(kernel.name, f"at {kernel.site(path) or 'the model'}: {why}")
                return original(*args, **kwargs) if want is None else want
            out = count(got)
        else:
            out = count(run(args, kwargs, key))
        if swap.compiled and key is not None and key not in state["ops"]:
            state["ops"][key] = compiled_call(args, kwargs, out, key)
        return framed(out, state["checked"][key])

    def count(out):
        swap.calls[kernel.name] += 1
        swap.shapes[kernel.name].add(kernel.site(path) or "the model")
        return out

    def compiled_call(args, kwargs, out, key):
        """call(args, kwargs) for the compiled forward: the region op on the inputs' tensors,
        its outputs put back in the structure ModelNew returned, in the forward's frame."""
        frame = state["checked"][key]
        leaves, spec = tree_flatten((args, kwargs))
        slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        outs, out_spec = tree_flatten(out)

        def body(tensors):
            filled = list(leaves)
            for i, t in zip(slots, tensors):
                filled[i] = t
            return tree_flatten(count(run(*tree_unflatten(filled, spec), key)))[0]
        state["bodies"].append(body)  # ops.py holds it weakly
        key, op = ops.region_call(body, outs), ops.region_op(kernel)

        def call(args, kwargs):
            tensors = [v for v in tree_flatten((args, kwargs))[0] if isinstance(v, torch.Tensor)]
            return framed(tree_unflatten(op(tensors, key), out_spec), frame)
        return call

    def check(args, kwargs, key):
        """(why not, or None where ModelNew computes what the instance's forward does on these
        inputs (their frame recorded); the forward's output, ModelNew's), each None where it
        did not run. The forward runs once: a module that is the whole model runs the model."""
        if state["new"] is None:
            try:
                first = next(t for t in [*module.parameters(), *module.buffers()])
                state["new"] = kernel.fn().to(device=first.device, dtype=first.dtype)
            except StopIteration:
                state["new"] = kernel.fn()
            except Exception as e:  # noqa: BLE001  (the kernel's own failure, named)
                return f"ModelNew() raised {type(e).__name__}: {e}", None, None
            state["tensors"], why = tensors()
            if why:
                return why, None, None
        want = original(*args, **kwargs)
        try:
            got = run(args, kwargs, key)
            if isinstance(got, torch.Tensor) and isinstance(want, (tuple, list)) and \
                    len(want) > 1 and all(isinstance(w, torch.Tensor) for w in want):
                state["packed"][key] = packing(got, want)  # several: ModelNew packs them
                got = type(want)(in_forward_order(got, *state["packed"][key]))
        except Exception as e:  # noqa: BLE001
            return (f"ModelNew does not take this forward's inputs ({type(e).__name__}: "
                    f"{str(e)[:120]}): the region is only part of the module's forward",
                    want, None)
        frame = frame_of(got, want)
        why = disagreement(got, want if frame is None else want[frame[2]])
        if why is None:
            state["checked"][key] = frame
        return why, want, got

    return forward


def packing(got, want):
    """How a packed output (regions.packed_shapes) holds the forward's several values: (their
    shapes, the order they are packed in). The reference packs them in the order of the model's
    graph, which can differ from the order the forward returns them (an LSTM cell's c before
    h): the order whose values match the forward's at this call, else the forward's own."""
    shapes = [tuple(w.shape) for w in want]
    if got.numel() == sum(math.prod(s) for s in shapes):
        for order in itertools.permutations(range(len(want))) if len(want) <= 5 else ():
            if disagreement(in_forward_order(got, shapes, order), want) is None:
                return shapes, order
    return shapes, tuple(range(len(want)))


def in_forward_order(out, shapes, order):
    """A packed output as the forward's values: views of it, in the forward's order (packing);
    ModelNew's output as it is where it does not hold them."""
    if not isinstance(out, torch.Tensor) or out.numel() != sum(math.prod(s) for s in shapes):
        return out
    parts, values = unpack(out, [shapes[i] for i in order]), [None] * len(order)
    for i, part in zip(order, parts):
        values[i] = part
    return tuple(values)


def as_drawn(value):
    """An activation as the region's reference draws its inputs, and so as the kernel was judged
    on: contiguous (a copy where the model's is not: an expanded class token, a transposed
    view)."""
    return value.contiguous() if isinstance(value, torch.Tensor) else value


def laid_out_for(taken, call, args, kwargs, key=None):
    """(args, kwargs) for ModelNew: as they come where it takes them so, else as drawn. Whether
    it does is decided once per layout of the inputs (shapes and strides), at the first call:
    where some input is not contiguous (a previous block's kernel left it channels_last, say),
    ModelNew runs on it as it comes and as drawn, and takes it as it comes from then on if the
    two agree (a starter's convolution block takes NCHW or NHWC: two copies saved a block).
    taken: the decisions so far, by layout; key: the inputs' signature where the caller has it
    (a region's call is on the model's hot path)."""
    if key is None:
        key = tuple((tuple(v.shape), v.stride()) for v in tree_flatten((args, kwargs))[0]
                    if isinstance(v, torch.Tensor))
    if key not in taken:
        leaves = tree_flatten((args, kwargs))[0]
        taken[key] = all(v.is_contiguous() for v in leaves if isinstance(v, torch.Tensor))
        if not taken[key]:
            try:
                taken[key] = disagreement(call(args, kwargs),
                                          call(*tree_map(as_drawn, (args, kwargs)))) is None
            except Exception:  # noqa: BLE001  (it does not take them: as drawn, then)
                taken[key] = False
    return (args, kwargs) if taken[key] else tree_map(as_drawn, (args, kwargs))


def in_layout(t, like):
    """The instance's tensor, or, where ModelNew holds its own in another layout (a
    convolution's weight in channels_last), a copy of it in that layout."""
    if t.shape != like.shape or t.stride() == like.stride():
        return t
    with torch.no_grad():
        return torch.empty_strided(t.shape, like.stride(), dtype=t.dtype,
                                   device=t.device).copy_(t)


def graph_call(swap, kernel, names, where, packed=None):
    """The function a rewritten graph calls in place of a region's nodes (autokernel/
    swap_graph.py): ModelNew on the region's inputs, input i being ModelNew's tensor names[i]
    (one of the model's parameters or buffers, read by the graph at every call) or, where
    names[i] is None, the next argument of its forward; a region of several outputs (packed:
    their shapes) returns them packed in one tensor, viewed back into the several here
    (regions.unpack). Calls are counted at `where`; inside
    torch.compile it is the kernel's custom op, whose fake gives the outputs its first eager
    call saw (the graph swap traces only graphs whose first call ran eagerly)."""
    state = {"new": None, "key": None, "spec": None, "copies": {}, "layouts": {}}

    def run(inputs):
        if state["new"] is None:  # in the dtype of its parameters, else of its float inputs
            floats = [t for t, n in sorted(zip(inputs, names), key=lambda p: p[1] is None)
                      if isinstance(t, torch.Tensor) and t.is_floating_point()]
            new = kernel.fn().to(device=inputs[0].device,
                                 dtype=floats[0].dtype if floats else None)
            mine = dict([*new.named_parameters(), *new.named_buffers()])
            missing = [n for n in mine if n not in names]
            if missing:
                raise RuntimeError(f"ModelNew.{missing[0]} is none of the region's tensors")
            state["new"], state["mine"] = new, mine  # (built and checked once: a hot path)
        mine = state["mine"]
        tensors = {n: laid_out(t, mine[n]) for n, t in zip(names, inputs) if n in mine}
        args = tuple(t for t, n in zip(inputs, names) if n is None)

        def call(args, kwargs):
            return torch.func.functional_call(state["new"], tensors, args, kwargs)
        return call(*laid_out_for(state["layouts"], call, args, {}))

    def laid_out(t, like):
        """in_layout, its copy made again only when the tensor has changed (a training step)."""
        kept = state["copies"].get(id(t))
        if kept is None or kept[0] is not t or kept[1] != t._version:
            kept = state["copies"][id(t)] = (t, t._version, in_layout(t, like))
        return kept[2]

    def body(tensors):
        swap.calls[kernel.name] += 1
        return tree_flatten(run(tensors))[0]

    def region(*inputs):
        if torch.compiler.is_compiling():
            if state["key"] is None:  # a swap that is not compiled, inside torch.compile
                return unpacked(run(inputs))
            outs = state["op"](list(inputs), state["key"])
            return unpacked(tree_unflatten(outs, state["spec"]))
        out = run(inputs)
        swap.calls[kernel.name] += 1
        swap.shapes[kernel.name].add(where)
        if swap.compiled and state["key"] is None:  # (ops.py holds body weakly; this closure
            leaves, state["spec"] = tree_flatten(out)  # keeps it)
            state["key"], state["op"] = ops.region_call(body, leaves), ops.region_op(kernel)
        return unpacked(out)

    def unpacked(out):
        return unpack(out, packed) if packed and isinstance(out, torch.Tensor) else out
    return region


def frame_of(got, want):
    """Where the forward returns ModelNew's tensor beside plain values (Swin's patch embeddings:
    (embeddings, (height, width))): (the forward's sequence type, its items, the tensor's
    place); else None. The plain values are the forward's own for inputs of that signature."""
    if not isinstance(want, (tuple, list)) or not isinstance(got, torch.Tensor):
        return None
    places = [i for i, w in enumerate(want) if isinstance(w, torch.Tensor)]
    if len(places) != 1 or not all(_plain(w) for i, w in enumerate(want) if i != places[0]):
        return None
    return type(want), list(want), places[0]


def _plain(value):
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def framed(out, frame):
    if frame is None:
        return out
    kind, items, place = frame
    items = list(items)
    items[place] = out
    return kind(items)


def signature(args, kwargs):
    """What a compiled call is keyed by: each tensor's shape, strides and dtype and every other
    argument's value (a region kernel is specialized to its shapes); None for an argument of
    another kind (such a forward keeps its own code inside torch.compile)."""
    leaves, spec = tree_flatten((args, kwargs))
    key = [len(args), tuple(kwargs)]
    for v in leaves:
        if isinstance(v, torch.Tensor):  # a size-1 dim's stride is any (traced or not)
            key.append((tuple(v.shape), tuple(st if n > 1 else 0
                                              for n, st in zip(v.shape, v.stride())), v.dtype))
        elif _plain(v):
            key.append(v)
        else:
            return None
    return tuple(key)


def disagreement(got, want):
    """None where got matches want within the dtype's tolerance (atol in units of the output's
    RMS, the gate's rule), else why not."""
    pairs = list(zip(got, want)) if isinstance(want, (tuple, list)) and \
        isinstance(got, (tuple, list)) and len(got) == len(want) else [(got, want)]
    for g, w in pairs:
        if not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor) or \
                g.shape != w.shape:
            return ("its output is not the module's (another shape or structure): the region "
                    "is only part of the module's forward")
        tol = TOLERANCES.get(w.dtype, TOLERANCES[torch.float32])
        w64, g64 = w.double(), g.double()
        rms = float(w64.pow(2).mean().sqrt()) if w.numel() else 0.0
        worst = float(((g64 - w64).abs() - tol * w64.abs()).max()) if w.numel() else 0.0
        if worst > tol * max(rms, 1e-30):
            return ("its output differs from the module's forward beyond the tolerance: the "
                    "region is only part of the module's forward, or the kernel is wrong")
    return None
