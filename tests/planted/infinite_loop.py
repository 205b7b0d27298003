"""Planted: never returns. Expected: TIMEOUT."""
KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


def kernel_fn(x, dim=-1):
    while True:
        pass
