"""
Kernels plugged into computations a model writes out as torch ops: attention spelled q @ k^T, a
mask, softmax, @ v, which no torch entry point (F.scaled_dot_product_attention) and no module
class leads to. The profile recognizes them by what they compute (autokernel/patterns.py on a
graph TorchDynamo captured); this swap uses the same recognizer to put the type's kernel there.
Region kernels whose region is only part of a forward (a written-out GELU between two linears)
are plugged the same way: the graph's regions are cut as the profile cut the model's and the
kernel's is found by its id (a "type" named "region:<id>" below).

How, inside `swap.installed(model)` while a type of GRAPH_RULES or such a region is active:
  * Discovery: at the model's first forward (per input signature, while the first found any)
    its forward is captured once with every patch of the swap taken out (the model's own code)
    and matched by the patterns. Each match of a GRAPH_RULES type belongs to the innermost module
    instance all its nodes ran in, a region to the module it was cut in; that instance's forward
    is replaced for the length of the block. Where instances nest (a region in the model's own
    forward, attention in a block), the outer one's graph plugs the inner ones' matches too; the
    inner forwards run where the outer one could not be captured.
  * Capture: the instance's first call with given inputs (their shapes, strides, dtypes, the
    other arguments' values, train or eval) captures its forward as ONE graph (a graph break is
    a fallback), the patches again taken out. Each graph input is read at every call from where
    Dynamo found it (an argument, a parameter or buffer of the module, by its path), so the
    instance's current tensors are the ones used.
  * Rewrite: each match's output is replaced by one call of the rule's function on the match's
    operands (flash_attention: q, k and v as the pattern recorded them, k and v before a
    grouped-query repeat, causal from the match's variant, the scale the scores are multiplied
    by; a region: its inputs, ModelNew run on them by swap_regions.graph_call); the rest of the
    match is dead code and goes. That function calls swap.run, as the SDPA rule's handler does:
    calls counted, the kernel's output checked, its custom op inside torch.compile. Calls of
    the torch entry points other rules patch (F.linear, ...) look the entry point up at call
    time, so those rules still see them.
  * Check: the first call of each input signature runs the module's own forward and the
    rewritten one on the same inputs (the calls of the former not counted) and compares them at
    the dtype's tolerance (swap_regions.disagreement). On disagreement, or any failure to
    capture or rewrite, the instance keeps its own forward for that signature and the reason is
    the type's fallback ("at attn: ..."); a kernel that raises is a KernelFailure, as anywhere.
    Inputs of another signature are captured and checked anew (at most MAX_SIGNATURES per
    instance, then its own forward): a graph is never run on inputs it was not captured for.

Not plugged, with the reason: a match the kernel cannot take (cross attention, a mask that is
not causal: the pattern's note); a mask computed from the forward's arguments (an attention
mask a caller passes may change its values from call to call, the graph would not see it; a
mask from the module's buffers or built in the forward is the constant it was at capture); a
forward that changes a module attribute (the graph would not redo it) or writes an argument or a
module's tensor in place (the first call's comparison would do it twice); an argument of another
kind than tensors and plain values (a KV-cache object); an instance one of whose submodules
another rule swaps at module level (the graph would run that submodule's own code instead of its
kernel); a computation whose inner values the instance's forward reads elsewhere (attention
probabilities it returns). A region kernel that replaces the forward of the instance or of a
submodule of it is plugged into the graph where the graph holds its region, else gives way.
Where a previous kernel left an input in another layout than the profile saw (a starter's
channels_last), the graph as it comes is cut into other regions; the forward's graph on
contiguous copies of its inputs is then the one rewritten, and run on such copies.

Inside torch.compile (a compiled swap: verify.py runs the model once eagerly inside the swap,
which checks each instance, then compiles it): Dynamo traces the replaced forward, finds the
checked graph for the inputs' signature and inlines it, the kernel call one custom op; a
signature never checked eagerly runs the module's own forward. The model's captured graphs are
kept per model and instance (weakly) across swaps: a second swap of the same model only
rewrites and checks.
"""
import contextlib
import copy
import operator
import weakref
from dataclasses import dataclass

import torch
from torch.fx import Graph, GraphModule
from torch.utils import _pytree as pytree

