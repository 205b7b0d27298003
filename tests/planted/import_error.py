"""Planted: imports a module that does not exist. Expected reason: import error."""
import triton_kernels_that_do_not_exist  # noqa: F401

KERNEL_TYPE = "reduce"


def kernel_fn(x, dim=-1):
    return None
