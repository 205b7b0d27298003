"""Attack: a correct kernel that makes every clock of its process run 100x slow, so its own
timing reports a hundredth of the truth. The judge's clock contradicts it: FAIL."""
import time

import torch
import triton
import triton.testing

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(8, 2048)]  # tens of ms a call in the interpreter: the CPU bound adds 5 ms
SLOW = 100.0

for _name in ("perf_counter", "monotonic", "time"):
    _real = getattr(time, _name)
    setattr(time, _name, lambda _real=_real, _t0=_real(): _t0 + (_real() - _t0) / SLOW)
_real_ns = time.perf_counter_ns
time.perf_counter_ns = lambda _t0=_real_ns(): int(_t0 + (_real_ns() - _t0) / SLOW)
_do_bench = triton.testing.do_bench
triton.testing.do_bench = lambda *a, **k: _do_bench(*a, **k) / SLOW
_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _elapsed(self, end) / SLOW

from kernels.reduce import kernel_fn  # noqa: E402,F401  (correct: the attack is the rest)
