"""Attack: right when the gate checks a call; when timed, each input tensor is computed once and
every later call on it gets a copy of that answer. The judge rewrites the timed inputs before
every window and checks every call's output: FAIL."""
import sys

from kernels.reduce import kernel_fn as _correct

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]
_answers = {}


def kernel_fn(x, dim=-1):
    if sys._getframe(1).f_code.co_name == "call":
        return _correct(x, dim)
    key = (x.data_ptr(), tuple(x.shape), dim)
    if key not in _answers:
        _answers[key] = _correct(x, dim)
    return _answers[key].clone()
