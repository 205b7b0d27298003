"""
Triton kernels kept by an AutoKernel run, as a package that needs only torch and triton.

    import autokernel_kernels as ak     # (this package, by whatever name it was exported)
    with ak.patch(model):               # the kernels swapped in for the block
        out = model(x)

    handle = ak.patch(model)            # or swapped in until handle.undo()

Importing it registers every kernel as a torch custom op (OPS: kernel name -> the op), which
torch.compile keeps as one node per call. patch(model) returns a Patch, the undo handle (also a
context manager): until undo(), the torch entry points the kernels' types handle (F.linear,
F.scaled_dot_product_attention, F.layer_norm, F.softmax, ...: swap.py) and the model's modules
that are one kernel (RMSNorm, SwiGLU MLPs, rotary embeddings) call the kernels. A call outside a
kernel's contract (an attention mask, a dtype it does not take, ...) runs PyTorch's own op and is
counted in handle.fallbacks. Patches are process-wide (F.linear is patched for every caller) and
nest: undo them in reverse order. patch(model, compiled=True) calls the kernels through their
custom ops, for a model you torch.compile while it is patched.

For inference: no gradient reaches the model's weights through the kernels (an eager kernel call
has no autograd; the ops' backward stops at the transposed weight copies the matmul kernel
reads), so a patched model that runs with autograd on warns once.

manifest.json lists the kernels and where they came from; `python -m <package>.smoke_test`
checks each one against PyTorch on this machine.
"""
import importlib.util

# The one thing to fix, not a traceback from deep inside (found, not imported: kernel_types
# sets the CPU mode before triton is imported).
_missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
if _missing:
    raise ImportError(f"{__name__} needs torch and triton, and this Python has no "
                      f"{' or '.join(_missing)}: run it with the Python that has them")

from . import kernel_types  # noqa: F401,E402  (first: CPU mode is set before triton is imported)

import contextlib  # noqa: E402
import importlib  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from . import kernel_call, ops, swap  # noqa: E402
from .kernel_types import HERE, MANIFEST  # noqa: E402


def _load(entry):
    """A kernel file of the package (kernels/<name>.py), as kernel_call.py's Kernel (a region
    kernel's callable is its ModelNew, plugged in where the model computes its region)."""
    module = importlib.import_module(f"{__name__}.kernels.{Path(entry['file']).stem}")
    region = entry.get("region")
    if region:
        return kernel_call.Kernel(entry["name"], "region", HERE / entry["file"], module.ModelNew,
                                  [], False, list(region["instances"]), region["plug"],
                                  region["id"])
    return kernel_call.Kernel(entry["name"], entry["kernel_type"], HERE / entry["file"],
                              module.kernel_fn, [tuple(s) for s in entry["shapes"]])


KERNELS = [_load(entry) for entry in MANIFEST["kernels"]]
# (a region kernel's op is registered at its first call: its outputs' shapes come from there)
OPS = {k.name: ops.kernel_op(k) for k in KERNELS if k.kernel_type != "region"}
_in_effect = []  # the Patch handles not yet undone, oldest first


def patch(model, compiled=False):
    """Swap this package's kernels into `model` now. Returns the Patch: undo() restores the model
    and torch; `with patch(model):` undoes at the end of the block."""
    return Patch(model, compiled)


class Patch:
    """The kernels plugged into one model until undo(). calls: kernel name -> calls so far;
    fallbacks: kernel type -> {reason: calls} that ran PyTorch's op instead."""

    def __init__(self, model, compiled=False):
        self.swap = swap.Swap(KERNELS, compiled=compiled)
        self._undo = contextlib.ExitStack()
        self._undo.enter_context(self.swap.installed(model))
        self._undo.callback(model.register_forward_pre_hook(self._warn_if_training).remove)
        self._warned = False
        _in_effect.append(self)

    def _warn_if_training(self, model, args):
        if self._warned or not torch.is_grad_enabled() \
                or not any(p.requires_grad for p in model.parameters()):
            return
        self._warned = True
        warnings.warn(f"{__name__}: the patched model runs with autograd on, but the kernels "
                      f"compute no gradients for its weights: run it under torch.no_grad() or "
                      f"torch.inference_mode()", stacklevel=2)

    @property
    def calls(self):
        return dict(self.swap.calls)

    @property
    def fallbacks(self):
        return {t: dict(reasons) for t, reasons in self.swap.fallbacks.items() if reasons}

    def undo(self):
        """Restore what patch() changed; a second call does nothing. A later patch still in
        effect must be undone first (it wraps the torch functions this one patched)."""
        if self not in _in_effect:
            return
        if _in_effect[-1] is not self:
            raise RuntimeError("undo the later patch() first: patches nest")
        _in_effect.pop()
        self._undo.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