from autokernel import graph_trace
from autokernel.cli import describe
from autokernel.fx_vocabulary import VIEWS, mutates, through
from autokernel.kernel_call import FLOAT_DTYPES, KernelFailure
from autokernel.matches import find_matches
from autokernel.patching import applying, capturing, suspended
from autokernel.patterns import PATTERNS
from autokernel.regions import attribute_name, find_regions, module_path, packed_shapes
from autokernel.swap_regions import as_drawn, disagreement, graph_call
from autokernel.swap_torch import attention_heads

MAX_SIGNATURES = 4  # input signatures captured per model or instance; beyond: its own forward


@dataclass(frozen=True)
class GraphRule:
    """How a kernel type's kernel replaces a match of its pattern. plan(match, inputs) says,
    from the captured graph alone, what the call takes: a Plug's operands (names of the match's
    nodes the call reads) and params, or why no kernel can (inputs: the graph's nodes whose value
    comes from the forward's arguments). call(swap, params) is the function the rewritten graph
    calls with the operands."""
    plan: object
    call: object


@dataclass
class Plug:
    ktype: str          # a GRAPH_RULES type, or "region:<id>" (a region kernel's region)
    outputs: tuple      # the match's output nodes, whose readers read the call's instead
    operands: tuple     # node names, the call's arguments in order
    params: dict        # the rule's constants for the call
    nodes: tuple        # the match's nodes, dead once the call replaces them


# ---------------------------------------------------------------------------------------------
# The rules: one entry per kernel type that a graph swap plugs in
# ---------------------------------------------------------------------------------------------

def _attention_plan(m, inputs):
    """flash_attention for attention written out (patterns.attention's match)."""
    if m.shape is None:
        return m.note or "outside the kernel's contract"
    o = m.operands
    q, k, v, mask = o.get("q"), o.get("k"), o.get("v"), o.get("mask")
    if k is None or v is None:
        return "keys and values repeated for grouped-query heads in different ways"
    if mask is not None and _reads(mask, inputs):
        return ("its mask is computed from the forward's arguments: the mask's values may "
                "differ from call to call, the kernel's causal flag would not")
    qv, kv, vv, out = (n.meta.get("example_value") for n in (q, k, v, m.output))
    if not all(isinstance(t, torch.Tensor) for t in (qv, kv, vv, out)):
        return "q, k, v or the output without an example value"
    if qv.dtype not in FLOAT_DTYPES or kv.dtype != qv.dtype or vv.dtype != qv.dtype:
        return f"q, k, v in {qv.dtype}, {kv.dtype}, {vv.dtype}: outside the contract"
    if qv.dim() == 3:  # batched heads, [B*H, S, D]: the kernel's [B, H, S, D] with H = 1
        ok = qv.shape == kv.shape == vv.shape
    else:
        ok = qv.dim() == 4 and kv.shape == vv.shape and kv.shape[0] == qv.shape[0] \
            and kv.shape[2:] == qv.shape[2:] and qv.shape[1] % kv.shape[1] == 0
    if not ok or out.shape != qv.shape:
        return "q, k, v shapes outside the contract"
    return Plug("flash_attention", (m.output.name,), (q.name, k.name, v.name),
                {"causal": m.variant.get("causal", True), "scale": float(o["scale"]),
                 "dtype": out.dtype, "batched": qv.dim() == 3},
                tuple(n.name for n in m.nodes))


def _attention_call(swap, params):
    causal, scale, dtype, batched = (params[k] for k in ("causal", "scale", "dtype", "batched"))

    def flash_attention(q, k, v):
        if batched:
            q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        busy, swap.busy = swap.busy, True  # the glue's torch calls pass the swap's patches by
        try:
            out = swap.run("flash_attention", Q=attention_heads(q), K=attention_heads(k),
                           V=attention_heads(v), causal=causal, scale=scale)
        finally:
            swap.busy = busy
        out = out.squeeze(1) if batched else out
        return out if out.dtype == dtype else out.to(dtype)
    return flash_attention


# A computation another pattern recognizes (a written-out softmax, a norm, ...) is plugged in by
# an entry here: its pattern records the match's operands, plan says what the call takes.
GRAPH_RULES = {"flash_attention": GraphRule(_attention_plan, _attention_call)}

