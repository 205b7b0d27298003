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
skipped in the interpreter, which computes them wrongly. A region kernel's ModelNew is compared
with its region's reference (regions/), on the reference's inputs and parameters, in the dtype
it was judged in.

Exit status: 0 every case ran and matched, 1 a kernel raised, returned the wrong shape or dtype,
or mismatched, 2 usage errors.
"""
import argparse
import importlib.util
import sys
import warnings

import torch

from . import KERNELS
from .kernel_types import CUDA, DEVICE, DTYPES, HERE, KERNEL_TYPES, MANIFEST, TOLERANCES


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
    regions = [k for k in KERNELS if k.kernel_type == "region"]
    for kernel in regions:
        verdict = check_region(kernel)
        failed += verdict.startswith("FAIL")
        print(f"  {kernel.name} (region): {verdict}")
    for case in cases:
        verdict = check(kernels[case["kernel"]], case)
        failed += verdict.startswith("FAIL")
        skipped += verdict.startswith("skipped")
        variant = f" {case['variant']}" if case["variant"] else ""
        print(f"  {case['kernel']} {'x'.join(map(str, case['shape']))} {case['dtype']}{variant}: "
              f"{verdict}")
    print(f"smoke test: {len(cases) + len(regions) - failed - skipped} passed, {failed} failed, "
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


def check_region(kernel):
    """'ok' or 'FAIL: ...': ModelNew against its region's reference Model (the same parameters,
    loaded into it by name) on the reference's inputs, in the kernel's BENCH_DTYPE, at the
    gate's tolerance (atol in units of the output's RMS)."""
    entry = next(e for e in MANIFEST["kernels"] if e["name"] == kernel.name)
    spec = importlib.util.spec_from_file_location(f"_reference_{kernel.name}",
                                                  HERE / entry["region"]["reference"])
    problem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(problem)
    dtype = DTYPES[getattr(sys.modules[kernel.fn.__module__], "BENCH_DTYPE", "fp32")]
    torch.manual_seed(0)
    model = problem.Model(*problem.get_init_inputs()).to(DEVICE, dtype).eval()
    inputs = [x.to(DEVICE, dtype) if x.is_floating_point() else x.to(DEVICE)
              for x in problem.get_inputs()]
    try:
        new = kernel.fn(*problem.get_init_inputs()).to(DEVICE, dtype).eval()
        new.load_state_dict(model.state_dict())
        with torch.no_grad():
            got, want = new(*inputs), model(*inputs)
    except Exception as e:
        return f"FAIL: raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    got, want = (got, want) if isinstance(want, (tuple, list)) else ((got,), (want,))
    tol = TOLERANCES[dtype]
    for g, w in zip(got, want):
        if tuple(g.shape) != tuple(w.shape):
            return f"FAIL: returned {tuple(g.shape)}, expected {tuple(w.shape)}"
        g, w = g.double(), w.double()
        atol = tol * float(w.square().mean().sqrt())
        close = torch.isclose(g, w, rtol=tol, atol=atol)
        if not bool(close.all()):
            return f"FAIL: {int((~close).sum())} of {close.numel()} values off (largest error " \
                   f"{float((g - w).abs().max()):.3g}, atol {atol:.3g}, rtol {tol:.3g})"
    return "ok"


if __name__ == "__main__":
    sys.exit(main())
