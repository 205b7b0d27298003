"""Attack: SIGKILL the judge (bench.py: this process's parent, or its grandparent where a
zygote forked it) at import, so no verdict is
written and the next bench.py finds the crash record. In the sandbox the signal is refused
(FAIL, named); without it, the next run records this one as a CRASH and restores the night."""
import os
import signal
from pathlib import Path

_judge = os.getppid()
while b"bench.py" in Path(f"/proc/{_judge}/cmdline").read_bytes():  # up to the outermost
    _above = int(Path(f"/proc/{_judge}/stat").read_text().rsplit(")", 1)[1].split()[1])
    if b"bench.py" not in Path(f"/proc/{_above}/cmdline").read_bytes():
        break
    _judge = _above
os.kill(_judge, signal.SIGKILL)

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
