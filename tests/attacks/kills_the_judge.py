"""Attack: SIGKILL the judge (bench.py, this process's parent) at import, so no verdict is
written and the next bench.py finds the crash record. In the sandbox the signal is refused
(FAIL, named); without it, the next run records this one as a CRASH and restores the night."""
import os
import signal

os.kill(os.getppid(), signal.SIGKILL)

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
