"""
Recognition by computation: which kernel type a piece of a model computes, whoever wrote it.

profile.py runs the model's forward once under TorchDynamo (torch.compile with a backend of
ours), finds in each captured graph the computations that are a kernel type -- RMSNorm,
LayerNorm, softmax, a SwiGLU or GeGLU MLP, rotary embedding (half-split or interleaved), an
attention layer's q/k/v projections with rotary on q and k, cross-entropy, attention written
out -- in the usual spellings (autokernel/patterns.py, matched by autokernel/matches.py), and
puts every match in an `autokernel::` profiler scope that carries its kernel type and shape
(recognize.scope_name). The profiled forwards run these instrumented graphs, so the time of a
match's ops belongs to its kernel type. When capture fails, profiling falls back to the op
names and module classes of recognize.py (module_scopes), after one line saying so.

Why TorchDynamo: torch.fx.symbolic_trace fails on data-dependent Python, which real models
(transformers' among them) are full of; torch.export must take the whole forward as one graph
(one unsupported construct fails the model) and hands back an ATen graph whose decompositions
are not the program the user runs. A Dynamo backend gets every graph Dynamo captures (a graph
break only splits them), each node with its example value (shape, dtype) and the modules it
was called in, and the real example inputs (a mask can be evaluated: causal or not); the graph
it returns is what runs, calling the same torch functions as the model, so the profiled
forward runs the model's own ops, now inside scopes.
"""
import heapq
import logging
from collections import Counter
from contextlib import contextmanager

import torch
from torch.profiler import record_function

from autokernel.cli import describe
from autokernel.matches import Match, find_matches
from autokernel.patching import fast_path_off
from autokernel.patterns import PATTERNS
from autokernel.recognize import REGION, module_scopes
from autokernel.regions import find_regions, observe, record


@contextmanager
def recognized_forward(model, inputs, say=print, skip=(), regions=None, origin=None):
    """The forward to profile: the model under Dynamo with every match in its profiler scope
    (already run once, the capture); skip: patterns (by name) not to look for; regions: a dict
    to fill with the regions (autokernel/regions.py) of what no pattern matched, {id: record},
    each also run in its scope (origin: the model's description, for their reference files).
    When capture fails, the model itself inside its module classes' scopes, after one line
    saying so. Dynamo's caches are cleared afterwards: they would keep this model's graphs, and
    after 8 of them Dynamo stops tracing that code. nn.TransformerEncoderLayer's fast path is
    off throughout (patching.fast_path_off), as it is with the kernels in."""
    with fast_path_off():
        if any(isinstance(m, torch.nn.TransformerEncoderLayer) and m.self_attn.batch_first
               for m in model.modules()):
            say("  nn.TransformerEncoderLayer's fast path (one fused op in eval, which no kernel "
                "could replace) is off while profiling: its layers are ranked as their linears, "
                "attention and norms; verify.py times the original model with it on")
        with _recognized(model, inputs, say, skip, regions, origin) as forward:
            yield forward


@contextmanager
def _recognized(model, inputs, say, skip, regions, origin):
    try:
        forward, matches = capture(model, inputs, skip, regions, origin)
    except Exception as e:  # noqa: BLE001  (any failure to trace leaves today's recognition)
        torch._dynamo.reset()
        say(f"  graph capture failed ({describe(e, 160)}): kernel types recognized by op name "
            "and module class only")
        with module_scopes(model):
            yield model
        return
    counts = Counter(m.ktype for m in matches if m.ktype != REGION)
    say("  recognized by computation: " + (", ".join(f"{n} {k}" for k, n in counts.most_common())
                                           or "nothing beyond single ops"))
    if regions is not None:
        say(f"  regions (the rest, cut by module): {len(regions)} distinct, "
            f"{sum(len(r['instances']) for r in regions.values())} instances")
    try:
        yield forward
    finally:
        torch._dynamo.reset()


def capture(model, inputs, skip=(), regions=None, origin=None):
    """Run the model once under Dynamo; every graph it captures is matched and instrumented
    (with its regions too when `regions` is a dict to fill: recognized_forward).
    Returns (the compiled forward, [Match])."""
    found, graphs = [], []
    root = type(model).__name__

    def backend(gm, example_inputs):
        matches = find_matches(gm, example_inputs, PATTERNS, root, skip)
        if regions is not None:
            matches = matches + _regions(gm, example_inputs, matches, model, regions,
                                         origin or root)
        instrument(gm, matches)
        found.extend(matches)
        graphs.append(gm)
        return gm

    compiled = torch.compile(model, backend=backend, dynamic=False)
    with dynamo_quiet():
        compiled(*inputs)
    if not graphs:
        raise RuntimeError("Dynamo captured no graph of the forward")
    return compiled, found


def _regions(gm, example_inputs, matches, model, regions, origin):
    """The graph's regions (recorded in `regions` by id, each instance's module path added)."""
    modules = {str(id(m)): name for name, m in model.named_modules()}
    cut = find_regions(gm, matches, type(model).__name__, modules)
    names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    seen = observe(gm, example_inputs, {a for r in cut for a in r.inputs}, names)
    for r in cut:
        if r.id not in regions:
            regions[r.id] = record(r, seen, origin)
        regions[r.id]["instances"].append(r.module)
    return cut


@contextmanager
def dynamo_quiet():
    # A failed trace logs pages of internals before it raises; the one-line reason is enough.
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(previous)


# ---------------------------------------------------------------------------------------------
# Each match run as one block inside its scope
# ---------------------------------------------------------------------------------------------

def instrument(gm, matches):
    """Reorder the graph so each match's nodes are contiguous (nodes in between that don't
    depend on it move before it) and wrap each in its profiler scope."""
    graph = gm.graph
    owner = {n: m for m in matches for n in m.nodes}
    order = {n: i for i, n in enumerate(graph.nodes)}
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    members, deps, users = {}, {}, {}
    for n in graph.nodes:
        if n is not output:
            members.setdefault(owner.get(n, n), []).append(n)
    for unit, nodes in members.items():
        deps[unit] = {owner.get(a, a) for n in nodes for a in n.all_input_nodes} - {unit}
        for d in deps[unit]:
            users.setdefault(d, []).append(unit)
    # Topological order of the blocks, each as early as the original order has it: acyclic
    # because only a match's output is read outside it.
    ready = [(order[nodes[0]], i, unit) for i, (unit, nodes) in enumerate(members.items())
             if not deps[unit]]
    heapq.heapify(ready)
    tie = len(members)
    while ready:
        _, _, unit = heapq.heappop(ready)
        if isinstance(unit, Match):
            with graph.inserting_before(output):
                scope = graph.call_function(_enter_scope, (unit.scope,))
            for n in members[unit]:
                output.prepend(n)
            with graph.inserting_before(output):
                graph.call_function(_exit_scope, (scope,))
        elif unit.op != "placeholder":
            output.prepend(unit)
        for u in users.get(unit, ()):
            deps[u].discard(unit)
            if not deps[u]:
                tie += 1
                heapq.heappush(ready, (order[members[u][0]], tie, u))
    graph.lint()
    gm.recompile()


def _enter_scope(name):
    scope = record_function(name)
    scope.__enter__()
    return scope


def _exit_scope(scope):
    scope.__exit__(None, None, None)
