"""Attack: patches the harness in its own process so that a timed window runs only its last call
and hands that output back for every call (n times less work on the judge's clock). The judge
checks every call's output against its own input set: FAIL."""
import autokernel.child

from kernels.reduce import kernel_fn  # noqa: F401  (correct: the attack is the rest)

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


def _last_call_only(self):
    out = self.fn(**self.sets[-1])
    if self.slots is not None:
        for slot in self.slots:
            slot.copy_(out)
    else:  # a CUDA graph's outputs: the last one written, the others left as they were
        self.outs[-1].copy_(out)
    self.sync()
    return {"status": "windowed"}


autokernel.child.Runner.window = _last_call_only
