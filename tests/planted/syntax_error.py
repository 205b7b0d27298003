"""Planted: a syntax error. Expected reason: syntax error."""
KERNEL_TYPE = "reduce"


def kernel_fn(x, dim=-1)
    return x.sum(dim)
