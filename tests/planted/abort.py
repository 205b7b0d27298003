"""Planted: aborts the process (as a fatal CUDA error or a failed C++ assert would).
Expected: CRASH, SIGABRT."""
import os

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


def kernel_fn(x, dim=-1):
    os.abort()
