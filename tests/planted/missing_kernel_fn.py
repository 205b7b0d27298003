"""Planted: no kernel_fn. Expected reason: defines no kernel_fn."""
KERNEL_TYPE = "reduce"


def kernel(x, dim=-1):
    return x
