"""
The kernel types as this package's swap and ops modules use them: each type's kernel_fn arguments
in order (manifest.json, written from AutoKernel's table of types) and its two PyTorch versions
in reference.py: the eager one (a call's output shape and dtype, the custom ops' fake and
backward) and the float64 oracle (smoke_test.py).

Importing it sets CPU mode first: without a CUDA GPU the kernels run in Triton's interpreter,
which TRITON_INTERPRET=1 turns on when triton is imported (slow: for trying the package out).
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = "cuda" if CUDA else "cpu"

HERE = Path(__file__).resolve().parent
MANIFEST = json.loads((HERE / "manifest.json").read_text())
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCES = {DTYPES[name]: tol for name, tol in MANIFEST["tolerances"].items()}

from . import reference  # noqa: E402


@dataclass(frozen=True)
class KernelType:
    name: str
    args: tuple              # kernel_fn's arguments, in order (all passed by name)
    uses_dot: bool = False   # tl.dot in bf16 is wrong in Triton's interpreter
    out_order: tuple = None  # the output's dims in memory order (None: row-major)

    def eager(self, **inputs):
        return getattr(reference, f"{self.name}_eager")(**inputs)

    def reference(self, **inputs):
        return getattr(reference, self.name)(**inputs)

    def shape_str(self, shape):
        return "x".join(str(d) for d in shape)


KERNEL_TYPES = {name: KernelType(name, tuple(t["args"]), t["uses_dot"],
                                 t.get("out_order") and tuple(t["out_order"]))
                for name, t in MANIFEST["kernel_types"].items()}
KERNEL_TYPE_NAMES = tuple(KERNEL_TYPES)


def rel(path) -> str:
    """A path as kernel_call.py's messages name it: relative to this package when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(HERE))
    except ValueError:
        return str(path)
