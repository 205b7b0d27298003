"""Attack: `git reset --soft HEAD~1` at import: the kept commit leaves the branch."""
import subprocess
from pathlib import Path

subprocess.run(["git", "reset", "-q", "--soft", "HEAD~1"], cwd=Path(__file__).resolve().parent,
               check=True)

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