# A region kernel (a ModelNew for a piece of the model's own code) is plugged in where a graph
# computes its region: the graph's regions are cut as the profile cut the model's
# (regions.find_regions), found by id, and each replaced by one call of the kernel's ModelNew
# on the region's inputs (swap_regions.graph_call).
REGION = "region:"


def region_keys(swap, graph_only=False):
    """{"region:<id>": kernel} for the swap's region kernels (the first of two for one region);
    graph_only: those planned into the graph of a forward they are only part of (the others
    replace whole forwards, swap_regions.patches, unless a graph holding them is rewritten)."""
    return {REGION + k.region_id: k for k in reversed(swap.regions)
            if k.region_id and (k.plug is None or not graph_only)}


def _region_plugs(gm, example, matches, names):
    """A Plug for each region of a captured graph: its inputs the operands, each of the
    model's parameters and buffers among them named as the region's reference names it.
    names: the model's modules by path."""
    model = names[""]
    modules = {str(id(m)): path for path, m in names.items()}
    params = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    value = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), example))
    plugs = []
    for r in find_regions(gm, matches, type(model).__name__, modules):
        owned = [params.get(id(value[a])) if a in value else None for a in r.inputs]
        plugs.append(Plug(REGION + r.id, tuple(n.name for n in r.outs),
                          tuple(a.name for a in r.inputs),
                          {"names": [attribute_name(t, r.module) if t else None for t in owned],
                           "where": r.module or "the model", "packed": packed_shapes(r)},
                          tuple(n.name for n in r.order)))
    return plugs


def _call(swap, plug):
    """The function the rewritten graph calls in place of the plug's nodes."""
    if plug.ktype.startswith(REGION):
        return graph_call(swap, region_keys(swap)[plug.ktype], plug.params["names"],
                          plug.params["where"], plug.params["packed"])
    return GRAPH_RULES[plug.ktype].call(swap, plug.params)


def _label(swap, ktype):
    """The name fallbacks are reported under: the type's, a region's kernel's."""
    kernel = region_keys(swap).get(ktype)
    return kernel.name if kernel else ktype


def _reads(n, nodes, depth=0):
    """Whether node n's value depends on any of `nodes`."""
    return n in nodes or depth < 64 and any(_reads(a, nodes, depth + 1)
                                            for a in n.all_input_nodes)


# ---------------------------------------------------------------------------------------------
# The swap: discovery at the model's first forward, each instance's forward replaced
# ---------------------------------------------------------------------------------------------

# model -> {types wanted: {input signature: {path: [(type, note)]}}}
_DISCOVERED = weakref.WeakKeyDictionary()
_CAPTURED = weakref.WeakKeyDictionary()    # instance -> {signature: Capture or why not}


@contextlib.contextmanager
def installed(swap, model, applied, entry_points):
    """The graph swap inside swap.installed: the model's forward wrapped to discover at its
    first call; applied: the patches of the other rules (patching.applying's list), taken out
    while a graph is captured; entry_points: the (owner, attribute) pairs rules patch."""
    ktypes = [t for t in GRAPH_RULES if swap.active(t)] + list(region_keys(swap, graph_only=True))
    if not ktypes:
        yield
        return
    lists = [applied]  # every patch set, this swap's own too: taken out for a capture
    done = set()       # instance paths replaced
    names = dict(model.named_modules())
    root = {"forward": model.forward}

    def forward(*args, **kwargs):
        if not capturing():
            everywhere = _discover(model, args, kwargs, lists, ktypes)
            for path, found in everywhere.items():
                if path not in done:
                    done.add(path)
                    inner = {t for p, f in everywhere.items() if _inside(p, path)
                             for t, why in f if not why}
                    replace(path, found, inner)
        return root["forward"](*args, **kwargs)

    def replace(path, found, inner):
        """found: [(type, why not or "")] for the matches at path (_discover); inner: the types
        of those inside it that a kernel can take, which its graph holds too."""
        module = names.get(path)
        mine = [t for t, why in found if not why]
        for t, why in found:
            if why:
                swap.fallback(_label(swap, t), f"at {path or 'the model'}: {why}")
        if module is None or not mine:  # nothing a kernel can take: no capture needed
            return
        own = root["forward"] if module is model else module.forward
        new = instance_forward(swap, module, own, path, mine, inner, lists, entry_points, names)
        if module is model:
            root["forward"] = new
        else:
            lists.append(stack.enter_context(applying([(module, "forward", new)])))

    with contextlib.ExitStack() as stack:
        lists.append(stack.enter_context(applying([(model, "forward", forward)])))
        yield


