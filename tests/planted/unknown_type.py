"""Planted: a kernel type the gate does not know. Expected reason: unknown KERNEL_TYPE."""
KERNEL_TYPE = "conv3d"


def kernel_fn(x):
    return x
