"""
A kernel file as a checked call of its type's contract.

A kernel file, loaded (Kernel), becomes a callable of its type's contract (KernelOp: the
reference's named tensors in, an output checked against the reference's shape and dtype out);
an exception, or an output of another shape or dtype, is a KernelFailure that names the kernel.
contract_shape says which shape, in the type's convention, a call is dispatched and reported
under. autokernel/swap.py plugs these calls into a model.
"""
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

import autokernel
from autokernel import ops
from autokernel.cli import describe
from autokernel.recognize import reduce_shape
from autokernel.results import rel

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the dtypes a contract takes


@dataclass
class Kernel:
    """A loaded kernel file: its name in reports, its type, its kernel_fn, and the contract
    shapes it declared (plan.json or BENCH_SHAPES; none = it takes every shape of its type)."""
    name: str
    kernel_type: str
    file: Path
    fn: object
    shapes: list = field(default_factory=list)
    optional: bool = False  # one that finds no op in the model is "unused", not a failure
    instances: list = field(default_factory=list)  # a region kernel's module paths (its fn:
                                                   # ModelNew; autokernel/swap_regions.py)
    plug: str | None = ""  # where in each instance it is swapped in: "" its forward, "dwconv" a
                           # child's, None: into the graph of the forward it is part of
    region_id: str = ""    # a region kernel's region (regions.region_id), found by it in graphs

    def site(self, path):
        """The module path a region kernel's instance at `path` is swapped in at."""
        return ".".join(p for p in (path, self.plug or "") if p)

    @property
    def rel_file(self):
        return rel(self.file)


class KernelFailure(Exception):
    """A kernel raised or returned the wrong thing while the model ran."""

    def __init__(self, kernel, message):
        super().__init__(f"{kernel.name} ({kernel.rel_file}): {message}")
        self.kernel, self.message = kernel, message


class KernelOp:
    """One kernel as a callable of its type's contract: op(shape, **tensors) calls kernel_fn and
    checks that the output has the shape and dtype the reference gives these inputs; anything
    else, or an exception, is a KernelFailure that names the kernel. `shape` is the contract
    shape the call is reported under.
    compiled: self.op is the kernel's torch custom op (autokernel/ops.py), which torch.compile
    keeps as one node; its body is this same checked call. A compiled swap calls self.op, an
    eager one calls this directly: the op's dispatch costs host time a kernel call cannot spare."""

    def __init__(self, kernel, compiled=False, on_call=None):
        self.kernel = kernel
        self.ktype = autokernel.KERNEL_TYPES[kernel.kernel_type]
        self.specs = {}  # input shapes and dtypes -> the reference's output (shape, dtype)
        self.op = ops.kernel_op(kernel, self._op_body) if compiled else None
        # on_call(op, shape, folded, normed) after each call of the op's body, held weakly:
        # ops.py keeps the body (and so this KernelOp) registered after its swap is gone.
        self.on_call = on_call and weakref.WeakMethod(on_call)

    def _op_body(self, **inputs):
        """The custom op's real body, run when the (compiled) forward runs: the checked call,
        reported under the shape the kernel got (a padded matmul: the padded N)."""
        shape = contract_shape(self.kernel.kernel_type, inputs)
        out = self(shape, **inputs)
        count = self.on_call and self.on_call()
        if count:  # a residual or a norm only comes from inductor's pass (fusion.py): folded in
            count(self, shape, inputs.get("residual") is not None,
                  inputs.get("ln_eps") is not None)
        return out

    def __call__(self, shape, **inputs):
        key = tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
                    for v in inputs.values())
        try:
            if key not in self.specs:
                self.specs[key] = _output_spec(self.ktype, inputs)
            want_shape, want_dtype = self.specs[key]
            # Torch-function handling off for the kernel's own host work: under a mode (e.g.
            # endtoend's loss-input recorder) every tensor access in Triton's launcher (strides,
            # data_ptr, dtype, ...) would pay a Python round trip, ~1.7 us each.
            with torch._C.DisableTorchFunction():
                out = self.kernel.fn(**inputs)
        except Exception as e:
            raise KernelFailure(self.kernel, f"raised {describe(e)} "
                                f"(shape {self.ktype.shape_str(shape)})") from e
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want_shape \
                or out.dtype != want_dtype:
            got = (f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise KernelFailure(self.kernel, f"returned {got}, expected {want_shape} "
                                f"{want_dtype} (shape {self.ktype.shape_str(shape)})")
        return out


def _output_spec(ktype, inputs):
    """(shape, dtype) the reference produces for these inputs, found on the meta device."""
    meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta")
            if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = ktype.eager(**meta)
    return tuple(out.shape), out.dtype


# ---------------------------------------------------------------------------------------------
# The contract shape of a call: its arguments -> the type's shape tuple
# ---------------------------------------------------------------------------------------------

def _qkv_shape(t):
    D = 2 * t["cos"].shape[-1]
    heads, kv = t["w_qkv"].shape[0] // D, t["kv_heads"]
    return (*t["x"].shape, heads - 2 * kv, kv, D)


def _first_arg_shape(inputs):
    return tuple(next(iter(inputs.values())).shape)


# The types whose shape is not their first argument's.
CONTRACT_SHAPES = {
    "matmul": lambda t: (t["A"].shape[0], t["B"].shape[1], t["A"].shape[1]),
    "fused_mlp": lambda t: (t["x"].shape[0], t["x"].shape[1], t["w_gate"].shape[0]),
    "reduce": lambda t: reduce_shape(tuple(t["x"].shape), t["dim"] % t["x"].dim())[0],
    "qkv_rotary": _qkv_shape,
    "decode_attention": lambda t: (*t["Q"].shape[:2], t["K"].shape[1], t["Q"].shape[2],
                                   *t["K"].shape[2:]),
}


def contract_shape(ktype, inputs):
    """The shape tuple of a call of this kernel type with these {arg: tensor} inputs."""
    return CONTRACT_SHAPES.get(ktype, _first_arg_shape)(inputs)
