"""Planted: a syntax error. Expected reason: syntax error."""
KERNEL_TYPE = "reduce"


def kernel_fn(x)
    return x.sum(-1)
