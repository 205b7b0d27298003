"""Attack: write outside the repo as the judge's user: a file in $HOME, and a .pth file (which
every later Python process runs at its start, the judge's included) in the user's site-packages
and in $AUTOKERNEL_TEST_SITE (the test's stand-in for the venv's site-packages). Each write is
tried; the first refusal is raised at the end. The sandbox refuses them all: FAIL, named."""
import os
import site
from pathlib import Path

_targets = [Path.home() / "autokernel_was_here", Path(site.getusersitepackages()) / "evil.pth"]
if os.environ.get("AUTOKERNEL_TEST_SITE"):
    _targets.append(Path(os.environ["AUTOKERNEL_TEST_SITE"]) / "evil.pth")
_refused = []
for _path in _targets:
    try:
        _path.parent.mkdir(parents=True, exist_ok=True)
        _path.write_text("import os; os.system('echo pwned')\n")
    except OSError as _e:
        _refused.append(_e)
if _refused:
    raise _refused[0]

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
