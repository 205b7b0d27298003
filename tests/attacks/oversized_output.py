"""Attack (GPU only: on a CPU the windows use the judge's slots): describes its CUDA graph's
outputs as views far past the end of their memory, so that the judge's first read would be a
fault that kills the judge, and no verdict is written. The judge asks the CUDA driver where each
opened allocation ends first: FAIL."""
import autokernel.child

from kernels.reduce import kernel_fn  # noqa: F401  (correct: the attack is the rest)

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

_honest = autokernel.child.shared


def _past_the_end(t):
    d = _honest(t)
    past = 64 << 30  # 64 GiB further: no allocation is that large here
    d["offset"] += past // t.element_size()
    d["size"] += past + d["size"]
    return d


autokernel.child.shared = _past_the_end
