"""Planted: no KERNEL_TYPE. Expected reason: defines no KERNEL_TYPE."""


def kernel_fn(x):
    return x
