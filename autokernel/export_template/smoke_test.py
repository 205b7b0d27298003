"""
Each kernel of this package against PyTorch on small inputs, on this machine (its CUDA GPU, else
Triton's interpreter on the CPU):

    python -m autokernel_kernels.smoke_test             # (this package's name)
    python -m autokernel_kernels.smoke_test --dtype fp32

The inputs are smoke_cases.pt, made by AutoKernel's input makers when the package was exported:
for each kernel, one small shape per variant of its type's contract (eps, no affine weights,
causal or not, grouped-query heads, a bias, a sum over another dim) in fp32, fp16 and bf16. Each
kernel's kernel_fn (what patch(model) calls) is compared with reference.py's float64 oracle by
AutoKernel's gate tolerances (stored with each case). bf16 cases of kernels that use tl.dot are
skipped in the interpreter, which computes them wrongly.

Exit status: 0 every case ran and matched, 1 a kernel raised, returned the wrong shape or dtype,
or mismatched, 2 usage errors.
"""
import argparse
import sys
import warnings

import torch

from . import KERNELS
from .kernel_types import CUDA, DEVICE, HERE, KERNEL_TYPES


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                     prog=f"python -m {__package__}.smoke_test")
    parser.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), action="append",
                        help="only cases in this dtype (repeatable; default: all)")
    args = parser.parse_args(argv)
    cases = [c for c in torch.load(HERE / "smoke_cases.pt", weights_only=True)
             if not args.dtype or c["dtype"] in args.dtype]
    kernels = {k.name: k for k in KERNELS}
    if not CUDA:
        # The interpreter computes masked-off lanes too, which are never stored: numpy's
        # overflow warnings about them are noise.
        warnings.simplefilter("ignore", RuntimeWarning)
    print(f"{len(cases)} cases, {len(kernels)} kernels, on {DEVICE}"
          + ("" if CUDA else " (Triton's interpreter)"))
    failed = skipped = 0
    for case in cases:
        verdict = check(kernels[case["kernel"]], case)
        failed += verdict.startswith("FAIL")
        skipped += verdict.startswith("skipped")
        variant = f" {case['variant']}" if case["variant"] else ""
        print(f"  {case['kernel']} {'x'.join(map(str, case['shape']))} {case['dtype']}{variant}: "
              f"{verdict}")
    print(f"smoke test: {len(cases) - failed - skipped} passed, {failed} failed, "
          f"{skipped} skipped")
    return 1 if failed else 0


def check(kernel, case):
    """'ok', 'skipped (why)' or 'FAIL: what went wrong' for one case."""
    ktype = KERNEL_TYPES[kernel.kernel_type]
    inputs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v
              for k, v in case["inputs"].items()}
    if not CUDA and ktype.uses_dot and case["dtype"] == "bf16":
        return "skipped (bf16 tl.dot is wrong in Triton's interpreter)"
    want = ktype.reference(**inputs)
    try:
        got = kernel.fn(**inputs)
    except Exception as e:
        return f"FAIL: raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return f"FAIL: returned {tuple(got.shape)} {got.dtype}, expected " \
               f"{tuple(want.shape)} {want.dtype}"
    close = torch.isclose(got.double(), want.double(), rtol=case["rtol"], atol=case["atol"])
    if not bool(close.all()):
        worst = float((got.double() - want.double()).abs().max())
        return f"FAIL: {int((~close).sum())} of {close.numel()} values off (largest error " \
               f"{worst:.3g}, atol {case['atol']:.3g}, rtol {case['rtol']:.3g})"
    return "ok"


if __name__ == "__main__":
    sys.exit(main())
