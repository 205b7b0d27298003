"""Tests run on the CPU through Triton's interpreter: set it before anything imports triton,
and put the repo root on sys.path so tests import the scripts as modules."""
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autokernel  # noqa: E402,F401  (loads the stdlib `profile` before ours can shadow it)