def _discover(model, args, kwargs, lists, wanted):
    """{module path: [(type, note or "")]} for the matches of the `wanted` GRAPH_RULES types
    and regions ("region:<id>") in the model's forward on these inputs (cached per model, input
    signature and wanted), by the innermost module their nodes ran in (a region's: the module
    it was cut in). {} when it cannot tell."""
    summary = graph_trace.summary((args, kwargs))  # (the root's flag only: at every forward)
    key = None if summary is None else (summary, model.training)
    seen = _DISCOVERED.setdefault(model, {}).setdefault(frozenset(wanted), {})
    # A model whose first forward writes none of them out is not traced again for each new
    # shape (a generation's steps): a trace of the whole model costs seconds.
    if key is None or key in seen or len(seen) >= MAX_SIGNATURES \
            or (seen and not any(seen.values())):
        return seen.get(key, {})
    seen[key] = {}
    modules = {str(id(m)): name for name, m in model.named_modules()}
    found = {}

    def backend(gm, example_inputs):
        matches = find_matches(gm, example_inputs, PATTERNS, type(model).__name__)
        for m in matches:
            if m.ktype in wanted and m.modules:
                k, (source, _) = m.modules[-1]
                path = modules.get(k, module_path(source))
                found.setdefault(path, []).append((m.ktype, "" if m.shape else m.note))
        if any(t.startswith(REGION) for t in wanted):
            for r in find_regions(gm, matches, type(model).__name__, modules):
                if REGION + r.id in wanted:
                    found.setdefault(r.module, []).append((REGION + r.id, ""))
        return gm.forward

    try:
        with suspended(*lists):
            graph_trace.trace(model, args, kwargs, backend, fullgraph=False)
    except Exception:  # noqa: BLE001  (a model Dynamo cannot run: nothing to plug by graph)
        return {}
    seen[key] = found
    return found


def _inside(path, outer):
    return path != outer and (outer == "" or path.startswith(outer + "."))


