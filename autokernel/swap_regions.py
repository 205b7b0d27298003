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

A region may be only part of its module's forward (the calls of a kernel type inside the same
module are not in it). So the first call of each instance runs both the module's own forward and
ModelNew on the same inputs, in eager mode: where the outputs differ beyond the dtype's tolerance
(or ModelNew does not take these inputs), the instance keeps its own forward for good and the
reason is counted as the kernel's fallback; where they agree, ModelNew runs from then on, each
call counted. Where the region is all a child module computes (a torch.nn conv in a block that
also runs a kernel type: profile.json's "plug"), that child's forward is the one replaced, its
tensors named as the region's module names them. A region kernel none of whose instances could
be plugged is "not plugged" in verify.py's report (with the reasons), not a failure: plugging a
region that is part of a forward needs the graph-level swap that is not built yet. Inside
torch.compile region kernels are not plugged in yet either (a compiled swap leaves them out).
"""
import torch

from autokernel.kernel_types import TOLERANCES
from autokernel.regions import attribute_name


def patches(swap, model):
    """[(module, "forward", replacement)] for each instance of each region kernel of the swap
    found in the model; an instance the model does not have is a fallback with its reason."""
    found = []
    names = dict(model.named_modules())
    for kernel in swap.regions:
        for path in kernel.instances:
            module = names.get(kernel.site(path))
            if module is None:
                swap.fallback(kernel.name, f"the model has no module {kernel.site(path)!r}")
                continue
            found.append((module, "forward", instance_forward(swap, kernel, module, path)))
    return found


def instance_forward(swap, kernel, module, path):
    """The instance's forward with the region kernel in it (module docstring)."""
    original = module.forward
    state = {"checked": False, "why": None, "new": None, "tensors": None}

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

    def in_layout(t, like):
        """The instance's tensor, or, where ModelNew holds its own in another layout (a
        convolution's weight in channels_last), a copy of it in that layout, made once."""
        if t.shape != like.shape or t.stride() == like.stride():
            return t
        with torch.no_grad():
            return torch.empty_strided(t.shape, like.stride(), dtype=t.dtype,
                                       device=t.device).copy_(t)

    def run(args, kwargs):
        return torch.func.functional_call(state["new"], state["tensors"], args, kwargs)

    def forward(*args, **kwargs):
        if state["why"] is not None:
            return original(*args, **kwargs)
        if not state["checked"]:
            why = check(args, kwargs)
            state["checked"] = True
            if why is not None:
                state["why"] = why
                swap.fallback(kernel.name, f"at {kernel.site(path) or 'the model'}: {why}")
                return original(*args, **kwargs)
        swap.calls[kernel.name] += 1
        swap.shapes[kernel.name].add(kernel.site(path) or "the model")
        return run(args, kwargs)

    def check(args, kwargs):
        """None where ModelNew computes what the instance's forward does on these inputs."""
        try:
            first = next(t for t in [*module.parameters(), *module.buffers()])
            state["new"] = kernel.fn().to(device=first.device, dtype=first.dtype)
        except StopIteration:
            state["new"] = kernel.fn()
        except Exception as e:  # noqa: BLE001  (the kernel's own failure, named)
            return f"ModelNew() raised {type(e).__name__}: {e}"
        state["tensors"], why = tensors()
        if why:
            return why
        want = original(*args, **kwargs)
        try:
            got = run(args, kwargs)
        except Exception as e:  # noqa: BLE001
            return (f"ModelNew does not take this forward's inputs ({type(e).__name__}: "
                    f"{str(e)[:120]}): the region is only part of the module's forward")
        return disagreement(got, want)

    return forward


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
