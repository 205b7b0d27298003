"""Planted: no kernel_fn. Expected reason: defines no kernel_fn."""
KERNEL_TYPE = "reduce"


def kernel(x):
    return x