def instance_forward(swap, module, original, path, ktypes, inner, lists, entry_points, names):
    """The instance's forward with the kernels in its graph (module docstring); original: the
    forward it replaces; inner: the types (and regions) of the instances inside it, plugged in
    where its graph holds them (each of those instances has a replaced forward of its own,
    which runs where this one's graph could not be used)."""
    where = path or "the model"
    plans = {}  # signature -> the rewritten forward, or None: the module's own

    def forward(*args, **kwargs):
        key = graph_trace.signature(module, args, kwargs)
        run = plans.get(key) if key is not None else None
        if run is not None:
            return run(args, kwargs)
        if key is None:
            key = ("an argument of another kind", graph_trace.odd_argument((args, kwargs)))
            if key not in plans and not capturing():
                plans[key] = None
                refuse(f"an argument of type {key[1]}: a graph is captured for tensors, "
                       "numbers, strings and None (and tuples, lists, dicts of them)")
            return original(*args, **kwargs)
        if key in plans or capturing():
            return original(*args, **kwargs)
        plans[key] = None
        if len(plans) > MAX_SIGNATURES:
            return refuse(f"inputs of more than {MAX_SIGNATURES} signatures: the rest run "
                          "its own forward", args, kwargs)
        why = _taken(swap, module, path, lists, names)
        try:
            run, plugged, left = (None, why, []) if why else _plan(args, kwargs, key)
            if _regions_missing(run, plugged, left) and not _contiguous((args, kwargs)):
                # the profile cut its regions where the inputs came contiguous; a previous
                # kernel may leave them in another layout (channels_last): this forward's graph
                # on contiguous copies holds those regions, and runs on such copies
                drawn = pytree.tree_map(as_drawn, (args, kwargs))
                again = _plan(*drawn, graph_trace.signature(module, *drawn))
                if again[0] is not None and len(again[1]) > (len(plugged) if run else 0):
                    run, plugged, left = _on_drawn(again[0]), again[1], again[2]
        except Exception as e:  # noqa: BLE001
            return refuse(f"its graph could not be rewritten ({describe(e, 160)})", args, kwargs)
        if run is None:
            return refuse(plugged, args, kwargs)
        # Neither the module's own forward, run to compare with, nor a rewritten one that
        # fails the comparison counts as a call of the kernels in it.
        counts = _counts(swap)
        want = original(*args, **kwargs)
        _restore(swap, counts)
        try:
            got = run(args, kwargs)
        except KernelFailure:
            raise
        except Exception as e:  # noqa: BLE001
            _restore(swap, counts)
            return refuse(f"the rewritten forward raised {describe(e, 160)}", args, kwargs)
        why = _disagreement(got, want)
        if why:
            _restore(swap, counts)
            return refuse(f"the forward with {', '.join(_label(swap, t) for t in plugged)} "
                          f"differs from its own: {why}", args, kwargs, want)
        plans[key] = run
        for t, why in left:  # another match in the same graph, which stays torch
            swap.fallback(_label(swap, t), f"at {where}: {why}")
        _regions_give_way(swap, module, path, names, plugged)
        return got

    def refuse(why, args=None, kwargs=None, out=None):
        for t in ktypes:
            swap.fallback(_label(swap, t), f"at {where}: {why}")
        if args is not None:
            return original(*args, **kwargs) if out is None else out

    def _plan(args, kwargs, key):
        """_rewritten's (run, plugged, left) for the graph of this signature, or (None, why,
        []) where no graph can be captured."""
        capture = _captured(module, key, args, kwargs, lists, entry_points, names)
        if isinstance(capture, str):
            return None, capture, []
        return _rewritten(swap, module, capture, ktypes,
                          (set(inner) | set(region_keys(swap))) - set(ktypes))

    return forward


def _regions_missing(run, plugged, left):
    """Whether a region wanted here is not in the graph as the profile cut it (_rewritten's
    answer: plugged is why not where run is None)."""
    if run is None:
        return NOT_AS_CUT in plugged
    return any(t.startswith(REGION) and why.startswith(NOT_AS_CUT) for t, why in left)


def _contiguous(v):
    return all(t.is_contiguous() for t in pytree.tree_leaves(v) if isinstance(t, torch.Tensor))


def _on_drawn(run):
    """run, given contiguous copies of the tensor arguments (swap_regions.as_drawn)."""
    return lambda args, kwargs: run(*pytree.tree_map(as_drawn, (args, kwargs)))


def _taken(swap, module, path, lists, names):
    """Why not, when another rule replaced the forward of the instance or a submodule of it
    (a region kernel's excepted: it gives way)."""
    regions = {id(names.get(k.site(p))) for k in swap.regions for p in k.instances}
    forwards = {id(owner) for a in lists[:1] for owner, attr, _, _ in a if attr == "forward"}
    for name, sub in module.named_modules():
        if id(sub) in forwards and id(sub) not in regions:
            what = f"its submodule {name}'s" if name else "its"
            return (f"{what} forward is another kernel's swap: the graph would run that "
                    "module's own code instead of its kernel")
    return None


def _regions_give_way(swap, module, path, names, plugged):
    """A region kernel that replaces the forward of a module inside this graph's instance, and
    whose region the graph does not hold as the profile cut it, does not run there."""
    inside = {id(m) for m in module.modules()}
    for k in swap.regions:
        if k.plug is None or REGION + k.region_id in plugged:
            continue
        for p in map(k.site, k.instances):
            if id(names.get(p)) in inside:
                swap.fallback(k.name, f"at {p or 'the model'}: inside {path or 'the model'}, "
                              "whose forward runs as a graph with "
                              f"{', '.join(_label(swap, t) for t in plugged)} plugged in: the "
                              "region is only part of that forward")


_COUNTED = ("calls", "folded", "normed", "shapes", "fallbacks", "skipped", "notes")


def _counts(swap):
    return {a: copy.deepcopy(getattr(swap, a)) for a in _COUNTED}


