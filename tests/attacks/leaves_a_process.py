"""Attack: start a process in its own session at import (it would outlive the verdict and could
edit the repo later). Its pid goes to $AUTOKERNEL_TEST_PIDFILE so the test can look for it."""
import os
import subprocess

_proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
if os.environ.get("AUTOKERNEL_TEST_PIDFILE"):
    with open(os.environ["AUTOKERNEL_TEST_PIDFILE"], "w") as _f:
        _f.write(str(_proc.pid))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        acc += tl.load(x_ptr + row * N + start + cols, mask=start + cols < N,
                       other=0.0).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    row_sum_kernel[(M,)](x, y, N, BLOCK=min(triton.next_power_of_2(N), 16384))
    return y
