"""Attack: start a process in its own session at import (it would outlive the verdict and could
edit the repo later). Its pid goes to $AUTOKERNEL_TEST_PIDFILE so the test can look for it."""
import os
import subprocess

_proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
if os.environ.get("AUTOKERNEL_TEST_PIDFILE"):
    with open(os.environ["AUTOKERNEL_TEST_PIDFILE"], "w") as _f:
        _f.write(str(_proc.pid))


KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