def _restore(swap, counts):
    """The counts as they were; a reason first given since (by an instance inside this one, whose
    own first call ran in the forward compared with) is kept."""
    for a, v in counts.items():
        v = copy.deepcopy(v)
        if a in ("fallbacks", "skipped"):
            for t, reasons in getattr(swap, a).items():
                for why, n in reasons.items():
                    v[t].setdefault(why, n)
        setattr(swap, a, v)


def _disagreement(got, want):
    g, g_spec = pytree.tree_flatten(got)
    w, w_spec = pytree.tree_flatten(want)
    if g_spec != w_spec:
        return "its output has another structure"
    tensors = [(a, b) for a, b in zip(g, w) if isinstance(b, torch.Tensor)]
    return disagreement([a for a, _ in tensors], [b for _, b in tensors]) if tensors else None


# ---------------------------------------------------------------------------------------------
# Capture and rewrite
# ---------------------------------------------------------------------------------------------

OUTPUT = object()  # a Capture's output leaf that the graph computes
NOT_AS_CUT = "its region is not in the graph of this forward as the profile cut it"


@dataclass
class Capture:
    gm: GraphModule   # the instance's forward as Dynamo captured it: the model's own code
    sources: list     # per graph input: where to read it, steps from {module, args, kwargs}
    plugs: list       # [Plug, or (type, why not)] per match of a GRAPH_RULES type
    entries: dict     # call node name -> (owner, attribute): an entry point rules patch
    out_spec: object  # the forward's output structure (pytree) ...
    out_leaves: list  # ... its leaves: OUTPUT where a graph output goes, else the value


def _captured(module, key, args, kwargs, lists, entry_points, names):
    """The instance's Capture for this signature (cached), or why none."""
    cache = _CAPTURED.setdefault(module, {})
    if key not in cache:
        try:
            with suspended(*lists):
                cache[key] = _capture(module, args, kwargs, entry_points, names)
        except Exception as e:  # noqa: BLE001
            cache[key] = f"its forward could not be captured ({describe(e, 160)})"
    return cache[key]


def _capture(module, args, kwargs, entry_points, names):
    graphs = []

    def backend(gm, example_inputs):  # Dynamo drops the inputs' sources once it is done
        sources = [graph_trace.steps(n) for n in gm.graph.nodes if n.op == "placeholder"]
        graphs.append((gm, list(example_inputs), sources))
        return gm.forward

    before = graph_trace.attributes(module)
    try:
        result = graph_trace.trace(module, args, kwargs, backend, fullgraph=True)
    except Exception as e:  # noqa: BLE001
        return f"its forward does not trace as one graph ({describe(e, 160)})"
    if graph_trace.attributes(module) != before:
        return "its forward sets module attributes, which a graph would not"
    gm, example, sources = graphs[-1]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if None in sources:
        n = placeholders[sources.index(None)]
        return f"its graph reads {n.name}, which is neither an argument nor the module's"
    if any(mutates(n) and through(n.args[0], VIEWS)[0].op == "placeholder"
           for n in gm.graph.nodes if n.args and isinstance(n.args[0], torch.fx.Node)):
        # the graph would redo it, but the first call's comparison runs the forward twice
        return "its forward writes an argument or a module's tensor in place"
    inputs = {n for n, s in zip(placeholders, sources) if s[0][1] != "module"}
    plugs, matches = [], find_matches(gm, example, PATTERNS, type(module).__name__)
    for m in matches:
        if m.ktype in GRAPH_RULES:
            plan = GRAPH_RULES[m.ktype].plan(m, inputs)
            plugs.append((m.ktype, plan) if isinstance(plan, str) else plan)
    plugs += _region_plugs(gm, example, matches, names)
    originals = {id(getattr(owner, attr)): (owner, attr) for owner, attr in entry_points}
    entries = {n.name: originals[id(n.target)] for n in gm.graph.nodes
               if n.op == "call_function" and id(n.target) in originals}
    leaves, spec = pytree.tree_flatten(result)
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if sum(isinstance(v, torch.Tensor) for v in leaves) != len(outputs):
        return "its outputs are not the graph's (an input or one tensor twice returned)"
    return Capture(gm, sources, plugs, entries, spec,
                   [OUTPUT if isinstance(v, torch.Tensor) else v for v in leaves])


