"""
The kinds of problem the judge knows. A kernel file's KERNEL_TYPE names its kind: one of the
table's kernel types (kernel_fn against autokernel/reference.py's float64 oracle, this module),
"kernelbench" (ModelNew against a KernelBench problem's Model, autokernel/kernelbench.py) or
"region" (ModelNew against a region's reference, library GEMMs and convolutions allowed:
autokernel/region_kind.py). The
judge (autokernel/experiment.py, autokernel/judge.py, autokernel/gate.py) asks the kind and never
branches on it:

    plan(attrs)                  what to judge the file at, from its contract names: the
                                 reference, the shapes, the dtype (and so the tolerance);
                                 KernelFileError when the file breaks its kind's contract
    missing_entry(hello)         why the child's module cannot be judged (the kind's entry point,
                                 kernel_fn or ModelNew, is not defined), or None
    judge                        the stages' Judge class (autokernel/gate.py's check runs it)
    timing_case(plan, runners)   what the timing runs on (a timing.Case): fresh inputs, the
                                 oracle, the tolerance test
    baselines(plan, latency_us)  what the row and the summary report beside a correct kernel's
                                 latency: speedups against the kind's baselines, the roofline
"""
import sys

import autokernel as ak
from autokernel import baselines, contract, gate, kernelbench, region_kind, timing
from autokernel.cli import one_line


class KernelTypeKind:
    """A kernel type of the table (autokernel/kernel_types.py)."""
    judge = gate.Judge

    def plan(self, attrs):
        return contract.plan(attrs)

    def missing_entry(self, hello):
        if not hello.get("has_kernel_fn"):
            return ("kernel file defines no kernel_fn(...); it must take the reference's tensors "
                    "by name and return a new tensor")
        return None

    def timing_case(self, plan, runners):
        return timing.kernel_case(ak.KERNEL_TYPES[plan["kernel_type"]], tuple(plan["shape"]),
                                  ak.DTYPES[plan["dtype"]], plan.get("variant"))

    def baselines(self, plan, latency_us):
        """Roofline and speedups from prepare.py's measured ceilings and baseline times (a new
        shape's baseline is timed here and cached)."""
        ktype, shape, dtype = ak.KERNEL_TYPES[plan["kernel_type"]], tuple(plan["shape"]), \
            ak.DTYPES[plan["dtype"]]
        ceilings, times = {}, {}
        try:
            ceilings = baselines.load_ceilings()
            # Where timings mean little (the CPU), eager is timed again now, beside the kernel: a
            # cached CPU time may come from a busy moment and would skew every later speedup.
            fresh = not ak.TIMING_MEANINGFUL
            times = baselines.baseline_times(ktype, shape, dtype, variant=plan.get("variant"),
                                             force=fresh, log=(lambda m: None) if fresh else None)
        except Exception as e:  # a broken cache costs the speedups, not the verdict
            print(f"note: baselines unavailable ({one_line(e)})", file=sys.stderr)
        tflops = (ceilings.get("tflops") or {}).get(plan["dtype"])
        roof = ak.roofline(ktype, shape, dtype, latency_us,
                           {"bandwidth_gb_s": ceilings.get("bandwidth_gb_s"), "tflops": tflops},
                           plan.get("variant"))
        spec = ceilings.get("spec") or {}
        eager, compiled = times.get("eager_us"), times.get("compile_us")
        out = dict(roof, bound=ktype.bound, ceiling_bandwidth_gb_s=ceilings.get("bandwidth_gb_s"),
                   ceiling_tflops=tflops, datasheet_bandwidth_gb_s=spec.get("bandwidth_gb_s"),
                   datasheet_tflops=spec.get("fp16_tflops") if plan["dtype"] != "fp32" else None,
                   eager_us=eager, compile_us=compiled, library=times.get("library"),
                   library_us=times.get("library_us"),
                   speedup_vs_pytorch=eager / latency_us if eager else None,
                   speedup_vs_compile=compiled / latency_us if compiled else None)
        if out["pct_peak"] != out["pct_peak"]:  # NaN: no ceilings (CPU, or no prepare.py)
            out["pct_peak"] = None
        return out


KERNEL_TYPE = KernelTypeKind()
# KERNEL_TYPE values that are a kind of their own; any other value is a kernel type's name.
KINDS = {"kernelbench": kernelbench.KIND, "region": region_kind.KIND}


def of(kernel_type):
    """The kind of a KERNEL_TYPE value (a plan's "kernel_type"); a value that is not a name is a
    kernel type's (whose plan then says what is wrong with it)."""
    return KINDS.get(kernel_type, KERNEL_TYPE) if isinstance(kernel_type, str) else KERNEL_TYPE


def plan(attrs):
    """The plan of a kernel file's contract names, by its kind."""
    return of(attrs.get("KERNEL_TYPE")).plan(attrs)
