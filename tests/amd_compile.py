"""
Compile the Triton starters for an AMD GPU on a machine without one: torch is made to look like
a ROCm build and Triton's driver like an AMD device of the target architecture, so each starter's
kernel_fn makes its AMD choices (no TMA, no Hopper kernel, no maxnreg, a dot precision ROCm's
Triton accepts) and Triton's HIP backend compiles what it launches, down to the code object.
Nothing runs: every launch stops after its compile, and a kernel that needs more shared memory
(LDS) than the target has counts as failed (on the GPU it would fail to load). Run by
tests/test_rocm.py at the small CPU shapes; --gpu-shapes takes each type's GPU primary shape,
whose bigger tiles are what an MI300X would get (minutes, GBs of host memory for the inputs).

    uv run tests/amd_compile.py gfx950                 # every type, fp16 and fp32
    uv run tests/amd_compile.py gfx942 --types matmul,softmax --gpu-shapes
    uv run tests/amd_compile.py gfx950 --as-nvidia     # the NVIDIA choices instead: they fail

Prints one line per kernel type and shape; exit status 1 when any failed.
"""
import argparse
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile, not interpret (before triton is imported)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import autokernel  # noqa: E402
from autokernel import KERNEL_TYPES  # noqa: E402
from autokernel.cli import one_line  # noqa: E402
from autokernel.contract import load_module  # noqa: E402

# (type, shape, dtype) beyond each type's primary shape in fp16 and fp32: softmax rows long
# enough for the register-resident path (its 16-bit launch caps registers on NVIDIA).
EXTRA = [("softmax", (2, 20000), torch.float16)]
LDS_BYTES = {"gfx90a": 64 << 10, "gfx942": 64 << 10, "gfx950": 160 << 10}  # per workgroup


class AMDDevice:
    """What Triton asks the active driver while it compiles: device, stream and target."""

    def __init__(self, arch):
        self.target = GPUTarget("hip", arch, 64)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def compile_only(run, compiled):
    """JITFunction.run that compiles and does not launch; (kernel name, shared bytes) of each
    compile go to `compiled`."""
    def warmup_run(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel.metadata.shared))
        return kernel
    return warmup_run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arch", help="AMD target, e.g. gfx942 (MI300X/MI325X), gfx950 (MI350X)")
    parser.add_argument("--types", help="comma-separated kernel types (default: all)")
    parser.add_argument("--as-nvidia", action="store_true",
                        help="leave torch a non-ROCm build: the starters make NVIDIA choices")
    parser.add_argument("--gpu-shapes", action="store_true",
                        help="each type's GPU primary shape instead of its CPU one")
    args = parser.parse_args()
    if not args.as_nvidia:
        torch.version.hip = "6.4"
    driver.set_active(AMDDevice(args.arch))
    compiled = []
    JITFunction.run = compile_only(JITFunction.run, compiled)
    lds = LDS_BYTES.get(args.arch, 64 << 10)
    names = args.types.split(",") if args.types else list(KERNEL_TYPES)
    shapes = "gpu_shapes" if args.gpu_shapes else "cpu_shapes"
    cases = [(n, getattr(KERNEL_TYPES[n], shapes)["primary"], d) for n in names
             for d in (torch.float16, torch.float32)] + [c for c in EXTRA if c[0] in names]
    failed = 0
    for name, shape, dtype in cases:
        module = load_module(autokernel.ROOT / "kernels" / f"{name}.py", f"starter_{name}")
        label = f"{name} {'x'.join(map(str, shape))} {autokernel.DTYPE_NAMES[dtype]}"
        del compiled[:]
        try:
            module.kernel_fn(**KERNEL_TYPES[name].inputs(shape, dtype, "cpu"))
        except Exception as e:  # noqa: BLE001  (a compile error of any kind is the answer)
            failed += 1
            print(f"{label}: FAILED {type(e).__name__}: {one_line(e)}", flush=True)
            continue
        over = [f"{kernel} needs {shared >> 10} KiB of shared memory, the GPU has {lds >> 10}"
                for kernel, shared in compiled if shared > lds]
        failed += bool(over)
        print(f"{label}: {'FAILED ' + '; '.join(over) if over else 'compiled'} for {args.arch}"
              f" (shared memory: {', '.join(f'{s >> 10} KiB' for _, s in compiled)})",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