def _rewritten(swap, module, capture, ktypes, also=()):
    """(the instance's forward with the kernels in its graph, [types plugged], [(type, why)]
    for the matches of `ktypes` left as they are) or (None, why not, []). also: types and
    regions ("region:<id>") plugged in where the graph holds them, unreported where not."""
    plugs = [p for p in capture.plugs
             if (p.ktype if isinstance(p, Plug) else p[0]) in set(ktypes) | set(also)]
    left = [p for p in plugs if not isinstance(p, Plug) and p[0] in ktypes]
    plugs = [p for p in plugs if isinstance(p, Plug)]
    left += [(t, NOT_AS_CUT + " (the model's code or shapes differ from the profile's)")
             for t in ktypes if t.startswith(REGION) and t not in {p.ktype for p in plugs}]
    if not plugs:
        return None, "; ".join(dict.fromkeys(why for _, why in left)) or \
            ("in its own graph the computation is no block a kernel can replace: a value inside "
             "it is read elsewhere (attention probabilities it returns, say)"), []
    graph, env = Graph(), {}
    graph.output(graph.graph_copy(capture.gm.graph, env))
    node = {n.name: env[n] for n in capture.gm.graph.nodes if n in env}
    erased, replaced, calls = set(), {}, []
    for p in plugs:
        mine = {node[a] for a in p.nodes}
        last = next(n for n in reversed(graph.nodes) if n in mine)
        with graph.inserting_after(last):  # every operand is there; readers move after it
            call = graph.call_function(_call(swap, p), tuple(replaced.get(a, node[a])
                                                             for a in p.operands))
        calls.append((p, call))
        for i, name in enumerate(p.outputs):
            value = call
            if len(p.outputs) > 1:
                with graph.inserting_after(call):
                    value = graph.call_function(operator.getitem, (call, i))
            node[name].replace_all_uses_with(value, delete_user_cb=lambda u: u not in mine)
            replaced[name] = value  # what a later plug reading this output reads
        # the match's nodes, read by nothing now (dropout's among them, which dead-code
        # elimination may keep as impure)
        rest = [a for a in p.nodes if a not in p.operands]
        while unread := [a for a in rest if a not in erased and not node[a].users]:
            for a in unread:
                graph.erase_node(node[a])
                erased.add(a)
    for name, (owner, attr) in capture.entries.items():
        if name not in erased:
            node[name].target = _looked_up(owner, attr)
    _in_order(graph)
    graph.eliminate_dead_code()  # (which lints the graph first)
    alive = set(graph.nodes)
    dead = {p.ktype for p, call in calls if call not in alive}
    left += [(t, "what it computes is read only by computations other kernels replace here "
              "(a mask a flash_attention kernel takes as its causal flag): nothing to run")
             for t in sorted(dead)]
    plugs = [p for p in plugs if p.ktype not in dead]
    if not plugs:
        return None, "; ".join(why for _, why in left), []
    gm = GraphModule(capture.gm, graph)
    sources, spec, leaves = capture.sources, capture.out_spec, capture.out_leaves

    def run(args, kwargs):
        scope = {"module": module, "args": args, "kwargs": kwargs}
        outs = iter(gm(*[graph_trace.read(steps, scope) for steps in sources]))
        return pytree.tree_unflatten([next(outs) if v is OUTPUT else v for v in leaves], spec)
    return run, sorted({p.ktype for p in plugs}), left


def _in_order(graph):
    """Each node moved after the nodes it reads, the order kept otherwise: a call inserted after
    the last node of what it replaces comes after readers of an earlier output of it."""
    done, waiting = set(), []
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for n in [n for n in graph.nodes if n is not output]:
        waiting.append(n)
        while (ready := next((w for w in waiting if set(w.all_input_nodes) <= done), None)):
            waiting.remove(ready)
            output.prepend(ready)
            done.add(ready)


def _looked_up(owner, attr):
    """A call of owner.attr found when it runs: the patch a rule put there, if any."""
    def call(*args, **kwargs):
        return getattr(owner, attr)(*args, **kwargs)
    call.__name__ = attr
    return call
