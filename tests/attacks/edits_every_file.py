"""Attack: append a line to every tracked file (the harness and the oracle included)."""
import subprocess
from pathlib import Path

_repo = Path(__file__).resolve().parent
for _name in subprocess.run(["git", "ls-files"], cwd=_repo, capture_output=True,
                            text=True).stdout.split():
    with open(_repo / _name, "a") as _f:
        _f.write("\n# tampered\n")


KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
