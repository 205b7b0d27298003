"""Tests run on the CPU through Triton's interpreter: set it before anything imports triton,
and put the repo root on sys.path so tests import the scripts as modules."""
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The session's workspace is a temporary folder: tests never touch a night's prepare.json,
# logs or build cache. Only this process: scripts the tests run in a repo copy use the copy's.
os.environ["AUTOKERNEL_WORKSPACE"] = tempfile.mkdtemp(prefix="autokernel_test_ws_")
atexit.register(shutil.rmtree, os.environ["AUTOKERNEL_WORKSPACE"], ignore_errors=True)
import autokernel  # noqa: E402,F401  (loads the stdlib `profile` before ours can shadow it)
del os.environ["AUTOKERNEL_WORKSPACE"]
