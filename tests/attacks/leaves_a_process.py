"""Attack: start a process in its own session at import (it would outlive the verdict and could
edit the repo later). Its pid goes to the child log (its stdout) so the test can look for it."""
import subprocess

_proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
print(f"leaves_a_process pid {_proc.pid}", flush=True)


KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
